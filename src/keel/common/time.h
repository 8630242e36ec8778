#pragma once
// Wall-clock time as milliseconds since the Unix epoch, and its RFC 3339 text form.

#include <cstdint>
#include <optional>
#include <string>

namespace keel {

using Millis = int64_t;

Millis NowMillis();
// "2026-11-30T12:00:00.000Z"
std::string FormatRfc3339(Millis ms);
// Accepts "YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)", the offset at most 23:59 either way; nullopt
// when malformed.
std::optional<Millis> ParseRfc3339(const std::string& s);

}  // namespace keel

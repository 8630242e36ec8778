#pragma once
// Identifiers: UUIDv7 strings, time-ordered, so sorting ids sorts by creation time.

#include <string>

namespace keel {

// A new UUIDv7 in canonical text form. Thread-safe; ids from one process are strictly increasing.
std::string NewId();

// True when `s` looks like a canonical UUID (8-4-4-4-12 lowercase hex).
bool IsUuid(const std::string& s);

}  // namespace keel

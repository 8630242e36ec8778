#pragma once
// The one JSON library of the codebase is nlohmann::json; this header adds the one entry point
// for JSON text from outside the process (request bodies, model and MCP answers, archive rows,
// stored columns) and helpers for reading untrusted values without exceptions leaking out.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "keel/common/status.h"

namespace keel {

using Json = nlohmann::json;

// The deepest nesting of arrays and objects ParseJson accepts. Every recursive walk of a parsed
// value (copy, dump, compare, schema check, Lua conversion) is bounded by it.
inline constexpr int kMaxJsonDepth = 64;

// Parses any JSON value: kInvalidArgument for text that is not JSON (naming where it breaks),
// nesting deeper than kMaxJsonDepth, a key twice in one object, ill-formed UTF-8 or a number
// out of range.
Result<Json> ParseJson(std::string_view text);
// Parses a request body: as ParseJson, and it must be an object holding no NUL character in any
// key or string.
Result<Json> ParseJsonObject(std::string_view text);

// Reads an optional string field: absent -> `fallback`; wrong type -> kInvalidArgument naming it.
Result<std::string> OptString(const Json& obj, const char* field, std::string fallback = "");
// Reads a required non-empty string field.
Result<std::string> ReqString(const Json& obj, const char* field);

// Dumps with invalid UTF-8 replaced rather than throwing.
std::string DumpJson(const Json& j);
// Appends `s` as a JSON string, as DumpJson writes it (invalid UTF-8 replaced by U+FFFD), to
// `out`: for writing JSON text without building a Json value first.
void AppendJsonString(std::string& out, std::string_view s);
// At most `max_bytes` of `s`, cut before a UTF-8 sequence rather than inside one.
std::string TruncateUtf8(std::string_view s, size_t max_bytes);

// The API error body {"error":{"code","message"}} for a failed status.
std::string ErrorBody(const Status& status);

}  // namespace keel

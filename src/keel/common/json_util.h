#pragma once
// The one JSON library of the codebase is nlohmann::json; this header adds the helpers for
// reading untrusted request bodies without exceptions leaking out.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "keel/common/status.h"

namespace keel {

using Json = nlohmann::json;

// Parses `text` as a JSON object; a clear kInvalidArgument otherwise.
Result<Json> ParseJsonObject(std::string_view text);
// Parses any JSON value, or nullopt-like failure as kInvalidArgument.
Result<Json> ParseJson(std::string_view text);

// Reads an optional string field: absent -> `fallback`; wrong type -> kInvalidArgument naming it.
Result<std::string> OptString(const Json& obj, const char* field, std::string fallback = "");
// Reads a required non-empty string field.
Result<std::string> ReqString(const Json& obj, const char* field);

// Dumps with invalid UTF-8 replaced rather than throwing.
std::string DumpJson(const Json& j);

// The API error body {"error":{"code","message"}} for a failed status.
std::string ErrorBody(const Status& status);

}  // namespace keel

#pragma once
// Redactor — takes known secret values back out of what a party that was given them sends.
// An MCP server receives its secrets by reference ({"secret": NAME} in env or headers) and may
// echo them in a tool result, an error or its stderr; everything it sends passes a Redactor
// holding the values it was given before the model, a client or the store sees it. Each value
// is replaced by "[secret:NAME]" in its raw form and in the encodings a server is likely to
// echo it in: JSON-escaped, percent-encoded (URLs), and base64 (standard and url-safe) of the
// value alone. A value embedded in a larger base64 blob (e.g. Basic auth's "user:value") or
// otherwise transformed is not recognized.
//
// Values shorter than kMinBytes cannot be hidden without garbling ordinary text, so Add
// refuses them: a server is not started with such a secret.
//
// A plain value: immutable once built, safe to share between threads.

#include <string>
#include <utility>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::secrets {

class Redactor {
 public:
  static constexpr size_t kMinBytes = 8;

  // Adds a secret; kInvalidArgument (naming it, never showing it) when it is shorter than
  // kMinBytes.
  Status Add(const std::string& name, const std::string& value);

  bool empty() const { return forms_.empty(); }
  std::string Text(std::string text) const;
  // Every string in `value`, object keys included.
  Json Value(Json value) const;
  // The same code, the message redacted.
  Status Error(const Status& status) const;

 private:
  // (form, replacement), longest form first so a form is never cut by a shorter one.
  std::vector<std::pair<std::string, std::string>> forms_;
};

}  // namespace keel::secrets

#pragma once
// Checks tool arguments against the tool's JSON Schema before a call goes further. The subset
// tools use: type (a name or a list of names), properties, required, additionalProperties
// (false, or a schema), enum, minimum/maximum, minLength/maxLength, items, minItems/maxItems.
// Keywords outside the subset are ignored rather than guessed at.

#include <string>

#include "keel/common/json_util.h"

namespace keel::tools {

// Ok, or kInvalidArgument naming the first offending path ("arguments.line: expected string,
// got number").
Status CheckArguments(const Json& schema, const Json& arguments);

}  // namespace keel::tools

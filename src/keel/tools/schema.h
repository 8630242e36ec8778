#pragma once
// Checks tool arguments against the tool's JSON Schema before a call goes further. The subset
// tools use: type (a name or a list of names), properties, required, additionalProperties
// (false, or a schema), enum, minimum/maximum, minLength/maxLength, items, minItems/maxItems.
// Keywords outside the subset are ignored rather than guessed at; a keyword of the subset whose
// value has the wrong kind (minLength "5", maxItems -1 or 1.5, minimum "0") is refused, never
// ignored.

#include <string>

#include "keel/common/json_util.h"

namespace keel::tools {

// Ok, or kInvalidArgument naming the first keyword whose value has the wrong kind, under `name`
// ("schema.properties.line.minLength: must be a non-negative integer, got \"5\""). Where a
// tenant registers a schema, so that a broken one is refused there rather than at each call.
Status CheckSchema(const Json& schema, const std::string& name);

// Ok, or kInvalidArgument naming the first offending path ("arguments.line: expected string,
// got number"). A schema that CheckSchema refuses is refused here too, under the name "schema".
Status CheckArguments(const Json& schema, const Json& arguments);

}  // namespace keel::tools

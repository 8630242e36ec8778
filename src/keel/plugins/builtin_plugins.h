#pragma once
// The built-in plugins, compiled into Keel and chosen by name in a manifest of kind "builtin":
//
//   audit-log   a listener: appends every event it subscribes to, as one JSON line
//               {"at", "event", "payload"}, to its audit file (outside the agent's workspace, so
//               the agent's own tools cannot rewrite it). On a transform or veto event it
//               changes nothing and allows.
//   redaction   a transform: replaces every match of its config's `patterns` (RE2 regular
//               expressions: linear time, whatever the pattern) in every string of the payload
//               with `mask` (default "[REDACTED]", inserted as is).
//               On model.before@v1 that covers everything the model is sent: the instructions,
//               the messages and the tool results.

#include <string>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::plugins {

class EventBus;
struct Manifest;

struct BuiltinContext {
  std::string audit_file;  // where audit-log appends
};

// Whether the manifest names a built-in, its events suit it and its config is valid.
Status CheckBuiltin(const Manifest& manifest, const Json& config);

// Adds the built-in's handlers to `bus`. REQUIRES: CheckBuiltin passed.
Status AddBuiltin(const Manifest& manifest, const Json& config, const BuiltinContext& context,
                  EventBus& bus);

}  // namespace keel::plugins

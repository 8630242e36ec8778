#pragma once
// A plugin's manifest: what it is and what it subscribes to. Checked when the plugin is
// registered; an unknown field, event or kind is an error that names it.
//
//   {"id": "no-exec", "name": "No exec", "version": "1.0.0", "kind": "lua" | "builtin" | "webhook",
//    "events": ["tool.before@v1"], "priority": 100, "failure_mode": "skip" | "fail",
//    "config_schema": {JSON Schema of the config},
//    "builtin": "audit-log" | "redaction"            (kind builtin)
//    "url": "https://...", "timeout_ms": 5000, "max_attempts": 8   (kind webhook)
//    "limits": {"instructions", "wall_ms", "memory_bytes", "state_bytes"}   (kind lua; each at
//               most the cap)}

#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/plugins/lua_plugin.h"

namespace keel::plugins {

struct Manifest {
  std::string id;       // 1-64 of a-z, 0-9, '-' (no '_': plugin tools are plugin__{id}__{name})
  std::string name;
  std::string version;
  std::string kind;     // builtin | lua | webhook
  std::vector<std::string> events;  // "family@vN"
  int priority = 100;   // lower runs first
  bool fail_turn = false;           // failure_mode "fail"
  Json config_schema = Json::object();
  std::string builtin;  // kind builtin
  std::string url;      // kind webhook
  int64_t timeout_ms = 5000;
  int max_attempts = 8;  // kind webhook: tries before a delivery is dead
  LuaLimits limits;     // kind lua
};

// The most a manifest may ask for.
inline constexpr int64_t kMaxInstructions = 100'000'000;
inline constexpr int64_t kMaxWallMs = 2'000;
inline constexpr size_t kMaxMemoryBytes = 256u << 20;

Result<Manifest> ParseManifest(const Json& json);

}  // namespace keel::plugins

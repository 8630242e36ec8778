#include "keel/plugins/manifest.h"

#include <set>

#include "keel/plugins/catalog.h"
#include "keel/tools/schema.h"

namespace keel::plugins {

namespace {

// 1 to 64 of a-z and 0-9 and the characters of `extra`, starting with a letter or digit.
bool IsSlug(const std::string& s, std::string_view extra) {
  if (s.empty() || s.size() > 64) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || extra.find(c) == std::string_view::npos)) return false;
  }
  return true;
}

Result<int64_t> Integer(const Json& j, const std::string& field, int64_t lo, int64_t hi) {
  if (!j.is_number_integer()) return InvalidArgument("manifest." + field + " must be an integer");
  int64_t v = j.get<int64_t>();
  if (v < lo || v > hi) {
    return InvalidArgument("manifest." + field + " must be from " + std::to_string(lo) + " to " +
                           std::to_string(hi));
  }
  return v;
}

}  // namespace

Result<Manifest> ParseManifest(const Json& j) {
  if (!j.is_object()) return InvalidArgument("the manifest must be a JSON object");
  static const std::set<std::string> kFields = {
      "id", "name", "version", "kind", "events", "priority", "failure_mode", "config_schema",
      "builtin", "url", "timeout_ms", "max_attempts", "limits", "description"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!kFields.count(it.key())) return InvalidArgument("manifest: unknown field '" + it.key() + "'");
  }
  Manifest m;
  KEEL_ASSIGN_OR_RETURN(m.id, ReqString(j, "id"));
  if (!IsSlug(m.id, "-")) {
    return InvalidArgument("manifest.id must be 1 to 64 of a-z, 0-9 and '-', starting with a "
                           "letter or digit");
  }
  KEEL_ASSIGN_OR_RETURN(m.name, ReqString(j, "name"));
  if (m.name.size() > 200) return InvalidArgument("manifest.name is longer than 200 characters");
  KEEL_ASSIGN_OR_RETURN(m.version, ReqString(j, "version"));
  if (m.version.size() > 64) return InvalidArgument("manifest.version is longer than 64 characters");
  KEEL_ASSIGN_OR_RETURN(m.kind, ReqString(j, "kind"));
  if (m.kind != "builtin" && m.kind != "lua" && m.kind != "webhook") {
    return InvalidArgument("manifest.kind must be \"builtin\", \"lua\" or \"webhook\"");
  }
  if (!j.contains("events") || !j["events"].is_array() || j["events"].empty()) {
    return InvalidArgument("manifest.events must list the events the plugin subscribes to");
  }
  for (const auto& e : j["events"]) {
    if (!e.is_string()) return InvalidArgument("manifest.events must be strings");
    const std::string name = e.get<std::string>();
    const EventType* type = FindEvent(name);
    if (!type) {
      return InvalidArgument("manifest.events: unknown event '" + name +
                             "' (events are named like tool.before@v1)");
    }
    if (m.kind == "webhook" && !type->webhook) {
      return InvalidArgument("manifest.events: '" + name + "' is on the hot path; webhook "
                             "plugins may subscribe only to events off it");
    }
    if (std::find(m.events.begin(), m.events.end(), name) == m.events.end()) m.events.push_back(name);
  }
  if (j.contains("priority")) {
    KEEL_ASSIGN_OR_RETURN(int64_t p, Integer(j["priority"], "priority", -1'000'000, 1'000'000));
    m.priority = static_cast<int>(p);
  }
  KEEL_ASSIGN_OR_RETURN(std::string mode, OptString(j, "failure_mode", "skip"));
  if (mode != "skip" && mode != "fail") {
    return InvalidArgument("manifest.failure_mode must be \"skip\" or \"fail\"");
  }
  m.fail_turn = mode == "fail";
  if (m.fail_turn && m.kind == "webhook") {
    return InvalidArgument("manifest.failure_mode \"fail\" does not apply to webhook plugins "
                           "(their deliveries are retried, off the turn)");
  }
  if (j.contains("config_schema")) {
    if (!j["config_schema"].is_object()) {
      return InvalidArgument("manifest.config_schema must be a JSON Schema object");
    }
    KEEL_RETURN_IF_ERROR(tools::CheckSchema(j["config_schema"], "manifest.config_schema"));
    m.config_schema = j["config_schema"];
  }
  auto only = [&](const char* field, const char* kind) -> Status {
    if (j.contains(field) && m.kind != kind) {
      return InvalidArgument(std::string("manifest.") + field + " goes with kind \"" + kind + "\"");
    }
    return Status::Ok();
  };
  KEEL_RETURN_IF_ERROR(only("builtin", "builtin"));
  KEEL_RETURN_IF_ERROR(only("url", "webhook"));
  KEEL_RETURN_IF_ERROR(only("timeout_ms", "webhook"));
  KEEL_RETURN_IF_ERROR(only("max_attempts", "webhook"));
  KEEL_RETURN_IF_ERROR(only("limits", "lua"));
  if (m.kind == "builtin") {
    KEEL_ASSIGN_OR_RETURN(m.builtin, ReqString(j, "builtin"));
  }
  if (m.kind == "webhook") {
    KEEL_ASSIGN_OR_RETURN(m.url, ReqString(j, "url"));
    if (m.url.rfind("http://", 0) != 0 && m.url.rfind("https://", 0) != 0) {
      return InvalidArgument("manifest.url must start with http:// or https://");
    }
    if (j.contains("timeout_ms")) {
      KEEL_ASSIGN_OR_RETURN(m.timeout_ms, Integer(j["timeout_ms"], "timeout_ms", 100, 60'000));
    }
    if (j.contains("max_attempts")) {
      KEEL_ASSIGN_OR_RETURN(int64_t n, Integer(j["max_attempts"], "max_attempts", 1, 20));
      m.max_attempts = static_cast<int>(n);
    }
  }
  if (j.contains("limits")) {
    const Json& l = j["limits"];
    if (!l.is_object()) return InvalidArgument("manifest.limits must be an object");
    for (auto it = l.begin(); it != l.end(); ++it) {
      if (it.key() == "instructions") {
        KEEL_ASSIGN_OR_RETURN(m.limits.instructions,
                              Integer(it.value(), "limits.instructions", 1000, kMaxInstructions));
      } else if (it.key() == "wall_ms") {
        KEEL_ASSIGN_OR_RETURN(m.limits.wall_ms, Integer(it.value(), "limits.wall_ms", 1, kMaxWallMs));
      } else if (it.key() == "state_bytes") {
        KEEL_ASSIGN_OR_RETURN(int64_t b, Integer(it.value(), "limits.state_bytes", 1 << 20,
                                                 static_cast<int64_t>(kMaxMemoryBytes)));
        m.limits.state_bytes = static_cast<size_t>(b);
      } else if (it.key() == "memory_bytes") {
        KEEL_ASSIGN_OR_RETURN(int64_t b, Integer(it.value(), "limits.memory_bytes", 64 * 1024,
                                                 static_cast<int64_t>(kMaxMemoryBytes)));
        m.limits.memory_bytes = static_cast<size_t>(b);
      } else {
        return InvalidArgument("manifest.limits: unknown field '" + it.key() + "'");
      }
    }
  }
  return m;
}

}  // namespace keel::plugins

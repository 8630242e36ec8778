#pragma once
// plugins::PluginHost — the plugins of the agents running on this node. Each agent gets an
// AgentPlugins of its own (DESIGN: never shared between agents): its event bus, the Lua states
// of its Lua plugins and the tools they added. It is built from the agent's enabled plugins
// as the store lists them at the start of each run, and built again when that list changed
// (a plugin enabled, disabled, registered again or deleted): changes take effect on the
// agent's next turn, without a restart.
//
// Webhook plugins add no handler here: their events are delivered from the store, off the turn.
//
// Lives on the event loop; not thread-safe.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "keel/plugins/bus.h"
#include "keel/store/types.h"

namespace keel::tools {
class Tool;
}

namespace keel::plugins {

class LuaPlugin;
struct MemoryReader;
// The read-only view of an agent's memories its Lua plugins get as ctx.memory.
using MemoryReaders =
    std::function<MemoryReader(const std::string& tenant_id, const std::string& agent_id)>;

struct AgentPlugins {
  std::string tenant_id;
  std::string agent_id;
  std::string fingerprint;  // the enabled plugins' ids and update times
  EventBus bus;
  std::vector<std::shared_ptr<LuaPlugin>> lua;
  // Tools the agent's Lua plugins added, named plugin__{plugin id}__{tool name}.
  std::map<std::string, std::shared_ptr<tools::Tool>> tools;
  // Its enabled webhook plugins and the events each subscribes to ("family@vN").
  struct Webhook {
    std::string plugin_id;
    std::vector<std::string> events;
  };
  std::vector<Webhook> webhooks;
  // A plugin whose failure mode is "fail" could not be loaded: every turn of the agent fails
  // (and every tool call is refused) until it is fixed, disabled or deleted.
  std::optional<PluginError> broken;

  // Whether a handler or a webhook plugin takes a version of `family` (callers skip building
  // payloads nobody takes).
  bool Wants(const std::string& family) const {
    if (bus.Has(family)) return true;
    for (const auto& w : webhooks) {
      for (const auto& e : w.events) {
        if (e.size() > family.size() && e.compare(0, family.size(), family) == 0 &&
            e[family.size()] == '@') {
          return true;
        }
      }
    }
    return false;
  }
};

class PluginHost {
 public:
  // Built-in audit-log writes under `audit_root`/{tenant_id}/{agent_id}.jsonl; Lua plugins read
  // their agent's memories through `memory` (none without it).
  explicit PluginHost(std::string audit_root, MemoryReaders memory = nullptr)
      : audit_root_(std::move(audit_root)), memory_(std::move(memory)) {}

  struct Loaded {
    std::shared_ptr<AgentPlugins> plugins;
    bool started = false;               // first built on this node: emit agent.started@v1
    std::vector<PluginError> errors;    // plugins that failed to load (left out)
  };
  // The agent's plugins for a turn, given its enabled plugins as the store has them now.
  Loaded For(const std::string& tenant_id, const std::string& agent_id,
             const std::vector<store::Plugin>& enabled);

  // The agent's plugins as last built, or nullptr.
  std::shared_ptr<AgentPlugins> Find(const std::string& agent_id) const;

  // Drops an agent's plugins (the agent was deleted); returns them, to emit agent.stopped@v1.
  std::shared_ptr<AgentPlugins> Forget(const std::string& agent_id);
  // Every agent's plugins (to emit agent.stopped@v1 when the node stops).
  std::vector<std::shared_ptr<AgentPlugins>> All() const;

 private:
  std::shared_ptr<AgentPlugins> Build(const std::string& tenant_id, const std::string& agent_id,
                                      const std::vector<store::Plugin>& enabled,
                                      std::vector<PluginError>* errors) const;
  std::string audit_root_;
  MemoryReaders memory_;
  std::map<std::string, std::shared_ptr<AgentPlugins>> agents_;
};

// A fingerprint of the enabled plugins (what For compares), from their rows or their stamps.
std::string FingerprintOf(const std::vector<store::Plugin>& enabled);
std::string FingerprintOf(const std::vector<store::PluginStamp>& enabled);

}  // namespace keel::plugins

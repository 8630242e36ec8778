#include "keel/plugins/host.h"

#include "keel/common/log.h"
#include "keel/plugins/builtin_plugins.h"
#include "keel/plugins/catalog.h"
#include "keel/plugins/lua_plugin.h"
#include "keel/plugins/manifest.h"
#include "keel/tools/tool.h"

namespace keel::plugins {

namespace {

// What ctx.session() shows a handler: the ids the payload carries.
Json SessionView(const Json& payload) {
  Json view = Json::object();
  if (!payload.is_object()) return view;
  if (payload.contains("session_id")) view["id"] = payload["session_id"];
  for (const char* f : {"agent_id", "run_id"}) {
    if (payload.contains(f)) view[f] = payload[f];
  }
  return view;
}

// A Lua handler's call. The frame holds the plugin (a rebuild may drop the host's copy while
// the call waits on a memory read); the bus keeps `payload` until the call completes.
boost::asio::awaitable<Result<Json>> CallHook(std::shared_ptr<LuaPlugin> lua, int ref, bool veto,
                                              const Json& payload) {
  Json session = SessionView(payload);
  auto result = co_await lua->Call(ref, payload, std::move(session));
  // Returning nothing keeps the payload (a veto: allows); a veto that returns a boolean
  // means allow or deny.
  if (result.ok() && result->is_null()) co_return veto ? Json{{"allow", true}} : Unchanged();
  if (veto && result.ok() && result->is_boolean()) {
    co_return Json{{"allow", result->get<bool>()}};
  }
  co_return result;
}

// A Lua tool's call, owning what it uses (the plugin, the arguments, the session it shows).
boost::asio::awaitable<Result<Json>> CallTool(std::shared_ptr<LuaPlugin> lua, int ref,
                                              Json arguments, Json session) {
  co_return co_await lua->Call(ref, arguments, std::move(session));
}

// A tool a Lua plugin added: it runs in the plugin's state, on the event loop, under the
// plugin's budgets, and passes the gateway like every other tool. It cannot reach the world,
// so it needs only `read`.
class LuaTool final : public tools::Tool {
 public:
  LuaTool(std::string name, std::shared_ptr<LuaPlugin> lua, LuaPlugin::ToolDef def)
      : name_(std::move(name)), lua_(std::move(lua)), def_(std::move(def)) {}
  std::string name() const override { return name_; }
  std::string description() const override { return def_.description; }
  Json parameters() const override { return def_.schema; }
  tools::EffectClass effect_class() const override {
    if (def_.effect == "once") return tools::EffectClass::kOnce;
    if (def_.effect == "idempotent") return tools::EffectClass::kIdempotent;
    return tools::EffectClass::kPure;
  }
  std::vector<std::string> rights() const override { return {"read"}; }
  // Suspends while the handler waits on ctx.memory, without holding the event loop.
  boost::asio::awaitable<Result<Json>> ExecuteOnLoop(const tools::ToolContext& ctx,
                                                     Json arguments) override {
    Json session = {{"id", ctx.session_id}, {"agent_id", ctx.agent_id}, {"run_id", ctx.run_id}};
    return CallTool(lua_, def_.ref, std::move(arguments), std::move(session));
  }
  // Not blocking: the gateway runs it through ExecuteOnLoop only.
  Result<Json> Execute(const tools::ToolContext&, const Json&) override {
    return Internal("a Lua tool runs on the event loop (ExecuteOnLoop)");
  }

 private:
  std::string name_;
  std::shared_ptr<LuaPlugin> lua_;
  LuaPlugin::ToolDef def_;
};

}  // namespace

std::string FingerprintOf(const std::vector<store::PluginStamp>& enabled) {
  std::string f;
  for (const auto& p : enabled) f += p.id + "@" + std::to_string(p.updated_at) + ";";
  return f;
}

std::string FingerprintOf(const std::vector<store::Plugin>& enabled) {
  std::vector<store::PluginStamp> stamps;
  stamps.reserve(enabled.size());
  for (const auto& p : enabled) stamps.push_back({p.id, p.updated_at});
  return FingerprintOf(stamps);
}

std::shared_ptr<AgentPlugins> PluginHost::Build(const std::string& tenant_id,
                                                const std::string& agent_id,
                                                const std::vector<store::Plugin>& enabled,
                                                std::vector<PluginError>* errors) const {
  auto out = std::make_shared<AgentPlugins>();
  out->tenant_id = tenant_id;
  out->agent_id = agent_id;
  out->fingerprint = FingerprintOf(enabled);
  for (const auto& p : enabled) {
    const bool must_run = p.manifest.is_object() && p.manifest.value("failure_mode", "") == "fail";
    auto fail = [&](const std::string& message) {
      errors->push_back({p.id, "", message});
      // A plugin that may not be skipped and cannot load stops the agent's turns (fail closed).
      if (must_run && !out->broken) out->broken = plugins::PluginError{p.id, "", message};
    };
    auto manifest = ParseManifest(p.manifest);
    if (!manifest.ok()) {
      fail(manifest.status().message());
      continue;
    }
    const Manifest& m = *manifest;
    if (m.kind == "webhook") {
      out->webhooks.push_back({m.id, m.events});
      continue;
    }
    if (m.kind == "builtin") {
      BuiltinContext context{audit_root_ + "/" + tenant_id + "/" + agent_id + ".jsonl"};
      if (Status st = AddBuiltin(m, p.config, context, out->bus); !st.ok()) fail(st.message());
      continue;
    }
    std::string where = "plugin " + m.id + " (agent " + agent_id + "): ";
    auto log = [where](const std::string& level, const std::string& text) {
      if (level == "error") LogError(where + text);
      else LogInfo(where + level + ": " + text);
    };
    MemoryReader memory = memory_ ? memory_(tenant_id, agent_id) : MemoryReader{};
    auto loaded = LuaPlugin::Load(m.id, p.source, p.config, m.events, m.priority, m.limits, log,
                                  std::move(memory));
    if (!loaded.ok()) {
      fail(loaded.status().message());
      continue;
    }
    std::shared_ptr<LuaPlugin> lua = std::move(*loaded);
    HookOptions options;
    options.plugin_id = m.id;
    options.fail_turn = m.fail_turn;
    for (const auto& hook : lua->hooks()) {
      options.priority = hook.priority;
      int ref = hook.ref;
      const bool veto = FindEvent(hook.event)->shape == Shape::kVeto;
      HookFn fn = [lua, ref, veto](const Json& payload) {
        return CallHook(lua, ref, veto, payload);
      };
      if (Status st = out->bus.On(hook.event, std::move(fn), options); !st.ok()) fail(st.message());
    }
    for (const auto& def : lua->tools()) {
      std::string name = "plugin__" + m.id + "__" + def.name;
      out->tools[name] = std::make_shared<LuaTool>(name, lua, def);
    }
    out->lua.push_back(std::move(lua));
  }
  return out;
}

PluginHost::Loaded PluginHost::For(const std::string& tenant_id, const std::string& agent_id,
                                   const std::vector<store::Plugin>& enabled) {
  Loaded out;
  auto it = agents_.find(agent_id);
  if (it != agents_.end() && it->second->fingerprint == FingerprintOf(enabled)) {
    out.plugins = it->second;
    return out;
  }
  out.started = it == agents_.end();
  out.plugins = Build(tenant_id, agent_id, enabled, &out.errors);
  agents_[agent_id] = out.plugins;
  return out;
}

std::shared_ptr<AgentPlugins> PluginHost::Find(const std::string& agent_id) const {
  auto it = agents_.find(agent_id);
  return it == agents_.end() ? nullptr : it->second;
}

std::shared_ptr<AgentPlugins> PluginHost::Forget(const std::string& agent_id) {
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return nullptr;
  auto out = it->second;
  agents_.erase(it);
  return out;
}

std::vector<std::shared_ptr<AgentPlugins>> PluginHost::All() const {
  std::vector<std::shared_ptr<AgentPlugins>> out;
  for (const auto& [id, p] : agents_) out.push_back(p);
  return out;
}

}  // namespace keel::plugins

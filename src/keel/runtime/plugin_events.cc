// The runtime's side of plugins: loading each agent's plugins on this node, emitting the
// catalog's events on the agent's bus, connecting the gateway's hooks (tool.before vetoes,
// tool.after, the tools Lua plugins add) and reporting the handlers that fail.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "keel/common/io_work.h"
#include "keel/common/log.h"
#include "keel/http/client.h"
#include "keel/memory/memory.h"
#include "keel/plugins/bus.h"
#include "keel/plugins/host.h"
#include "keel/plugins/lua_plugin.h"
#include "keel/runtime/plugin_bridge.h"
#include "keel/store/async.h"
#include "keel/tools/gateway.h"
#include "keel/tools/tool.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

// ctx.memory for an agent's Lua plugins: synchronous reads of that agent's memories (the plugin
// runs on the event loop, in the turn).
plugins::MemoryReaders MemoryReadersOn(store::Store& store) {
  return [&store](const std::string& tenant_id, const std::string& agent_id) {
    plugins::MemoryReader reader;
    reader.search = [&store, tenant_id, agent_id](const std::string& query, const std::string& tag,
                                                  int limit) -> Result<Json> {
      Json hits;
      KEEL_RETURN_IF_ERROR(store.Read([&](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(hits, memory::SearchJson(tx, tenant_id, agent_id, query, tag, limit));
        return Status::Ok();
      }));
      return hits;
    };
    reader.get = [&store, tenant_id, agent_id](const std::string& id) -> Result<Json> {
      Json memory;
      KEEL_RETURN_IF_ERROR(store.Read([&](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(memory, memory::GetJson(tx, tenant_id, agent_id, id));
        return Status::Ok();
      }));
      return memory;
    };
    return reader;
  };
}

}  // namespace

PluginBridge::PluginBridge(asio::any_io_executor executor, store::Store& store,
                           tools::Gateway& gateway, std::string audit_dir,
                           http::OutboundGuard outbound, const secrets::Vault* vault)
    : executor_(executor),
      store_(store),
      gateway_(gateway),
      vault_(vault),
      host_(std::make_unique<plugins::PluginHost>(std::move(audit_dir), MemoryReadersOn(store))),
      webhook_client_(std::make_unique<http::Client>([&] {
        http::Client::Options o;
        o.outbound = std::move(outbound);
        return o;
      }())),
      delivery_timer_(executor) {
  HookGateway();
}

PluginBridge::~PluginBridge() = default;

void PluginBridge::Start() {
  asio::co_spawn(executor_, DeliveryLoop(), ReportExceptions{"webhook deliveries"});
}

void PluginBridge::StopDeliveries() {
  stopping_ = true;
  delivery_timer_.cancel();
}

void PluginBridge::StopAgents() {
  for (const auto& p : host_->All()) ForgetAgent(p->agent_id);
}

asio::awaitable<Result<std::shared_ptr<plugins::AgentPlugins>>> PluginBridge::PluginsOf(
    std::string tenant_id, std::string agent_id) {
  std::vector<store::Plugin> enabled;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(enabled, tx.plugins().PluginsForAgent(tenant_id, agent_id));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  co_return UsePlugins(tenant_id, agent_id, enabled);
}

std::shared_ptr<plugins::AgentPlugins> PluginBridge::UsePlugins(
    const std::string& tenant_id, const std::string& agent_id,
    const std::vector<store::Plugin>& enabled) {
  auto loaded = host_->For(tenant_id, agent_id, enabled);
  if (!loaded.errors.empty()) ReportPluginErrors(*loaded.plugins, loaded.errors);
  if (loaded.started) Emit(*loaded.plugins, "agent.started", {{"agent_id", agent_id}});
  return loaded.plugins;
}

asio::awaitable<void> PluginBridge::EmitFor(std::string tenant_id, std::string agent_id,
                                       std::string family, Json payload) {
  auto plugins = co_await PluginsOf(tenant_id, agent_id);
  if (!plugins.ok()) co_return;
  Emit(**plugins, family, std::move(payload));
}

void PluginBridge::ForgetAgent(const std::string& agent_id) {
  if (auto gone = host_->Forget(agent_id)) Emit(*gone, "agent.stopped", {{"agent_id", agent_id}});
}

plugins::Emitted PluginBridge::Emit(const plugins::AgentPlugins& plugins, const std::string& family,
                               Json payload, bool queue_webhooks) {
  queue_webhooks = queue_webhooks && !plugins.webhooks.empty();
  if (!plugins.bus.Has(family)) {
    if (queue_webhooks) QueueDeliveries(plugins, family, payload);
    plugins::Emitted none;
    none.payload = std::move(payload);
    return none;
  }
  plugins::Emitted out;
  {
    // Lua handlers run here, on the io thread: the watchdog names them if they hold it.
    // A payload is the event's: its run_id may be absent or null (memory, session events).
    auto run = payload.is_object() ? payload.find("run_id") : payload.end();
    const std::string run_id =
        run != payload.end() && run->is_string() ? run->get<std::string>() : "";
    IoWork work(plugins.tenant_id, run_id, "plugin hook " + family + " of agent " +
                                                plugins.agent_id);
    out = plugins.bus.Emit(family, std::move(payload));
  }
  if (queue_webhooks) QueueDeliveries(plugins, family, out.payload);
  std::vector<plugins::PluginError> errors = out.errors;
  if (out.abort) errors.push_back(*out.abort);
  if (!errors.empty()) ReportPluginErrors(plugins, errors);
  return out;
}

void PluginBridge::ReportPluginErrors(const plugins::AgentPlugins& plugins,
                                 const std::vector<plugins::PluginError>& errors) {
  Json recorded = Json::array();
  for (const auto& e : errors) {
    Json payload = {{"agent_id", plugins.agent_id},
                    {"plugin_id", e.plugin_id},
                    {"event", e.event},
                    {"message", e.message}};
    LogError("plugin " + e.plugin_id + " (agent " + plugins.agent_id + ")" +
             (e.event.empty() ? "" : " on " + e.event) + ": " + e.message);
    recorded.push_back(payload);
    if (!plugins.webhooks.empty()) QueueDeliveries(plugins, "plugin.error", payload);
    // The agent's own plugin.error listeners hear of it, except of their own failures (which
    // would repeat without end).
    if (e.event != "plugin.error@v1" && plugins.bus.Has("plugin.error")) {
      auto heard = plugins.bus.Emit("plugin.error", payload);
      for (const auto& again : heard.errors) {
        recorded.push_back({{"agent_id", plugins.agent_id},
                            {"plugin_id", again.plugin_id},
                            {"event", again.event},
                            {"message", again.message}});
      }
    }
  }
  asio::co_spawn(executor_, RecordPluginErrors(plugins.tenant_id, plugins.agent_id, recorded),
                 asio::detached);
}

asio::awaitable<void> PluginBridge::RecordPluginErrors(std::string tenant_id, std::string agent_id,
                                                  Json errors) {
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    for (const auto& e : errors) {
      KEEL_RETURN_IF_ERROR(tx.events().Append(
          {tenant_id, "plugin.error@v1", agent_id, "", "", e}));
    }
    return Status::Ok();
  });
  if (!written.ok()) LogError("could not record plugin errors: " + written.status().message());
}

void PluginBridge::HookGateway() {
  gateway_.AddVetoHook([this](const tools::CallRequest& c) -> std::optional<tools::Veto> {
    auto p = host_->Find(c.agent_id);
    if (p && p->broken) {
      return tools::Veto{"plugin " + p->broken->plugin_id + " could not be loaded: " +
                             p->broken->message,
                         true};
    }
    if (!p || !p->bus.Has("tool.before")) return std::nullopt;
    Json payload = {{"agent_id", c.agent_id},   {"session_id", c.session_id},
                    {"run_id", c.run_id},       {"call_id", c.call_id},
                    {"tool", c.tool},           {"arguments", c.arguments},
                    {"caller_role", c.caller_role}};
    auto out = Emit(*p, "tool.before", std::move(payload));
    if (out.abort) {
      return tools::Veto{"plugin " + out.abort->plugin_id + " failed deciding: " +
                             out.abort->message,
                         true};
    }
    if (out.denied) return tools::Veto{"plugin " + out.denied_by + ": " + out.reason};
    return std::nullopt;
  });
  // tool.after: its webhook deliveries go into the unit that records the call's result; the
  // agent's handlers hear of it once that unit committed.
  auto tool_after = [](const tools::CallRecord& r) {
    return Json{{"agent_id", r.agent_id},
                {"session_id", r.session_id},
                {"run_id", r.run_id},
                {"call_id", r.call->call_id},
                {"tool", r.call->tool},
                {"arguments", r.call->arguments},
                {"status", r.call->status},
                {"result", r.call->result},
                {"duration_ms", r.duration_ms},
                {"effect_class", r.call->effect_class},
                {"decision", r.decision}};
  };
  // A memory.upsert call that succeeded is a memory.upsert@v1 as well, delivered the same way.
  // The result has the memory without its text; the text is the call's.
  auto memory_upsert = [](const tools::CallRecord& r) -> std::optional<Json> {
    const Json& m = r.call->result;
    if (r.call->tool != "memory.upsert" || r.call->status != "succeeded" || !m.is_object() ||
        !m.contains("id")) {
      return std::nullopt;
    }
    return Json{{"agent_id", r.agent_id},
                {"session_id", r.session_id},
                {"run_id", r.run_id},
                {"memory_id", m.value("id", "")},
                {"text", r.call->arguments.value("text", "")},
                {"tags", m.value("tags", Json::array())},
                {"source", m.value("source", "")},
                {"replaced", m.value("replaced", false)}};
  };
  gateway_.SetOutboxHook([this, tool_after, memory_upsert](const tools::CallRecord& r) {
    auto p = host_->Find(r.agent_id);
    if (!p || p->webhooks.empty()) return std::vector<store::PluginDelivery>();
    auto out = DeliveriesFor(*p, "tool.after", tool_after(r));
    if (auto upsert = memory_upsert(r)) {
      for (auto& d : DeliveriesFor(*p, "memory.upsert", *upsert)) out.push_back(std::move(d));
    }
    return out;
  });
  gateway_.SetAfterHook([this, tool_after, memory_upsert](const tools::CallRecord& r) {
    auto p = host_->Find(r.agent_id);
    if (!p) return;
    auto upsert = memory_upsert(r);
    if (!p->Wants("tool.after") && !(upsert && p->Wants("memory.upsert"))) return;
    if (!p->webhooks.empty()) WakeDeliveries();
    if (p->bus.Has("tool.after")) Emit(*p, "tool.after", tool_after(r), /*queue_webhooks=*/false);
    if (upsert && p->bus.Has("memory.upsert")) {
      Emit(*p, "memory.upsert", std::move(*upsert), /*queue_webhooks=*/false);
    }
  });
  gateway_.SetAgentTools([this](const std::string& agent_id) {
    std::vector<std::shared_ptr<tools::Tool>> out;
    if (auto p = host_->Find(agent_id)) {
      for (const auto& [name, tool] : p->tools) out.push_back(tool);
    }
    return out;
  });
}

}  // namespace keel::runtime

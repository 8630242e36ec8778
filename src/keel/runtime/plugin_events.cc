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

// ctx.memory's reads of one agent's memories: awaited by the plugin's suspended call, through
// store::AsyncRead (on PostgreSQL a reader thread's, off the event loop). The frame owns its
// inputs; the store outlives every plugin.
asio::awaitable<Result<Json>> SearchMemories(store::Store& store, std::string tenant_id,
                                             std::string agent_id, std::string query,
                                             std::string tag, int limit) {
  Json hits;
  Status read = co_await store::AsyncRead(store, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(hits, memory::SearchJson(tx, tenant_id, agent_id, query, tag, limit));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  co_return hits;
}

asio::awaitable<Result<Json>> GetMemory(store::Store& store, std::string tenant_id,
                                        std::string agent_id, std::string id) {
  Json memory;
  Status read = co_await store::AsyncRead(store, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(memory, memory::GetJson(tx, tenant_id, agent_id, id));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  co_return memory;
}

plugins::MemoryReaders MemoryReadersOn(store::Store& store) {
  return [&store](const std::string& tenant_id, const std::string& agent_id) {
    plugins::MemoryReader reader;
    reader.search = [&store, tenant_id, agent_id](std::string query, std::string tag, int limit) {
      return SearchMemories(store, tenant_id, agent_id, std::move(query), std::move(tag), limit);
    };
    reader.get = [&store, tenant_id, agent_id](std::string id) {
      return GetMemory(store, tenant_id, agent_id, std::move(id));
    };
    return reader;
  };
}

// tool.after's payload.
Json ToolAfterPayload(const tools::CallRecord& r) {
  return Json{{"agent_id", r.agent_id},       {"session_id", r.session_id},
              {"run_id", r.run_id},           {"call_id", r.call->call_id},
              {"tool", r.call->tool},         {"arguments", r.call->arguments},
              {"status", r.call->status},     {"result", r.call->result},
              {"duration_ms", r.duration_ms}, {"effect_class", r.call->effect_class},
              {"decision", r.decision}};
}

// A memory.upsert call that succeeded is a memory.upsert@v1 as well, delivered the same way.
// The result has the memory without its text; the text is the call's.
std::optional<Json> MemoryUpsertPayload(const tools::CallRecord& r) {
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

asio::awaitable<void> PluginBridge::StopAgents() {
  for (const auto& p : host_->All()) co_await ForgetAgent(p->agent_id);
}

asio::awaitable<Result<std::shared_ptr<plugins::AgentPlugins>>> PluginBridge::PluginsOf(
    std::string tenant_id, std::string agent_id) {
  std::vector<store::Plugin> enabled;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(enabled, tx.plugins().PluginsForAgent(tenant_id, agent_id));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  co_return co_await UsePlugins(tenant_id, agent_id, enabled);
}

asio::awaitable<Result<std::shared_ptr<plugins::AgentPlugins>>> PluginBridge::PluginsFor(
    std::string tenant_id, std::string agent_id, std::vector<store::PluginStamp> stamps) {
  auto current = host_->Find(agent_id);
  if (current && current->tenant_id == tenant_id &&
      current->fingerprint == plugins::FingerprintOf(stamps)) {
    co_return current;
  }
  co_return co_await PluginsOf(std::move(tenant_id), std::move(agent_id));
}

asio::awaitable<std::shared_ptr<plugins::AgentPlugins>> PluginBridge::UsePlugins(
    std::string tenant_id, std::string agent_id, const std::vector<store::Plugin>& enabled) {
  auto loaded = host_->For(tenant_id, agent_id, enabled);
  if (!loaded.errors.empty()) co_await ReportPluginErrors(loaded.plugins, loaded.errors);
  if (loaded.started) {
    Json started = {{"agent_id", agent_id}};  // named: g++ 12 fails on a braced one here
    co_await Emit(loaded.plugins, "agent.started", std::move(started));
  }
  co_return loaded.plugins;
}

asio::awaitable<void> PluginBridge::EmitFor(std::string tenant_id, std::string agent_id,
                                            std::string family, Json payload) {
  auto plugins = co_await PluginsOf(tenant_id, agent_id);
  if (!plugins.ok()) co_return;
  co_await Emit(*plugins, std::move(family), std::move(payload));
}

asio::awaitable<void> PluginBridge::ForgetAgent(std::string agent_id) {
  // Dropped at once (a turn that starts meanwhile builds the agent's plugins anew); the
  // emission holds the dropped ones until their handlers are done.
  if (auto gone = host_->Forget(agent_id)) {
    Json stopped = {{"agent_id", agent_id}};  // named: g++ 12 fails on a braced one here
    co_await Emit(gone, "agent.stopped", std::move(stopped));
  }
}

asio::awaitable<plugins::Emitted> PluginBridge::Emit(std::shared_ptr<plugins::AgentPlugins> plugins,
                                                     std::string family, Json payload,
                                                     bool queue_webhooks) {
  queue_webhooks = queue_webhooks && !plugins->webhooks.empty();
  if (!plugins->bus.Has(family)) {
    if (queue_webhooks) QueueDeliveries(*plugins, family, payload);
    plugins::Emitted none;
    none.payload = std::move(payload);
    co_return none;
  }
  plugins::Emitted out;
  {
    // Lua handlers run here, on the io thread: the watchdog names them while they hold it (a
    // handler waiting on a memory read takes the marker down meanwhile: IoWorkPause).
    // A payload is the event's: its run_id may be absent or null (memory, session events).
    auto run = payload.is_object() ? payload.find("run_id") : payload.end();
    const std::string run_id =
        run != payload.end() && run->is_string() ? run->get<std::string>() : "";
    IoWork work(plugins->tenant_id, run_id,
                "plugin hook " + family + " of agent " + plugins->agent_id);
    out = co_await plugins->bus.Emit(family, std::move(payload));
  }
  if (queue_webhooks) QueueDeliveries(*plugins, family, out.payload);
  std::vector<plugins::PluginError> errors = out.errors;
  if (out.abort) errors.push_back(*out.abort);
  if (!errors.empty()) co_await ReportPluginErrors(plugins, std::move(errors));
  co_return out;
}

asio::awaitable<void> PluginBridge::ReportPluginErrors(
    std::shared_ptr<plugins::AgentPlugins> plugins, std::vector<plugins::PluginError> errors) {
  Json recorded = Json::array();
  for (const auto& e : errors) {
    Json payload = {{"agent_id", plugins->agent_id},
                    {"plugin_id", e.plugin_id},
                    {"event", e.event},
                    {"message", e.message}};
    LogError("plugin " + e.plugin_id + " (agent " + plugins->agent_id + ")" +
             (e.event.empty() ? "" : " on " + e.event) + ": " + e.message);
    recorded.push_back(payload);
    if (!plugins->webhooks.empty()) QueueDeliveries(*plugins, "plugin.error", payload);
    // The agent's own plugin.error listeners hear of it, except of their own failures (which
    // would repeat without end).
    if (e.event != "plugin.error@v1" && plugins->bus.Has("plugin.error")) {
      auto heard = co_await plugins->bus.Emit("plugin.error", payload);
      for (const auto& again : heard.errors) {
        recorded.push_back({{"agent_id", plugins->agent_id},
                            {"plugin_id", again.plugin_id},
                            {"event", again.event},
                            {"message", again.message}});
      }
    }
  }
  asio::co_spawn(executor_, RecordPluginErrors(plugins->tenant_id, plugins->agent_id, recorded),
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
  // Each hook calls a coroutine of this bridge, which outlives the gateway's calls.
  gateway_.AddVetoHook([this](const tools::CallRequest& c) { return ToolBefore(c); });
  // tool.after: its webhook deliveries go into the unit that records the call's result; the
  // agent's handlers hear of it once that unit committed.
  gateway_.SetOutboxHook([this](const tools::CallRecord& r) {
    auto p = host_->Find(r.agent_id);
    if (!p || p->webhooks.empty()) return std::vector<store::PluginDelivery>();
    auto out = DeliveriesFor(*p, "tool.after", ToolAfterPayload(r));
    if (auto upsert = MemoryUpsertPayload(r)) {
      for (auto& d : DeliveriesFor(*p, "memory.upsert", *upsert)) out.push_back(std::move(d));
    }
    return out;
  });
  gateway_.SetAfterHook([this](const tools::CallRecord& r) { return ToolAfter(r); });
  gateway_.SetAgentTools([this](const std::string& agent_id) {
    std::vector<std::shared_ptr<tools::Tool>> out;
    if (auto p = host_->Find(agent_id)) {
      for (const auto& [name, tool] : p->tools) out.push_back(tool);
    }
    return out;
  });
}

asio::awaitable<std::optional<tools::Veto>> PluginBridge::ToolBefore(const tools::CallRequest& c) {
  auto p = host_->Find(c.agent_id);
  if (p && p->broken) {
    co_return tools::Veto{
        "plugin " + p->broken->plugin_id + " could not be loaded: " + p->broken->message, true};
  }
  if (!p || !p->bus.Has("tool.before")) co_return std::nullopt;
  Json payload = {{"agent_id", c.agent_id},
                  {"session_id", c.session_id},
                  {"run_id", c.run_id},
                  {"call_id", c.call_id},
                  {"tool", c.tool},
                  {"arguments", c.arguments},
                  {"caller_role", c.caller_role}};
  auto out = co_await Emit(p, "tool.before", std::move(payload));
  if (out.abort) {
    co_return tools::Veto{
        "plugin " + out.abort->plugin_id + " failed deciding: " + out.abort->message, true};
  }
  if (out.denied) co_return tools::Veto{"plugin " + out.denied_by + ": " + out.reason};
  co_return std::nullopt;
}

asio::awaitable<void> PluginBridge::ToolAfter(const tools::CallRecord& r) {
  auto p = host_->Find(r.agent_id);
  if (!p) co_return;
  auto upsert = MemoryUpsertPayload(r);
  if (!p->Wants("tool.after") && !(upsert && p->Wants("memory.upsert"))) co_return;
  if (!p->webhooks.empty()) WakeDeliveries();
  if (p->bus.Has("tool.after")) {
    co_await Emit(p, "tool.after", ToolAfterPayload(r), /*queue_webhooks=*/false);
  }
  if (upsert && p->bus.Has("memory.upsert")) {
    co_await Emit(p, "memory.upsert", std::move(*upsert), /*queue_webhooks=*/false);
  }
}

asio::awaitable<Result<std::optional<std::string>>> PluginBridge::ChannelMessage(
    std::string family, std::string tenant_id, std::string agent_id, Json payload,
    std::optional<std::vector<store::PluginStamp>> stamps) {
  // The request body limit's default: a rewrite may not make more of a message than a client
  // may send (as for session.message.received@v1).
  constexpr size_t kMaxRewritten = 1 << 20;
  std::string content = payload.value("content", "");
  // Not a conditional expression: g++ 12 miscompiles a co_await in one (the result destroyed
  // twice).
  Result<std::shared_ptr<plugins::AgentPlugins>> found = Internal("no plugins");
  if (stamps) {
    found = co_await PluginsFor(std::move(tenant_id), std::move(agent_id), std::move(*stamps));
  } else {
    found = co_await PluginsOf(std::move(tenant_id), std::move(agent_id));
  }
  if (!found.ok()) co_return found.status();
  std::shared_ptr<plugins::AgentPlugins> plugins = std::move(found).value();
  if (!plugins->Wants(family)) co_return std::optional<std::string>(content);
  auto out = co_await Emit(plugins, family, std::move(payload));
  if (out.abort) {
    co_return InvalidArgument("plugin " + out.abort->plugin_id +
                              " refused the message: " + out.abort->message);
  }
  if (out.payload.value("drop", false) == true) co_return std::optional<std::string>();
  const Json& c = out.payload.contains("content") ? out.payload["content"] : Json();
  if (c.is_string() && !c.get_ref<const std::string&>().empty()) {
    const size_t most = std::max(content.size(), kMaxRewritten);
    if (c.get_ref<const std::string&>().size() > most) {
      co_return InvalidArgument("the agent's plugins rewrote the message to " +
                                std::to_string(c.get_ref<const std::string&>().size()) +
                                " bytes; a rewritten message may have at most " +
                                std::to_string(most) + " bytes");
    }
    content = c.get<std::string>();
  }
  co_return std::optional<std::string>(std::move(content));
}

}  // namespace keel::runtime

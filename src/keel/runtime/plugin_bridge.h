#pragma once
// runtime::PluginBridge — the runtime's side of plugins (docs/PLUGINS.md).
//
// It loads each agent's plugins on this node when the store's list of them changed, emits the
// catalog's events on the agent's bus, connects the gateway's hooks to the buses (tool.before
// vetoes, tool.after, memory.upsert, the tools Lua plugins add), reports the handlers that
// fail as plugin.error@v1, and sends webhook plugins' deliveries (plugin_events.cc,
// webhooks.cc).
//
// Everything here runs on the server's io executor; no member needs a lock. Emitting is
// awaited: a Lua handler waiting on a ctx.memory read suspends its emission without holding
// the event loop. Each emission holds the AgentPlugins it runs on (a rebuild or ForgetAgent
// may drop the host's copy meanwhile).

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/http/outbound_guard.h"
#include "keel/store/types.h"

namespace keel {
namespace store {
class Store;
}
namespace tools {
class Gateway;
struct CallRecord;
struct CallRequest;
struct Veto;
}  // namespace tools
namespace http {
class Client;
}
namespace secrets {
class Vault;
}
namespace plugins {
class PluginHost;
struct AgentPlugins;
struct Emitted;
struct PluginError;
}  // namespace plugins
}  // namespace keel

namespace keel::runtime {

class PluginBridge {
 public:
  // `audit_dir`: where the built-in audit-log plugin writes ({tenant}/{agent}.jsonl);
  // `outbound`: where webhook plugins' receivers may be (the tenant chose the URL);
  // `vault`: opens the secrets deliveries are signed with (null: deliveries are refused).
  // Connects the gateway's hooks at once.
  PluginBridge(boost::asio::any_io_executor executor, store::Store& store,
               tools::Gateway& gateway, std::string audit_dir, http::OutboundGuard outbound,
               const secrets::Vault* vault);
  ~PluginBridge();
  PluginBridge(const PluginBridge&) = delete;
  PluginBridge& operator=(const PluginBridge&) = delete;

  // Starts sending due webhook deliveries (on the leader). REQUIRES: once, on the executor.
  void Start();
  // A drain: StopDeliveries when it begins (nothing more is claimed or sent), StopAgents once
  // the runs stopped (every agent's plugins stop: agent.stopped@v1, one agent after another).
  void StopDeliveries();
  boost::asio::awaitable<void> StopAgents();

  // The agent's plugins as the store lists them now, built on this node when they changed
  // (emitting agent.started@v1 the first time); failures to load are reported as
  // plugin.error@v1. Fails only when the store does.
  boost::asio::awaitable<Result<std::shared_ptr<plugins::AgentPlugins>>> PluginsOf(
      std::string tenant_id, std::string agent_id);
  // This node's plugins of the agent when `stamps`, read from the store just now, say they are
  // current (no other read); else as PluginsOf builds them.
  boost::asio::awaitable<Result<std::shared_ptr<plugins::AgentPlugins>>> PluginsFor(
      std::string tenant_id, std::string agent_id, std::vector<store::PluginStamp> stamps);
  // The same for an enabled list the caller just read from the store. REQUIRES: `enabled`
  // stays valid until it completes.
  boost::asio::awaitable<std::shared_ptr<plugins::AgentPlugins>> UsePlugins(
      std::string tenant_id, std::string agent_id, const std::vector<store::Plugin>& enabled);
  // Emits on a bus already loaded; reports failed handlers (plugin.error@v1, in the log and to
  // the agent's plugin.error listeners), and queues the event's webhook deliveries in a unit
  // of their own. With queue_webhooks false the caller wrote them itself (DeliveriesFor, in
  // the unit of work the event is about).
  boost::asio::awaitable<plugins::Emitted> Emit(std::shared_ptr<plugins::AgentPlugins> plugins,
                                                std::string family, Json payload,
                                                bool queue_webhooks = true);
  // Emits `family` with the payload of its newest version on the agent's bus, loading the
  // agent's plugins first (for the API's events: session.opened, session.closed); a store
  // failure only costs the event.
  boost::asio::awaitable<void> EmitFor(std::string tenant_id, std::string agent_id,
                                       std::string family, Json payload);
  // channel.message.in@v1 or channel.message.out@v1 (Runtime::ChannelMessage).
  boost::asio::awaitable<Result<std::optional<std::string>>> ChannelMessage(
      std::string family, std::string tenant_id, std::string agent_id, Json payload,
      std::optional<std::vector<store::PluginStamp>> stamps);
  // The agent was deleted: drops its plugins on this node and emits agent.stopped@v1.
  boost::asio::awaitable<void> ForgetAgent(std::string agent_id);

  // The deliveries an event makes for the agent's webhook plugins (none written yet).
  std::vector<store::PluginDelivery> DeliveriesFor(const plugins::AgentPlugins& plugins,
                                                   const std::string& family,
                                                   const Json& payload) const;
  // Looks for webhook deliveries that are due now.
  void WakeDeliveries();

 private:
  boost::asio::awaitable<void> ReportPluginErrors(std::shared_ptr<plugins::AgentPlugins> plugins,
                                                  std::vector<plugins::PluginError> errors);
  // Appends plugin.error@v1 events (off the caller's path).
  boost::asio::awaitable<void> RecordPluginErrors(std::string tenant_id, std::string agent_id,
                                                  Json errors);
  void HookGateway();
  // The gateway's hooks: the agent's tool.before vetoes, and tool.after and memory.upsert.
  boost::asio::awaitable<std::optional<tools::Veto>> ToolBefore(const tools::CallRequest& call);
  boost::asio::awaitable<void> ToolAfter(const tools::CallRecord& record);
  // Writes an emitted event's deliveries in a unit of their own, then wakes the sender.
  void QueueDeliveries(const plugins::AgentPlugins& plugins, const std::string& family,
                       const Json& payload);
  // On the leader: claims due deliveries and sends them, signed, retried with backoff, dead
  // after the plugin's max_attempts.
  boost::asio::awaitable<void> DeliveryLoop();
  boost::asio::awaitable<void> Deliver(store::PluginDelivery delivery);

  boost::asio::any_io_executor executor_;
  store::Store& store_;
  tools::Gateway& gateway_;
  const secrets::Vault* vault_;
  std::unique_ptr<plugins::PluginHost> host_;
  std::unique_ptr<http::Client> webhook_client_;
  boost::asio::steady_timer delivery_timer_;
  bool stopping_ = false;
  bool delivery_wake_ = false;
  std::set<std::string> delivering_;  // deliveries being sent by this node
};

}  // namespace keel::runtime

#pragma once
// runtime::Intake — how a message becomes a run, and how a run is cancelled (intake.cc).
//
// PostMessage commits the message, its run and their events in one unit of work. When the
// session is idle and this node has a run slot for the tenant, that unit also claims the run
// (running, leased to this node) and the run starts here at once; otherwise the run is queued
// and the dispatcher is woken. A schedule's firing posts its prompt inside a unit of its own
// with the same three steps (Prepare, Write, After).
//
// Runs on the server's io executor; no member needs a lock.

#include <boost/asio/awaitable.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"
#include "keel/runtime/run_slots.h"
#include "keel/store/types.h"

namespace keel::plugins {
struct AgentPlugins;  // plugins/host.h
}

namespace keel::store {
class Store;
class Tx;
}  // namespace keel::store

namespace keel::runtime {

class Dispatcher;    // dispatcher.h
class EventHub;      // event_hub.h
class PluginBridge;  // plugin_bridge.h
class SettingsCache;  // settings_cache.h

struct IntakeRequest {
  std::string tenant_id;
  std::string session_id;
  std::string content;
  std::string idempotency_key;  // empty: none
  std::string requested_by;     // the caller's token id
  // owner | user | guest: bounds the run's tool calls; a guest posts only to the sessions it
  // opened (access::CanUseSession, checked by PostMessage), others get kNotFound.
  std::string caller_role = "owner";
  // Whom the run acts for beside the token (store::Run::user_id, channel_id): a chat message's
  // sender and channel, a webhook's channel, a slot's schedule's; "" for none.
  std::string user_id;
  std::string channel_id;
  // An introspection run (docs/CONTEXT.md) instead of a user's message: the message is recorded
  // with role "introspection", is shown to no plugin, and its run tends the session's
  // description and the agent's working memory with the introspection tools.
  bool introspection = false;
  // A direct tool call instead of a message for the model (Keel as an MCP server):
  // {"name", "arguments"}. The run passes that one call through the gateway, with its policy
  // and approvals, and ends with the call's answer; the model is never asked. The message is
  // recorded with role "call" and the call as its content. Null: an ordinary message.
  Json call;
  // The caller tells no one of the message before its run ends or the caller's wait for it
  // runs out, and then only after store::AsyncFlush (api::WaitForRun): the message and its
  // run are written with Store::WriteDeferred, so that a turn that ends at once commits once.
  bool answered_after_run = false;
  // Written in the unit that writes the message and its run (the run as written), never on a
  // replay: what the caller owes the run, such as a channel's reply to it. Its failure fails
  // the unit.
  std::function<Status(store::Tx&, const store::Run&)> with_run;
};

struct IntakeResult {
  store::Message message;
  store::Run run;
  bool replayed = false;  // the idempotency key matched an earlier message
};

class Intake {
 public:
  // `lease_ms`: the lease a claimed run starts with; `tenant_run_cap`: the most runs a tenant
  // may have in flight (queued, running or waiting) before intake refuses more.
  Intake(store::Store& store, Dispatcher& dispatcher, EventHub& hub, PluginBridge& plugins,
         const SettingsCache& settings, int lease_ms, int tenant_run_cap);

  // Validates and commits a user message and its run. kNotFound for an unknown session,
  // kConflict for an inactive session or a busy one whose agent rejects while busy,
  // kRateLimited when the tenant has too many runs in flight.
  boost::asio::awaitable<Result<IntakeResult>> PostMessage(const IntakeRequest& request);

  // Cancels a run: at once when it is not executing, at its next step boundary otherwise.
  // kConflict when it already ended.
  boost::asio::awaitable<Result<store::Run>> Cancel(const std::string& tenant_id,
                                                    const std::string& run_id);

  // The unit of work of intake, in three parts so that another unit (a schedule's firing) can
  // post a message inside itself: Prepare (before the unit: ids, times, whether this node may
  // claim the run), Write (inside it), After (once it committed: start the run
  // here if the unit claimed it, else wake the dispatcher).
  struct Unit {
    IntakeRequest request;
    store::Agent agent;
    bool reject_when_busy = false;
    bool may_claim = false;
    RunSlots::Hold slot;  // held while may_claim: the slot the claimed run executes in
    std::string origin;
    Millis now = 0;
    Json trigger;        // what posted the message, for run.queued@v1 (a schedule); null: a client
    // The unit created the session itself just before (a schedule's new session): it is the
    // agent's, active and idle, so intake need not read it back.
    bool new_session = false;
    // The caller read the session just before the unit (outside the writer) and found it
    // idle: the unit does not read it again, and its claim marks the session running only if
    // it is still idle and the tenant under its cap (runs::IdleGuard); otherwise the unit fails
    // with kConflict and the caller runs it again without this.
    bool idle_when_read = false;
    IntakeResult out;    // the message and the run to write
    // The agent's plugins when the caller found them (PostMessage does), handed to the run the
    // unit claims; otherwise the run looks for them.
    std::shared_ptr<plugins::AgentPlugins> plugins;
    std::string session_instructions;  // the session's own, for the run the unit claims
    // Set by Write:
    bool busy = false;     // the session had an unfinished run
    bool claimed = false;  // the run was written running, with this node's lease
    store::Run written;    // the run as the unit wrote it (queued, or running when claimed)
    bool refused = false;  // a check refused the message before anything was written
    std::optional<IntakeResult> replay;  // the idempotency key matched an earlier message
  };
  Unit Prepare(const IntakeRequest& request, const store::Agent& agent, std::string content);
  // Checks the session (the agent's, not inactive, busy policy) and the tenant's run cap, then
  // writes the message, its run (claimed when it may be) and their events. A refusal
  // (kNotFound, kConflict, kRateLimited) comes before any write and sets `refused`.
  Status Write(store::Tx& tx, Unit& unit);
  // Once the unit committed: launches the run it claimed (moving its `written` run, agent and
  // plugins into it; `out` stays), or wakes the dispatcher for a queued one.
  void After(Unit& unit);

 private:
  Status Check(store::Tx& tx, Unit& unit);

  store::Store& store_;
  Dispatcher& dispatcher_;
  EventHub& hub_;
  PluginBridge& plugins_;
  const SettingsCache& settings_;
  const int lease_ms_;
  const int tenant_run_cap_;
};

}  // namespace keel::runtime

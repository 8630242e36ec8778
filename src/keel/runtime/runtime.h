#pragma once
// runtime::Runtime — turns messages into runs and runs into steps.
//
// Intake (PostMessage) commits the message, its run (queued) and their events in one unit of
// work, then wakes the dispatcher. The dispatcher claims runnable runs with a lease — one run
// per session at a time, many sessions at once — and executes each as a coroutine: assemble
// context, call the model, pass each tool call through the Gateway, record every model response
// and tool result as a step when it happens, loop until a final answer or the step limit.
// A run whose process died is resumed from its last recorded step (DESIGN.md invariant 11).
//
// Everything here runs on the server's single io executor; no member needs a lock.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <span>
#include <string>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"
#include "keel/store/compaction_store.h"
#include "keel/store/schedule_store.h"
#include "keel/config/config.h"
#include "keel/http/outbound_guard.h"
#include "keel/runtime/conversation_cache.h"
#include "keel/runtime/run_slots.h"
#include "keel/store/skill_store.h"
#include "keel/store/store.h"
#include "keel/store/usage_store.h"

namespace keel {
struct Metrics;
namespace model {
class Provider;
class ProviderRegistry;
struct ModelRequest;
}
namespace tools {
class Gateway;
}
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

class EventHub;
struct ModelCall;      // model_calls.h
struct FailedSummary;  // model_calls.h
struct HistoryMark;    // model_calls.h

// Wall-clock time in milliseconds. The runtime's schedules read it through RuntimeOptions, so a
// test can run them on a clock it moves; the server uses NowMillis.
using Clock = std::function<Millis()>;

struct RuntimeOptions {
  int max_concurrent_runs = 256;
  // Of those, the most one tenant's runs take at once on this node (run_slots.h); its further
  // runs stay queued while other tenants' are claimed. Clamped to [1, max_concurrent_runs].
  int tenant_max_running = 64;
  int lease_ms = 30000;
  int default_max_steps = 16;
  int history_limit = 50;
  int tenant_run_cap = 1000;
  std::string audit_dir;  // where the built-in audit-log plugin writes ({tenant}/{agent}.jsonl)
  Clock clock;            // for schedules; empty: NowMillis
  // The model router (model_calls.h): prices by model string, and the response cache.
  std::map<std::string, config::ModelPrice> prices;
  config::CacheConfig cache;
  // Where webhook plugins' receivers may be (the tenant chose the URL).
  http::OutboundGuard outbound;
};


struct IntakeRequest {
  std::string tenant_id;
  std::string session_id;
  std::string content;
  std::string idempotency_key;  // empty: none
  std::string requested_by;     // the caller's token id
  // owner | user | guest: bounds the run's tool calls; a guest posts only to the sessions it
  // opened (access::CanUseSession, checked by PostMessage), others get kNotFound.
  std::string caller_role = "owner";
  // An introspection run (docs/CONTEXT.md) instead of a user's message: the message is recorded
  // with role "introspection", is shown to no plugin, and its run tends the session's
  // description and the agent's working memory with the introspection tools.
  bool introspection = false;
  // A direct tool call instead of a message for the model (Keel as an MCP server):
  // {"name", "arguments"}. The run passes that one call through the gateway, with its policy
  // and approvals, and ends with the call's answer; the model is never asked. The message is
  // recorded with role "call" and the call as its content. Null: an ordinary message.
  Json call;
};

struct IntakeResult {
  store::Message message;
  store::Run run;
  bool replayed = false;  // the idempotency key matched an earlier message
};

class Runtime {
 public:
  Runtime(boost::asio::any_io_executor executor, store::Store& store, EventHub& hub,
          model::ProviderRegistry& providers, tools::Gateway& gateway, Metrics& metrics,
          RuntimeOptions options, const secrets::Vault* vault = nullptr);
  ~Runtime();

  // Expires leases this origin held before a restart and starts the dispatcher and the lease
  // keeper. REQUIRES: called once, on the executor.
  Status Start();
  // Stops claiming new runs; waits up to `grace` for executing runs to reach a step boundary.
  boost::asio::awaitable<void> Drain(std::chrono::milliseconds grace);

  // Validates and commits a user message and its run. kNotFound for an unknown session,
  // kConflict for an inactive session or a busy one whose agent rejects while busy,
  // kRateLimited when the tenant has too many runs in flight.
  boost::asio::awaitable<Result<IntakeResult>> PostMessage(const IntakeRequest& request);

  // Cancels a run: at once when it is not executing, at its next step boundary otherwise.
  // kConflict when it already ended.
  boost::asio::awaitable<Result<store::Run>> Cancel(const std::string& tenant_id,
                                                    const std::string& run_id);

  // Wakes the dispatcher to look for runnable runs.
  void Wake();

  // Plugins (docs/PLUGINS.md). The agent's plugins as the store lists them now, built on this
  // node when they changed (emitting agent.started@v1 the first time); failures to load are
  // reported as plugin.error@v1. Fails only when the store does.
  boost::asio::awaitable<Result<std::shared_ptr<plugins::AgentPlugins>>> PluginsOf(
      std::string tenant_id, std::string agent_id);
  // Emits `family` with the payload of its newest version on the agent's bus and reports the
  // handlers that failed. For the API's events (session.opened, session.closed): loads the
  // agent's plugins first; a store failure only costs the event.
  boost::asio::awaitable<void> EmitFor(std::string tenant_id, std::string agent_id,
                                       std::string family, Json payload);
  // The agent was deleted: emits agent.stopped@v1 and drops its plugins on this node.
  void ForgetAgent(const std::string& agent_id);
  // Looks for webhook deliveries that are due now.
  void WakeDeliveries();
  // Looks for due schedules now (a schedule was created or resumed on this node, or the test
  // clock moved). Other nodes' new schedules are seen within a second.
  void WakeSchedules();

  const RuntimeOptions& options() const { return options_; }

 private:
  class Execution;
  boost::asio::awaitable<void> DispatchLoop();
  boost::asio::awaitable<void> LeaseLoop();
  // What intake already read for a run it claimed, so execution need not read it again.
  struct Known {
    store::Agent agent;
    store::Message prompt;
    // The plugins enabled for the agent, when intake read them (a schedule's does not).
    std::optional<std::vector<store::Plugin>> enabled;
  };
  // What a model turn's context is assembled from (ReadContext), read in the same snapshot as
  // the rest of what the run loads.
  struct ContextRead {
    std::optional<store::Compaction> summary;  // the session's newest compaction
    // The conversation since it before the run's prompt, oldest first: a view into `known`.
    std::span<const store::Message> window;
    // The session's conversation as this node knew it (out of conversations_ for the read),
    // and what the read added to it: KeepWindow merges them and points `window` into it.
    std::unique_ptr<ConversationEntry> known;
    int64_t fetched_from = 0;
    store::Conversation fetched;
    std::vector<store::Skill> skills;          // the agent's, without their files
    store::Session session;                    // an introspection run's, for its description
  };
  // Intake's unit of work, in three parts so that another unit (a schedule's firing) can post
  // a message inside itself: PrepareIntake (before the unit: ids, times, whether this node may
  // claim the run), WriteIntake (inside it), AfterIntake (once it committed: start the run
  // here if the unit claimed it, else wake the dispatcher).
  struct IntakeUnit {
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
    IntakeResult out;    // the message and the run to write
    // The agent's enabled plugins when the caller read them (PostMessage does), handed to the
    // run the unit claims; otherwise the run reads them.
    std::optional<std::vector<store::Plugin>> enabled;
    // Set by WriteIntake:
    bool busy = false;     // the session had an unfinished run
    bool claimed = false;  // the run was written running, with this node's lease
    store::Run written;    // the run as the unit wrote it (queued, or running when claimed)
    bool refused = false;  // a check refused the message before anything was written
    std::optional<IntakeResult> replay;  // the idempotency key matched an earlier message
  };
  IntakeUnit PrepareIntake(const IntakeRequest& request, const store::Agent& agent,
                           std::string content);
  // Checks the session (the agent's, not inactive, busy policy) and the tenant's run cap, then
  // writes the message, its run (claimed when it may be) and their events. A refusal
  // (kNotFound, kConflict, kRateLimited) comes before any write and sets `refused`.
  Status WriteIntake(store::Tx& tx, IntakeUnit& unit);
  Status CheckIntake(store::Tx& tx, IntakeUnit& unit);
  void AfterIntake(IntakeUnit& unit);
  // Executes a run in `slot`, which it gives back when it ends; with `known`, intake already
  // holds its lease, otherwise RunOne claims it.
  boost::asio::awaitable<void> RunOne(store::Run run, std::optional<Known> known,
                                      RunSlots::Hold slot);
  // Marks a run as held by this node and starts executing it in `slot`. REQUIRES: slot.
  void Launch(store::Run run, std::optional<Known> known, RunSlots::Hold slot);
  // Puts a run that found its approval still pending back to waiting_for_approval.
  boost::asio::awaitable<Status> ParkAgain(const store::Run& run, const std::string& call_id);
  // Context assembly (context.cc): fills request.messages for a model turn of `run`: the
  // system prompt (the agent's instructions, the index of its skills, the summary of the
  // session's compacted turns), the messages since that summary, the prompt. When they would
  // exceed the agent's budget (config.context_tokens) or history_limit, the oldest are first
  // summarized by the agent's model, through CallModel (cache, budgets, fallback, metering),
  // into a compaction record, each recorded as a step of the run (appended to `steps`) with
  // its usage and session.compacted@v1. Brings the agent's skills in its workspace up to date
  // first. On failure, `error_code` is the run's error code (internal, compaction_failed,
  // budget_exceeded, plugin_failed; empty when the store failed and the run is left to resume
  // after its lease), and `failed` the failed compaction step when a summary call failed.
  // `history` marks the session's messages in request.messages (model_calls.h).
  Status ReadContext(store::Tx& tx, const store::Run& run, const store::Message& prompt,
                     ContextRead& out);
  // Inside ReadContext and after a compaction: the session's newest compaction and what the
  // conversation since it (at most window_limit messages) has that `read.known` lacks.
  Status ReadWindow(store::Tx& tx, const store::Run& run, int window_limit, ContextRead& read);
  // Once the read is back on the io thread: the conversation merged and kept for the next
  // turn, and the run's window (what precedes its prompt) taken from it.
  void KeepWindow(const store::Run& run, ContextRead& read);
  boost::asio::awaitable<Status> AssembleContext(const store::Run& run, const store::Agent& agent,
                                                 const store::Message& prompt,
                                                 const plugins::AgentPlugins& plugins,
                                                 ContextRead read,
                                                 model::ModelRequest& request,
                                                 std::vector<store::Step>& steps,
                                                 std::string& error_code,
                                                 std::optional<FailedSummary>& failed,
                                                 HistoryMark& history);
  // Introspection's triggers (introspection.cc). After a run of the session ended `done` (not
  // a direct call or an introspection) and its agent has triggers: posts an introspection run
  // when the agent's every_turns is reached, and moves the session's idle introspection to
  // idle_seconds from now.
  void TurnEnded(const store::Run& run);
  boost::asio::awaitable<void> AfterTurn(store::Run run);
  // Posts an introspection run in the session through the normal intake (queued behind its
  // runs); `key` makes it idempotent.
  boost::asio::awaitable<void> Introspect(std::string tenant_id, std::string session_id,
                                          std::string trigger, std::string key);
  // Posts the idle introspections that are due (on the leader), every second.
  boost::asio::awaitable<void> IntrospectionLoop();
  // In the unit that ends an introspection run `done`: introspection.completed@v1.
  static Status IntrospectionCompleted(store::Tx& tx, const store::Run& run,
                                       const std::string& trigger);
  // Makes the agent's workspace hold copies of exactly `skills` (its assigned ones, read
  // without files), reading the files of those whose copy is not current.
  boost::asio::awaitable<Status> SyncSkills(const store::Run& run,
                                            std::vector<store::Skill> skills);
  // The reason of an emergency stop in force for the run's agent, if any; from `stops` when
  // the caller just read them, else read now.
  boost::asio::awaitable<std::optional<std::string>> StopFor(
      const store::Run& run, const std::vector<store::EmergencyStop>* stops = nullptr);
  // One model call: cache, budgets, the agent's model and its fallback, metering
  // (model_calls.cc). `history`, when given, marks the request's history for its cache key.
  boost::asio::awaitable<ModelCall> CallModel(const store::Run& run, const store::Agent& agent,
                                              const model::ModelRequest& request,
                                              std::function<void(const std::string&)> on_delta,
                                              const HistoryMark* history = nullptr);
  // Prunes the response cache (on the leader): expired entries, and the oldest beyond the bound.
  boost::asio::awaitable<void> CachePruneLoop();
  // Queues an answer for the response cache; queued answers are written together, in one unit
  // of work a moment later, so that a miss does not cost a commit of its own.
  void QueueCacheEntry(store::CacheEntry entry);
  boost::asio::awaitable<void> FlushCacheEntries();  // after a moment, WriteCacheEntries
  void WriteCacheEntries();                          // one unit, not awaited
  // Expires pending approvals past their time (on the leader), every second.
  boost::asio::awaitable<void> ApprovalExpiryLoop();
  // The agent's plugins for the enabled list just read from the store (see PluginsOf).
  std::shared_ptr<plugins::AgentPlugins> UsePlugins(const std::string& tenant_id,
                                                    const std::string& agent_id,
                                                    const std::vector<store::Plugin>& enabled);
  // Emits on a bus already loaded; reports failed handlers (plugin.error@v1, in the log and to
  // the agent's plugin.error listeners).
  // With queue_webhooks false the caller wrote the event's webhook deliveries itself (in the
  // unit of work the event is about).
  plugins::Emitted Emit(const plugins::AgentPlugins& plugins, const std::string& family,
                        Json payload, bool queue_webhooks = true);
  // Reports handlers that failed or plugins that did not load.
  void ReportPluginErrors(const plugins::AgentPlugins& plugins,
                          const std::vector<plugins::PluginError>& errors);
  // Appends plugin.error@v1 events (off the caller's path).
  boost::asio::awaitable<void> RecordPluginErrors(std::string tenant_id, std::string agent_id,
                                                  Json errors);
  // Connects the gateway's veto, after and agent-tools hooks to the agents' plugins.
  void HookGateway();
  // Webhook plugins (webhooks.cc): queue an emitted event for the agent's webhook plugins
  // that subscribe to it; send due deliveries (on the leader), signed, retried with backoff,
  // dead after the plugin's max_attempts.
  void QueueDeliveries(const plugins::AgentPlugins& plugins, const std::string& family,
                       const Json& payload);
  // The deliveries an event makes for the agent's webhook plugins (none written yet).
  std::vector<store::PluginDelivery> DeliveriesFor(const plugins::AgentPlugins& plugins,
                                                   const std::string& family,
                                                   const Json& payload) const;
  boost::asio::awaitable<void> DeliveryLoop();
  boost::asio::awaitable<void> Deliver(store::PluginDelivery delivery);
  // Schedules (schedules.cc): on the leader, fires due slots, up to kMaxFiring at once, and
  // sleeps until the earliest next slot (at most a second). FireSchedule handles one due
  // schedule in one unit of work: the slot recorded, the schedule advanced, the prompt posted.
  // FireGroup posts several due slots in one unit of work, each exactly as FireSchedule would,
  // and hands a slot that needs more (a skip, a refusal, a plugin hook) to FireSchedule.
  struct SlotPost;  // one slot's prompt, prepared before the unit (schedules.cc)
  boost::asio::awaitable<void> ScheduleLoop();
  boost::asio::awaitable<void> FireSchedule(store::Schedule schedule, Millis firing_since);
  boost::asio::awaitable<void> FireGroup(std::vector<store::Schedule> group, Millis firing_since);
  // Inside the unit: records the slot, advances the schedule and posts the prompt (nothing when
  // the slot is stale: dealt with meanwhile). Once committed: starts or queues the run.
  Status WriteSlotPost(store::Tx& tx, SlotPost& post);
  void AfterSlotPost(SlotPost& post);
  // Before the unit: the new session (when the schedule names none) and intake's ids.
  void PrepareSlotPost(SlotPost& post, std::string prompt);
  Millis Now() const { return options_.clock ? options_.clock() : NowMillis(); }

  boost::asio::any_io_executor executor_;
  store::Store& store_;
  EventHub& hub_;
  model::ProviderRegistry& providers_;
  tools::Gateway& gateway_;
  Metrics& metrics_;
  const RuntimeOptions options_;

  boost::asio::steady_timer wake_timer_;
  bool wake_pending_ = false;
  bool draining_ = false;
  std::set<std::string> executing_;         // run ids claimed or running on this node
  RunSlots slots_;  // this node's run slots, in total and per tenant
  std::set<std::string> cancel_requested_;  // executing runs asked to stop
  std::unique_ptr<plugins::PluginHost> plugins_;
  const secrets::Vault* vault_;
  std::unique_ptr<http::Client> webhook_client_;
  boost::asio::steady_timer delivery_timer_;
  bool delivery_wake_ = false;
  std::set<std::string> delivering_;  // deliveries being sent by this node
  boost::asio::steady_timer schedule_timer_;
  bool schedule_wake_ = true;         // the first round does not wait
  std::set<std::string> firing_;      // schedules being fired by this node
  std::vector<store::CacheEntry> cache_pending_;  // answers not written to the cache yet
  ConversationCache conversations_{64u << 20};    // sessions' conversations, 64 MiB of text
  bool cache_flush_scheduled_ = false;
};

}  // namespace keel::runtime

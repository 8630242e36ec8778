#pragma once
// runtime::Runtime — turns messages into runs and runs into steps.
//
// The path of a turn, part by part:
//   intake.h         Intake::PostMessage commits the message, its run and their events in one
//                    unit of work, claiming the run at once when its session is idle;
//   dispatcher.h     the Dispatcher starts claimed runs and claims runnable ones, one run per
//                    session at a time, many sessions at once, within this node's run slots,
//                    and renews their leases;
//   RunOne           (run_executor.cc, below) executes one run as a coroutine: assemble the
//                    context (context.cc), call the model (model_calls.h: ModelCaller), pass
//                    each tool call through the Gateway, record every model response and tool
//                    result as a step when it happens (runs/run_state.h writes every status),
//                    loop until a final answer or the step limit;
//   plugin_bridge.h  the agent's plugins hear each step of it on their bus.
// A run whose process died is resumed from its last recorded step (DESIGN.md invariant 11).
// Runtime owns those parts, starts and drains them, and runs the leader's background loops:
// schedules (schedules.cc), idle introspection (introspection.cc) and approval expiry.
//
// Everything here runs on the server's single io executor; no member needs a lock.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"
#include "keel/config/config.h"
#include "keel/http/outbound_guard.h"
#include "keel/runtime/conversation_cache.h"
#include "keel/runtime/dispatcher.h"
#include "keel/runtime/intake.h"
#include "keel/runtime/settings_cache.h"
#include "keel/store/compaction_store.h"
#include "keel/store/schedule_store.h"
#include "keel/store/skill_store.h"
#include "keel/store/store.h"
#include "keel/store/usage_store.h"

namespace keel {
struct Metrics;
namespace model {
class ProviderRegistry;
struct ModelRequest;
}
namespace tools {
class Gateway;
}
namespace secrets {
class Vault;
}
namespace plugins {
struct AgentPlugins;
}
}  // namespace keel

namespace keel::runtime {

class EventHub;
class PluginBridge;    // plugin_bridge.h
class ModelCaller;     // model_calls.h
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
  // Where a fatal signal leaves the runs it stopped (runtime/crash_note.h); "" for none.
  std::string crash_note;
  Clock clock;            // for schedules; empty: NowMillis
  // The model router (model_calls.h): prices by model string, and the response cache.
  std::map<std::string, config::ModelPrice> prices;
  config::CacheConfig cache;
  // Where webhook plugins' receivers may be (the tenant chose the URL).
  http::OutboundGuard outbound;
};

// Work a run's ending owes (Runtime::SetEndingWork): `write` in the unit that ends the run,
// after runs::Finish, with the run as ended (it may run twice: docs/decisions/0014); `after` on
// the executor once that unit committed (true) or failed (false), always called once.
struct EndingWork {
  std::function<Status(store::Tx&, const store::Run&)> write;
  std::function<void(bool committed)> after;
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
  // Drains the node: intake and new streams refuse (503), live streams end (their clients
  // reconnect), no new run is claimed, and each executing run goes back to the queue at its
  // next step boundary (runs::Release) for another node, or this one restarted, to go on with;
  // returns once none executes or `grace` has passed.
  boost::asio::awaitable<void> Drain(std::chrono::milliseconds grace);
  // Since Drain began.
  bool draining() const;

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

  // Plugins (plugin_bridge.h): the agent's plugins as the store lists them now; an API event
  // emitted on the agent's bus; a deleted agent's plugins stopped; due webhook deliveries.
  boost::asio::awaitable<Result<std::shared_ptr<plugins::AgentPlugins>>> PluginsOf(
      std::string tenant_id, std::string agent_id);
  boost::asio::awaitable<void> EmitFor(std::string tenant_id, std::string agent_id,
                                       std::string family, Json payload);
  boost::asio::awaitable<void> ForgetAgent(std::string agent_id);
  // channel.message.in@v1 (`family` "channel.message.in": a message that came through a
  // channel) or channel.message.out@v1 ("channel.message.out": an answer a channel sends) on the
  // agent's bus, `payload` holding its "content": the content as the agent's plugins leave it,
  // or nullopt when one of them set "drop". kInvalidArgument when a handler failed (the message
  // is refused, as intake refuses one) or a rewrite grew it past the request limit's default.
  // `stamps`: the agent's plugin stamps when the caller read them (PluginStampsForAgentLater),
  // so that plugins this node holds current are used without a read.
  boost::asio::awaitable<Result<std::optional<std::string>>> ChannelMessage(
      std::string family, std::string tenant_id, std::string agent_id, Json payload,
      std::optional<std::vector<store::PluginStamp>> stamps = std::nullopt);
  void WakeDeliveries();

  // `ask` is asked on the executor as an execution ends a run (done, failed or cancelled at a
  // step boundary; not an ending written elsewhere, such as a cancel of a queued run) for the
  // work the run's ending owes (EndingWork; empty for none). One asker: the channels' relay,
  // which claims a chat's answer with its run's end. REQUIRES: called on the executor.
  void SetEndingWork(std::function<EndingWork(const store::Run&)> ask);

  // Looks for due schedules now (a schedule was created or resumed on this node, or the test
  // clock moved). Other nodes' new schedules are seen within a second.
  void WakeSchedules();

  const RuntimeOptions& options() const { return options_; }

 private:
  class Execution;
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
    // The run's session: its instructions (from intake when it claimed the run), and an
    // introspection run's description.
    store::Session session;
    bool session_read = false;  // ReadContext reads it (not claimed at intake, or introspection)
  };
  // Dispatcher::Execute: claims a run (unless intake did: `known`) and executes it in `slot`,
  // which it gives back when it ends (run_executor.cc).
  boost::asio::awaitable<void> RunOne(store::Run run, std::optional<KnownRun> known,
                                      RunSlots::Hold slot);
  // Puts a run that found its approval still pending back to waiting_for_approval.
  boost::asio::awaitable<Status> ParkAgain(const store::Run& run, const std::string& call_id);
  // Gives an executing run back to the queue at a step boundary while the node drains.
  boost::asio::awaitable<void> ReleaseRun(const store::Run& run);
  // Context assembly (context.cc): fills request.messages for a model turn of `run`: the
  // system prompt (the agent's instructions, the index of its skills, the summary of the
  // session's compacted turns), the messages since that summary, the prompt. When they would
  // exceed the agent's budget (config.context_tokens) or history_limit, the oldest are first
  // summarized by the agent's model, through ModelCaller::Call (cache, budgets, fallback,
  // metering), into a compaction record, each recorded as a step of the run (appended to
  // `steps`) with its usage and session.compacted@v1. Brings the agent's skills in its
  // workspace up to date first. On failure, `error_code` is the run's error code (internal,
  // compaction_failed, budget_exceeded, plugin_failed; empty when the store failed and the run
  // is left to resume after its lease), and `failed` the failed compaction step when a summary
  // call failed.
  // `history` marks the session's messages in request.messages (model_calls.h).
  Status ReadContext(store::Tx& tx, const store::Run& run, const store::Message& prompt,
                     ContextRead& out);
  // Inside ReadContext and after a compaction: the session's newest compaction and what the
  // conversation since it (at most window_limit messages) has that `read.known` lacks.
  Status ReadWindow(store::Tx& tx, const store::Run& run, int window_limit, ContextRead& read);
  // Once the read is back on the io thread: the conversation merged and kept for the next
  // turn, and the run's window (what precedes its prompt) taken from it.
  void KeepWindow(const store::Run& run, ContextRead& read);
  boost::asio::awaitable<Status> AssembleContext(
      const store::Run& run, const store::Agent& agent, const store::Message& prompt,
      const std::shared_ptr<plugins::AgentPlugins>& plugins, ContextRead read,
      model::ModelRequest& request, std::vector<store::Step>& steps, std::string& error_code,
      std::optional<FailedSummary>& failed, HistoryMark& history);
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
  // Expires pending approvals past their time (on the leader), every second.
  boost::asio::awaitable<void> ApprovalExpiryLoop();
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

  SettingsCache settings_{4096};  // agents' settings between turns (intake's and the runs')
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<PluginBridge> plugins_;
  std::unique_ptr<ModelCaller> models_;
  std::unique_ptr<Intake> intake_;
  boost::asio::steady_timer schedule_timer_;
  bool schedule_wake_ = true;         // the first round does not wait
  std::set<std::string> firing_;      // schedules being fired by this node
  ConversationCache conversations_{64u << 20};    // sessions' conversations, 64 MiB of text
  std::function<EndingWork(const store::Run&)> ending_work_;  // SetEndingWork
};

}  // namespace keel::runtime

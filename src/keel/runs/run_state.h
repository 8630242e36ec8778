#pragma once

// The run state machine: every change of a run's status, and of a tool call's, is one function
// here.
//
//   run:       queued -> running -> (waiting_for_approval | released -> queued) -> done | failed |
//              cancelled
//   tool call: proposed -> denied | awaiting_approval -> approved | rejected -> started ->
//              succeeded | failed | unknown
//
// Each function runs inside its caller's unit of work (the `store::Tx` of one `Store::Write`),
// so that the transition, the rows the caller writes beside it (a step, a tool call, a message)
// and their events commit together or not at all. Each one checks that the run is in a state
// the transition leaves from, and a transition of a running run checks that the execution
// asking still holds it (`Held`: this node's lease, at the attempt it claimed); it then writes
// the run, its session's status and the transition's event. Nothing else writes `runs.status`,
// a session's status on a run's behalf, or `tool_calls.status`: intake, the executor, context
// assembly, the gateway and the approval decision ask for a transition here. A lease is taken
// and released here too; between the two, only its holder extends it (the runtime's lease
// keeper, `RunStore::RenewLeases`), and a node starting again ends its own dead leases
// (`RunStore::ExpireLeasesOf`), which changes no status.
//
// Pure functions over the store's ports: no I/O of their own, no threads, no clock (the caller
// passes `now`).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"
#include "keel/store/types.h"

namespace keel::store {
class Tx;
}

namespace keel::runs {

// The execution that holds a running run: the node (origin) that claimed it and the attempt.
struct Holder {
  std::string origin;
  int attempt = 0;
};

// The holder a run names (its lease owner and attempt), as the execution that claimed it sees it.
inline Holder HolderOf(const store::Run& run) { return {run.lease_owner, run.attempt}; }

// The run as committed, when `holder` still holds it (running, leased to that origin, at that
// attempt); kConflict when another execution took it or it ended. Every transition of a running
// run starts here, so a node that lost the run while paused past its lease writes nothing more
// for it.
Result<store::Run> Held(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                        const Holder& holder);
inline Result<store::Run> Held(store::Tx& tx, const store::Run& mine) {
  return Held(tx, mine.tenant_id, mine.id, HolderOf(mine));
}

// The lease a node takes on a run it claims: its origin, until when.
struct Lease {
  std::string origin;
  Millis until = 0;
};

// What the session must still be for a claim whose unit did not read it (RunStore::
// StartIdleSession): its agent's, and its tenant under `max_active` runs in flight.
struct IdleGuard {
  std::string agent_id;
  int64_t max_active = 0;
};

// A new run (`run` as intake made it, queued): written queued, with run.queued@v1 carrying
// `queued_payload`; or, with `claim` (intake's node has room and the session is idle), running
// at once (attempt 1, leased, the session running) with run.started@v1 after it. With `guard`,
// the session is marked running only if it is still idle (the unit fails otherwise). Returns
// the run as written.
Result<store::Run> Create(store::Tx& tx, store::Run run, const Json& queued_payload, Millis now,
                          const std::optional<Lease>& claim,
                          const std::optional<IdleGuard>& guard = std::nullopt);

// What a claim found.
struct Claim {
  store::Run run;      // running, leased to the claiming node, at its next attempt
  bool resumed = false;  // it was running under a lease that ran out (its node died)
  // Not empty: the run stopped its node too often at one point (or stalled the io thread) and
  // is not resumed. It is not claimed either (`run` is as found, its lease run out, no
  // run.started@v1): the caller fails it with this reason in the same unit (Finish ends it as
  // found), so that a kill between a claim and its ending cannot add a try.
  std::string poison;
};

// queued -> running, or running with an expired lease -> running again (a resumption): the
// run locked (skipped when another node's claim holds it), attempt + 1, leased to `origin` until
// `now + lease_ms`, the session running, run.started@v1. kConflict when it is not claimable.
Result<Claim> ClaimRun(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                       const std::string& origin, Millis now, int64_t lease_ms);

// This node crashed (a fatal signal) while it executed `attempt` of the run, as its crash note
// says at the restart (runtime/crash_note.h): run.crashed@v1, which the poison check of the
// run's next claim counts, when the run is still running at that attempt (another node may
// have resumed it meanwhile). A run that is gone is skipped.
Status RecordCrash(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                   int64_t attempt, int signal);

// Tokens a held run spent (a model step, a compaction's summary), added to its counters.
// REQUIRES: `cur` came from Held in this unit.
Status AddTokens(store::Tx& tx, store::Run& cur, int64_t input_tokens, int64_t output_tokens);

// running -> waiting_for_approval: the lease released (another node may take the run once the
// approval is decided), the session awaiting_approval, run.waiting_for_approval@v1.
// REQUIRES: `cur` came from Held in this unit.
Status Park(store::Tx& tx, store::Run& cur, const std::string& approval_id, Millis now);

// waiting_for_approval -> queued, after its approval was decided (approve or reject: the run
// goes on either way, with the call run or refused); the session idle again, run.queued@v1.
// A run in any other state (cancelled meanwhile) is left as it is.
Status Requeue(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
               const std::string& approval_id, Millis now);

// running -> queued, for an execution that stops at a step boundary because its node is
// draining: the lease released and the session idle, so that another node (or this one after
// its restart) claims the run at once and resumes it from its recorded steps, run.queued@v1
// with "released": true. REQUIRES: `cur` came from Held in this unit.
Status Release(store::Tx& tx, store::Run& cur, Millis now);

// How a run ends.
struct Ending {
  std::string status;  // "done", "failed" or "cancelled"
  std::string output;  // the final answer ("done")
  Json error;          // {"code", "message"} ("failed", "cancelled"); null for "done"
  Json usage;          // the run's usage as run.completed@v1 and the others show it
};

// running -> done | failed | cancelled, for the execution holding it: output, error, finish
// time, the lease's expiry cleared (its owner stays, for the record), the session idle,
// run.completed@v1 | run.failed@v1 | run.cancelled@v1. Its own check that the execution still
// holds the run (RunStore::EndHeldRun: the unit fails with kConflict otherwise), so `cur` may be
// the execution's own copy rather than Held's: REQUIRES its tokens be the run's (the holder
// alone changes them; the other columns the ending writes are its own).
Status Finish(store::Tx& tx, store::Run& cur, const Ending& ending, Millis now);

// A client's cancel of run `run_id`: a running run is asked to stop at its next step boundary
// (run.cancel_requested@v1; its executor ends it); a queued or waiting run ends at once,
// cancelled (run.cancelled@v1), after `before_end` withdrew what it left pending (its approval,
// its approved calls). kConflict for a run that already ended. Returns the run as written.
Result<store::Run> Cancel(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                          Millis now,
                          const std::function<Status(store::Tx&, const store::Run&)>& before_end);

// ---- A tool call's transitions
//
// `call` and `step` are the call's journal entry and its step as the gateway built them; each
// function sets their status (with the result, the step's output and times), writes them
// (inserted when `recorded` is false, updated when they were recorded before: a call approved
// while its run waited) and appends the transition's event with the run's agent and session.
// All but SettleParkedCall and WithdrawApprovedCalls are for the execution holding the call's
// run, checked with Held first: a node that lost the run records nothing more for it.

// -> denied, before it ran (unknown tool, arguments, veto, role, stop, policy; or an approved
// call refused at its run's resumption): tool.call.denied@v1 with the reason, which the model
// is given as the call's error.
Status DenyCall(store::Tx& tx, const Holder& holder, store::ToolCall& call, store::Step& step,
                const std::string& reason, bool recorded, Millis now);

// -> awaiting_approval: the call, its step and `approval` recorded, approval.requested@v1, and
// the run parked (Park: its lease released until the decision).
Status ParkCall(store::Tx& tx, const Holder& holder, store::ToolCall& call, store::Step& step,
                const store::Approval& approval, Millis now);

// -> started: the effect journal's entry, durable before the tool runs (invariant 5), with the
// decision that let it run; tool.call.started@v1.
Status StartCall(store::Tx& tx, const Holder& holder, store::ToolCall& call, store::Step& step,
                 const Json& decision, bool recorded, Millis now);

// started -> succeeded | failed (`status`), with its result, on the call and its step in memory:
// what the gateway's hooks are shown before EndCall records it.
void Ended(store::ToolCall& call, store::Step& step, const std::string& status, Json result,
           Millis now);
// Records a call Ended set: tool.call.completed@v1.
Status EndCall(store::Tx& tx, const Holder& holder, const store::ToolCall& call,
               const store::Step& step);

// started -> unknown: a `once` call a crash interrupted, which may or may not have taken effect
// and is never repeated; tool.call.unknown@v1.
Status CallUnknown(store::Tx& tx, const Holder& holder, store::ToolCall& call, store::Step& step,
                   Millis now);

// awaiting_approval -> approved | rejected (`status`), for the approval decision: with `error`
// (rejected, or the approval expired or was cancelled) as the call's result and its step's
// output; approved with `amended` arguments (an object) runs with those, its step keeping the
// ones the model proposed. The caller appends the decision's event.
Status SettleParkedCall(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                        const std::string& call_id, const std::string& status,
                        const std::string& error, const Json& amended, Millis now);

// approved -> rejected, for every approved call of a run that is cancelled before they ran.
Status WithdrawApprovedCalls(store::Tx& tx, const store::Run& run, Millis now);

}  // namespace keel::runs

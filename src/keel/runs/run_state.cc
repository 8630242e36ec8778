#include "keel/runs/run_state.h"

#include "keel/common/log.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"

namespace keel::runs {

namespace {

// A run is poison when the process stopped during the same point of it several times in a
// row: each claim appends run.started, each step or wait appends events of its own, so that
// run.started events with nothing else after them are tries that ended without progress. How
// many make a run poison depends on what is known of the stops:
// - a crash (a fatal signal while the run executed: run.crashed@v1, from the node's crash note,
//   runtime/crash_note.h) kCrashTries times in a row;
// - stops with no cause known (kill -9, a power cut, the OOM killer) kUnexplainedTries times
//   in a row. Outside kills at random moments interrupt a run before its next step now and
//   then (right after a restart most of all, while the resumed runs and the clients'
//   retries come at once): soaks with a kill every 0.5 to 2 s (scripts/soak.sh) cut 6 % of
//   their runs twice in a row and 0.25 % four times, so a bound of 4 stopped healthy runs;
//   if each further try is cut as often, 10 in a row is one run in five million, and a run
//   that gets the process killed each time still ends.
// A run the io watchdog caught holding the io thread past io_stall_limit_ms
// (runtime/watchdog.h) ends with run.stalled@v1: it is poison at once.
constexpr int kCrashTries = 3;
constexpr int kUnexplainedTries = 10;

// How far back in the tenant's log PoisonCheck looks for a run's tries (its newest events).
// A run that stops its process again and again has its tries close together; one whose tries
// are further apart than this gets a few more before it is stopped. Reading the whole log
// instead cost a resumed claim 66 ms in the writer at 129,000 events (soak store), and grows
// with the log.
constexpr int kPoisonWindow = 4096;

// Empty, or why `run` is not resumed again. REQUIRES: `run` is locked in `tx`, to be resumed.
// Reads the run's events newest first, back to its last progress.
Result<std::string> PoisonCheck(store::Tx& tx, const store::Run& run) {
  KEEL_ASSIGN_OR_RETURN(auto events,
                        tx.events().RecentRunEvents(run.tenant_id, run.id, kPoisonWindow));
  int tries = 0;    // run.started events since the run's last progress
  int crashes = 0;  // run.crashed events among them
  std::optional<store::Event> stalled;  // the last event but crashes, when run.stalled@v1
  for (const auto& e : events) {
    if (e.type == "run.crashed@v1") {  // the watchdog's abort notes its run too
      ++crashes;
    } else if (e.type == "run.started@v1") {
      ++tries;
    } else {
      if (e.type == "run.stalled@v1" && tries == 0) stalled = e;
      break;  // the run's last progress
    }
  }
  if (stalled) {
    const Json& p = stalled->payload;
    return "the run held the server's io thread for " +
           std::to_string(p.value("held_ms", int64_t(0))) + " ms (" + p.value("work", "") +
           "), past io_stall_limit_ms, and the server was stopped; it is not tried again";
  }
  if (crashes >= kCrashTries) {
    return "the server crashed " + std::to_string(crashes) +
           " times in a row while it ran this run, after its last recorded step; it is not "
           "tried again";
  }
  if (tries < kUnexplainedTries) return std::string();
  return "the server stopped (or held the run past its lease) " + std::to_string(tries) +
         " times in a row while it ran this run, after its last recorded step; it is not tried "
         "again";
}

// A run's write and its session's status, carried to the unit's next event (row_images.h).
Status WriteRun(store::Tx& tx, const store::Run& run) {
  KEEL_RETURN_IF_ERROR(tx.runs().UpdateRun(run));
  tx.Carry("runs", store::RunUpdateImage(run));
  return Status::Ok();
}

Status SetSessionStatus(store::Tx& tx, const store::Run& run, const char* status, Millis now) {
  KEEL_RETURN_IF_ERROR(
      tx.sessions().UpdateSessionStatus(run.tenant_id, run.session_id, status, now));
  tx.Carry("sessions", store::SessionStatusImage(run.session_id, status, now));
  return Status::Ok();
}

Status Append(store::Tx& tx, const store::Run& run, std::string type, Json payload) {
  return tx.events().Append(
      {run.tenant_id, std::move(type), run.agent_id, run.session_id, run.id, std::move(payload)});
}

}  // namespace

Result<store::Run> Held(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                        const Holder& holder) {
  KEEL_ASSIGN_OR_RETURN(store::Run cur, tx.runs().GetRun(tenant_id, run_id));
  if (cur.status != "running" || cur.lease_owner != holder.origin ||
      cur.attempt != holder.attempt) {
    // Said once per execution in practice: the execution stops at the first refused write.
    LogInfo("run " + run_id + ": this node's execution (attempt " + std::to_string(holder.attempt) +
            ") no longer holds it (now " + cur.status + ", attempt " + std::to_string(cur.attempt) +
            (cur.lease_owner.empty() ? std::string() : " on origin " + cur.lease_owner) +
            ": its lease ran out and another execution took it, or it ended); it stops here "
            "and writes nothing more for it");
    return Conflict("run " + run_id + " is no longer held by this execution");
  }
  return cur;
}

Result<store::Run> Create(store::Tx& tx, store::Run run, const Json& queued_payload, Millis now,
                          const std::optional<Lease>& claim,
                          const std::optional<IdleGuard>& guard) {
  if (run.status != "queued") return Internal("a new run is queued, not " + run.status);
  if (claim) {
    run.status = "running";
    run.attempt = 1;
    run.lease_owner = claim->origin;
    run.lease_expires_at = claim->until;
    run.started_at = now;
    if (guard) {
      KEEL_RETURN_IF_ERROR(tx.runs().StartIdleSession(run.tenant_id, run.session_id,
                                                      guard->agent_id, guard->max_active, now));
      tx.Carry("sessions", store::SessionStatusImage(run.session_id, "running", now));
    } else {
      KEEL_RETURN_IF_ERROR(SetSessionStatus(tx, run, "running", now));
    }
  }
  KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(run));
  tx.Carry("runs", store::RowImage(run));
  KEEL_RETURN_IF_ERROR(Append(tx, run, "run.queued@v1", queued_payload));
  if (claim) {
    KEEL_RETURN_IF_ERROR(
        Append(tx, run, "run.started@v1", {{"attempt", run.attempt}, {"resumed", false}}));
  }
  return run;
}

Status RecordCrash(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                   int64_t attempt, int signal) {
  auto got = tx.runs().GetRun(tenant_id, run_id);
  if (!got.ok()) return got.status().code() == Code::kNotFound ? Status::Ok() : got.status();
  const store::Run& cur = *got;
  if (cur.status != "running" || cur.attempt != attempt) return Status::Ok();
  return Append(tx, cur, "run.crashed@v1", {{"attempt", attempt}, {"signal", signal}});
}

Result<Claim> ClaimRun(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                       const std::string& origin, Millis now, int64_t lease_ms) {
  Claim out;
  KEEL_ASSIGN_OR_RETURN(store::Run cur, tx.runs().LockRun(tenant_id, run_id));
  out.resumed = cur.status == "running" && cur.lease_expires_at < now;
  if (cur.status != "queued" && !out.resumed) return Conflict("run is not claimable");
  if (out.resumed) {
    KEEL_ASSIGN_OR_RETURN(out.poison, PoisonCheck(tx, cur));
    if (!out.poison.empty()) {  // not claimed: the caller ends it as found, in this unit
      out.run = std::move(cur);
      return out;
    }
  }
  cur.status = "running";
  cur.attempt += 1;
  cur.lease_owner = origin;
  cur.lease_expires_at = now + lease_ms;
  if (!cur.started_at) cur.started_at = now;
  KEEL_RETURN_IF_ERROR(WriteRun(tx, cur));
  KEEL_RETURN_IF_ERROR(SetSessionStatus(tx, cur, "running", now));
  KEEL_RETURN_IF_ERROR(Append(tx, cur, "run.started@v1",
                              {{"attempt", cur.attempt}, {"resumed", out.resumed}}));
  out.run = std::move(cur);
  return out;
}

Status AddTokens(store::Tx& tx, store::Run& cur, int64_t input_tokens, int64_t output_tokens) {
  cur.input_tokens += input_tokens;
  cur.output_tokens += output_tokens;
  return WriteRun(tx, cur);
}

Status Park(store::Tx& tx, store::Run& cur, const std::string& approval_id, Millis now) {
  if (cur.status != "running") return Conflict("only a running run waits for an approval");
  cur.status = "waiting_for_approval";
  cur.lease_owner.clear();
  cur.lease_expires_at = 0;
  KEEL_RETURN_IF_ERROR(WriteRun(tx, cur));
  KEEL_RETURN_IF_ERROR(SetSessionStatus(tx, cur, "awaiting_approval", now));
  return Append(tx, cur, "run.waiting_for_approval@v1", {{"approval_id", approval_id}});
}

Status Requeue(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
               const std::string& approval_id, Millis now) {
  KEEL_ASSIGN_OR_RETURN(store::Run run, tx.runs().GetRun(tenant_id, run_id));
  if (run.status != "waiting_for_approval") return Status::Ok();
  run.status = "queued";
  KEEL_RETURN_IF_ERROR(WriteRun(tx, run));
  KEEL_RETURN_IF_ERROR(SetSessionStatus(tx, run, "idle", now));
  return Append(tx, run, "run.queued@v1",
                {{"message_id", run.message_id}, {"after_approval", approval_id}});
}

Status Release(store::Tx& tx, store::Run& cur, Millis now) {
  if (cur.status != "running") return Conflict("run " + cur.id + " is not running");
  cur.status = "queued";
  cur.lease_owner.clear();
  cur.lease_expires_at = 0;
  KEEL_RETURN_IF_ERROR(WriteRun(tx, cur));
  KEEL_RETURN_IF_ERROR(SetSessionStatus(tx, cur, "idle", now));
  return Append(tx, cur, "run.queued@v1", {{"message_id", cur.message_id}, {"released", true}});
}

Status Finish(store::Tx& tx, store::Run& cur, const Ending& ending, Millis now) {
  if (cur.status != "running") return Conflict("run " + cur.id + " is not running");
  const char* type = ending.status == "done"        ? "run.completed@v1"
                     : ending.status == "cancelled" ? "run.cancelled@v1"
                     : ending.status == "failed"    ? "run.failed@v1"
                                                    : nullptr;
  if (!type) return Internal("a run does not end " + ending.status);
  cur.status = ending.status;
  cur.output = ending.output;
  cur.error = ending.error;
  cur.finished_at = now;
  cur.lease_expires_at = 0;
  // Only while this execution holds the run (the update's condition, checked when its count
  // arrives): the ending needs no read of the run first.
  KEEL_RETURN_IF_ERROR(tx.runs().EndHeldRun(cur));
  tx.Carry("runs", store::RunEndImage(cur));
  KEEL_RETURN_IF_ERROR(SetSessionStatus(tx, cur, "idle", now));
  Json payload = {{"status", ending.status}};
  if (!ending.error.is_null()) payload["error"] = ending.error;
  payload["usage"] = ending.usage;
  return Append(tx, cur, type, std::move(payload));
}

Result<store::Run> Cancel(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                          Millis now,
                          const std::function<Status(store::Tx&, const store::Run&)>& before_end) {
  KEEL_ASSIGN_OR_RETURN(store::Run out, tx.runs().GetRun(tenant_id, run_id));
  if (out.Terminal()) return Conflict("run " + run_id + " already ended (" + out.status + ")");
  if (out.status == "running") {
    if (out.cancel_requested) return out;
    out.cancel_requested = true;
    KEEL_RETURN_IF_ERROR(WriteRun(tx, out));
    KEEL_RETURN_IF_ERROR(Append(tx, out, "run.cancel_requested@v1", Json::object()));
    return out;
  }
  if (before_end) KEEL_RETURN_IF_ERROR(before_end(tx, out));
  if (out.status == "waiting_for_approval") {
    KEEL_RETURN_IF_ERROR(SetSessionStatus(tx, out, "idle", now));
  }
  out.status = "cancelled";
  out.finished_at = now;
  out.error = {{"code", "cancelled"}, {"message", "cancelled by request"}};
  KEEL_RETURN_IF_ERROR(WriteRun(tx, out));
  Json payload = {{"status", out.status},
                  {"error", out.error},
                  {"usage", {{"input_tokens", out.input_tokens},
                             {"output_tokens", out.output_tokens}}}};
  KEEL_RETURN_IF_ERROR(Append(tx, out, "run.cancelled@v1", std::move(payload)));
  return out;
}

// ---- A tool call's transitions

namespace {

Status WriteCall(store::Tx& tx, const store::ToolCall& call, const store::Step& step,
                 bool recorded) {
  if (recorded) {
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateToolCall(call));
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateStep(step));
    tx.Carry("run_steps", store::StepUpdateImage(step));
    tx.Carry("tool_calls", store::ToolCallUpdateImage(call));
    return Status::Ok();
  }
  KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(step));
  KEEL_RETURN_IF_ERROR(tx.runs().InsertToolCall(call));
  tx.Carry("run_steps", store::RowImage(step));
  tx.Carry("tool_calls", store::RowImage(call));
  return Status::Ok();
}

}  // namespace

Status DenyCall(store::Tx& tx, const Holder& holder, store::ToolCall& call, store::Step& step,
                const std::string& reason, bool recorded, Millis now) {
  KEEL_ASSIGN_OR_RETURN(store::Run run, Held(tx, call.tenant_id, call.run_id, holder));
  call.status = "denied";
  call.result = {{"error", reason}};
  if (recorded) call.updated_at = now;
  step.status = "denied";
  step.input["decision"] = {{"outcome", "deny"}, {"reason", reason}};
  step.output = call.result;
  step.finished_at = now;
  KEEL_RETURN_IF_ERROR(WriteCall(tx, call, step, recorded));
  return Append(tx, run, "tool.call.denied@v1",
                {{"call_id", call.call_id}, {"tool", call.tool}, {"reason", reason}});
}

Status ParkCall(store::Tx& tx, const Holder& holder, store::ToolCall& call, store::Step& step,
                const store::Approval& approval, Millis now) {
  KEEL_ASSIGN_OR_RETURN(store::Run run, Held(tx, call.tenant_id, call.run_id, holder));
  call.status = "awaiting_approval";
  step.status = "awaiting_approval";
  step.input["decision"] = {
      {"outcome", "approval"}, {"reason", approval.reason}, {"approval_id", approval.id}};
  KEEL_RETURN_IF_ERROR(WriteCall(tx, call, step, /*recorded=*/false));
  KEEL_RETURN_IF_ERROR(tx.approvals().InsertApproval(approval));
  tx.Carry("approvals", store::RowImage(approval));
  KEEL_RETURN_IF_ERROR(Append(tx, run, "approval.requested@v1",
                              {{"approval_id", approval.id},
                               {"call_id", call.call_id},
                               {"tool", call.tool},
                               {"arguments", call.arguments},
                               {"reason", approval.reason},
                               {"expires_at", FormatRfc3339(approval.expires_at)}}));
  return Park(tx, run, approval.id, now);
}

Status StartCall(store::Tx& tx, const Holder& holder, store::ToolCall& call, store::Step& step,
                 const Json& decision, bool recorded, Millis now) {
  KEEL_ASSIGN_OR_RETURN(store::Run run, Held(tx, call.tenant_id, call.run_id, holder));
  call.status = "started";
  step.status = "started";
  if (recorded) {
    call.updated_at = now;  // the step keeps the decision that approved it
  } else {
    call.result = nullptr;
    step.input["decision"] = decision;
  }
  KEEL_RETURN_IF_ERROR(WriteCall(tx, call, step, recorded));
  return Append(tx, run, "tool.call.started@v1",
                {{"call_id", call.call_id},
                 {"tool", call.tool},
                 {"arguments", call.arguments},
                 {"effect_class", call.effect_class},
                 {"decision", decision}});
}

void Ended(store::ToolCall& call, store::Step& step, const std::string& status, Json result,
           Millis now) {
  call.status = status;
  call.result = std::move(result);
  call.updated_at = now;
  step.status = call.status;
  step.output = call.result;
  step.finished_at = now;
}

Status EndCall(store::Tx& tx, const Holder& holder, const store::ToolCall& call,
               const store::Step& step) {
  if (call.status != "succeeded" && call.status != "failed") {
    return Internal("a started call ends succeeded or failed, not " + call.status);
  }
  KEEL_ASSIGN_OR_RETURN(store::Run run, Held(tx, call.tenant_id, call.run_id, holder));
  KEEL_RETURN_IF_ERROR(WriteCall(tx, call, step, /*recorded=*/true));
  return Append(tx, run, "tool.call.completed@v1",
                {{"call_id", call.call_id}, {"tool", call.tool}, {"status", call.status}});
}

Status CallUnknown(store::Tx& tx, const Holder& holder, store::ToolCall& call, store::Step& step,
                   Millis now) {
  KEEL_ASSIGN_OR_RETURN(store::Run run, Held(tx, call.tenant_id, call.run_id, holder));
  Ended(call, step, "unknown",
        {{"error", "the call to " + call.tool +
                       " was interrupted by a crash and may or may not have taken effect; it "
                       "was not repeated"}},
        now);
  KEEL_RETURN_IF_ERROR(WriteCall(tx, call, step, /*recorded=*/true));
  return Append(tx, run, "tool.call.unknown@v1", {{"call_id", call.call_id}, {"tool", call.tool}});
}

Status SettleParkedCall(store::Tx& tx, const std::string& tenant_id, const std::string& run_id,
                        const std::string& call_id, const std::string& status,
                        const std::string& error, const Json& amended, Millis now) {
  if (status != "approved" && status != "rejected") {
    return Internal("a parked call is approved or rejected, not " + status);
  }
  KEEL_ASSIGN_OR_RETURN(auto calls, tx.runs().ListToolCalls(tenant_id, run_id));
  const store::ToolCall* parked = nullptr;
  for (const auto& c : calls) {
    if (c.call_id == call_id) parked = &c;
  }
  if (!parked || parked->status != "awaiting_approval") {
    return Internal("tool call " + call_id + " of run " + run_id + " awaits no approval");
  }
  store::ToolCall call = *parked;
  call.status = status;
  call.updated_at = now;
  if (error.empty()) {
    if (amended.is_object()) call.arguments = amended;
    call.result = nullptr;
  } else {
    call.result = {{"error", error}};
  }
  KEEL_RETURN_IF_ERROR(tx.runs().UpdateToolCall(call));
  tx.Carry("tool_calls", store::ToolCallUpdateImage(call));
  KEEL_ASSIGN_OR_RETURN(auto steps, tx.runs().ListSteps(tenant_id, run_id));
  for (auto step : steps) {
    if (step.id != call.step_id) continue;
    step.status = call.status;
    if (!error.empty()) {
      step.output = call.result;
      step.finished_at = now;
    } else if (amended.is_object()) {
      step.input["arguments"] = amended;
      step.input["amended_from"] = parked->arguments;
    }
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateStep(step));
    tx.Carry("run_steps", store::StepUpdateImage(step));
  }
  return Status::Ok();
}

Status WithdrawApprovedCalls(store::Tx& tx, const store::Run& run, Millis now) {
  KEEL_ASSIGN_OR_RETURN(auto calls, tx.runs().ListToolCalls(run.tenant_id, run.id));
  KEEL_ASSIGN_OR_RETURN(auto steps, tx.runs().ListSteps(run.tenant_id, run.id));
  for (auto c : calls) {
    if (c.status != "approved") continue;
    c.status = "rejected";
    c.result = {{"error", "the run was cancelled before the approved call ran"}};
    c.updated_at = now;
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateToolCall(c));
    tx.Carry("tool_calls", store::ToolCallUpdateImage(c));
    for (auto s : steps) {
      if (s.id != c.step_id) continue;
      s.status = c.status;
      s.output = c.result;
      s.finished_at = now;
      KEEL_RETURN_IF_ERROR(tx.runs().UpdateStep(s));
      tx.Carry("run_steps", store::StepUpdateImage(s));
    }
  }
  return Status::Ok();
}

}  // namespace keel::runs

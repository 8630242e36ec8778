// Intake and cancellation: the two ways a client changes what the runtime will do.

#include "keel/runtime/intake.h"

#include <algorithm>
#include <string>

#include "keel/access/access.h"
#include "keel/approvals/approvals.h"
#include "keel/common/ids.h"
#include "keel/plugins/bus.h"
#include "keel/plugins/host.h"
#include "keel/runs/run_state.h"
#include "keel/runtime/dispatcher.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/plugin_bridge.h"
#include "keel/runtime/settings_cache.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"

namespace keel::runtime {

namespace {
// The longest message a session.message.received@v1 rewrite may make of a shorter one: the
// request body limit's default.
constexpr size_t kMaxRewrittenMessage = 1 << 20;
}  // namespace

namespace asio = boost::asio;

Intake::Intake(store::Store& store, Dispatcher& dispatcher, EventHub& hub, PluginBridge& plugins,
               const SettingsCache& settings, int lease_ms, int tenant_run_cap)
    : store_(store),
      dispatcher_(dispatcher),
      hub_(hub),
      plugins_(plugins),
      settings_(settings),
      lease_ms_(lease_ms),
      tenant_run_cap_(tenant_run_cap) {}

asio::awaitable<Result<IntakeResult>> Intake::PostMessage(const IntakeRequest& req) {
  if (dispatcher_.draining()) {
    co_return Unavailable(
        "this node is stopping: send the message to another node, or again once it has "
        "restarted");
  }
  std::string content = req.content;
  if (!req.call.is_null()) {
    const Json& c = req.call;
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
        c["name"].get_ref<const std::string&>().empty()) {
      co_return InvalidArgument("a direct call needs a tool name");
    }
    Json arguments = c.value("arguments", Json::object());
    if (!arguments.is_object()) co_return InvalidArgument("a call's arguments must be an object");
    content = DumpJson(Json{{"id", "call_" + NewId()}, {"name", c["name"]}, {"arguments", arguments}});
  }
  if (content.empty()) co_return InvalidArgument("field 'content' must not be empty");
  if (req.idempotency_key.size() > 256) {
    co_return InvalidArgument("Idempotency-Key is longer than 256 characters");
  }
  store::Session session;
  bool busy = false;  // the session had an unfinished run
  store::Agent agent;
  std::optional<IntakeResult> replay;
  std::vector<store::PluginStamp> stamps;
  Status st = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto read, tx.runs().ReadForIntake(req.tenant_id, req.session_id));
    session = std::move(read.session);
    busy = read.busy;
    // The caller may use it (a guest only the sessions it opened): refused as if it did not
    // exist, so a guest learns nothing of the others.
    if (!access::CanUseSession({req.tenant_id, req.requested_by, req.caller_role}, session)) {
      return NotFound("session not found: " + req.session_id);
    }
    if (!read.agent) return Conflict("the session's agent was deleted");
    agent = std::move(*read.agent);
    // The plugins' stamps as this node keeps them when the tenant's settings version, read
    // with the session, says they are current; else read (a round trip more on PostgreSQL).
    auto kept = settings_.Get(req.tenant_id, agent.id);
    if (kept && kept->version == read.settings_version) {
      stamps = kept->stamps;
    } else {
      KEEL_RETURN_IF_ERROR(tx.plugins().PluginStampsForAgentLater(req.tenant_id, agent.id, stamps));
    }
    if (!req.idempotency_key.empty()) {
      KEEL_ASSIGN_OR_RETURN(auto found, tx.messages().FindByIdempotencyKey(
                                            req.tenant_id, req.session_id, req.idempotency_key));
      if (found) {
        KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(req.tenant_id, found->run_id));
        replay = IntakeResult{*found, run, true};
      }
    }
    return Status::Ok();
  });
  if (!st.ok()) co_return st;
  if (replay) co_return *replay;
  if (session.status == "inactive") {
    co_return Conflict("session " + session.id + " is inactive and takes no new messages");
  }
  // session.message.received@v1: the agent's plugins may rewrite the message before it is
  // stored (a direct call is not a message and is not shown to them).
  // The agent's plugins: this node's when the stamps say they are current, else built again.
  auto found = co_await plugins_.PluginsFor(req.tenant_id, agent.id, std::move(stamps));
  if (!found.ok()) co_return found.status();
  std::shared_ptr<plugins::AgentPlugins> plugins = std::move(found).value();
  if (req.call.is_null() && !req.introspection) {
    if (plugins->Wants("session.message.received")) {
      // Named: g++ 12 cannot take a braced JSON literal into a co_await.
      Json received = {{"agent_id", agent.id},
                       {"session_id", session.id},
                       {"role", "user"},
                       {"content", content}};
      auto out = co_await plugins_.Emit(plugins, "session.message.received", std::move(received));
      if (out.abort) {
        co_return InvalidArgument("plugin " + out.abort->plugin_id + " refused the message: " +
                                  out.abort->message);
      }
      const Json& c = out.payload.contains("content") ? out.payload["content"] : Json();
      if (c.is_string() && !c.get_ref<const std::string&>().empty()) {
        // A rewrite may not grow a message past what a client may send (a plugin that
        // returned 40 MB stored 40 MB, and a reply as long, per turn).
        const size_t most = std::max(content.size(), kMaxRewrittenMessage);
        if (c.get_ref<const std::string&>().size() > most) {
          co_return InvalidArgument(
              "the agent's plugins rewrote the message to " +
              std::to_string(c.get_ref<const std::string&>().size()) +
              " bytes; a rewritten message may have at most " + std::to_string(most) + " bytes");
        }
        content = c.get<std::string>();
      }
    }
  }
  Unit unit = Prepare(req, agent, std::move(content));
  unit.plugins = std::move(plugins);
  unit.session_instructions = std::move(session.instructions);
  // Read idle just now: the writer need not read the session again (on PostgreSQL that read
  // was a round trip in the writer's transaction, per message) unless it changed meanwhile.
  // The tenant's cap is checked by the claim's update alone (a tenant at its cap is rare).
  unit.idle_when_read = !busy && unit.may_claim;
  store::WriteFn write = [&unit, this](store::Tx& tx) { return Write(tx, unit); };
  // Deferred only where the run is to start here at once: a queued run waits for the commit.
  const store::WriteKind kind = req.answered_after_run && unit.idle_when_read
                                    ? store::WriteKind::kDeferred
                                    : store::WriteKind::kNormal;
  auto written = co_await store::AsyncWrite(store_, write, kind);
  if (!written.ok() && written.status().code() == Code::kConflict && unit.idle_when_read) {
    unit.idle_when_read = false;  // it changed: read it in the unit this time
    written = co_await store::AsyncWrite(store_, std::move(write));
  }
  if (!written.ok()) co_return written.status();
  if (unit.replay) co_return std::move(*unit.replay);
  // Told before its commit (no events yet: Store::WriteDeferred), which posts to this
  // executor after this continuation: the run's deltas wait for it.
  if (kind == store::WriteKind::kDeferred && unit.claimed && written->empty()) {
    hub_.HoldDeltas(unit.written.id);
  }
  After(unit);
  co_return std::move(unit.out);  // co_return copies an lvalue (g++ 12 does no implicit move)
}

Intake::Unit Intake::Prepare(const IntakeRequest& req, const store::Agent& agent,
                             std::string content) {
  Unit u;
  u.request = req;
  u.agent = agent;
  u.reject_when_busy = agent.config.is_object() && agent.config.value("busy", "") == "reject";
  // When the session is idle and this node has a slot for the tenant's run, intake also claims
  // the run, saving a commit and a trip through the dispatcher. The slot is taken now, not
  // when the unit commits, so that intakes in flight together cannot exceed the tenant's share.
  u.slot = dispatcher_.TakeSlot(req.tenant_id);
  u.may_claim = static_cast<bool>(u.slot);
  u.origin = store_.origin();
  u.now = NowMillis();
  IntakeResult& out = u.out;
  out.message.id = NewId();
  out.run.id = NewId();
  out.message.tenant_id = out.run.tenant_id = req.tenant_id;
  out.message.session_id = out.run.session_id = req.session_id;
  out.message.run_id = out.run.id;
  out.message.role = req.introspection ? "introspection" : req.call.is_null() ? "user" : "call";
  out.message.content = std::move(content);
  out.message.idempotency_key = req.idempotency_key;
  out.message.created_at = out.run.created_at = u.now;
  out.run.agent_id = agent.id;
  out.run.message_id = out.message.id;
  out.run.status = "queued";
  out.run.requested_by = req.requested_by;
  out.run.caller_role = req.caller_role;
  out.run.user_id = req.user_id;
  out.run.channel_id = req.channel_id;
  return u;
}

Status Intake::Check(store::Tx& tx, Unit& u) {
  const IntakeRequest& req = u.request;
  if (!req.idempotency_key.empty()) {
    // Re-checked inside the unit: two requests with one key may race past the read before it.
    KEEL_ASSIGN_OR_RETURN(auto found, tx.messages().FindByIdempotencyKey(
                                          req.tenant_id, req.session_id, req.idempotency_key));
    if (found) {
      KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(req.tenant_id, found->run_id));
      u.replay = IntakeResult{*found, run, true};
      return Status::Ok();
    }
  }
  int64_t active = 0;  // the tenant's runs in flight
  if (u.idle_when_read) {
    u.busy = false;  // checked again by the claim's guarded update (Write)
    return Status::Ok();
  }
  if (u.new_session) {
    u.busy = false;  // created by this unit for this agent: active, no run yet
    KEEL_ASSIGN_OR_RETURN(active, tx.runs().CountActiveRuns(req.tenant_id));
  } else {
    KEEL_ASSIGN_OR_RETURN(auto view, tx.runs().ForIntake(req.tenant_id, req.session_id));
    const store::Session& current = view.session;
    if (current.agent_id != u.agent.id) {
      return Conflict("session " + req.session_id + " is not a session of agent " + u.agent.id);
    }
    if (current.status == "inactive") {
      return Conflict("session " + req.session_id + " is inactive and takes no new messages");
    }
    u.busy = view.busy;
    if (u.busy && u.reject_when_busy) {
      return Conflict("session " + req.session_id +
                      " is busy with a run and its agent rejects messages while busy");
    }
    active = view.active_runs;
  }
  const int cap = tenant_run_cap_;
  if (active >= cap) {
    return Status(Code::kRateLimited, "the tenant has " + std::to_string(active) +
                                          " runs in flight (limit " + std::to_string(cap) +
                                          "); retry later");
  }
  return Status::Ok();
}

Status Intake::Write(store::Tx& tx, Unit& u) {
  u.refused = false;
  u.replay.reset();
  u.claimed = false;
  // The message's and the run's times are taken in the unit, where the writer runs it: a run
  // claimed here starts after whatever committed before it (the session's previous run ended).
  u.now = NowMillis();
  u.out.message.created_at = u.out.run.created_at = u.now;
  if (Status checked = Check(tx, u); !checked.ok()) {
    // Nothing is written yet: a caller may record the refusal instead (a schedule does).
    u.refused = checked.code() != Code::kUnavailable && checked.code() != Code::kInternal;
    return checked;
  }
  if (u.replay) return Status::Ok();
  const IntakeRequest& req = u.request;
  const IntakeResult& out = u.out;
  KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(out.message));
  tx.Carry("messages", store::RowImage(out.message));
  KEEL_RETURN_IF_ERROR(tx.events().Append({req.tenant_id, "message.created@v1", u.agent.id,
                                           req.session_id, out.run.id,
                                           {{"message_id", out.message.id},
                                            {"role", out.message.role}}}));
  u.claimed = u.may_claim && !u.busy;
  std::optional<runs::Lease> claim;
  if (u.claimed) claim = runs::Lease{u.origin, u.now + lease_ms_};
  Json queued = {{"message_id", out.message.id}};
  if (!u.trigger.is_null()) queued["trigger"] = u.trigger;
  std::optional<runs::IdleGuard> guard;
  if (u.claimed && u.idle_when_read) guard = runs::IdleGuard{u.agent.id, tenant_run_cap_};
  KEEL_ASSIGN_OR_RETURN(u.written, runs::Create(tx, out.run, queued, u.now, claim, guard));
  if (req.with_run) KEEL_RETURN_IF_ERROR(req.with_run(tx, u.written));
  return Status::Ok();
}

void Intake::After(Unit& u) {
  if (!u.claimed) {
    u.slot.Release();  // before the dispatcher looks for runs
    dispatcher_.Wake();
    return;
  }
  u.out.run = u.written;  // the run as committed: running, leased to this node
  // The unit's last use: what the run needs moves into it.
  dispatcher_.Launch(std::move(u.written),
                     KnownRun{std::move(u.agent), u.out.message, std::move(u.session_instructions),
                              std::move(u.plugins)},
                     std::move(u.slot));
}

asio::awaitable<Result<store::Run>> Intake::Cancel(const std::string& tenant_id,
                                                    const std::string& run_id) {
  store::Run out;
  // What a run that ends at once leaves pending is withdrawn in the same unit: a waiting run's
  // approval (through the one decision function), a requeued run's approved calls.
  Millis now = 0;  // one clock for the run, its approval and its calls; set in the unit
  auto withdraw = [&](store::Tx& tx, const store::Run& run) -> Status {
    if (run.status == "waiting_for_approval") {
      KEEL_ASSIGN_OR_RETURN(auto calls, tx.runs().ListToolCalls(tenant_id, run_id));
      for (const auto& c : calls) {
        if (c.status != "awaiting_approval") continue;
        KEEL_ASSIGN_OR_RETURN(auto approval,
                              tx.approvals().FindApprovalForCall(tenant_id, run_id, c.call_id));
        if (!approval) continue;
        approvals::DecisionRequest d;
        d.tenant_id = tenant_id;
        d.approval_id = approval->id;
        d.verdict = approvals::Verdict::kCancel;
        d.decided_by = "system";
        d.reason = "the run was cancelled";
        KEEL_RETURN_IF_ERROR(approvals::Decide(tx, d, now).status());
      }
    } else if (run.attempt > 0) {
      // A run queued again after an approval: its approved call will never run now.
      KEEL_RETURN_IF_ERROR(runs::WithdrawApprovedCalls(tx, run, now));
    }
    return Status::Ok();
  };
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    now = NowMillis();
    KEEL_ASSIGN_OR_RETURN(out, runs::Cancel(tx, tenant_id, run_id, now, withdraw));
    return Status::Ok();
  });
  if (!written.ok()) co_return written.status();
  if (out.status == "running") dispatcher_.RequestCancel(run_id);
  if (out.status == "cancelled") dispatcher_.Wake();  // the session's next run may start
  co_return out;
}

}  // namespace keel::runtime

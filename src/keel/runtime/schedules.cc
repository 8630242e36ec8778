// Schedules: the leader fires their due slots (docs/SCHEDULES.md).
//
// ScheduleLoop runs on every node and acts only while Store::leader() holds. Each round reads
// the due schedules (runtime-wide, the longest due first) and the earliest next_fire_at, fires
// the due ones, up to kMaxFiring at once (so their commits share fsyncs), and sleeps until the
// earliest next slot, at most a second: a schedule created on another node is seen within it,
// one created or resumed here wakes the loop at once (WakeSchedules). Idle, a round is one
// indexed read per second.
//
// FireSchedule decides with schedule::PlanFiring what a due schedule does, then writes it in
// ONE unit of work that re-reads the schedule (still active with the same next slot: nobody
// fired it meanwhile), records the slot (schedule_fires, unique per (schedule_id, slot): a
// second node or a restarted process doing the same slot writes nothing), advances
// next_fire_at (a one-shot is done), and posts the prompt through intake's unit body
// (WriteIntake: message, run, their events) with schedule.fired@v1. The slot is recorded before
// the prompt is posted and both commit together: a slot posts once, and a recorded slot always
// has its prompt. When intake refuses (an inactive session, the tenant's run cap, a session
// whose agent rejects while busy), that unit is rolled back and one of its own records the slot
// as refused, with schedule.refused@v1, and advances the schedule all the same.

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "keel/common/ids.h"
#include "keel/common/log.h"
#include "keel/plugins/bus.h"
#include "keel/plugins/host.h"
#include "keel/runtime/runtime.h"
#include "keel/schedule/schedule.h"
#include "keel/store/async.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

constexpr int kMaxFiring = 64;  // schedules fired at once by one node
constexpr Millis kMaxSleepMs = 1000;

Json TimeOrNull(const std::optional<Millis>& t) {
  return t ? Json(FormatRfc3339(*t)) : Json(nullptr);
}

// Inside a unit: the schedule as stored when it is still as `seen` (active, the same next
// slot); nullopt when it changed meanwhile (deleted, paused, or fired by another node): then
// the caller must not touch it.
Result<std::optional<store::Schedule>> StillDue(store::Tx& tx, const store::Schedule& seen) {
  auto current = tx.schedules().GetSchedule(seen.tenant_id, seen.id);
  if (!current.ok()) {
    if (current.status().code() == Code::kNotFound) return std::optional<store::Schedule>();
    return current.status();
  }
  if (current->status != "active" || current->next_fire_at != seen.next_fire_at) {
    return std::optional<store::Schedule>();
  }
  return std::optional<store::Schedule>(std::move(current).value());
}

// The schedule after a due slot was dealt with.
void Advance(store::Schedule& s, const schedule::Firing& plan, Millis now, bool end) {
  s.next_fire_at = end ? std::nullopt : plan.next;
  s.status = s.next_fire_at ? "active" : "done";
  if (plan.slot) s.last_fired_at = plan.slot;
  s.updated_at = now;
}

}  // namespace

void Runtime::WakeSchedules() {
  schedule_wake_ = true;
  schedule_timer_.cancel();
}

asio::awaitable<void> Runtime::ScheduleLoop() {
  std::optional<Millis> firing_since;  // since when this node fires; nullopt while it does not
  std::optional<Millis> next_at;       // the earliest slot not being fired, when known
  while (!draining_) {
    if (!schedule_wake_) {
      Millis wait = kMaxSleepMs;
      if (next_at) wait = std::clamp<Millis>(*next_at - Now(), 0, kMaxSleepMs);
      schedule_timer_.expires_after(std::chrono::milliseconds(wait));
      boost::system::error_code ec;
      co_await schedule_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    schedule_wake_ = false;
    next_at.reset();
    if (draining_) break;
    if (!store_.leader()) {
      firing_since.reset();
      continue;
    }
    const Millis now = Now();
    if (!firing_since) firing_since = now;
    int room = kMaxFiring - static_cast<int>(firing_.size());
    if (room <= 0) continue;  // a firing that ends wakes the loop
    std::vector<store::Schedule> due;
    std::optional<Millis> earliest;
    const int want = room + static_cast<int>(firing_.size());
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(due, tx.schedules().DueSchedules(now, want));
      KEEL_ASSIGN_OR_RETURN(earliest, tx.schedules().NextFireAt());
      return Status::Ok();
    });
    if (!read.ok()) continue;
    // A due slot already being fired wakes the loop when it is done; sleep until then.
    if (earliest && *earliest > now) next_at = earliest;
    for (auto& s : due) {
      if (room <= 0) break;
      if (!firing_.insert(s.id).second) continue;
      --room;
      asio::co_spawn(executor_, FireSchedule(std::move(s), *firing_since),
                     ReportExceptions{"schedule firing"});
    }
  }
}

asio::awaitable<void> Runtime::FireSchedule(store::Schedule s, Millis firing_since) {
  struct Done {
    Runtime* rt;
    std::string id;
    bool wake = false;  // not after a store failure: the next round comes within a second
    ~Done() {
      rt->firing_.erase(id);
      if (wake) rt->WakeSchedules();
    }
  } done{this, s.id};

  const Millis now = Now();
  schedule::Firing plan;
  std::string refusal;  // why nothing is posted for the slot
  bool end = false;     // the schedule can never post again (its agent is gone)
  if (auto planned = schedule::PlanFiring(s, now, firing_since); planned.ok()) {
    plan = *planned;
  } else {
    // A stored expression or zone that no longer parses (the zone left the database).
    plan.slot = s.next_fire_at;
    refusal = planned.status().message();
    end = true;
  }

  if (!plan.slot) {  // missed slots skipped
    store::WriteFn skip = [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto current, StillDue(tx, s));
      if (!current) return Status::Ok();
      Advance(*current, plan, now, false);
      KEEL_RETURN_IF_ERROR(tx.schedules().UpdateSchedule(*current));
      return tx.events().Append({s.tenant_id,
                                 "schedule.skipped@v1",
                                 s.agent_id,
                                 "",
                                 "",
                                 {{"schedule_id", s.id},
                                  {"missed_from", TimeOrNull(s.next_fire_at)},
                                  {"next_fire_at", TimeOrNull(current->next_fire_at)}}});
    };
    auto written = co_await store::AsyncWrite(store_, std::move(skip));
    if (!written.ok()) {
      LogError("schedule " + s.id + ": " + written.status().message());
    } else {
      done.wake = true;
    }
    co_return;
  }
  const Millis slot = *plan.slot;

  // Before the unit: the agent and its plugins; schedule.fired@v1 may rewrite the prompt.
  store::Agent agent;
  std::vector<store::Plugin> enabled;
  if (refusal.empty()) {
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      auto a = tx.agents().GetAgent(s.tenant_id, s.agent_id);
      if (!a.ok() && a.status().code() != Code::kNotFound) return a.status();
      if (!a.ok()) {
        refusal = "the schedule's agent " + s.agent_id + " was deleted";
        end = true;
        return Status::Ok();
      }
      agent = *a;
      KEEL_ASSIGN_OR_RETURN(enabled, tx.plugins().PluginsForAgent(s.tenant_id, agent.id));
      return Status::Ok();
    });
    if (!read.ok()) {
      LogError("schedule " + s.id + ": " + read.message());
      co_return;
    }
  }
  store::Session session;  // a new one for this firing, when the schedule names none
  session.id = s.session_id.empty() ? NewId() : s.session_id;
  std::string prompt = s.prompt;
  std::vector<store::PluginDelivery> deliveries;
  if (refusal.empty()) {
    auto plugins = UsePlugins(s.tenant_id, agent.id, enabled);
    if (plugins->Wants("schedule.fired")) {
      Json payload = {
          {"agent_id", agent.id},     {"schedule_id", s.id},         {"name", s.name},
          {"session_id", session.id}, {"slot", FormatRfc3339(slot)}, {"missed", plan.missed},
          {"prompt", prompt}};
      auto out = Emit(*plugins, "schedule.fired", std::move(payload), /*queue_webhooks=*/false);
      if (out.abort) {
        refusal = "plugin " + out.abort->plugin_id + " failed: " + out.abort->message;
      } else {
        const Json& p = out.payload.contains("prompt") ? out.payload["prompt"] : Json();
        if (p.is_string() && !p.get_ref<const std::string&>().empty())
          prompt = p.get<std::string>();
        if (!plugins->webhooks.empty()) {
          deliveries = DeliveriesFor(*plugins, "schedule.fired", out.payload);
        }
      }
    }
  }

  const bool new_session = s.session_id.empty();
  IntakeRequest request;
  request.tenant_id = s.tenant_id;
  request.session_id = session.id;
  request.content = prompt;
  request.requested_by = s.created_by;
  request.caller_role = s.caller_role;
  IntakeUnit unit = PrepareIntake(request, agent, prompt);
  unit.trigger = {{"schedule_id", s.id}, {"slot", FormatRfc3339(slot)}};
  bool stale = false;  // another node, or an earlier process, dealt with this slot
  if (refusal.empty()) {
    if (new_session) {
      session.tenant_id = s.tenant_id;
      session.agent_id = agent.id;
      session.title = s.name;
      session.created_at = session.updated_at = now;
    }
    store::WriteFn fire = [&](store::Tx& tx) -> Status {
      stale = false;
      KEEL_ASSIGN_OR_RETURN(auto current, StillDue(tx, s));
      if (!current) {
        stale = true;
        return Status::Ok();
      }
      store::ScheduleFire record{
          s.tenant_id,         s.id, slot, now, "posted", session.id, unit.out.run.id,
          unit.out.message.id, ""};
      Status recorded = tx.schedules().InsertFire(record);
      if (recorded.code() == Code::kConflict) {
        stale = true;
        return Status::Ok();
      }
      KEEL_RETURN_IF_ERROR(recorded);
      Advance(*current, plan, now, false);
      KEEL_RETURN_IF_ERROR(tx.schedules().UpdateSchedule(*current));
      if (new_session) {
        KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(session));
        KEEL_RETURN_IF_ERROR(tx.events().Append({s.tenant_id,
                                                 "session.created@v1",
                                                 agent.id,
                                                 session.id,
                                                 "",
                                                 {{"title", session.title}}}));
      }
      KEEL_RETURN_IF_ERROR(WriteIntake(tx, unit));
      for (const auto& d : deliveries) KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
      return tx.events().Append({s.tenant_id,
                                 "schedule.fired@v1",
                                 agent.id,
                                 session.id,
                                 unit.out.run.id,
                                 {{"schedule_id", s.id},
                                  {"slot", FormatRfc3339(slot)},
                                  {"missed", plan.missed},
                                  {"message_id", unit.out.message.id},
                                  {"next_fire_at", TimeOrNull(current->next_fire_at)}}});
    };
    auto written = co_await store::AsyncWrite(store_, std::move(fire));
    if (written.ok()) {
      done.wake = true;
      if (stale) co_return;
      AfterIntake(unit);
      if (!deliveries.empty()) WakeDeliveries();
      if (new_session) {
        asio::co_spawn(
            executor_,
            EmitFor(s.tenant_id, agent.id, "session.opened",
                    {{"agent_id", agent.id}, {"session_id", session.id}, {"title", session.title}}),
            asio::detached);
      }
      co_return;
    }
    if (!unit.refused) {
      LogError("schedule " + s.id + ": " + written.status().message());
      co_return;
    }
    refusal = written.status().message();
  }

  // Nothing is posted for this slot: record it as refused, and move on.
  store::WriteFn refuse = [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto current, StillDue(tx, s));
    if (!current) return Status::Ok();
    store::ScheduleFire record{
        s.tenant_id, s.id, slot, now, "refused", s.session_id, "", "", refusal.substr(0, 500)};
    Status recorded = tx.schedules().InsertFire(record);
    if (recorded.code() == Code::kConflict) return Status::Ok();
    KEEL_RETURN_IF_ERROR(recorded);
    Advance(*current, plan, now, end);
    KEEL_RETURN_IF_ERROR(tx.schedules().UpdateSchedule(*current));
    return tx.events().Append({s.tenant_id,
                               "schedule.refused@v1",
                               s.agent_id,
                               s.session_id,
                               "",
                               {{"schedule_id", s.id},
                                {"slot", FormatRfc3339(slot)},
                                {"reason", record.error},
                                {"next_fire_at", TimeOrNull(current->next_fire_at)}}});
  };
  auto written = co_await store::AsyncWrite(store_, std::move(refuse));
  if (!written.ok()) {
    LogError("schedule " + s.id + ": " + written.status().message());
    co_return;
  }
  done.wake = true;
}

}  // namespace keel::runtime

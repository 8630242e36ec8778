// Schedules: the leader fires their due slots (docs/SCHEDULES.md).
//
// ScheduleLoop runs on every node and acts only while Store::leader() holds. Each round reads
// the due schedules (runtime-wide, the longest due first) and the earliest next_fire_at, fires
// the due ones, up to kMaxFiring at once (so their commits share fsyncs), and sleeps until the
// earliest next slot, at most a second: a schedule created on another node is seen within it,
// one created or resumed here wakes the loop at once (WakeSchedules). Idle, a round is one
// indexed read per second.
//
// A round's due slots go out in groups of up to kGroup: FireGroup reads the group's agents and
// their plugins once and posts all its slots in ONE unit of work, each slot written exactly as
// FireSchedule's unit below writes it (so a node that fell behind catches up with a read, a
// unit and a wake-up per group rather than per slot: on PostgreSQL each costs round trips).
// A lone due slot, and any slot that needs more than a plain post (a skip, an unparsable
// schedule, a deleted agent, a schedule.fired hook), is FireSchedule's. When intake refuses one
// slot of a group, the group's unit rolls back whole and each of its slots is fired alone by
// FireSchedule: a refused slot holds back no other, and the re-read and the unique slot make
// the retry exact.
//
// Firing units are urgent (Store::WriteUrgent): they go ahead of the queued turns' units, so a
// busy store delays the turns, not the posting of the slots (at most kMaxFiring are queued).
//
// FireSchedule decides with schedule::PlanFiring what a due schedule does, then writes it in
// ONE unit of work that re-reads the schedule (still active with the same next slot: nobody
// fired it meanwhile), records the slot (schedule_fires, unique per (schedule_id, slot): a
// second node or a restarted process doing the same slot writes nothing), advances
// next_fire_at (a one-shot is done), and posts the prompt through intake's unit body
// (Intake::Write: message, run, their events) with schedule.fired@v1. The slot is recorded before
// the prompt is posted and both commit together: a slot posts once, and a recorded slot always
// has its prompt. When intake refuses (an inactive session, the tenant's run cap, a session
// whose agent rejects while busy), that unit is rolled back and one of its own records the slot
// as refused, with schedule.refused@v1, and advances the schedule all the same.

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <map>

#include "keel/access/access.h"
#include "keel/access/users.h"
#include "keel/channels/webhook.h"
#include "keel/common/ids.h"
#include "keel/common/json_util.h"
#include "keel/common/log.h"
#include "keel/plugins/bus.h"
#include "keel/plugins/host.h"
#include "keel/runs/open_session.h"
#include "keel/runtime/plugin_bridge.h"
#include "keel/runtime/runtime.h"
#include "keel/schedule/schedule.h"
#include "keel/store/async.h"
#include "keel/store/channel_store.h"
#include "keel/store/row_images.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

constexpr int kMaxFiring = 64;  // schedules fired at once by one node
constexpr size_t kGroup = 16;   // due slots posted in one unit of work (FireGroup)
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
  // Reassigned since it was read (whom it acts for changed): the next round posts the slot
  // with the schedule as it is now.
  if (current->status != "active" || current->next_fire_at != seen.next_fire_at ||
      current->created_by != seen.created_by || current->caller_role != seen.caller_role ||
      current->user_id != seen.user_id || current->channel_id != seen.channel_id) {
    return std::optional<store::Schedule>();
  }
  return std::optional<store::Schedule>(std::move(current).value());
}

// The role a slot of `s` posts with: the role recorded with it, bounded by the role on the
// agent now of each person it acts for (its token's user, and the person it was made for,
// `user_id`), as their own requests would be (docs/USERS.md), and by the `role` now of the
// channel it was made through (`channel_id`), as that channel's runs are. kPermissionDenied
// when one of them no longer reaches the agent, or reaches it only as a guest: a guest holds
// no schedules (none can make one), and a guest's turns count against the agent's budget per
// identity, which a slot has not.
Result<std::string> SlotRole(store::Tx& tx, const store::Schedule& s) {
  std::string role = s.caller_role;
  auto bound_by = [&](const std::string& user_id, const std::string& who) -> Status {
    auto on = access::UserRoleOn(tx, s.tenant_id, user_id, s.agent_id);
    if (on.status().code() == Code::kNotFound) {  // none such (a store edited by hand)
      return PermissionDenied(who + " does not exist");
    }
    KEEL_RETURN_IF_ERROR(on.status());
    if (!*on) return PermissionDenied(who + " has no role on the agent any more");
    if (**on == "guest") {
      return PermissionDenied(who +
                              " is only a guest on the agent now, and a guest holds no "
                              "schedules");
    }
    role = access::LowerRole(role, **on);
    return Status::Ok();
  };
  if (!s.user_id.empty()) {
    KEEL_RETURN_IF_ERROR(bound_by(s.user_id, "the user " + s.user_id + " it was made for"));
  }
  if (!s.channel_id.empty()) {
    const std::string which = "the channel " + s.channel_id + " it was made through";
    auto channel = tx.channels().GetChannel(s.tenant_id, s.channel_id);
    if (channel.status().code() == Code::kNotFound) return PermissionDenied(which + " is gone");
    KEEL_RETURN_IF_ERROR(channel.status());
    // As a disabled channel takes no message (its schedules stop with it).
    if (!channel->enabled) return PermissionDenied(which + " is disabled");
    auto settings = ParseJson(channel->settings);
    Result<std::string> on =
        settings.ok() ? channels::SettingsRole(*settings) : Result<std::string>(settings.status());
    if (!on.ok()) return PermissionDenied(which + " has no role: " + on.status().message());
    if (*on == "guest") {
      return PermissionDenied(which + " acts as a guest now, and a guest holds no schedules");
    }
    role = access::LowerRole(role, *on);
  }
  auto token = tx.tokens().GetToken(s.tenant_id, s.created_by);
  if (token.status().code() == Code::kNotFound) return role;  // as access::Revoked
  KEEL_RETURN_IF_ERROR(token.status());
  if (!token->user_id.empty()) {
    KEEL_RETURN_IF_ERROR(bound_by(token->user_id, "the user of token " + s.created_by));
  }
  return role;
}

// The schedule after a due slot was dealt with.
void Advance(store::Schedule& s, const schedule::Firing& plan, Millis now, bool end) {
  s.next_fire_at = end ? std::nullopt : plan.next;
  s.status = s.next_fire_at ? "active" : "done";
  if (plan.slot) s.last_fired_at = plan.slot;
  s.updated_at = now;
}

}  // namespace

struct Runtime::SlotPost {
  store::Schedule s;  // as read by the round
  schedule::Firing plan;
  Millis now = 0;
  Millis slot = 0;
  store::Agent agent;
  store::Session session;  // the schedule's, or a new one (its id set before the unit)
  bool new_session = false;
  std::vector<store::PluginDelivery> deliveries;
  Intake::Unit unit;
  bool stale = false;  // another node, or an earlier process, dealt with this slot
};

void Runtime::PrepareSlotPost(SlotPost& post, std::string prompt) {
  const store::Schedule& s = post.s;
  post.new_session = s.session_id.empty();
  if (post.new_session) {
    post.session.tenant_id = s.tenant_id;
    post.session.agent_id = post.agent.id;
    post.session.title = s.name;
    post.session.created_by = s.created_by;
    post.session.created_at = post.session.updated_at = post.now;
  }
  IntakeRequest request;
  request.tenant_id = s.tenant_id;
  request.session_id = post.session.id;
  request.content = prompt;
  request.requested_by = s.created_by;
  request.caller_role = s.caller_role;
  request.user_id = s.user_id;
  request.channel_id = s.channel_id;
  post.unit = intake_->Prepare(request, post.agent, std::move(prompt));
  post.unit.trigger = {{"schedule_id", s.id}, {"slot", FormatRfc3339(post.slot)}};
  post.unit.new_session = post.new_session;
}

Status Runtime::WriteSlotPost(store::Tx& tx, SlotPost& post) {
  const store::Schedule& s = post.s;
  const store::Agent& agent = post.agent;
  const store::Session& session = post.session;
  Intake::Unit& unit = post.unit;
  post.stale = false;
  unit.refused = false;  // a run again after a rollback may fail before Intake::Write resets it
  KEEL_ASSIGN_OR_RETURN(auto current, StillDue(tx, s));
  if (!current) {
    post.stale = true;
    return Status::Ok();
  }
  store::ScheduleFire record{
      s.tenant_id, s.id, post.slot, post.now, "posted", session.id, unit.out.run.id,
      unit.out.message.id, ""};
  Status recorded = tx.schedules().InsertFire(record);
  if (recorded.code() == Code::kConflict) {
    post.stale = true;
    return Status::Ok();
  }
  KEEL_RETURN_IF_ERROR(recorded);
  auto role = SlotRole(tx, s);
  if (!role.ok()) {
    if (role.status().code() == Code::kPermissionDenied) unit.refused = true;
    return role.status();
  }
  unit.request.caller_role = *role;
  unit.out.run.caller_role = *role;
  Advance(*current, post.plan, post.now, false);
  KEEL_RETURN_IF_ERROR(tx.schedules().UpdateSchedule(*current));
  tx.Carry("schedule_fires", store::RowImage(record));
  tx.Carry("schedules", store::RowImage(*current));
  if (post.new_session) {
    KEEL_RETURN_IF_ERROR(runs::OpenSession(tx, session));
  }
  KEEL_RETURN_IF_ERROR(intake_->Write(tx, unit));
  for (const auto& d : post.deliveries) KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
  return tx.events().Append({s.tenant_id,
                             "schedule.fired@v1",
                             agent.id,
                             session.id,
                             unit.out.run.id,
                             {{"schedule_id", s.id},
                              {"slot", FormatRfc3339(post.slot)},
                              {"missed", post.plan.missed},
                              {"message_id", unit.out.message.id},
                              {"next_fire_at", TimeOrNull(current->next_fire_at)}}});
}

void Runtime::AfterSlotPost(SlotPost& post) {
  if (post.stale) return;
  intake_->After(post.unit);
  if (!post.deliveries.empty()) plugins_->WakeDeliveries();
  if (post.new_session) {
    const store::Session& session = post.session;
    asio::co_spawn(executor_,
                   plugins_->EmitFor(post.s.tenant_id, post.agent.id, "session.opened",
                           {{"agent_id", post.agent.id},
                            {"session_id", session.id},
                            {"title", session.title}}),
                   asio::detached);
  }
}

void Runtime::WakeSchedules() {
  schedule_wake_ = true;
  schedule_timer_.cancel();
}

asio::awaitable<void> Runtime::ScheduleLoop() {
  std::optional<Millis> firing_since;  // since when this node fires; nullopt while it does not
  std::optional<Millis> next_at;       // the earliest slot not being fired, when known
  while (!dispatcher_->draining()) {
    if (!schedule_wake_) {
      Millis wait = kMaxSleepMs;
      if (next_at) wait = std::clamp<Millis>(*next_at - Now(), 0, kMaxSleepMs);
      schedule_timer_.expires_after(std::chrono::milliseconds(wait));
      boost::system::error_code ec;
      co_await schedule_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    schedule_wake_ = false;
    next_at.reset();
    if (dispatcher_->draining()) break;
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
    std::vector<store::Schedule> picked;
    for (auto& s : due) {
      if (room <= 0) break;
      if (!firing_.insert(s.id).second) continue;
      --room;
      picked.push_back(std::move(s));
    }
    for (size_t i = 0; i < picked.size(); i += kGroup) {
      const size_t n = std::min(kGroup, picked.size() - i);
      if (n == 1) {
        asio::co_spawn(executor_, FireSchedule(std::move(picked[i]), *firing_since),
                       ReportExceptions{"schedule firing"});
        continue;
      }
      std::vector<store::Schedule> group(std::make_move_iterator(picked.begin() + i),
                                         std::make_move_iterator(picked.begin() + i + n));
      asio::co_spawn(executor_, FireGroup(std::move(group), *firing_since),
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
      tx.Carry("schedules", store::RowImage(*current));
      return tx.events().Append({s.tenant_id,
                                 "schedule.skipped@v1",
                                 s.agent_id,
                                 "",
                                 "",
                                 {{"schedule_id", s.id},
                                  {"missed_from", TimeOrNull(s.next_fire_at)},
                                  {"next_fire_at", TimeOrNull(current->next_fire_at)}}});
    };
    auto written = co_await store::AsyncWrite(store_, std::move(skip), store::WriteKind::kUrgent);
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
    auto plugins = co_await plugins_->UsePlugins(s.tenant_id, agent.id, enabled);
    if (plugins->Wants("schedule.fired")) {
      Json payload = {
          {"agent_id", agent.id},     {"schedule_id", s.id},         {"name", s.name},
          {"session_id", session.id}, {"slot", FormatRfc3339(slot)}, {"missed", plan.missed},
          {"prompt", prompt}};
      auto out = co_await plugins_->Emit(plugins, "schedule.fired", std::move(payload),
                                         /*queue_webhooks=*/false);
      if (out.abort) {
        refusal = "plugin " + out.abort->plugin_id + " failed: " + out.abort->message;
      } else {
        const Json& p = out.payload.contains("prompt") ? out.payload["prompt"] : Json();
        if (p.is_string() && !p.get_ref<const std::string&>().empty())
          prompt = p.get<std::string>();
        if (!plugins->webhooks.empty()) {
          deliveries = plugins_->DeliveriesFor(*plugins, "schedule.fired", out.payload);
        }
      }
    }
  }

  SlotPost post;
  post.s = s;
  post.plan = plan;
  post.now = now;
  post.slot = slot;
  post.agent = agent;
  post.session = session;
  post.deliveries = std::move(deliveries);
  if (refusal.empty()) {
    PrepareSlotPost(post, prompt);
    store::WriteFn fire = [&](store::Tx& tx) -> Status { return WriteSlotPost(tx, post); };
    auto written = co_await store::AsyncWrite(store_, std::move(fire), store::WriteKind::kUrgent);
    if (written.ok()) {
      done.wake = true;
      AfterSlotPost(post);
      co_return;
    }
    if (!post.unit.refused) {
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
        s.tenant_id, s.id, slot, now, "refused", s.session_id, "", "", TruncateUtf8(refusal, 500)};
    Status recorded = tx.schedules().InsertFire(record);
    if (recorded.code() == Code::kConflict) return Status::Ok();
    KEEL_RETURN_IF_ERROR(recorded);
    Advance(*current, plan, now, end);
    KEEL_RETURN_IF_ERROR(tx.schedules().UpdateSchedule(*current));
    tx.Carry("schedule_fires", store::RowImage(record));
    tx.Carry("schedules", store::RowImage(*current));
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
  auto written = co_await store::AsyncWrite(store_, std::move(refuse), store::WriteKind::kUrgent);
  if (!written.ok()) {
    LogError("schedule " + s.id + ": " + written.status().message());
    co_return;
  }
  done.wake = true;
}

asio::awaitable<void> Runtime::FireGroup(std::vector<store::Schedule> group, Millis firing_since) {
  // The group's schedules stay in firing_ until it is done with them; one handed to
  // FireSchedule is FireSchedule's from then on.
  struct Done {
    Runtime* rt;
    std::vector<std::string> ids;
    bool wake = false;
    ~Done() {
      for (const auto& id : ids) rt->firing_.erase(id);
      if (wake) rt->WakeSchedules();
    }
  } done{this, {}};
  for (const auto& s : group) done.ids.push_back(s.id);
  auto hand_off = [this, &done, firing_since](store::Schedule s) {
    done.ids.erase(std::remove(done.ids.begin(), done.ids.end(), s.id), done.ids.end());
    asio::co_spawn(executor_, FireSchedule(std::move(s), firing_since),
                   ReportExceptions{"schedule firing"});
  };

  // Only plain posts stay here: a skip, a slot that cannot fire, a deleted agent or a
  // schedule.fired hook (which runs once, in FireSchedule) go to FireSchedule.
  const Millis now = Now();
  std::vector<SlotPost> posts;
  for (auto& s : group) {
    auto planned = schedule::PlanFiring(s, now, firing_since);
    if (!planned.ok() || !planned->slot) {
      hand_off(std::move(s));
      continue;
    }
    SlotPost& post = posts.emplace_back();
    post.s = std::move(s);
    post.plan = *planned;
    post.now = now;
    post.slot = *planned->slot;
  }
  // One read for the group: each agent and its plugins once.
  struct AgentInfo {
    std::optional<store::Agent> agent;  // nullopt: deleted
    std::vector<store::Plugin> enabled;
    bool hook = false;  // a plugin wants schedule.fired
  };
  std::map<std::pair<std::string, std::string>, AgentInfo> agents;
  for (const auto& post : posts) agents[{post.s.tenant_id, post.s.agent_id}];
  std::function<Status(store::Tx&)> read_fn = [&agents](store::Tx& tx) -> Status {
    for (auto& [key, info] : agents) {
      auto a = tx.agents().GetAgent(key.first, key.second);
      if (!a.ok() && a.status().code() != Code::kNotFound) return a.status();
      if (!a.ok()) continue;
      info.agent = *a;
      KEEL_ASSIGN_OR_RETURN(info.enabled, tx.plugins().PluginsForAgent(key.first, key.second));
    }
    return Status::Ok();
  };
  if (!agents.empty()) {
    Status read = co_await store::AsyncRead(store_, std::move(read_fn));
    if (!read.ok()) {
      LogError("schedules: " + read.message());
      co_return;
    }
  }
  for (auto& entry : agents) {
    AgentInfo& info = entry.second;
    if (info.agent) {
      auto plugins =
          co_await plugins_->UsePlugins(entry.first.first, entry.first.second, info.enabled);
      info.hook = plugins->Wants("schedule.fired");
    }
  }
  std::vector<SlotPost> ready;
  for (auto& post : posts) {
    const AgentInfo& info = agents[{post.s.tenant_id, post.s.agent_id}];
    if (!info.agent || info.hook) {
      hand_off(std::move(post.s));
      continue;
    }
    post.agent = *info.agent;
    post.session.id = post.s.session_id.empty() ? NewId() : post.s.session_id;
    // Each slot's intake takes its run's slot now, so the group's runs together stay within
    // this node's room and each tenant's share.
    PrepareSlotPost(post, post.s.prompt);
    ready.push_back(std::move(post));
  }
  if (ready.empty()) co_return;

  // One unit of work posts every slot, each exactly as FireSchedule's unit would.
  store::WriteFn fire = [this, &ready](store::Tx& tx) -> Status {
    // A run again after a rollback may stop before a slot that the first run marked refused.
    for (auto& post : ready) post.unit.refused = false;
    for (auto& post : ready) KEEL_RETURN_IF_ERROR(WriteSlotPost(tx, post));
    return Status::Ok();
  };
  auto written = co_await store::AsyncWrite(store_, std::move(fire), store::WriteKind::kUrgent);
  if (written.ok()) {
    done.wake = true;
    for (auto& post : ready) AfterSlotPost(post);
    co_return;
  }
  // Intake refused one slot and the unit rolled back with it: each slot fires alone, so the
  // refused one is recorded as such without holding back the others.
  const bool refused = std::any_of(ready.begin(), ready.end(),
                                   [](const SlotPost& p) { return p.unit.refused; });
  if (!refused) {
    LogError("schedules: " + written.status().message());
    co_return;
  }
  for (auto& post : ready) hand_off(std::move(post.s));
}

}  // namespace keel::runtime

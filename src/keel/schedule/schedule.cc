#include "keel/schedule/schedule.h"

#include "keel/access/access.h"
#include "keel/common/ids.h"
#include "keel/schedule/cron.h"
#include "keel/store/row_images.h"

namespace keel::schedule {

namespace {

constexpr size_t kMaxPromptBytes = 64 * 1024;
constexpr size_t kMaxNameBytes = 200;

struct Compiled {
  CronExpr cron;
  TimeZone zone;
};

Result<Compiled> Compile(const store::Schedule& s) {
  KEEL_ASSIGN_OR_RETURN(CronExpr cron, CronExpr::Parse(s.cron));
  KEEL_ASSIGN_OR_RETURN(TimeZone zone, TimeZone::Find(s.timezone));
  return Compiled{std::move(cron), std::move(zone)};
}

// The latest slot of `s` at or before `now`, given that `due` (its next_fire_at) is one.
Result<Millis> LatestDue(const store::Schedule& s, Millis due, Millis now) {
  if (s.kind == "once") return due;
  KEEL_ASSIGN_OR_RETURN(Compiled c, Compile(s));
  return LatestSlot(c.cron, c.zone, now, due - 1).value_or(due);
}

}  // namespace

Result<store::Schedule> MakeSchedule(const ScheduleRequest& r, const std::string& tenant_id,
                                     const std::string& created_by, const std::string& caller_role,
                                     Millis now) {
  if (r.agent_id.empty()) return InvalidArgument("field 'agent_id' is required");
  if (r.cron.empty() == !r.at.has_value()) {
    return InvalidArgument(r.cron.empty() ? "one of 'cron' and 'at' is required"
                                          : "give 'cron' or 'at', not both");
  }
  if (r.prompt.empty()) return InvalidArgument("field 'prompt' must not be empty");
  if (r.prompt.size() > kMaxPromptBytes) {
    return InvalidArgument("field 'prompt' is longer than " + std::to_string(kMaxPromptBytes) +
                           " bytes");
  }
  if (r.name.size() > kMaxNameBytes) {
    return InvalidArgument("field 'name' is longer than " + std::to_string(kMaxNameBytes) +
                           " bytes");
  }
  if (r.missed != "skip" && r.missed != "catch_up_one") {
    return InvalidArgument("field 'missed' must be \"skip\" or \"catch_up_one\", not \"" +
                           r.missed.substr(0, 40) + "\"");
  }
  auto zone = TimeZone::Find(r.timezone);
  if (!zone.ok()) return InvalidArgument("field 'timezone': " + zone.status().message());

  store::Schedule s;
  s.id = NewId();
  s.tenant_id = tenant_id;
  s.agent_id = r.agent_id;
  s.timezone = r.timezone;
  s.prompt = r.prompt;
  s.session_id = r.session_id;
  s.missed = r.missed;
  s.status = "active";
  s.created_by = created_by;
  s.caller_role = caller_role;
  s.created_at = s.updated_at = now;
  if (!r.cron.empty()) {
    auto cron = CronExpr::Parse(r.cron);
    if (!cron.ok()) return InvalidArgument("field 'cron': " + cron.status().message());
    s.kind = "cron";
    s.cron = cron->text();
    s.next_fire_at = NextSlot(*cron, *zone, now);
    if (!s.next_fire_at) {
      return InvalidArgument("field 'cron': \"" + s.cron + "\" never fires");
    }
    s.name = r.name.empty() ? s.cron : r.name;
  } else {
    s.kind = "once";
    s.at = r.at;
    s.next_fire_at = r.at;
    s.name = r.name.empty() ? "once at " + FormatRfc3339(*r.at) : r.name;
  }
  return s;
}

Result<std::optional<Millis>> SlotAfter(const store::Schedule& s, Millis after) {
  if (s.kind == "once") {
    if (s.at && *s.at > after) return s.at;
    return std::optional<Millis>();
  }
  KEEL_ASSIGN_OR_RETURN(Compiled c, Compile(s));
  return NextSlot(c.cron, c.zone, after);
}

Result<Firing> PlanFiring(const store::Schedule& s, Millis now, Millis firing_since) {
  const Millis due = s.next_fire_at.value_or(now);
  Firing f;
  f.missed = due < firing_since && s.updated_at < firing_since;
  if (!f.missed) {
    f.slot = due;
    if (s.kind == "cron") {
      KEEL_ASSIGN_OR_RETURN(f.next, SlotAfter(s, due));
    }
    return f;
  }
  if (s.missed == "catch_up_one") {
    KEEL_ASSIGN_OR_RETURN(f.slot, LatestDue(s, due, now));
  }
  KEEL_ASSIGN_OR_RETURN(f.next, SlotAfter(s, now));
  return f;
}

Result<std::optional<Millis>> ResumeAt(const store::Schedule& s, Millis now) {
  if (s.next_fire_at && *s.next_fire_at <= now && s.missed == "catch_up_one") {
    KEEL_ASSIGN_OR_RETURN(Millis latest, LatestDue(s, *s.next_fire_at, now));
    return std::optional<Millis>(latest);
  }
  return SlotAfter(s, now);
}

Status InsertSchedule(store::Tx& tx, const store::Schedule& s) {
  auto agent = tx.agents().GetAgent(s.tenant_id, s.agent_id);
  if (!agent.ok()) {
    if (agent.status().code() != Code::kNotFound) return agent.status();
    return InvalidArgument("field 'agent_id': no agent " + s.agent_id);
  }
  if (!s.session_id.empty()) {
    auto session = tx.sessions().GetSession(s.tenant_id, s.session_id);
    if (!session.ok() && session.status().code() != Code::kNotFound) return session.status();
    if (!session.ok() || session->agent_id != s.agent_id) {
      return InvalidArgument("field 'session_id': " + s.session_id + " is not a session of agent " +
                             s.agent_id);
    }
    if (session->status == "inactive") {
      return InvalidArgument("field 'session_id': session " + s.session_id + " is inactive");
    }
  }
  KEEL_RETURN_IF_ERROR(tx.schedules().InsertSchedule(s));
  tx.Carry("schedules", store::RowImage(s));
  return tx.events().Append({s.tenant_id,
                             "schedule.created@v1",
                             s.agent_id,
                             s.session_id,
                             "",
                             {{"schedule_id", s.id},
                              {"kind", s.kind},
                              {"next_fire_at", FormatRfc3339(s.next_fire_at.value_or(0))}}});
}

Status RemoveSchedule(store::Tx& tx, const std::string& tenant_id, const std::string& id,
                      const std::string& agent_id) {
  KEEL_ASSIGN_OR_RETURN(store::Schedule s, tx.schedules().GetSchedule(tenant_id, id));
  if (!agent_id.empty() && s.agent_id != agent_id) return NotFound("schedule not found: " + id);
  KEEL_RETURN_IF_ERROR(tx.schedules().DeleteSchedule(tenant_id, id));
  tx.Carry("schedules", store::DeletedImage({{"id", id}}));  // and its fires
  return tx.events().Append(
      {tenant_id, "schedule.deleted@v1", s.agent_id, s.session_id, "", {{"schedule_id", id}}});
}

namespace {
Json TimeOrNull(const std::optional<Millis>& t) {
  return t ? Json(FormatRfc3339(*t)) : Json(nullptr);
}
Json TextOrNull(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }
}  // namespace

Json ScheduleJson(const store::Schedule& s) {
  return {{"id", s.id},
          {"agent_id", s.agent_id},
          {"name", s.name},
          {"kind", s.kind},
          {"cron", TextOrNull(s.cron)},
          {"at", TimeOrNull(s.at)},
          {"timezone", s.timezone},
          {"prompt", s.prompt},
          {"session_id", TextOrNull(s.session_id)},
          {"missed", s.missed},
          {"status", s.status},
          {"suspended_reason",
           s.status == "suspended" ? Json(access::SuspendedReason(s.created_by)) : Json(nullptr)},
          {"next_fire_at", TimeOrNull(s.next_fire_at)},
          {"last_fired_at", TimeOrNull(s.last_fired_at)},
          {"created_by", s.created_by},
          {"user_id", TextOrNull(s.user_id)},
          {"channel_id", TextOrNull(s.channel_id)},
          {"created_at", FormatRfc3339(s.created_at)},
          {"updated_at", FormatRfc3339(s.updated_at)}};
}

Json FireJson(const store::ScheduleFire& f) {
  return {{"slot", FormatRfc3339(f.slot)},  {"fired_at", FormatRfc3339(f.fired_at)},
          {"outcome", f.outcome},           {"session_id", TextOrNull(f.session_id)},
          {"run_id", TextOrNull(f.run_id)}, {"message_id", TextOrNull(f.message_id)},
          {"error", TextOrNull(f.error)}};
}

}  // namespace keel::schedule

#pragma once
// Internal to the store backends: the columns of schedules and schedule_fires and how a result
// row maps to them (see rows.h for the pattern).

#include "keel/store/rows.h"
#include "keel/store/schedule_store.h"

namespace keel::store::rows {

inline constexpr const char* kScheduleCols =
    "id, tenant_id, agent_id, name, kind, cron, at, timezone, prompt, session_id, missed, status, "
    "next_fire_at, last_fired_at, created_by, caller_role, created_at, updated_at, user_id, "
    "channel_id";
template <typename Row>
Schedule ReadSchedule(const Row& r) {
  Schedule s;
  s.id = r.Text(0);
  s.tenant_id = r.Text(1);
  s.agent_id = r.Text(2);
  s.name = r.Text(3);
  s.kind = r.Text(4);
  s.cron = r.Text(5);
  s.at = r.OptInt(6);
  s.timezone = r.Text(7);
  s.prompt = r.Text(8);
  s.session_id = r.Text(9);
  s.missed = r.Text(10);
  s.status = r.Text(11);
  s.next_fire_at = r.OptInt(12);
  s.last_fired_at = r.OptInt(13);
  s.created_by = r.Text(14);
  s.caller_role = r.Text(15);
  s.created_at = r.Int(16);
  s.updated_at = r.Int(17);
  s.user_id = r.Text(18);
  s.channel_id = r.Text(19);
  return s;
}

inline constexpr const char* kFireCols =
    "tenant_id, schedule_id, slot, fired_at, outcome, session_id, run_id, message_id, error";
template <typename Row>
ScheduleFire ReadFire(const Row& r) {
  ScheduleFire f;
  f.tenant_id = r.Text(0);
  f.schedule_id = r.Text(1);
  f.slot = r.Int(2);
  f.fired_at = r.Int(3);
  f.outcome = r.Text(4);
  f.session_id = r.Text(5);
  f.run_id = r.Text(6);
  f.message_id = r.Text(7);
  f.error = r.Text(8);
  return f;
}

}  // namespace keel::store::rows

#pragma once
// Schedules (docs/SCHEDULES.md): the records and their storage port. A schedule posts a prompt
// into one of its agent's sessions (or a new session each time) at the slots of a cron
// expression in a time zone, or once at a given time. Each slot that fired is recorded once:
// (schedule_id, slot) is unique, and the record is written in the unit of work that posts the
// prompt, so a slot never fires twice, whatever restarts or other nodes do.

#include <optional>
#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {

struct Schedule {
  std::string id;
  std::string tenant_id;
  std::string agent_id;
  std::string name;
  std::string kind = "cron";  // cron | once
  std::string cron;           // kind cron: the expression as given
  std::optional<Millis> at;   // kind once: the one slot
  std::string timezone = "UTC";
  std::string prompt;
  std::string session_id;               // "" = a new session for each firing
  std::string missed = "skip";          // skip | catch_up_one: slots missed while no node fired
  // active | paused | done | suspended (the token it acts for was revoked: it fires again once
  // an owner reassigns it to an active token)
  std::string status = "active";
  std::optional<Millis> next_fire_at;   // the next slot to fire; null once done
  std::optional<Millis> last_fired_at;  // the last slot that fired
  std::string created_by;               // token id of whoever created it
  std::string caller_role = "owner";    // that caller's role, carried by the runs it starts
  // The person it was made for beside its token: the sender of the chat message whose run
  // created it (the channel's token is its creator's), or the one a slot's run that created it
  // acted for. Their role on the agent at each slot bounds the slot's; "" for none.
  std::string user_id;
  // The channel whose chat message's run created it (or the one of the schedule whose slot's
  // run did): that channel's `role` as it is at each slot bounds the slot's; "" for none.
  std::string channel_id;
  Millis created_at = 0;
  Millis updated_at = 0;  // every change, a firing included
};

// One slot of a schedule that came due and was dealt with.
struct ScheduleFire {
  std::string tenant_id;
  std::string schedule_id;
  Millis slot = 0;                 // the slot's instant (UTC)
  Millis fired_at = 0;             // when it was recorded
  std::string outcome = "posted";  // posted | refused (intake would not take the prompt)
  std::string session_id;
  std::string run_id;      // empty when refused
  std::string message_id;  // empty when refused
  std::string error;       // why it was refused
};

class ScheduleStore {
 public:
  virtual ~ScheduleStore() = default;
  // kConflict when the id exists.
  virtual Status InsertSchedule(const Schedule& s) = 0;
  // By tenant and id: writes name, status, next_fire_at, last_fired_at, updated_at, created_by,
  // caller_role, user_id and channel_id (the last four change when an owner reassigns a
  // suspended schedule).
  // kNotFound "schedule not found: ID".
  virtual Status UpdateSchedule(const Schedule& s) = 0;
  // kNotFound "schedule not found: ID".
  virtual Result<Schedule> GetSchedule(const std::string& tenant_id, const std::string& id) = 0;
  // By id; `agent_id` empty for every agent's.
  virtual Result<Paged<Schedule>> ListSchedules(const std::string& tenant_id,
                                                const std::string& agent_id, const Page& page) = 0;
  // Deletes the schedule and its fires. kNotFound "schedule not found: ID".
  virtual Status DeleteSchedule(const std::string& tenant_id, const std::string& id) = 0;
  // Records a slot. kConflict when that slot of the schedule is recorded already (another node
  // or an earlier process fired it); on both backends the unit of work may go on.
  virtual Status InsertFire(const ScheduleFire& f) = 0;
  // The schedule's latest fires, newest slot first, at most `limit`.
  virtual Result<std::vector<ScheduleFire>> RecentFires(const std::string& tenant_id,
                                                        const std::string& schedule_id,
                                                        int limit) = 0;
  // The fire that posted run `run_id`'s message; nullopt when no schedule's did (or the schedule
  // has been deleted since, its fires with it).
  virtual Result<std::optional<ScheduleFire>> FireOfRun(const std::string& tenant_id,
                                                        const std::string& run_id) = 0;
  // Runtime-wide: active schedules whose next_fire_at is at or before `now`, the longest due
  // first (next_fire_at, then id). At most `limit`.
  virtual Result<std::vector<Schedule>> DueSchedules(Millis now, int limit) = 0;
  // Runtime-wide: the earliest next_fire_at of an active schedule; nullopt when none has one.
  virtual Result<std::optional<Millis>> NextFireAt() = 0;
};

}  // namespace keel::store

#pragma once
// Schedules as values (docs/SCHEDULES.md): checking what a client asks for, and deciding,
// without I/O, when a schedule fires next and what a due one does now. The firing loop
// (runtime/schedules.cc), the API (api/api_schedules.cc) and the agents' schedule tools build
// on these; unit tests drive them with any clock they like.

#include <optional>
#include <string>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"
#include "keel/store/schedule_store.h"
#include "keel/store/store.h"

namespace keel::schedule {

// What a client asks for (the API, the CLI, an agent's schedule.create).
struct ScheduleRequest {
  std::string agent_id;
  std::string name;  // empty: named after its cron or time
  std::string cron;  // exactly one of cron and at
  std::optional<Millis> at;
  std::string timezone = "UTC";
  std::string prompt;
  std::string session_id;       // empty: a new session for each firing
  std::string missed = "skip";  // skip | catch_up_one
};

// Checks a request and makes the schedule to store, active, with its first slot after `now`
// as next_fire_at (a one-shot's `at`, even when it has passed: it then fires at once).
// kInvalidArgument naming the field and value. Whether the agent and the session exist is the
// caller's to check, in its unit of work.
Result<store::Schedule> MakeSchedule(const ScheduleRequest& request, const std::string& tenant_id,
                                     const std::string& created_by, const std::string& caller_role,
                                     Millis now);

// The first slot of `s` strictly after `after`: its cron expression's next slot, or its `at`
// when that is later (nullopt: none is left). Fails only for a stored expression or zone that
// no longer parses (a zone removed from the time zone database).
Result<std::optional<Millis>> SlotAfter(const store::Schedule& s, Millis after);

// What to do with a schedule that is due (next_fire_at <= now).
struct Firing {
  std::optional<Millis> slot;  // the slot to fire now; nullopt: none fires
  std::optional<Millis> next;  // next_fire_at afterwards; nullopt: the schedule is done
  bool missed = false;         // its due slot came while no node was firing schedules
};

// `firing_since` is when the calling node began firing (it became the leader). A due slot
// before it, on a schedule nobody changed since then, was missed: no node fired while it came
// due. A slot that is merely late (the node was busy) is not missed and fires, and a cron
// schedule then goes on from that slot, so a busy node catches up slot by slot. A missed one
// follows the schedule's policy: skip fires nothing and moves to the first slot after `now`;
// catch_up_one fires the latest missed slot, then moves on likewise.
// REQUIRES: s.status == "active" and s.next_fire_at <= now.
Result<Firing> PlanFiring(const store::Schedule& s, Millis now, Millis firing_since);

// next_fire_at for a paused schedule resumed at `now`: with skip, its first slot after now;
// with catch_up_one, the latest slot that came due while it was paused, if one did (it fires
// at once), else likewise. nullopt: nothing is left (a one-shot whose time passed, with skip).
Result<std::optional<Millis>> ResumeAt(const store::Schedule& s, Millis now);

// Inside a unit of work: checks that the agent exists and that a named session is one of its
// sessions and not inactive (kInvalidArgument naming them), stores the schedule and appends
// schedule.created@v1.
Status InsertSchedule(store::Tx& tx, const store::Schedule& s);
// Inside a unit of work: deletes the schedule and its fires, with schedule.deleted@v1. With
// `agent_id` set, only that agent's schedule (another's is kNotFound).
Status RemoveSchedule(store::Tx& tx, const std::string& tenant_id, const std::string& id,
                      const std::string& agent_id = "");

// The API's shapes (docs/API.md, schedules).
Json ScheduleJson(const store::Schedule& s);
Json FireJson(const store::ScheduleFire& f);

}  // namespace keel::schedule

// SqliteTx's ScheduleStore: schedules and the slots they fired.

#include <algorithm>

#include "keel/store/schedule_rows.h"
#include "keel/store/sqlite/sqlite_tx.h"

namespace keel::store::sqlite {
namespace {

using namespace rows;  // NOLINT: the shared record readers

// The statement returned a row (RETURNING), or kNotFound with `what`.
Status Found(Stmt& s, const std::string& what) {
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFound(what);
  return Status::Ok();
}

}  // namespace

Status SqliteTx::InsertSchedule(const Schedule& x) {
  static const std::string kSql = "INSERT INTO schedules(" + std::string(kScheduleCols) +
                                  ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s
      .BindAll(x.id, x.tenant_id, x.agent_id, x.name, x.kind, x.cron, x.at, x.timezone, x.prompt,
               x.session_id, x.missed, x.status, x.next_fire_at, x.last_fired_at, x.created_by,
               x.caller_role, x.created_at, x.updated_at)
      .Run();
}

Status SqliteTx::UpdateSchedule(const Schedule& x) {
  static const std::string kSql =
      "UPDATE schedules SET name=?, status=?, next_fire_at=?, last_fired_at=?, updated_at=?, "
      "created_by=?, caller_role=? WHERE tenant_id=? AND id=? RETURNING id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(x.name, x.status, x.next_fire_at, x.last_fired_at, x.updated_at, x.created_by,
            x.caller_role, x.tenant_id, x.id);
  return Found(s, "schedule not found: " + x.id);
}

Result<Schedule> SqliteTx::GetSchedule(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kScheduleCols) + " FROM schedules WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFound("schedule not found: " + id);
  return ReadSchedule(s);
}

Result<Paged<Schedule>> SqliteTx::ListSchedules(const std::string& tenant_id,
                                                const std::string& agent_id, const Page& page) {
  static const std::string kSql =
      "SELECT " + std::string(kScheduleCols) +
      " FROM schedules WHERE tenant_id=? AND (?='' OR agent_id=?) AND id>? ORDER BY id LIMIT ?";
  const int limit = std::clamp(page.limit, 1, 500);
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, agent_id, agent_id, DecodeCursor(page.cursor), limit + 1);
  KEEL_ASSIGN_OR_RETURN(auto found, Collect<Schedule>(s, ReadSchedule<Stmt>));
  Paged<Schedule> out;
  if (static_cast<int>(found.size()) > limit) {
    found.resize(limit);
    out.next_cursor = EncodeCursor(found.back().id);
  }
  out.items = std::move(found);
  return out;
}

Status SqliteTx::DeleteSchedule(const std::string& tenant_id, const std::string& id) {
  static const std::string kFires =
      "DELETE FROM schedule_fires WHERE tenant_id=? AND schedule_id=?";
  static const std::string kSql = "DELETE FROM schedules WHERE tenant_id=? AND id=? RETURNING id";
  {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kFires));
    KEEL_RETURN_IF_ERROR(s.BindAll(tenant_id, id).Run());
  }
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return Found(s, "schedule not found: " + id);
}

Status SqliteTx::InsertFire(const ScheduleFire& f) {
  // OR IGNORE: a slot recorded already leaves the unit of work usable, as on PostgreSQL.
  static const std::string kSql = "INSERT OR IGNORE INTO schedule_fires(" + std::string(kFireCols) +
                                  ") VALUES(?,?,?,?,?,?,?,?,?) RETURNING slot";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(f.tenant_id, f.schedule_id, f.slot, f.fired_at, f.outcome, f.session_id, f.run_id,
            f.message_id, f.error);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) {
    return Conflict("slot " + FormatRfc3339(f.slot) + " of schedule " + f.schedule_id +
                    " was fired already");
  }
  return Status::Ok();
}

Result<std::vector<ScheduleFire>> SqliteTx::RecentFires(const std::string& tenant_id,
                                                        const std::string& schedule_id, int limit) {
  static const std::string kSql = "SELECT " + std::string(kFireCols) +
                                  " FROM schedule_fires WHERE tenant_id=? AND schedule_id=? "
                                  "ORDER BY slot DESC LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, schedule_id, std::clamp(limit, 1, 500));
  return Collect<ScheduleFire>(s, ReadFire<Stmt>);
}

Result<std::optional<ScheduleFire>> SqliteTx::FireOfRun(const std::string& tenant_id,
                                                        const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kFireCols) +
                                  " FROM schedule_fires WHERE tenant_id=? AND run_id=? LIMIT 1";
  if (run_id.empty()) return std::optional<ScheduleFire>();  // refused fires have no run
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, run_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<ScheduleFire>();
  return std::optional<ScheduleFire>(ReadFire<Stmt>(s));
}

Result<std::vector<Schedule>> SqliteTx::DueSchedules(Millis now, int limit) {
  static const std::string kSql = "SELECT " + std::string(kScheduleCols) +
                                  " FROM schedules WHERE status='active' AND next_fire_at<=? "
                                  "ORDER BY next_fire_at, id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  return Collect<Schedule>(s, ReadSchedule<Stmt>);
}

Result<std::optional<Millis>> SqliteTx::NextFireAt() {
  static const std::string kSql = "SELECT min(next_fire_at) FROM schedules WHERE status='active'";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<Millis>();
  return s.OptInt(0);
}

}  // namespace keel::store::sqlite

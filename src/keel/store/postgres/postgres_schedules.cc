// PostgresTx's ScheduleStore: schedules and the slots they fired. The same answers as SqliteTx.

#include <algorithm>

#include "keel/store/postgres/postgres_tx.h"
#include "keel/store/schedule_rows.h"

namespace keel::store::postgres {
namespace {

using namespace rows;  // NOLINT: the shared record readers

std::string Placeholders(int n) {
  std::string out;
  for (int i = 1; i <= n; ++i) out += (i > 1 ? ",$" : "$") + std::to_string(i);
  return out;
}

// The statement returned a row (RETURNING), or kNotFound with `what`.
Status Found(const Result<Rows>& rows, const std::string& what) {
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return NotFound(what);
  return Status::Ok();
}

}  // namespace

Status PostgresTx::InsertSchedule(const Schedule& x) {
  static const std::string kSql = "INSERT INTO schedules(" + std::string(kScheduleCols) +
                                  ") VALUES(" + Placeholders(18) +
                                  ") ON CONFLICT DO NOTHING RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  auto rows = conn_.Query(
      kSql, P(x.id, x.tenant_id, x.agent_id, x.name, x.kind, x.cron, x.at, x.timezone, x.prompt,
              x.session_id, x.missed, x.status, x.next_fire_at, x.last_fired_at, x.created_by,
              x.caller_role, x.created_at, x.updated_at));
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return Conflict("schedule already exists: " + x.id);
  return Status::Ok();
}

Status PostgresTx::UpdateSchedule(const Schedule& x) {
  static const std::string kSql =
      "UPDATE schedules SET name=$1, status=$2, next_fire_at=$3, last_fired_at=$4, "
      "updated_at=$5, created_by=$6, caller_role=$7 WHERE tenant_id=$8 AND id=$9 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  return Found(conn_.Query(kSql, P(x.name, x.status, x.next_fire_at, x.last_fired_at, x.updated_at,
                                   x.created_by, x.caller_role, x.tenant_id, x.id)),
               "schedule not found: " + x.id);
}

Result<Schedule> PostgresTx::GetSchedule(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kScheduleCols) + " FROM schedules WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  if (rows.empty()) return NotFound("schedule not found: " + id);
  return ReadSchedule(Row(rows, 0));
}

Result<Paged<Schedule>> PostgresTx::ListSchedules(const std::string& tenant_id,
                                                  const std::string& agent_id, const Page& page) {
  static const std::string kSql =
      "SELECT " + std::string(kScheduleCols) +
      " FROM schedules WHERE tenant_id=$1 AND ($2='' OR agent_id=$2) AND id>$3 ORDER BY id "
      "LIMIT $4";
  const int limit = std::clamp(page.limit, 1, 500);
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto rows, conn_.Query(kSql, P(tenant_id, agent_id, DecodeCursor(page.cursor), limit + 1)));
  std::vector<Schedule> found = Collect<Schedule>(rows, ReadSchedule<Row>);
  Paged<Schedule> out;
  if (static_cast<int>(found.size()) > limit) {
    found.resize(limit);
    out.next_cursor = EncodeCursor(found.back().id);
  }
  out.items = std::move(found);
  return out;
}

Status PostgresTx::DeleteSchedule(const std::string& tenant_id, const std::string& id) {
  static const std::string kFires =
      "DELETE FROM schedule_fires WHERE tenant_id=$1 AND schedule_id=$2";
  static const std::string kSql = "DELETE FROM schedules WHERE tenant_id=$1 AND id=$2 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_RETURN_IF_ERROR(conn_.Query(kFires, P(tenant_id, id)).status());
  return Found(conn_.Query(kSql, P(tenant_id, id)), "schedule not found: " + id);
}

Status PostgresTx::InsertFire(const ScheduleFire& f) {
  static const std::string kSql = "INSERT INTO schedule_fires(" + std::string(kFireCols) +
                                  ") VALUES(" + Placeholders(9) +
                                  ") ON CONFLICT DO NOTHING RETURNING slot";
  KEEL_RETURN_IF_ERROR(BindTenant(f.tenant_id));
  auto rows = conn_.Query(kSql, P(f.tenant_id, f.schedule_id, f.slot, f.fired_at, f.outcome,
                                  f.session_id, f.run_id, f.message_id, f.error));
  if (!rows.ok()) return rows.status();
  if (rows->empty()) {
    return Conflict("slot " + FormatRfc3339(f.slot) + " of schedule " + f.schedule_id +
                    " was fired already");
  }
  return Status::Ok();
}

Result<std::vector<ScheduleFire>> PostgresTx::RecentFires(const std::string& tenant_id,
                                                          const std::string& schedule_id,
                                                          int limit) {
  static const std::string kSql = "SELECT " + std::string(kFireCols) +
                                  " FROM schedule_fires WHERE tenant_id=$1 AND schedule_id=$2 "
                                  "ORDER BY slot DESC LIMIT $3";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows,
                        conn_.Query(kSql, P(tenant_id, schedule_id, std::clamp(limit, 1, 500))));
  return Collect<ScheduleFire>(rows, ReadFire<Row>);
}

Result<std::optional<ScheduleFire>> PostgresTx::FireOfRun(const std::string& tenant_id,
                                                          const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kFireCols) +
                                  " FROM schedule_fires WHERE tenant_id=$1 AND run_id=$2 LIMIT 1";
  if (run_id.empty()) return std::optional<ScheduleFire>();  // refused fires have no run
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, run_id)));
  std::vector<ScheduleFire> found = Collect<ScheduleFire>(rows, ReadFire<Row>);
  if (found.empty()) return std::optional<ScheduleFire>();
  return std::optional<ScheduleFire>(std::move(found.front()));
}

// The two runtime-wide reads: the owner's functions give the due schedules' keys (read here
// bound to their tenants) and the earliest time.
Result<std::vector<Schedule>> PostgresTx::DueSchedules(Millis now, int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_due_schedules($1, $2)";
  static const std::string kSql = "SELECT " + std::string(kScheduleCols) +
                                  " FROM schedules WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, P(now, static_cast<int64_t>(
                                                                 std::max(limit, 0)))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<Schedule>(keys, found, ReadSchedule<Row>);
}

Result<std::optional<Millis>> PostgresTx::NextFireAt() {
  static const std::string kSql = "SELECT keel_next_fire_at()";
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, Params()));
  if (rows.empty()) return std::optional<Millis>();
  return rows.OptInt(0, 0);
}

}  // namespace keel::store::postgres

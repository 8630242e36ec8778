// PostgresTx's UsageStore: model usage with its running totals, budgets, the response cache.
// Same answers and error codes as sqlite_usage.cc.

#include "keel/model/metering.h"
#include "keel/store/postgres/postgres_tx.h"
#include "keel/store/usage_rows.h"

namespace keel::store::postgres {
namespace {

using namespace rows;  // NOLINT: the shared record readers

// Adds one call to a totals row, creating it at zero first.
const std::string kAddToTotals =
    "INSERT INTO usage_totals(tenant_id, agent_id, period, period_start, " +
    std::string(kTotalsCols) +
    ") VALUES($1,$2,$3,$4,1,$5,$6,$7,$8,$9) ON CONFLICT(tenant_id, period, period_start, "
    "agent_id) DO UPDATE SET calls=usage_totals.calls+1, "
    "cached_calls=usage_totals.cached_calls+EXCLUDED.cached_calls, "
    "input_tokens=usage_totals.input_tokens+EXCLUDED.input_tokens, "
    "output_tokens=usage_totals.output_tokens+EXCLUDED.output_tokens, "
    "cost_micros=usage_totals.cost_micros+EXCLUDED.cost_micros, "
    "saved_micros=usage_totals.saved_micros+EXCLUDED.saved_micros";

}  // namespace

Status PostgresTx::InsertUsage(const UsageRecord& u) {
  static const std::string kSql = "INSERT INTO model_usage(" + std::string(kUsageCols) +
                                  ") VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13) "
                                  "ON CONFLICT DO NOTHING RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(u.tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto rows, conn_.Query(kSql, P(u.id, u.tenant_id, u.agent_id, u.run_id, u.step_id, u.model,
                                     u.input_tokens, u.output_tokens, u.cost_micros, u.saved_micros,
                                     u.cached, u.fallback, u.created_at)));
  if (rows.empty()) return Conflict("usage record already exists: " + u.id);
  // Pipelined: their results are not needed; a failure fails the unit when it is collected.
  for (const char* period : {model::kPeriodDay, model::kPeriodMonth}) {
    Millis start = model::PeriodStart(period, u.created_at);
    for (const std::string& agent : {u.agent_id, std::string()}) {
      KEEL_RETURN_IF_ERROR(conn_.Send(
          kAddToTotals, P(u.tenant_id, agent, period, start, u.cached ? 1 : 0, u.input_tokens,
                          u.output_tokens, u.cost_micros, u.saved_micros)));
    }
  }
  return Status::Ok();
}

Result<UsageTotals> PostgresTx::RunUsage(const std::string& tenant_id, const std::string& run_id) {
  static const std::string kSql =
      "SELECT count(*), coalesce(sum(cached),0), coalesce(sum(input_tokens),0), "
      "coalesce(sum(output_tokens),0), coalesce(sum(cost_micros),0), "
      "coalesce(sum(saved_micros),0) FROM model_usage WHERE tenant_id=$1 AND run_id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, run_id)));
  if (rows.empty()) return UsageTotals{};
  return ReadTotals(Row(rows, 0), 0);
}

Result<UsageTotals> PostgresTx::PeriodUsage(const std::string& tenant_id,
                                            const std::string& agent_id, const std::string& period,
                                            Millis start) {
  static const std::string kSql = "SELECT " + std::string(kTotalsCols) +
                                  " FROM usage_totals WHERE tenant_id=$1 AND period=$2 AND "
                                  "period_start=$3 AND agent_id=$4";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, period, start, agent_id)));
  if (rows.empty()) return UsageTotals{};
  return ReadTotals(Row(rows, 0), 0);
}

Result<std::vector<AgentUsage>> PostgresTx::PeriodUsageByAgent(const std::string& tenant_id,
                                                               const std::string& period,
                                                               Millis start) {
  static const std::string kSql = "SELECT agent_id, " + std::string(kTotalsCols) +
                                  " FROM usage_totals WHERE tenant_id=$1 AND period=$2 AND "
                                  "period_start=$3 AND agent_id<>'' ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, period, start)));
  std::vector<AgentUsage> out;
  for (int i = 0; i < rows.size(); ++i) {
    Row row(rows, i);
    out.push_back(AgentUsage{row.Text(0), ReadTotals(row, 1)});
  }
  return out;
}

Status PostgresTx::PutBudget(const Budget& b) {
  static const std::string kSql =
      "INSERT INTO budgets(" + std::string(kBudgetCols) +
      ") VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT(tenant_id, scope, period) DO UPDATE SET "
      "limit_micros=EXCLUDED.limit_micros, updated_at=EXCLUDED.updated_at";
  KEEL_RETURN_IF_ERROR(BindTenant(b.tenant_id));
  return conn_
      .Query(kSql, P(b.tenant_id, b.scope, b.period, b.limit_micros, b.created_at, b.updated_at))
      .status();
}

Result<std::vector<Budget>> PostgresTx::ListBudgets(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kBudgetCols) +
                                  " FROM budgets WHERE tenant_id=$1 ORDER BY scope, period";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  std::vector<Budget> out;
  for (int i = 0; i < rows.size(); ++i) out.push_back(ReadBudget(Row(rows, i)));
  return out;
}

Status PostgresTx::DeleteBudget(const std::string& tenant_id, const std::string& scope,
                                const std::string& period) {
  static const std::string kSql =
      "DELETE FROM budgets WHERE tenant_id=$1 AND scope=$2 AND period=$3 RETURNING scope";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, scope, period)));
  if (rows.empty()) return NotFound("no " + period + " budget is set for " + scope);
  return Status::Ok();
}

Result<std::optional<CacheEntry>> PostgresTx::GetCacheEntry(const std::string& tenant_id,
                                                            const std::string& cache_group,
                                                            const std::string& key,
                                                            Millis not_before) {
  static const std::string kSql = "SELECT " + std::string(kCacheCols) +
                                  " FROM model_cache WHERE tenant_id=$1 AND cache_group=$2 AND "
                                  "key=$3 AND created_at>=$4";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, cache_group, key, not_before)));
  if (rows.empty()) return std::optional<CacheEntry>();
  return std::optional<CacheEntry>(ReadCacheEntry(Row(rows, 0)));
}

Status PostgresTx::PutCacheEntry(const CacheEntry& e) {
  static const std::string kSql =
      "INSERT INTO model_cache(" + std::string(kCacheCols) +
      ") VALUES($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT(tenant_id, cache_group, key) DO UPDATE SET "
      "model=EXCLUDED.model, response=EXCLUDED.response, input_tokens=EXCLUDED.input_tokens, "
      "output_tokens=EXCLUDED.output_tokens, created_at=EXCLUDED.created_at";
  KEEL_RETURN_IF_ERROR(BindTenant(e.tenant_id));
  return conn_
      .Query(kSql, P(e.tenant_id, e.cache_group, e.key, e.model, DumpJson(e.response),
                     e.input_tokens, e.output_tokens, e.created_at))
      .status();
}

// Runtime-wide: the owner's function deletes across tenants and returns only the count.
Result<int64_t> PostgresTx::PruneCache(Millis before, int64_t max_entries) {
  static const std::string kSql = "SELECT keel_prune_cache($1, $2)";
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(before, max_entries)));
  return rows.empty() ? 0 : rows.Int(0, 0);
}

}  // namespace keel::store::postgres

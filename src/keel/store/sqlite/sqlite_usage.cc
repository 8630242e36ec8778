// SqliteTx's UsageStore: model usage with its running totals, budgets, the response cache.

#include <sqlite3.h>

#include "keel/model/metering.h"
#include "keel/store/sqlite/sqlite_tx.h"
#include "keel/store/usage_rows.h"

namespace keel::store::sqlite {
namespace {

using namespace rows;  // NOLINT: the shared record readers

// Adds one call to a totals row, creating it at zero first.
const std::string kAddToTotals =
    "INSERT INTO usage_totals(tenant_id, agent_id, period, period_start, " +
    std::string(kTotalsCols) +
    ") VALUES(?,?,?,?,1,?,?,?,?,?) ON CONFLICT(tenant_id, period, period_start, agent_id) DO "
    "UPDATE SET calls=usage_totals.calls+1, "
    "cached_calls=usage_totals.cached_calls+excluded.cached_calls, "
    "input_tokens=usage_totals.input_tokens+excluded.input_tokens, "
    "output_tokens=usage_totals.output_tokens+excluded.output_tokens, "
    "cost_micros=usage_totals.cost_micros+excluded.cost_micros, "
    "saved_micros=usage_totals.saved_micros+excluded.saved_micros";

}  // namespace

Status SqliteTx::InsertUsage(const UsageRecord& u) {
  static const std::string kSql =
      "INSERT INTO model_usage(" + std::string(kUsageCols) + ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)";
  {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
    KEEL_RETURN_IF_ERROR(s.BindAll(u.id, u.tenant_id, u.agent_id, u.run_id, u.step_id, u.model,
                                   u.input_tokens, u.output_tokens, u.cost_micros, u.saved_micros,
                                   u.cached, u.fallback, u.created_at)
                             .Run());
  }
  for (const char* period : {model::kPeriodDay, model::kPeriodMonth}) {
    Millis start = model::PeriodStart(period, u.created_at);
    for (const std::string& agent : {u.agent_id, std::string()}) {
      KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kAddToTotals));
      KEEL_RETURN_IF_ERROR(s.BindAll(u.tenant_id, agent, period, start, u.cached ? 1 : 0,
                                     u.input_tokens, u.output_tokens, u.cost_micros, u.saved_micros)
                               .Run());
    }
  }
  return Status::Ok();
}

Result<UsageTotals> SqliteTx::RunUsage(const std::string& tenant_id, const std::string& run_id) {
  static const std::string kSql =
      "SELECT count(*), coalesce(sum(cached),0), coalesce(sum(input_tokens),0), "
      "coalesce(sum(output_tokens),0), coalesce(sum(cost_micros),0), "
      "coalesce(sum(saved_micros),0) FROM model_usage WHERE tenant_id=? AND run_id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, run_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return UsageTotals{};
  return ReadTotals(s, 0);
}

Result<UsageTotals> SqliteTx::PeriodUsage(const std::string& tenant_id, const std::string& agent_id,
                                          const std::string& period, Millis start) {
  static const std::string kSql = "SELECT " + std::string(kTotalsCols) +
                                  " FROM usage_totals WHERE tenant_id=? AND period=? AND "
                                  "period_start=? AND agent_id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, period, start, agent_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return UsageTotals{};
  return ReadTotals(s, 0);
}

Result<std::vector<AgentUsage>> SqliteTx::PeriodUsageByAgent(const std::string& tenant_id,
                                                             const std::string& period,
                                                             Millis start) {
  static const std::string kSql = "SELECT agent_id, " + std::string(kTotalsCols) +
                                  " FROM usage_totals WHERE tenant_id=? AND period=? AND "
                                  "period_start=? AND agent_id!='' ORDER BY agent_id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, period, start);
  std::vector<AgentUsage> out;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(AgentUsage{s.Text(0), ReadTotals(s, 1)});
  }
  return out;
}

Status SqliteTx::PutBudget(const Budget& b) {
  static const std::string kSql =
      "INSERT INTO budgets(" + std::string(kBudgetCols) +
      ") VALUES(?,?,?,?,?,?) ON CONFLICT(tenant_id, scope, period) DO UPDATE SET "
      "limit_micros=excluded.limit_micros, updated_at=excluded.updated_at";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(b.tenant_id, b.scope, b.period, b.limit_micros, b.created_at, b.updated_at)
      .Run();
}

Result<std::vector<Budget>> SqliteTx::ListBudgets(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kBudgetCols) +
                                  " FROM budgets WHERE tenant_id=? ORDER BY scope, period";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  std::vector<Budget> out;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(ReadBudget(s));
  }
  return out;
}

Status SqliteTx::DeleteBudget(const std::string& tenant_id, const std::string& scope,
                              const std::string& period) {
  static const std::string kSql =
      "DELETE FROM budgets WHERE tenant_id=? AND scope=? AND period=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, scope, period);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("no " + period + " budget is set for " + scope);
  return Status::Ok();
}

Result<std::optional<CacheEntry>> SqliteTx::GetCacheEntry(const std::string& tenant_id,
                                                          const std::string& cache_group,
                                                          const std::string& key,
                                                          Millis not_before) {
  static const std::string kSql = "SELECT " + std::string(kCacheCols) +
                                  " FROM model_cache WHERE tenant_id=? AND cache_group=? AND "
                                  "key=? AND created_at>=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, cache_group, key, not_before);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<CacheEntry>();
  return std::optional<CacheEntry>(ReadCacheEntry(s));
}

Status SqliteTx::PutCacheEntry(const CacheEntry& e) {
  static const std::string kSql =
      "INSERT OR REPLACE INTO model_cache(" + std::string(kCacheCols) + ") VALUES(?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s
      .BindAll(e.tenant_id, e.cache_group, e.key, e.model, DumpJson(e.response), e.input_tokens,
               e.output_tokens, e.created_at)
      .Run();
}

Result<int64_t> SqliteTx::PruneCache(Millis before, int64_t max_entries) {
  static const std::string kExpired = "DELETE FROM model_cache WHERE created_at<?";
  static const std::string kOldest =
      "DELETE FROM model_cache WHERE rowid IN (SELECT rowid FROM model_cache "
      "ORDER BY created_at DESC LIMIT -1 OFFSET ?)";
  int64_t deleted = 0;
  {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kExpired));
    KEEL_RETURN_IF_ERROR(s.BindAll(before).Run());
    deleted += sqlite3_changes(db_.raw());
  }
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kOldest));
  KEEL_RETURN_IF_ERROR(s.BindAll(max_entries).Run());
  deleted += sqlite3_changes(db_.raw());
  return deleted;
}

}  // namespace keel::store::sqlite

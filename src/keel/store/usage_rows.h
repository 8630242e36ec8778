#pragma once
// Internal to the store backends: the column lists and row readers of the usage port's records
// (usage_store.h), shared by SQLite and PostgreSQL as rows.h does for the others.

#include <string>

#include "keel/store/rows.h"
#include "keel/store/usage_store.h"

namespace keel::store::rows {

inline constexpr const char* kUsageCols =
    "id, tenant_id, agent_id, run_id, step_id, model, input_tokens, output_tokens, cost_micros, "
    "saved_micros, cached, fallback, created_at";

// The sums a totals query selects, in UsageTotals order.
inline constexpr const char* kTotalsCols =
    "calls, cached_calls, input_tokens, output_tokens, cost_micros, saved_micros";

template <typename Row>
UsageTotals ReadTotals(const Row& s, int first) {
  UsageTotals t;
  t.calls = s.Int(first);
  t.cached_calls = s.Int(first + 1);
  t.input_tokens = s.Int(first + 2);
  t.output_tokens = s.Int(first + 3);
  t.cost_micros = s.Int(first + 4);
  t.saved_micros = s.Int(first + 5);
  return t;
}

inline constexpr const char* kBudgetCols =
    "tenant_id, scope, period, limit_micros, created_at, updated_at";
template <typename Row>
Budget ReadBudget(const Row& s) {
  return Budget{s.Text(0), s.Text(1), s.Text(2), s.Int(3), s.Int(4), s.Int(5)};
}

inline constexpr const char* kCacheCols =
    "tenant_id, cache_group, key, model, response, input_tokens, output_tokens, created_at";
template <typename Row>
CacheEntry ReadCacheEntry(const Row& s) {
  CacheEntry e;
  e.tenant_id = s.Text(0);
  e.cache_group = s.Text(1);
  e.key = s.Text(2);
  e.model = s.Text(3);
  e.response = ParseStored(s.Text(4));
  e.input_tokens = s.Int(5);
  e.output_tokens = s.Int(6);
  e.created_at = s.Int(7);
  return e;
}

}  // namespace keel::store::rows

#pragma once
// The model router's storage port (docs/API.md, usage, budgets and the response cache): what
// each model call used and cost, running totals per tenant and agent for each UTC day and
// month, the budgets set on them, and the exact-match response cache.
//
// Usage is written in the unit of work that records the step the call answered, so a step and
// its usage commit together or not at all. Cache entries are written in units of their own: a
// cache is allowed to lose or miss an entry, never to fail a run.

#include <optional>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"

namespace keel::store {

// One model call: who made it, which model answered, tokens and cost. Money is in micro-dollars.
struct UsageRecord {
  std::string id;
  std::string tenant_id;
  std::string agent_id;
  std::string run_id;
  std::string step_id;  // the model step the call answered
  std::string model;    // the model string that answered ("openai/gpt-4o-mini", "local")
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cost_micros = 0;   // 0 for a cache hit
  int64_t saved_micros = 0;  // a cache hit: what the call would have cost
  bool cached = false;       // answered from the response cache
  bool fallback = false;     // answered by the agent's fallback model
  Millis created_at = 0;
};

// Sums over model calls.
struct UsageTotals {
  int64_t calls = 0;
  int64_t cached_calls = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cost_micros = 0;
  int64_t saved_micros = 0;
};

struct AgentUsage {
  std::string agent_id;
  UsageTotals totals;
};
// One period's totals of the tenant (agent_id "") or of one agent.
struct PeriodTotals {
  Millis period_start = 0;
  std::string agent_id;
  UsageTotals totals;
};

// A spending limit for a UTC day or month, on the whole tenant or on one agent.
struct Budget {
  std::string tenant_id;
  std::string scope;   // "tenant", or an agent id
  std::string period;  // day | month
  int64_t limit_micros = 0;
  Millis created_at = 0;
  Millis updated_at = 0;
};

// A cached model answer. (tenant_id, cache_group, key) is unique; key is the sha256 (hex) of the
// normalized request.
struct CacheEntry {
  std::string tenant_id;
  std::string cache_group;
  std::string key;
  std::string model;               // the model string the request named
  Json response = Json::object();  // {"text", "tool_calls": [{"id","name","arguments"}]}
  int64_t input_tokens = 0;        // the usage of the call that filled the entry
  int64_t output_tokens = 0;
  Millis created_at = 0;
};

class UsageStore {
 public:
  virtual ~UsageStore() = default;

  // Records a call and adds it to the totals of its agent and of its tenant for the UTC day and
  // the UTC month of created_at. kConflict when the id exists.
  virtual Status InsertUsage(const UsageRecord& u) = 0;
  // The run's calls summed (zeros for a run without any).
  virtual Result<UsageTotals> RunUsage(const std::string& tenant_id, const std::string& run_id) = 0;
  // The totals of the period ("day" or "month") that starts at `start` (model::PeriodStart):
  // of one agent, or of the whole tenant when agent_id is "". Zeros when nothing was used.
  virtual Result<UsageTotals> PeriodUsage(const std::string& tenant_id, const std::string& agent_id,
                                          const std::string& period, Millis start) = 0;
  // Each agent's totals for that period, by agent id; agents that used nothing are absent.
  virtual Result<std::vector<AgentUsage>> PeriodUsageByAgent(const std::string& tenant_id,
                                                             const std::string& period,
                                                             Millis start) = 0;
  // Every period's totals from `since` on (the tenant's and each agent's), by period_start then
  // agent id (the tenant's first); periods without usage are absent.
  virtual Result<std::vector<PeriodTotals>> UsageHistory(const std::string& tenant_id,
                                                         const std::string& period,
                                                         Millis since) = 0;

  // Inserts or replaces the budget of (tenant, scope, period); created_at is kept on replace.
  virtual Status PutBudget(const Budget& b) = 0;
  // The tenant's budgets, by scope then period.
  virtual Result<std::vector<Budget>> ListBudgets(const std::string& tenant_id) = 0;
  // The same, filled later (store.h, Tx).
  virtual Status ListBudgetsLater(const std::string& tenant_id, std::vector<Budget>& out) = 0;
  // kNotFound "no PERIOD budget is set for SCOPE".
  virtual Status DeleteBudget(const std::string& tenant_id, const std::string& scope,
                              const std::string& period) = 0;

  // The entry, when there is one created at or after `not_before`.
  virtual Result<std::optional<CacheEntry>> GetCacheEntry(const std::string& tenant_id,
                                                          const std::string& cache_group,
                                                          const std::string& key,
                                                          Millis not_before) = 0;
  // Inserts or replaces the entry.
  virtual Status PutCacheEntry(const CacheEntry& e) = 0;
  // Runtime-wide: deletes the entries created before `before`, then the oldest ones beyond
  // `max_entries`. Returns how many it deleted.
  virtual Result<int64_t> PruneCache(Millis before, int64_t max_entries) = 0;
};

}  // namespace keel::store

#pragma once
// Internal to the runtime: the model router's side of a run (model_calls.cc). One model call
// goes through ModelCaller::Call, in this order:
//
//   response cache  the agent's cache group (config.cache_group, default the agent's id) is
//                   looked up by the sha256 of the normalized request; a hit is the answer
//                   (its text reaches streaming clients as one delta), the provider is not asked
//   budgets         the tenant's and the agent's day and month budgets: when what they have
//                   spent plus this call's estimated cost (input tokens ~ request bytes / 4,
//                   priced) would cross one, no call is made and the run stops (budget_exceeded)
//   provider        the agent's model; when it is unavailable (after its own retries), the
//                   agent's config.fallback_model gets the same request, after its own budget
//                   check
//   metering        the answer's cost from the price table; a primary's answer is queued for
//                   the cache, and the queue is written in one unit of its own a moment later
//                   (QueueCacheEntry), off the run's path; until that unit commits, this node
//                   answers the same request from the queue
//
// The executor records the outcome with the model step (ModelCall::Record), in the step's unit
// of work. A cache that fails (a read or a write) only costs the cache: the call goes to the
// provider as if there were none, and keel_model_cache_errors_total counts it.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/config/config.h"
#include "keel/model/provider.h"
#include "keel/store/store.h"
#include "keel/store/usage_store.h"

namespace keel {
struct Metrics;
}

namespace keel::runtime {

// What one model call came to.
struct ModelCall {
  Result<model::ModelResponse> response = Internal("no model call was made");
  std::string model;    // the model string that answered: the agent's, or its fallback
  bool cached = false;  // answered from the response cache
  bool fell_back = false;
  std::string primary_error;  // why the agent's model failed, when the fallback was asked
  int64_t cost_micros = 0;
  int64_t saved_micros = 0;  // a cache hit: what the call would have cost
  // Non-null when no call was made because a budget would be crossed:
  // {"scope", "period", "limit_usd", "spent_usd", "estimate_usd"}.
  Json budget_exceeded;
  bool store_failed = false;  // the budgets could not be read: no call was made

  // The run error's message for a budget stop, naming the budget.
  std::string BudgetMessage() const;
  // Adds what the step shows of the call to a model step's output: "model", "cached",
  // "fallback" (and "fallback_from", "primary_error"), "cost_usd", "budget".
  void Describe(Json& step_output) const;
  // In the unit of work that records `step` (the call's model step): the call's usage record
  // (when a model or the cache answered) and its events, model.fallback@v1 or
  // budget.exceeded@v1.
  Status Record(store::Tx& tx, const store::Run& run, const store::Step& step) const;
  // Adds the usage record Record writes (when it writes one) to a run's totals, for a caller
  // that keeps them instead of reading them back (store::UsageStore::RunUsage).
  void AddTo(store::UsageTotals& totals) const;
};

struct HistoryMark;  // below

// Makes the model calls of this node's runs, and keeps the response cache.
// Runs on the server's io executor; no member needs a lock.
class ModelCaller {
 public:
  // `prices`: by model string, for metering and budgets; `cache`: the response cache's
  // settings (an agent turns it off for itself with config.cache).
  ModelCaller(boost::asio::any_io_executor executor, store::Store& store,
              model::ProviderRegistry& providers, Metrics& metrics,
              std::map<std::string, config::ModelPrice> prices, config::CacheConfig cache);

  // Starts pruning the response cache (on the leader): expired entries, and the oldest beyond
  // the bound. REQUIRES: once, on the executor.
  void Start();
  // Stops pruning.
  void Stop();

  // One model call of `run` for `agent` (the order above). `on_delta` hears the answer's text
  // as it streams; `history`, when given, marks the request's history for its cache key.
  boost::asio::awaitable<ModelCall> Call(const store::Run& run, const store::Agent& agent,
                                         const model::ModelRequest& request,
                                         std::function<void(const std::string&)> on_delta,
                                         const HistoryMark* history = nullptr);

 private:
  // Queues an answer for the response cache; queued answers are written together, in one
  // unit of work a moment later, so that a miss does not cost a commit of its own.
  void QueueCacheEntry(store::CacheEntry entry);
  boost::asio::awaitable<void> FlushCacheEntries();  // after a moment, WriteCacheEntries
  void WriteCacheEntries();                          // one unit, not awaited
  boost::asio::awaitable<void> CachePruneLoop();

  boost::asio::any_io_executor executor_;
  store::Store& store_;
  model::ProviderRegistry& providers_;
  Metrics& metrics_;
  const std::map<std::string, config::ModelPrice> prices_;
  const config::CacheConfig cache_;
  bool stopping_ = false;
  // Answers queued for the cache or being written, by their full key (tenant, group, key), so
  // that a call asking again before the unit commits is a hit; the writer thread drops a
  // batch's answers once its unit is done.
  struct Unwritten;
  std::shared_ptr<Unwritten> unwritten_;
  std::vector<std::string> cache_pending_;  // full keys not handed to the writer yet
  uint64_t cache_batches_ = 0;
  bool cache_flush_scheduled_ = false;
};

// A compaction whose summary call failed or was stopped by a budget (context.cc): its failed
// step and the call, recorded with the run's end (the step, then ModelCall::Record).
struct FailedSummary {
  store::Step step;
  ModelCall call;
};

// The run's usage as the API shows it: its tokens, and the cost, cached calls and cache savings
// of its model calls.
Json RunUsageJson(const store::Run& run, const store::UsageTotals& totals);
// Usage totals as the API shows them (GET /v1/usage).
Json UsageTotalsJson(const store::UsageTotals& totals);

// A stretch of a request's messages, the session's history, stood for by a digest of it that
// the session's conversation keeps from turn to turn (HashHistory): a turn's cache key hashes
// only what the history gained since the last turn, not the whole conversation again. Whoever
// changes those messages after it was taken moves `begin` (an insertion before them) or drops
// the mark (any other change).
struct HistoryMark {
  size_t begin = 0;     // the stretch is request.messages[begin, begin + count)
  size_t count = 0;     // 0: no mark
  size_t bytes = 0;     // of text in it, as RequestKey::bytes counts them
  std::string digest;   // of its messages, each framed as CacheKeyOf frames a message
};

// Whether a stored message is part of the conversation a model turn is sent (user and
// assistant messages; a request carries them as {role, content}).
bool InConversation(const store::Message& m);

struct HistoryHash;  // conversation_cache.h
// The mark of `history`'s conversation messages, to sit at request.messages[begin]. Goes on
// from `kept` when it covers a first stretch of `history` (the same messages), else hashes them
// all; then leaves in `kept` (when given) what covers them all.
HistoryMark HashHistory(std::span<const store::Message> history, size_t begin, HistoryHash* kept);

// The response cache's key of a request: SHA-256 over the agent's model string, the messages
// (the marked stretch as its digest), the tools, and the agent config fields that change an
// answer (temperature, top_p, top_k, max_tokens, seed, local_rules), hashed as they are walked;
// and the bytes of text it covered, from which a budget estimates the call's input tokens.
struct RequestKey {
  std::string key;
  size_t bytes = 0;
};
RequestKey CacheKeyOf(const std::string& model, const model::ModelRequest& request,
                      const HistoryMark& history = {});

}  // namespace keel::runtime

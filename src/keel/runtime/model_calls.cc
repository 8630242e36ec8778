// The model router's side of a run: one model call through the response cache, the budgets,
// the agent's model and its fallback, and metering (see model_calls.h).

#include "keel/runtime/model_calls.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/log.h"
#include "keel/metrics.h"
#include "keel/model/metering.h"
#include "keel/runtime/conversation_cache.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

// How long answers wait to be written to the cache together, and how many may wait.
constexpr int kCacheFlushDelayMs = 100;
constexpr size_t kMaxPendingCacheEntries = 256;

std::string FullCacheKey(const std::string& tenant, const std::string& group,
                         const std::string& key) {
  std::string full;
  full.reserve(tenant.size() + group.size() + key.size() + 2);
  full.append(tenant).push_back('\n');
  full.append(group).push_back('\n');
  full.append(key);
  return full;
}

// Agent config fields that change what a model answers (the others, such as busy or
// local_latency_ms, do not).
constexpr const char* kAnswerFields[] = {"temperature", "top_p", "top_k",
                                         "max_tokens",  "seed",  "local_rules"};

std::string ConfigString(const Json& config, const char* field) {
  if (!config.is_object()) return "";
  auto it = config.find(field);
  return it != config.end() && it->is_string() ? it->get<std::string>() : "";
}

// Whether the agent's calls may use the cache: config.cache is not false.
bool CacheOn(const Json& config) {
  if (!config.is_object()) return true;
  auto it = config.find("cache");
  return it == config.end() || !it->is_boolean() || it->get<bool>();
}

// Failures a fallback model may answer instead: the provider is unreachable, overloaded, rate
// limited past its retries, or answered garbage or a broken stream. Configuration errors (no or
// a wrong API key, a request the provider refuses) fail the run, so that they are seen.
bool FallbackMayAnswer(const Status& status) {
  return status.code() == Code::kUnavailable || status.code() == Code::kRateLimited ||
         status.code() == Code::kInternal;
}

Json CachedResponseJson(const model::ModelResponse& r) {
  Json calls = Json::array();
  for (const auto& c : r.tool_calls) {
    calls.push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
  }
  return {{"text", r.text}, {"tool_calls", std::move(calls)}};
}

// The answer a cache entry holds; nullopt when the entry is malformed.
std::optional<model::ModelResponse> ResponseOf(const store::CacheEntry& e) {
  const Json& j = e.response;
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string() ||
      !j.contains("tool_calls") || !j["tool_calls"].is_array()) {
    return std::nullopt;
  }
  model::ModelResponse r;
  r.text = j["text"].get<std::string>();
  for (const auto& c : j["tool_calls"]) {
    if (!c.is_object() || !c.contains("id") || !c["id"].is_string() || !c.contains("name") ||
        !c["name"].is_string() || !c.contains("arguments") || !c["arguments"].is_object()) {
      return std::nullopt;
    }
    r.tool_calls.push_back(
        {c["id"].get<std::string>(), c["name"].get<std::string>(), c["arguments"]});
  }
  r.usage = {e.input_tokens, e.output_tokens};
  return r;
}

// A budget in force for the run's agent, and what its period has spent so far.
struct BudgetSpend {
  store::Budget budget;
  int64_t spent_micros = 0;
};

// The first budget this call would cross, as ModelCall::budget_exceeded; null when none. A
// call estimated to cost nothing (an unpriced model) crosses none.
Json CrossedBudget(const std::vector<BudgetSpend>& spends, int64_t estimate_micros) {
  if (estimate_micros <= 0) return Json();
  for (const auto& s : spends) {
    if (s.spent_micros + estimate_micros > s.budget.limit_micros) {
      return {{"scope", s.budget.scope},
              {"period", s.budget.period},
              {"limit_usd", model::MicrosToUsd(s.budget.limit_micros)},
              {"spent_usd", model::MicrosToUsd(s.spent_micros)},
              {"estimate_usd", model::MicrosToUsd(estimate_micros)}};
    }
  }
  return Json();
}

// "5 USD", "0.0012 USD": a JSON number of USD, to the micro-dollar, without trailing zeros.
std::string UsdText(const Json& usd) {
  int64_t micros = usd.is_number() ? std::llround(usd.get<double>() * 1e6) : 0;
  std::string fraction = std::to_string(1000000 + micros % 1000000).substr(1);
  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
  return std::to_string(micros / 1000000) + (fraction.empty() ? "" : "." + fraction) + " USD";
}

// One message of a request, each field framed (FieldDigest::Add); the count of its tool calls
// says how many fields follow, so that no two messages frame alike. Returns the bytes of text.
size_t AddMessage(FieldDigest& d, std::string_view role, std::string_view content,
                  const std::vector<model::ToolCallRequest>& calls, std::string_view tool_call_id,
                  std::string_view tool_name) {
  size_t bytes = role.size() + content.size() + tool_call_id.size() + tool_name.size();
  d.Add(role);
  d.Add(content);
  d.Add(std::to_string(calls.size()));
  for (const auto& c : calls) {
    std::string arguments = DumpJson(c.arguments);
    d.Add(c.id);
    d.Add(c.name);
    d.Add(arguments);
    bytes += c.id.size() + c.name.size() + arguments.size();
  }
  d.Add(tool_call_id);
  d.Add(tool_name);
  return bytes;
}

const std::vector<model::ToolCallRequest> kNoCalls;

}  // namespace

bool InConversation(const store::Message& m) { return m.role == "user" || m.role == "assistant"; }

HistoryMark HashHistory(std::span<const store::Message> history, size_t begin, HistoryHash* kept) {
  HistoryHash fresh;
  HistoryHash& h = kept ? *kept : fresh;
  // The kept state covers history[0, count) when it began and ended on the same messages: a
  // session's messages are only ever added, sorted by id, so nothing came between them.
  const bool resumes = h.state && h.count > 0 && h.count <= history.size() &&
                       history[0].id == h.first_id && history[h.count - 1].id == h.last_id;
  if (!resumes) {
    h.state = std::make_unique<FieldDigest>();
    h.state->Raw("keel-history-v1\n");
    h.count = 0;
    h.sent = 0;
    h.bytes = 0;
  }
  for (size_t i = h.count; i < history.size(); ++i) {
    const store::Message& m = history[i];
    if (!InConversation(m)) continue;
    h.bytes += AddMessage(*h.state, m.role, m.content, kNoCalls, "", "");
    ++h.sent;
  }
  h.count = history.size();
  if (h.count > 0) {
    h.first_id = history.front().id;
    h.last_id = history.back().id;
  }
  HistoryMark mark;
  mark.begin = begin;
  mark.count = h.sent;
  mark.bytes = h.bytes;
  if (mark.count > 0) mark.digest = h.state->HexDigestSoFar();
  return mark;
}

RequestKey CacheKeyOf(const std::string& model, const model::ModelRequest& request,
                      const HistoryMark& history) {
  // Hashed as it is walked: no copy of the conversation is built. Counts name how many fields
  // follow, so that no two requests frame alike; the marked history is '#' (which begins no
  // framed field), its count and its digest.
  FieldDigest d;
  RequestKey out;
  auto add = [&](std::string_view v) {
    d.Add(v);
    out.bytes += v.size();
  };
  auto count = [&](size_t n) { d.Add(std::to_string(n)); };
  d.Raw("keel-cache-v3\n");
  add(model);
  count(request.messages.size());
  const auto& messages = request.messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (history.count > 0 && i == history.begin && i + history.count <= messages.size()) {
      d.Raw("#");
      count(history.count);
      d.Add(history.digest);
      out.bytes += history.bytes;
      i += history.count - 1;
      continue;
    }
    const auto& m = messages[i];
    out.bytes += AddMessage(d, m.role, m.content, m.tool_calls, m.tool_call_id, m.tool_name);
  }
  count(request.tools.size());
  for (const auto& t : request.tools) {
    add(t.name);
    add(t.description);
    add(DumpJson(t.parameters));
  }
  for (const char* field : kAnswerFields) {
    auto it = request.agent_config.is_object() ? request.agent_config.find(field)
                                               : request.agent_config.end();
    // An absent field and a present one differ; nlohmann dumps objects with sorted keys.
    add(it == request.agent_config.end() ? std::string_view("-") : std::string_view("+"));
    if (it != request.agent_config.end()) add(DumpJson(*it));
  }
  out.key = d.HexDigest();
  return out;
}

std::string ModelCall::BudgetMessage() const {
  const Json& b = budget_exceeded;
  std::string scope = b.value("scope", "");
  std::string whose = scope == "tenant" ? "the tenant's" : "agent " + scope + "'s";
  return "this model call would cross " + whose + " " + b.value("period", "") + " budget of " +
         UsdText(b["limit_usd"]) + ": " + UsdText(b["spent_usd"]) +
         " spent, this call is estimated at " + UsdText(b["estimate_usd"]);
}

void ModelCall::Describe(Json& out) const {
  if (!budget_exceeded.is_null()) {
    out["budget"] = budget_exceeded;
    return;
  }
  out["model"] = model;
  out["cached"] = cached;
  out["fallback"] = fell_back;
  if (fell_back) out["primary_error"] = primary_error;
  if (response.ok()) {
    out["cost_usd"] = model::MicrosToUsd(cost_micros);
    if (cached) out["cache_savings_usd"] = model::MicrosToUsd(saved_micros);
  }
}

Status ModelCall::Record(store::Tx& tx, const store::Run& run, const store::Step& step) const {
  if (!budget_exceeded.is_null()) {
    return tx.events().Append({run.tenant_id,
                               "budget.exceeded@v1",
                               run.agent_id,
                               run.session_id,
                               run.id,
                               {{"step_seq", step.seq}, {"budget", budget_exceeded}}});
  }
  if (fell_back) {
    KEEL_RETURN_IF_ERROR(tx.events().Append({run.tenant_id,
                                             "model.fallback@v1",
                                             run.agent_id,
                                             run.session_id,
                                             run.id,
                                             {{"step_seq", step.seq},
                                              {"to", model},
                                              {"error", primary_error},
                                              {"answered", response.ok()}}}));
  }
  if (!response.ok()) return Status::Ok();
  store::UsageRecord u;
  u.id = NewId();
  u.tenant_id = run.tenant_id;
  u.agent_id = run.agent_id;
  u.run_id = run.id;
  u.step_id = step.id;
  u.model = model;
  u.input_tokens = response->usage.input_tokens;
  u.output_tokens = response->usage.output_tokens;
  u.cost_micros = cost_micros;
  u.saved_micros = saved_micros;
  u.cached = cached;
  u.fallback = fell_back;
  u.created_at = step.finished_at.value_or(step.started_at);
  KEEL_RETURN_IF_ERROR(tx.usage().InsertUsage(u));
  tx.Carry("model_usage", store::RowImage(u));
  return Status::Ok();
}

void ModelCall::AddTo(store::UsageTotals& totals) const {
  // The conditions under which Record inserts its usage record, above.
  if (!budget_exceeded.is_null() || !response.ok()) return;
  totals.calls += 1;
  totals.cached_calls += cached ? 1 : 0;
  totals.input_tokens += response->usage.input_tokens;
  totals.output_tokens += response->usage.output_tokens;
  totals.cost_micros += cost_micros;
  totals.saved_micros += saved_micros;
}

Json UsageTotalsJson(const store::UsageTotals& t) {
  return {{"model_calls", t.calls},
          {"cached_calls", t.cached_calls},
          {"input_tokens", t.input_tokens},
          {"output_tokens", t.output_tokens},
          {"cost_usd", model::MicrosToUsd(t.cost_micros)},
          {"cache_savings_usd", model::MicrosToUsd(t.saved_micros)}};
}

Json RunUsageJson(const store::Run& run, const store::UsageTotals& totals) {
  Json j = UsageTotalsJson(totals);
  // The run's own counters: they include calls of attempts whose steps were not recorded.
  j["input_tokens"] = run.input_tokens;
  j["output_tokens"] = run.output_tokens;
  return j;
}

struct ModelCaller::Unwritten {
  struct Answer {
    store::CacheEntry entry;
    uint64_t batch = 0;  // the unit writing it; 0 while queued
  };
  std::mutex mu;
  std::unordered_map<std::string, Answer> answers;
};

ModelCaller::ModelCaller(asio::any_io_executor executor, store::Store& store,
                         model::ProviderRegistry& providers, Metrics& metrics,
                         std::map<std::string, config::ModelPrice> prices,
                         config::CacheConfig cache)
    : executor_(executor),
      store_(store),
      providers_(providers),
      metrics_(metrics),
      prices_(std::move(prices)),
      cache_(std::move(cache)),
      unwritten_(std::make_shared<Unwritten>()) {}

void ModelCaller::Start() {
  asio::co_spawn(executor_, CachePruneLoop(), ReportExceptions{"response cache pruning"});
}

void ModelCaller::Stop() { stopping_ = true; }

asio::awaitable<ModelCall> ModelCaller::Call(const store::Run& run, const store::Agent& agent,
                                             const model::ModelRequest& request,
                                             std::function<void(const std::string&)> on_delta,
                                             const HistoryMark* history) {
  ModelCall call;
  call.model = agent.model;
  const RequestKey request_key =
      CacheKeyOf(agent.model, request, history ? *history : HistoryMark{});
  const bool use_cache = cache_.enabled && CacheOn(agent.config);
  std::string group = ConfigString(agent.config, "cache_group");
  if (group.empty()) group = agent.id;
  const std::string& key = request_key.key;
  const Millis now = NowMillis();

  // 1. The cache, and 2. the budgets in force for this agent with what each has spent in its
  // current period, in one read. A cache read that fails is a miss; a budget read that fails
  // leaves the run to resume after its lease. The budgets' list goes out with the cache's read
  // (one round trip on PostgreSQL, where either failing fails both): when that read fails, it
  // is made again the way that keeps the failures apart, the cache last (on PostgreSQL a failed
  // statement ends the transaction).
  std::optional<store::CacheEntry> entry;
  Status cache_read = Status::Ok();
  std::vector<BudgetSpend> spends;
  auto read_with = [&](bool together) {
    return [&, together](store::Tx& tx) -> Status {
      entry.reset();
      cache_read = Status::Ok();
      spends.clear();
      std::vector<store::Budget> budgets;
      if (together) {
        KEEL_RETURN_IF_ERROR(tx.usage().ListBudgetsLater(run.tenant_id, budgets));
        KEEL_ASSIGN_OR_RETURN(
            entry, tx.usage().GetCacheEntry(run.tenant_id, group, key, now - cache_.ttl_ms));
      } else {
        KEEL_ASSIGN_OR_RETURN(budgets, tx.usage().ListBudgets(run.tenant_id));
      }
      for (auto& b : budgets) {
        if (b.scope != "tenant" && b.scope != run.agent_id) continue;
        std::string agent_id = b.scope == "tenant" ? std::string() : run.agent_id;
        Millis start = model::PeriodStart(b.period, now);
        KEEL_ASSIGN_OR_RETURN(auto totals,
                              tx.usage().PeriodUsage(run.tenant_id, agent_id, b.period, start));
        spends.push_back({std::move(b), totals.cost_micros});
      }
      if (!together && use_cache) {
        auto found = tx.usage().GetCacheEntry(run.tenant_id, group, key, now - cache_.ttl_ms);
        if (found.ok()) {
          entry = std::move(*found);
        } else {
          cache_read = found.status();
        }
      }
      return Status::Ok();
    };
  };
  Status read = co_await store::AsyncRead(store_, read_with(use_cache));
  if (!read.ok() && use_cache) read = co_await store::AsyncRead(store_, read_with(false));
  if (!read.ok() && cache_read.ok()) cache_read = read;  // the cache was not read either
  if (use_cache && cache_read.ok() && !entry) {
    std::lock_guard lock(unwritten_->mu);
    auto it = unwritten_->answers.find(FullCacheKey(run.tenant_id, group, key));
    if (it != unwritten_->answers.end()) entry = it->second.entry;
  }
  if (use_cache) {
    std::optional<model::ModelResponse> cached;
    if (!cache_read.ok()) {
      ++metrics_.model_cache_errors;
      LogError("response cache read failed (the call goes to the provider): " +
               cache_read.message());
    } else if (entry) {
      cached = ResponseOf(*entry);
      if (!cached) ++metrics_.model_cache_errors;
    }
    if (cached) {
      ++metrics_.model_cache_hits;
      if (!cached->text.empty() && on_delta) on_delta(cached->text);
      call.cached = true;
      call.saved_micros =
          model::CostMicros(model::PriceOf(prices_, agent.model), cached->usage);
      call.response = std::move(*cached);
      co_return call;
    }
    ++metrics_.model_cache_misses;
  }
  if (!read.ok()) {
    call.store_failed = true;
    call.response = read;
    co_return call;
  }
  const int64_t estimated_input = model::EstimateInputTokens(request_key.bytes);
  auto estimate = [&](const std::string& model) {
    return model::CostMicros(model::PriceOf(prices_, model), {estimated_input, 0});
  };
  call.budget_exceeded = CrossedBudget(spends, estimate(agent.model));
  if (!call.budget_exceeded.is_null()) {
    ++metrics_.budget_stops;
    call.response = PermissionDenied(call.BudgetMessage());
    co_return call;
  }

  // 3. The agent's model, then its fallback when the model is unavailable.
  std::string model_name;
  auto provider = providers_.Resolve(agent.model, &model_name);
  if (!provider.ok()) {
    call.response = provider.status();
    co_return call;
  }
  // The request names the provider's model already (the run resolved it); a copy only when not.
  model::ModelRequest renamed;
  auto named = [&](const std::string& name) -> const model::ModelRequest& {
    if (request.model == name) return request;
    renamed = request;
    renamed.model = name;
    return renamed;
  };
  call.response = co_await (*provider)->Complete(named(model_name), on_delta);
  const std::string fallback = ConfigString(agent.config, "fallback_model");
  if (!call.response.ok() && !fallback.empty() && FallbackMayAnswer(call.response.status())) {
    call.primary_error = call.response.status().message();
    call.fell_back = true;
    call.model = fallback;
    ++metrics_.model_fallbacks;
    call.budget_exceeded = CrossedBudget(spends, estimate(fallback));
    if (!call.budget_exceeded.is_null()) {
      ++metrics_.budget_stops;
      call.response = PermissionDenied(call.BudgetMessage());
      co_return call;
    }
    auto second = providers_.Resolve(fallback, &model_name);
    if (!second.ok()) {
      call.response = second.status();
      co_return call;
    }
    call.response = co_await (*second)->Complete(named(model_name), on_delta);
  }
  if (!call.response.ok()) co_return call;

  // 4. Metering, and the cache (only the agent's own model's answers: a fallback's answer is
  // not what the request asked for; nor an empty one, which a compaction fails on and should
  // ask again for).
  call.cost_micros =
      model::CostMicros(model::PriceOf(prices_, call.model), call.response->usage);
  const bool empty = call.response->text.empty() && call.response->tool_calls.empty();
  if (use_cache && !call.fell_back && !empty) {
    store::CacheEntry entry;
    entry.tenant_id = run.tenant_id;
    entry.cache_group = group;
    entry.key = key;
    entry.model = agent.model;
    entry.response = CachedResponseJson(*call.response);
    entry.input_tokens = call.response->usage.input_tokens;
    entry.output_tokens = call.response->usage.output_tokens;
    entry.created_at = NowMillis();
    if (DumpJson(entry.response).size() <= static_cast<size_t>(cache_.max_entry_bytes)) {
      QueueCacheEntry(std::move(entry));
    }
  }
  co_return call;
}

void ModelCaller::QueueCacheEntry(store::CacheEntry entry) {
  std::string full = FullCacheKey(entry.tenant_id, entry.cache_group, entry.key);
  {
    std::lock_guard lock(unwritten_->mu);
    auto& answer = unwritten_->answers[full];
    const bool queued = answer.batch == 0 && !answer.entry.key.empty();
    answer = {std::move(entry), 0};
    if (queued) return;  // its newer answer goes with the queued key
  }
  cache_pending_.push_back(std::move(full));
  if (cache_pending_.size() >= kMaxPendingCacheEntries) {
    WriteCacheEntries();
  } else if (!cache_flush_scheduled_) {
    cache_flush_scheduled_ = true;
    asio::co_spawn(executor_, FlushCacheEntries(), ReportExceptions{"response cache writes"});
  }
}

asio::awaitable<void> ModelCaller::FlushCacheEntries() {
  // A short wait gathers the answers of many calls into one unit (one commit), off the runs'
  // path; meanwhile this node answers from the queue (another node's call is a miss, which
  // only costs its model call).
  asio::steady_timer timer(executor_);
  timer.expires_after(std::chrono::milliseconds(kCacheFlushDelayMs));
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  cache_flush_scheduled_ = false;
  WriteCacheEntries();
}

void ModelCaller::WriteCacheEntries() {
  if (cache_pending_.empty()) return;
  std::vector<std::string> keys = std::move(cache_pending_);
  cache_pending_.clear();
  const uint64_t batch = ++cache_batches_;
  std::vector<store::CacheEntry> entries;
  entries.reserve(keys.size());
  {
    std::lock_guard lock(unwritten_->mu);
    for (const auto& full : keys) {
      auto& answer = unwritten_->answers[full];
      answer.batch = batch;
      entries.push_back(answer.entry);
    }
  }
  const auto count = static_cast<int64_t>(entries.size());
  Metrics* metrics = &metrics_;
  store_.Write(
      [entries = std::move(entries)](store::Tx& tx) -> Status {
        for (const auto& e : entries) KEEL_RETURN_IF_ERROR(tx.usage().PutCacheEntry(e));
        return Status::Ok();
      },
      [metrics, count, batch, keys = std::move(keys), unwritten = unwritten_](
          Status st, std::vector<store::Event>) {
        {
          // Written or not, the answers leave the queue: a failed write is a miss later.
          std::lock_guard lock(unwritten->mu);
          for (const auto& full : keys) {
            auto it = unwritten->answers.find(full);
            if (it != unwritten->answers.end() && it->second.batch == batch) {
              unwritten->answers.erase(it);
            }
          }
        }
        if (st.ok()) {
          metrics->model_cache_stores += count;
        } else {
          metrics->model_cache_errors += count;
          LogError("response cache write failed: " + st.message());
        }
      });
}

asio::awaitable<void> ModelCaller::CachePruneLoop() {
  asio::steady_timer timer(executor_);
  while (!stopping_) {
    timer.expires_after(std::chrono::seconds(60));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping_ || !store_.leader()) continue;
    Millis before = NowMillis() - cache_.ttl_ms;
    int64_t max_entries = cache_.max_entries;
    store::WriteFn prune = [before, max_entries](store::Tx& tx) -> Status {
      return tx.usage().PruneCache(before, max_entries).status();
    };
    auto pruned = co_await store::AsyncWrite(store_, std::move(prune));
    if (!pruned.ok()) LogError("response cache pruning failed: " + pruned.status().message());
  }
}

}  // namespace keel::runtime

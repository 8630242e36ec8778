// Usage and budgets: the tenant's and its agents' model usage in the current UTC day or month,
// and the budgets that stop runs before a model call would cross them. Owners and users may see
// usage; only owners see and change budgets. Money is shown in USD (JSON numbers, exact to the
// micro-dollar, which is how Keel keeps it).

#include <algorithm>

#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/time.h"
#include "keel/model/metering.h"
#include "keel/runtime/model_calls.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"
#include "keel/store/usage_store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

Result<std::string> PeriodOf(const std::string& period) {
  if (!model::IsPeriod(period)) {
    return InvalidArgument("period must be 'day' or 'month', got '" + period + "'");
  }
  return period;
}

Json BudgetJson(const store::Budget& b, int64_t spent_micros, Millis period_start) {
  return {{"scope", b.scope},
          {"period", b.period},
          {"limit_usd", model::MicrosToUsd(b.limit_micros)},
          {"spent_usd", model::MicrosToUsd(spent_micros)},
          {"period_start", FormatRfc3339(period_start)},
          {"created_at", FormatRfc3339(b.created_at)},
          {"updated_at", FormatRfc3339(b.updated_at)}};
}

// The budget with what its current period has spent.
Result<Json> BudgetWithSpend(store::Tx& tx, const store::Budget& b, Millis now) {
  Millis start = model::PeriodStart(b.period, now);
  std::string agent_id = b.scope == "tenant" ? std::string() : b.scope;
  KEEL_ASSIGN_OR_RETURN(auto totals,
                        tx.usage().PeriodUsage(b.tenant_id, agent_id, b.period, start));
  return BudgetJson(b, totals.cost_micros, start);
}

// scope "tenant", or the id of one of the tenant's agents.
Status CheckScope(store::Tx& tx, const std::string& tenant, const std::string& scope) {
  if (scope == "tenant") return Status::Ok();
  auto agent = tx.agents().GetAgent(tenant, scope);
  if (agent.ok()) return Status::Ok();
  if (agent.status().code() != Code::kNotFound) return agent.status();
  return InvalidArgument("scope must be \"tenant\" or the id of one of the tenant's agents, got '" +
                         scope + "'");
}

}  // namespace

void RegisterUsageRoutes(http::Router& router, ApiContext& ctx) {
  // ?period=day|month (default day) &agent_id=ID (only that agent in "agents").
  router.Add("GET", "/v1/usage", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see usage"); !st.ok()) co_return Response::Error(st);
    std::string raw = req.Query("period");
    auto period = PeriodOf(raw.empty() ? model::kPeriodDay : raw);
    if (!period.ok()) co_return Response::Error(period.status());
    std::string tenant = req.principal.tenant_id;
    std::string agent_id = req.Query("agent_id");
    Millis start = model::PeriodStart(*period, NowMillis());
    store::UsageTotals whole;
    std::vector<store::AgentUsage> agents;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(whole, tx.usage().PeriodUsage(tenant, "", *period, start));
      if (agent_id.empty()) {
        KEEL_ASSIGN_OR_RETURN(agents, tx.usage().PeriodUsageByAgent(tenant, *period, start));
        return Status::Ok();
      }
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent_id).status());
      KEEL_ASSIGN_OR_RETURN(auto totals, tx.usage().PeriodUsage(tenant, agent_id, *period, start));
      agents.push_back({agent_id, totals});
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    for (const auto& a : agents) {
      Json j = runtime::UsageTotalsJson(a.totals);
      j["agent_id"] = a.agent_id;
      items.push_back(std::move(j));
    }
    co_return Response::Json(200, {{"period", *period},
                                   {"period_start", FormatRfc3339(start)},
                                   {"tenant", runtime::UsageTotalsJson(whole)},
                                   {"agents", std::move(items)}});
  });

  // The last `count` days or months (the current one included), oldest first, each with the
  // tenant's totals and each agent's: every period is listed, zeros where nothing was used.
  router.Add("GET", "/v1/usage/history", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see usage"); !st.ok()) co_return Response::Error(st);
    std::string raw = req.Query("period");
    auto period = PeriodOf(raw.empty() ? model::kPeriodDay : raw);
    if (!period.ok()) co_return Response::Error(period.status());
    const bool daily = *period == model::kPeriodDay;
    const int most = daily ? 366 : 120;
    int count = daily ? 30 : 12;
    if (std::string n = req.Query("count"); !n.empty()) {
      if (n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(n) < 1 || std::stoi(n) > most) {
        co_return Response::Error(InvalidArgument("count must be an integer between 1 and " +
                                                  std::to_string(most) + " for " + *period));
      }
      count = std::stoi(n);
    }
    std::vector<Millis> starts = {model::PeriodStart(*period, NowMillis())};
    while (static_cast<int>(starts.size()) < count) {
      starts.push_back(model::PeriodStart(*period, starts.back() - 1));
    }
    std::reverse(starts.begin(), starts.end());
    const std::string agent_id = req.Query("agent_id");
    std::vector<store::PeriodTotals> rows;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      if (!agent_id.empty()) {
        KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(req.principal.tenant_id, agent_id).status());
      }
      KEEL_ASSIGN_OR_RETURN(
          rows, tx.usage().UsageHistory(req.principal.tenant_id, *period, starts.front()));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    size_t r = 0;
    for (Millis start : starts) {
      Json item = Json::object();
      item["period_start"] = FormatRfc3339(start);
      item["tenant"] = runtime::UsageTotalsJson({});
      Json agents = Json::array();
      for (; r < rows.size() && rows[r].period_start <= start; ++r) {
        if (rows[r].period_start != start) continue;
        if (rows[r].agent_id.empty()) {
          item["tenant"] = runtime::UsageTotalsJson(rows[r].totals);
        } else if (agent_id.empty() || rows[r].agent_id == agent_id) {
          Json j = runtime::UsageTotalsJson(rows[r].totals);
          j["agent_id"] = rows[r].agent_id;
          agents.push_back(std::move(j));
        }
      }
      item["agents"] = std::move(agents);
      items.push_back(std::move(item));
    }
    Json out = Json::object();
    out["period"] = *period;
    out["items"] = std::move(items);
    co_return Response::Json(200, out);
  });

  router.Add("GET", "/v1/budgets", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    Millis now = NowMillis();
    Json items = Json::array();
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto budgets, tx.usage().ListBudgets(tenant));
      for (const auto& b : budgets) {
        KEEL_ASSIGN_OR_RETURN(auto j, BudgetWithSpend(tx, b, now));
        items.push_back(std::move(j));
      }
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  // {"scope": "tenant" | AGENT_ID, "period": "day" | "month", "limit_usd": NUMBER}
  router.Add("PUT", "/v1/budgets", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"scope", "period", "limit_usd"}); !st.ok()) {
      co_return Response::Error(st);
    }
    auto scope = ReqString(*body, "scope");
    if (!scope.ok()) co_return Response::Error(scope.status());
    auto period_text = ReqString(*body, "period");
    if (!period_text.ok()) co_return Response::Error(period_text.status());
    auto period = PeriodOf(*period_text);
    if (!period.ok()) co_return Response::Error(period.status());
    int64_t limit = 0;
    const Json& usd = body->value("limit_usd", Json());
    if (!usd.is_number() || !model::UsdToMicros(usd.get<double>(), &limit)) {
      co_return Response::Error(
          InvalidArgument("limit_usd must be a number of US dollars from 0 to 1000000000"));
    }
    store::Budget budget;
    budget.tenant_id = req.principal.tenant_id;
    budget.scope = *scope;
    budget.period = *period;
    budget.limit_micros = limit;
    budget.created_at = budget.updated_at = NowMillis();
    Json out;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(CheckScope(tx, budget.tenant_id, budget.scope));
      KEEL_RETURN_IF_ERROR(tx.usage().PutBudget(budget));
      tx.Carry("budgets", store::RowImage(budget));
      KEEL_ASSIGN_OR_RETURN(auto all, tx.usage().ListBudgets(budget.tenant_id));
      out = Json();  // afresh: a unit may run again (docs/decisions/0014)
      for (const auto& b : all) {
        if (b.scope != budget.scope || b.period != budget.period) continue;
        KEEL_ASSIGN_OR_RETURN(out, BudgetWithSpend(tx, b, budget.updated_at));
      }
      std::string agent_id = budget.scope == "tenant" ? std::string() : budget.scope;
      return tx.events().Append({budget.tenant_id,
                                 "budget.set@v1",
                                 agent_id,
                                 "",
                                 "",
                                 {{"scope", budget.scope},
                                  {"period", budget.period},
                                  {"limit_usd", model::MicrosToUsd(budget.limit_micros)}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, out);
  });

  // ?scope=tenant|AGENT_ID&period=day|month
  router.Add("DELETE", "/v1/budgets", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string scope = req.Query("scope");
    if (scope.empty()) co_return Response::Error(InvalidArgument("?scope= is required"));
    auto period = PeriodOf(req.Query("period"));
    if (!period.ok()) co_return Response::Error(period.status());
    std::string tenant = req.principal.tenant_id;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.usage().DeleteBudget(tenant, scope, *period));
      tx.Carry("budgets",
               store::DeletedImage({{"tenant_id", tenant}, {"scope", scope}, {"period", *period}}));
      std::string agent_id = scope == "tenant" ? std::string() : scope;
      return tx.events().Append(
          {tenant, "budget.deleted@v1", agent_id, "", "", {{"scope", scope}, {"period", *period}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });
}

}  // namespace keel::api

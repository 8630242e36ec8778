// Runs: show, list, steps, cancel.

#include "keel/access/access.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/runtime/model_calls.h"
#include "keel/runtime/runtime.h"
#include "keel/common/time.h"
#include "keel/store/async.h"
#include "keel/store/schedule_store.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {
bool IsRunStatus(const std::string& s) {
  for (const char* known :
       {"queued", "running", "waiting_for_approval", "done", "failed", "cancelled"}) {
    if (s == known) return true;
  }
  return false;
}
}  // namespace

void RegisterRunRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("GET", "/v1/runs/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    store::Run run;
    store::UsageTotals usage;
    std::optional<store::ScheduleFire> fire;  // the schedule's fire that posted its message
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(run, access::UsableRun(tx, req.principal, req.Param("id")));
      KEEL_ASSIGN_OR_RETURN(usage, tx.usage().RunUsage(run.tenant_id, run.id));
      KEEL_ASSIGN_OR_RETURN(fire, tx.schedules().FireOfRun(run.tenant_id, run.id));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json out = RunJson(run);
    out["usage"] = runtime::RunUsageJson(run, usage);  // with cost and cache savings
    // As in run.queued@v1: what started the run, when a schedule did.
    out["trigger"] = fire ? Json{{"schedule_id", fire->schedule_id},
                                 {"slot", FormatRfc3339(fire->slot)}}
                          : Json();
    co_return Response::Json(200, out);
  });

  auto list = [&ctx](Request& req) -> asio::awaitable<Response> {
    auto page = OrderedPageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    store::RunFilter filter;
    filter.session_id = req.Param("id");
    if (filter.session_id.empty()) filter.session_id = req.Query("session_id");
    filter.agent_id = req.Query("agent_id");
    filter.status = req.Query("status");
    if (!filter.status.empty() && !IsRunStatus(filter.status)) {
      co_return Response::Error(InvalidArgument(
          "status must be one of queued, running, waiting_for_approval, done, failed, cancelled; "
          "got '" +
          filter.status.substr(0, 64) + "'"));
    }
    // A guest sees the runs of the sessions it opened, and its pages and cursors are made of
    // those alone (a cursor is a run's id: never one of a run it may not see).
    store::Paged<store::Run> runs;
    auto opened_by = access::ListedOpenedBy(req.principal);
    if (!opened_by) co_return Response::Json(200, ListJson(runs, RunJson));
    filter.opened_by = std::move(*opened_by);
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      if (!filter.session_id.empty()) {
        KEEL_RETURN_IF_ERROR(access::UsableSession(tx, req.principal, filter.session_id).status());
      }
      KEEL_ASSIGN_OR_RETURN(runs, tx.runs().ListRuns(req.principal.tenant_id, filter, *page));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ListJson(runs, RunJson));
  };
  router.Add("GET", "/v1/sessions/{id}/runs", list);
  router.Add("GET", "/v1/runs", list);

  router.Add("GET", "/v1/runs/{id}/steps", [&ctx](Request& req) -> asio::awaitable<Response> {
    std::vector<store::Step> steps;
    std::vector<store::ToolCall> calls;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      const std::string& tenant = req.principal.tenant_id;
      KEEL_RETURN_IF_ERROR(access::UsableRun(tx, req.principal, req.Param("id")).status());
      KEEL_ASSIGN_OR_RETURN(steps, tx.runs().ListSteps(tenant, req.Param("id")));
      KEEL_ASSIGN_OR_RETURN(calls, tx.runs().ListToolCalls(tenant, req.Param("id")));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    for (const auto& s : steps) {
      const store::ToolCall* call = nullptr;
      for (const auto& c : calls) {
        if (c.step_id == s.id) call = &c;
      }
      items.push_back(StepJson(access::VisibleStep(req.principal, s), call));
    }
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  router.Add("POST", "/v1/runs/{id}/cancel", [&ctx](Request& req) -> asio::awaitable<Response> {
    // No body is taken; one with fields is refused rather than ignored.
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {}); !st.ok()) co_return Response::Error(st);
    Status usable = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      return access::UsableRun(tx, req.principal, req.Param("id")).status();
    });
    if (!usable.ok()) co_return Response::Error(usable);
    auto run = co_await ctx.runtime.Cancel(req.principal.tenant_id, req.Param("id"));
    if (!run.ok()) co_return Response::Error(run.status());
    co_return Response::Json(200, RunJson(*run));
  });
}

}  // namespace keel::api

// Schedules: create (POST /v1/schedules, or under an agent), list, show with recent fires,
// delete, pause and resume (also PATCH {"enabled"}). Owners and users; guests are refused.
// A schedule acts on the authority of the token that created it; when that token is revoked
// it is suspended (access::WithdrawAuthority) until an owner hands it to another token
// (PATCH {"token_id"}).
// A schedule is checked whole before anything is written (cron expression, time zone, agent,
// session); the firing itself is the runtime's (runtime/schedules.cc).

#include "keel/access/access.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/runtime/runtime.h"
#include "keel/schedule/cron.h"
#include "keel/schedule/schedule.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/schedule_store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

constexpr int kRecentFires = 20;

// The request in a body; `agent_id` is the path's when it is not empty (then the body has none).
Result<schedule::ScheduleRequest> RequestOf(const Json& body, const std::string& agent_id) {
  // Under /v1/agents/{id}/schedules the agent is the path's.
  KEEL_RETURN_IF_ERROR(
      agent_id.empty()
          ? CheckFields(body, {"agent_id", "name", "cron", "at", "timezone", "prompt", "session_id",
                               "missed"})
          : CheckFields(body, {"name", "cron", "at", "timezone", "prompt", "session_id", "missed"}));
  schedule::ScheduleRequest r;
  if (agent_id.empty()) {
    KEEL_ASSIGN_OR_RETURN(r.agent_id, ReqString(body, "agent_id"));
  } else {
    r.agent_id = agent_id;
  }
  KEEL_ASSIGN_OR_RETURN(r.name, OptString(body, "name"));
  KEEL_ASSIGN_OR_RETURN(r.cron, OptString(body, "cron"));
  KEEL_ASSIGN_OR_RETURN(std::string at, OptString(body, "at"));
  if (!at.empty()) {
    r.at = ParseRfc3339(at);
    if (!r.at) {
      return InvalidArgument(
          "field 'at' must be an RFC 3339 time such as "
          "2026-11-30T12:00:00.000Z, not \"" +
          at.substr(0, 40) + "\"");
    }
  }
  KEEL_ASSIGN_OR_RETURN(r.timezone, OptString(body, "timezone", "UTC"));
  KEEL_ASSIGN_OR_RETURN(r.prompt, OptString(body, "prompt"));
  KEEL_ASSIGN_OR_RETURN(r.session_id, OptString(body, "session_id"));
  KEEL_ASSIGN_OR_RETURN(r.missed, OptString(body, "missed", "skip"));
  return r;
}

asio::awaitable<Response> Create(ApiContext& ctx, Request& req, std::string agent_id) {
  if (auto st = RequireMember(req, "create schedules"); !st.ok()) co_return Response::Error(st);
  auto body = ParseJsonObject(req.body);
  if (!body.ok()) co_return Response::Error(body.status());
  auto request = RequestOf(*body, agent_id);
  if (!request.ok()) co_return Response::Error(request.status());
  auto made = schedule::MakeSchedule(*request, req.principal.tenant_id, req.principal.token_id,
                                     req.principal.role, NowMillis());
  if (!made.ok()) co_return Response::Error(made.status());
  store::Schedule s = *made;
  store::WriteFn insert = [&s](store::Tx& tx) { return schedule::InsertSchedule(tx, s); };
  auto written = co_await store::AsyncWrite(ctx.store, std::move(insert));
  if (!written.ok()) co_return Response::Error(written.status());
  ctx.runtime.WakeSchedules();
  co_return Response::Json(201, schedule::ScheduleJson(s));
}

asio::awaitable<Response> List(ApiContext& ctx, Request& req, std::string agent_id) {
  if (auto st = RequireMember(req, "see schedules"); !st.ok()) co_return Response::Error(st);
  auto page = PageOf(req);
  if (!page.ok()) co_return Response::Error(page.status());
  std::string tenant = req.principal.tenant_id;
  store::Paged<store::Schedule> found;
  Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
    // An agent of another tenant (or none) is 404, not an empty list.
    if (!agent_id.empty()) KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent_id).status());
    KEEL_ASSIGN_OR_RETURN(found, tx.schedules().ListSchedules(tenant, agent_id, *page));
    return Status::Ok();
  });
  if (!st.ok()) co_return Response::Error(st);
  co_return Response::Json(200, ListJson(found, schedule::ScheduleJson));
}

// Pauses (enabled false) or resumes a schedule. Resuming recomputes next_fire_at from now by
// the schedule's missed policy. Either is a no-op when the schedule is in that state already.
asio::awaitable<Response> SetEnabled(ApiContext& ctx, Request& req, bool enabled) {
  if (auto st = RequireMember(req, "change schedules"); !st.ok()) co_return Response::Error(st);
  std::string tenant = req.principal.tenant_id;
  std::string id = req.Param("id");
  store::Schedule s;
  store::WriteFn change = [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(s, tx.schedules().GetSchedule(tenant, id));
    if (s.status == "done") return Conflict("schedule " + id + " is done: it has no slot left");
    if (s.status == "suspended") {
      return Conflict("schedule " + id + " is suspended: " + access::SuspendedReason(s.created_by));
    }
    if ((s.status == "active") == enabled) return Status::Ok();
    Millis now = NowMillis();
    if (enabled) {
      KEEL_ASSIGN_OR_RETURN(s.next_fire_at, schedule::ResumeAt(s, now));
      s.status = s.next_fire_at ? "active" : "done";
    } else {
      s.status = "paused";
    }
    s.updated_at = now;
    KEEL_RETURN_IF_ERROR(tx.schedules().UpdateSchedule(s));
    tx.Carry("schedules", store::RowImage(s));
    Json payload = {{"schedule_id", id}, {"status", s.status}};
    if (enabled) {
      payload["next_fire_at"] =
          s.next_fire_at ? Json(FormatRfc3339(*s.next_fire_at)) : Json(nullptr);
    }
    return tx.events().Append({tenant, enabled ? "schedule.resumed@v1" : "schedule.paused@v1",
                               s.agent_id, s.session_id, "", payload});
  };
  auto written = co_await store::AsyncWrite(ctx.store, std::move(change));
  if (!written.ok()) co_return Response::Error(written.status());
  if (enabled) ctx.runtime.WakeSchedules();
  co_return Response::Json(200, schedule::ScheduleJson(s));
}

// Hands the schedule to another active token of the tenant: its firings act for that token
// (its id and role) from now on. A suspended schedule is resumed as `resume` resumes one (slots
// that came due meanwhile follow its `missed` policy). Owners only.
asio::awaitable<Response> Reassign(ApiContext& ctx, Request& req, std::string token_id) {
  if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
  std::string tenant = req.principal.tenant_id;
  std::string id = req.Param("id");
  store::Schedule s;
  store::WriteFn change = [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(store::Token token, access::ActiveToken(tx, tenant, token_id));
    if (token.role == "guest") {
      return InvalidArgument("field 'token_id': a guest token may not hold schedules");
    }
    KEEL_ASSIGN_OR_RETURN(s, tx.schedules().GetSchedule(tenant, id));
    Millis now = NowMillis();
    if (s.status == "suspended") {
      KEEL_ASSIGN_OR_RETURN(s.next_fire_at, schedule::ResumeAt(s, now));
      s.status = s.next_fire_at ? "active" : "done";
    }
    s.created_by = token.id;
    s.caller_role = token.role;
    s.user_id.clear();  // it acts for the new token's holder now
    s.channel_id.clear();
    s.updated_at = now;
    KEEL_RETURN_IF_ERROR(tx.schedules().UpdateSchedule(s));
    tx.Carry("schedules", store::RowImage(s));
    return tx.events().Append({tenant,
                               "schedule.reassigned@v1",
                               s.agent_id,
                               s.session_id,
                               "",
                               {{"schedule_id", id},
                                {"token_id", token.id},
                                {"status", s.status},
                                {"next_fire_at", s.next_fire_at
                                                     ? Json(FormatRfc3339(*s.next_fire_at))
                                                     : Json(nullptr)}}});
  };
  auto written = co_await store::AsyncWrite(ctx.store, std::move(change));
  if (!written.ok()) co_return Response::Error(written.status());
  ctx.runtime.WakeSchedules();
  co_return Response::Json(200, schedule::ScheduleJson(s));
}

}  // namespace

void RegisterScheduleRoutes(http::Router& router, ApiContext& ctx) {
  // The next slots of a cron expression in a zone, by the code that fires schedules (a form
  // shows them while the expression is typed, so an expression or zone it cannot take is an
  // answer, "error", not a failed request).
  router.Add("GET", "/v1/cron/preview", [](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "preview schedules"); !st.ok()) co_return Response::Error(st);
    const std::string text = req.Query("cron");
    const std::string zone_name = req.Query("timezone", "UTC");
    if (text.size() > 256 || zone_name.size() > 256) {
      co_return Response::Error(InvalidArgument("cron and timezone take at most 256 bytes"));
    }
    int count = 5;
    if (std::string n = req.Query("count"); !n.empty()) {
      if (n.size() > 2 || n.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(n) < 1 || std::stoi(n) > 50) {
        co_return Response::Error(InvalidArgument("count must be an integer between 1 and 50"));
      }
      count = std::stoi(n);
    }
    Json out = Json::object();
    out["cron"] = text;
    out["timezone"] = zone_name;
    out["slots"] = Json::array();
    out["error"] = nullptr;
    auto cron = text.empty() ? Result<schedule::CronExpr>(InvalidArgument("cron is empty"))
                             : schedule::CronExpr::Parse(text);
    auto zone = schedule::TimeZone::Find(zone_name);
    if (!cron.ok() || !zone.ok()) {
      out["error"] = (!cron.ok() ? cron.status() : zone.status()).message();
      co_return Response::Json(200, out);
    }
    Millis at = NowMillis();
    for (int i = 0; i < count; ++i) {
      auto next = schedule::NextSlot(*cron, *zone, at);
      if (!next) break;
      out["slots"].push_back(FormatRfc3339(*next));
      at = *next;
    }
    co_return Response::Json(200, out);
  });

  router.Add("POST", "/v1/schedules", [&ctx](Request& req) -> asio::awaitable<Response> {
    std::string from_body;
    co_return co_await Create(ctx, req, from_body);
  });
  router.Add("POST", "/v1/agents/{id}/schedules",
             [&ctx](Request& req) -> asio::awaitable<Response> {
               std::string agent_id = req.Param("id");
               co_return co_await Create(ctx, req, agent_id);
             });

  router.Add("GET", "/v1/schedules", [&ctx](Request& req) -> asio::awaitable<Response> {
    std::string agent_id = req.Query("agent_id");
    co_return co_await List(ctx, req, agent_id);
  });
  router.Add("GET", "/v1/agents/{id}/schedules", [&ctx](Request& req) -> asio::awaitable<Response> {
    std::string agent_id = req.Param("id");
    co_return co_await List(ctx, req, agent_id);
  });

  router.Add("GET", "/v1/schedules/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see schedules"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    Json out;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto s, tx.schedules().GetSchedule(tenant, id));
      KEEL_ASSIGN_OR_RETURN(auto fires, tx.schedules().RecentFires(tenant, id, kRecentFires));
      out = schedule::ScheduleJson(s);
      Json recent = Json::array();
      for (const auto& f : fires) recent.push_back(schedule::FireJson(f));
      out["recent_fires"] = std::move(recent);
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, out);
  });

  router.Add("DELETE", "/v1/schedules/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "delete schedules"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    store::WriteFn remove = [&](store::Tx& tx) { return schedule::RemoveSchedule(tx, tenant, id); };
    auto written = co_await store::AsyncWrite(ctx.store, std::move(remove));
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });

  for (bool enable : {false, true}) {
    router.Add("POST", enable ? "/v1/schedules/{id}/resume" : "/v1/schedules/{id}/pause",
               [&ctx, enable](Request& req) -> asio::awaitable<Response> {
      // No body is taken; one with fields is refused rather than ignored.
      auto body = ParseJsonObject(req.body);
      if (!body.ok()) co_return Response::Error(body.status());
      if (auto st = CheckFields(*body, {}); !st.ok()) co_return Response::Error(st);
      co_return co_await SetEnabled(ctx, req, enable);
    });
  }
  // {"enabled": false} pauses, {"enabled": true} resumes (the core contract's form);
  // {"token_id": ID} reassigns.
  router.Add("PATCH", "/v1/schedules/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"enabled", "token_id"}); !st.ok()) {
      co_return Response::Error(st);
    }
    if (body->size() > 1) {
      co_return Response::Error(
          InvalidArgument("PATCH takes one of 'enabled' and 'token_id', not both"));
    }
    if (body->contains("token_id")) {
      if (!(*body)["token_id"].is_string() || (*body)["token_id"].get<std::string>().empty()) {
        co_return Response::Error(InvalidArgument("field 'token_id' must be a token's id"));
      }
      co_return co_await Reassign(ctx, req, (*body)["token_id"].get<std::string>());
    }
    if (!body->contains("enabled") || !(*body)["enabled"].is_boolean()) {
      co_return Response::Error(InvalidArgument("field 'enabled' must be true or false"));
    }
    const bool enabled = (*body)["enabled"].get<bool>();
    co_return co_await SetEnabled(ctx, req, enabled);
  });
}

}  // namespace keel::api

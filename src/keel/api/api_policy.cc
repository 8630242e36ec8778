// The gateway's guardrails: the tenant policy (frame), each agent's narrowing, and emergency
// stops. Owners change them; owners and users may read them.

#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/time.h"
#include "keel/policy/policy.h"
#include "keel/policy/stored.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

Json StopJson(const store::EmergencyStop& s) {
  return {{"agent_id", s.agent_id.empty() ? Json(nullptr) : Json(s.agent_id)},
          {"reason", s.reason},
          {"created_by", s.created_by},
          {"created_at", FormatRfc3339(s.created_at)}};
}

// GET, PUT and DELETE of one policy document; `scope` "" is the tenant frame, otherwise the
// agent named by the route's {id}.
void AddPolicyRoutes(http::Router& router, ApiContext& ctx, const std::string& path,
                     bool agent_scope) {
  router.Add("GET", path, [&ctx, agent_scope](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "read policies"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string scope = agent_scope ? req.Param("id") : "";
    std::optional<store::PolicyDoc> doc;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      if (agent_scope) KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, scope).status());
      KEEL_ASSIGN_OR_RETURN(doc, tx.policies().GetPolicy(tenant, scope));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    if (!doc) {
      co_return Response::Error(NotFound(
          agent_scope ? "no agent policy is set: the agent has the tenant policy's rights"
                      : "no tenant policy is set: every tool is allowed"));
    }
    co_return Response::Json(200, doc->body);
  });

  router.Add("PUT", path, [&ctx, agent_scope](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    auto parsed = policy::ParsePolicy(*body);
    if (!parsed.ok()) co_return Response::Error(parsed.status());
    std::string tenant = req.principal.tenant_id;
    std::string scope = agent_scope ? req.Param("id") : "";
    store::PolicyDoc doc{tenant, scope, policy::PolicyJson(*parsed), NowMillis()};
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      if (agent_scope) {
        KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, scope).status());
        // Checked against the frame in force, inside the unit that writes the narrowing.
        KEEL_ASSIGN_OR_RETURN(auto frame, policy::LoadPolicy(tx, tenant, ""));
        KEEL_RETURN_IF_ERROR(policy::CheckNarrowing(frame ? &*frame : nullptr, *parsed));
      }
      KEEL_RETURN_IF_ERROR(tx.policies().PutPolicy(doc));
      tx.Carry("policies", store::RowImage(doc));
      return tx.events().Append({tenant, "policy.updated@v1", scope, "", "",
                                 {{"scope", agent_scope ? "agent" : "tenant"},
                                  {"rules", doc.body["rules"].size()}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, doc.body);
  });

  router.Add("DELETE", path, [&ctx, agent_scope](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string scope = agent_scope ? req.Param("id") : "";
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.policies().DeletePolicy(tenant, scope));
      tx.Carry("policies", store::DeletedImage({{"tenant_id", tenant}, {"scope", scope}}));
      return tx.events().Append({tenant, "policy.deleted@v1", scope, "", "",
                                 {{"scope", agent_scope ? "agent" : "tenant"}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });
}

// PUT and DELETE of one emergency stop; `agent_scope` picks the route's agent, else the tenant.
void AddStopRoutes(http::Router& router, ApiContext& ctx, const std::string& path,
                   bool agent_scope) {
  router.Add("PUT", path, [&ctx, agent_scope](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body.empty() ? std::string("{}") : req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"reason"}); !st.ok()) co_return Response::Error(st);
    auto reason = OptString(*body, "reason");
    if (!reason.ok()) co_return Response::Error(reason.status());
    if (reason->size() > 1000) {
      co_return Response::Error(InvalidArgument("reason is longer than 1000 characters"));
    }
    store::EmergencyStop stop{req.principal.tenant_id, agent_scope ? req.Param("id") : "",
                              *reason, req.principal.token_id, NowMillis()};
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      if (agent_scope) {
        KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(stop.tenant_id, stop.agent_id).status());
      }
      KEEL_RETURN_IF_ERROR(tx.policies().PutStop(stop));
      tx.Carry("emergency_stops", store::RowImage(stop));
      return tx.events().Append({stop.tenant_id, "emergency_stop.engaged@v1", stop.agent_id, "",
                                 "", {{"reason", stop.reason}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, StopJson(stop));
  });

  router.Add("DELETE", path, [&ctx, agent_scope](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string agent = agent_scope ? req.Param("id") : "";
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.policies().DeleteStop(tenant, agent));
      tx.Carry("emergency_stops",
               store::DeletedImage({{"tenant_id", tenant}, {"agent_id", agent}}));
      return tx.events().Append({tenant, "emergency_stop.lifted@v1", agent, "", "", {}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    ctx.runtime.Wake();
    co_return Response::NoContent();
  });
}

}  // namespace

void RegisterPolicyRoutes(http::Router& router, ApiContext& ctx) {
  AddPolicyRoutes(router, ctx, "/v1/policy", false);
  AddPolicyRoutes(router, ctx, "/v1/agents/{id}/policy", true);
  AddStopRoutes(router, ctx, "/v1/emergency-stop", false);
  AddStopRoutes(router, ctx, "/v1/agents/{id}/emergency-stop", true);

  router.Add("GET", "/v1/emergency-stops", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "read policies"); !st.ok()) co_return Response::Error(st);
    std::vector<store::EmergencyStop> stops;
    std::string tenant = req.principal.tenant_id;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(stops, tx.policies().ListStops(tenant));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    for (const auto& s : stops) items.push_back(StopJson(s));
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });
}

}  // namespace keel::api

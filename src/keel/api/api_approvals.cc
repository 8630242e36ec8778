// Approvals: list and show them; approve or reject through approvals::Decide, the one decision
// function; standing approvals, listed and revoked. Owners decide; users may look.

#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/approvals/approvals.h"
#include "keel/common/time.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

constexpr int64_t kMaxStandingSeconds = 365LL * 24 * 3600;

Json StandingJson(const store::StandingApproval& s) {
  return {{"id", s.id},
          {"agent_id", s.agent_id},
          {"tool", s.tool},
          {"match", s.arguments_match},
          {"created_by", s.created_by},
          {"approval_id", s.approval_id},
          {"created_at", FormatRfc3339(s.created_at)},
          {"expires_at", FormatRfc3339(s.expires_at)},
          {"revoked_at", s.revoked_at ? Json(FormatRfc3339(*s.revoked_at)) : Json(nullptr)}};
}

// The body of approve/reject: {"reason"} and, to approve, {"arguments"} and {"standing"}.
Result<approvals::DecisionRequest> ParseDecision(const Request& req, bool approve, Millis now) {
  auto body = ParseJsonObject(req.body.empty() ? std::string("{}") : req.body);
  if (!body.ok()) return body.status();
  approvals::DecisionRequest d;
  d.tenant_id = req.principal.tenant_id;
  d.approval_id = req.Param("id");
  d.verdict = approve ? approvals::Verdict::kApprove : approvals::Verdict::kReject;
  d.decided_by = req.principal.token_id;
  KEEL_RETURN_IF_ERROR(approve ? CheckFields(*body, {"reason", "arguments", "standing"})
                               : CheckFields(*body, {"reason"}));
  KEEL_ASSIGN_OR_RETURN(d.reason, OptString(*body, "reason"));
  if (d.reason.size() > 1000) return InvalidArgument("reason is longer than 1000 characters");
  if (body->contains("arguments")) {
    if (!(*body)["arguments"].is_object()) {
      return InvalidArgument("field 'arguments' must be an object (the amended arguments)");
    }
    d.amended_arguments = (*body)["arguments"];
  }
  if (body->contains("standing")) {
    const Json& s = (*body)["standing"];
    if (!s.is_object()) return InvalidArgument("field 'standing' must be an object");
    approvals::StandingGrant g;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() != "expires_in" && it.key() != "expires_at" && it.key() != "match") {
        return InvalidArgument("standing: unknown field '" + it.key() + "'");
      }
    }
    if (s.contains("expires_in") == s.contains("expires_at")) {
      return InvalidArgument("standing needs exactly one of 'expires_in' (seconds) and "
                             "'expires_at' (RFC 3339)");
    }
    if (s.contains("expires_in")) {
      const Json& n = s["expires_in"];
      if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > kMaxStandingSeconds) {
        return InvalidArgument("standing.expires_in must be whole seconds from 1 to " +
                               std::to_string(kMaxStandingSeconds));
      }
      g.expires_at = now + n.get<int64_t>() * 1000;
    } else {
      auto at = s["expires_at"].is_string() ? ParseRfc3339(s["expires_at"].get<std::string>())
                                            : std::nullopt;
      if (!at) return InvalidArgument("standing.expires_at must be an RFC 3339 time");
      if (*at - now > kMaxStandingSeconds * 1000) {
        return InvalidArgument("a standing approval lasts at most a year");
      }
      g.expires_at = *at;
    }
    if (s.contains("match")) {
      if (!s["match"].is_object()) {
        return InvalidArgument("standing.match must be an object of arguments to match");
      }
      g.arguments_match = s["match"];
    }
    d.standing = g;
  }
  return d;
}

}  // namespace

void RegisterApprovalRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("GET", "/v1/approvals", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see approvals"); !st.ok()) co_return Response::Error(st);
    auto page = OrderedPageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    std::string status = req.Query("status");
    if (!status.empty() && status != "pending" && status != "approved" && status != "rejected" &&
        status != "expired" && status != "cancelled") {
      co_return Response::Error(InvalidArgument(
          "status must be pending, approved, rejected, expired or cancelled"));
    }
    store::Paged<store::Approval> found;
    std::string tenant = req.principal.tenant_id;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(found, tx.approvals().ListApprovals(tenant, status, *page));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ListJson(found, approvals::ApprovalJson));
  });

  router.Add("GET", "/v1/approvals/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see approvals"); !st.ok()) co_return Response::Error(st);
    store::Approval found;
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(found, tx.approvals().GetApproval(tenant, id));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, approvals::ApprovalJson(found));
  });

  for (bool approve : {true, false}) {
    std::string path = std::string("/v1/approvals/{id}/") + (approve ? "approve" : "reject");
    router.Add("POST", path, [&ctx, approve](Request& req) -> asio::awaitable<Response> {
      if (req.principal.role != "owner") {
        co_return Response::Error(PermissionDenied("only owners may decide approvals"));
      }
      Millis now = NowMillis();
      auto decision = ParseDecision(req, approve, now);
      if (!decision.ok()) co_return Response::Error(decision.status());
      store::Approval decided;
      auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(decided, approvals::Decide(tx, *decision, now));
        return Status::Ok();
      });
      if (!written.ok()) co_return Response::Error(written.status());
      ctx.runtime.Wake();
      co_return Response::Json(200, approvals::ApprovalJson(decided));
    });
  }

  router.Add("GET", "/v1/standing-approvals", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see approvals"); !st.ok()) co_return Response::Error(st);
    std::vector<store::StandingApproval> found;
    std::string tenant = req.principal.tenant_id;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(found, tx.approvals().ListStanding(tenant));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    for (const auto& s : found) items.push_back(StandingJson(s));
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  router.Add("DELETE", "/v1/standing-approvals/{id}",
             [&ctx](Request& req) -> asio::awaitable<Response> {
               if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
               std::string tenant = req.principal.tenant_id;
               std::string id = req.Param("id");
               auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
                 const Millis at = NowMillis();
                 KEEL_RETURN_IF_ERROR(tx.approvals().RevokeStanding(tenant, id, at));
                 tx.Carry("standing_approvals",
                          store::ColumnsImage({{"id", id}, {"revoked_at", at}}));
                 return tx.events().Append({tenant, "standing_approval.revoked@v1", "", "", "",
                                            {{"standing_approval_id", id}}});
               });
               if (!written.ok()) co_return Response::Error(written.status());
               co_return Response::NoContent();
             });
}

}  // namespace keel::api

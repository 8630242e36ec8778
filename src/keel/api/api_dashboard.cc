// The dashboard: its files at / and /assets/..., and its sign-in. Signing in exchanges an API
// token for a token of the browser's own (store::Token.parent_id names the one it acts as),
// held in an HttpOnly, SameSite=Strict cookie (http/session_cookie.h): stored like every token,
// so it holds on every node and after a restart, and it ends at sign-out, at its expiry, or
// when the token that signed in is revoked.

#include <algorithm>
#include <tuple>
#include <vector>

#include "keel/api/api.h"
#include "keel/api/dashboard_assets.h"
#include "keel/api/render.h"
#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/http/session_cookie.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

constexpr long kSignInSeconds = 24 * 3600;
// The most sign-ins one token has at once (a browser each); a new one ends the oldest.
constexpr size_t kMaxSignIns = 20;

// Scripts and styles only from the server's own files; nothing inline, no other origin, no
// frames: model and tool output is shown as text, and this keeps it so should a page slip.
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

const DashboardAsset* FindAsset(std::string_view path) {
  for (size_t i = 0; i < kDashboardAssetCount; ++i) {
    if (path == kDashboardAssets[i].path) return &kDashboardAssets[i];
  }
  return nullptr;
}

bool AcceptsGzip(const Request& req) {
  // Enough for browsers, which always list gzip; a q=0 refusal is not worth parsing for.
  return req.Header("accept-encoding").find("gzip") != std::string::npos;
}

Response AssetResponse(const Request& req, const DashboardAsset& asset, bool immutable) {
  Response r;
  r.headers["ETag"] = asset.etag;
  r.headers["Vary"] = "Accept-Encoding";
  r.headers["X-Content-Type-Options"] = "nosniff";
  r.headers["Cache-Control"] = immutable ? "public, max-age=31536000, immutable" : "no-cache";
  if (req.Header("if-none-match") == asset.etag) {
    r.status = 304;
    r.content_type.clear();
    return r;
  }
  r.content_type = asset.content_type;
  if (AcceptsGzip(req)) {
    r.headers["Content-Encoding"] = "gzip";
    r.body.assign(asset.gzip);
  } else {
    r.body.assign(asset.body);
  }
  return r;
}

Json SignInJson(const ApiContext& ctx, const store::Token& signin, const std::string& secret) {
  return {{"signed_in", true},
          {"tenant_id", signin.tenant_id},
          {"token_id", signin.parent_id},
          {"role", signin.role},
          {"platform_admin", signin.role == "owner" && signin.tenant_id == ctx.admin_tenant_id},
          {"expires_at", FormatRfc3339(signin.expires_at.value_or(0))},
          {"csrf_token", http::CsrfTokenFor(secret)}};
}

}  // namespace

void RegisterDashboardRoutes(http::Router& router, ApiContext& ctx) {
  router.Add(
      "GET", "/",
      [](Request& req) -> asio::awaitable<Response> {
        const DashboardAsset* index = FindAsset("/index.html");
        Response r = AssetResponse(req, *index, /*immutable=*/false);
        r.headers["Content-Security-Policy"] = kContentSecurityPolicy;
        r.headers["X-Frame-Options"] = "DENY";
        r.headers["Referrer-Policy"] = "no-referrer";
        co_return r;
      },
      /*requires_auth=*/false);
  // Vite names the built files by their content: they never change under one name.
  router.Add(
      "GET", "/assets/{file}",
      [](Request& req) -> asio::awaitable<Response> {
        const DashboardAsset* asset = FindAsset("/assets/" + req.Param("file"));
        if (asset == nullptr) co_return Response::Error(NotFound("no such file: " + req.path));
        co_return AssetResponse(req, *asset, /*immutable=*/true);
      },
      /*requires_auth=*/false);
  router.Add(
      "POST", "/v1/dashboard/sign-in",
      [&ctx](Request& req) -> asio::awaitable<Response> {
        // Only the server's own pages sign in: a page of another origin (another port of the
        // same host is the same site to SameSite) must not swap the browser's sign-in for one
        // of its own, and a JSON content type keeps a cross-site form from posting at all.
        if (Status st = http::CheckOrigin(req); !st.ok()) co_return Response::Error(st);
        if (req.Header("content-type").rfind("application/json", 0) != 0) {
          co_return Response::Error(
              InvalidArgument("sign-in takes a JSON body with Content-Type: application/json"));
        }
        auto body = ParseJsonObject(req.body);
        if (!body.ok()) co_return Response::Error(body.status());
        if (auto st = CheckFields(*body, {"token"}); !st.ok()) co_return Response::Error(st);
        auto given = body->find("token");
        if (given == body->end() || !given->is_string() || given->get<std::string>().empty()) {
          co_return Response::Error(
              InvalidArgument("token is required: an API token to sign in with"));
        }
        const std::string hash = Sha256Hex(given->get<std::string>());
        store::Token parent;
        Status found = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
          KEEL_ASSIGN_OR_RETURN(parent, tx.tokens().FindActiveTokenByHash(hash));
          return Status::Ok();
        });
        if (found.code() == Code::kNotFound) {
          co_return Response::Error(Unauthenticated("invalid or revoked token"));
        }
        if (!found.ok()) co_return Response::Error(found);
        const Millis now = NowMillis();
        if (!parent.parent_id.empty() || (parent.expires_at && *parent.expires_at <= now)) {
          co_return Response::Error(
              Unauthenticated("sign in with an API token, not a sign-in's own"));
        }
        const std::string secret = NewToken();
        store::Token signin;
        signin.id = NewId();
        signin.tenant_id = parent.tenant_id;
        signin.name = "dashboard sign-in";
        signin.role = parent.role;
        signin.hash = Sha256Hex(secret);
        signin.created_at = now;
        signin.parent_id = parent.id;
        signin.expires_at = now + kSignInSeconds * 1000;
        auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
          // In the unit that writes it, so that it cannot follow a revocation of its token
          // that committed since the read above (the tenant's units are serialized).
          KEEL_ASSIGN_OR_RETURN(auto now_parent, tx.tokens().GetToken(parent.tenant_id, parent.id));
          if (now_parent.revoked_at) return Unauthenticated("invalid or revoked token");
          // At most kMaxSignIns live sign-ins per token: the oldest ends.
          KEEL_ASSIGN_OR_RETURN(auto tokens, tx.tokens().ListTokens(parent.tenant_id));
          std::vector<const store::Token*> live;
          for (const auto& t : tokens) {
            if (t.parent_id == parent.id && !t.revoked_at && t.expires_at && *t.expires_at > now) {
              live.push_back(&t);
            }
          }
          // Oldest first: ids are time-ordered, and break ties within a millisecond.
          std::sort(live.begin(), live.end(), [](const store::Token* a, const store::Token* b) {
            return std::tie(a->created_at, a->id) < std::tie(b->created_at, b->id);
          });
          for (size_t i = 0; i + kMaxSignIns <= live.size(); ++i) {
            KEEL_RETURN_IF_ERROR(tx.tokens().RevokeToken(parent.tenant_id, live[i]->id, now));
            tx.Carry("api_tokens", store::ColumnsImage({{"id", live[i]->id}, {"revoked_at", now}}));
            KEEL_RETURN_IF_ERROR(tx.events().Append(
                {parent.tenant_id, "token.revoked@v1", "", "", "", {{"token_id", live[i]->id}}}));
          }
          KEEL_RETURN_IF_ERROR(tx.tokens().InsertToken(signin));
          tx.Carry("api_tokens", store::RowImage(signin));
          return tx.events().Append({signin.tenant_id,
                                     "token.created@v1",
                                     "",
                                     "",
                                     "",
                                     {{"token_id", signin.id},
                                      {"name", signin.name},
                                      {"role", signin.role},
                                      {"parent_id", signin.parent_id}}});
        });
        if (!written.ok()) co_return Response::Error(written.status());
        Response r = Response::Json(201, SignInJson(ctx, signin, secret));
        r.headers["Set-Cookie"] = http::SessionCookie(req, secret, kSignInSeconds);
        r.headers["Cache-Control"] = "no-store";
        co_return r;
      },
      /*requires_auth=*/false);

  // Whether the request's cookie holds a live sign-in, and which: answered 200 either way, so
  // that a page loaded while signed out has no failed request to report.
  router.Add(
      "GET", "/v1/dashboard/session",
      [&ctx](Request& req) -> asio::awaitable<Response> {
        Response signed_out = Response::Json(200, {{"signed_in", false}});
        signed_out.headers["Cache-Control"] = "no-store";
        auto cookie = http::CookieValue(req, http::kSessionCookie);
        if (!cookie.ok()) co_return signed_out;
        const std::string secret = *cookie;
        if (secret.empty()) co_return signed_out;
        const http::Request no_route;  // the sign-in itself, not a route's object
        auto who = co_await MakeAuthenticator(ctx)(secret, no_route);
        if (!who.ok()) {
          if (who.status().code() == Code::kUnauthenticated) co_return signed_out;
          co_return Response::Error(who.status());
        }
        if (who->browser_session_id.empty()) co_return signed_out;
        if (Status st = http::CheckCookieRequest(req, secret); !st.ok()) {
          co_return Response::Error(st);
        }
        store::Token signin;
        Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
          KEEL_ASSIGN_OR_RETURN(signin,
                                tx.tokens().GetToken(who->tenant_id, who->browser_session_id));
          return Status::Ok();
        });
        if (!st.ok()) co_return Response::Error(st);
        Response r = Response::Json(200, SignInJson(ctx, signin, secret));
        r.headers["Cache-Control"] = "no-store";
        co_return r;
      },
      /*requires_auth=*/false);

  router.Add("POST", "/v1/dashboard/sign-out", [&ctx](Request& req) -> asio::awaitable<Response> {
    const std::string id = req.principal.browser_session_id;
    if (id.empty()) {
      co_return Response::Error(InvalidArgument(
          "this ends a dashboard sign-in; an API token is revoked with DELETE /v1/tokens/{id}"));
    }
    const std::string tenant = req.principal.tenant_id;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      const Millis at = NowMillis();
      KEEL_RETURN_IF_ERROR(tx.tokens().RevokeToken(tenant, id, at));
      tx.Carry("api_tokens", store::ColumnsImage({{"id", id}, {"revoked_at", at}}));
      return tx.events().Append({tenant, "token.revoked@v1", "", "", "", {{"token_id", id}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    Response r = Response::NoContent();
    r.headers["Set-Cookie"] = http::SessionCookie(req, "", 0);
    co_return r;
  });
}

}  // namespace keel::api

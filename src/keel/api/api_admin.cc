// Tenants, tokens, and the unauthenticated health/readiness routes plus metrics and OpenAPI.

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "keel/access/access.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/channels/relay.h"
#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/metrics.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/user_store.h"
#include "keel/tenants/tenants.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

void RegisterHealthRoutes(http::Router& router, ApiContext& ctx) {
  router.Add(
      "GET", "/healthz",
      [&ctx](Request&) -> asio::awaitable<Response> {
        co_return Response::Json(200, {{"status", ctx.runtime.draining() ? "draining" : "ok"},
                                       {"leader", ctx.store.leader()}});
      },
      /*requires_auth=*/false);
  router.Add(
      "GET", "/readyz",
      [&ctx](Request&) -> asio::awaitable<Response> {
        // Draining (SIGTERM): a load balancer sends no more requests here.
        if (ctx.runtime.draining()) {
          Response r = Response::Json(503, {{"status", "draining"}});
          r.headers["Retry-After"] = "1";
          co_return r;
        }
        // Any small query will do: the store answers. No tenant is named, so none is read.
        Status st = co_await store::AsyncRead(
            ctx.store, [](store::Tx& tx) { return tx.events().LastPosition("").status(); });
        if (!st.ok()) co_return Response::Error(Unavailable("store not ready: " + st.message()));
        co_return Response::Json(200, {{"status", "ready"}});
      },
      /*requires_auth=*/false);
  // Node-wide counters reveal every tenant's activity: only the platform admin reads them.
  router.Add("GET", "/metrics", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (!req.principal.platform_admin) {
      co_return Response::Error(
          PermissionDenied("/metrics shows node-wide counters: it needs the platform admin's token"));
    }
    auto s = ctx.store.stats();
    std::string extra;
    extra += "# HELP keel_store_commits_total Durable store commits (fsyncs).\n"
             "# TYPE keel_store_commits_total counter\nkeel_store_commits_total " +
             std::to_string(s.commits) + "\n";
    extra += "# HELP keel_store_units_total Units of work committed.\n"
             "# TYPE keel_store_units_total counter\nkeel_store_units_total " +
             std::to_string(s.units) + "\n";
    extra += "# HELP keel_store_failed_units_total Units of work rolled back.\n"
             "# TYPE keel_store_failed_units_total counter\nkeel_store_failed_units_total " +
             std::to_string(s.failed_units) + "\n";
    extra += "# HELP keel_leader 1 while this node leads the cluster (always, on SQLite).\n"
             "# TYPE keel_leader gauge\nkeel_leader " +
             std::string(ctx.store.leader() ? "1" : "0") + "\n";
    if (ctx.relay) {
      extra +=
          "# HELP keel_channels_polled Channels this node polls or registers the command of "
          "(it holds their leases).\n# TYPE keel_channels_polled gauge\nkeel_channels_polled " +
          std::to_string(ctx.relay->Polling()) + "\n";
    }
    Response r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = ctx.metrics.Render(extra);
    co_return r;
  });
  router.Add("GET", "/v1/openapi.json", [](Request&) -> asio::awaitable<Response> {
    Response r;
    r.body = OpenApiDocument();
    co_return r;
  }, /*requires_auth=*/false);
}

namespace {

Result<std::string> RoleOf(const Json& body) {
  KEEL_ASSIGN_OR_RETURN(std::string role, OptString(body, "role", "user"));
  if (role != "owner" && role != "user" && role != "guest") {
    return InvalidArgument("role must be 'owner', 'user' or 'guest', got '" + role + "'");
  }
  return role;
}

Result<std::string> NameOf(const Json& body) {
  KEEL_ASSIGN_OR_RETURN(std::string name, ReqString(body, "name"));
  if (name.size() > 200) return InvalidArgument("name is longer than 200 characters");
  return name;
}

}  // namespace

namespace {

// The fleet now: the nodes that reported lately (this one always), the leader, the queue.
asio::awaitable<Result<Json>> FleetJson(ApiContext& ctx) {
  std::vector<store::NodeInfo> nodes;
  int64_t queued = 0;
  Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(nodes, tx.runs().ListNodes(10000));
    KEEL_ASSIGN_OR_RETURN(queued, tx.runs().CountQueuedRuns());
    return Status::Ok();
  });
  if (!st.ok()) co_return st;
  const store::NodeInfo self = ctx.store.NodeReport();
  bool listed = false;
  for (auto& n : nodes) {
    if (n.origin == self.origin) {
      n = self;  // its own figures as of now
      listed = true;
    }
  }
  if (!listed) nodes.push_back(self);
  Json items = Json::array();
  Json leader = nullptr;
  int64_t executing = 0;
  for (const auto& n : nodes) {
    Json j = Json::object();
    j["origin"] = n.origin;
    j["address"] = n.address;
    j["started_at"] = FormatRfc3339(n.started_at);
    j["seen_at"] = FormatRfc3339(n.seen_at);
    j["runs_executing"] = n.runs_executing;
    j["runs_finished"] = n.runs_finished;
    j["leader"] = n.leader;
    j["this_node"] = n.origin == self.origin;
    if (n.leader) leader = n.origin;
    executing += n.runs_executing;
    items.push_back(std::move(j));
  }
  Json out = Json::object();
  out["at"] = FormatRfc3339(NowMillis());
  out["leader"] = std::move(leader);
  out["runs_queued"] = queued;
  out["runs_executing"] = executing;
  out["nodes"] = std::move(items);
  co_return out;
}

Status RequirePlatformAdmin(const Request& req) {
  if (req.principal.platform_admin) return Status::Ok();
  return PermissionDenied("the fleet is the platform admin's: it shows every tenant's load");
}

}  // namespace

void RegisterAdminRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("GET", "/v1/nodes", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequirePlatformAdmin(req); !st.ok()) co_return Response::Error(st);
    auto fleet = co_await FleetJson(ctx);
    if (!fleet.ok()) co_return Response::Error(fleet.status());
    co_return Response::Json(200, *fleet);
  });

  // The same, once a second, as Server-Sent Events (the dashboard's fleet page plots it).
  router.Add("GET", "/v1/nodes/stream", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequirePlatformAdmin(req); !st.ok()) co_return Response::Error(st);
    if (req.IsWebSocketUpgrade()) {
      co_return Response::Error(InvalidArgument("/v1/nodes/stream is Server-Sent Events only"));
    }
    Response r;
    r.content_type = "text/event-stream";
    r.headers["X-Accel-Buffering"] = "no";
    r.stream = [&ctx, who = req.principal](http::StreamWriter& w) -> asio::awaitable<void> {
      ++ctx.metrics.sse_clients;
      struct Leave {
        Metrics& metrics;
        ~Leave() { --metrics.sse_clients; }
      } leave{ctx.metrics};
      asio::steady_timer timer(co_await asio::this_coro::executor);
      while (!ctx.runtime.draining()) {
        Status still = co_await store::AsyncRead(
            ctx.store, [&](store::Tx& tx) { return StillAuthorized(tx, who, NowMillis()); });
        if (!still.ok()) co_return;  // revoked, signed out or expired: the feed ends
        auto fleet = co_await FleetJson(ctx);
        if (!fleet.ok()) co_return;
        if (!co_await w.Write("event: fleet\ndata: " + DumpJson(*fleet) + "\n\n")) co_return;
        timer.expires_after(std::chrono::seconds(1));
        boost::system::error_code ec;
        co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        if (ec) co_return;
      }
    };
    co_return r;
  });

  router.Add("POST", "/v1/tenants", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (!req.principal.platform_admin) {
      co_return Response::Error(PermissionDenied("only the platform admin can create tenants"));
    }
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"name"}); !st.ok()) co_return Response::Error(st);
    auto name = NameOf(*body);
    if (!name.ok()) co_return Response::Error(name.status());
    tenants::NewTenant created = tenants::MakeTenant(*name);
    auto written = co_await store::AsyncWrite(
        ctx.store, [&](store::Tx& tx) { return tenants::InsertTenant(tx, created); });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(201, {{"tenant", TenantJson(created.tenant)},
                                   {"owner_token", created.secret}});
  });

  router.Add("GET", "/v1/tenants", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (!req.principal.platform_admin) {
      co_return Response::Error(PermissionDenied("only the platform admin can list tenants"));
    }
    std::vector<store::Tenant> tenants;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(tenants, tx.tenants().ListTenants());
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    for (const auto& t : tenants) items.push_back(TenantJson(t));
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  // Only the platform admin grants what reaches the host (DESIGN.md invariant 12): a tenant's
  // owner cannot turn on host execution or unsandboxed stdio MCP servers, even for itself.
  router.Add("PATCH", "/v1/tenants/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (!req.principal.platform_admin) {
      co_return Response::Error(
          PermissionDenied("only the platform admin can change a tenant's settings"));
    }
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (body->empty()) {
      co_return Response::Error(
          InvalidArgument("give allow_host_exec and/or allow_stdio_mcp (true or false)"));
    }
    for (auto it = body->begin(); it != body->end(); ++it) {
      if (it.key() != "allow_host_exec" && it.key() != "allow_stdio_mcp") {
        co_return Response::Error(InvalidArgument(
            "unknown field '" + it.key() + "' (a tenant's settings are allow_host_exec and "
            "allow_stdio_mcp)"));
      }
      if (!it.value().is_boolean()) {
        co_return Response::Error(InvalidArgument(it.key() + " must be true or false"));
      }
    }
    std::string id = req.Param("id");
    store::Tenant tenant;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(tenant, tx.tenants().GetTenant(id));
      tenant.allow_host_exec = body->value("allow_host_exec", tenant.allow_host_exec);
      tenant.allow_stdio_mcp = body->value("allow_stdio_mcp", tenant.allow_stdio_mcp);
      KEEL_RETURN_IF_ERROR(tx.tenants().UpdateTenantSettings(tenant));
      tx.Carry("tenants", store::RowImage(tenant));
      return tx.events().Append({tenant.id, "tenant.settings_changed@v1", "", "", "",
                                 {{"allow_host_exec", tenant.allow_host_exec},
                                  {"allow_stdio_mcp", tenant.allow_stdio_mcp}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, TenantJson(tenant));
  });

  router.Add("POST", "/v1/tokens", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"name", "role", "user_id"}); !st.ok()) {
      co_return Response::Error(st);
    }
    auto name = NameOf(*body);
    if (!name.ok()) co_return Response::Error(name.status());
    auto role = RoleOf(*body);
    if (!role.ok()) co_return Response::Error(role.status());
    std::string secret = NewToken();
    store::Token token;
    token.id = NewId();
    token.tenant_id = req.principal.tenant_id;
    token.name = *name;
    token.role = *role;
    token.hash = Sha256Hex(secret);
    token.created_at = NowMillis();
    if (body->contains("user_id")) {
      auto user = ReqString(*body, "user_id");
      if (!user.ok()) co_return Response::Error(user.status());
      token.user_id = *user;
    }
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      if (!token.user_id.empty()) {
        // A person's token: its role on each agent is at most the person's there.
        auto user = tx.users().GetUser(token.tenant_id, token.user_id);
        if (user.status().code() == Code::kNotFound) {
          return InvalidArgument("user_id names no user of this tenant: " + token.user_id);
        }
        KEEL_RETURN_IF_ERROR(user.status());
        if (!user->merged_into.empty()) {
          return InvalidArgument("user " + token.user_id + " was merged into " + user->merged_into +
                                 ": use that user");
        }
      }
      KEEL_RETURN_IF_ERROR(tx.tokens().InsertToken(token));
      tx.Carry("api_tokens", store::RowImage(token));
      return tx.events().Append({token.tenant_id,
                                 "token.created@v1",
                                 "",
                                 "",
                                 "",
                                 {{"token_id", token.id},
                                  {"name", token.name},
                                  {"role", token.role},
                                  {"user_id", token.user_id}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    Json out = TokenJson(token);
    out["token"] = secret;
    co_return Response::Json(201, out);
  });

  router.Add("GET", "/v1/tokens", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::vector<store::Token> tokens;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(tokens, tx.tokens().ListTokens(req.principal.tenant_id));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    for (const auto& t : tokens) items.push_back(TokenJson(t));
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  router.Add("DELETE", "/v1/tokens/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string id = req.Param("id");
    std::string tenant = req.principal.tenant_id;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      const Millis at = NowMillis();
      KEEL_RETURN_IF_ERROR(tx.tokens().RevokeToken(tenant, id, at));
      KEEL_RETURN_IF_ERROR(access::WithdrawAuthority(tx, tenant, id, at));
      tx.Carry("api_tokens", store::ColumnsImage({{"id", id}, {"revoked_at", at}}));
      KEEL_RETURN_IF_ERROR(
          tx.events().Append({tenant, "token.revoked@v1", "", "", "", {{"token_id", id}}}));
      // The dashboard sign-ins of the token end with it.
      KEEL_ASSIGN_OR_RETURN(auto tokens, tx.tokens().ListTokens(tenant));
      for (const auto& t : tokens) {
        if (t.parent_id != id || t.revoked_at) continue;
        KEEL_RETURN_IF_ERROR(tx.tokens().RevokeToken(tenant, t.id, at));
        tx.Carry("api_tokens", store::ColumnsImage({{"id", t.id}, {"revoked_at", at}}));
        KEEL_RETURN_IF_ERROR(
            tx.events().Append({tenant, "token.revoked@v1", "", "", "", {{"token_id", t.id}}}));
      }
      return Status::Ok();
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });
}

}  // namespace keel::api

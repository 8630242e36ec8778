// Secrets: set (PUT), list (names and times only), delete. Owners only. A value never leaves
// the server through the API, and never appears in an event or a log line.

#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/time.h"
#include "keel/secrets/vault.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

Json SecretJson(const store::Secret& s) {
  return {{"name", s.name},
          {"created_at", FormatRfc3339(s.created_at)},
          {"updated_at", FormatRfc3339(s.updated_at)}};
}

}  // namespace

void RegisterSecretRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("PUT", "/v1/secrets/{name}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string name = req.Param("name");
    if (auto st = secrets::Vault::CheckName(name); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"value"}); !st.ok()) co_return Response::Error(st);
    if (!body->contains("value") || !(*body)["value"].is_string()) {
      co_return Response::Error(InvalidArgument("field 'value' must be a string"));
    }
    if (auto st = ctx.vault.ready(); !st.ok()) co_return Response::Error(st);
    std::string value = (*body)["value"].get<std::string>();
    std::string tenant = req.principal.tenant_id;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(bool created, ctx.vault.Put(tx, tenant, name, value, NowMillis()));
      return tx.events().Append(
          {tenant, "secret.set@v1", "", "", "", {{"name", name}, {"created", created}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });

  router.Add("GET", "/v1/secrets", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::vector<store::Secret> found;
    std::string tenant = req.principal.tenant_id;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(found, tx.secrets().ListSecrets(tenant));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    for (const auto& s : found) items.push_back(SecretJson(s));
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  router.Add("DELETE", "/v1/secrets/{name}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string name = req.Param("name");
    std::string tenant = req.principal.tenant_id;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.secrets().DeleteSecret(tenant, name));
      tx.Carry("secrets", store::DeletedImage({{"tenant_id", tenant}, {"name", name}}));
      return tx.events().Append({tenant, "secret.deleted@v1", "", "", "", {{"name", name}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });
}

}  // namespace keel::api

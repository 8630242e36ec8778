// A session's context (docs/CONTEXT.md): the compaction records that stand for its older turns.
// Any role may read them, as it may read the session's messages.

#include "keel/access/access.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/time.h"
#include "keel/store/async.h"
#include "keel/store/compaction_store.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

Json CompactionJson(const store::Compaction& c) {
  return {{"id", c.id},
          {"session_id", c.session_id},
          {"run_id", c.run_id},
          {"last_message_id", c.last_message_id},
          {"summary", c.summary},
          {"messages", c.messages},
          {"tokens_before", c.tokens_before},
          {"tokens_after", c.tokens_after},
          {"created_at", FormatRfc3339(c.created_at)}};
}

}  // namespace

void RegisterContextRoutes(http::Router& router, ApiContext& ctx) {
  router.Add(
      "GET", "/v1/sessions/{id}/compactions", [&ctx](Request& req) -> asio::awaitable<Response> {
        auto page = PageOf(req);
        if (!page.ok()) co_return Response::Error(page.status());
        std::string tenant = req.principal.tenant_id;
        std::string session_id = req.Param("id");
        store::Paged<store::Compaction> found;
        Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
          KEEL_RETURN_IF_ERROR(access::UsableSession(tx, req.principal, session_id).status());
          KEEL_ASSIGN_OR_RETURN(found, tx.compactions().ListCompactions(tenant, session_id, *page));
          return Status::Ok();
        });
        if (!st.ok()) co_return Response::Error(st);
        co_return Response::Json(200, ListJson(found, CompactionJson));
      });
}

}  // namespace keel::api

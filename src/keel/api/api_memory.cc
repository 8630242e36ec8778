// An agent's memories: search (GET with q) or list (GET without), write (POST: add, or replace
// by id), show and delete one (under the agent, or by id alone: ids are unique in a tenant); its
// working memory (GET, PUT). Any token of the tenant may read; writing needs an owner or user
// token (a guest gets 403), as the memory tools need the right `write`. Each write and its event
// are one unit of work; an upsert then emits memory.upsert@v1 to the agent's plugins
// (docs/MEMORY.md).

#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/time.h"
#include "keel/memory/memory.h"
#include "keel/memory/query.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

// ?limit= for a search: 1..kMaxSearchLimit, default kDefaultSearchLimit.
Result<int> SearchLimitOf(const Request& req) {
  const std::string text = req.Query("limit");
  if (text.empty()) return memory::kDefaultSearchLimit;
  int limit = 0;
  size_t used = 0;
  try {
    limit = std::stoi(text, &used);
  } catch (...) {
    used = 0;
  }
  if (used != text.size()) {
    return InvalidArgument("limit must be an integer between 1 and " +
                           std::to_string(memory::kMaxSearchLimit) + ", got '" + text + "'");
  }
  KEEL_RETURN_IF_ERROR(memory::CheckSearchLimit(limit));
  return limit;
}

}  // namespace

void RegisterMemoryRoutes(http::Router& router, ApiContext& ctx) {
  // Whether the search language takes `q`, and if not why (a search form checks as it is
  // typed: a query it cannot take is an answer, not a failed request).
  router.Add("GET", "/v1/memory-query", [](Request& req) -> asio::awaitable<Response> {
    auto parsed = memory::ParseQuery(req.Query("q"));
    Json out = Json::object();
    out["valid"] = parsed.ok();
    out["error"] = parsed.ok() ? Json(nullptr) : Json(parsed.status().message());
    co_return Response::Json(200, out);
  });

  // ?q= searches (best first, with scores; ?limit= 1..100); without it, lists newest first
  // (paged). ?tag= filters both.
  router.Add("GET", "/v1/agents/{id}/memories", [&ctx](Request& req) -> asio::awaitable<Response> {
    std::string tenant = req.principal.tenant_id;
    std::string agent = req.Param("id");
    std::string tag = req.Query("tag");
    if (!tag.empty()) {
      if (Status st = memory::CheckTag(tag); !st.ok()) co_return Response::Error(st);
    }
    auto query = req.query.find("q");
    if (query != req.query.end()) {
      auto limit = SearchLimitOf(req);
      if (!limit.ok()) co_return Response::Error(limit.status());
      std::string q = query->second;
      Json items = Json::array();
      Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
        KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent).status());
        KEEL_ASSIGN_OR_RETURN(auto hits, memory::Search(tx, tenant, agent, q, tag, *limit));
        for (const auto& h : hits) items.push_back(memory::HitJson(h));
        return Status::Ok();
      });
      if (!st.ok()) co_return Response::Error(st);
      co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
    }
    auto page = PageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    store::Paged<store::Memory> found;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent).status());
      KEEL_ASSIGN_OR_RETURN(found, tx.memory().ListMemories(tenant, agent, tag, *page));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ListJson(found, memory::MemoryJson));
  });

  // {"text", "tags"?, "id"?, "source"?}: 201 for a new memory, 200 when it replaced the agent's
  // memory with that id.
  router.Add("POST", "/v1/agents/{id}/memories", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "write memories"); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    std::string tenant = req.principal.tenant_id;
    std::string agent = req.Param("id");
    auto checked = memory::MemoryFrom(*body, tenant, agent, "api");
    if (!checked.ok()) co_return Response::Error(checked.status());
    store::Memory m = *checked;
    memory::Upserted written;
    auto committed = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent).status());
      KEEL_ASSIGN_OR_RETURN(written, memory::Upsert(tx, m));
      return Status::Ok();
    });
    if (!committed.ok()) co_return Response::Error(committed.status());
    Json payload = memory::UpsertPayload(written.memory, written.replaced, "", "");
    co_await ctx.runtime.EmitFor(tenant, agent, "memory.upsert", payload);
    co_return Response::Json(written.replaced ? 200 : 201, memory::MemoryJson(written.memory));
  });

  router.Add("GET", "/v1/agents/{id}/memories/{memory}",
             [&ctx](Request& req) -> asio::awaitable<Response> {
    std::string tenant = req.principal.tenant_id;
    std::string agent = req.Param("id");
    std::string id = req.Param("memory");
    Json out;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent).status());
      KEEL_ASSIGN_OR_RETURN(auto m, tx.memory().GetMemory(tenant, agent, id));
      out = memory::MemoryJson(m);
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, out);
  });

  router.Add("DELETE", "/v1/agents/{id}/memories/{memory}",
             [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "delete memories"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string agent = req.Param("id");
    std::string id = req.Param("memory");
    auto committed = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent).status());
      return memory::Delete(tx, tenant, agent, id);
    });
    if (!committed.ok()) co_return Response::Error(committed.status());
    co_return Response::NoContent();
  });

  // A memory by its id alone (ids are unique in a tenant), whichever agent's it is.
  router.Add("GET", "/v1/memories/{memory}", [&ctx](Request& req) -> asio::awaitable<Response> {
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("memory");
    Json out;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto m, tx.memory().FindMemory(tenant, id));
      out = memory::MemoryJson(m);
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, out);
  });

  router.Add("DELETE", "/v1/memories/{memory}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "delete memories"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("memory");
    auto committed = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto m, tx.memory().FindMemory(tenant, id));
      return memory::Delete(tx, tenant, m.agent_id, id);
    });
    if (!committed.ok()) co_return Response::Error(committed.status());
    co_return Response::NoContent();
  });

  router.Add("GET", "/v1/agents/{id}/working-memory",
             [&ctx](Request& req) -> asio::awaitable<Response> {
    std::string tenant = req.principal.tenant_id;
    std::string agent = req.Param("id");
    store::WorkingMemory w;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent).status());
      KEEL_ASSIGN_OR_RETURN(w, tx.memory().GetWorkingMemory(tenant, agent));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(
        200, {{"agent_id", agent},
              {"text", w.text},
              {"updated_at", w.updated_at ? Json(FormatRfc3339(w.updated_at)) : Json(nullptr)}});
  });

  // {"text"}: replaces it whole; "" clears it.
  router.Add("PUT", "/v1/agents/{id}/working-memory",
             [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "change the working memory"); !st.ok()) {
      co_return Response::Error(st);
    }
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"text"}); !st.ok()) co_return Response::Error(st);
    if (!body->contains("text") || !(*body)["text"].is_string()) {
      co_return Response::Error(InvalidArgument("field 'text' (a string) is required"));
    }
    std::string tenant = req.principal.tenant_id;
    std::string agent = req.Param("id");
    std::string text = (*body)["text"].get<std::string>();
    store::WorkingMemory w;
    auto committed = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent).status());
      KEEL_ASSIGN_OR_RETURN(w, memory::PutWorkingMemory(tx, tenant, agent, text));
      return Status::Ok();
    });
    if (!committed.ok()) co_return Response::Error(committed.status());
    co_return Response::Json(
        200, {{"agent_id", agent}, {"text", w.text}, {"updated_at", FormatRfc3339(w.updated_at)}});
  });
}

}  // namespace keel::api

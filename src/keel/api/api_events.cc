// The event log over HTTP: paged reads and the live stream, as Server-Sent Events or, for a
// WebSocket upgrade of the same route, as WebSocket text messages (one JSON object each).

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <limits>
#include <memory>
#include <set>

#include "keel/access/access.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/config/config.h"
#include "keel/metrics.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/audit.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

Result<int64_t> PositionOf(const std::string& text, const char* what) {
  try {
    size_t used = 0;
    long long v = std::stoll(text, &used);
    if (used == text.size() && v >= 0) return static_cast<int64_t>(v);
  } catch (...) {
  }
  return InvalidArgument(std::string(what) + " must be a non-negative integer event position");
}

store::EventFilter FilterOf(const Request& req) {
  return {req.Query("agent_id"), req.Query("session_id"), req.Query("run_id")};
}

// One stored event or token delta as the stream sends it: an SSE frame, or a WebSocket
// message (the same JSON; a delta's carries "type": "message.delta").
std::string EventFrame(const store::Event& e, bool websocket) {
  std::string json = DumpJson(EventJson(e));
  if (websocket) return json;
  return "id: " + std::to_string(e.position) + "\nevent: " + e.type + "\ndata: " + json + "\n\n";
}

std::string DeltaFrame(const runtime::Delta& d, bool websocket) {
  Json data = {{"run_id", d.run_id}, {"session_id", d.session_id}, {"agent_id", d.agent_id},
               {"text", d.text}};
  if (websocket) {
    data["type"] = "message.delta";
    return DumpJson(data);
  }
  return "event: message.delta\ndata: " + DumpJson(data) + "\n\n";
}

}  // namespace

void RegisterEventRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("GET", "/v1/events", [&ctx](Request& req) -> asio::awaitable<Response> {
    // `after` is a position; `cursor` (the previous page's next_cursor) is one too.
    int64_t after = 0;
    const char* given = "after";
    std::string a = req.Query("after");
    if (a.empty()) {
      given = "cursor";
      a = req.Query("cursor");
    }
    if (!a.empty()) {
      auto p = PositionOf(a, given);
      if (!p.ok()) co_return Response::Error(p.status());
      after = *p;
    }
    auto limit = LimitOf(req);
    if (!limit.ok()) co_return Response::Error(limit.status());
    // ?order=desc: the newest first, from the end of the log or before `cursor`.
    const std::string order = req.Query("order", "asc");
    if (order != "asc" && order != "desc") {
      co_return Response::Error(
          InvalidArgument("order must be asc or desc, got '" + order.substr(0, 64) + "'"));
    }
    const bool newest_first = order == "desc";
    if (newest_first && !req.Query("after").empty()) {
      co_return Response::Error(
          InvalidArgument("after reads forward; with order=desc, go back with cursor"));
    }
    // The page is cut from the log before the caller's view filters it: a guest's page may be
    // short, and its cursor still moves past what it may not see.
    std::vector<store::Event> events;
    Json items = Json::array();
    access::SessionScope scope(req.principal);
    bool more = false;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      if (newest_first) {
        const int64_t before = a.empty() ? std::numeric_limits<int64_t>::max() : after;
        KEEL_ASSIGN_OR_RETURN(events, tx.events().ReadEventsBefore(req.principal.tenant_id, before,
                                                                   FilterOf(req), *limit + 1));
      } else {
        KEEL_ASSIGN_OR_RETURN(events, tx.events().ReadEvents(req.principal.tenant_id, after,
                                                             FilterOf(req), *limit + 1));
      }
      more = static_cast<int>(events.size()) > *limit;
      if (more) events.resize(*limit);
      for (const auto& e : events) {
        KEEL_ASSIGN_OR_RETURN(auto visible, scope.Visible(tx, e));
        if (visible) items.push_back(EventJson(*visible));
      }
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json next = more ? Json(std::to_string(events.back().position)) : Json(nullptr);
    co_return Response::Json(200, {{"items", items}, {"next_cursor", next}});
  });

  router.Add("GET", "/v1/stream", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (ctx.runtime.draining()) {
      Response r = Response::Error(Unavailable(
          "this node is stopping: connect to another node, or again once it has restarted"));
      r.headers["Retry-After"] = "1";
      co_return r;
    }
    const std::string tenant = req.principal.tenant_id;
    store::EventFilter filter = FilterOf(req);
    const char* given = "Last-Event-ID";
    std::string resume = req.Header("last-event-id");
    if (resume.empty()) {
      given = "after";
      resume = req.Query("after");
    }
    int64_t cursor = 0;
    if (!resume.empty()) {
      auto p = PositionOf(resume, given);
      if (!p.ok()) co_return Response::Error(p.status());
      cursor = *p;
    } else {
      // A new client tails from now.
      Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(cursor, tx.events().LastPosition(tenant));
        return Status::Ok();
      });
      if (!st.ok()) co_return Response::Error(st);
    }
    // Subscribe before the headers go out, so a client that waits for them before acting
    // misses no delta.
    auto sub = ctx.hub.Subscribe({tenant, filter.agent_id, filter.session_id, filter.run_id});
    const bool websocket = req.IsWebSocketUpgrade();
    Response r;
    r.content_type = "text/event-stream";
    r.headers["X-Accel-Buffering"] = "no";
    r.stream = [&ctx, tenant, filter, cursor, sub, websocket, who = req.principal,
                scope = access::SessionScope(req.principal)](
                   http::StreamWriter& w) mutable -> asio::awaitable<void> {
      ++ctx.metrics.sse_clients;
      struct Leave {
        ApiContext& ctx;
        runtime::EventHub::SubscriptionPtr sub;
        ~Leave() {
          ctx.hub.Unsubscribe(sub);
          --ctx.metrics.sse_clients;
        }
      } leave{ctx, sub};
      if (!websocket && !co_await w.Write("retry: 2000\n: connected\n\n")) co_return;
      // The stream ends once its credential no longer holds (revoked, signed out, expired):
      // checked every few seconds as it wakes, and at once after a token is revoked.
      Millis next_check = NowMillis() + 5000;
      bool revocation_seen = false;
      while (true) {
        ctx.hub.TakeDirty(sub);
        std::vector<store::Event> events;  // as read: the cursor moves past all of them
        std::vector<store::Event> shown;   // what this caller may see of them
        Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
          const Millis now = NowMillis();
          if (revocation_seen || now >= next_check) {
            KEEL_RETURN_IF_ERROR(StillAuthorized(tx, who, now));
            next_check = now + 5000;
            revocation_seen = false;
          }
          KEEL_ASSIGN_OR_RETURN(events, tx.events().ReadEvents(tenant, cursor, filter, 500));
          for (const auto& e : events) revocation_seen |= e.type == "token.revoked@v1";
          for (const auto& e : events) {
            KEEL_ASSIGN_OR_RETURN(auto visible, scope.Visible(tx, e));
            if (visible) shown.push_back(std::move(*visible));
          }
          return Status::Ok();
        });
        if (!st.ok()) co_return;
        std::deque<runtime::Delta> deltas = ctx.hub.TakeDeltas(sub);
        // Token deltas are shown as their session's events are; a session not looked up yet
        // (a delta can come before its run's events are read) is looked up now.
        bool unknown = false;
        for (const auto& d : deltas) unknown = unknown || !scope.Known(d.session_id);
        if (unknown) {
          st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
            for (const auto& d : deltas) KEEL_RETURN_IF_ERROR(scope.Sees(tx, d.session_id).status());
            return Status::Ok();
          });
          if (!st.ok()) co_return;
        }
        std::vector<std::string> frames;
        size_t next = 0;
        for (const auto& d : deltas) {
          if (!scope.Known(d.session_id).value_or(false)) continue;
          // Deltas go between the events committed before and after they were published.
          for (; next < shown.size() && shown[next].position <= d.after_position; ++next) {
            frames.push_back(EventFrame(shown[next], websocket));
          }
          frames.push_back(DeltaFrame(d, websocket));
        }
        for (; next < shown.size(); ++next) frames.push_back(EventFrame(shown[next], websocket));
        if (!events.empty()) cursor = events.back().position;
        if (websocket) {  // one message each
          for (auto& f : frames) {
            if (!co_await w.Write(std::move(f))) co_return;
          }
        } else if (!frames.empty()) {  // one write
          std::string out;
          for (const auto& f : frames) out += f;
          if (!co_await w.Write(std::move(out))) co_return;
        }
        if (events.size() == 500) continue;
        if (ctx.hub.closing()) {
          // The node stops. What committed before the last read went out; the client reconnects
          // (to another node, or to this one restarted) after its last event id, missing nothing.
          w.EndForRestart();
          if (!websocket) (void)co_await w.Write(": this node is stopping; reconnect\n\n");
          co_return;
        }
        auto before = std::chrono::steady_clock::now();
        co_await ctx.hub.Wait(sub, std::chrono::seconds(15));
        if (std::chrono::steady_clock::now() - before >= std::chrono::seconds(15)) {
          if (!co_await w.Ping()) co_return;
        }
      }
    };
    co_return r;
  });

  // The tenant's audit chains, checked in one snapshot (store/audit.h). Owners only. A
  // tenant's whole log is read and hashed, so it runs off the event loop, on a thread of its
  // own, one verification at a time; a few more may wait (one per tenant), beyond that 429.
  // `tenants` is touched on the io thread only.
  struct Verifier {
    asio::thread_pool pool{1};
    std::set<std::string> tenants;  // those with a verification running or waiting
  };
  constexpr size_t kMaxWaiting = 4;
  auto verifier = std::make_shared<Verifier>();  // shared by the copies of the handler
  router.Add("GET", "/v1/audit/verify", [&ctx, verifier](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    const std::string tenant = req.principal.tenant_id;
    if (verifier->tenants.size() >= kMaxWaiting || verifier->tenants.count(tenant)) {
      Response r = Response::Error(Status(
          Code::kRateLimited, "audit verifications are already running; try again shortly"));
      r.headers["Retry-After"] = "1";
      co_return r;
    }
    verifier->tenants.insert(tenant);
    // A KEK that does not parse signs nothing (the server says so at start): "unchecked".
    auto key = store::AuditKeyFromKek(ctx.config.secret_kek);
    const std::string audit_key = key.ok() ? *key : std::string();
    Result<std::vector<store::ChainReport>> reports;
    co_await asio::async_initiate<const asio::use_awaitable_t<>, void()>(
        [&](auto handler) {
          auto ex = asio::get_associated_executor(handler);
          auto h = std::make_shared<decltype(handler)>(std::move(handler));
          asio::post(verifier->pool, [&, h, ex] {
            Status st = ctx.store.Read([&](store::Tx& tx) -> Status {
              reports = store::VerifyTenantChains(tx, audit_key, tenant);
              return reports.status();
            });
            if (!st.ok() && reports.ok()) reports = st;
            asio::post(ex, [h] { (*h)(); });
          });
        },
        asio::use_awaitable);
    verifier->tenants.erase(tenant);
    if (!reports.ok()) co_return Response::Error(reports.status());
    co_return Response::Json(200, store::AuditReportJson(tenant, *reports));
  });
}

}  // namespace keel::api

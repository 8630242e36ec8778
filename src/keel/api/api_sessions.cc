// Sessions and their messages; posting a message is the runtime's intake.

#include <cmath>

#include "keel/access/access.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/api/run_wait.h"
#include "keel/common/ids.h"
#include "keel/runs/open_session.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

// A run that intake just claimed for this node (not a replay; running, leased to its origin) is not
// read first: it moves only by this node's commits (or, after its lease, another node's), and each
// wakes the subscription, which is in place before the first of them is dispatched. A run this
// node's execution ended is not read back either: the hub hands over the run as the ending
// committed it (EventHub::Ending). Intake may have told the run before its commit
// (IntakeRequest::answered_after_run): a run not handed over by a commit is answered only as
// read after a flush, so that the caller never hears of a run that is not on disk.
asio::awaitable<Result<store::Run>> WaitForRun(ApiContext& ctx, store::Run current, double seconds,
                                               bool just_claimed, bool through_approval) {
  const std::string tenant_id = current.tenant_id, run_id = current.id;
  auto sub = ctx.hub.Subscribe({tenant_id, "", "", run_id, /*deltas=*/false});
  // Whole milliseconds, rounded up: a wait is never shorter than asked.
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
  // Whether `current` is the run as it stands, as far as waiting goes.
  bool known =
      just_claimed && current.status == "running" && current.lease_owner == ctx.store.origin();
  bool flushed = false;  // the units queued before this wait's flush are durable
  while (true) {
    bool committed = false;  // `current` as a commit handed it over
    if (auto settled = ctx.hub.TakeSettled(sub)) {
      current = std::move(*settled);  // as this node's execution committed its ending
      committed = true;
    } else if (!known) {
      Status st;
      if (!flushed) st = co_await store::AsyncFlush(ctx.store);
      flushed = true;
      if (st.ok()) {
        st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
          KEEL_ASSIGN_OR_RETURN(current, tx.runs().GetRun(tenant_id, run_id));
          return Status::Ok();
        });
      }
      if (st.code() == Code::kNotFound) {
        // Intake told it, and its commit failed since (the store logged it).
        st = Unavailable("the run " + run_id +
                         " was not written: the store failed; post again "
                         "with the same Idempotency-Key");
      }
      if (!st.ok()) {
        ctx.hub.Unsubscribe(sub);
        co_return st;
      }
      committed = true;
    }
    auto now = std::chrono::steady_clock::now();
    const bool parked = current.status == "waiting_for_approval" && !through_approval;
    if (current.Terminal() || parked || now >= deadline) {
      if (committed) break;
      known = false;  // answered as read after a flush
      continue;
    }
    co_await ctx.hub.Wait(sub, std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
    // Still so after the run's progress alone. Read when it may have ended, at the deadline (the
    // caller gets the run as it stands), and while the node drains (the hub no longer waits).
    known = !ctx.hub.TakeMayHaveEnded(sub) && !ctx.hub.closing() &&
            std::chrono::steady_clock::now() < deadline;
  }
  ctx.hub.Unsubscribe(sub);
  co_return std::move(current);
}

namespace {

Result<double> WaitSeconds(const Request& req) {
  std::string w = req.Query("wait");
  if (w.empty()) return 0.0;
  double v = -1;
  try {
    size_t used = 0;
    v = std::stod(w, &used);
    if (used != w.size()) v = -1;
  } catch (...) {
  }
  if (!(v >= 0 && v <= 300)) return InvalidArgument("wait must be a number of seconds from 0 to 300");
  return v;
}

}  // namespace

void RegisterSessionRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("POST", "/v1/agents/{id}/sessions", [&ctx](Request& req) -> asio::awaitable<Response> {
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"title", "instructions"}); !st.ok())
      co_return Response::Error(st);
    auto title = OptString(*body, "title");
    if (!title.ok()) co_return Response::Error(title.status());
    if (title->size() > 1000) co_return Response::Error(InvalidArgument("title is longer than 1000 characters"));
    auto instructions = OptString(*body, "instructions");
    if (!instructions.ok()) co_return Response::Error(instructions.status());
    if (instructions->size() > kMaxSessionInstructions) {
      co_return Response::Error(InvalidArgument("instructions are longer than 256 KiB"));
    }
    store::Session session;
    session.id = NewId();
    session.tenant_id = req.principal.tenant_id;
    session.agent_id = req.Param("id");
    session.title = *title;
    session.instructions = std::move(*instructions);
    session.created_by = req.principal.token_id;
    session.created_at = session.updated_at = NowMillis();
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(session.tenant_id, session.agent_id).status());
      return runs::OpenSession(tx, session);
    });
    if (!written.ok()) co_return Response::Error(written.status());
    Json opened = {{"agent_id", session.agent_id}, {"session_id", session.id},
                   {"title", session.title}};
    co_await ctx.runtime.EmitFor(session.tenant_id, session.agent_id, "session.opened",
                                 std::move(opened));
    co_return Response::Json(201, SessionJson(session));
  });

  router.Add("GET", "/v1/agents/{id}/sessions", [&ctx](Request& req) -> asio::awaitable<Response> {
    auto page = OrderedPageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    store::Paged<store::Session> sessions;
    // A guest's pages hold only the sessions its token opened, full, and its cursors are its own.
    auto opened_by = access::ListedOpenedBy(req.principal);
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(req.principal.tenant_id, req.Param("id")).status());
      if (!opened_by) return Status::Ok();
      KEEL_ASSIGN_OR_RETURN(
          sessions,
          tx.sessions().ListSessions(req.principal.tenant_id, req.Param("id"), *page, *opened_by));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ListJson(sessions, SessionJson));
  });

  router.Add("GET", "/v1/sessions/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    store::Session session;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(session, access::UsableSession(tx, req.principal, req.Param("id")));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, SessionJson(session));
  });

  // Closing and reopening: {"status": "inactive" | "idle"}.
  router.Add("PATCH", "/v1/sessions/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"status"}); !st.ok()) co_return Response::Error(st);
    auto status = ReqString(*body, "status");
    if (!status.ok()) co_return Response::Error(status.status());
    if (*status != "inactive" && *status != "idle") {
      co_return Response::Error(InvalidArgument("status must be 'inactive' (close) or 'idle' (reopen)"));
    }
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    store::Session session;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(session, access::UsableSession(tx, req.principal, id));
      KEEL_ASSIGN_OR_RETURN(bool busy, tx.runs().SessionBusy(tenant, id));
      if (busy && *status == "inactive") {
        return Conflict("session " + id + " has a run in flight; cancel it or wait");
      }
      if (*status == "idle" && session.status != "inactive") {
        return Conflict("session " + id + " is not inactive (it is " + session.status + ")");
      }
      session.status = *status;
      session.updated_at = NowMillis();
      KEEL_RETURN_IF_ERROR(tx.sessions().UpdateSessionStatus(tenant, id, *status, session.updated_at));
      tx.Carry("sessions", store::SessionStatusImage(id, *status, session.updated_at));
      return tx.events()
          .Append({tenant, *status == "inactive" ? "session.closed@v1" : "session.reopened@v1",
                   session.agent_id, id, "", {}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    Json changed = {{"agent_id", session.agent_id}, {"session_id", id}, {"title", session.title}};
    std::string family = *status == "inactive" ? "session.closed" : "session.opened";
    co_await ctx.runtime.EmitFor(tenant, session.agent_id, family, std::move(changed));
    co_return Response::Json(200, SessionJson(session));
  });

  router.Add("POST", "/v1/sessions/{id}/messages", [&ctx](Request& req) -> asio::awaitable<Response> {
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"content"}); !st.ok()) co_return Response::Error(st);
    auto content = ReqString(*body, "content");
    if (!content.ok()) co_return Response::Error(content.status());
    auto wait = WaitSeconds(req);
    if (!wait.ok()) co_return Response::Error(wait.status());
    // Whether the caller may use the session is checked by intake, in its own read.
    runtime::IntakeRequest intake;
    intake.tenant_id = req.principal.tenant_id;
    intake.session_id = req.Param("id");
    intake.content = *content;
    intake.idempotency_key = req.Header("idempotency-key");
    if (auto st = CheckClientIdempotencyKey(intake.idempotency_key); !st.ok()) {
      co_return Response::Error(st);
    }
    intake.requested_by = req.principal.token_id;
    intake.caller_role = req.principal.role;
    intake.answered_after_run = *wait > 0;
    auto result = co_await ctx.runtime.PostMessage(intake);
    if (!result.ok()) co_return IntakeError(result.status());
    store::Run run = std::move(result->run);
    int status = 202;
    if (*wait > 0) {
      auto waited = co_await WaitForRun(ctx, std::move(run), *wait, !result->replayed);
      if (!waited.ok()) co_return Response::Error(waited.status());
      run = std::move(*waited);
      status = 200;
    }
    Json out = {{"message", MessageJson(result->message)}, {"run", RunJson(run)}};
    if (result->replayed) out["replayed"] = true;
    co_return Response::Json(status, out);
  });

  router.Add("GET", "/v1/sessions/{id}/messages", [&ctx](Request& req) -> asio::awaitable<Response> {
    auto page = PageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    store::Paged<store::Message> messages;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(access::UsableSession(tx, req.principal, req.Param("id")).status());
      KEEL_ASSIGN_OR_RETURN(messages, tx.messages().ListMessages(req.principal.tenant_id,
                                                                 req.Param("id"), *page));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ListJson(messages, MessageJson));
  });
}

}  // namespace keel::api

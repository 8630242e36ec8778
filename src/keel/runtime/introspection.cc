// Introspection's triggers (docs/CONTEXT.md): every N user turns, checked when a turn ends, and
// a session idle for a while, kept as a due time in the store and fired by the leader. Either
// posts an introspection run into the session through the normal intake, so it is queued,
// leased, resumed and recorded like any run.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "keel/access/access.h"
#include "keel/common/log.h"
#include "keel/runtime/context.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/introspection_store.h"

namespace keel::runtime {

namespace asio = boost::asio;

std::string IntrospectionTrigger(const std::string& content) {
  auto parsed = ParseJson(content);
  if (parsed.ok() && parsed->is_object() && parsed->contains("trigger") &&
      (*parsed)["trigger"].is_string() && !(*parsed)["trigger"].get<std::string>().empty()) {
    return (*parsed)["trigger"].get<std::string>();
  }
  return "introspection";
}

Json RunTools(const Json& agent_tools, bool introspection) {
  return introspection ? Json::array({"introspection.*", "memory.search", "memory.upsert"})
                       : agent_tools;
}

Status Runtime::IntrospectionCompleted(store::Tx& tx, const store::Run& run,
                                       const std::string& trigger) {
  KEEL_ASSIGN_OR_RETURN(auto session, tx.sessions().GetSession(run.tenant_id, run.session_id));
  return tx.events().Append({run.tenant_id,
                             "introspection.completed@v1",
                             run.agent_id,
                             run.session_id,
                             run.id,
                             {{"trigger", trigger}, {"description", session.description}}});
}

void Runtime::TurnEnded(const store::Run& run) {
  asio::co_spawn(executor_, AfterTurn(run), ReportExceptions{"introspection trigger"});
}

asio::awaitable<void> Runtime::AfterTurn(store::Run run) {
  ContextSettings settings;
  int64_t turns = 0;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto agent, tx.agents().GetAgent(run.tenant_id, run.agent_id));
    KEEL_ASSIGN_OR_RETURN(settings, ContextSettingsOf(agent.config));
    if (settings.every_turns > 0) {
      KEEL_ASSIGN_OR_RETURN(
          turns, tx.introspection().TurnsSinceIntrospection(run.tenant_id, run.session_id));
    }
    return Status::Ok();
  });
  if (!read.ok()) co_return;  // a deleted agent, a store failure: no introspection this time
  if (settings.idle_seconds > 0) {
    store::IntrospectionDue due{run.tenant_id, run.session_id, run.agent_id,
                                NowMillis() + settings.idle_seconds * 1000};
    store::WriteFn put = [due](store::Tx& tx) -> Status {
      return tx.introspection().PutIntrospectionDue(due);
    };
    (void)co_await store::AsyncWrite(store_, std::move(put));
  }
  if (settings.every_turns > 0 && turns >= settings.every_turns) {
    // Keyed by the turn that reached the count: posted once, whatever retries.
    std::string trigger = "every_turns";
    std::string key = "introspection:" + run.message_id;
    co_await Introspect(run.tenant_id, run.session_id, trigger, key);
  }
}

asio::awaitable<void> Runtime::Introspect(std::string tenant_id, std::string session_id,
                                          std::string trigger, std::string key) {
  // Introspection acts on the session's content, so it has the rights of the least privileged
  // author of that content. A guest may write no memory, so a session holding a guest's message
  // is not introspected at all (rather than running a turn whose every write is refused).
  std::string role;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(role, access::LeastPrivilegedAuthor(tx, tenant_id, session_id));
    return Status::Ok();
  });
  if (!read.ok()) co_return;
  if (role == "guest") {
    LogInfo("introspection of session " + session_id + " (" + trigger +
            ") not started: a guest wrote to it, and a guest's turns may not write memory");
    co_return;
  }
  IntakeRequest req;
  req.tenant_id = tenant_id;
  req.session_id = session_id;
  req.content = DumpJson(Json{{"trigger", trigger}});
  req.idempotency_key = key;
  req.requested_by = "system";
  req.caller_role = role;
  req.introspection = true;
  auto posted = co_await PostMessage(req);
  if (!posted.ok()) {
    LogInfo("introspection of session " + session_id + " (" + trigger +
            ") not started: " + posted.status().message());
  }
}

asio::awaitable<void> Runtime::IntrospectionLoop() {
  asio::steady_timer timer(executor_);
  while (!dispatcher_->draining()) {
    timer.expires_after(std::chrono::seconds(1));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (dispatcher_->draining() || !store_.leader()) continue;  // one node fires them
    std::vector<store::IntrospectionDue> due;
    Millis now = NowMillis();
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(due, tx.introspection().DueIntrospections(now, 100));
      return Status::Ok();
    });
    if (!read.ok()) continue;
    for (const auto& d : due) {
      // Only a session at rest with turns since its last introspection: a run in flight moves
      // the due time when it ends, and nothing new needs no second look.
      bool busy = true;
      int64_t turns = 0;
      Status checked = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(busy, tx.runs().SessionBusy(d.tenant_id, d.session_id));
        KEEL_ASSIGN_OR_RETURN(
            turns, tx.introspection().TurnsSinceIntrospection(d.tenant_id, d.session_id));
        return Status::Ok();
      });
      if (!checked.ok()) continue;
      if (!busy && turns > 0) {
        std::string trigger = "idle";
        std::string key = "introspection:idle:" + std::to_string(d.due_at);
        co_await Introspect(d.tenant_id, d.session_id, trigger, key);
      }
      store::IntrospectionDue done = d;
      store::WriteFn clear = [done](store::Tx& tx) -> Status {
        return tx.introspection().ClearIntrospectionDue(done.tenant_id, done.session_id,
                                                        done.due_at);
      };
      (void)co_await store::AsyncWrite(store_, std::move(clear));
    }
  }
}

}  // namespace keel::runtime

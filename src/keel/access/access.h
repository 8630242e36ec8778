#pragma once
// Access: the role table of docs/API.md ("Roles") in code. It is the one place that decides
// what a token reaches of its tenant's sessions, runs and events, and what becomes of the
// authority a token lent to work that acts later (schedules, standing approvals, queued runs)
// once that token is revoked. Routes, both stream transports, the run executor and
// introspection ask here; none of them decides on its own.
//
// The rules, in short:
//  - owners and users reach every session of the tenant, with every field of every event;
//  - a guest reaches only the sessions it opened (their messages, runs, steps, compactions and
//    events), sees no tenant- or agent-level events, and never the arguments of a tool call or
//    an approval (in events and tool steps); another session is "not found", as another
//    tenant's would be;
//  - an MCP session (Mcp-Session-Id) serves only the token that opened it, whatever its role;
//  - a revoked token's schedules are suspended, its standing approvals revoked, and a run it
//    asked for that had not started (or was parked) fails when a node claims it;
//  - a run that acts on a session's content (introspection) has the rights of the least
//    privileged author of that content, and a session with a guest's message is not
//    introspected at all.
//
// Stateless functions, except SessionScope, which belongs to one request or stream and is used
// from one coroutine at a time.

#include <map>
#include <optional>
#include <string>

#include "keel/common/status.h"
#include "keel/http/types.h"
#include "keel/store/store.h"

namespace keel::access {

// Owners and users may read and act on (post to, close, reopen, cancel the runs of) every
// session of the tenant; a guest only on the sessions it opened.
bool CanUseSession(const http::Principal& p, const store::Session& s);

// The sessions a list of sessions or runs holds for `p`, for the store's statement: "" every
// session (owners, users), a token's id only the sessions that token opened (a guest), nullopt
// none (a guest without a token id opened none).
std::optional<std::string> ListedOpenedBy(const http::Principal& p);

// Inside a unit of work: the session (or run, through its session) when `p` may use it;
// kNotFound "session not found: ID" ("run not found: ID") when it does not exist or `p` may
// not use it, so a guest learns nothing of the sessions it may not reach.
Result<store::Session> UsableSession(store::Tx& tx, const http::Principal& p,
                                     const std::string& id);
Result<store::Run> UsableRun(store::Tx& tx, const http::Principal& p, const std::string& id);

// An MCP session serves only the token that opened it (with `initialize` on /v1/mcp).
bool CanUseMcpSession(const http::Principal& p, const store::Session& s);

// What one caller sees of the tenant's event log, live deltas and run lists. Remembers the
// sessions it looked up (a bounded number), so a long stream reads each session once.
class SessionScope {
 public:
  explicit SessionScope(http::Principal p);

  // Whether the caller sees what belongs to `session_id` ("" = tenant- or agent-level).
  Result<bool> Sees(store::Tx& tx, const std::string& session_id);
  // The answer Sees gave before, or nullopt when it has not been asked for this session.
  std::optional<bool> Known(const std::string& session_id) const;
  // The event as the caller may see it (redacted for a guest), or nullopt when it sees none of
  // it.
  Result<std::optional<store::Event>> Visible(store::Tx& tx, const store::Event& e);

 private:
  http::Principal p_;
  std::map<std::string, bool> sessions_;
};

// A run step as the caller may see it: a guest's tool steps show no arguments (an owner may
// have amended them when approving).
store::Step VisibleStep(const http::Principal& p, store::Step step);

// Inside the unit of work that revokes `token_id`: withdraws what the token lent to work that
// acts later. Its active and paused schedules become `suspended` (schedule.suspended@v1) and
// fire no more until an owner reassigns them; its standing approvals are revoked
// (standing_approval.revoked@v1).
Status WithdrawAuthority(store::Tx& tx, const std::string& tenant_id, const std::string& token_id,
                         Millis at);

// Whether `token_id` names a revoked token of the tenant. Ids that name no token ("system",
// "") are not revoked: they are the runtime's own.
Result<bool> Revoked(store::Tx& tx, const std::string& tenant_id, const std::string& token_id);

// The active token `token_id` of the tenant, for handing it a schedule; kInvalidArgument when
// it is unknown or revoked.
Result<store::Token> ActiveToken(store::Tx& tx, const std::string& tenant_id,
                                 const std::string& token_id);

// The least privileged role among the callers whose runs wrote the session's content:
// "guest", "user" or "owner" ("owner" for a session with no such run).
Result<std::string> LeastPrivilegedAuthor(store::Tx& tx, const std::string& tenant_id,
                                          const std::string& session_id);

// The text of a suspended schedule's `suspended_reason`.
std::string SuspendedReason(const std::string& token_id);

}  // namespace keel::access

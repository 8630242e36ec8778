#include "keel/access/access.h"

#include "keel/store/row_images.h"
#include "keel/store/schedule_store.h"

namespace keel::access {

namespace {

constexpr size_t kRememberedSessions = 4096;  // per SessionScope; then it forgets and re-reads

bool IsGuest(const http::Principal& p) { return p.role == "guest"; }

// A role nobody knows counts as the least.
int Rank(const std::string& role) {
  if (role == "owner") return 2;
  if (role == "user") return 1;
  return 0;
}

// The event types whose payload carries tool-call arguments (a guest sees them without).
bool CarriesArguments(const std::string& type) {
  return type.rfind("approval.requested@", 0) == 0 || type.rfind("approval.decided@", 0) == 0 ||
         type.rfind("tool.call.started@", 0) == 0;
}

}  // namespace

bool CanUseSession(const http::Principal& p, const store::Session& s) {
  if (s.tenant_id != p.tenant_id) return false;
  if (!IsGuest(p)) return true;
  return !s.created_by.empty() && s.created_by == p.token_id;
}

std::optional<std::string> ListedOpenedBy(const http::Principal& p) {
  if (!IsGuest(p)) return std::string();
  if (p.token_id.empty()) return std::nullopt;
  return p.token_id;
}

Result<store::Session> UsableSession(store::Tx& tx, const http::Principal& p,
                                     const std::string& id) {
  KEEL_ASSIGN_OR_RETURN(store::Session s, tx.sessions().GetSession(p.tenant_id, id));
  if (!CanUseSession(p, s)) return NotFound("session not found: " + id);
  return s;
}

Result<store::Run> UsableRun(store::Tx& tx, const http::Principal& p, const std::string& id) {
  KEEL_ASSIGN_OR_RETURN(store::Run run, tx.runs().GetRun(p.tenant_id, id));
  if (IsGuest(p)) {
    auto s = UsableSession(tx, p, run.session_id);
    if (!s.ok()) {
      if (s.status().code() == Code::kNotFound) return NotFound("run not found: " + id);
      return s.status();
    }
  }
  return run;
}

bool CanUseMcpSession(const http::Principal& p, const store::Session& s) {
  return s.tenant_id == p.tenant_id && !s.created_by.empty() && s.created_by == p.token_id;
}

SessionScope::SessionScope(http::Principal p) : p_(std::move(p)) {}

Result<bool> SessionScope::Sees(store::Tx& tx, const std::string& session_id) {
  if (!IsGuest(p_)) return true;
  if (session_id.empty()) return false;
  if (auto known = Known(session_id)) return *known;
  auto s = tx.sessions().GetSession(p_.tenant_id, session_id);
  if (!s.ok() && s.status().code() != Code::kNotFound) return s.status();
  bool sees = s.ok() && CanUseSession(p_, *s);
  if (sessions_.size() >= kRememberedSessions) sessions_.clear();
  sessions_[session_id] = sees;
  return sees;
}

std::optional<bool> SessionScope::Known(const std::string& session_id) const {
  if (!IsGuest(p_)) return true;
  if (session_id.empty()) return false;
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return std::nullopt;
  return it->second;
}

Result<std::optional<store::Event>> SessionScope::Visible(store::Tx& tx, const store::Event& e) {
  KEEL_ASSIGN_OR_RETURN(bool sees, Sees(tx, e.session_id));
  if (!sees) return std::optional<store::Event>();
  store::Event out = e;
  if (IsGuest(p_) && CarriesArguments(e.type) && out.payload.is_object()) {
    out.payload.erase("arguments");
    out.payload.erase("original_arguments");
  }
  return std::optional<store::Event>(std::move(out));
}

store::Step VisibleStep(const http::Principal& p, store::Step step) {
  if (IsGuest(p) && step.kind == "tool" && step.input.is_object()) {
    step.input.erase("arguments");
    step.input.erase("original_arguments");
  }
  return step;
}

Status WithdrawAuthority(store::Tx& tx, const std::string& tenant_id, const std::string& token_id,
                         Millis at) {
  store::Page page{"", 500};
  while (true) {
    KEEL_ASSIGN_OR_RETURN(auto found, tx.schedules().ListSchedules(tenant_id, "", page));
    for (auto& s : found.items) {
      if (s.created_by != token_id || (s.status != "active" && s.status != "paused")) continue;
      s.status = "suspended";
      s.updated_at = at;
      KEEL_RETURN_IF_ERROR(tx.schedules().UpdateSchedule(s));
      tx.Carry("schedules", store::RowImage(s));
      KEEL_RETURN_IF_ERROR(tx.events().Append({tenant_id,
                                               "schedule.suspended@v1",
                                               s.agent_id,
                                               s.session_id,
                                               "",
                                               {{"schedule_id", s.id},
                                                {"token_id", token_id},
                                                {"reason", SuspendedReason(token_id)}}}));
    }
    if (found.next_cursor.empty()) break;
    page.cursor = found.next_cursor;
  }
  KEEL_ASSIGN_OR_RETURN(auto standing, tx.approvals().ListStanding(tenant_id));
  for (const auto& s : standing) {
    if (s.created_by != token_id || s.revoked_at || s.expires_at <= at) continue;
    KEEL_RETURN_IF_ERROR(tx.approvals().RevokeStanding(tenant_id, s.id, at));
    tx.Carry("standing_approvals", store::ColumnsImage({{"id", s.id}, {"revoked_at", at}}));
    KEEL_RETURN_IF_ERROR(tx.events().Append({tenant_id,
                                             "standing_approval.revoked@v1",
                                             "",
                                             "",
                                             "",
                                             {{"standing_approval_id", s.id},
                                              {"token_id", token_id}}}));
  }
  return Status::Ok();
}

Result<bool> Revoked(store::Tx& tx, const std::string& tenant_id, const std::string& token_id) {
  if (token_id.empty()) return false;
  auto token = tx.tokens().GetToken(tenant_id, token_id);
  if (!token.ok()) {
    if (token.status().code() == Code::kNotFound) return false;  // not a token of the tenant's
    return token.status();
  }
  return token->revoked_at.has_value();
}

Result<store::Token> ActiveToken(store::Tx& tx, const std::string& tenant_id,
                                 const std::string& token_id) {
  auto t = tx.tokens().GetToken(tenant_id, token_id);
  if (!t.ok()) {
    if (t.status().code() != Code::kNotFound) return t.status();
    return InvalidArgument("field 'token_id': no token " + token_id + " in this tenant");
  }
  if (t->revoked_at) return InvalidArgument("field 'token_id': token " + token_id + " is revoked");
  return *t;
}

Result<std::string> LeastPrivilegedAuthor(store::Tx& tx, const std::string& tenant_id,
                                          const std::string& session_id) {
  std::string least = "owner";
  store::Page page{"", 500};
  while (true) {
    KEEL_ASSIGN_OR_RETURN(auto runs,
                          tx.runs().ListRuns(tenant_id, {.session_id = session_id}, page));
    for (const auto& r : runs.items) {
      if (Rank(r.caller_role) < Rank(least)) least = Rank(r.caller_role) == 1 ? "user" : "guest";
      if (least == "guest") return least;
    }
    if (runs.next_cursor.empty()) return least;
    page.cursor = runs.next_cursor;
  }
}

std::string SuspendedReason(const std::string& token_id) {
  return "the token it acts for (" + token_id +
         ") was revoked; an owner can hand it to another token with PATCH /v1/schedules/{id} "
         "{\"token_id\": ...} (keel schedule reassign)";
}

}  // namespace keel::access

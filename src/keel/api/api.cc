#include "keel/api/api.h"

#include <algorithm>

#include "keel/access/users.h"
#include "keel/api/render.h"
#include "keel/common/crypto.h"
#include "keel/store/async.h"
#include "keel/store/channel_store.h"
#include "keel/store/memory_store.h"
#include "keel/store/row_images.h"
#include "keel/store/schedule_store.h"
#include "keel/store/store.h"

namespace keel::api {

Json TenantJson(const store::Tenant& t) {
  return {{"id", t.id},
          {"name", t.name},
          {"created_at", FormatRfc3339(t.created_at)},
          {"settings", {{"allow_host_exec", t.allow_host_exec},
                        {"allow_stdio_mcp", t.allow_stdio_mcp}}}};
}

Json TokenJson(const store::Token& t) {
  return {{"id", t.id},
          {"name", t.name},
          {"role", t.role},
          {"created_at", FormatRfc3339(t.created_at)},
          {"revoked_at", t.revoked_at ? Json(FormatRfc3339(*t.revoked_at)) : Json(nullptr)},
          {"parent_id", t.parent_id.empty() ? Json(nullptr) : Json(t.parent_id)},
          {"expires_at", t.expires_at ? Json(FormatRfc3339(*t.expires_at)) : Json(nullptr)},
          {"user_id", t.user_id.empty() ? Json(nullptr) : Json(t.user_id)}};
}

Json AgentJson(const store::Agent& a) {
  return {{"id", a.id},
          {"name", a.name},
          {"model", a.model},
          {"instructions", a.instructions},
          {"tools", a.tools},
          {"config", a.config},
          {"status", a.status},
          {"created_at", FormatRfc3339(a.created_at)},
          {"updated_at", FormatRfc3339(a.updated_at)}};
}

Json SessionJson(const store::Session& s) {
  return {{"id", s.id},
          {"agent_id", s.agent_id},
          {"status", s.status},
          {"title", s.title},
          {"description", s.description},
          {"instructions", s.instructions},
          {"created_at", FormatRfc3339(s.created_at)},
          {"updated_at", FormatRfc3339(s.updated_at)}};
}

// The answers every turn makes are built member by member: an initializer list of pairs
// builds each pair as a JSON array and copies it, twice the work.
Json MessageJson(const store::Message& m) {
  Json j = Json::object();
  j["id"] = m.id;
  j["session_id"] = m.session_id;
  j["role"] = m.role;
  j["content"] = m.content;
  j["run_id"] = m.run_id;
  j["created_at"] = FormatRfc3339(m.created_at);
  return j;
}

namespace {
Json OptTime(const std::optional<Millis>& t) {
  return t ? Json(FormatRfc3339(*t)) : Json(nullptr);
}
}  // namespace

Json RunJson(const store::Run& r) {
  Json j = Json::object();
  j["id"] = r.id;
  j["session_id"] = r.session_id;
  j["agent_id"] = r.agent_id;
  j["message_id"] = r.message_id;
  j["status"] = r.status;
  j["attempt"] = r.attempt;
  j["output"] = r.status == "done" ? Json(r.output) : Json(nullptr);
  j["error"] = r.error;
  Json usage = Json::object();
  usage["input_tokens"] = r.input_tokens;
  usage["output_tokens"] = r.output_tokens;
  j["usage"] = std::move(usage);
  j["cancel_requested"] = r.cancel_requested;
  j["created_at"] = FormatRfc3339(r.created_at);
  j["started_at"] = OptTime(r.started_at);
  j["finished_at"] = OptTime(r.finished_at);
  return j;
}

Json StepJson(const store::Step& s, const store::ToolCall* call) {
  Json j = {{"id", s.id},
            {"seq", s.seq},
            {"kind", s.kind},
            {"status", s.status},
            {"input", s.input},
            {"output", s.output},
            {"started_at", FormatRfc3339(s.started_at)},
            {"finished_at", OptTime(s.finished_at)}};
  if (s.finished_at) j["duration_ms"] = *s.finished_at - s.started_at;
  if (call) {
    j["tool_call"] = {{"id", call->id},
                      {"call_id", call->call_id},
                      {"tool", call->tool},
                      {"effect_class", call->effect_class},
                      {"effect_key", call->effect_key},
                      {"status", call->status}};
  }
  return j;
}

Json EventJson(const store::Event& e) {
  auto opt = [](const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); };
  // The row images are the log's own record (store/row_images.h): no role sees them.
  Json payload = Json::object();
  if (e.payload.is_object()) {
    for (const auto& [key, value] : e.payload.items()) {
      if (key != store::kRowsField) payload[key] = value;
    }
  }
  return {{"position", e.position},
          {"id", e.id},
          {"type", e.type},
          {"origin", e.origin},
          {"origin_seq", e.origin_seq},
          {"agent_id", opt(e.agent_id)},
          {"session_id", opt(e.session_id)},
          {"run_id", opt(e.run_id)},
          {"payload", std::move(payload)},
          {"occurred_at", FormatRfc3339(e.occurred_at)}};
}

Result<store::Page> PageOf(const http::Request& req) {
  store::Page page;
  KEEL_ASSIGN_OR_RETURN(page.limit, LimitOf(req));
  page.cursor = req.Query("cursor");
  if (!page.cursor.empty() && store::DecodeCursor(page.cursor).empty()) {
    return InvalidArgument("cursor is not valid");
  }
  return page;
}

Result<store::Page> OrderedPageOf(const http::Request& req) {
  KEEL_ASSIGN_OR_RETURN(store::Page page, PageOf(req));
  const std::string order = req.Query("order", "asc");
  if (order != "asc" && order != "desc") {
    return InvalidArgument("order must be 'asc' (oldest first) or 'desc' (newest first), got '" +
                           order + "'");
  }
  page.newest_first = order == "desc";
  return page;
}

Result<int> LimitOf(const http::Request& req) {
  int out = 50;
  std::string limit = req.Query("limit");
  if (!limit.empty()) {
    int v = 0;
    size_t used = 0;
    try {
      v = std::stoi(limit, &used);
    } catch (...) {
      used = 0;
    }
    if (used != limit.size() || v < 1 || v > 500) {
      return InvalidArgument("limit must be an integer between 1 and 500, got '" + limit + "'");
    }
    out = v;
  }
  return out;
}

Status CheckFields(const Json& body, std::initializer_list<std::string_view> fields) {
  if (!body.is_object()) return Status::Ok();
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(fields.begin(), fields.end(), it.key()) != fields.end()) continue;
    std::string known;
    for (std::string_view f : fields) known += (known.empty() ? "" : ", ") + std::string(f);
    std::string key = it.key().size() <= 64 ? it.key() : it.key().substr(0, 64) + "...";
    return InvalidArgument("unknown field '" + key + "' (this body takes " +
                           (known.empty() ? std::string("no fields") : known) + ")");
  }
  return Status::Ok();
}

Status CheckClientIdempotencyKey(const std::string& key) {
  for (const char* kept : {"webhook:", "telegram:", "slack:", "discord:"}) {
    if (key.rfind(kept, 0) == 0) {
      return InvalidArgument("Idempotency-Key values starting with '" + std::string(kept) +
                             "' are kept for channel deliveries");
    }
  }
  return Status::Ok();
}

http::Response IntakeError(const Status& st) {
  http::Response r = http::Response::Error(st);
  if (st.code() == Code::kRateLimited || st.code() == Code::kUnavailable) {
    r.headers["Retry-After"] = "1";
  }
  return r;
}

Status RequireMember(const http::Request& req, const std::string& what) {
  if (req.principal.role == "guest") {
    return PermissionDenied("guests may not " + what + "; this needs an owner or user token");
  }
  return Status::Ok();
}

Status RequireOwner(const http::Request& req) {
  if (req.principal.role != "owner") {
    return PermissionDenied("this needs an owner token; this token's role is '" +
                            req.principal.role + "'");
  }
  return Status::Ok();
}

namespace {

// The agent a request concerns, by the object its path names first (an agent, or a session,
// run, approval, channel, schedule or memory of one): its id and what the path calls it, or ""
// for a route of the whole tenant (or an object that does not exist: its route says so).
Result<std::pair<std::string, std::string>> AgentOfRequest(store::Tx& tx, const std::string& tenant,
                                                           const http::Request& req) {
  std::string_view path = req.path;
  auto it = req.params.find("id");
  const std::string id = it == req.params.end() ? "" : it->second;
  auto under = [&](std::string_view prefix) { return !id.empty() && path.starts_with(prefix); };
  auto found = [](auto r, std::string kind) -> Result<std::pair<std::string, std::string>> {
    if (r.status().code() == Code::kNotFound) return std::pair<std::string, std::string>();
    KEEL_RETURN_IF_ERROR(r.status());
    return std::pair(r->agent_id, std::move(kind));
  };
  if (under("/v1/agents/")) return std::pair(id, std::string("agent"));
  if (under("/v1/sessions/")) return found(tx.sessions().GetSession(tenant, id), "session");
  if (under("/v1/runs/")) return found(tx.runs().GetRun(tenant, id), "run");
  if (under("/v1/approvals/")) return found(tx.approvals().GetApproval(tenant, id), "approval");
  if (under("/v1/channels/")) return found(tx.channels().GetChannel(tenant, id), "channel");
  if (under("/v1/schedules/")) return found(tx.schedules().GetSchedule(tenant, id), "schedule");
  auto memory = req.params.find("memory");
  if (path.starts_with("/v1/memories/") && memory != req.params.end()) {
    return found(tx.memory().FindMemory(tenant, memory->second), "memory");
  }
  return std::pair<std::string, std::string>();
}

}  // namespace

http::Authenticator MakeAuthenticator(ApiContext& ctx) {
  // The token by value: the coroutine must not refer to its caller's string.
  return [&ctx](std::string token,
                const http::Request& req) -> boost::asio::awaitable<Result<http::Principal>> {
    std::string hash = Sha256Hex(token);
    store::Token found;
    std::string user_id, role;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(found, tx.tokens().FindActiveTokenByHash(hash));
      user_id = found.user_id;
      role = found.role;
      // A dashboard sign-in holds only while the token it acts as does (a sign-in made as that
      // token was being revoked must not outlive it), and is its person's.
      if (!found.parent_id.empty()) {
        KEEL_ASSIGN_OR_RETURN(auto parent, tx.tokens().GetToken(found.tenant_id, found.parent_id));
        if (parent.revoked_at) return Unauthenticated("the sign-in's token is revoked");
        user_id = parent.user_id;
      }
      if (user_id.empty()) return Status::Ok();
      // A person's token: on the agent the request concerns, the lower of its role and the
      // person's there (no role there: nothing of that agent exists for it); elsewhere a
      // guest's reach.
      KEEL_ASSIGN_OR_RETURN(auto agent, AgentOfRequest(tx, found.tenant_id, req));
      if (agent.first.empty()) {
        role = access::LowerRole(role, "guest");
        return Status::Ok();
      }
      KEEL_ASSIGN_OR_RETURN(auto on, access::UserRoleOn(tx, found.tenant_id, user_id, agent.first));
      if (!on) {
        const std::string named = agent.second == "memory" ? req.Param("memory") : req.Param("id");
        return NotFound(agent.second + " not found: " + named);
      }
      role = access::LowerRole(role, *on);
      return Status::Ok();
    });
    if (st.code() == Code::kNotFound && found.id.empty()) {
      co_return Unauthenticated("invalid or revoked token");
    }
    if (!st.ok()) co_return st;
    if (found.expires_at && *found.expires_at <= NowMillis()) {
      co_return Unauthenticated("expired token: sign in again");
    }
    http::Principal p;
    p.tenant_id = found.tenant_id;
    // A dashboard sign-in acts as the token that signed in (its grants, its sessions, its
    // approvals' separate-approver check).
    p.token_id = found.parent_id.empty() ? found.id : found.parent_id;
    if (!found.parent_id.empty()) p.browser_session_id = found.id;
    p.role = role;
    p.user_id = user_id;
    // The platform admin's token is the tenant's, never a person's.
    p.platform_admin =
        found.role == "owner" && user_id.empty() && found.tenant_id == ctx.admin_tenant_id;
    co_return p;
  };
}

Status StillAuthorized(store::Tx& tx, const http::Principal& who, Millis now) {
  for (const std::string& id : {who.token_id, who.browser_session_id}) {
    if (id.empty()) continue;
    auto t = tx.tokens().GetToken(who.tenant_id, id);
    if (t.status().code() == Code::kNotFound) return Unauthenticated("the token is gone");
    KEEL_RETURN_IF_ERROR(t.status());
    if (t->revoked_at) return Unauthenticated("the token was revoked");
    if (t->expires_at && *t->expires_at <= now) return Unauthenticated("the sign-in expired");
  }
  return Status::Ok();
}

void RegisterAllRoutes(http::Router& router, ApiContext& ctx) {
  RegisterHealthRoutes(router, ctx);
  RegisterAdminRoutes(router, ctx);
  RegisterAgentRoutes(router, ctx);
  RegisterSessionRoutes(router, ctx);
  RegisterRunRoutes(router, ctx);
  RegisterEventRoutes(router, ctx);
  RegisterSecretRoutes(router, ctx);
  RegisterPolicyRoutes(router, ctx);
  RegisterApprovalRoutes(router, ctx);
  RegisterMcpRoutes(router, ctx);
  RegisterMcpServerRoutes(router, ctx);
  RegisterPluginRoutes(router, ctx);
  RegisterScheduleRoutes(router, ctx);
  RegisterUsageRoutes(router, ctx);
  RegisterMemoryRoutes(router, ctx);
  RegisterSkillRoutes(router, ctx);
  RegisterChannelRoutes(router, ctx);
  RegisterUserRoutes(router, ctx);
  RegisterContextRoutes(router, ctx);
  RegisterOpenAiRoutes(router, ctx);
  RegisterDashboardRoutes(router, ctx);
}

}  // namespace keel::api

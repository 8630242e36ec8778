// Users (docs/USERS.md): the people of a tenant and their identities on chat platforms, their
// roles on each agent, and each agent's access level. Owners change them; owners and users read
// users and members. An agent's access code is never shown after it is made.

#include "keel/access/users.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/secrets/vault.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"
#include "keel/store/user_store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

Json IdentityJson(const store::Identity& i) {
  return {{"platform", i.platform},
          {"platform_user_id", i.platform_user_id},
          {"name", i.name},
          {"created_at", FormatRfc3339(i.created_at)}};
}

Json UserJson(const store::User& u, const std::vector<store::Identity>& identities) {
  Json ids = Json::array();
  for (const auto& i : identities) ids.push_back(IdentityJson(i));
  return {{"id", u.id},
          {"name", u.name},
          {"merged_into", u.merged_into.empty() ? Json(nullptr) : Json(u.merged_into)},
          {"identities", std::move(ids)},
          {"created_at", FormatRfc3339(u.created_at)},
          {"updated_at", FormatRfc3339(u.updated_at)}};
}

Json MemberJson(const store::AgentMember& m, const std::string& name) {
  return {{"agent_id", m.agent_id},
          {"user_id", m.user_id},
          {"name", name},
          {"role", m.role},
          {"created_at", FormatRfc3339(m.created_at)},
          {"updated_at", FormatRfc3339(m.updated_at)}};
}

Json AccessJson(const std::string& agent_id, const std::optional<store::AgentAccess>& a) {
  return {{"agent_id", agent_id},
          {"level", a ? a->level : "private"},
          {"code_set", a && a->code_set},
          {"guest_daily_tokens", a ? a->guest_daily_tokens : store::kDefaultGuestDailyTokens},
          {"updated_at", a ? Json(FormatRfc3339(a->updated_at)) : Json(nullptr)}};
}

Result<std::string> UserName(const Json& body) {
  KEEL_ASSIGN_OR_RETURN(auto name, ReqString(body, "name"));
  size_t chars = 0;
  bool one_line = true;
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if ((c & 0xC0) != 0x80) ++chars;  // a character starts here
    one_line = one_line && c >= 0x20 && c != 0x7f;
    // U+0085 (next line), U+2028 (line separator), U+2029 (paragraph separator).
    one_line = one_line && name.compare(i, 2, "\xC2\x85") != 0 &&
               name.compare(i, 3, "\xE2\x80\xA8") != 0 && name.compare(i, 3, "\xE2\x80\xA9") != 0;
  }
  if (chars == 0 || chars > access::kMaxUserName || !one_line) {
    return InvalidArgument("name must be 1 to 200 characters on one line");
  }
  return name;
}

// A platform's id of a person: Telegram's and Discord's are numbers, Slack's letters and
// digits.
Status CheckIdentity(const std::string& platform, const std::string& id) {
  if (!access::ValidPlatform(platform)) {
    return InvalidArgument("platform must be telegram, slack or discord, got '" +
                           platform.substr(0, 32) + "'");
  }
  bool ok = !id.empty() && id.size() <= 64;
  for (char c : id) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-' || c == '.');
  }
  if (!ok) {
    return InvalidArgument(
        "platform_user_id must be 1 to 64 letters, digits, '_', '-' or '.' (the platform's id "
        "of the person, as Keel's refusal to them names it)");
  }
  return Status::Ok();
}

// The agent, when it exists and is not deleted.
Status LiveAgent(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id) {
  KEEL_ASSIGN_OR_RETURN(auto agent, tx.agents().GetAgent(tenant_id, agent_id));
  if (agent.status == "deleted") return NotFound("agent not found: " + agent_id);
  return Status::Ok();
}

// Links an identity to the user, inside a unit (identity.linked@v1).
Status Link(store::Tx& tx, const store::Identity& i) {
  KEEL_ASSIGN_OR_RETURN(auto held,
                        tx.users().FindIdentity(i.tenant_id, i.platform, i.platform_user_id));
  if (held) {
    return Conflict("identity " + i.platform + ":" + i.platform_user_id + " belongs to user " +
                    held->user_id +
                    " already (merge the two users, or "
                    "unlink it there first)");
  }
  KEEL_RETURN_IF_ERROR(tx.users().InsertIdentity(i));
  tx.Carry("identities", store::RowImage(i));
  return tx.events().Append({i.tenant_id,
                             "identity.linked@v1",
                             "",
                             "",
                             "",
                             {{"user_id", i.user_id},
                              {"platform", i.platform},
                              {"platform_user_id", i.platform_user_id}}});
}

// The user itself (merged ones too), for the routes that name one.
Result<store::User> NotMerged(store::Tx& tx, const std::string& tenant_id, const std::string& id) {
  KEEL_ASSIGN_OR_RETURN(auto user, tx.users().GetUser(tenant_id, id));
  if (!user.merged_into.empty()) {
    return InvalidArgument("user " + id + " was merged into " + user.merged_into +
                           ": use that user");
  }
  return user;
}

}  // namespace

void RegisterUserRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("POST", "/v1/users", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"name", "identities"}); !st.ok()) {
      co_return Response::Error(st);
    }
    auto name = UserName(*body);
    if (!name.ok()) co_return Response::Error(name.status());
    store::User u;
    u.id = NewId();
    u.tenant_id = req.principal.tenant_id;
    u.name = *name;
    u.created_at = u.updated_at = NowMillis();
    std::vector<store::Identity> identities;
    const Json list = body->value("identities", Json::array());
    if (!list.is_array() || list.size() > 16) {
      co_return Response::Error(InvalidArgument("identities must be an array of at most 16"));
    }
    for (const auto& item : list) {
      if (!item.is_object()) {
        co_return Response::Error(
            InvalidArgument("each identity is {\"platform\": ..., \"platform_user_id\": ...}"));
      }
      if (auto st = CheckFields(item, {"platform", "platform_user_id"}); !st.ok()) {
        co_return Response::Error(st);
      }
      auto platform = ReqString(item, "platform");
      if (!platform.ok()) co_return Response::Error(platform.status());
      auto id = ReqString(item, "platform_user_id");
      if (!id.ok()) co_return Response::Error(id.status());
      if (auto st = CheckIdentity(*platform, *id); !st.ok()) co_return Response::Error(st);
      for (const auto& seen : identities) {
        if (seen.platform == *platform && seen.platform_user_id == *id) {
          co_return Response::Error(
              InvalidArgument("identity " + *platform + ":" + *id + " is given twice"));
        }
      }
      identities.push_back({u.tenant_id, *platform, *id, u.id, "", u.created_at});
    }
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.users().InsertUser(u));
      tx.Carry("users", store::RowImage(u));
      KEEL_RETURN_IF_ERROR(tx.events().Append(
          {u.tenant_id, "user.created@v1", "", "", "", {{"user_id", u.id}, {"name", u.name}}}));
      for (const auto& i : identities) KEEL_RETURN_IF_ERROR(Link(tx, i));
      return Status::Ok();
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(201, UserJson(u, identities));
  });

  router.Add("GET", "/v1/users", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see users"); !st.ok()) co_return Response::Error(st);
    auto page = PageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    store::Paged<store::User> found;
    std::vector<std::vector<store::Identity>> identities;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(found, tx.users().ListUsers(req.principal.tenant_id, *page));
      for (const auto& u : found.items) {
        KEEL_ASSIGN_OR_RETURN(auto ids, tx.users().UserIdentities(u.tenant_id, u.id));
        identities.push_back(std::move(ids));
      }
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    size_t i = 0;
    co_return Response::Json(
        200, ListJson(found, [&](const store::User& u) { return UserJson(u, identities[i++]); }));
  });

  router.Add("GET", "/v1/users/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see users"); !st.ok()) co_return Response::Error(st);
    store::User u;
    std::vector<store::Identity> identities;
    std::vector<store::AgentMember> roles;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      const std::string& tenant = req.principal.tenant_id;
      KEEL_ASSIGN_OR_RETURN(u, tx.users().GetUser(tenant, req.Param("id")));
      KEEL_ASSIGN_OR_RETURN(identities, tx.users().UserIdentities(tenant, u.id));
      KEEL_ASSIGN_OR_RETURN(roles, tx.users().UserMemberships(tenant, u.id));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json out = UserJson(u, identities);
    out["roles"] = Json::array();
    for (const auto& m : roles)
      out["roles"].push_back({{"agent_id", m.agent_id}, {"role", m.role}});
    co_return Response::Json(200, out);
  });

  router.Add("PATCH", "/v1/users/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"name"}); !st.ok()) co_return Response::Error(st);
    auto name = UserName(*body);
    if (!name.ok()) co_return Response::Error(name.status());
    store::User u;
    std::vector<store::Identity> identities;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(u, tx.users().GetUser(req.principal.tenant_id, req.Param("id")));
      u.name = *name;
      u.updated_at = NowMillis();
      KEEL_RETURN_IF_ERROR(tx.users().UpdateUser(u));
      tx.Carry("users", store::RowImage(u));
      KEEL_ASSIGN_OR_RETURN(identities, tx.users().UserIdentities(u.tenant_id, u.id));
      return tx.events().Append(
          {u.tenant_id, "user.updated@v1", "", "", "", {{"user_id", u.id}, {"name", u.name}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, UserJson(u, identities));
  });

  router.Add("POST", "/v1/users/{id}/identities",
             [&ctx](Request& req) -> asio::awaitable<Response> {
               if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
               auto body = ParseJsonObject(req.body);
               if (!body.ok()) co_return Response::Error(body.status());
               if (auto st = CheckFields(*body, {"platform", "platform_user_id"}); !st.ok()) {
                 co_return Response::Error(st);
               }
               auto platform = ReqString(*body, "platform");
               if (!platform.ok()) co_return Response::Error(platform.status());
               auto id = ReqString(*body, "platform_user_id");
               if (!id.ok()) co_return Response::Error(id.status());
               if (auto st = CheckIdentity(*platform, *id); !st.ok()) {
                 co_return Response::Error(st);
               }
               store::Identity i{req.principal.tenant_id, *platform, *id,
                                 req.Param("id"),         "",        NowMillis()};
               auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
                 KEEL_RETURN_IF_ERROR(NotMerged(tx, i.tenant_id, i.user_id).status());
                 return Link(tx, i);
               });
               if (!written.ok()) co_return Response::Error(written.status());
               co_return Response::Json(201, IdentityJson(i));
             });

  router.Add("DELETE", "/v1/users/{id}/identities/{platform}/{platform_user_id}",
             [&ctx](Request& req) -> asio::awaitable<Response> {
               if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
               const std::string tenant = req.principal.tenant_id;
               const std::string platform = req.Param("platform");
               const std::string id = req.Param("platform_user_id");
               const std::string user_id = req.Param("id");
               auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
                 KEEL_ASSIGN_OR_RETURN(auto held, tx.users().FindIdentity(tenant, platform, id));
                 if (!held || held->user_id != user_id) {
                   return NotFound("identity not found: " + platform + ":" + id);
                 }
                 KEEL_RETURN_IF_ERROR(tx.users().DeleteIdentity(tenant, platform, id));
                 tx.Carry("identities", store::DeletedImage({{"tenant_id", tenant},
                                                             {"platform", platform},
                                                             {"platform_user_id", id}}));
                 return tx.events().Append(
                     {tenant,
                      "identity.unlinked@v1",
                      "",
                      "",
                      "",
                      {{"user_id", user_id}, {"platform", platform}, {"platform_user_id", id}}});
               });
               if (!written.ok()) co_return Response::Error(written.status());
               co_return Response::NoContent();
             });

  router.Add("POST", "/v1/users/{id}/merge", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"from"}); !st.ok()) co_return Response::Error(st);
    auto from = ReqString(*body, "from");
    if (!from.ok()) co_return Response::Error(from.status());
    store::User u;
    std::vector<store::Identity> identities;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      const std::string& tenant = req.principal.tenant_id;
      KEEL_RETURN_IF_ERROR(access::MergeUsers(tx, tenant, *from, req.Param("id"), NowMillis()));
      KEEL_ASSIGN_OR_RETURN(u, tx.users().GetUser(tenant, req.Param("id")));
      KEEL_ASSIGN_OR_RETURN(identities, tx.users().UserIdentities(tenant, u.id));
      return Status::Ok();
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, UserJson(u, identities));
  });

  router.Add("GET", "/v1/agents/{id}/members", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see an agent's members"); !st.ok()) {
      co_return Response::Error(st);
    }
    auto page = PageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    store::Paged<store::AgentMember> found;
    std::vector<std::string> names;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      const std::string& tenant = req.principal.tenant_id;
      KEEL_RETURN_IF_ERROR(LiveAgent(tx, tenant, req.Param("id")));
      KEEL_ASSIGN_OR_RETURN(found, tx.users().ListMembers(tenant, req.Param("id"), *page));
      for (const auto& m : found.items) {
        KEEL_ASSIGN_OR_RETURN(auto user, tx.users().GetUser(tenant, m.user_id));
        names.push_back(user.name);
      }
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    size_t i = 0;
    co_return Response::Json(200, ListJson(found, [&](const store::AgentMember& m) {
                               return MemberJson(m, names[i++]);
                             }));
  });

  router.Add(
      "PUT", "/v1/agents/{id}/members/{user}", [&ctx](Request& req) -> asio::awaitable<Response> {
        if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
        auto body = ParseJsonObject(req.body);
        if (!body.ok()) co_return Response::Error(body.status());
        if (auto st = CheckFields(*body, {"role"}); !st.ok()) co_return Response::Error(st);
        auto role = ReqString(*body, "role");
        if (!role.ok()) co_return Response::Error(role.status());
        if (!access::ValidRole(*role)) {
          co_return Response::Error(InvalidArgument("role must be owner, user or guest, got '" +
                                                    role->substr(0, 32) + "'"));
        }
        const std::string tenant = req.principal.tenant_id;
        const std::string agent_id = req.Param("id");
        std::optional<store::AgentMember> member;
        std::string name;
        auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
          KEEL_RETURN_IF_ERROR(LiveAgent(tx, tenant, agent_id));
          KEEL_ASSIGN_OR_RETURN(auto user, NotMerged(tx, tenant, req.Param("user")));
          name = user.name;
          KEEL_RETURN_IF_ERROR(
              access::SetMember(tx, tenant, agent_id, user.id, *role, NowMillis()));
          KEEL_ASSIGN_OR_RETURN(member, tx.users().GetMember(tenant, agent_id, user.id));
          return Status::Ok();
        });
        if (!written.ok()) co_return Response::Error(written.status());
        co_return Response::Json(200, MemberJson(*member, name));
      });

  router.Add("DELETE", "/v1/agents/{id}/members/{user}",
             [&ctx](Request& req) -> asio::awaitable<Response> {
               if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
               const std::string tenant = req.principal.tenant_id;
               const std::string agent_id = req.Param("id");
               const std::string user_id = req.Param("user");
               auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
                 KEEL_RETURN_IF_ERROR(LiveAgent(tx, tenant, agent_id));
                 KEEL_RETURN_IF_ERROR(tx.users().DeleteMember(tenant, agent_id, user_id));
                 tx.Carry("agent_members", store::DeletedImage({{"tenant_id", tenant},
                                                                {"agent_id", agent_id},
                                                                {"user_id", user_id}}));
                 return tx.events().Append(
                     {tenant, "agent.member_removed@v1", agent_id, "", "", {{"user_id", user_id}}});
               });
               if (!written.ok()) co_return Response::Error(written.status());
               co_return Response::NoContent();
             });

  router.Add("GET", "/v1/agents/{id}/access", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see an agent's access level"); !st.ok()) {
      co_return Response::Error(st);
    }
    std::optional<store::AgentAccess> found;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(LiveAgent(tx, req.principal.tenant_id, req.Param("id")));
      KEEL_ASSIGN_OR_RETURN(found, tx.users().GetAccess(req.principal.tenant_id, req.Param("id")));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, AccessJson(req.Param("id"), found));
  });

  router.Add("PUT", "/v1/agents/{id}/access", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"level", "code", "new_code", "guest_daily_tokens"});
        !st.ok()) {
      co_return Response::Error(st);
    }
    if (body->empty()) {
      co_return Response::Error(
          InvalidArgument("nothing to change: give level, guest_daily_tokens, code or new_code"));
    }
    std::optional<std::string> level;  // absent: as it was
    if (body->contains("level")) {
      auto given = ReqString(*body, "level");
      if (!given.ok()) co_return Response::Error(given.status());
      if (!access::ValidAccessLevel(*given)) {
        co_return Response::Error(InvalidArgument(
            "level must be public, protected or private, got '" + given->substr(0, 32) + "'"));
      }
      level = *given;
    }
    std::optional<int64_t> allowance;  // absent: as it was
    if (body->contains("guest_daily_tokens")) {
      const Json& n = (*body)["guest_daily_tokens"];
      if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > 1'000'000'000'000) {
        co_return Response::Error(InvalidArgument(
            "guest_daily_tokens must be a whole number from 0 (no allowance) to 10^12"));
      }
      allowance = n.get<int64_t>();
    }
    if (body->contains("new_code") && !(*body)["new_code"].is_boolean()) {
      co_return Response::Error(InvalidArgument("new_code must be true or false"));
    }
    const bool new_code = body->value("new_code", false);
    std::optional<std::string> code;
    if (body->contains("code")) {
      auto given = ReqString(*body, "code");
      if (!given.ok()) co_return Response::Error(given.status());
      if (auto st = access::CheckAccessCode(*given); !st.ok()) co_return Response::Error(st);
      if (new_code) {
        co_return Response::Error(InvalidArgument("give a code or ask for a new_code, not both"));
      }
      code = *given;
    }
    const std::string tenant = req.principal.tenant_id;
    const std::string agent_id = req.Param("id");
    std::optional<store::AgentAccess> access;
    std::string made;  // a code Keel made, shown this once
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(LiveAgent(tx, tenant, agent_id));
      KEEL_ASSIGN_OR_RETURN(auto before, tx.users().GetAccess(tenant, agent_id));
      store::AgentAccess a;
      a.tenant_id = tenant;
      a.agent_id = agent_id;
      a.level = level ? *level : before ? before->level : "private";
      a.code_set = before && before->code_set;
      a.guest_daily_tokens = allowance ? *allowance
                             : before  ? before->guest_daily_tokens
                                       : store::kDefaultGuestDailyTokens;
      // A protected agent without a code would let no one in: it gets one.
      if (new_code || (a.level == "protected" && !a.code_set && !code)) {
        made = access::NewAccessCode();
        code = made;
      }
      if (code) {
        // Sealed as every secret is (no key-encryption key: refused, nothing written).
        KEEL_RETURN_IF_ERROR(
            ctx.vault.Put(tx, tenant, access::AccessCodeSecret(agent_id), *code, NowMillis())
                .status());
        a.code_set = true;
      }
      a.updated_at = NowMillis();
      KEEL_RETURN_IF_ERROR(tx.users().PutAccess(a));
      tx.Carry("agent_access", store::RowImage(a));
      access = a;
      return tx.events().Append({tenant,
                                 "agent.access_changed@v1",
                                 agent_id,
                                 "",
                                 "",
                                 {{"level", a.level},
                                  {"code_changed", code.has_value()},
                                  {"guest_daily_tokens", a.guest_daily_tokens}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    Json out = AccessJson(agent_id, access);
    if (!made.empty()) out["code"] = made;
    co_return Response::Json(200, out);
  });
}

}  // namespace keel::api

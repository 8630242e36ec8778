// Skills: register (POST, again to replace), list, show, delete; assign to and unassign from an
// agent, and list an agent's skills. Owners change things; owners and users may look. A skill is
// checked whole when registered (skills::SkillOf): a refused one writes nothing. Agents see a
// change at their next turn.

#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/time.h"
#include "keel/skills/skills.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/skill_store.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

// A registration's files: `files` as given, with SKILL.md written from `body` when the body
// has one. `body` is SKILL.md's text: whole (front matter and all) when neither `name` nor
// `description` is given, else its instructions, under front matter made of those two.
Result<Json> FilesOf(const Json& body) {
  Json files = body.contains("files") ? body["files"] : Json::object();
  if (!files.is_object()) return InvalidArgument("field 'files' must be an object");
  const bool named = body.contains("name") || body.contains("description");
  if (!body.contains("body")) {
    if (named) return InvalidArgument("'name' and 'description' go with 'body', SKILL.md's text");
    if (!body.contains("files")) return InvalidArgument("field 'files' (or 'body') is required");
    return files;
  }
  if (!body["body"].is_string()) return InvalidArgument("field 'body' must be a string");
  if (files.contains("SKILL.md")) {
    return InvalidArgument("SKILL.md is given twice: as 'body' and in 'files'");
  }
  std::string text = body["body"].get<std::string>();
  if (named) {
    if (!body.contains("name") || !body["name"].is_string() || !body.contains("description") ||
        !body["description"].is_string()) {
      return InvalidArgument("'name' and 'description' are strings, and both are needed");
    }
    const std::string name = body["name"].get<std::string>();
    KEEL_RETURN_IF_ERROR(skills::CheckSkillName(name));
    // Quoted, so that no character of the description reads as front matter.
    std::string description = "\"";
    for (char c : body["description"].get<std::string>()) {
      if (static_cast<unsigned char>(c) < 0x20) {
        return InvalidArgument("field 'description' may not hold control characters");
      }
      if (c == '"' || c == '\\') description += '\\';
      description += c;
    }
    description += '"';
    text = "---\nname: " + name + "\ndescription: " + description + "\n---\n" + text;
  }
  files["SKILL.md"] = std::move(text);
  return files;
}

// The skill as the API shows it; `files` (the contents) only when it was read with them.
Json SkillJson(const store::Skill& s, const std::vector<store::SkillAssignment>& assigned) {
  Json agents = Json::array();
  for (const auto& a : assigned) agents.push_back(a.agent_id);
  Json out = {{"name", s.name},
              {"description", s.description},
              {"hash", s.hash},
              {"bytes", s.bytes},
              {"manifest", s.manifest},
              {"assigned_to", agents},
              {"created_at", FormatRfc3339(s.created_at)},
              {"updated_at", FormatRfc3339(s.updated_at)}};
  if (!s.files.is_null()) out["files"] = s.files;
  return out;
}

// The agent's skills, without their files.
Json AgentSkillsJson(const std::vector<store::Skill>& skills) {
  Json items = Json::array();
  for (const auto& s : skills) {
    items.push_back({{"name", s.name},
                     {"description", s.description},
                     {"hash", s.hash},
                     {"bytes", s.bytes},
                     {"updated_at", FormatRfc3339(s.updated_at)}});
  }
  return {{"items", items}, {"next_cursor", nullptr}};
}

}  // namespace

void RegisterSkillRoutes(http::Router& router, ApiContext& ctx) {
  // {"files": {"SKILL.md": TEXT, "PATH": TEXT | {"base64": DATA}, ...}}
  router.Add("POST", "/v1/skills", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"files", "name", "description", "body"}); !st.ok()) {
      co_return Response::Error(st);
    }
    auto files = FilesOf(*body);
    if (!files.ok()) co_return Response::Error(files.status());
    auto checked = skills::SkillOf(*files);
    if (!checked.ok()) co_return Response::Error(checked.status());
    store::Skill skill = std::move(*checked);
    skill.tenant_id = req.principal.tenant_id;
    skill.created_at = skill.updated_at = NowMillis();
    std::vector<store::SkillAssignment> assigned;
    bool replaced = false;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      auto before = tx.skills().GetSkill(skill.tenant_id, skill.name, false);
      replaced = before.ok();
      // Set on every run: a run again after a rollback may find no skill where the first did.
      skill.created_at = replaced ? before->created_at : skill.updated_at;
      KEEL_RETURN_IF_ERROR(tx.skills().UpsertSkill(skill));
      tx.Carry("skills", store::RowImage(skill));
      KEEL_ASSIGN_OR_RETURN(assigned,
                            tx.skills().ListSkillAssignments(skill.tenant_id, skill.name));
      return tx.events().Append({skill.tenant_id,
                                 "skill.registered@v1",
                                 "",
                                 "",
                                 "",
                                 {{"name", skill.name},
                                  {"hash", skill.hash},
                                  {"files", skill.manifest.size()},
                                  {"bytes", skill.bytes},
                                  {"replaced", replaced}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    skill.files = nullptr;  // the caller has them
    co_return Response::Json(replaced ? 200 : 201, SkillJson(skill, assigned));
  });

  router.Add("GET", "/v1/skills", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see skills"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    Json items = Json::array();
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto found, tx.skills().ListSkills(tenant));
      for (const auto& s : found) {
        KEEL_ASSIGN_OR_RETURN(auto assigned, tx.skills().ListSkillAssignments(tenant, s.name));
        items.push_back(SkillJson(s, assigned));
      }
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  router.Add("GET", "/v1/skills/{name}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see skills"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string name = req.Param("name");
    Json out;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto s, tx.skills().GetSkill(tenant, name, true));
      KEEL_ASSIGN_OR_RETURN(auto assigned, tx.skills().ListSkillAssignments(tenant, name));
      out = SkillJson(s, assigned);
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, out);
  });

  router.Add("DELETE", "/v1/skills/{name}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string name = req.Param("name");
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.skills().DeleteSkill(tenant, name));
      tx.Carry("skills", store::DeletedImage({{"tenant_id", tenant}, {"name", name}}));
      return tx.events().Append({tenant, "skill.deleted@v1", "", "", "", {{"name", name}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });

  router.Add("GET", "/v1/agents/{id}/skills", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see skills"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string agent_id = req.Param("id");
    std::vector<store::Skill> skills;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent_id).status());
      KEEL_ASSIGN_OR_RETURN(skills, tx.skills().SkillsForAgent(tenant, agent_id, false));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, AgentSkillsJson(skills));
  });

  // {"name": SKILL}
  router.Add("POST", "/v1/agents/{id}/skills", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"name"}); !st.ok()) co_return Response::Error(st);
    auto name = ReqString(*body, "name");
    if (!name.ok()) co_return Response::Error(name.status());
    std::string tenant = req.principal.tenant_id;
    std::string agent_id = req.Param("id");
    std::string skill = *name;
    std::vector<store::Skill> skills;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, agent_id).status());
      store::SkillAssignment assignment{tenant, agent_id, skill, NowMillis()};
      Status assigned = tx.skills().AssignSkill(assignment);
      if (assigned.code() == Code::kNotFound)
        return InvalidArgument("no skill named '" + skill + "'");
      KEEL_RETURN_IF_ERROR(assigned);
      tx.Carry("agent_skills", store::RowImage(assignment));
      KEEL_ASSIGN_OR_RETURN(skills, tx.skills().SkillsForAgent(tenant, agent_id, false));
      return tx.events().Append({tenant,
                                 "skill.assigned@v1",
                                 agent_id,
                                 "",
                                 "",
                                 {{"name", skill}, {"agent_id", agent_id}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, AgentSkillsJson(skills));
  });

  router.Add("DELETE", "/v1/agents/{id}/skills/{name}",
             [&ctx](Request& req) -> asio::awaitable<Response> {
               if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
               std::string tenant = req.principal.tenant_id;
               std::string agent_id = req.Param("id");
               std::string skill = req.Param("name");
               auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
                 KEEL_RETURN_IF_ERROR(tx.skills().UnassignSkill(tenant, agent_id, skill));
                 tx.Carry("agent_skills",
                          store::DeletedImage(
                              {{"tenant_id", tenant}, {"agent_id", agent_id}, {"skill", skill}}));
                 return tx.events().Append({tenant,
                                            "skill.unassigned@v1",
                                            agent_id,
                                            "",
                                            "",
                                            {{"name", skill}, {"agent_id", agent_id}}});
               });
               if (!written.ok()) co_return Response::Error(written.status());
               co_return Response::NoContent();
             });
}

}  // namespace keel::api

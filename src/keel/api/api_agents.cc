// Agents: create, list, show, update (partial), delete.

#include "keel/access/users.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/ids.h"
#include "keel/model/local_model.h"
#include "keel/model/provider.h"
#include "keel/runtime/context.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/skill_store.h"
#include "keel/store/user_store.h"
#include "keel/tools/gateway.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

Status ValidateName(const std::string& name) {
  if (name.empty() || name.size() > 100) return InvalidArgument("name must be 1 to 100 characters");
  for (char c : name) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    if (!ok) {
      return InvalidArgument("name may only contain letters, digits, '-', '_' and '.', got '" +
                             name + "'");
    }
  }
  if (IsUuid(name)) return InvalidArgument("name must not look like an id");
  return Status::Ok();
}

Status ValidateConfig(const Json& config) {
  if (!config.is_object()) return InvalidArgument("config must be a JSON object");
  // context_tokens and introspection
  KEEL_RETURN_IF_ERROR(runtime::ContextSettingsOf(config).status());
  if (config.contains("busy")) {
    const auto& b = config["busy"];
    if (!b.is_string() || (b != "queue" && b != "reject")) {
      return InvalidArgument("config.busy must be 'queue' or 'reject'");
    }
  }
  if (config.contains("max_steps")) {
    const auto& m = config["max_steps"];
    if (!m.is_number_integer() || m.get<int64_t>() < 1 || m.get<int64_t>() > 1000) {
      return InvalidArgument("config.max_steps must be an integer from 1 to 1000");
    }
  }
  if (config.contains("exec_backend")) {
    const auto& b = config["exec_backend"];
    if (!b.is_string() || (b != "sandbox" && b != "host")) {
      return InvalidArgument("config.exec_backend must be 'sandbox' (the default) or 'host'");
    }
  }
  if (config.contains("local_latency_ms")) {
    const auto& m = config["local_latency_ms"];
    if (!m.is_number_integer() || m.get<int64_t>() < 0 || m.get<int64_t>() > 60000) {
      return InvalidArgument("config.local_latency_ms must be an integer from 0 to 60000");
    }
  }
  if (config.contains("local_rules")) {
    KEEL_RETURN_IF_ERROR(model::LocalModel::CheckRules(config["local_rules"]));
  }
  return Status::Ok();
}

// The model router's fields (docs/API.md, models): fallback_model, cache, cache_group.
Status ValidateRouterConfig(const Json& config, const model::ProviderRegistry& providers) {
  if (config.contains("fallback_model")) {
    const auto& f = config["fallback_model"];
    if (!f.is_string() || f.get<std::string>().empty()) {
      return InvalidArgument("config.fallback_model must be a model string such as \"local\" or "
                             "\"openai/gpt-4o-mini\"");
    }
    std::string model_name;
    Status known = providers.Resolve(f.get<std::string>(), &model_name).status();
    if (!known.ok()) return InvalidArgument("config.fallback_model: " + known.message());
  }
  if (config.contains("cache") && !config["cache"].is_boolean()) {
    return InvalidArgument("config.cache must be true or false");
  }
  if (config.contains("cache_group")) {
    const auto& g = config["cache_group"];
    if (!g.is_string() || g.get<std::string>().empty() || g.get<std::string>().size() > 200) {
      return InvalidArgument("config.cache_group must be a string of 1 to 200 characters");
    }
  }
  return Status::Ok();
}

// Applies the fields present in `body` to `agent`; `creating` requires a name.
Status Apply(const Json& body, const model::ProviderRegistry& providers, store::Agent& agent,
             bool creating) {
  KEEL_RETURN_IF_ERROR(CheckFields(body, {"name", "model", "instructions", "tools", "config"}));
  if (creating || body.contains("name")) {
    KEEL_ASSIGN_OR_RETURN(agent.name, ReqString(body, "name"));
    KEEL_RETURN_IF_ERROR(ValidateName(agent.name));
  }
  if (body.contains("model") || creating) {
    KEEL_ASSIGN_OR_RETURN(agent.model, OptString(body, "model", creating ? "local" : agent.model));
    std::string model_name;
    KEEL_RETURN_IF_ERROR(providers.Resolve(agent.model, &model_name).status());
  }
  if (body.contains("instructions")) {
    KEEL_ASSIGN_OR_RETURN(agent.instructions, OptString(body, "instructions"));
    if (agent.instructions.size() > 256 * 1024) {
      return InvalidArgument("instructions are longer than 256 KiB");
    }
  }
  if (body.contains("tools")) {
    const Json& tools = body["tools"];
    if (!tools.is_array()) return InvalidArgument("tools must be an array of tool names");
    for (const auto& t : tools) {
      if (!t.is_string() || t.get<std::string>().empty()) {
        return InvalidArgument("tools must be an array of non-empty strings");
      }
    }
    agent.tools = tools;
  }
  if (body.contains("config")) {
    KEEL_RETURN_IF_ERROR(ValidateConfig(body["config"]));
    KEEL_RETURN_IF_ERROR(ValidateRouterConfig(body["config"], providers));
    agent.config = body["config"];
  }
  return Status::Ok();
}

}  // namespace

// What Apply cannot check alone: the tools list names things that exist, and host execution
// is the tenant's only when the platform admin granted it. (References: every caller awaits it
// at once.)
static asio::awaitable<Status> CheckGrants(ApiContext& ctx, const store::Agent& agent,
                                           bool tools_given, bool config_given) {
  if (tools_given) {
    Status known = co_await ctx.gateway.CheckToolList(agent.tenant_id, agent.tools);
    if (!known.ok()) co_return known;
  }
  if (config_given && agent.config.is_object() &&
      agent.config.value("exec_backend", "") == "host") {
    store::Tenant tenant;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(tenant, tx.tenants().GetTenant(agent.tenant_id));
      return Status::Ok();
    });
    if (!st.ok()) co_return st;
    if (!tenant.allow_host_exec) {
      co_return PermissionDenied(
          "config.exec_backend \"host\" runs commands on the host, which this tenant may not: "
          "only the platform admin can allow it (PATCH /v1/tenants/{id} with allow_host_exec)");
    }
  }
  co_return Status::Ok();
}

// Finds an agent of the caller's tenant by id. (References: every caller awaits it at once.)
static asio::awaitable<Result<store::Agent>> LoadAgent(ApiContext& ctx, const Request& req) {
  store::Agent agent;
  Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(agent, tx.agents().GetAgent(req.principal.tenant_id, req.Param("id")));
    return Status::Ok();
  });
  if (!st.ok()) co_return st;
  co_return agent;
}

void RegisterAgentRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("POST", "/v1/agents", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    store::Agent agent;
    if (auto st = Apply(*body, ctx.providers, agent, true); !st.ok()) co_return Response::Error(st);
    agent.id = NewId();
    agent.tenant_id = req.principal.tenant_id;
    Status granted = co_await CheckGrants(ctx, agent, true, true);
    if (!granted.ok()) co_return Response::Error(granted);
    agent.created_at = agent.updated_at = NowMillis();
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(agent));
      tx.Carry("agents", store::RowImage(agent));
      return tx.events()
          .Append({agent.tenant_id, "agent.created@v1", agent.id, "", "",
                   {{"name", agent.name}, {"model", agent.model}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(201, AgentJson(agent));
  });

  router.Add("GET", "/v1/agents", [&ctx](Request& req) -> asio::awaitable<Response> {
    auto page = PageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    store::Paged<store::Agent> agents;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(agents, tx.agents().ListAgents(req.principal.tenant_id, *page));
      // A person's token lists the agents the person may talk to (its pages may be short).
      std::vector<store::Agent> kept;
      for (auto& a : agents.items) {
        Status reach = access::Reachable(tx, a.tenant_id, req.principal.user_id, a.id);
        if (reach.code() == Code::kNotFound) continue;
        KEEL_RETURN_IF_ERROR(reach);
        kept.push_back(std::move(a));
      }
      agents.items = std::move(kept);
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ListJson(agents, AgentJson));
  });

  router.Add("GET", "/v1/agents/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    auto agent = co_await LoadAgent(ctx, req);
    if (!agent.ok()) co_return Response::Error(agent.status());
    co_return Response::Json(200, AgentJson(*agent));
  });

  // What the agent's model is offered, with each tool's argument schema (the dashboard checks an
  // approval's amended arguments against it).
  router.Add("GET", "/v1/agents/{id}/tools", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "list an agent's tools"); !st.ok()) {
      co_return Response::Error(st);
    }
    auto agent = co_await LoadAgent(ctx, req);
    if (!agent.ok()) co_return Response::Error(agent.status());
    Json items = Json::array();
    for (const auto& t : co_await ctx.gateway.Offered(agent->tenant_id, agent->id, agent->tools)) {
      if (runtime::IsIntrospectionTool(t->name())) continue;  // only introspection runs have them
      Json item = Json::object();
      item["name"] = t->name();
      item["description"] = t->description();
      item["parameters"] = t->parameters();
      item["rights"] = t->rights();
      item["effect_class"] = tools::EffectClassName(t->effect_class());
      items.push_back(std::move(item));
    }
    Json out = Json::object();
    out["items"] = std::move(items);
    co_return Response::Json(200, out);
  });

  router.Add("PATCH", "/v1/agents/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    auto agent = co_await LoadAgent(ctx, req);
    if (!agent.ok()) co_return Response::Error(agent.status());
    store::Agent updated = *agent;
    if (auto st = Apply(*body, ctx.providers, updated, false); !st.ok()) {
      co_return Response::Error(st);
    }
    Status granted =
        co_await CheckGrants(ctx, updated, body->contains("tools"), body->contains("config"));
    if (!granted.ok()) co_return Response::Error(granted);
    updated.updated_at = NowMillis();
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().UpdateAgent(updated));
      tx.Carry("agents", store::RowImage(updated));
      Json changed = Json::array();
      for (auto it = body->begin(); it != body->end(); ++it) changed.push_back(it.key());
      return tx.events()
          .Append({updated.tenant_id, "agent.updated@v1", updated.id, "", "",
                   {{"fields", changed}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, AgentJson(updated));
  });

  router.Add("DELETE", "/v1/agents/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().DeleteAgent(tenant, id));
      // Plugins enabled for it alone are no longer enabled for anyone.
      KEEL_ASSIGN_OR_RETURN(auto plugins, tx.plugins().ListPlugins(tenant));
      for (const auto& p : plugins) {
        KEEL_ASSIGN_OR_RETURN(auto enabled, tx.plugins().ListEnablements(tenant, p.id));
        for (const auto& e : enabled) {
          if (e.agent_id != id) continue;
          KEEL_RETURN_IF_ERROR(tx.plugins().DisablePlugin(tenant, p.id, id));
          tx.Carry(
              "agent_plugins",
              store::DeletedImage({{"tenant_id", tenant}, {"plugin_id", p.id}, {"agent_id", id}}));
        }
      }
      // Its skills are no longer assigned.
      KEEL_ASSIGN_OR_RETURN(auto skills, tx.skills().SkillsForAgent(tenant, id, false));
      for (const auto& s : skills) {
        KEEL_RETURN_IF_ERROR(tx.skills().UnassignSkill(tenant, id, s.name));
        tx.Carry("agent_skills",
                 store::DeletedImage({{"tenant_id", tenant}, {"agent_id", id}, {"skill", s.name}}));
      }
      // No one has a role on it any more.
      for (store::Page page{"", 500};;) {
        KEEL_ASSIGN_OR_RETURN(auto members, tx.users().ListMembers(tenant, id, page));
        for (const auto& m : members.items) {
          KEEL_RETURN_IF_ERROR(tx.users().DeleteMember(tenant, id, m.user_id));
          tx.Carry("agent_members",
                   store::DeletedImage(
                       {{"tenant_id", tenant}, {"agent_id", id}, {"user_id", m.user_id}}));
        }
        if (members.next_cursor.empty()) break;
        page.cursor = members.next_cursor;
      }
      tx.Carry("agents", store::ColumnsImage({{"id", id}, {"status", "deleted"}}));
      return tx.events().Append({tenant, "agent.deleted@v1", id, "", "", {}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_await ctx.runtime.ForgetAgent(id);  // agent.stopped@v1 on this node
    co_return Response::NoContent();
  });
}

}  // namespace keel::api

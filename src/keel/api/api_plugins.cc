// Plugins: register (POST, again to replace), list, show, delete; enable and disable for an
// agent or for all ("*"); a webhook plugin's deliveries and their replay. Owners change
// things; owners and users may look. A plugin is checked whole when registered: its manifest,
// its config against the manifest's config_schema, a built-in's settings, a Lua script loaded
// once in a throwaway sandbox (so one that does not compile, fails or runs away is refused
// here), a webhook's signing secret. Changes reach an agent at its next turn.

#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/time.h"
#include "keel/plugins/builtin_plugins.h"
#include "keel/plugins/lua_plugin.h"
#include "keel/plugins/manifest.h"
#include "keel/runtime/runtime.h"
#include "keel/secrets/vault.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"
#include "keel/tools/schema.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

constexpr size_t kMaxSourceBytes = 256 * 1024;

Json PluginJson(const store::Plugin& p, const std::vector<store::PluginEnablement>& enabled,
                bool with_source) {
  Json agents = Json::array();
  for (const auto& e : enabled) agents.push_back(e.agent_id);
  Json out = {{"id", p.id},
              {"name", p.name},
              {"version", p.version},
              {"kind", p.kind},
              {"manifest", p.manifest},
              {"config", p.config},
              {"enabled_for", agents},
              {"created_at", FormatRfc3339(p.created_at)},
              {"updated_at", FormatRfc3339(p.updated_at)}};
  if (with_source && p.kind == "lua") out["source"] = p.source;
  return out;
}

Json DeliveryJson(const store::PluginDelivery& d) {
  return {{"id", d.id},
          {"plugin_id", d.plugin_id},
          {"agent_id", d.agent_id},
          {"event", d.event_type},
          {"payload", d.payload},
          {"status", d.status},
          {"attempts", d.attempts},
          {"next_attempt_at", d.status == "pending" ? Json(FormatRfc3339(d.next_attempt_at)) : Json()},
          {"last_status", d.last_status},
          {"last_error", d.last_error},
          {"created_at", FormatRfc3339(d.created_at)},
          {"delivered_at", d.delivered_at ? Json(FormatRfc3339(*d.delivered_at)) : Json()}};
}

// Checks a registration and returns the plugin to store.
Result<store::Plugin> PluginOf(const Json& body, const std::string& tenant_id) {
  KEEL_RETURN_IF_ERROR(CheckFields(body, {"manifest", "source", "config"}));
  if (!body.contains("manifest")) return InvalidArgument("field 'manifest' is required");
  KEEL_ASSIGN_OR_RETURN(auto m, plugins::ParseManifest(body["manifest"]));
  Json config = body.value("config", Json::object());
  if (!config.is_object()) return InvalidArgument("config must be an object");
  if (Status fits = tools::CheckArguments(m.config_schema, config); !fits.ok()) {
    std::string why = fits.message();
    if (why.rfind("arguments", 0) == 0) why = "config" + why.substr(9);
    return InvalidArgument("config does not match the manifest's config_schema: " + why);
  }
  KEEL_ASSIGN_OR_RETURN(std::string source, OptString(body, "source"));
  if (m.kind == "lua") {
    if (source.empty()) return InvalidArgument("a lua plugin needs its source");
    if (source.size() > kMaxSourceBytes) return InvalidArgument("source is larger than 256 KiB");
    // Loaded once, in a sandbox of its own, to refuse what could never run.
    auto loaded = plugins::LuaPlugin::Load(m.id, source, config, m.events, m.priority, m.limits,
                                           nullptr);
    if (!loaded.ok()) return loaded.status();
  } else if (!source.empty()) {
    return InvalidArgument("source goes with kind \"lua\"");
  }
  if (m.kind == "builtin") KEEL_RETURN_IF_ERROR(plugins::CheckBuiltin(m, config));
  if (m.kind == "webhook") {
    if (!config.contains("secret") || !config["secret"].is_string()) {
      return InvalidArgument("a webhook plugin needs config.secret: the name of the tenant secret "
                             "its deliveries are signed with");
    }
    KEEL_RETURN_IF_ERROR(secrets::Vault::CheckName(config["secret"].get<std::string>()));
  }
  store::Plugin p;
  p.tenant_id = tenant_id;
  p.id = m.id;
  p.name = m.name;
  p.version = m.version;
  p.kind = m.kind;
  p.manifest = body["manifest"];
  p.source = source;
  p.config = config;
  p.created_at = p.updated_at = NowMillis();
  return p;
}

Status RequirePlugin(store::Tx& tx, const std::string& tenant, const std::string& id) {
  return tx.plugins().GetPlugin(tenant, id).status();
}

}  // namespace

void RegisterPluginRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("POST", "/v1/plugins", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    auto plugin = PluginOf(*body, req.principal.tenant_id);
    if (!plugin.ok()) co_return Response::Error(plugin.status());
    store::Plugin p = *plugin;
    std::vector<store::PluginEnablement> enabled;
    bool replaced = false;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      if (p.kind == "webhook") {
        // The signing secret must exist and open now, not at the first delivery.
        KEEL_RETURN_IF_ERROR(
            ctx.vault.Get(tx, p.tenant_id, p.config["secret"].get<std::string>()).status());
      }
      auto before = tx.plugins().GetPlugin(p.tenant_id, p.id);
      replaced = before.ok();
      // Set on every run: a run again after a rollback may find no plugin where the first did.
      p.created_at = replaced ? before->created_at : p.updated_at;
      KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(p));
      tx.Carry("plugins", store::RowImage(p));
      KEEL_ASSIGN_OR_RETURN(enabled, tx.plugins().ListEnablements(p.tenant_id, p.id));
      return tx.events().Append({p.tenant_id, "plugin.registered@v1", "", "", "",
                                 {{"plugin_id", p.id}, {"kind", p.kind},
                                  {"version", p.version}, {"replaced", replaced}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(replaced ? 200 : 201, PluginJson(p, enabled, true));
  });

  router.Add("GET", "/v1/plugins", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see plugins"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    Json items = Json::array();
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto found, tx.plugins().ListPlugins(tenant));
      for (const auto& p : found) {
        KEEL_ASSIGN_OR_RETURN(auto enabled, tx.plugins().ListEnablements(tenant, p.id));
        items.push_back(PluginJson(p, enabled, false));
      }
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  router.Add("GET", "/v1/plugins/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see plugins"); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    Json out;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto p, tx.plugins().GetPlugin(tenant, id));
      KEEL_ASSIGN_OR_RETURN(auto enabled, tx.plugins().ListEnablements(tenant, id));
      out = PluginJson(p, enabled, true);
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, out);
  });

  router.Add("DELETE", "/v1/plugins/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.plugins().DeletePlugin(tenant, id));
      tx.Carry("plugins", store::DeletedImage({{"tenant_id", tenant}, {"id", id}}));
      return tx.events().Append({tenant, "plugin.deleted@v1", "", "", "", {{"plugin_id", id}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });

  // {"agent_id": ID | "*"}
  for (const char* action : {"enable", "disable"}) {
    const bool enable = std::string(action) == "enable";
    router.Add("POST", std::string("/v1/plugins/{id}/") + action,
               [&ctx, enable](Request& req) -> asio::awaitable<Response> {
      if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
      auto body = ParseJsonObject(req.body);
      if (!body.ok()) co_return Response::Error(body.status());
      if (auto st = CheckFields(*body, {"agent_id"}); !st.ok()) co_return Response::Error(st);
      auto agent = ReqString(*body, "agent_id");
      if (!agent.ok()) co_return Response::Error(agent.status());
      std::string tenant = req.principal.tenant_id;
      std::string id = req.Param("id");
      std::string agent_id = *agent;
      Json out;
      auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
        KEEL_RETURN_IF_ERROR(RequirePlugin(tx, tenant, id));
        if (enable && agent_id != "*") {  // a deleted agent's enablement may still be removed
          auto a = tx.agents().GetAgent(tenant, agent_id);
          if (!a.ok()) {
            return a.status().code() == Code::kNotFound
                       ? InvalidArgument("no agent " + agent_id + " (or \"*\" for all agents)")
                       : a.status();
          }
        }
        if (enable) {
          store::PluginEnablement e{tenant, id, agent_id, NowMillis()};
          KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin(e));
          tx.Carry("agent_plugins", store::RowImage(e));
        } else {
          KEEL_RETURN_IF_ERROR(tx.plugins().DisablePlugin(tenant, id, agent_id));
          tx.Carry("agent_plugins",
                   store::DeletedImage(
                       {{"tenant_id", tenant}, {"plugin_id", id}, {"agent_id", agent_id}}));
        }
        KEEL_ASSIGN_OR_RETURN(auto p, tx.plugins().GetPlugin(tenant, id));
        KEEL_ASSIGN_OR_RETURN(auto enabled, tx.plugins().ListEnablements(tenant, id));
        out = PluginJson(p, enabled, false);
        return tx.events().Append({tenant, enable ? "plugin.enabled@v1" : "plugin.disabled@v1",
                                   agent_id == "*" ? "" : agent_id, "", "",
                                   {{"plugin_id", id}, {"agent_id", agent_id}}});
      });
      if (!written.ok()) co_return Response::Error(written.status());
      co_return Response::Json(200, out);
    });
  }

  router.Add("GET", "/v1/plugins/{id}/deliveries", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see deliveries"); !st.ok()) co_return Response::Error(st);
    auto page = PageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    std::string status = req.Query("status");
    if (!status.empty() && status != "pending" && status != "delivered" && status != "dead") {
      co_return Response::Error(InvalidArgument("status must be pending, delivered or dead"));
    }
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    store::Paged<store::PluginDelivery> found;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(RequirePlugin(tx, tenant, id));
      KEEL_ASSIGN_OR_RETURN(found, tx.plugins().ListDeliveries(tenant, id, status, *page));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ListJson(found, DeliveryJson));
  });

  // Sends a delivery again (a dead one, or a delivered one on purpose): pending, due now, its
  // attempts counted from zero.
  router.Add("POST", "/v1/plugins/{id}/deliveries/{delivery}/replay",
             [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    // No body is taken; one with fields is refused rather than ignored.
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {}); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    std::string delivery_id = req.Param("delivery");
    store::PluginDelivery d;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(d, tx.plugins().GetDelivery(tenant, delivery_id));
      if (d.plugin_id != id) return NotFound("plugin delivery not found: " + delivery_id);
      if (d.status == "pending") return Conflict("delivery " + delivery_id + " is still pending");
      d.status = "pending";
      d.attempts = 0;
      d.next_attempt_at = NowMillis();
      d.last_error.clear();
      d.last_status = 0;
      d.delivered_at.reset();
      KEEL_RETURN_IF_ERROR(tx.plugins().UpdateDelivery(d));
      return tx.events().Append({tenant, "plugin.delivery_replayed@v1", d.agent_id, "", "",
                                 {{"plugin_id", id}, {"delivery_id", d.id}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    ctx.runtime.WakeDeliveries();
    co_return Response::Json(200, DeliveryJson(d));
  });
}

}  // namespace keel::api

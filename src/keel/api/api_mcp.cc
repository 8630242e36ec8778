// MCP servers: register (POST), list, show, delete. Owners register and delete; owners and
// users may look. A registered stdio server is started (and its tools listed) at once, so the
// answer says whether it works; its tools are then callable as mcp__{name}__{tool} by agents
// whose `tools` list names them (or lists `*`, or is empty), through the same gateway, policy
// and approvals as every other tool. Secrets are referenced by name ({"secret": NAME}) and
// opened only when the server is started.

#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/mcp/manager.h"
#include "keel/secrets/vault.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"
#include "keel/tools/gateway.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

// Validates a registration and returns the stored config (command, env, timeout_ms).
Result<Json> ConfigOf(const Json& body, std::string* name, std::string* transport) {
  KEEL_RETURN_IF_ERROR(
      CheckFields(body, {"name", "transport", "command", "env", "timeout_ms", "url", "headers"}));
  KEEL_ASSIGN_OR_RETURN(*name, ReqString(body, "name"));
  if (name->size() > 32 || name->find("__") != std::string::npos) {
    return InvalidArgument("name must be 1 to 32 characters without '__' (tools are named "
                           "mcp__{server}__{tool})");
  }
  for (char c : *name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) {
      return InvalidArgument("name may contain only lowercase letters, digits, '_' and '-'");
    }
  }
  if (name->front() == '_' || name->back() == '_') {
    return InvalidArgument("name may not start or end with '_' (tools are named "
                           "mcp__{server}__{tool})");
  }
  KEEL_ASSIGN_OR_RETURN(*transport, OptString(body, "transport", "stdio"));
  if (*transport != "stdio" && *transport != "http") {
    return InvalidArgument("transport must be \"stdio\" or \"http\"");
  }
  Json config = Json::object();
  // A header or environment value: a string, or a secret by reference.
  auto value = [](const std::string& what, const Json& v) -> Status {
    if (v.is_string()) return Status::Ok();
    if (v.is_object() && v.size() == 1 && v.contains("secret") && v["secret"].is_string()) {
      return secrets::Vault::CheckName(v["secret"].get<std::string>());
    }
    return InvalidArgument(what + " must be a string or {\"secret\": NAME}");
  };
  if (*transport == "http") {
    if (body.contains("command") || body.contains("env")) {
      return InvalidArgument("command and env go with transport \"stdio\"");
    }
    KEEL_ASSIGN_OR_RETURN(std::string url, ReqString(body, "url"));
    if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0) {
      return InvalidArgument("url must start with http:// or https://");
    }
    config["url"] = url;
    Json headers = Json::object();
    if (body.contains("headers")) {
      if (!body["headers"].is_object()) return InvalidArgument("headers must be an object");
      for (auto it = body["headers"].begin(); it != body["headers"].end(); ++it) {
        if (it.key().empty() || it.key().find_first_of(":\r\n ") != std::string::npos) {
          return InvalidArgument("headers: '" + it.key() + "' is not a header name");
        }
        KEEL_RETURN_IF_ERROR(value("headers." + it.key(), it.value()));
        headers[it.key()] = it.value();
      }
    }
    config["headers"] = headers;
    if (body.contains("timeout_ms")) {
      const Json& t = body["timeout_ms"];
      if (!t.is_number_integer() || t.get<int64_t>() < 100 || t.get<int64_t>() > 600000) {
        return InvalidArgument("timeout_ms must be an integer from 100 to 600000");
      }
      config["timeout_ms"] = t;
    }
    return config;
  }
  if (body.contains("url") || body.contains("headers")) {
    return InvalidArgument("url and headers go with transport \"http\"");
  }
  if (!body.contains("command") || !body["command"].is_array() || body["command"].empty()) {
    return InvalidArgument("command must be a non-empty array of strings (program and arguments)");
  }
  for (const auto& arg : body["command"]) {
    if (!arg.is_string() || arg.get_ref<const std::string&>().find('\0') != std::string::npos) {
      return InvalidArgument("command must be an array of strings");
    }
  }
  if (body["command"][0].get_ref<const std::string&>().empty()) {
    return InvalidArgument("command[0] must name a program");
  }
  config["command"] = body["command"];
  Json env = Json::object();
  if (body.contains("env")) {
    if (!body["env"].is_object()) return InvalidArgument("env must be an object");
    for (auto it = body["env"].begin(); it != body["env"].end(); ++it) {
      const std::string& key = it.key();
      if (key.empty() || key.find('=') != std::string::npos) {
        return InvalidArgument("env: '" + key + "' is not a variable name");
      }
      const Json& v = it.value();
      if (v.is_string()) {
        env[key] = v;
      } else if (v.is_object() && v.size() == 1 && v.contains("secret") &&
                 v["secret"].is_string()) {
        KEEL_RETURN_IF_ERROR(secrets::Vault::CheckName(v["secret"].get<std::string>()));
        env[key] = v;
      } else {
        return InvalidArgument("env." + key + " must be a string or {\"secret\": NAME}");
      }
    }
  }
  config["env"] = env;
  if (body.contains("timeout_ms")) {
    const Json& t = body["timeout_ms"];
    if (!t.is_number_integer() || t.get<int64_t>() < 100 || t.get<int64_t>() > 600000) {
      return InvalidArgument("timeout_ms must be an integer from 100 to 600000");
    }
    config["timeout_ms"] = t;
  }
  return config;
}

Json ServerJson(const store::McpServer& s, const std::string& status) {
  Json out = {{"id", s.id},
              {"name", s.name},
              {"transport", s.transport},
              {"created_at", FormatRfc3339(s.created_at)}};
  if (s.transport == "http") {
    out["url"] = s.config.value("url", "");
    out["headers"] = s.config.value("headers", Json::object());  // references, never values
  } else {
    out["command"] = s.config.value("command", Json::array());
    out["env"] = s.config.value("env", Json::object());  // references, never values
  }
  if (status.rfind("error: ", 0) == 0) {
    out["status"] = "error";
    out["error"] = status.substr(7);
  } else {
    out["status"] = status;
  }
  if (s.config.contains("timeout_ms")) out["timeout_ms"] = s.config["timeout_ms"];
  return out;
}

// Connects (when needed) and renders the server with its tools.
asio::awaitable<Json> LiveServerJson(ApiContext& ctx, store::McpServer s) {
  auto tools = co_await ctx.gateway.McpServerTools(s);
  Json out = ServerJson(s, tools.ok() ? "ready" : "error: " + tools.status().message());
  Json list = Json::array();
  if (tools.ok()) {
    for (const auto& t : *tools) {
      list.push_back({{"name", t->name()},
                      {"description", t->description()},
                      {"rights", t->rights()},
                      {"effect_class", tools::EffectClassName(t->effect_class())}});
    }
  }
  out["tools"] = list;
  co_return out;
}

}  // namespace

void RegisterMcpRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("POST", "/v1/mcp-servers", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    std::string name, transport;
    auto config = ConfigOf(*body, &name, &transport);
    if (!config.ok()) co_return Response::Error(config.status());
    store::McpServer s{NewId(), req.principal.tenant_id, name, transport, *config, NowMillis()};
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.mcp_servers().InsertMcpServer(s));
      tx.Carry("mcp_servers", store::RowImage(s));
      return tx.events().Append({s.tenant_id, "mcp_server.registered@v1", "", "", "",
                                 {{"server_id", s.id}, {"name", s.name},
                                  {"transport", s.transport}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(201, co_await LiveServerJson(ctx, s));
  });

  router.Add("GET", "/v1/mcp-servers", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see MCP servers"); !st.ok()) co_return Response::Error(st);
    std::vector<store::McpServer> found;
    std::string tenant = req.principal.tenant_id;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(found, tx.mcp_servers().ListMcpServers(tenant));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    Json items = Json::array();
    for (const auto& s : found) items.push_back(ServerJson(s, ctx.mcp.StatusOf(s.id)));
    co_return Response::Json(200, {{"items", items}, {"next_cursor", nullptr}});
  });

  router.Add("GET", "/v1/mcp-servers/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see MCP servers"); !st.ok()) co_return Response::Error(st);
    store::McpServer found;
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(found, tx.mcp_servers().GetMcpServer(tenant, id));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, co_await LiveServerJson(ctx, found));
  });

  router.Add("DELETE", "/v1/mcp-servers/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    std::string tenant = req.principal.tenant_id;
    std::string id = req.Param("id");
    store::McpServer gone;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(gone, tx.mcp_servers().GetMcpServer(tenant, id));
      KEEL_RETURN_IF_ERROR(tx.mcp_servers().DeleteMcpServer(tenant, id));
      tx.Carry("mcp_servers", store::DeletedImage({{"id", id}}));
      return tx.events().Append({tenant, "mcp_server.deleted@v1", "", "", "",
                                 {{"server_id", id}, {"name", gone.name}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_await ctx.gateway.ForgetMcpServer(id);
    co_return Response::NoContent();
  });
}

}  // namespace keel::api

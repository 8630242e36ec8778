// Keel as an MCP server: `/v1/mcp` speaks the streamable HTTP transport of the Model Context
// Protocol, so an external agent harness can use one agent's tools with a bearer token.
//
// `initialize` (POST /v1/mcp?agent={id}) opens a Keel session for that agent; its id is the
// Mcp-Session-Id of every later request. `tools/list` offers what the agent's model would be
// offered. `tools/call` posts a direct call into the session (runtime::IntakeRequest::call):
// a run that passes the one call through the gateway — policy for the token's role, approvals,
// the effect journal — and ends with its answer. A call that needs a human waits: the answer is
// an SSE stream that says which approval it waits for, keeps the connection alive, and carries
// the result once someone decides (a client that only accepts JSON waits on a plain request).
// DELETE /v1/mcp closes the session.

#include <boost/asio/use_awaitable.hpp>
#include <cctype>
#include <chrono>
#include <map>
#include <memory>
#include <set>

#include "keel/access/access.h"
#include "keel/access/users.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/config/config.h"
#include "keel/http/cors.h"
#include "keel/mcp/messages.h"
#include "keel/runs/open_session.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"
#include "keel/tools/gateway.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

// The protocol versions this server speaks, newest first.
constexpr const char* kVersions[] = {"2025-11-25", "2025-06-18", "2025-03-26"};

bool Supported(const std::string& version) {
  for (const char* v : kVersions) {
    if (version == v) return true;
  }
  return false;
}

// JSON-RPC error codes.
constexpr int kInvalidRequest = mcp::kJsonRpcInvalidRequest;
constexpr int kMethodNotFound = -32601;
constexpr int kInvalidParams = -32602;
constexpr int kServerError = -32000;

Json RpcResult(const Json& id, Json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

Json RpcError(const Json& id, int code, const std::string& message) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
}

Response RpcResponse(int http_status, const Json& body) { return Response::Json(http_status, body); }

// 202 with no body: the answer to a notification.
Response Accepted() {
  Response r;
  r.status = 202;
  r.content_type.clear();
  return r;
}

// The host part of a Host header or an origin, lower-cased ("http://LocalHost:7878" ->
// "localhost").
std::string HostOf(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (auto scheme = s.find("://"); scheme != std::string::npos) s = s.substr(scheme + 3);
  if (auto slash = s.find('/'); slash != std::string::npos) s.resize(slash);
  if (!s.empty() && s.front() == '[') {
    auto close = s.find(']');
    return close == std::string::npos ? s : s.substr(0, close + 1);
  }
  if (auto colon = s.find(':'); colon != std::string::npos) s.resize(colon);
  return s;
}

bool IsLoopbackName(const std::string& host) {
  return host == "localhost" || host == "127.0.0.1" || host == "[::1]";
}

// DNS rebinding protection (the transport's security rules): a server listening on a loopback
// address answers only requests addressed to a loopback name; a browser's request must come
// from a page of this server (its Origin names the same host as its Host header), or of an
// origin the cors_origins setting lists.
Status CheckHostAndOrigin(const Request& req, const config::Config& config) {
  const std::string& listen = config.listen;
  const std::string host = HostOf(req.Header("host"));
  if (IsLoopbackName(HostOf(listen)) && !IsLoopbackName(host)) {
    return Status(Code::kPermissionDenied,
                  "this server listens on a loopback address and answers /v1/mcp only for "
                  "localhost, 127.0.0.1 or [::1], not Host '" + host + "'");
  }
  const std::string origin = req.Header("origin");
  if (!origin.empty() && HostOf(origin) != host &&
      !http::CorsPolicy{config.cors_origins}.Allows(origin)) {
    return Status(Code::kPermissionDenied,
                  "Origin '" + origin + "' does not match the Host this request was sent to");
  }
  return Status::Ok();
}

// Calls in flight, for notifications/cancelled. Lives on the io executor.
struct McpState {
  // (session id, JSON-RPC id as JSON text) -> run id.
  std::map<std::pair<std::string, std::string>, std::string> in_flight;
  std::set<std::pair<std::string, std::string>> cancelled;
};

// A tool as tools/list describes it; the hints follow what the gateway knows of it.
Json ToolJson(const tools::Tool& t) {
  auto rights = t.rights();
  bool sends = std::find(rights.begin(), rights.end(), "send") != rights.end();
  Json schema = t.parameters();
  if (!schema.is_object()) schema = {{"type", "object"}};
  return {{"name", t.name()},
          {"description", t.description()},
          {"inputSchema", schema},
          {"annotations",
           {{"readOnlyHint", t.effect_class() == tools::EffectClass::kPure},
            {"idempotentHint", t.effect_class() != tools::EffectClass::kOnce},
            {"openWorldHint", sends}}}};
}

// The CallToolResult of a direct call's run once it has ended.
Result<Json> CallResultOf(store::Tx& tx, const store::Run& run) {
  KEEL_ASSIGN_OR_RETURN(auto calls, tx.runs().ListToolCalls(run.tenant_id, run.id));
  const store::ToolCall* call = calls.empty() ? nullptr : &calls.front();
  auto text = [](std::string s) { return Json::array({{{"type", "text"}, {"text", std::move(s)}}}); };
  if (!call || call->status == "approved" || call->status == "awaiting_approval" ||
      call->status == "started" || call->status == "proposed") {
    // The run ended before its call did: cancelled, halted by an emergency stop, ...
    std::string why = run.error.is_object() ? run.error.value("message", run.status) : run.status;
    return Json{{"content", text("the call did not run: " + why)}, {"isError", true}};
  }
  tools::CallOutcome outcome{call->status, call->result};
  if (call->status != "succeeded") {
    return Json{{"content", text(outcome.ForModel())}, {"isError", true}};
  }
  const Json& r = call->result;
  // An MCP server's own result (non-text content or structured content) passes through.
  if (r.is_object() && r.contains("content") && r["content"].is_array()) {
    Json out = {{"content", r["content"]}, {"isError", false}};
    if (r.contains("structuredContent")) out["structuredContent"] = r["structuredContent"];
    return out;
  }
  Json out = {{"content", text(outcome.ForModel())}, {"isError", false}};
  if (r.is_object()) out["structuredContent"] = r;
  return out;
}

// An SSE frame carrying one JSON-RPC message.
std::string Frame(const Json& message) { return "event: message\ndata: " + DumpJson(message) + "\n\n"; }

// While a call waits for an approval, a client that gave a progress token hears
// notifications/progress this often: clients that reset their request timeout on progress (the
// official SDKs do, with a 60 s default) keep waiting for the human.
constexpr std::chrono::seconds kProgressEvery{10};

// Waits until the direct call's run ends and returns its CallToolResult. With `w` (an SSE
// answer) it tells the client when the call waits for an approval, sends `progress_token`'s
// notifications/progress while it waits (when the client gave one), and keeps the connection
// alive; nullopt when that client went away or cancelled the request.
asio::awaitable<Result<std::optional<Json>>> AwaitCall(ApiContext& ctx, McpState& state,
                                                       std::pair<std::string, std::string> key,
                                                       store::Run run, std::string call_id,
                                                       http::StreamWriter* w, Json progress_token) {
  auto sub = ctx.hub.Subscribe({run.tenant_id, "", "", run.id, /*deltas=*/false});
  struct Leave {
    ApiContext& ctx;
    McpState& state;
    runtime::EventHub::SubscriptionPtr sub;
    std::pair<std::string, std::string> key;
    ~Leave() {
      ctx.hub.Unsubscribe(sub);
      state.in_flight.erase(key);
      state.cancelled.erase(key);
    }
  } leave{ctx, state, sub, key};
  std::string told_approval;
  int64_t progress = 0;  // notifications/progress sent (their progress values: 1, 2, ...)
  auto last_progress = std::chrono::steady_clock::time_point();
  while (true) {
    ctx.hub.TakeDirty(sub);
    store::Run current;
    std::optional<store::Approval> approval;
    std::optional<Json> result;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(current, tx.runs().GetRun(run.tenant_id, run.id));
      if (current.Terminal()) {
        KEEL_ASSIGN_OR_RETURN(result, CallResultOf(tx, current));
      } else if (current.status == "waiting_for_approval") {
        KEEL_ASSIGN_OR_RETURN(approval,
                              tx.approvals().FindApprovalForCall(run.tenant_id, run.id, call_id));
      }
      return Status::Ok();
    });
    if (!st.ok()) co_return st;
    if (state.cancelled.count(key)) co_return std::optional<Json>();
    if (result) co_return result;
    if (approval && approval->id != told_approval && w) {
      told_approval = approval->id;
      Json note = {{"jsonrpc", "2.0"},
                   {"method", "notifications/message"},
                   {"params",
                    {{"level", "notice"},
                     {"logger", "keel"},
                     {"data",
                      {{"message", "the call waits for a human to approve it"},
                       {"approval_id", approval->id},
                       {"run_id", run.id}}}}}};
      if (!co_await w->Write(Frame(note))) co_return std::optional<Json>();
    }
    const bool reports = w && !progress_token.is_null() && approval;
    if (reports && std::chrono::steady_clock::now() - last_progress >= kProgressEvery) {
      last_progress = std::chrono::steady_clock::now();
      Json note = {{"jsonrpc", "2.0"},
                   {"method", "notifications/progress"},
                   {"params",
                    {{"progressToken", progress_token},
                     {"progress", ++progress},
                     {"message", "waiting for approval " + approval->id}}}};
      std::string frame = Frame(note);
      if (!co_await w->Write(std::move(frame))) co_return std::optional<Json>();
    }
    auto before = std::chrono::steady_clock::now();
    co_await ctx.hub.Wait(
        sub, reports ? std::chrono::duration_cast<std::chrono::milliseconds>(kProgressEvery)
                     : std::chrono::milliseconds(15000));
    if (w && std::chrono::steady_clock::now() - before >= std::chrono::seconds(15)) {
      if (!co_await w->Write(": keepalive\n\n")) co_return std::optional<Json>();
    }
  }
}

// The session named by Mcp-Session-Id: 400 without one, 404 (the client must initialize again)
// for one that is unknown or closed, or that another token opened.
asio::awaitable<Result<store::Session>> SessionOf(ApiContext& ctx, const Request& req) {
  std::string id = req.Header("mcp-session-id");
  if (id.empty()) {
    co_return InvalidArgument("Mcp-Session-Id is required after initialize");
  }
  store::Session session;
  Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(session, tx.sessions().GetSession(req.principal.tenant_id, id));
    return Status::Ok();
  });
  if (!st.ok()) co_return st;
  if (!access::CanUseMcpSession(req.principal, session)) {
    co_return NotFound("MCP session not found: " + id + " (a session serves the token that opened it)");
  }
  if (session.status == "inactive") co_return NotFound("MCP session " + id + " was closed");
  co_return session;
}

// Every request but initialize may name the protocol version; it must be one this server speaks.
Status CheckVersionHeader(const Request& req) {
  std::string version = req.Header("mcp-protocol-version");
  if (!version.empty() && !Supported(version)) {
    return InvalidArgument("unsupported MCP-Protocol-Version '" + version + "'");
  }
  return Status::Ok();
}

// Transport-level failures are HTTP errors with a JSON-RPC error body (id null).
Response TransportError(const Status& st) {
  Response r = RpcResponse(HttpStatusOf(st.code()), RpcError(nullptr, kInvalidRequest, st.message()));
  if (st.code() == Code::kUnauthenticated) r.headers["WWW-Authenticate"] = "Bearer";
  return r;
}

asio::awaitable<Response> Initialize(ApiContext& ctx, const Request& req, const Json& id,
                                     const Json& params) {
  std::string agent_id = req.Query("agent");
  if (agent_id.empty()) {
    co_return RpcResponse(200, RpcError(id, kInvalidParams,
                                        "name the agent whose tools to serve: /v1/mcp?agent={id}"));
  }
  // A string field of an object, or "" (clients send all sorts).
  auto text = [](const Json& obj, const char* field) -> std::string {
    if (!obj.is_object() || !obj.contains(field) || !obj[field].is_string()) return "";
    return obj[field].get<std::string>();
  };
  std::string asked = text(params, "protocolVersion");
  std::string version = Supported(asked) ? asked : kVersions[0];
  std::string client = params.is_object() && params.contains("clientInfo")
                           ? text(params["clientInfo"], "name") : "";
  if (client.empty()) client = "MCP client";
  store::Session session;
  session.id = NewId();
  session.tenant_id = req.principal.tenant_id;
  session.agent_id = agent_id;
  session.title = TruncateUtf8("MCP: " + client, 200);
  session.created_by = req.principal.token_id;
  session.created_at = session.updated_at = NowMillis();
  store::Agent agent;
  auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(agent, tx.agents().GetAgent(session.tenant_id, agent_id));
    KEEL_RETURN_IF_ERROR(access::Reachable(tx, session.tenant_id, req.principal.user_id, agent_id));
    return runs::OpenSession(tx, session, "mcp");
  });
  if (!written.ok()) {
    if (written.status().code() != Code::kNotFound) co_return TransportError(written.status());
    co_return RpcResponse(200, RpcError(id, kInvalidParams, "no agent " + agent_id));
  }
  Json result = {{"protocolVersion", version},
                 {"capabilities", {{"tools", {{"listChanged", false}}}, {"logging", Json::object()}}},
                 {"serverInfo", {{"name", "keel"}, {"title", "Keel agent " + agent.name}, {"version", "0.1"}}},
                 {"instructions", "Tools of the Keel agent '" + agent.name +
                                      "'. Every call passes Keel's policy; a call that needs a "
                                      "human waits for an approval."}};
  Json opened = {{"agent_id", agent_id}, {"session_id", session.id}, {"title", session.title}};
  co_await ctx.runtime.EmitFor(session.tenant_id, agent_id, "session.opened", std::move(opened));
  Response r = RpcResponse(200, RpcResult(id, result));
  r.headers["Mcp-Session-Id"] = session.id;
  co_return r;
}

asio::awaitable<Response> ToolsList(ApiContext& ctx, const store::Session& session, const Json& id) {
  store::Agent agent;
  Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(agent, tx.agents().GetAgent(session.tenant_id, session.agent_id));
    return Status::Ok();
  });
  if (!st.ok()) co_return RpcResponse(200, RpcError(id, kServerError, st.message()));
  Json tools = Json::array();
  for (const auto& t : co_await ctx.gateway.Offered(session.tenant_id, session.agent_id, agent.tools)) {
    tools.push_back(ToolJson(*t));
  }
  co_return RpcResponse(200, RpcResult(id, {{"tools", tools}}));
}

asio::awaitable<Response> ToolsCall(ApiContext& ctx, std::shared_ptr<McpState> state,
                                    const Request& req, const store::Session& session,
                                    const Json& id, const Json& params) {
  if (!params.is_object() || !params.contains("name") || !params["name"].is_string() ||
      params["name"].get_ref<const std::string&>().empty()) {
    co_return RpcResponse(200, RpcError(id, kInvalidParams, "params.name must be a tool's name"));
  }
  Json arguments = params.value("arguments", Json::object());
  if (arguments.is_null()) arguments = Json::object();
  if (!arguments.is_object()) {
    co_return RpcResponse(200, RpcError(id, kInvalidParams, "params.arguments must be an object"));
  }
  runtime::IntakeRequest intake;
  intake.tenant_id = session.tenant_id;
  intake.session_id = session.id;
  intake.requested_by = req.principal.token_id;
  intake.caller_role = req.principal.role;
  intake.call = {{"name", params["name"]}, {"arguments", arguments}};
  auto posted = co_await ctx.runtime.PostMessage(intake);
  if (!posted.ok()) co_return RpcResponse(200, RpcError(id, kServerError, posted.status().message()));
  auto recorded = ParseJson(posted->message.content);  // written by intake: {"id", "name", ...}
  std::string call_id = recorded.ok() ? recorded->value("id", "") : "";
  auto key = std::make_pair(session.id, DumpJson(id));
  state->in_flight[key] = posted->run.id;

  if (req.Header("accept").find("text/event-stream") == std::string::npos) {
    auto done = co_await AwaitCall(ctx, *state, key, posted->run, call_id, nullptr, Json());
    if (!done.ok()) co_return RpcResponse(200, RpcError(id, kServerError, done.status().message()));
    if (!*done) co_return Response::NoContent();  // cancelled by the client
    co_return RpcResponse(200, RpcResult(id, **done));
  }
  Response r;
  r.content_type = "text/event-stream";
  r.headers["X-Accel-Buffering"] = "no";
  store::Run run = posted->run;
  // The client's progress token (params._meta.progressToken: a string or an integer).
  Json token;
  if (params.contains("_meta") && params["_meta"].is_object() &&
      params["_meta"].contains("progressToken")) {
    const Json& t = params["_meta"]["progressToken"];
    if (t.is_string() || t.is_number_integer()) token = t;
  }
  r.stream = [&ctx, state, key, run, call_id, id,
              token](http::StreamWriter& w) -> asio::awaitable<void> {
    auto done = co_await AwaitCall(ctx, *state, key, run, call_id, &w, token);
    if (done.ok() && !*done) co_return;  // the client went away or cancelled
    Json message = done.ok() ? RpcResult(id, **done) : RpcError(id, kServerError, done.status().message());
    (void)co_await w.Write(Frame(message));
  };
  co_return r;
}

}  // namespace

void RegisterMcpServerRoutes(http::Router& router, ApiContext& ctx) {
  auto state = std::make_shared<McpState>();

  router.Add("POST", "/v1/mcp", [&ctx, state](Request& req) -> asio::awaitable<Response> {
    if (Status st = CheckHostAndOrigin(req, ctx.config); !st.ok()) {
      co_return TransportError(st);
    }
    mcp::PostedMessage msg = mcp::ParsePostedMessage(req.body);
    if (msg.error_code != 0)
      co_return RpcResponse(400, RpcError(nullptr, msg.error_code, msg.error));
    const bool has_id = msg.has_id;
    const Json& id = msg.id;
    const std::string& method = msg.method;
    const Json& params = msg.params;
    if (method == "initialize") {
      if (!has_id)
        co_return RpcResponse(400, RpcError(nullptr, kInvalidRequest, "initialize needs an id"));
      co_return co_await Initialize(ctx, req, id, params);
    }
    if (Status st = CheckVersionHeader(req); !st.ok()) co_return TransportError(st);
    auto session = co_await SessionOf(ctx, req);
    if (!session.ok()) co_return TransportError(session.status());
    if (method.empty()) {  // a response to a request of ours: this server sends none
      co_return Accepted();
    }
    if (!has_id) {  // a notification
      if (method == "notifications/cancelled" && params.is_object() && params.contains("requestId")) {
        auto key = std::make_pair(session->id, DumpJson(params["requestId"]));
        if (auto it = state->in_flight.find(key); it != state->in_flight.end()) {
          state->cancelled.insert(key);
          // A copy: the entry may be erased while the cancel is written.
          const std::string run_id = it->second;
          (void)co_await ctx.runtime.Cancel(session->tenant_id, run_id);
        }
      }
      co_return Accepted();
    }
    if (method == "ping") co_return RpcResponse(200, RpcResult(id, Json::object()));
    if (method == "logging/setLevel") co_return RpcResponse(200, RpcResult(id, Json::object()));
    if (method == "tools/list") co_return co_await ToolsList(ctx, *session, id);
    if (method == "tools/call") co_return co_await ToolsCall(ctx, state, req, *session, id, params);
    co_return RpcResponse(200, RpcError(id, kMethodNotFound, "method '" + method + "' is not served"));
  });

  // Closing the session. A call still waiting (for an approval) keeps it open: 409.
  router.Add("DELETE", "/v1/mcp", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (Status st = CheckHostAndOrigin(req, ctx.config); !st.ok()) {
      co_return TransportError(st);
    }
    if (Status st = CheckVersionHeader(req); !st.ok()) co_return TransportError(st);
    auto session = co_await SessionOf(ctx, req);
    if (!session.ok()) co_return TransportError(session.status());
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(bool busy, tx.runs().SessionBusy(session->tenant_id, session->id));
      if (busy) return Conflict("the MCP session has a call in flight; it stays open");
      const Millis at = NowMillis();
      KEEL_RETURN_IF_ERROR(
          tx.sessions().UpdateSessionStatus(session->tenant_id, session->id, "inactive", at));
      tx.Carry("sessions", store::SessionStatusImage(session->id, "inactive", at));
      return tx.events().Append({session->tenant_id, "session.closed@v1", session->agent_id,
                                 session->id, "", {}});
    });
    if (!written.ok()) co_return TransportError(written.status());
    Json closed = {{"agent_id", session->agent_id}, {"session_id", session->id},
                   {"title", session->title}};
    co_await ctx.runtime.EmitFor(session->tenant_id, session->agent_id, "session.closed",
                                 std::move(closed));
    co_return Response::NoContent();
  });
}

}  // namespace keel::api

#include "keel/mcp/http_client.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>

#include "keel/http/client.h"
#include "keel/mcp/messages.h"

namespace keel::mcp {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

constexpr int kMaxToolPages = 100;

// Splits complete SSE events off the front of `buffer`; returns the data of each.
std::vector<std::string> TakeSseEvents(std::string& buffer) {
  std::vector<std::string> out;
  while (true) {
    size_t end = buffer.find("\n\n");
    size_t sep = 2;
    if (size_t crlf = buffer.find("\r\n\r\n"); crlf != std::string::npos && crlf < end) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) return out;
    std::string event = buffer.substr(0, end);
    buffer.erase(0, end + sep);
    std::string data;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      std::string line = event.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) {
        std::string value = line.substr(5);
        if (!value.empty() && value[0] == ' ') value.erase(0, 1);
        if (!data.empty()) data += "\n";
        data += value;
      }
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
    if (!data.empty()) out.push_back(std::move(data));
  }
}

}  // namespace

McpHttpClient::McpHttpClient(HttpServerSpec spec, ClientOptions options,
                             const http::OutboundGuard& outbound)
    : spec_(std::move(spec)),
      options_(options),
      http_(std::make_unique<http::Client>([&] {
        http::Client::Options o;
        o.outbound = outbound;
        return o;
      }())) {}

std::string McpHttpClient::Label() const {
  return "MCP server " + (spec_.name.empty() ? spec_.url : spec_.name);
}

Result<std::unique_ptr<McpHttpClient>> McpHttpClient::Connect(const HttpServerSpec& spec,
                                                              const ClientOptions& options,
                                                              const http::OutboundGuard& outbound) {
  if (spec.url.rfind("http://", 0) != 0 && spec.url.rfind("https://", 0) != 0) {
    return InvalidArgument("an MCP server URL must start with http:// or https://");
  }
  std::unique_ptr<McpHttpClient> c(new McpHttpClient(spec, options, outbound));
  Json params = {{"protocolVersion", std::string(kProtocolVersion)},
                 {"capabilities", Json::object()},
                 {"clientInfo", {{"name", "keel"}, {"version", "0.1"}}}};
  KEEL_ASSIGN_OR_RETURN(Json result, c->Request("initialize", params, options.init_timeout_ms));
  std::string version = result.value("protocolVersion", "");
  if (!IsSupportedProtocolVersion(version)) {
    return Unavailable(c->Label() + " speaks protocol version '" + version +
                       "', which Keel does not support");
  }
  {
    std::lock_guard<std::mutex> lock(c->mu_);
    c->protocol_version_ = version;
  }
  c->has_tools_ = result.contains("capabilities") && result["capabilities"].is_object() &&
                  result["capabilities"].contains("tools");
  KEEL_RETURN_IF_ERROR(c->Notify("notifications/initialized", Json::object()));
  return c;
}

McpHttpClient::~McpHttpClient() {
  std::string session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    session = session_id_;
  }
  if (session.empty() || broken_) return;
  // Ends the session; the server may refuse (405), which is fine.
  http::ClientRequest req;
  req.method = "DELETE";
  req.url = spec_.url;
  req.headers = spec_.headers;
  req.headers.emplace_back("Mcp-Session-Id", session);
  req.timeout = std::chrono::milliseconds(2000);
  asio::io_context io;
  asio::co_spawn(io, [this, &req]() -> asio::awaitable<void> {
    (void)co_await http_->Fetch(req, 64 * 1024);
  }, asio::detached);
  io.run();
}

void McpHttpClient::Observe(const Json& message) {
  if (message.value("method", "") == "notifications/tools/list_changed") changed_ = true;
}

Result<Json> McpHttpClient::Post(const Json& message, int64_t timeout_ms, const Json& id) {
  http::ClientRequest req;
  req.method = "POST";
  req.url = spec_.url;
  req.headers = spec_.headers;
  req.headers.emplace_back("Content-Type", "application/json");
  req.headers.emplace_back("Accept", "application/json, text/event-stream");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!session_id_.empty()) req.headers.emplace_back("Mcp-Session-Id", session_id_);
    if (!protocol_version_.empty()) req.headers.emplace_back("MCP-Protocol-Version", protocol_version_);
  }
  req.body = DumpJson(message);
  if (req.body.size() > options_.max_message_bytes) {
    return Status(Code::kPayloadTooLarge, "the request to " + Label() + " is too large");
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  req.timeout = std::chrono::milliseconds(timeout_ms);

  Result<Json> out = Internal("the request was not sent");
  asio::io_context io;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    auto opened = co_await http_->Open(req);
    if (!opened.ok()) {
      Code code = opened.status().code() == Code::kPermissionDenied ? Code::kPermissionDenied
                                                                     : Code::kUnavailable;
      out = Status(code, Label() + ": " + opened.status().message());
      co_return;
    }
    auto& stream = *opened;
    if (std::string sid = stream->Header("mcp-session-id"); !sid.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      session_id_ = sid;
    }
    int status = stream->status();
    if (id.is_null() && (status == 202 || status == 200 || status == 204)) {
      out = Json(nullptr);
      co_return;
    }
    if (status == 404 && !id.is_null()) {
      broken_ = true;  // the server forgot the session: a new connection starts one
      out = Unavailable(Label() + " ended the session (404)");
      co_return;
    }
    if (status < 200 || status >= 300) {
      // The status alone: the body is the server's to say anything in, and errors reach the
      // model, the tenant's clients and the store (a server inside a network would otherwise
      // make Keel a reader of it).
      out = Unavailable(Label() + " answered HTTP " + std::to_string(status));
      co_return;
    }
    std::string type = stream->Header("content-type");
    auto matches = [&](const Json& m) { return m.is_object() && m.contains("id") && m["id"] == id; };
    if (type.find("text/event-stream") == std::string::npos) {
      auto body = co_await stream->ReadAll(options_.max_message_bytes);
      if (!body.ok()) {
        out = Unavailable(Label() + ": " + body.status().message());
        co_return;
      }
      auto parsed = ParseJson(*body);
      if (!parsed.ok()) {
        out = Unavailable(Label() + " sent a response that is refused: " + parsed.status().message());
        co_return;
      }
      std::vector<Json> messages = parsed->is_array() ? parsed->get<std::vector<Json>>()
                                                      : std::vector<Json>{*parsed};
      for (const Json& m : messages) {
        if (matches(m)) {
          out = m;
          co_return;
        }
        if (m.is_object()) Observe(m);
      }
      out = Unavailable(Label() + " sent no response to the request (" +
                        std::to_string(body->size()) + " bytes of something else)");
      co_return;
    }
    std::string buffer;
    while (Clock::now() < deadline) {
      auto piece = co_await stream->Next();
      if (!piece.ok()) {
        out = Unavailable(Label() + ": " + piece.status().message());
        co_return;
      }
      if (!*piece) break;
      buffer += **piece;
      if (buffer.size() > options_.max_message_bytes) {
        out = Unavailable(Label() + " sent an event larger than the limit");
        co_return;
      }
      for (const std::string& data : TakeSseEvents(buffer)) {
        auto parsed = ParseJson(data);
        if (!parsed.ok()) continue;  // an event that is not a message Keel reads is skipped
        const Json& m = *parsed;
        if (matches(m)) {
          out = m;
          co_return;
        }
        if (m.is_object()) Observe(m);
      }
    }
    out = Unavailable(Label() + " did not answer within " + std::to_string(timeout_ms) + " ms");
  }, asio::detached);
  io.run();
  return out;
}

Result<Json> McpHttpClient::Request(const std::string& method, Json params, int64_t timeout_ms) {
  if (broken_) return Unavailable(Label() + " is disconnected");
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
  }
  Json message = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
  KEEL_ASSIGN_OR_RETURN(Json response, Post(message, timeout_ms, Json(id)));
  if (response.contains("error")) {
    const Json& e = response["error"];
    return InvalidArgument(Label() + " answered " + method + " with error " +
                           std::to_string(e.value("code", 0)) + ": " + e.value("message", ""));
  }
  if (!response.contains("result")) return Unavailable(Label() + " sent a response without a result");
  return response["result"];
}

Status McpHttpClient::Notify(const std::string& method, Json params) {
  Json message = {{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
  return Post(message, options_.request_timeout_ms, Json(nullptr)).status();
}

Result<std::vector<McpTool>> McpHttpClient::ListTools() {
  if (!has_tools_) return std::vector<McpTool>();
  return ListAllTools(Label(), kMaxToolPages, [this](Json params) {
    return Request("tools/list", std::move(params), options_.request_timeout_ms);
  });
}

Result<Json> McpHttpClient::CallTool(const std::string& name, const Json& arguments,
                                     int64_t timeout_ms) {
  if (!arguments.is_null() && !arguments.is_object()) {
    return InvalidArgument("tool arguments must be a JSON object");
  }
  Json params = {{"name", name}, {"arguments", arguments.is_null() ? Json::object() : arguments}};
  KEEL_ASSIGN_OR_RETURN(Json result, Request("tools/call", params,
                                              timeout_ms > 0 ? timeout_ms : options_.request_timeout_ms));
  if (Status st = CheckCallResult(result); !st.ok()) {
    return Unavailable(Label() + " sent a malformed tools/call result for '" + name + "': " +
                       st.message());
  }
  return result;
}

}  // namespace keel::mcp

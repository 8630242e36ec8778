#pragma once
// MCP over the streamable HTTP transport (spec revision 2025-06-18, basic/transports): every
// client message is a POST of one JSON-RPC message to the server's endpoint; the server answers
// a request with either one JSON body or a Server-Sent Events stream that carries the response
// (and possibly notifications before it), and a notification with 202 Accepted. The session id
// the server assigns at initialize (Mcp-Session-Id) goes with every later request, and a
// DELETE ends the session when the client is destroyed.
//
// Blocking and thread-safe like McpClient: each call runs its own small event loop on the
// calling (worker) thread. Never call from the server's event loop.

#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "keel/http/outbound_guard.h"
#include "keel/mcp/mcp_client.h"

namespace keel::http {
class Client;
}

namespace keel::mcp {

struct HttpServerSpec {
  std::string url;  // the MCP endpoint, http:// or https://
  std::vector<std::pair<std::string, std::string>> headers;  // sent with every request
  std::string name;  // for messages
};

class McpHttpClient final : public McpSession {
 public:
  // Initializes a session within options.init_timeout_ms. Every request's connection is checked
  // by `outbound` (the tenant chose the URL). kUnavailable when the server cannot be reached,
  // answers with an HTTP error or a JSON-RPC error, or speaks an unsupported protocol version;
  // kPermissionDenied when the guard refuses its address; kInvalidArgument for a malformed URL.
  // An HTTP error is reported by its status alone: the server's body never reaches a message.
  static Result<std::unique_ptr<McpHttpClient>> Connect(const HttpServerSpec& spec,
                                                        const ClientOptions& options,
                                                        const http::OutboundGuard& outbound);
  ~McpHttpClient() override;

  Result<std::vector<McpTool>> ListTools() override;
  Result<Json> CallTool(const std::string& name, const Json& arguments,
                        int64_t timeout_ms = 0) override;
  // False once the server lost the session (404) or a request could not be delivered.
  bool alive() const override { return !broken_; }
  bool tools_changed() override { return changed_.exchange(false); }

 private:
  McpHttpClient(HttpServerSpec spec, ClientOptions options, const http::OutboundGuard& outbound);
  // Sends a request and waits for its response; the result member, or the error.
  Result<Json> Request(const std::string& method, Json params, int64_t timeout_ms);
  Status Notify(const std::string& method, Json params);
  // POSTs `message`; returns the response with `id` (or null for a notification).
  Result<Json> Post(const Json& message, int64_t timeout_ms, const Json& id);
  // Handles one message the server sent: a notification or a request the client ignores.
  void Observe(const Json& message);
  std::string Label() const;

  const HttpServerSpec spec_;
  const ClientOptions options_;
  std::unique_ptr<http::Client> http_;
  std::mutex mu_;
  std::string session_id_;        // GUARDED_BY(mu_)
  std::string protocol_version_;  // GUARDED_BY(mu_)
  int64_t next_id_ = 1;           // GUARDED_BY(mu_)
  bool has_tools_ = true;
  std::atomic<bool> broken_{false};
  std::atomic<bool> changed_{false};
};

}  // namespace keel::mcp

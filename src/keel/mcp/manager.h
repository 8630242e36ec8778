#pragma once
// McpManager — the live connections to the tenants' MCP servers, one per registered server,
// started on first use and started again after the server died. Tool lists are cached per
// connection and refreshed after notifications/tools/list_changed.
//
// Threads: blocking and thread-safe; call from worker threads (the gateway's tool pool), never
// from the event loop. Calls to one server run concurrently on its one connection.
//
// Everything a server sends reaches the rest of Keel through here (tool lists, results, errors
// with its stderr, the status), so this is where the secrets it was given are taken back out
// of it (ServerLaunch::redactor). Servers over HTTP are reached only at addresses `outbound`
// allows.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "keel/http/outbound_guard.h"
#include "keel/mcp/http_client.h"
#include "keel/mcp/mcp_client.h"
#include "keel/secrets/redactor.h"

namespace keel::mcp {

// A registered server with its secrets resolved: what it takes to start it.
struct ServerLaunch {
  std::string server_id;
  std::string tenant_id;
  std::string name;
  std::string transport = "stdio";  // stdio | http
  StdioServerSpec spec;             // stdio
  HttpServerSpec http;              // http
  ClientOptions options;
  // The secret values given to the server (env or headers), taken back out of all it sends.
  secrets::Redactor redactor;
  // Changes when the registration changed (a different command or environment): a running
  // connection started from another fingerprint is replaced.
  std::string fingerprint;
};

class McpManager {
 public:
  explicit McpManager(http::OutboundGuard outbound = {}) : outbound_(std::move(outbound)) {}
  ~McpManager();

  // The server's tools (connecting first when needed).
  Result<std::vector<McpTool>> Tools(const ServerLaunch& launch);
  // Calls a tool. A connection found dead is started again once before the call.
  Result<Json> Call(const ServerLaunch& launch, const std::string& tool, const Json& arguments,
                    int64_t timeout_ms);
  // Stops and forgets a server's connection (it was deleted).
  void Forget(const std::string& server_id);
  // The tenant's connections whose servers are no longer registered (deleted through another
  // node), to Forget. `registered`: the ids the tenant has now. Never blocks: callable from the
  // event loop, which then forgets the few it finds on a worker thread.
  std::vector<std::string> Stale(const std::string& tenant_id,
                                 const std::vector<std::string>& registered);
  // "ready", "not_connected" or "error: ..." for the API.
  std::string StatusOf(const std::string& server_id);

 private:
  struct Entry {
    std::mutex mu;  // serializes (re)starting and tool-list refreshes of this server
    std::shared_ptr<McpSession> client;
    std::string fingerprint;
    std::vector<McpTool> tools;
    bool have_tools = false;
    std::string last_error;
  };
  std::shared_ptr<Entry> EntryFor(const ServerLaunch& launch);
  // Returns a live client for the launch, starting one when there is none or it died.
  Result<std::shared_ptr<McpSession>> Connect(Entry& e, const ServerLaunch& launch);

  const http::OutboundGuard outbound_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> entries_;  // GUARDED_BY(mu_)
  std::map<std::string, std::string> tenant_of_;          // server id -> tenant; GUARDED_BY(mu_)
};

}  // namespace keel::mcp

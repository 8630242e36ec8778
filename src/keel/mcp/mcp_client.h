#pragma once
// A client for the Model Context Protocol (MCP) over the stdio transport: Keel starts an MCP
// server as a child process and speaks JSON-RPC 2.0 with it, one message per line on the
// child's stdin and stdout; the child's stderr is its log (spec revision 2025-06-18,
// basic/transports "stdio"). The client performs the lifecycle (initialize, then the
// notifications/initialized notification), lists and calls tools, answers the server's pings,
// and notes notifications/tools/list_changed.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::mcp {

// The protocol revision the client asks for in `initialize`. A server may answer with an older
// revision it prefers; the client accepts 2025-06-18, 2025-03-26 and 2024-11-05 and refuses
// (disconnects from) any other.
inline constexpr std::string_view kProtocolVersion = "2025-06-18";
bool IsSupportedProtocolVersion(std::string_view version);

// A tool as the server lists it (tools/list). Untrusted: the server chose every field.
struct McpTool {
  std::string name;         // unique per server, as the server spells it
  std::string description;  // "" when the server gave none
  Json input_schema;        // the tool's inputSchema; {"type":"object"} when the server gave none
  Json annotations;         // hints (readOnlyHint, destructiveHint, ...); {} when none
  std::string title;        // display name (2025-06-18); "" when none
};

// How to start a server.
struct StdioServerSpec {
  // argv: command[0] is a path, or a name looked up in the child's PATH (below).
  std::vector<std::string> command;
  // The child's whole environment: exactly these variables, plus PATH and HOME copied from
  // Keel's own environment when this map does not set them (most servers are scripts that need
  // an interpreter from PATH, and npm/node and Python look under HOME). Nothing else of Keel's
  // environment reaches the server, secrets included.
  std::map<std::string, std::string> env;
  // The child's working directory; "" inherits Keel's.
  std::string cwd;
  // Names the server in error messages and logs; "" uses the command line.
  std::string name;
  // The user and group the server runs as; -1: Keel's own.
  int run_as_uid = -1;
  int run_as_gid = -1;
};

struct ClientOptions {
  int64_t request_timeout_ms = 30000;  // default wait for a tools/list page or a tools/call
  int64_t init_timeout_ms = 20000;     // wait for the answer to initialize
  // The longest line (message) accepted from the server; a longer one breaks the connection.
  // Requests longer than this are refused before they are sent.
  size_t max_message_bytes = size_t(16) << 20;
  // Lines on the server's stdout that are not JSON-RPC messages are logged and ignored, up to
  // this many over the connection's life; one more breaks the connection.
  int max_garbage_lines = 100;
};

// One live connection to one MCP server process.
//
// Ownership: whoever called StartStdio. Destroying the client shuts the server down: its stdin
// is closed (the MCP way to ask a stdio server to exit), then after 2 s its process group gets
// SIGTERM, then after 1 s more SIGKILL; the destructor returns once the process is reaped and
// the client's thread joined.
//
// Threads: every method is blocking and thread-safe; any number of worker threads may call at
// once, and each call waits only for its own answer. Do not call from the event loop. Each
// client runs one I/O thread of its own that does all reading and writing of the pipes (so a
// server that writes while Keel writes cannot deadlock either side), drains stderr, and reaps
// the process.
//
// Failures: after the connection breaks it stays broken: the server exited, wrote a line longer
// than max_message_bytes, wrote too many non-JSON-RPC lines, or closed its stdout or stdin.
// Every call then waiting, and every later call, fails at once with kUnavailable saying why
// (the exit status and the end of the server's stderr when it exited). A caller that wants the
// server back starts a new client.
// What Keel needs of a connection to an MCP server, whatever its transport (stdio: McpClient;
// streamable HTTP: McpHttpClient in http_client.h). Blocking and thread-safe.
class McpSession {
 public:
  virtual ~McpSession() = default;
  virtual Result<std::vector<McpTool>> ListTools() = 0;
  virtual Result<Json> CallTool(const std::string& name, const Json& arguments,
                                int64_t timeout_ms = 0) = 0;
  virtual bool alive() const = 0;
  virtual bool tools_changed() = 0;
};

class McpClient final : public McpSession {
 public:
  // Starts the server and performs the initialize handshake within options.init_timeout_ms.
  // Errors: kInvalidArgument for a bad spec; kNotFound when the command does not exist;
  // kUnavailable when it cannot be started, exits or breaks during the handshake (the message
  // carries the last lines of its stderr), does not answer in time, answers initialize with an
  // error or a malformed result, or speaks an unsupported protocol version.
  static Result<std::unique_ptr<McpClient>> StartStdio(const StdioServerSpec& spec,
                                                       const ClientOptions& options);

  // REQUIRES: no call of this client is running or will start.
  ~McpClient() override;
  McpClient(const McpClient&) = delete;
  McpClient& operator=(const McpClient&) = delete;

  // All tools of the server, following tools/list's nextCursor through every page. Empty when
  // the server did not declare the tools capability. kUnavailable for a broken connection, a
  // timeout (request_timeout_ms per page) or a malformed answer; kInvalidArgument when the
  // server answers with a JSON-RPC error.
  Result<std::vector<McpTool>> ListTools() override;

  // Calls a tool and returns the MCP result object as received: {"content": [...],
  // "isError"?: bool, "structuredContent"?: {...}}. A tool that ran and failed is a success
  // here with "isError": true (the result is for the model to read).
  // `arguments`: a JSON object, or null for none. `timeout_ms` <= 0: request_timeout_ms.
  // Errors: kInvalidArgument when `arguments` is not an object, or the server answered with a
  // JSON-RPC error (the message names the server's code and message); kPayloadTooLarge when the
  // request exceeds max_message_bytes; kUnavailable when the server did not answer in time (the
  // request is then cancelled with notifications/cancelled and the client stays usable), or the
  // connection is or becomes broken, or the result is malformed.
  Result<Json> CallTool(const std::string& name, const Json& arguments,
                        int64_t timeout_ms = 0) override;

  // True while the process runs and the connection is healthy.
  bool alive() const override;
  // True once after each notifications/tools/list_changed (several coalesce): the caller
  // should ListTools again.
  bool tools_changed() override;
  // From the initialize result: serverInfo.name ("" when absent), and the protocol revision
  // the server chose.
  std::string server_name() const;
  std::string protocol_version() const;
  // The last 4 KiB (about) of the server's stderr, for error messages and diagnostics.
  std::string stderr_tail() const;

 private:
  class Connection;  // the process, its pipes, the I/O thread and the requests in flight
  McpClient();
  Status Initialize(int64_t timeout_ms);

  std::unique_ptr<Connection> conn_;
  ClientOptions options_;
  // Set by Initialize before StartStdio returns the client; immutable after.
  std::string server_name_;
  std::string protocol_version_;
  Json server_capabilities_;
};

}  // namespace keel::mcp

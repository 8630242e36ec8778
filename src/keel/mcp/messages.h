#pragma once
// The JSON-RPC messages of MCP that Keel reads from others, checked in one place: what an MCP
// server answers Keel's client (tools/list pages, tools/call results; both transports), and
// what an MCP client posts to Keel's own endpoint (POST /v1/mcp). Everything here is untrusted
// input; nothing throws, and every refusal says what is wrong.

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/mcp/mcp_client.h"

namespace keel::mcp {

// Appends the tools of one tools/list result page to `tools` and sets `next_cursor` to its
// nextCursor ("" when it is the last page). kInvalidArgument naming what is malformed: no tools
// array, a tool without a name, a nextCursor that is not a string.
Status ReadToolsPage(const Json& result, std::vector<McpTool>& tools, std::string& next_cursor);

// Every tool of a server: tools/list pages through `request` (which sends one tools/list with
// the given params and returns its result) until the last, at most `max_pages`. kUnavailable,
// prefixed with `label`, for a malformed page, a repeated cursor or too many pages; errors of
// `request` as they are.
Result<std::vector<McpTool>> ListAllTools(const std::string& label, int max_pages,
                                          const std::function<Result<Json>(Json params)>& request);

// Checks the shape of a tools/call result: an object with a content array (or
// structuredContent) and a boolean isError if any. kInvalidArgument naming what is wrong.
Status CheckCallResult(const Json& result);

// A message posted to Keel's MCP endpoint. When `error_code` is not 0 the message is refused:
// answer with that JSON-RPC error code, `error` as its message and a null id.
struct PostedMessage {
  int error_code = 0;
  std::string error;
  bool has_id = false;  // false: a notification (or a response, with an empty method)
  Json id;              // a string or an integer; null without one
  std::string method;   // "" when the message has none (a response to the server)
  Json params;          // {} when absent
};

inline constexpr int kJsonRpcParseError = -32700;
inline constexpr int kJsonRpcInvalidRequest = -32600;

PostedMessage ParsePostedMessage(std::string_view body);

}  // namespace keel::mcp

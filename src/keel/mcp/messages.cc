#include "keel/mcp/messages.h"

#include <set>

namespace keel::mcp {
namespace {

const Json* Field(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::string StringField(const Json& obj, const char* key) {
  const Json* v = Field(obj, key);
  return v && v->is_string() ? v->get<std::string>() : "";
}

std::string Truncate(std::string s, size_t max) {
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

}  // namespace

Status ReadToolsPage(const Json& result, std::vector<McpTool>& tools, std::string& next_cursor) {
  const Json* list = Field(result, "tools");
  if (!list || !list->is_array()) return InvalidArgument("no tools array");
  for (const Json& t : *list) {
    McpTool tool;
    tool.name = StringField(t, "name");
    if (tool.name.empty()) return InvalidArgument("a tool without a name: " + Truncate(DumpJson(t), 200));
    tool.description = StringField(t, "description");
    tool.title = StringField(t, "title");
    const Json* schema = Field(t, "inputSchema");
    tool.input_schema = schema && schema->is_object() ? *schema : Json{{"type", "object"}};
    const Json* annotations = Field(t, "annotations");
    tool.annotations = annotations && annotations->is_object() ? *annotations : Json::object();
    tools.push_back(std::move(tool));
  }
  next_cursor.clear();
  const Json* next = Field(result, "nextCursor");
  if (!next || next->is_null()) return Status::Ok();
  if (!next->is_string()) return InvalidArgument("nextCursor is not a string");
  next_cursor = next->get<std::string>();
  return Status::Ok();
}

Result<std::vector<McpTool>> ListAllTools(const std::string& label, int max_pages,
                                          const std::function<Result<Json>(Json params)>& request) {
  std::vector<McpTool> tools;
  std::set<std::string> cursors_seen;
  std::string cursor;
  for (int page = 0; page < max_pages; ++page) {
    Json params = Json::object();
    if (!cursor.empty()) params["cursor"] = cursor;
    KEEL_ASSIGN_OR_RETURN(Json result, request(std::move(params)));
    if (Status st = ReadToolsPage(result, tools, cursor); !st.ok()) {
      return Unavailable(label + " sent a malformed tools/list result: " + st.message());
    }
    if (cursor.empty()) return tools;
    if (!cursors_seen.insert(cursor).second) {
      return Unavailable(label + " sent a malformed tools/list result: nextCursor repeats '" +
                         Truncate(cursor, 100) + "'");
    }
  }
  return Unavailable(label + " lists tools over more than " + std::to_string(max_pages) + " pages");
}

Status CheckCallResult(const Json& result) {
  if (!result.is_object()) return InvalidArgument("the result is not an object");
  const Json* content = Field(result, "content");
  const Json* is_error = Field(result, "isError");
  if (content && !content->is_array()) return InvalidArgument("content is not an array");
  if (is_error && !is_error->is_boolean()) return InvalidArgument("isError is not a boolean");
  if (!content && !Field(result, "structuredContent")) {
    return InvalidArgument("the result has neither content nor structuredContent");
  }
  return Status::Ok();
}

PostedMessage ParsePostedMessage(std::string_view body) {
  PostedMessage m;
  auto refuse = [&m](int code, std::string why) {
    m.error_code = code;
    m.error = std::move(why);
    return m;
  };
  auto parsed = ParseJson(body);
  if (!parsed.ok()) return refuse(kJsonRpcParseError, parsed.status().message());
  const Json& msg = *parsed;
  if (msg.is_array()) {
    return refuse(kJsonRpcInvalidRequest, "JSON-RPC batches are not part of this protocol version");
  }
  if (!msg.is_object() || StringField(msg, "jsonrpc") != "2.0") {
    return refuse(kJsonRpcInvalidRequest, "not a JSON-RPC 2.0 message");
  }
  if (const Json* id = Field(msg, "id")) {
    if (!id->is_string() && !id->is_number_integer()) {
      return refuse(kJsonRpcInvalidRequest, "id must be a string or an integer");
    }
    m.has_id = true;
    m.id = *id;
  }
  m.method = StringField(msg, "method");
  const Json* params = Field(msg, "params");
  m.params = params ? *params : Json::object();
  return m;
}

}  // namespace keel::mcp

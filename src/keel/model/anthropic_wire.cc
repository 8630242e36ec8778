#include "keel/model/anthropic_wire.h"

#include <algorithm>
#include <optional>

#include "keel/common/crypto.h"
#include "keel/model/quick_json.h"

namespace keel::model::anthropic {
namespace {

// More content blocks than any sane message has; bounds what a hostile server can make us hold.
constexpr size_t kMaxBlocks = 512;

std::string_view Trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// A short, printable excerpt of untrusted text for error messages.
std::string Excerpt(std::string_view s, size_t max = 200) {
  std::string out;
  for (char c : s.substr(0, max)) {
    unsigned char u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7f ? ' ' : c);
  }
  if (s.size() > max) out += "...";
  return out;
}

// obj[field] when it is a string; "" otherwise.
std::string StringField(const Json& obj, const char* field) {
  auto it = obj.find(field);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// obj[field] when it is an integer; nullopt otherwise.
std::optional<int64_t> IntField(const Json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || !it->is_number_integer()) return std::nullopt;
  if (it->is_number_unsigned()) {
    return static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX));
  }
  return it->get<int64_t>();
}

int64_t TokenCount(const Json& usage, const char* field) {
  return std::max<int64_t>(0, IntField(usage, field).value_or(0));
}

// Input tokens include those read from or written to Anthropic's prompt cache: they are billed.
void ReadUsage(const Json& usage, Usage& out, bool is_message_start) {
  if (!usage.is_object()) return;
  bool has_input = usage.contains("input_tokens");
  if (is_message_start || has_input) {
    out.input_tokens = TokenCount(usage, "input_tokens") +
                       TokenCount(usage, "cache_creation_input_tokens") +
                       TokenCount(usage, "cache_read_input_tokens");
  }
  if (usage.contains("output_tokens")) out.output_tokens = TokenCount(usage, "output_tokens");
}

Status ServerError(const Json& error) {
  std::string type;
  std::string message;
  if (error.is_object()) {
    type = StringField(error, "type");
    message = StringField(error, "message");
  } else if (error.is_string()) {
    message = error.get<std::string>();
  }
  if (message.empty()) message = Excerpt(DumpJson(error));
  return Unavailable("the server reported an error: " + (type.empty() ? "" : type + ": ") +
                     message);
}

// Turns one tool_use block into Keel's form: name decoded, input checked.
Result<ToolCallRequest> MakeToolCall(const std::string& id, const std::string& wire_name,
                                     Json input, const std::string& stop_reason,
                                     const ToolNameMap& names) {
  if (wire_name.empty()) return Unavailable("the model returned a tool call without a name");
  // A name that was never offered passes through: the gateway denies it as an unknown tool and
  // the model reads that as the tool's answer, as with openai.
  auto keel_name = names.Decode(wire_name);
  ToolCallRequest call;
  call.id = id.empty() ? "call_" + RandomHex(12) : id;
  call.name = keel_name.ok() ? std::move(keel_name).value() : wire_name;
  if (!input.is_object()) {
    std::string cut = stop_reason == "max_tokens" ? " (the output was cut at max_tokens)" : "";
    return Unavailable("the model's input for tool '" + call.name + "' is not a JSON object" + cut +
                       ": " + Excerpt(DumpJson(input)));
  }
  call.arguments = std::move(input);
  return call;
}

Status CheckOption(const Json& config, const char* field, Json& body, bool integer) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return Status::Ok();
  if (integer ? !it->is_number_integer() : !it->is_number()) {
    return InvalidArgument(std::string("agent config '") + field + "' must be " +
                           (integer ? "an integer" : "a number"));
  }
  body[field] = *it;
  return Status::Ok();
}

}  // namespace

std::string WireToolId(std::string_view id) {
  std::string out;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    out.push_back(ok ? c : '_');
  }
  return out.empty() ? "call" : out;
}

Result<Json> BuildMessagesRequest(const ModelRequest& request, bool stream, int default_max_tokens,
                                  ToolNameMap& names) {
  Json body = Json::object();
  body["model"] = request.model;
  int64_t max_tokens = default_max_tokens;
  const Json& config = request.agent_config;
  if (config.is_object()) {
    auto it = config.find("max_tokens");
    if (it != config.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 1) {
        return InvalidArgument("agent config 'max_tokens' must be a positive integer");
      }
      max_tokens = it->get<int64_t>();
    }
  }
  body["max_tokens"] = max_tokens;

  // Tools first, so their names claim their wire forms before history's do.
  Json tools = Json::array();
  for (const ToolSpec& tool : request.tools) {
    Json t = {{"name", names.Encode(tool.name)}};
    if (!tool.description.empty()) t["description"] = tool.description;
    t["input_schema"] = tool.parameters.is_object()
                            ? tool.parameters
                            : Json{{"type", "object"}, {"properties", Json::object()}};
    tools.push_back(std::move(t));
  }

  std::string system;
  Json messages = Json::array();
  // Adds a block to the last message when it has `role`, else starts a new message.
  auto append = [&messages](const char* role, Json block) {
    if (!messages.empty() && messages.back()["role"] == role) {
      messages.back()["content"].push_back(std::move(block));
    } else {
      messages.push_back({{"role", role}, {"content", Json::array({std::move(block)})}});
    }
  };
  for (const ChatMessage& m : request.messages) {
    if (m.role == "system" || m.role == "developer") {
      if (!m.content.empty()) system += (system.empty() ? "" : "\n\n") + m.content;
    } else if (m.role == "user") {
      // The API refuses empty text blocks.
      if (!m.content.empty()) append("user", {{"type", "text"}, {"text", m.content}});
    } else if (m.role == "assistant") {
      if (!m.content.empty()) append("assistant", {{"type", "text"}, {"text", m.content}});
      for (const ToolCallRequest& call : m.tool_calls) {
        Json input = call.arguments.is_object() ? call.arguments : Json::object();
        append("assistant", {{"type", "tool_use"},
                             {"id", WireToolId(call.id)},
                             {"name", names.Encode(call.name)},
                             {"input", std::move(input)}});
      }
    } else if (m.role == "tool") {
      Json result = {{"type", "tool_result"}, {"tool_use_id", WireToolId(m.tool_call_id)}};
      if (!m.content.empty()) result["content"] = m.content;
      append("user", std::move(result));
    } else {
      return InvalidArgument("message role '" + Excerpt(m.role, 80) + "' has no Messages API form");
    }
  }
  if (!system.empty()) body["system"] = system;
  body["messages"] = std::move(messages);
  if (!tools.empty()) body["tools"] = std::move(tools);
  if (config.is_object()) {
    KEEL_RETURN_IF_ERROR(CheckOption(config, "temperature", body, false));
    KEEL_RETURN_IF_ERROR(CheckOption(config, "top_p", body, false));
    KEEL_RETURN_IF_ERROR(CheckOption(config, "top_k", body, true));
  }
  if (stream) body["stream"] = true;
  return body;
}

std::optional<TextDelta> ReadTextDelta(std::string_view text, std::string_view event_name) {
  unsigned char buffer[1024];
  boost::json::monotonic_resource memory(buffer, sizeof buffer);
  boost::json::value value;
  if (!QuickParse(text, memory, value) || !value.is_object()) return std::nullopt;
  const boost::json::object& event = value.get_object();
  // As the full path: the "type" member when it is a non-empty string, else the event's name.
  std::string_view type = event_name;
  if (const boost::json::value* t = event.if_contains("type");
      t && t->is_string() && !t->get_string().empty()) {
    type = t->get_string();
  }
  if (type != "content_block_delta") return std::nullopt;
  TextDelta out;
  // As IntField: an integer, one beyond int64 as its maximum.
  const boost::json::value* index = event.if_contains("index");
  if (index && index->is_int64()) {
    out.index = index->get_int64();
  } else if (index && index->is_uint64()) {
    out.index = static_cast<int64_t>(std::min<uint64_t>(index->get_uint64(), INT64_MAX));
  } else {
    return std::nullopt;
  }
  const boost::json::value* d = event.if_contains("delta");
  if (!d || !d->is_object()) return std::nullopt;
  const boost::json::value* delta_type = d->get_object().if_contains("type");
  const boost::json::value* t = d->get_object().if_contains("text");
  if (!delta_type || !delta_type->is_string() || delta_type->get_string() != "text_delta" || !t ||
      !t->is_string()) {
    return std::nullopt;
  }
  out.text = std::string(t->get_string());
  return out;
}

Status MessageStreamAccumulator::Add(const SseEvent& event, std::string& delta) {
  delta.clear();
  std::string_view text = Trim(event.data);
  if (done_ || text.empty()) return Status::Ok();
  if (auto quick = ReadTextDelta(text, event.event)) {
    auto block = blocks_.find(quick->index);
    if (block != blocks_.end() && !block->second.stopped) {  // else the full path says why
      delta = std::move(quick->text);
      text_ += delta;
      return Status::Ok();
    }
  }
  auto parsed = ParseJson(text);
  if (!parsed.ok() || !parsed->is_object()) {
    return Unavailable("the server sent an event that is not a JSON object" +
                       (parsed.ok() ? std::string() : " (" + parsed.status().message() + ")") +
                       ": " + Excerpt(text));
  }
  Json j = std::move(*parsed);
  std::string type = StringField(j, "type");
  if (type.empty()) type = event.event;

  if (type == "error") {
    auto error = j.find("error");
    return ServerError(error == j.end() ? j : *error);
  }
  if (type == "message_start") {
    auto message = j.find("message");
    if (message != j.end() && message->is_object()) {
      auto usage = message->find("usage");
      if (usage != message->end()) ReadUsage(*usage, usage_, /*is_message_start=*/true);
    }
    return Status::Ok();
  }
  if (type == "message_delta") {
    auto d = j.find("delta");
    if (d != j.end() && d->is_object()) {
      std::string reason = StringField(*d, "stop_reason");
      if (!reason.empty()) stop_reason_ = reason;
    }
    auto usage = j.find("usage");
    if (usage != j.end()) ReadUsage(*usage, usage_, /*is_message_start=*/false);
    return Status::Ok();
  }
  if (type == "message_stop") {
    done_ = true;
    return Status::Ok();
  }
  if (type != "content_block_start" && type != "content_block_delta" &&
      type != "content_block_stop") {
    return Status::Ok();  // ping, and event types newer than this code
  }

  std::optional<int64_t> index = IntField(j, "index");
  if (!index) return Unavailable("the server sent " + type + " without an integer 'index'");
  if (type == "content_block_start") {
    auto cb = j.find("content_block");
    if (cb == j.end() || !cb->is_object()) {
      return Unavailable("the server sent content_block_start without a 'content_block' object");
    }
    if (blocks_.count(*index)) {
      return Unavailable("the server started content block " + std::to_string(*index) + " twice");
    }
    if (blocks_.size() >= kMaxBlocks) {
      return Unavailable("the server sent more than " + std::to_string(kMaxBlocks) +
                         " content blocks");
    }
    Block& block = blocks_[*index];
    block.type = StringField(*cb, "type");
    block.id = StringField(*cb, "id");
    block.name = StringField(*cb, "name");
    auto input = cb->find("input");
    if (input != cb->end()) block.start_input = *input;
    if (block.type == "text") {
      std::string start = StringField(*cb, "text");
      text_ += start;
      delta = start;
    }
    return Status::Ok();
  }
  auto it = blocks_.find(*index);
  if (it == blocks_.end() || it->second.stopped) {
    return Unavailable("the server sent " + type + " for content block " + std::to_string(*index) +
                       ", which is not open");
  }
  Block& block = it->second;
  if (type == "content_block_stop") {
    block.stopped = true;
    return Status::Ok();
  }
  auto d = j.find("delta");
  if (d == j.end() || !d->is_object()) {
    return Unavailable("the server sent content_block_delta without a 'delta' object");
  }
  std::string delta_type = StringField(*d, "type");
  if (delta_type == "text_delta") {
    auto t = d->find("text");
    if (t == d->end() || !t->is_string()) {
      return Unavailable("the server sent a text_delta without a string 'text'");
    }
    delta = t->get<std::string>();
    text_ += delta;
  } else if (delta_type == "input_json_delta") {
    auto part = d->find("partial_json");
    if (part == d->end() || !part->is_string()) {
      return Unavailable("the server sent an input_json_delta without a string 'partial_json'");
    }
    block.partial_json += part->get_ref<const std::string&>();
  }
  // Other deltas (thinking, signatures, citations) carry nothing Keel keeps.
  return Status::Ok();
}

Result<ModelResponse> MessageStreamAccumulator::Finish() const {
  ModelResponse response;
  response.text = text_;
  response.usage = usage_;
  for (const auto& [index, block] : blocks_) {
    if (block.type != "tool_use") continue;
    if (!block.stopped) {
      return Unavailable("the response ended inside the call of tool '" + block.name + "'");
    }
    Json input;
    std::string_view json = Trim(block.partial_json);
    if (json.empty()) {
      // A start input that is not an object is refused by MakeToolCall, not replaced by {}.
      input = block.start_input.is_null() ? Json::object() : block.start_input;
    } else {
      auto parsed = ParseJson(json);
      if (!parsed.ok()) {
        std::string cut = stop_reason_ == "max_tokens" ? " (the output was cut at max_tokens)" : "";
        return Unavailable("the model's input for tool '" + block.name + "' is refused: " +
                           parsed.status().message() + cut + ": " + Excerpt(json));
      }
      input = std::move(*parsed);
    }
    auto call = MakeToolCall(block.id, block.name, std::move(input), stop_reason_, names_);
    if (!call.ok()) return call.status();
    response.tool_calls.push_back(std::move(call).value());
  }
  return response;
}

Result<ModelResponse> ParseMessage(std::string_view body, const ToolNameMap& names) {
  auto parsed = ParseJson(body);
  if (!parsed.ok() || !parsed->is_object()) {
    return Unavailable("the server's response is not a JSON object" +
                       (parsed.ok() ? std::string() : " (" + parsed.status().message() + ")") +
                       ": " + Excerpt(Trim(body)));
  }
  Json j = std::move(*parsed);
  if (StringField(j, "type") == "error") {
    auto error = j.find("error");
    return ServerError(error == j.end() ? j : *error);
  }
  auto content = j.find("content");
  if (content == j.end() || !content->is_array()) {
    return Unavailable("the server's response is not a message (no 'content' array): " +
                       Excerpt(Trim(body)));
  }
  std::string stop_reason = StringField(j, "stop_reason");
  ModelResponse response;
  auto usage = j.find("usage");
  if (usage != j.end()) ReadUsage(*usage, response.usage, /*is_message_start=*/true);
  for (const Json& block : *content) {
    if (!block.is_object()) {
      return Unavailable("the server sent a content block that is not an object");
    }
    std::string type = StringField(block, "type");
    if (type == "text") {
      response.text += StringField(block, "text");
    } else if (type == "tool_use") {
      auto input = block.find("input");
      Json value = input == block.end() ? Json::object() : *input;
      auto call = MakeToolCall(StringField(block, "id"), StringField(block, "name"),
                               std::move(value), stop_reason, names);
      if (!call.ok()) return call.status();
      response.tool_calls.push_back(std::move(call).value());
    }
  }
  return response;
}

std::string ErrorMessageFromBody(std::string_view body) {
  std::string_view trimmed = Trim(body);
  if (trimmed.empty()) return "(empty body)";
  auto parsed = ParseJson(trimmed);
  Json j = parsed.ok() ? std::move(*parsed) : Json();
  if (j.is_object()) {
    auto error = j.find("error");
    if (error != j.end() && error->is_object()) {
      std::string type = StringField(*error, "type");
      std::string message = StringField(*error, "message");
      if (!message.empty()) return Excerpt((type.empty() ? "" : type + ": ") + message, 1000);
    }
    std::string message = StringField(j, "message");
    if (!message.empty()) return Excerpt(message, 1000);
  }
  return Excerpt(trimmed, 300);
}

}  // namespace keel::model::anthropic

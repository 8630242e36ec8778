#include "keel/model/openai_wire.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "keel/common/crypto.h"
#include "keel/model/quick_json.h"

namespace keel::model::openai {
namespace {

constexpr size_t kMaxWireName = 64;
constexpr size_t kHashHexDigits = 10;
constexpr size_t kMaxHashedPrefix = kMaxWireName - 2 - kHashHexDigits;
// More distinct tool calls than any sane response has; bounds what a hostile server can make
// us hold.
constexpr size_t kMaxToolCalls = 512;

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string HashedWireName(std::string_view keel_name, int salt) {
  std::string prefix;
  for (char c : keel_name) {
    if (prefix.size() == kMaxHashedPrefix) break;
    prefix.push_back(IsWordChar(c) ? c : (c == '.' || c == '-') ? '-' : '_');
  }
  std::string key(keel_name);
  if (salt > 0) key += "#" + std::to_string(salt);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Fnv1a64(key)));
  return prefix + "--" + std::string(hex, kHashHexDigits);
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\t' || s.front() == '\r' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
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

std::string Quoted(std::string_view s) { return "'" + Excerpt(s, 80) + "'"; }

// Reads an optional integer token count; absent, null or non-integer counts as 0.
int64_t TokenCount(const Json& usage, const char* field) {
  auto it = usage.find(field);
  if (it == usage.end()) return 0;
  if (it->is_number_unsigned()) {
    return static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX));
  }
  if (it->is_number_integer()) return std::max<int64_t>(0, it->get<int64_t>());
  return 0;
}

void ReadUsage(const Json& obj, Usage& usage) {
  auto it = obj.find("usage");
  if (it == obj.end() || !it->is_object()) return;
  usage.input_tokens = TokenCount(*it, "prompt_tokens");
  usage.output_tokens = TokenCount(*it, "completion_tokens");
}

// Turns one assembled call into Keel's form: name decoded, arguments parsed.
Result<ToolCallRequest> MakeToolCall(const std::string& id, const std::string& wire_name,
                                     std::string_view arguments, const std::string& finish_reason,
                                     const ToolNameMap& names) {
  if (wire_name.empty()) return Unavailable("the model returned a tool call without a name");
  // A name that was never offered passes through as it is: the gateway denies it as an unknown
  // tool and the model reads that as the tool's answer, so the run can go on.
  auto keel_name = names.Decode(wire_name);
  ToolCallRequest call;
  call.id = id.empty() ? "call_" + RandomHex(12) : id;
  call.name = keel_name.ok() ? std::move(keel_name).value() : wire_name;
  std::string_view text = Trim(arguments);
  if (text.empty()) {
    call.arguments = Json::object();  // models send "" for tools without parameters
    return call;
  }
  auto parsed = ParseJson(text);
  if (!parsed.ok() || !parsed->is_object()) {
    std::string why = !parsed.ok() ? "are refused: " + parsed.status().message() : "are not a JSON object";
    std::string cut = finish_reason == "length" ? " (the output was cut at the token limit)" : "";
    return Unavailable("the model's arguments for tool '" + call.name + "' " + why + cut + ": " +
                       Excerpt(text));
  }
  call.arguments = std::move(*parsed);
  return call;
}

Status StreamedError(const Json& error) {
  std::string message;
  if (error.is_object()) {
    auto it = error.find("message");
    if (it != error.end() && it->is_string()) message = it->get<std::string>();
  } else if (error.is_string()) {
    message = error.get<std::string>();
  }
  if (message.empty()) message = Excerpt(DumpJson(error));
  return Unavailable("the server reported an error: " + message);
}

// Appends a content or refusal field; null and absent are fine.
Status AppendText(const Json& obj, const char* field, std::string& out) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) {
    return Unavailable(std::string("the server sent a non-string '") + field + "'");
  }
  out += it->get_ref<const std::string&>();
  return Status::Ok();
}

Status CheckNumber(const Json& config, const char* field, Json& body, bool integer) {
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

bool IsValidWireToolName(std::string_view name) {
  if (name.empty() || name.size() > kMaxWireName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return IsWordChar(c) || c == '-'; });
}

std::optional<std::string> EncodePlainToolName(std::string_view keel_name) {
  if (keel_name.empty() || keel_name.size() > kMaxWireName) return std::nullopt;
  std::string out;
  out.reserve(keel_name.size());
  char prev = '.';  // a leading dot is an empty segment
  for (char c : keel_name) {
    if (c == '.') {
      if (prev == '.') return std::nullopt;
      out.push_back('-');
    } else if (IsWordChar(c)) {
      out.push_back(c);
    } else {
      return std::nullopt;
    }
    prev = c;
  }
  if (prev == '.') return std::nullopt;
  return out;
}

std::string ToolNameMap::Encode(const std::string& keel_name) {
  auto known = to_wire_.find(keel_name);
  if (known != to_wire_.end()) return known->second;
  std::string wire;
  if (auto plain = EncodePlainToolName(keel_name)) {
    wire = std::move(*plain);
  } else {
    for (int salt = 0;; ++salt) {
      wire = HashedWireName(keel_name, salt);
      if (!to_keel_.count(wire)) break;
    }
  }
  to_wire_.emplace(keel_name, wire);
  to_keel_.emplace(wire, keel_name);
  return wire;
}

Result<std::string> ToolNameMap::Decode(const std::string& wire_name) const {
  auto it = to_keel_.find(wire_name);
  if (it == to_keel_.end()) {
    return Unavailable("the model called tool " + Quoted(wire_name) +
                       ", which was not offered to it");
  }
  return it->second;
}

Result<std::string> BuildChatRequest(const ModelRequest& request, bool stream, ToolNameMap& names) {
  // Everything but the messages as a value; the messages, most of a request and all of a long
  // conversation's, are written as text at once rather than copied into values first.
  Json rest = Json::object();
  rest["model"] = request.model;

  // Tools first, so their names claim their wire forms before history's do.
  Json tools = Json::array();
  for (const ToolSpec& tool : request.tools) {
    Json function = {{"name", names.Encode(tool.name)}};
    if (!tool.description.empty()) function["description"] = tool.description;
    function["parameters"] = tool.parameters.is_object()
                                 ? tool.parameters
                                 : Json{{"type", "object"}, {"properties", Json::object()}};
    tools.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  if (!tools.empty()) rest["tools"] = std::move(tools);
  if (request.agent_config.is_object()) {
    KEEL_RETURN_IF_ERROR(CheckNumber(request.agent_config, "temperature", rest, false));
    KEEL_RETURN_IF_ERROR(CheckNumber(request.agent_config, "top_p", rest, false));
    KEEL_RETURN_IF_ERROR(CheckNumber(request.agent_config, "max_tokens", rest, true));
    KEEL_RETURN_IF_ERROR(CheckNumber(request.agent_config, "seed", rest, true));
  }
  if (stream) {
    rest["stream"] = true;
    rest["stream_options"] = {{"include_usage", true}};
  }

  std::string out = R"({"messages":[)";
  // "name":value, with `value` a JSON string.
  auto field = [&out](std::string_view name, std::string_view value) {
    out += '"';
    out += name;
    out += "\":";
    AppendJsonString(out, value);
  };
  for (size_t i = 0; i < request.messages.size(); ++i) {
    const ChatMessage& m = request.messages[i];
    if (i > 0) out += ',';
    if (m.role == "system" || m.role == "user" || m.role == "developer") {
      out += '{';
      field("role", m.role);
      out += ',';
      field("content", m.content);
    } else if (m.role == "assistant") {
      out += R"({"role":"assistant","content":)";
      if (m.tool_calls.empty() || !m.content.empty()) {
        AppendJsonString(out, m.content);
      } else {
        out += "null";
      }
      if (!m.tool_calls.empty()) {
        out += R"(,"tool_calls":[)";
        for (size_t k = 0; k < m.tool_calls.size(); ++k) {
          const ToolCallRequest& call = m.tool_calls[k];
          const Json& args = call.arguments.is_null() ? Json::object() : call.arguments;
          if (k > 0) out += ',';
          out += '{';
          field("id", call.id);
          out += R"(,"type":"function","function":{)";
          field("name", names.Encode(call.name));
          out += ',';
          field("arguments", DumpJson(args));
          out += "}}";
        }
        out += ']';
      }
    } else if (m.role == "tool") {
      out += R"({"role":"tool",)";
      field("tool_call_id", m.tool_call_id);
      out += ',';
      field("content", m.content);
    } else {
      return InvalidArgument("message role " + Quoted(m.role) + " has no Chat Completions form");
    }
    out += '}';
  }
  out += "],";
  // The rest's members, without its braces: it always has "model".
  const std::string members = DumpJson(rest);
  out.append(members, 1, std::string::npos);
  return out;
}

Status SseParser::Feed(std::string_view bytes, std::vector<SseEvent>& events) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (skip_lf_) {
      skip_lf_ = false;
      if (bytes[pos] == '\n') {
        ++pos;
        continue;
      }
    }
    // (find_first_of would search the two ends in turn for every byte.)
    size_t end = pos;
    while (end < bytes.size() && bytes[end] != '\n' && bytes[end] != '\r') ++end;
    if (end == bytes.size()) {
      line_.append(bytes.substr(pos));
      if (line_.size() > kMaxLineBytes) {
        return Unavailable("an event-stream line exceeds " + std::to_string(kMaxLineBytes) +
                           " bytes");
      }
      break;
    }
    skip_lf_ = bytes[end] == '\r';
    if (line_.empty()) {
      ProcessLine(bytes.substr(pos, end - pos), events);  // whole in these bytes: not copied
    } else {
      line_.append(bytes.substr(pos, end - pos));
      ProcessLine(line_, events);
      line_.clear();
    }
    pos = end + 1;
  }
  return Status::Ok();
}

std::optional<SseEvent> SseParser::Finish() {
  std::vector<SseEvent> none;
  if (!line_.empty()) ProcessLine(line_, none);
  line_.clear();
  std::optional<SseEvent> last;
  if (has_data_) last = SseEvent{event_, data_};
  event_.clear();
  data_.clear();
  has_data_ = false;
  return last;
}

void SseParser::ProcessLine(std::string_view line, std::vector<SseEvent>& events) {
  if (!seen_first_line_) {
    seen_first_line_ = true;
    if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);  // a UTF-8 BOM
  }
  if (line.empty()) {
    if (has_data_) events.push_back({std::move(event_), std::move(data_)});
    event_.clear();
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // a comment (servers send them as keep-alives)
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  } else if (field == "event") {
    event_ = std::string(value);
  }
  // "id" and "retry" matter only to reconnecting browsers.
}

std::optional<TextChunk> ReadTextChunk(std::string_view text) {
  unsigned char buffer[2048];
  boost::json::monotonic_resource memory(buffer, sizeof buffer);
  boost::json::value value;
  if (!QuickParse(text, memory, value) || !value.is_object()) return std::nullopt;
  const boost::json::object& chunk = value.get_object();
  if (const boost::json::value* error = chunk.if_contains("error"); error && !error->is_null()) {
    return std::nullopt;
  }
  TextChunk out;
  if (const boost::json::value* usage = chunk.if_contains("usage"); usage && usage->is_object()) {
    out.usage = Usage{QuickCount(usage->get_object(), "prompt_tokens"),
                      QuickCount(usage->get_object(), "completion_tokens")};
  }
  const boost::json::value* choices = chunk.if_contains("choices");
  if (!choices || choices->is_null()) return out;  // e.g. the usage chunk
  if (!choices->is_array() || choices->get_array().size() > 1) return std::nullopt;
  if (choices->get_array().empty()) return out;
  const boost::json::value& first = choices->get_array()[0];
  if (!first.is_object()) return std::nullopt;
  const boost::json::object& choice = first.get_object();
  if (const boost::json::value* index = choice.if_contains("index");
      index && !(index->is_int64() && index->get_int64() == 0) &&
      !(index->is_uint64() && index->get_uint64() == 0)) {
    return std::nullopt;
  }
  if (const boost::json::value* reason = choice.if_contains("finish_reason");
      reason && !reason->is_null()) {
    if (!reason->is_string()) return std::nullopt;
    out.finish_reason = std::string(reason->get_string());
  }
  const boost::json::value* delta = choice.if_contains("delta");
  if (!delta || delta->is_null()) return out;
  if (!delta->is_object()) return std::nullopt;
  for (const auto& member : delta->get_object()) {
    if (member.key() == "content" && member.value().is_string()) {
      out.content = std::string(member.value().get_string());
    } else if (member.key() != "role" && !(member.key() == "content" && member.value().is_null())) {
      return std::nullopt;  // a refusal, tool calls, a content that is not text...
    }
  }
  return out;
}

Status ChatStreamAccumulator::Add(std::string_view data, std::string& delta) {
  delta.clear();
  std::string_view text = Trim(data);
  if (done_ || text.empty()) return Status::Ok();
  if (text == "[DONE]") {
    done_ = true;
    return Status::Ok();
  }
  if (auto quick = ReadTextChunk(text)) {
    if (quick->usage) usage_ = *quick->usage;
    if (quick->finish_reason) finish_reason_ = std::move(*quick->finish_reason);
    text_ += quick->content;
    delta = std::move(quick->content);
    return Status::Ok();
  }
  auto parsed = ParseJson(text);
  if (!parsed.ok() || !parsed->is_object()) {
    return Unavailable("the server sent a stream chunk that is not a JSON object" +
                       (parsed.ok() ? std::string() : " (" + parsed.status().message() + ")") +
                       ": " + Excerpt(text));
  }
  Json chunk = std::move(*parsed);
  auto error = chunk.find("error");
  if (error != chunk.end() && !error->is_null()) return StreamedError(*error);
  ReadUsage(chunk, usage_);

  auto choices = chunk.find("choices");
  if (choices == chunk.end() || choices->is_null()) return Status::Ok();  // e.g. the usage chunk
  if (!choices->is_array()) return Unavailable("the server sent 'choices' that is not an array");
  for (const Json& choice : *choices) {
    if (!choice.is_object()) return Unavailable("the server sent a choice that is not an object");
    auto index = choice.find("index");
    if (index != choice.end() && index->is_number_integer() && index->get<int64_t>() != 0) {
      continue;
    }
    auto reason = choice.find("finish_reason");
    if (reason != choice.end() && reason->is_string()) finish_reason_ = reason->get<std::string>();
    auto d = choice.find("delta");
    if (d == choice.end() || d->is_null()) continue;
    if (!d->is_object()) return Unavailable("the server sent a delta that is not an object");
    size_t before = text_.size();
    KEEL_RETURN_IF_ERROR(AppendText(*d, "content", text_));
    KEEL_RETURN_IF_ERROR(AppendText(*d, "refusal", text_));
    delta = text_.substr(before);

    auto tool_calls = d->find("tool_calls");
    if (tool_calls == d->end() || tool_calls->is_null()) continue;
    if (!tool_calls->is_array()) {
      return Unavailable("the server sent 'tool_calls' that is not an array");
    }
    for (const Json& tc : *tool_calls) {
      if (!tc.is_object()) return Unavailable("the server sent a tool call that is not an object");
      std::string id;
      auto id_it = tc.find("id");
      if (id_it != tc.end() && id_it->is_string()) id = id_it->get<std::string>();
      int64_t idx;
      auto idx_it = tc.find("index");
      if (idx_it != tc.end() && idx_it->is_number_integer()) {
        idx = idx_it->get<int64_t>();
      } else if (last_index_ < 0 ||
                 (!id.empty() && !calls_[last_index_].id.empty() && calls_[last_index_].id != id)) {
        // Servers that omit "index" start a new call with a new id.
        idx = calls_.empty() ? 0 : calls_.rbegin()->first + 1;
      } else {
        idx = last_index_;
      }
      if (!calls_.count(idx) && calls_.size() >= kMaxToolCalls) {
        return Unavailable("the server sent more than " + std::to_string(kMaxToolCalls) +
                           " tool calls");
      }
      last_index_ = idx;
      PartialCall& call = calls_[idx];
      if (call.id.empty()) call.id = id;
      auto fn = tc.find("function");
      if (fn == tc.end() || fn->is_null()) continue;
      if (!fn->is_object())
        return Unavailable("the server sent a tool call 'function' that is not an object");
      auto name = fn->find("name");
      if (name != fn->end() && name->is_string()) {
        const std::string& part = name->get_ref<const std::string&>();
        // Most servers send the name once; some repeat it whole in every delta.
        if (call.name.empty()) {
          call.name = part;
        } else if (part != call.name) {
          call.name += part;
        }
      }
      auto args = fn->find("arguments");
      if (args != fn->end() && !args->is_null()) {
        if (args->is_string()) {
          call.arguments += args->get_ref<const std::string&>();
        } else {
          call.arguments = DumpJson(*args);  // a server that sends the object itself
        }
      }
    }
  }
  return Status::Ok();
}

Result<ModelResponse> ChatStreamAccumulator::Finish() const {
  ModelResponse response;
  response.text = text_;
  response.usage = usage_;
  for (const auto& [index, partial] : calls_) {
    auto call = MakeToolCall(partial.id, partial.name, partial.arguments, finish_reason_, names_);
    if (!call.ok()) return call.status();
    response.tool_calls.push_back(std::move(call).value());
  }
  return response;
}

Result<ModelResponse> ParseChatCompletion(std::string_view body, const ToolNameMap& names) {
  auto parsed = ParseJson(body);
  if (!parsed.ok() || !parsed->is_object()) {
    return Unavailable("the server's response is not a JSON object" +
                       (parsed.ok() ? std::string() : " (" + parsed.status().message() + ")") +
                       ": " + Excerpt(Trim(body)));
  }
  Json j = std::move(*parsed);
  auto error = j.find("error");
  if (error != j.end() && !error->is_null()) return StreamedError(*error);
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty() ||
      !(*choices)[0].is_object()) {
    return Unavailable("the server's response has no choices: " + Excerpt(Trim(body)));
  }
  const Json& choice = (*choices)[0];
  std::string finish_reason;
  auto reason = choice.find("finish_reason");
  if (reason != choice.end() && reason->is_string()) finish_reason = reason->get<std::string>();
  auto message = choice.find("message");
  if (message == choice.end() || !message->is_object()) {
    return Unavailable("the server's response has no message");
  }
  ModelResponse response;
  KEEL_RETURN_IF_ERROR(AppendText(*message, "content", response.text));
  KEEL_RETURN_IF_ERROR(AppendText(*message, "refusal", response.text));
  ReadUsage(j, response.usage);
  auto tool_calls = message->find("tool_calls");
  if (tool_calls != message->end() && !tool_calls->is_null()) {
    if (!tool_calls->is_array()) {
      return Unavailable("the server sent 'tool_calls' that is not an array");
    }
    for (const Json& tc : *tool_calls) {
      if (!tc.is_object()) return Unavailable("the server sent a tool call that is not an object");
      std::string id;
      auto id_it = tc.find("id");
      if (id_it != tc.end() && id_it->is_string()) id = id_it->get<std::string>();
      auto fn = tc.find("function");
      if (fn == tc.end() || !fn->is_object()) {
        return Unavailable("the server sent a tool call without a 'function' object");
      }
      std::string name;
      auto name_it = fn->find("name");
      if (name_it != fn->end() && name_it->is_string()) name = name_it->get<std::string>();
      std::string arguments;
      auto args = fn->find("arguments");
      if (args != fn->end() && !args->is_null()) {
        arguments = args->is_string() ? args->get<std::string>() : DumpJson(*args);
      }
      auto call = MakeToolCall(id, name, arguments, finish_reason, names);
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
    if (error != j.end()) {
      if (error->is_string()) return Excerpt(error->get<std::string>(), 1000);
      if (error->is_object()) {
        auto message = error->find("message");
        if (message != error->end() && message->is_string()) {
          return Excerpt(message->get<std::string>(), 1000);
        }
      }
    }
    for (const char* field : {"message", "detail"}) {
      auto it = j.find(field);
      if (it != j.end() && it->is_string()) return Excerpt(it->get<std::string>(), 1000);
    }
  }
  return Excerpt(trimmed, 300);
}

}  // namespace keel::model::openai

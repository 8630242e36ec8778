#include "keel/model/local_model.h"

#include <re2/re2.h>

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "keel/common/crypto.h"
#include "keel/model/context_requests.h"

namespace keel::model {
namespace {

// The high bit of each byte of `x` that equals the byte repeated in `v` (exact: no carries).
constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7FULL;
inline uint64_t BytesEqual(uint64_t x, uint64_t v) {
  const uint64_t t = x ^ v;
  return ~(((t & kLow7) + kLow7) | t | kLow7);
}

// Words are runs of bytes other than ' ', '\n', '\t' and '\r'. Every message of every request
// is counted, so eight bytes are taken at a time (the last ones padded with spaces): a word
// starts at each byte that is not a space after one that is (the byte before the text counts
// as a space).
int64_t CountWords(const std::string& s) {
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  int64_t n = 0;
  uint64_t before = 0x80;  // the previous byte was a space, as the high bit of byte 0
  for (size_t i = 0; i < s.size(); i += 8) {
    uint64_t x = ' ' * kOnes;
    std::memcpy(&x, s.data() + i, std::min<size_t>(8, s.size() - i));
    const uint64_t space = BytesEqual(x, ' ' * kOnes) | BytesEqual(x, '\n' * kOnes) |
                           BytesEqual(x, '\t' * kOnes) | BytesEqual(x, '\r' * kOnes);
    const uint64_t starts = ~space & ((space << 8) | before) & (0x80 * kOnes);
    n += static_cast<int64_t>(((starts >> 7) * kOnes) >> 56);  // the sum of the bytes' bits
    before = space >> 56;                                      // byte 7's bit, as byte 0's
  }
  return n;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// An owner's pattern runs on the io thread against whole messages, so it is RE2 (time linear in
// the text whatever the pattern, no recursion) with its size and compiled memory bounded.
constexpr size_t kMaxPatternBytes = 1024;
constexpr int64_t kPatternMaxMem = int64_t(1) << 20;

Result<std::unique_ptr<RE2>> CompilePattern(const std::string& pattern) {
  if (pattern.size() > kMaxPatternBytes) {
    return InvalidArgument("config.local_rules: a 'match' pattern is longer than " +
                           std::to_string(kMaxPatternBytes) + " bytes, the limit");
  }
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(kPatternMaxMem);
  auto re = std::make_unique<RE2>(pattern, options);
  if (!re->ok()) {
    return InvalidArgument("config.local_rules: invalid pattern '" + pattern +
                           "' (RE2 syntax): " + re->error());
  }
  return re;
}

// Parses "/call TOOL {json}" lines. Returns false with *error set when a line is malformed.
bool ParseCalls(const std::string& text, int first_id, std::vector<ToolCallRequest>* calls,
                std::string* error) {
  std::istringstream in(text);
  std::string line;
  int next = first_id;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.rfind("/call", 0) != 0 || (line.size() > 5 && line[5] != ' ')) continue;
    std::string rest = Trim(line.substr(5));
    size_t sp = rest.find_first_of(" \t");
    std::string name = Trim(rest.substr(0, sp));
    std::string args = sp == std::string::npos ? "" : Trim(rest.substr(sp));
    if (name.empty()) {
      *error = "a /call line names no tool";
      return false;
    }
    Json parsed = Json::object();
    if (!args.empty()) {
      auto read = ParseJson(args);
      if (!read.ok() || !read->is_object()) {
        *error = "the arguments of /call " + name + " are not a JSON object" +
                 (read.ok() ? std::string() : " (" + read.status().message() + ")");
        return false;
      }
      parsed = std::move(*read);
    }
    calls->push_back({"call_" + std::to_string(next++), name, parsed});
  }
  return true;
}

// What the model was sent, for tests that look at the context: the system messages, or every
// message as "ROLE: CONTENT", one after another.
std::string Echo(const std::vector<ChatMessage>& messages, bool system_only) {
  std::string out;
  for (const auto& m : messages) {
    if (system_only && m.role != "system") continue;
    if (!out.empty()) out += "\n";
    out += system_only ? m.content : m.role + ": " + m.content;
  }
  return out;
}

// Cuts `s` to at most `max` bytes on a UTF-8 boundary, marking the cut with "...".
std::string Condense(std::string s, size_t max) {
  if (s.size() <= max) return s;
  s.resize(max - 3);
  while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xC0) == 0x80) s.pop_back();
  if (!s.empty() && (static_cast<unsigned char>(s.back()) & 0x80)) s.pop_back();
  return s + "...";
}

// Keel's summarization request (context_requests.h), answered deterministically: the user's
// statements of the previous summary and of the conversation to add, in order, each condensed
// to 160 bytes, without repeats. Past 16 statements, or past the request's length limit, the
// middle ones go first, so the earliest (and the latest) survive any number of compactions.
std::string Summarize(const std::string& instructions, const std::string& material) {
  size_t limit = 4000;
  if (size_t at = instructions.find(kSummaryLimit); at != std::string::npos) {
    limit = std::strtoul(instructions.c_str() + at + kSummaryLimit.size(), nullptr, 10);
  }
  std::vector<std::string> said;
  bool in_summary = false;
  std::istringstream in(material);
  std::string line;
  while (std::getline(in, line)) {
    if (line == kSummarySoFar) in_summary = true;
    if (line == kConversationToAdd) in_summary = false;
    std::string statement;
    if (in_summary && line.rfind("- ", 0) == 0) statement = line.substr(2);
    if (!in_summary && line.rfind("user: ", 0) == 0) {
      statement = Condense(Trim(line.substr(6)), 160);
    }
    if (!statement.empty() && std::find(said.begin(), said.end(), statement) == said.end()) {
      said.push_back(statement);
    }
  }
  const std::string head = "Earlier in this session the user said:";
  auto render = [&] {
    std::string out = head;
    for (const auto& s : said) out += "\n- " + s;
    return out;
  };
  if (said.size() > 16) said.erase(said.begin() + 8, said.end() - 8);
  while (said.size() > 1 && render().size() > limit) said.erase(said.begin() + said.size() / 2);
  if (said.empty()) return "Earlier in this session the user said nothing that needs keeping.";
  if (render().size() > limit) {  // one statement, still too long: shorten it
    const size_t room = limit > head.size() + 3 + 8 ? limit - head.size() - 3 : 8;
    said[0] = Condense(said[0], room);
  }
  return render();
}

bool StartsWith(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// An introspection run's first step, deterministically: a description from the first thing the
// user said in the context, a working memory of the last three, and (when the run offers
// memory.upsert) a long-term memory of the last one, its id a hash of its text so that a later
// introspection over the same words replaces it rather than adding a copy.
std::vector<ToolCallRequest> Introspect(const ModelRequest& request, int last_user) {
  const auto& messages = request.messages;
  std::vector<std::string> said;
  for (int i = 0; i < last_user; ++i) {
    if (messages[i].role == "user") said.push_back(Condense(Trim(messages[i].content), 120));
  }
  std::string description =
      said.empty() ? "A session with nothing said yet." : "About: " + Condense(said.front(), 80);
  std::string memory = "Recent requests:";
  for (size_t i = said.size() > 3 ? said.size() - 3 : 0; i < said.size(); ++i) {
    memory += "\n- " + said[i];
  }
  std::vector<ToolCallRequest> calls = {
      {"call_1", "introspection.set_description", Json{{"description", description}}},
      {"call_2", "introspection.set_working_memory", Json{{"content", memory}}}};
  bool can_upsert = std::any_of(request.tools.begin(), request.tools.end(),
                                [](const ToolSpec& t) { return t.name == "memory.upsert"; });
  if (can_upsert && !said.empty()) {
    std::string fact = "The user said: " + said.back();
    calls.push_back({"call_3", "memory.upsert",
                     Json{{"id", "introspection-" + Sha256Hex(fact).substr(0, 16)},
                          {"text", fact},
                          {"tags", Json::array({"introspection"})}}});
  }
  return calls;
}

}  // namespace

Status LocalModel::CheckRules(const Json& rules) {
  if (!rules.is_array()) return InvalidArgument("config.local_rules must be an array");
  for (const auto& r : rules) {
    if (!r.is_object() || !r.contains("match") || !r["match"].is_string()) {
      return InvalidArgument("each config.local_rules entry needs a string 'match'");
    }
    bool reply = r.contains("reply") && r["reply"].is_string();
    bool call = r.contains("call") && r["call"].is_object() && r["call"].contains("tool") &&
                r["call"]["tool"].is_string();
    bool echo = r.contains("echo") && (r["echo"] == "system" || r["echo"] == "context");
    if (!reply && !call && !echo) {
      return InvalidArgument("each config.local_rules entry needs 'reply' (text), 'call' "
                             "({\"tool\", \"arguments\"}) or 'echo' (\"system\" or "
                             "\"context\")");
    }
    if (call && r["call"].contains("arguments") && !r["call"]["arguments"].is_object()) {
      return InvalidArgument("config.local_rules: a call's 'arguments' must be a JSON object");
    }
    KEEL_RETURN_IF_ERROR(CompilePattern(r["match"].get<std::string>()).status());
  }
  return Status::Ok();
}

Result<ModelResponse> LocalModel::Decide(const ModelRequest& request) {
  ModelResponse out;
  for (const auto& m : request.messages) {
    out.usage.input_tokens += CountWords(m.content);
    for (const auto& c : m.tool_calls) out.usage.input_tokens += CountWords(c.arguments.dump());
  }
  int last_user = -1;
  for (int i = static_cast<int>(request.messages.size()) - 1; i >= 0; --i) {
    if (request.messages[i].role == "user") {
      last_user = i;
      break;
    }
  }
  if (last_user < 0) return InvalidArgument("the local model needs a user message");
  const std::string& prompt = request.messages[last_user].content;
  if (request.messages[0].role == "system" &&
      StartsWith(request.messages[0].content, kSummarizeRequest)) {
    out.text = Summarize(request.messages[0].content, prompt);
    out.usage.output_tokens = CountWords(out.text);
    return out;
  }

  // Tool results after the last assistant turn: answer with them.
  int calls_so_far = 0;
  std::vector<const ChatMessage*> results;
  for (size_t i = last_user + 1; i < request.messages.size(); ++i) {
    const auto& m = request.messages[i];
    if (m.role == "assistant") {
      calls_so_far += static_cast<int>(m.tool_calls.size());
      results.clear();
    } else if (m.role == "tool") {
      results.push_back(&m);
    }
  }
  if (!results.empty()) {
    std::string text;
    for (const auto* r : results) {
      if (!text.empty()) text += " ";
      text += "The tool " + r->tool_name + " returned: " + r->content + ".";
    }
    out.text = text;
  } else if (calls_so_far == 0 && request.messages[0].role == "system" &&
             StartsWith(request.messages[0].content, kIntrospectRequest)) {
    out.tool_calls = Introspect(request, last_user);
  } else if (calls_so_far == 0) {
    std::string error;
    if (!ParseCalls(prompt, 1, &out.tool_calls, &error)) {
      out.text = "I could not follow that: " + error + ".";
    } else if (out.tool_calls.empty()) {
      const Json& rules = request.agent_config.contains("local_rules")
                              ? request.agent_config["local_rules"]
                              : Json::array();
      bool matched = false;
      if (rules.is_array()) {
        for (const auto& rule : rules) {
          if (!rule.is_object() || !rule.contains("match") || !rule["match"].is_string()) continue;
          // An agent written before its patterns were checked may still hold a bad one.
          KEEL_ASSIGN_OR_RETURN(auto re, CompilePattern(rule["match"].get<std::string>()));
          if (!RE2::PartialMatch(prompt, *re)) continue;
          if (rule.contains("reply") && rule["reply"].is_string()) {
            out.text = rule["reply"].get<std::string>();
          } else if (rule.contains("echo") &&
                     (rule["echo"] == "system" || rule["echo"] == "context")) {
            out.text = Echo(request.messages, rule["echo"] == "system");
          } else if (rule.contains("call") && rule["call"].is_object() &&
                     rule["call"].contains("tool") && rule["call"]["tool"].is_string()) {
            // Arguments that are not an object (a rule kept from before they were checked) go
            // to the gateway as they are, which refuses them; {} in their place would run the
            // tool with arguments nobody wrote.
            out.tool_calls.push_back({"call_1", rule["call"]["tool"].get<std::string>(),
                                      rule["call"].value("arguments", Json::object())});
          } else {
            continue;
          }
          matched = true;
          break;
        }
      }
      if (!matched) out.text = "You said: \"" + prompt + "\"";
    }
  } else {
    out.text = "Done.";
  }
  out.usage.output_tokens = CountWords(out.text);
  for (const auto& c : out.tool_calls) out.usage.output_tokens += 2 + CountWords(c.arguments.dump());
  return out;
}

boost::asio::awaitable<Result<ModelResponse>> LocalModel::Complete(const ModelRequest& request,
                                                                   DeltaSink on_delta) {
  // A simulated model latency (config.local_latency_ms), for demos and for tests that need
  // runs in flight; checked to be 0..60000 when the agent is written.
  const Json& latency = request.agent_config.contains("local_latency_ms")
                            ? request.agent_config["local_latency_ms"]
                            : Json();
  if (latency.is_number_integer() && latency.get<int64_t>() > 0) {
    boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
    timer.expires_after(std::chrono::milliseconds(latency.get<int64_t>()));
    co_await timer.async_wait(boost::asio::use_awaitable);
  }
  auto response = Decide(request);
  if (response.ok() && on_delta && !response->text.empty()) {
    const std::string& text = response->text;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find(' ', start);
      end = end == std::string::npos ? text.size() : end + 1;
      on_delta(text.substr(start, end - start));
      start = end;
    }
  }
  co_return response;
}

}  // namespace keel::model

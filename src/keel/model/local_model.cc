#include "keel/model/local_model.h"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <regex>
#include <sstream>

#include "keel/model/context_requests.h"

namespace keel::model {
namespace {

int64_t CountWords(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : s) {
    bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
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
      parsed = Json::parse(args, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object()) {
        *error = "the arguments of /call " + name + " are not a JSON object";
        return false;
      }
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

}  // namespace

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
          try {
            std::regex re(rule["match"].get<std::string>(), std::regex::ECMAScript);
            if (!std::regex_search(prompt, re)) continue;
          } catch (const std::regex_error& e) {
            return InvalidArgument("local_rules: invalid regex '" +
                                   rule["match"].get<std::string>() + "': " + e.what());
          }
          if (rule.contains("reply") && rule["reply"].is_string()) {
            out.text = rule["reply"].get<std::string>();
          } else if (rule.contains("echo") &&
                     (rule["echo"] == "system" || rule["echo"] == "context")) {
            out.text = Echo(request.messages, rule["echo"] == "system");
          } else if (rule.contains("call") && rule["call"].is_object() &&
                     rule["call"].contains("tool") && rule["call"]["tool"].is_string()) {
            Json args = rule["call"].value("arguments", Json::object());
            out.tool_calls.push_back({"call_1", rule["call"]["tool"].get<std::string>(),
                                      args.is_object() ? args : Json::object()});
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

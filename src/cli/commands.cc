#include "cli/commands.h"

#include <editline/readline.h>
#include <unistd.h>

#include <algorithm>
#include <boost/url/encode.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/json_util.h"
#include "keel/common/time.h"

namespace keel::cli {
namespace {

using std::chrono::seconds;

constexpr char kDefaultUrl[] = "http://127.0.0.1:7878";

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

std::string Trim(std::string_view s) {
  std::size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return "";
  std::size_t end = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(begin, end - begin + 1));
}

// The trimmed contents of a small file, or "" when it cannot be read.
std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream contents;
  contents << in.rdbuf();
  return Trim(contents.str());
}

// The server writes the address it bound; a wildcard bind is reached through loopback.
std::string UrlForListenAddr(const std::string& addr) {
  if (addr.starts_with("0.0.0.0:")) return "http://127.0.0.1:" + addr.substr(8);
  if (addr.starts_with("[::]:")) return "http://[::1]:" + addr.substr(5);
  return addr.find("://") == std::string::npos ? "http://" + addr : addr;
}

bool IsTty(int fd) { return isatty(fd) == 1; }

// Tool calls are shown on stderr, dimmed when stderr is a terminal that wants colour.
std::string Dim(const std::string& text) {
  if (!IsTty(STDERR_FILENO) || !Env("NO_COLOR").empty()) return text;
  return "\x1b[2m" + text + "\x1b[0m";
}

// A field of a JSON object as display text: strings as they are, null or absent as "", other
// values as compact JSON.
std::string Str(const Json& obj, const char* field) {
  if (!obj.is_object()) return "";
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  return DumpJson(*it);
}

const Json& Field(const Json& obj, const char* field) {
  static const Json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(field);
  return it == obj.end() ? kNull : *it;
}

const Json& Items(const Json& list) {
  static const Json kEmpty = Json::array();
  const Json& items = Field(list, "items");
  return items.is_array() ? items : kEmpty;
}

// One line of at most `max` bytes, for table cells.
std::string OneLine(std::string s, std::size_t max) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  if (s.size() > max) {
    s.resize(max - 3);
    while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xC0) == 0x80) s.pop_back();
    if (!s.empty() && (static_cast<unsigned char>(s.back()) & 0x80)) s.pop_back();
    s += "...";
  }
  return s;
}

std::string Join(const Json& array, std::string_view separator) {
  std::string out;
  if (!array.is_array()) return out;
  for (const Json& item : array) {
    if (!out.empty()) out += separator;
    out += item.is_string() ? item.get<std::string>() : DumpJson(item);
  }
  return out;
}

void PrintJson(const Context& ctx, const Json& j) {
  if (ctx.field.empty()) {
    std::cout << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
    return;
  }
  // --field PATH: the value at a dotted path ("id", "items.0.id", "items.-1.id" for the last
  // item); a string prints bare, so
  // that shell scripts can capture it with $(...).
  const Json* at = &j;
  std::string_view rest = ctx.field;
  while (at != nullptr && !rest.empty()) {
    auto dot = rest.find('.');
    std::string key(rest.substr(0, dot));
    rest = dot == std::string_view::npos ? std::string_view() : rest.substr(dot + 1);
    if (at->is_object()) {
      auto it = at->find(key);
      at = it == at->end() ? nullptr : &*it;
    } else if (at->is_array() && !key.empty() && key.size() < 10 &&
               key.find_first_not_of("0123456789", key[0] == '-' ? 1 : 0) == std::string::npos &&
               key != "-") {
      // An index counts from the end when negative: items.-1 is the last item.
      long index = std::stol(key);
      long size = static_cast<long>(at->size());
      if (index < 0) index += size;
      at = index >= 0 && index < size ? &(*at)[static_cast<size_t>(index)] : nullptr;
    } else {
      at = nullptr;
    }
  }
  if (at == nullptr) {
    std::cerr << "keel: the answer has no field '" << ctx.field << "'\n";
    ctx.field_missing = true;
    return;
  }
  if (at->is_string()) {
    std::cout << at->get<std::string>() << "\n";
  } else {
    std::cout << at->dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  }
}

// Prints rows under a header, columns padded to their widest cell.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) widths[c] = header[c].size();
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    std::cout << line << "\n";
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
}

// Prints "label: value" lines with the values aligned; empty values are left out.
void PrintFields(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::size_t width = 0;
  for (const auto& [label, value] : fields) width = std::max(width, label.size());
  for (const auto& [label, value] : fields) {
    if (value.empty()) continue;
    std::cout << label << ":" << std::string(width - label.size() + 1, ' ') << value << "\n";
  }
}

// Percent-encodes a path segment or query value.
std::string Escape(std::string_view s) { return boost::urls::encode(s, boost::urls::unreserved_chars); }

int ReportTransportError(const Status& status) {
  std::cerr << "keel: " << status.message() << "\n";
  if (status.code() != Code::kUnavailable) return kExitUsage;
  std::cerr << "hint: is the server running? Start it with `keel serve`, or point --url (or "
               "KEEL_URL) at it.\n";
  return kExitCannotConnect;
}

int ReportHttpError(const HttpResult& answer) {
  std::string code;
  std::string message;
  Result<Json> parsed = ParseJson(answer.body);
  if (parsed.ok()) {
    code = Str(Field(*parsed, "error"), "code");
    message = Str(Field(*parsed, "error"), "message");
  }
  if (code.empty()) code = "http_" + std::to_string(answer.status);
  if (message.empty()) message = OneLine(Trim(answer.body), 200);
  std::cerr << "keel: " << code << (message.empty() ? "" : ": " + message) << "\n";
  if (answer.status == 401) {
    std::cerr << "hint: pass --token or set KEEL_TOKEN; the owner token of a local server is in "
                 "$KEEL_HOME/owner.token.\n";
    return kExitUnauthenticated;
  }
  return kExitServerError;
}

// The JSON answer of one call, or the exit code after its error has been reported.
struct Reply {
  Json body;
  int exit_code = kExitOk;
  int status = 0;  // the HTTP status of a successful answer
  bool ok() const { return exit_code == kExitOk; }
};

Reply Request(Context& ctx, std::string_view method, const std::string& target,
              const std::optional<Json>& body = std::nullopt, seconds timeout = seconds(60)) {
  Result<HttpResult> answer = ctx.client.Call(method, target, body, {}, timeout);
  if (!answer.ok()) return {nullptr, ReportTransportError(answer.status())};
  if (answer->status < 200 || answer->status >= 300) return {nullptr, ReportHttpError(*answer)};
  if (Trim(answer->body).empty()) return {Json::object(), kExitOk, answer->status};
  Result<Json> parsed = ParseJson(answer->body);
  if (!parsed.ok()) {
    std::cerr << "keel: the server sent invalid JSON: " << parsed.status().message() << "\n";
    return {nullptr, kExitServerError};
  }
  return {std::move(parsed).value(), kExitOk, answer->status};
}

// Reads every page of a list, following next_cursor; the answer is one list with all items.
Reply ListAll(Context& ctx, const std::string& path) {
  Json items = Json::array();
  std::string cursor;
  do {
    std::string target = path + (path.find('?') == std::string::npos ? "?" : "&") + "limit=500";
    if (!cursor.empty()) target += "&cursor=" + Escape(cursor);
    Reply page = Request(ctx, "GET", target);
    if (!page.ok()) return page;
    for (const Json& item : Items(page.body)) items.push_back(item);
    std::string next = Str(page.body, "next_cursor");
    if (next == cursor) break;  // a server that repeats its cursor must not loop us forever
    cursor = std::move(next);
  } while (!cursor.empty());
  return {Json{{"items", std::move(items)}, {"next_cursor", nullptr}}};
}

// Resolves an agent id or name to its id; reports and returns the exit code when there is none.
int ResolveAgent(Context& ctx, const std::string& agent, std::string* id) {
  if (IsUuid(agent)) {
    *id = agent;
    return kExitOk;
  }
  Reply agents = ListAll(ctx, "/v1/agents");
  if (!agents.ok()) return agents.exit_code;
  for (const Json& a : Items(agents.body)) {
    if (Str(a, "name") == agent || Str(a, "id") == agent) {
      *id = Str(a, "id");
      return kExitOk;
    }
  }
  std::cerr << "keel: not_found: no agent named " << agent << " (see `keel agent list`)\n";
  return kExitServerError;
}

std::string RunErrorText(const Json& error) {
  if (error.is_string()) return error.get<std::string>();
  if (error.is_object()) {
    std::string code = Str(error, "code");
    std::string message = Str(error, "message");
    return code.empty() ? message : code + (message.empty() ? "" : ": " + message);
  }
  return "no error recorded";
}

// Reports how a run ended, after its output was printed, and returns the exit code for it.
int FinishRun(const Json& run) {
  std::string id = Str(run, "id");
  std::string status = Str(run, "status");
  if (status == "done") return kExitOk;
  if (status == "waiting_for_approval") {
    std::cerr << "keel: run " << id
              << " is waiting for approval: see `keel approvals list --status pending`, then "
                 "`keel approvals approve|reject ID`\n";
    return kExitOk;
  }
  if (status == "failed") {
    std::cerr << "keel: run " << id << " failed: " << RunErrorText(Field(run, "error")) << "\n";
    return kExitServerError;
  }
  if (status == "cancelled") {
    std::cerr << "keel: run " << id << " was cancelled ("
              << RunErrorText(Field(run, "error")) << ")\n";
    return kExitServerError;
  }
  std::cerr << "keel: run " << id << " is still " << (status.empty() ? "unknown" : status)
            << " after the wait; follow it with `keel runs show " << id << "`\n";
  return kExitTimedOut;
}

// True for the events after which a turn has nothing more to show.
bool EndsTurn(const std::string& type, const Json& payload) {
  if (type == "run.completed@v1" || type == "run.failed@v1" || type == "run.cancelled@v1") {
    return true;
  }
  if (type.starts_with("run.waiting_for_approval") || type.starts_with("approval.requested")) {
    return true;
  }
  return type.starts_with("run.") && Str(payload, "status") == "waiting_for_approval";
}

// Shows tool activity on stderr. `stdout_mid_line` is set when the answer text printed so far
// does not end a line; a terminal would otherwise glue the two together.
void ShowToolEvent(const std::string& type, const Json& payload, bool* stdout_mid_line) {
  std::string tool = Str(payload, "tool");
  std::string line;
  if (type == "tool.call.started@v1") {
    line = "> " + tool + " " + OneLine(Str(payload, "arguments"), 200);
  } else if (type == "tool.call.completed@v1") {
    line = "< " + tool + " " + Str(payload, "status");
  } else if (type == "tool.call.denied@v1") {
    line = "< " + tool + " denied: " + Str(payload, "reason");
  } else if (type == "tool.call.unknown@v1") {
    line = "< " + tool + " unknown (started before a crash; not repeated)";
  } else {
    return;
  }
  if (*stdout_mid_line && IsTty(STDOUT_FILENO)) {
    std::cout << "\n" << std::flush;
    *stdout_mid_line = false;
  }
  std::cerr << Dim(line) << "\n";
}

// Sends one message in a session and follows its run on the session's event stream. The stream
// is open before the message is posted, so no event of the run can be missed.
// `run_id` (when given) is set to the run the message started.
int StreamTurn(Context& ctx, const std::string& session_id, const std::string& text,
               int wait_seconds, std::string* started = nullptr) {
  Result<HttpClient::Opened> opened =
      ctx.client.OpenStream("/v1/stream?session_id=" + Escape(session_id));
  if (!opened.ok()) return ReportTransportError(opened.status());
  if (!opened->stream) return ReportHttpError(opened->error);
  SseStream& stream = *opened->stream;

  Reply posted = Request(ctx, "POST", "/v1/sessions/" + Escape(session_id) + "/messages",
                         Json{{"content", text}});
  if (!posted.ok()) return posted.exit_code;
  std::string run_id = Str(Field(posted.body, "run"), "id");
  if (started) *started = run_id;

  stream.SetDeadline(std::chrono::steady_clock::now() + seconds(wait_seconds));
  bool printed = false;
  bool mid_line = false;
  while (true) {
    // A timeout or a lost stream ends the loop; the run's record below decides what happened.
    Result<std::optional<SseEvent>> next = stream.Next();
    if (!next.ok() || !next->has_value()) break;
    const SseEvent& event = **next;
    Result<Json> data = ParseJson(event.data);
    if (!data.ok() || !data->is_object()) continue;
    std::string event_run = Str(*data, "run_id");
    if (!event_run.empty() && event_run != run_id) continue;
    if (ctx.json && ctx.field.empty()) std::cout << DumpJson(*data) << "\n" << std::flush;
    std::string type = event.event.empty() ? Str(*data, "type") : event.event;
    if (type == "message.delta") {
      std::string delta = Str(*data, "text");
      if (!ctx.json && !delta.empty()) {
        std::cout << delta << std::flush;
        printed = true;
        mid_line = delta.back() != '\n';
      }
      continue;
    }
    const Json& payload = Field(*data, "payload");
    if (!ctx.json) ShowToolEvent(type, payload, &mid_line);
    if (EndsTurn(type, payload)) break;
  }

  Reply run = Request(ctx, "GET", "/v1/runs/" + Escape(run_id));
  if (!run.ok()) return run.exit_code;
  if (ctx.json) {
    PrintJson(ctx, run.body);
  } else {
    // A model that does not stream leaves the whole answer in the run's output.
    std::string output = printed ? "" : Str(run.body, "output");
    std::cout << output;
    if (printed || !output.empty()) std::cout << "\n";
    std::cout << std::flush;
  }
  return FinishRun(run.body);
}

// Sends one message and waits for its run with ?wait=, without a stream.
int WaitTurn(Context& ctx, const std::string& session_id, const std::string& text, int wait_seconds,
             std::string* started) {
  Reply posted = Request(
      ctx, "POST",
      "/v1/sessions/" + Escape(session_id) + "/messages?wait=" + std::to_string(wait_seconds),
      Json{{"content", text}}, seconds(wait_seconds + 30));
  if (!posted.ok()) return posted.exit_code;
  const Json& run = Field(posted.body, "run");
  *started = Str(run, "id");
  if (ctx.json) {
    PrintJson(ctx, posted.body);
  } else {
    std::string output = Str(run, "output");
    if (!output.empty()) std::cout << output << "\n";
  }
  return FinishRun(run);
}

// Creates a session for an agent and tells the user how to continue it.
int CreateSession(Context& ctx, const std::string& agent_id, const std::string& title,
                  std::string* session_id) {
  Reply session =
      Request(ctx, "POST", "/v1/agents/" + Escape(agent_id) + "/sessions", Json{{"title", title}});
  if (!session.ok()) return session.exit_code;
  *session_id = Str(session.body, "id");
  std::cerr << Dim("session " + *session_id + " (continue it with --session " + *session_id + ")")
            << "\n";
  return kExitOk;
}

// Resolves the session of send and chat: the given one, or a new one for the agent.
int SessionFor(Context& ctx, const std::string& agent, const std::string& given,
               const std::string& title, std::string* session_id) {
  if (!given.empty()) {
    *session_id = given;
    return kExitOk;
  }
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  return CreateSession(ctx, agent_id, title, session_id);
}

}  // namespace

Result<Context> MakeContext(const GlobalOptions& options) {
  std::string home = options.home;
  if (home.empty()) home = Env("KEEL_HOME");
  if (home.empty()) home = Env("HOME") + "/.local/share/keel";

  std::string url = options.url;
  if (url.empty()) url = Env("KEEL_URL");
  if (url.empty()) {
    std::string addr = ReadSmallFile(home + "/listen.addr");
    if (!addr.empty()) url = UrlForListenAddr(addr);
  }
  if (url.empty()) url = kDefaultUrl;

  std::string token = options.token;
  if (token.empty()) token = Env("KEEL_TOKEN");
  if (token.empty()) token = ReadSmallFile(home + "/owner.token");

  KEEL_ASSIGN_OR_RETURN(HttpClient client, HttpClient::Create(url, std::move(token)));
  return Context{std::move(client), options.json || !options.field.empty(), options.field};
}

int AgentCreate(Context& ctx, const AgentCreateArgs& args) {
  Json body = {{"name", args.name}, {"model", args.model}};
  if (!args.instructions.empty()) body["instructions"] = args.instructions;
  if (!args.tools.empty()) body["tools"] = args.tools;
  if (!args.config_json.empty()) {
    Result<Json> config = ParseJsonObject(args.config_json);
    if (!config.ok()) {
      std::cerr << "keel: --config must be a JSON object (" << config.status().message() << ")\n";
      return kExitUsage;
    }
    body["config"] = *config;
  }
  Reply agent = Request(ctx, "POST", "/v1/agents", body);
  if (!agent.ok()) return agent.exit_code;
  if (ctx.json) {
    PrintJson(ctx, agent.body);
  } else {
    std::cout << "created agent " << Str(agent.body, "name") << " (" << Str(agent.body, "id")
              << ")\n";
  }
  return kExitOk;
}

int AgentUpdate(Context& ctx, const AgentUpdateArgs& args) {
  Json body = Json::object();
  if (args.name) body["name"] = *args.name;
  if (args.model) body["model"] = *args.model;
  if (args.instructions) body["instructions"] = *args.instructions;
  if (args.tools) body["tools"] = *args.tools;
  if (args.config_json) {
    Result<Json> config = ParseJsonObject(*args.config_json);
    if (!config.ok()) {
      std::cerr << "keel: --config must be a JSON object (" << config.status().message() << ")\n";
      return kExitUsage;
    }
    body["config"] = *config;
  }
  if (body.empty()) {
    std::cerr << "keel agent update: nothing to change (give --name, --model, --instructions, "
                 "--tool, --no-tools or --config)\n";
    return kExitUsage;
  }
  std::string id;
  if (int code = ResolveAgent(ctx, args.agent, &id); code != kExitOk) return code;
  Reply agent = Request(ctx, "PATCH", "/v1/agents/" + Escape(id), body);
  if (!agent.ok()) return agent.exit_code;
  if (ctx.json) {
    PrintJson(ctx, agent.body);
  } else {
    std::string fields;
    for (auto it = body.begin(); it != body.end(); ++it)
      fields += (fields.empty() ? "" : ", ") + it.key();
    std::cout << "updated agent " << Str(agent.body, "name") << " (" << fields << ")\n";
  }
  return kExitOk;
}

int AgentList(Context& ctx) {
  Reply agents = ListAll(ctx, "/v1/agents");
  if (!agents.ok()) return agents.exit_code;
  if (ctx.json) {
    PrintJson(ctx, agents.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& a : Items(agents.body)) {
    rows.push_back({Str(a, "id"), Str(a, "name"), Str(a, "model"), Str(a, "status"),
                    OneLine(Join(Field(a, "tools"), ","), 40), Str(a, "created_at")});
  }
  PrintTable({"ID", "NAME", "MODEL", "STATUS", "TOOLS", "CREATED"}, rows);
  return kExitOk;
}

int AgentShow(Context& ctx, const std::string& agent) {
  std::string id;
  if (int code = ResolveAgent(ctx, agent, &id); code != kExitOk) return code;
  Reply a = Request(ctx, "GET", "/v1/agents/" + Escape(id));
  if (!a.ok()) return a.exit_code;
  if (ctx.json) {
    PrintJson(ctx, a.body);
    return kExitOk;
  }
  const Json& config = Field(a.body, "config");
  PrintFields({{"id", Str(a.body, "id")},
               {"name", Str(a.body, "name")},
               {"model", Str(a.body, "model")},
               {"status", Str(a.body, "status")},
               {"tools", Join(Field(a.body, "tools"), ", ")},
               {"created", Str(a.body, "created_at")},
               {"updated", Str(a.body, "updated_at")},
               {"config", config.empty() ? "" : DumpJson(config)}});
  std::string instructions = Str(a.body, "instructions");
  if (!instructions.empty()) std::cout << "\ninstructions:\n" << instructions << "\n";
  return kExitOk;
}

int AgentDelete(Context& ctx, const std::string& agent) {
  std::string id;
  if (int code = ResolveAgent(ctx, agent, &id); code != kExitOk) return code;
  Reply deleted = Request(ctx, "DELETE", "/v1/agents/" + Escape(id));
  if (!deleted.ok()) return deleted.exit_code;
  if (ctx.json) {
    PrintJson(ctx, deleted.body);
  } else {
    std::cout << "deleted agent " << agent << (agent == id ? "" : " (" + id + ")") << "\n";
  }
  return kExitOk;
}

int Send(Context& ctx, const SendArgs& args) {
  std::string session_id;
  if (int code = SessionFor(ctx, args.agent, args.session_id, OneLine(args.text, 60), &session_id);
      code != kExitOk) {
    return code;
  }
  std::string run_id;
  int code = args.no_stream ? WaitTurn(ctx, session_id, args.text, args.wait_seconds, &run_id)
                            : StreamTurn(ctx, session_id, args.text, args.wait_seconds, &run_id);
  // On stderr, as the session's line: the answer alone goes to stdout.
  if (!ctx.json && !run_id.empty()) {
    std::cerr << Dim("run " + run_id + " (keel runs show " + run_id + ")") << "\n";
  }
  return code;
}

// A line of the chat: with line editing and history at a terminal (libedit), else a plain
// read. nullopt at the end of the input.
std::optional<std::string> ReadChatLine(bool interactive) {
  if (!interactive) {
    std::string line;
    if (!std::getline(std::cin, line)) return std::nullopt;
    return line;
  }
  char* read = readline("you> ");
  if (!read) return std::nullopt;
  std::string line(read);
  std::free(read);
  if (!Trim(line).empty()) add_history(line.c_str());
  return line;
}

// The last messages of a session being resumed, and how many came before them.
int ShowRecent(Context& ctx, const std::string& session_id) {
  constexpr size_t kShown = 20;
  Reply messages = ListAll(ctx, "/v1/sessions/" + Escape(session_id) + "/messages");
  if (!messages.ok()) return messages.exit_code;
  std::vector<Json> shown;
  for (const Json& m : Items(messages.body)) {
    const std::string role = Str(m, "role");
    if (role == "user" || role == "assistant") shown.push_back(m);
  }
  if (shown.size() > kShown) {
    std::cout << Dim("(" + std::to_string(shown.size() - kShown) +
                     " earlier messages: keel sessions show " + session_id + ")")
              << "\n";
    shown.erase(shown.begin(), shown.end() - kShown);
  }
  for (const Json& m : shown) {
    std::cout << (Str(m, "role") == "user" ? "you> " : "") << Str(m, "content") << "\n";
  }
  return kExitOk;
}

int Chat(Context& ctx, const ChatArgs& args) {
  std::string session_id;
  if (int code = SessionFor(ctx, args.agent, args.session_id, "chat", &session_id);
      code != kExitOk) {
    return code;
  }
  bool interactive = IsTty(STDIN_FILENO);
  if (!args.session_id.empty()) {  // resumed: where the conversation stands
    if (int code = ShowRecent(ctx, session_id); code != kExitOk) return code;
  }
  if (interactive) std::cout << Dim("/help lists the chat's commands") << "\n";
  while (true) {
    std::optional<std::string> line = ReadChatLine(interactive);
    if (!line) {
      if (interactive) std::cout << "\n";
      break;
    }
    std::string text = Trim(*line);
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/help") {
      std::cout << "/help     this list\n/session  this session's id (resume it with keel chat "
                   "--session ID)\n/exit     end the chat (also /quit, or Ctrl-D)\nAnything "
                   "else, /call lines too, is a message to the agent.\n";
      continue;
    }
    if (text == "/session") {
      std::cout << session_id << "\n";
      continue;
    }
    int code = StreamTurn(ctx, session_id, text, args.wait_seconds);
    // A failed run ends only its turn; a server that is gone or rejects us ends the chat.
    if (code == kExitCannotConnect || code == kExitUnauthenticated) return code;
  }
  return kExitOk;
}

// A list of `path` newest first: one page as `page` says, or all of it.
Reply NewestFirst(Context& ctx, const std::string& path, const PageArgs& page) {
  const std::string ordered =
      path + (path.find('?') == std::string::npos ? "?" : "&") + "order=desc";
  if (page.all) return ListAll(ctx, ordered);
  std::string target = ordered + "&limit=" + std::to_string(page.limit);
  if (!page.cursor.empty()) target += "&cursor=" + Escape(page.cursor);
  return Request(ctx, "GET", target);
}

// Under a table of one page: how to see the rest (on stderr, away from the table).
void MoreHint(const Json& body, const std::string& what, const std::string& command) {
  const std::string next = Str(body, "next_cursor");
  if (next.empty()) return;
  std::cerr << Dim("the newest " + std::to_string(Items(body).size()) + " " + what +
                   "; more with " + command + " --cursor " + next + ", or all with " + command +
                   " --all")
            << "\n";
}

int RunsList(Context& ctx, const RunsListArgs& args) {
  std::string target =
      args.session_id.empty() ? "/v1/runs" : "/v1/sessions/" + Escape(args.session_id) + "/runs";
  std::string query, again = "keel runs list";
  if (!args.session_id.empty()) again += " --session " + args.session_id;
  if (!args.agent.empty()) {
    std::string agent_id;
    if (int code = ResolveAgent(ctx, args.agent, &agent_id); code != kExitOk) return code;
    query += "&agent_id=" + Escape(agent_id);
    again += " --agent " + args.agent;
  }
  if (!args.status.empty()) {
    query += "&status=" + Escape(args.status);
    again += " --status " + args.status;
  }
  if (!query.empty()) target += "?" + query.substr(1);
  Reply runs = NewestFirst(ctx, target, args.page);
  if (!runs.ok()) return runs.exit_code;
  if (ctx.json) {
    PrintJson(ctx, runs.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& r : Items(runs.body)) {
    rows.push_back({Str(r, "id"), Str(r, "status"), Str(r, "session_id"), Str(r, "created_at"),
                    OneLine(Str(r, "output"), 50)});
  }
  PrintTable({"ID", "STATUS", "SESSION", "CREATED", "OUTPUT"}, rows);
  MoreHint(runs.body, "runs", again);
  return kExitOk;
}

int RunsShow(Context& ctx, const std::string& run_id) {
  Reply run = Request(ctx, "GET", "/v1/runs/" + Escape(run_id));
  if (!run.ok()) return run.exit_code;
  Reply steps = ListAll(ctx, "/v1/runs/" + Escape(run_id) + "/steps");
  if (!steps.ok()) return steps.exit_code;
  if (ctx.json) {
    PrintJson(ctx, Json{{"run", run.body}, {"steps", Items(steps.body)}});
    return kExitOk;
  }
  const Json& r = run.body;
  const Json& usage = Field(r, "usage");
  const Json& error = Field(r, "error");
  PrintFields({{"id", Str(r, "id")},
               {"status", Str(r, "status")},
               {"agent", Str(r, "agent_id")},
               {"session", Str(r, "session_id")},
               {"attempt", Str(r, "attempt")},
               {"created", Str(r, "created_at")},
               {"started", Str(r, "started_at")},
               {"finished", Str(r, "finished_at")},
               {"tokens", usage.is_object() ? Str(usage, "input_tokens") + " in, " +
                                                  Str(usage, "output_tokens") + " out"
                                            : ""},
               {"error", error.is_null() ? "" : RunErrorText(error)},
               {"output", Str(r, "output")}});
  std::vector<std::vector<std::string>> rows;
  for (const Json& s : Items(steps.body)) {
    const Json& input = Field(s, "input");
    // A tool step names its tool and arguments; a model step is best shown by what it said.
    std::string detail = Str(input, "tool").empty()
                             ? Str(s, "output")
                             : Str(input, "tool") + " " + Str(input, "arguments");
    rows.push_back({Str(s, "seq"), Str(s, "kind"), Str(s, "status"), Str(s, "started_at"),
                    OneLine(detail, 70)});
  }
  std::cout << "\n";
  PrintTable({"SEQ", "KIND", "STATUS", "STARTED", "DETAIL"}, rows);
  return kExitOk;
}

int RunsCancel(Context& ctx, const std::string& run_id) {
  Reply run = Request(ctx, "POST", "/v1/runs/" + Escape(run_id) + "/cancel");
  if (!run.ok()) return run.exit_code;
  if (ctx.json) {
    PrintJson(ctx, run.body);
  } else {
    std::string status = Str(run.body, "status");
    std::cout << "run " << run_id << ": " << (status.empty() ? "cancel requested" : status) << "\n";
  }
  return kExitOk;
}

int SessionsList(Context& ctx, const std::string& agent, const PageArgs& page) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  Reply sessions = NewestFirst(ctx, "/v1/agents/" + Escape(agent_id) + "/sessions", page);
  if (!sessions.ok()) return sessions.exit_code;
  if (ctx.json) {
    PrintJson(ctx, sessions.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& s : Items(sessions.body)) {
    rows.push_back(
        {Str(s, "id"), Str(s, "status"), Str(s, "updated_at"), OneLine(Str(s, "title"), 50)});
  }
  PrintTable({"ID", "STATUS", "UPDATED", "TITLE"}, rows);
  MoreHint(sessions.body, "sessions", "keel sessions list " + agent);
  return kExitOk;
}

int SessionsShow(Context& ctx, const std::string& session_id) {
  Reply session = Request(ctx, "GET", "/v1/sessions/" + Escape(session_id));
  if (!session.ok()) return session.exit_code;
  Reply messages = ListAll(ctx, "/v1/sessions/" + Escape(session_id) + "/messages");
  if (!messages.ok()) return messages.exit_code;
  if (ctx.json) {
    PrintJson(ctx, Json{{"session", session.body}, {"messages", Items(messages.body)}});
    return kExitOk;
  }
  const Json& s = session.body;
  PrintFields({{"id", Str(s, "id")},
               {"agent", Str(s, "agent_id")},
               {"status", Str(s, "status")},
               {"title", Str(s, "title")},
               {"description", Str(s, "description")},
               {"created", Str(s, "created_at")},
               {"updated", Str(s, "updated_at")}});
  for (const Json& m : Items(messages.body)) {
    std::cout << "\n"
              << Dim("[" + Str(m, "created_at") + "] " + Str(m, "role") + ":") << "\n"
              << Str(m, "content") << "\n";
  }
  return kExitOk;
}

int TokensCreate(Context& ctx, const std::string& name, const std::string& role) {
  Reply token = Request(ctx, "POST", "/v1/tokens", Json{{"name", name}, {"role", role}});
  if (!token.ok()) return token.exit_code;
  if (ctx.json) {
    PrintJson(ctx, token.body);
    return kExitOk;
  }
  // The secret alone goes to stdout, so `TOKEN=$(keel tokens create ci)` works.
  std::cerr << "created " << Str(token.body, "role") << " token " << Str(token.body, "name") << " ("
            << Str(token.body, "id") << "); the secret is shown only this once:\n";
  std::cout << Str(token.body, "token") << "\n";
  return kExitOk;
}

int TokensList(Context& ctx) {
  Reply tokens = ListAll(ctx, "/v1/tokens");
  if (!tokens.ok()) return tokens.exit_code;
  if (ctx.json) {
    PrintJson(ctx, tokens.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& t : Items(tokens.body)) {
    rows.push_back(
        {Str(t, "id"), Str(t, "name"), Str(t, "role"), Str(t, "created_at"), Str(t, "revoked_at")});
  }
  PrintTable({"ID", "NAME", "ROLE", "CREATED", "REVOKED"}, rows);
  return kExitOk;
}

int TokensRevoke(Context& ctx, const std::string& token_id) {
  Reply revoked = Request(ctx, "DELETE", "/v1/tokens/" + Escape(token_id));
  if (!revoked.ok()) return revoked.exit_code;
  if (ctx.json) {
    PrintJson(ctx, revoked.body);
  } else {
    std::cout << "revoked token " << token_id << "\n";
  }
  return kExitOk;
}

int SecretsSet(Context& ctx, const std::string& name, const std::optional<std::string>& value) {
  std::string text;
  if (value) {
    text = *value;
  } else {
    if (isatty(STDIN_FILENO)) std::cerr << "value for " << name << " (end with Ctrl-D): ";
    std::ostringstream in;
    in << std::cin.rdbuf();
    text = in.str();
    if (!text.empty() && text.back() == '\n') text.pop_back();
    if (!text.empty() && text.back() == '\r') text.pop_back();
  }
  Reply set = Request(ctx, "PUT", "/v1/secrets/" + Escape(name), Json{{"value", text}});
  if (!set.ok()) return set.exit_code;
  if (!ctx.json) std::cout << "set secret " << name << "\n";
  return kExitOk;
}

int SecretsList(Context& ctx) {
  Reply list = Request(ctx, "GET", "/v1/secrets");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& s : Items(list.body)) {
    rows.push_back({Str(s, "name"), Str(s, "created_at"), Str(s, "updated_at")});
  }
  PrintTable({"NAME", "CREATED", "UPDATED"}, rows);
  return kExitOk;
}

int SecretsDelete(Context& ctx, const std::string& name) {
  Reply gone = Request(ctx, "DELETE", "/v1/secrets/" + Escape(name));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "deleted secret " << name << "\n";
  return kExitOk;
}

int ApprovalsList(Context& ctx, const std::string& status) {
  Reply list = ListAll(ctx, "/v1/approvals" + (status.empty() ? "" : "?status=" + Escape(status)));
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& a : Items(list.body)) {
    rows.push_back({Str(a, "id"), Str(a, "status"), Str(a, "tool"),
                    OneLine(a.value("arguments", Json::object()).dump(), 40), Str(a, "run_id"),
                    Str(a, "expires_at")});
  }
  PrintTable({"ID", "STATUS", "TOOL", "ARGUMENTS", "RUN", "EXPIRES"}, rows);
  return kExitOk;
}

int ApprovalsShow(Context& ctx, const std::string& id) {
  Reply a = Request(ctx, "GET", "/v1/approvals/" + Escape(id));
  if (!a.ok()) return a.exit_code;
  if (ctx.json) {
    PrintJson(ctx, a.body);
    return kExitOk;
  }
  const Json& b = a.body;
  std::vector<std::pair<std::string, std::string>> fields = {
      {"id", Str(b, "id")},
      {"status", Str(b, "status")},
      {"tool", Str(b, "tool")},
      {"arguments", b.value("arguments", Json::object()).dump()},
      {"why", Str(b, "reason")},
      {"run", Str(b, "run_id")},
      {"agent", Str(b, "agent_id")},
      {"asked by", Str(b, "requested_by")},
      {"created", Str(b, "created_at")},
      {"expires", Str(b, "expires_at")}};
  if (b.contains("amended_arguments") && b["amended_arguments"].is_object()) {
    fields.push_back({"amended to", b["amended_arguments"].dump()});
  }
  if (Str(b, "status") != "pending") {
    fields.push_back({"decided by", Str(b, "decided_by")});
    fields.push_back({"decided", Str(b, "decided_at")});
    fields.push_back({"decision reason", Str(b, "decision_reason")});
  }
  PrintFields(fields);
  return kExitOk;
}

int ApprovalsDecide(Context& ctx, const ApprovalDecisionArgs& args, bool approve) {
  Json body = Json::object();
  if (!args.reason.empty()) body["reason"] = args.reason;
  if (!args.arguments_json.empty()) {
    auto amended = ParseJsonObject(args.arguments_json);
    if (!amended.ok()) {
      std::cerr << "keel: --arguments: " << amended.status().message() << "\n";
      return kExitUsage;
    }
    body["arguments"] = *amended;
  }
  if (args.standing_seconds < 0 || (args.standing_seconds == 0 && args.standing_given)) {
    std::cerr << "keel: --standing takes a number of seconds greater than 0\n";
    return kExitUsage;
  }
  if (args.standing_seconds > 0) {
    body["standing"] = {{"expires_in", args.standing_seconds}};
    if (!args.match_json.empty()) {
      auto match = ParseJsonObject(args.match_json);
      if (!match.ok()) {
        std::cerr << "keel: --match: " << match.status().message() << "\n";
        return kExitUsage;
      }
      body["standing"]["match"] = *match;
    }
  } else if (!args.match_json.empty()) {
    std::cerr << "keel: --match goes with --standing SECONDS\n";
    return kExitUsage;
  }
  Reply decided = Request(ctx, "POST",
                          "/v1/approvals/" + Escape(args.id) + (approve ? "/approve" : "/reject"),
                          body);
  if (!decided.ok()) return decided.exit_code;
  if (ctx.json) {
    PrintJson(ctx, decided.body);
  } else {
    std::cout << Str(decided.body, "status") << " " << Str(decided.body, "tool") << " call of run "
              << Str(decided.body, "run_id") << "; the run goes on\n";
  }
  return kExitOk;
}

namespace {

// The policy route of the tenant (`agent` empty) or of an agent; reports a bad agent name.
int PolicyPath(Context& ctx, const std::string& agent, std::string* path) {
  if (agent.empty()) {
    *path = "/v1/policy";
    return kExitOk;
  }
  std::string id;
  if (int code = ResolveAgent(ctx, agent, &id); code != kExitOk) return code;
  *path = "/v1/agents/" + Escape(id) + "/policy";
  return kExitOk;
}

int StopPath(Context& ctx, const std::string& agent, std::string* path) {
  if (agent.empty()) {
    *path = "/v1/emergency-stop";
    return kExitOk;
  }
  std::string id;
  if (int code = ResolveAgent(ctx, agent, &id); code != kExitOk) return code;
  *path = "/v1/agents/" + Escape(id) + "/emergency-stop";
  return kExitOk;
}

}  // namespace

int PolicyShow(Context& ctx, const std::string& agent) {
  std::string path;
  if (int code = PolicyPath(ctx, agent, &path); code != kExitOk) return code;
  Reply doc = Request(ctx, "GET", path);
  if (!doc.ok()) return doc.exit_code;
  PrintJson(ctx, doc.body);  // the document is its own best display
  return kExitOk;
}

int PolicySet(Context& ctx, const std::string& agent, const std::string& file) {
  std::string text;
  if (file == "-") {
    std::ostringstream in;
    in << std::cin.rdbuf();
    text = in.str();
  } else {
    std::ifstream in(file);
    if (!in) {
      std::cerr << "keel: cannot read " << file << "\n";
      return kExitUsage;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  auto doc = ParseJsonObject(text);
  if (!doc.ok()) {
    std::cerr << "keel: " << (file == "-" ? "standard input" : file) << ": "
              << doc.status().message() << "\n";
    return kExitUsage;
  }
  std::string path;
  if (int code = PolicyPath(ctx, agent, &path); code != kExitOk) return code;
  Reply stored = Request(ctx, "PUT", path, *doc);
  if (!stored.ok()) return stored.exit_code;
  if (ctx.json) {
    PrintJson(ctx, stored.body);
  } else {
    std::cout << "set the " << (agent.empty() ? "tenant policy" : "policy of agent " + agent)
              << " (" << stored.body.value("rules", Json::array()).size() << " rules)\n";
  }
  return kExitOk;
}

int PolicyRemove(Context& ctx, const std::string& agent) {
  std::string path;
  if (int code = PolicyPath(ctx, agent, &path); code != kExitOk) return code;
  Reply gone = Request(ctx, "DELETE", path);
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) {
    std::cout << "removed the " << (agent.empty() ? "tenant policy" : "policy of agent " + agent)
              << "\n";
  }
  return kExitOk;
}

int StopEngage(Context& ctx, const std::string& agent, const std::string& reason) {
  std::string path;
  if (int code = StopPath(ctx, agent, &path); code != kExitOk) return code;
  Reply stop = Request(ctx, "PUT", path, Json{{"reason", reason}});
  if (!stop.ok()) return stop.exit_code;
  if (ctx.json) {
    PrintJson(ctx, stop.body);
  } else {
    std::cout << "emergency stop in force for " << (agent.empty() ? "the tenant" : agent)
              << ": runs halt at their next step and every tool call is refused until "
                 "`keel emergency-stop off`\n";
  }
  return kExitOk;
}

int StopLift(Context& ctx, const std::string& agent) {
  std::string path;
  if (int code = StopPath(ctx, agent, &path); code != kExitOk) return code;
  Reply gone = Request(ctx, "DELETE", path);
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) {
    std::cout << "lifted the emergency stop for " << (agent.empty() ? "the tenant" : agent)
              << "\n";
  }
  return kExitOk;
}

int StopList(Context& ctx) {
  Reply list = Request(ctx, "GET", "/v1/emergency-stops");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& s : Items(list.body)) {
    std::string agent = Str(s, "agent_id");
    rows.push_back({agent.empty() ? "(tenant)" : agent, Str(s, "reason"), Str(s, "created_by"),
                    Str(s, "created_at")});
  }
  PrintTable({"AGENT", "REASON", "BY", "SINCE"}, rows);
  return kExitOk;
}

namespace {

// NAME=value, or NAME=secret:SECRET for a secret by reference.
Result<std::pair<std::string, Json>> Assignment(const std::string& text, const char* what) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument(std::string(what) + " '" + text + "' is not NAME=value");
  }
  std::string value = text.substr(eq + 1);
  if (value.rfind("secret:", 0) == 0) {
    return std::pair<std::string, Json>(text.substr(0, eq), Json{{"secret", value.substr(7)}});
  }
  return std::pair<std::string, Json>(text.substr(0, eq), Json(value));
}

}  // namespace

int McpAdd(Context& ctx, const McpAddArgs& args) {
  Json body = {{"name", args.name}};
  if (!args.url.empty()) {
    body["transport"] = "http";
    body["url"] = args.url;
    Json headers = Json::object();
    for (const auto& h : args.headers) {
      auto kv = Assignment(h, "--header");
      if (!kv.ok()) {
        std::cerr << "keel: " << kv.status().message() << "\n";
        return kExitUsage;
      }
      headers[kv->first] = kv->second;
    }
    body["headers"] = headers;
  } else {
    body["command"] = args.command;
    Json env = Json::object();
    for (const auto& e : args.env) {
      auto kv = Assignment(e, "--env");
      if (!kv.ok()) {
        std::cerr << "keel: " << kv.status().message() << "\n";
        return kExitUsage;
      }
      env[kv->first] = kv->second;
    }
    body["env"] = env;
  }
  Reply added = Request(ctx, "POST", "/v1/mcp-servers", body, seconds(120));
  if (!added.ok()) return added.exit_code;
  if (ctx.json) {
    PrintJson(ctx, added.body);
    return kExitOk;
  }
  const Json& b = added.body;
  if (Str(b, "status") == "ready") {
    std::cout << "registered MCP server " << Str(b, "name") << " (" << Str(b, "id") << "): "
              << b.value("tools", Json::array()).size() << " tools\n";
    for (const Json& t : b.value("tools", Json::array())) {
      std::cout << "  " << Str(t, "name") << "  [" << Join(t.value("rights", Json::array()), ",")
                << "]\n";
    }
  } else {
    std::cout << "registered MCP server " << Str(b, "name") << " (" << Str(b, "id")
              << "), but it does not work yet: " << Str(b, "error") << "\n";
  }
  return kExitOk;
}

int McpList(Context& ctx) {
  Reply list = Request(ctx, "GET", "/v1/mcp-servers");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& s : Items(list.body)) {
    std::string where = Str(s, "transport") == "http" ? Str(s, "url")
                                                      : Join(s.value("command", Json::array()), " ");
    rows.push_back({Str(s, "id"), Str(s, "name"), Str(s, "transport"), Str(s, "status"),
                    OneLine(where, 50)});
  }
  PrintTable({"ID", "NAME", "TRANSPORT", "STATUS", "COMMAND / URL"}, rows);
  return kExitOk;
}

int McpRemove(Context& ctx, const std::string& server) {
  std::string id = server;
  if (!IsUuid(server)) {
    Reply list = Request(ctx, "GET", "/v1/mcp-servers");
    if (!list.ok()) return list.exit_code;
    id.clear();
    for (const Json& s : Items(list.body)) {
      if (Str(s, "name") == server) id = Str(s, "id");
    }
    if (id.empty()) {
      std::cerr << "keel: not_found: no MCP server named " << server << "\n";
      return kExitServerError;
    }
  }
  Reply gone = Request(ctx, "DELETE", "/v1/mcp-servers/" + Escape(id));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "removed MCP server " << server << "\n";
  return kExitOk;
}

namespace {

// The whole of a file, or nullopt when it cannot be read.
std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return contents.str();
}

// A file that must hold a JSON object; the error names the file and where the JSON breaks.
Result<Json> ReadJsonObjectFile(const std::string& path) {
  std::optional<std::string> text = ReadFile(path);
  if (!text) return InvalidArgument("cannot read " + path);
  auto parsed = ParseJson(*text);
  if (!parsed.ok()) {
    const std::string& why = parsed.status().message();  // "not valid JSON: parse error at ..."
    return InvalidArgument(path + (why.rfind("not valid JSON", 0) == 0 ? " is " : ": ") + why);
  }
  Json j = std::move(*parsed);
  if (!j.is_object()) return InvalidArgument(path + " must hold a JSON object");
  return j;
}

bool IsDirectory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// The agents a plugin is enabled for, for display: "*" is every agent.
std::string EnabledFor(const Json& plugin) {
  std::string out;
  for (const Json& a : Field(plugin, "enabled_for")) {
    if (!out.empty()) out += ", ";
    std::string agent = a.is_string() ? a.get<std::string>() : DumpJson(a);
    out += agent == "*" ? "all agents" : agent;
  }
  return out;
}

// What a plugin does, from its manifest: "builtin audit-log", a webhook's URL, or "".
std::string PluginTarget(const Json& plugin) {
  const Json& m = Field(plugin, "manifest");
  if (Str(plugin, "kind") == "builtin") return Str(m, "builtin");
  if (Str(plugin, "kind") == "webhook") return Str(m, "url");
  return "";
}

}  // namespace

int PluginsList(Context& ctx) {
  Reply list = ListAll(ctx, "/v1/plugins");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& p : Items(list.body)) {
    std::string enabled = EnabledFor(p);
    rows.push_back({Str(p, "id"), Str(p, "kind"), Str(p, "version"),
                    OneLine(Join(Field(Field(p, "manifest"), "events"), ","), 50),
                    OneLine(enabled.empty() ? "-" : enabled, 40), Str(p, "updated_at")});
  }
  PrintTable({"ID", "KIND", "VERSION", "EVENTS", "ENABLED FOR", "UPDATED"}, rows);
  return kExitOk;
}

int PluginsShow(Context& ctx, const std::string& id) {
  Reply p = Request(ctx, "GET", "/v1/plugins/" + Escape(id));
  if (!p.ok()) return p.exit_code;
  if (ctx.json) {
    PrintJson(ctx, p.body);
    return kExitOk;
  }
  const Json& b = p.body;
  const Json& m = Field(b, "manifest");
  const Json& config = Field(b, "config");
  std::string kind = Str(b, "kind");
  std::string enabled = EnabledFor(b);
  PrintFields({{"id", Str(b, "id")},
               {"name", Str(b, "name")},
               {"version", Str(b, "version")},
               {"kind", kind},
               {"builtin", kind == "builtin" ? Str(m, "builtin") : ""},
               {"url", kind == "webhook" ? Str(m, "url") : ""},
               {"events", Join(Field(m, "events"), ", ")},
               {"priority", Str(m, "priority").empty() ? "100" : Str(m, "priority")},
               {"failure mode", kind == "webhook" ? ""
                                : Str(m, "failure_mode").empty() ? "skip"
                                                                 : Str(m, "failure_mode")},
               {"enabled for", enabled.empty() ? "no agent" : enabled},
               {"config", config.is_object() && !config.empty() ? DumpJson(config) : ""},
               {"created", Str(b, "created_at")},
               {"updated", Str(b, "updated_at")}});
  std::string description = Str(m, "description");
  if (!description.empty()) std::cout << "\n" << description << "\n";
  std::string source = Str(b, "source");
  if (!source.empty()) {
    std::cout << "\nsource:\n" << source << (source.back() == '\n' ? "" : "\n");
  }
  return kExitOk;
}

int PluginsRegister(Context& ctx, const PluginRegisterArgs& args) {
  if (!IsDirectory(args.dir)) {
    std::cerr << "keel: " << args.dir << " is not a directory (it should hold manifest.json, "
              << "and plugin.lua for a lua plugin)\n";
    return kExitUsage;
  }
  const std::string dir = args.dir.ends_with('/') ? args.dir.substr(0, args.dir.size() - 1)
                                                  : args.dir;
  Result<Json> manifest = ReadJsonObjectFile(dir + "/manifest.json");
  if (!manifest.ok()) {
    std::cerr << "keel: " << manifest.status().message() << "\n";
    return kExitUsage;
  }
  Json body = {{"manifest", *manifest}};
  const Json& kind = Field(*manifest, "kind");
  if (kind.is_string() && kind.get<std::string>() == "lua") {
    std::optional<std::string> source = ReadFile(dir + "/plugin.lua");
    if (!source) {
      std::cerr << "keel: cannot read " << dir << "/plugin.lua (a lua plugin's script)\n";
      return kExitUsage;
    }
    body["source"] = *source;
  }
  std::string config_file = args.config_file;
  if (config_file.empty() && Exists(dir + "/config.json")) config_file = dir + "/config.json";
  if (!config_file.empty()) {
    Result<Json> config = ReadJsonObjectFile(config_file);
    if (!config.ok()) {
      std::cerr << "keel: " << config.status().message() << "\n";
      return kExitUsage;
    }
    body["config"] = *config;
  }
  Reply registered = Request(ctx, "POST", "/v1/plugins", body);
  if (!registered.ok()) return registered.exit_code;
  if (ctx.json) {
    PrintJson(ctx, registered.body);
    return kExitOk;
  }
  const Json& p = registered.body;
  std::string id = Str(p, "id");
  std::string target = PluginTarget(p);
  std::cout << (registered.status == 201 ? "registered" : "replaced") << " plugin " << id << " ("
            << Str(p, "kind") << (target.empty() ? "" : " " + target) << ", version "
            << Str(p, "version") << "): "
            << Join(Field(Field(p, "manifest"), "events"), ", ") << "\n";
  std::string enabled = EnabledFor(p);
  if (enabled.empty()) {
    std::cout << "enable it with `keel plugins enable " << id << " --agent AGENT` or `--all`\n";
  } else {
    std::cout << "enabled for " << enabled << "; agents take it up at their next turn\n";
  }
  return kExitOk;
}

int PluginsEnable(Context& ctx, const std::string& id, const std::string& agent, bool all,
                  bool enable) {
  const char* verb = enable ? "enable" : "disable";
  if (agent.empty() == !all) {
    std::cerr << "keel: plugins " << verb << " takes --agent AGENT or --all (one of them)\n";
    return kExitUsage;
  }
  std::string agent_id = "*";
  if (!all) {
    if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  }
  Reply changed = Request(ctx, "POST", "/v1/plugins/" + Escape(id) + "/" + verb,
                          Json{{"agent_id", agent_id}});
  if (!changed.ok()) return changed.exit_code;
  if (ctx.json) {
    PrintJson(ctx, changed.body);
    return kExitOk;
  }
  std::cout << verb << "d plugin " << id << " for "
            << (all ? std::string("all agents")
                    : "agent " + agent + (agent == agent_id ? "" : " (" + agent_id + ")"))
            << "; it takes effect at " << (all ? "each agent's" : "the agent's")
            << " next turn\n";
  std::string enabled = EnabledFor(changed.body);
  std::cout << "enabled for: " << (enabled.empty() ? "no agent" : enabled) << "\n";
  return kExitOk;
}

int PluginsDelete(Context& ctx, const std::string& id) {
  Reply gone = Request(ctx, "DELETE", "/v1/plugins/" + Escape(id));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "deleted plugin " << id << "\n";
  return kExitOk;
}

int PluginsDeliveries(Context& ctx, const std::string& id, const std::string& status) {
  Reply list = ListAll(ctx, "/v1/plugins/" + Escape(id) + "/deliveries" +
                                (status.empty() ? "" : "?status=" + Escape(status)));
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& d : Items(list.body)) {
    // The last attempt: why it failed, or the receiver's status.
    std::string last = Str(d, "last_error");
    std::string code = Str(d, "last_status");
    if (last.empty() && !code.empty() && code != "0") last = "HTTP " + code;
    std::string when = Str(d, "status") == "pending" ? Str(d, "next_attempt_at")
                                                     : Str(d, "delivered_at");
    rows.push_back({Str(d, "id"), Str(d, "status"), Str(d, "event"), Str(d, "attempts"),
                    Str(d, "created_at"), when.empty() ? "-" : when,
                    OneLine(last.empty() ? "-" : last, 60)});
  }
  PrintTable({"ID", "STATUS", "EVENT", "ATTEMPTS", "CREATED", "NEXT / DELIVERED", "LAST ATTEMPT"},
             rows);
  return kExitOk;
}

int PluginsReplay(Context& ctx, const std::string& id, const std::string& delivery_id) {
  Reply d = Request(ctx, "POST", "/v1/plugins/" + Escape(id) + "/deliveries/" +
                                     Escape(delivery_id) + "/replay");
  if (!d.ok()) return d.exit_code;
  if (ctx.json) {
    PrintJson(ctx, d.body);
  } else {
    std::cout << "delivery " << delivery_id << " of plugin " << id << " (" << Str(d.body, "event")
              << ") is pending again and due now\n";
  }
  return kExitOk;
}

// ---- skills

namespace {

// Text the API can carry as a JSON string: valid UTF-8 without NUL bytes.
bool IsUtf8Text(const std::string& s) {
  if (s.find('\0') != std::string::npos) return false;
  try {
    (void)Json(s).dump();  // throws on invalid UTF-8
  } catch (const Json::type_error&) {
    return false;
  }
  return true;
}

// Standard base64 with padding, as the API takes binary skill files.
std::string Base64(std::string_view data) {
  std::string out = Base64UrlEncode(data);
  for (char& c : out) {
    if (c == '-') c = '+';
    else if (c == '_') c = '/';
  }
  while (out.size() % 4) out += '=';
  return out;
}

// The files of a skill's directory as the API takes them: {"PATH": TEXT | {"base64": DATA}}.
// Symbolic links are refused (a skill holds regular files only).
Result<Json> SkillFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  Json files = Json::object();
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) return InvalidArgument("cannot read " + dir + ": " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) return InvalidArgument("cannot read " + dir + ": " + ec.message());
    const fs::path& path = it->path();
    std::string rel = path.lexically_relative(dir).generic_string();
    if (it->is_symlink(ec)) {
      return InvalidArgument(rel + " is a symbolic link; a skill holds regular files only");
    }
    if (it->is_directory(ec)) continue;
    if (!it->is_regular_file(ec)) return InvalidArgument(rel + " is not a regular file");
    std::optional<std::string> data = ReadFile(path.string());
    if (!data) return InvalidArgument("cannot read " + path.string());
    files[rel] = IsUtf8Text(*data) ? Json(*data) : Json{{"base64", Base64(*data)}};
  }
  return files;
}

std::string AssignedTo(const Json& skill) {
  std::string out = Join(Field(skill, "assigned_to"), ", ");
  return out.empty() ? "no agent" : out;
}

}  // namespace

int SkillsRegister(Context& ctx, const std::string& dir_arg) {
  if (!IsDirectory(dir_arg)) {
    std::cerr << "keel: " << dir_arg << " is not a directory (it should hold SKILL.md)\n";
    return kExitUsage;
  }
  const std::string dir = dir_arg.ends_with('/') ? dir_arg.substr(0, dir_arg.size() - 1) : dir_arg;
  if (!Exists(dir + "/SKILL.md")) {
    std::cerr << "keel: " << dir << " has no SKILL.md\n";
    return kExitUsage;
  }
  Result<Json> files = SkillFiles(dir);
  if (!files.ok()) {
    std::cerr << "keel: " << files.status().message() << "\n";
    return kExitUsage;
  }
  Reply registered = Request(ctx, "POST", "/v1/skills", Json{{"files", *files}});
  if (!registered.ok()) return registered.exit_code;
  if (ctx.json) {
    PrintJson(ctx, registered.body);
    return kExitOk;
  }
  const Json& k = registered.body;
  std::cout << (registered.status == 201 ? "registered" : "replaced") << " skill "
            << Str(k, "name") << " (" << Field(k, "manifest").size() << " files, "
            << Str(k, "bytes") << " bytes)\n";
  if (Field(k, "assigned_to").empty()) {
    std::cout << "assign it with `keel skills assign AGENT " << Str(k, "name") << "`\n";
  } else {
    std::cout << "assigned to " << AssignedTo(k) << "; agents take it up at their next turn\n";
  }
  return kExitOk;
}

int SkillsList(Context& ctx) {
  Reply list = Request(ctx, "GET", "/v1/skills");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& k : Items(list.body)) {
    rows.push_back({Str(k, "name"), std::to_string(Field(k, "manifest").size()), Str(k, "bytes"),
                    OneLine(AssignedTo(k), 40), OneLine(Str(k, "description"), 60),
                    Str(k, "updated_at")});
  }
  PrintTable({"NAME", "FILES", "BYTES", "ASSIGNED TO", "DESCRIPTION", "UPDATED"}, rows);
  return kExitOk;
}

int SkillsShow(Context& ctx, const std::string& name) {
  Reply k = Request(ctx, "GET", "/v1/skills/" + Escape(name));
  if (!k.ok()) return k.exit_code;
  if (ctx.json) {
    PrintJson(ctx, k.body);
    return kExitOk;
  }
  const Json& b = k.body;
  PrintFields({{"name", Str(b, "name")},
               {"description", Str(b, "description")},
               {"hash", Str(b, "hash")},
               {"bytes", Str(b, "bytes")},
               {"assigned to", AssignedTo(b)},
               {"created", Str(b, "created_at")},
               {"updated", Str(b, "updated_at")}});
  std::cout << "\nfiles:\n";
  for (const Json& f : Field(b, "manifest")) {
    std::cout << "  " << Str(f, "path") << " (" << Str(f, "bytes") << " bytes"
              << (Field(f, "binary") == true ? ", binary" : "") << ")\n";
  }
  std::string text = Str(Field(b, "files"), "SKILL.md");
  if (!text.empty()) std::cout << "\nSKILL.md:\n" << text << (text.back() == '\n' ? "" : "\n");
  return kExitOk;
}

int SkillsRemove(Context& ctx, const std::string& name) {
  Reply gone = Request(ctx, "DELETE", "/v1/skills/" + Escape(name));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "deleted skill " << name << "\n";
  return kExitOk;
}

int SkillsAssign(Context& ctx, const std::string& agent, const std::string& name, bool assign) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  Reply changed = assign ? Request(ctx, "POST", "/v1/agents/" + Escape(agent_id) + "/skills",
                                   Json{{"name", name}})
                         : Request(ctx, "DELETE", "/v1/agents/" + Escape(agent_id) + "/skills/" +
                                                      Escape(name));
  if (!changed.ok()) return changed.exit_code;
  if (ctx.json) {
    PrintJson(ctx, changed.body);
    return kExitOk;
  }
  std::cout << (assign ? "assigned skill " : "unassigned skill ") << name
            << (assign ? " to agent " : " from agent ") << agent
            << "; it takes effect at the agent's next turn\n";
  return kExitOk;
}

int TenantsCreate(Context& ctx, const std::string& name) {
  Reply created = Request(ctx, "POST", "/v1/tenants", Json{{"name", name}});
  if (!created.ok()) return created.exit_code;
  if (ctx.json) {
    PrintJson(ctx, created.body);
    return kExitOk;
  }
  const Json& tenant = Field(created.body, "tenant");
  std::cerr << "created tenant " << Str(tenant, "name") << " (" << Str(tenant, "id")
            << "); its owner token is shown only this once:\n";
  std::cout << Str(created.body, "owner_token") << "\n";
  return kExitOk;
}

int TenantsList(Context& ctx) {
  Reply tenants = Request(ctx, "GET", "/v1/tenants");
  if (!tenants.ok()) return tenants.exit_code;
  if (ctx.json) {
    PrintJson(ctx, tenants.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& t : Items(tenants.body)) {
    rows.push_back({Str(t, "id"), Str(t, "name"), Str(t, "created_at")});
  }
  PrintTable({"ID", "NAME", "CREATED"}, rows);
  return kExitOk;
}

namespace {

void PrintEventLine(const Json& e) {
  std::string run = Str(e, "run_id");
  std::cout << Str(e, "position") << "  " << Str(e, "occurred_at") << "  " << Str(e, "type")
            << (run.empty() ? "" : "  run=" + run) << "  " << OneLine(Str(e, "payload"), 120)
            << "\n";
}

// Tails the event stream, reconnecting with Last-Event-ID when the server ends it.
int FollowEvents(Context& ctx, const EventsArgs& args) {
  std::string last_id = args.after > 0 ? std::to_string(args.after) : "";
  while (true) {
    Headers headers;
    if (!last_id.empty()) headers.emplace_back("Last-Event-ID", last_id);
    Result<HttpClient::Opened> opened = ctx.client.OpenStream("/v1/stream", headers);
    if (!opened.ok()) return ReportTransportError(opened.status());
    if (!opened->stream) return ReportHttpError(opened->error);
    while (true) {
      Result<std::optional<SseEvent>> next = opened->stream->Next();
      if (!next.ok() || !next->has_value()) break;
      const SseEvent& event = **next;
      if (!event.id.empty()) last_id = event.id;
      if (ctx.json) {
        std::cout << event.data << "\n" << std::flush;
        continue;
      }
      if (event.event == "message.delta") continue;  // token deltas would drown the log
      Result<Json> data = ParseJson(event.data);
      if (data.ok()) PrintEventLine(*data);
      std::cout << std::flush;
    }
    std::cerr << Dim("stream ended; reconnecting") << "\n";
    std::this_thread::sleep_for(seconds(1));
  }
}

}  // namespace

int Events(Context& ctx, const EventsArgs& args) {
  if (args.follow) return FollowEvents(ctx, args);
  Reply events = Request(
      ctx, "GET",
      "/v1/events?after=" + std::to_string(args.after) + "&limit=" + std::to_string(args.limit));
  if (!events.ok()) return events.exit_code;
  if (ctx.json) {
    PrintJson(ctx, events.body);
    return kExitOk;
  }
  for (const Json& e : Items(events.body)) PrintEventLine(e);
  return kExitOk;
}

int Health(Context& ctx) {
  Result<HttpResult> answer = ctx.client.Call("GET", "/readyz", std::nullopt, {}, seconds(10));
  if (!answer.ok()) return ReportTransportError(answer.status());
  bool ready = answer->status == 200;
  if (ctx.json) {
    Result<Json> body = ParseJson(answer->body);
    PrintJson(ctx, body.ok() ? *body : Json{{"status", answer->status}, {"body", answer->body}});
  } else if (ready) {
    std::cout << "ready: " << ctx.client.url() << "\n";
  }
  if (!ready) {
    std::cerr << "keel: not ready: " << ctx.client.url() << " answered " << answer->status
              << (Trim(answer->body).empty() ? "" : ": " + OneLine(Trim(answer->body), 200))
              << "\n";
    return kExitServerError;
  }
  return kExitOk;
}

// ---- memory

namespace {

std::string MemoriesPath(const std::string& agent_id) {
  return "/v1/agents/" + Escape(agent_id) + "/memories";
}

}  // namespace

int MemorySearch(Context& ctx, const MemorySearchArgs& args) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, args.agent, &agent_id); code != kExitOk) return code;
  std::string target = MemoriesPath(agent_id) + "?q=" + Escape(args.query) +
                       "&limit=" + std::to_string(args.limit);
  if (!args.tag.empty()) target += "&tag=" + Escape(args.tag);
  Reply found = Request(ctx, "GET", target);
  if (!found.ok()) return found.exit_code;
  if (ctx.json) {
    PrintJson(ctx, found.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& m : Items(found.body)) {
    char score[32];
    const Json& s = Field(m, "score");
    std::snprintf(score, sizeof(score), "%.4f", s.is_number() ? s.get<double>() : 0.0);
    rows.push_back({score, Str(m, "id"), OneLine(Join(Field(m, "tags"), ","), 30),
                    OneLine(Str(m, "text"), 80)});
  }
  if (rows.empty()) {
    std::cout << "no memory matches\n";
    return kExitOk;
  }
  PrintTable({"SCORE", "ID", "TAGS", "TEXT"}, rows);
  return kExitOk;
}

int MemoryAdd(Context& ctx, const MemoryAddArgs& args) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, args.agent, &agent_id); code != kExitOk) return code;
  Json body = {{"text", args.text}, {"tags", args.tags}};
  if (!args.source.empty()) body["source"] = args.source;
  if (!args.id.empty()) body["id"] = args.id;
  Reply written = Request(ctx, "POST", MemoriesPath(agent_id), body);
  if (!written.ok()) return written.exit_code;
  if (ctx.json) {
    PrintJson(ctx, written.body);
    return kExitOk;
  }
  std::cout << (written.status == 201 ? "added" : "replaced") << " memory "
            << Str(written.body, "id") << "\n";
  return kExitOk;
}

int MemoryRemove(Context& ctx, const std::string& agent, const std::string& id) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  Reply gone = Request(ctx, "DELETE", MemoriesPath(agent_id) + "/" + Escape(id));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "deleted memory " << id << "\n";
  return kExitOk;
}

int MemoryList(Context& ctx, const std::string& agent, const std::string& tag) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  Reply list = ListAll(ctx, MemoriesPath(agent_id) + (tag.empty() ? "" : "?tag=" + Escape(tag)));
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& m : Items(list.body)) {
    rows.push_back({Str(m, "id"), Str(m, "updated_at"), Str(m, "source"),
                    OneLine(Join(Field(m, "tags"), ","), 30), OneLine(Str(m, "text"), 80)});
  }
  PrintTable({"ID", "UPDATED", "SOURCE", "TAGS", "TEXT"}, rows);
  return kExitOk;
}

// ---- schedules

namespace {

// --at: an RFC 3339 time as it is, or "+N" with s, m, h or d from now (in UTC).
std::optional<std::string> AtTime(const std::string& at) {
  if (at.size() < 3 || at[0] != '+') {
    return ParseRfc3339(at) ? std::optional<std::string>(at) : std::nullopt;
  }
  int64_t n = 0;
  for (std::size_t i = 1; i + 1 < at.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(at[i])) || n > 100'000'000) return std::nullopt;
    n = n * 10 + (at[i] - '0');
  }
  int64_t unit = 0;
  switch (at.back()) {
    case 's': unit = 1000; break;
    case 'm': unit = 60'000; break;
    case 'h': unit = 3'600'000; break;
    case 'd': unit = 86'400'000; break;
    default: return std::nullopt;
  }
  return FormatRfc3339(NowMillis() + n * unit);
}

std::string ScheduleWhen(const Json& s) {
  return Str(s, "kind") == "once" ? "at " + Str(s, "at")
                                  : Str(s, "cron") + " (" + Str(s, "timezone") + ")";
}

}  // namespace

int ScheduleAdd(Context& ctx, const ScheduleAddArgs& args) {
  if (args.cron.empty() == args.at.empty()) {
    std::cerr << "keel: schedule add takes --cron EXPR or --at TIME (one of them)\n";
    return kExitUsage;
  }
  std::string agent_id;
  if (int code = ResolveAgent(ctx, args.agent, &agent_id); code != kExitOk) return code;
  Json body = {{"agent_id", agent_id}, {"prompt", args.prompt}};
  if (!args.cron.empty()) body["cron"] = args.cron;
  if (!args.at.empty()) {
    std::optional<std::string> at = AtTime(args.at);
    if (!at) {
      std::cerr << "keel: --at takes an RFC 3339 time (2026-11-30T09:00:00Z) or +N with s, m, h "
                   "or d (+90s, +2h), not " << args.at << "\n";
      return kExitUsage;
    }
    body["at"] = *at;
  }
  if (!args.timezone.empty()) body["timezone"] = args.timezone;
  if (!args.session_id.empty()) body["session_id"] = args.session_id;
  if (!args.missed.empty()) body["missed"] = args.missed;
  if (!args.name.empty()) body["name"] = args.name;
  Reply created = Request(ctx, "POST", "/v1/schedules", body);
  if (!created.ok()) return created.exit_code;
  if (ctx.json) {
    PrintJson(ctx, created.body);
    return kExitOk;
  }
  std::cout << "created schedule " << Str(created.body, "id") << ": "
            << ScheduleWhen(created.body) << "; next at " << Str(created.body, "next_fire_at")
            << "\n";
  return kExitOk;
}

int ScheduleList(Context& ctx, const std::string& agent) {
  std::string path = "/v1/schedules";
  if (!agent.empty()) {
    std::string agent_id;
    if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
    path += "?agent_id=" + Escape(agent_id);
  }
  Reply list = ListAll(ctx, path);
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& s : Items(list.body)) {
    std::string next = Str(s, "next_fire_at");
    rows.push_back({Str(s, "id"), OneLine(Str(s, "name"), 30), OneLine(ScheduleWhen(s), 40),
                    Str(s, "status"), next.empty() ? "-" : next,
                    Str(s, "session_id").empty() ? "new" : Str(s, "session_id"),
                    OneLine(Str(s, "prompt"), 40)});
  }
  PrintTable({"ID", "NAME", "WHEN", "STATUS", "NEXT", "SESSION", "PROMPT"}, rows);
  for (const Json& s : Items(list.body)) {
    if (Str(s, "status") == "suspended") {
      std::cout << Str(s, "id") << " is suspended: " << Str(s, "suspended_reason") << "\n";
    }
  }
  return kExitOk;
}

int ScheduleShow(Context& ctx, const std::string& id) {
  Reply s = Request(ctx, "GET", "/v1/schedules/" + Escape(id));
  if (!s.ok()) return s.exit_code;
  if (ctx.json) {
    PrintJson(ctx, s.body);
    return kExitOk;
  }
  const Json& b = s.body;
  PrintFields({{"id", Str(b, "id")},
               {"name", Str(b, "name")},
               {"agent", Str(b, "agent_id")},
               {"when", ScheduleWhen(b)},
               {"missed", Str(b, "missed")},
               {"session", Str(b, "session_id").empty() ? "a new one each time"
                                                        : Str(b, "session_id")},
               {"status", Str(b, "status")},
               {"suspended", Str(b, "suspended_reason").empty() ? "-" : Str(b, "suspended_reason")},
               {"next", Str(b, "next_fire_at")},
               {"last", Str(b, "last_fired_at")},
               {"prompt", Str(b, "prompt")}});
  std::vector<std::vector<std::string>> rows;
  for (const Json& f : Field(b, "recent_fires")) {
    rows.push_back({Str(f, "slot"), Str(f, "fired_at"), Str(f, "outcome"),
                    Str(f, "run_id").empty() ? "-" : Str(f, "run_id"),
                    OneLine(Str(f, "error").empty() ? "-" : Str(f, "error"), 50)});
  }
  if (!rows.empty()) {
    std::cout << "\n";
    PrintTable({"SLOT", "FIRED", "OUTCOME", "RUN", "ERROR"}, rows);
  }
  return kExitOk;
}

int ScheduleRemove(Context& ctx, const std::string& id) {
  Reply gone = Request(ctx, "DELETE", "/v1/schedules/" + Escape(id));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "deleted schedule " << id << "\n";
  return kExitOk;
}

int ScheduleSetEnabled(Context& ctx, const std::string& id, bool enabled) {
  Reply s = Request(ctx, "POST", "/v1/schedules/" + Escape(id) + (enabled ? "/resume" : "/pause"));
  if (!s.ok()) return s.exit_code;
  if (ctx.json) {
    PrintJson(ctx, s.body);
    return kExitOk;
  }
  std::string next = Str(s.body, "next_fire_at");
  std::cout << "schedule " << id << " is " << Str(s.body, "status")
            << (enabled && !next.empty() ? "; next at " + next : "") << "\n";
  return kExitOk;
}

int ScheduleReassign(Context& ctx, const std::string& id, const std::string& token_id) {
  Reply s = Request(ctx, "PATCH", "/v1/schedules/" + Escape(id), Json{{"token_id", token_id}});
  if (!s.ok()) return s.exit_code;
  if (ctx.json) {
    PrintJson(ctx, s.body);
    return kExitOk;
  }
  std::string next = Str(s.body, "next_fire_at");
  std::cout << "schedule " << id << " acts for token " << token_id << "; it is "
            << Str(s.body, "status") << (next.empty() ? "" : "; next at " + next) << "\n";
  return kExitOk;
}

}  // namespace keel::cli

// ---- channels

namespace keel::cli {

int ChannelAdd(Context& ctx, const ChannelAddArgs& args) {
  // The flags each kind needs and takes, checked before anything is asked of the server.
  const bool telegram = args.kind == "telegram", slack = args.kind == "slack",
             discord = args.kind == "discord", webhook = !telegram && !slack && !discord;
  const std::vector<std::tuple<const char*, const std::string*, bool, bool>> flags = {
      // flag, value, needed, taken
      {"--secret", &args.secret, webhook || slack, webhook || slack},
      {"--bot-token", &args.bot_token, !webhook, !webhook},
      {"--api-base", &args.api_base, false, !webhook},
      {"--template", &args.message_template, false, webhook},
      {"--conversation", &args.conversation, false, webhook},
      {"--application-id", &args.application_id, discord, discord},
      {"--public-key", &args.public_key, discord, discord},
      {"--command", &args.command, false, discord}};
  for (const auto& [flag, value, needed, taken] : flags) {
    if (needed && value->empty()) {
      std::cerr << "keel: a " << args.kind << " channel needs " << flag << "\n";
      return kExitUsage;
    }
  }
  for (const auto& [flag, value, needed, taken] : flags) {
    if (!taken && !value->empty()) {
      std::cerr << "keel: " << flag << " is not for " << args.kind << " channels\n";
      return kExitUsage;
    }
  }
  std::string agent_id;
  if (int code = ResolveAgent(ctx, args.agent, &agent_id); code != kExitOk) return code;
  Json settings = Json::object();
  if (!webhook) {
    settings["bot_token"] = args.bot_token;
    if (slack) settings["signing_secret"] = args.secret;
    if (discord) {
      settings["application_id"] = args.application_id;
      settings["public_key"] = args.public_key;
      if (!args.command.empty()) settings["command"] = args.command;
    }
    if (!args.api_base.empty()) settings["api_base"] = args.api_base;
  } else {
    settings["signing_secret"] = args.secret;
    if (!args.message_template.empty()) settings["template"] = args.message_template;
    if (!args.conversation.empty()) settings["conversation"] = args.conversation;
  }
  if (!args.role.empty()) settings["role"] = args.role;
  Reply created = Request(ctx, "POST", "/v1/agents/" + Escape(agent_id) + "/channels",
                          Json{{"kind", args.kind}, {"name", args.name}, {"settings", settings}});
  if (!created.ok()) return created.exit_code;
  if (ctx.json) {
    PrintJson(ctx, created.body);
    return kExitOk;
  }
  if (telegram) {
    std::cout << "created channel " << Str(created.body, "name") << " (" << Str(created.body, "id")
              << "): the bot is polled within two seconds; "
              << "`keel channels show " << Str(created.body, "id") << "` says if Telegram "
              << "refuses it\n";
    return kExitOk;
  }
  std::cout << "created channel " << Str(created.body, "name") << " (" << Str(created.body, "id")
            << "): "
            << (slack     ? "the Slack app's Request URL is "
                : discord ? "the Discord app's Interactions Endpoint URL is "
                          : "signed deliveries to ")
            << ctx.client.url() << Str(created.body, "url") << "\n";
  return kExitOk;
}

int ChannelList(Context& ctx, const std::string& agent) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  Reply list = ListAll(ctx, "/v1/agents/" + Escape(agent_id) + "/channels");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& c : Items(list.body)) {
    const Json settings = c.value("settings", Json::object());
    rows.push_back({Str(c, "id"), OneLine(Str(c, "name"), 30), Str(c, "kind"), Str(c, "status"),
                    OneLine(settings.value("template", ""), 40), Str(c, "url")});
  }
  PrintTable({"ID", "NAME", "KIND", "STATUS", "TEMPLATE", "URL"}, rows);
  for (const Json& c : Items(list.body)) {
    if (Str(c, "status") == "error") {
      std::cout << Str(c, "name") << " is not working: " << Str(c, "error") << "\n";
    }
  }
  return kExitOk;
}

namespace {

int PrintChannel(Context& ctx, const Json& c) {
  if (ctx.json) {
    PrintJson(ctx, c);
    return kExitOk;
  }
  const Json settings = c.value("settings", Json::object());
  if (Str(c, "kind") == "discord") {
    PrintFields(
        {{"id", Str(c, "id")},
         {"name", Str(c, "name")},
         {"agent", Str(c, "agent_id")},
         {"kind", Str(c, "kind")},
         {"status", Str(c, "status") == "error" ? "error: " + Str(c, "error") : Str(c, "status")},
         {"interactions url", ctx.client.url() + Str(c, "url")},
         {"application", settings.value("application_id", "")},
         {"command", "/" + settings.value("command", "")},
         {"bot token", settings.value("bot_token", "")},
         {"api base", settings.value("api_base", "")},
         {"role", settings.value("role", "")},
         {"created", Str(c, "created_at")}});
    return kExitOk;
  }
  if (Str(c, "kind") == "slack") {
    PrintFields(
        {{"id", Str(c, "id")},
         {"name", Str(c, "name")},
         {"agent", Str(c, "agent_id")},
         {"kind", Str(c, "kind")},
         {"status", Str(c, "status") == "error" ? "error: " + Str(c, "error") : Str(c, "status")},
         {"request url", ctx.client.url() + Str(c, "url")},
         {"secret", settings.value("signing_secret", "")},
         {"bot token", settings.value("bot_token", "")},
         {"api base", settings.value("api_base", "")},
         {"role", settings.value("role", "")},
         {"created", Str(c, "created_at")}});
    return kExitOk;
  }
  if (Str(c, "kind") == "telegram") {
    PrintFields(
        {{"id", Str(c, "id")},
         {"name", Str(c, "name")},
         {"agent", Str(c, "agent_id")},
         {"kind", Str(c, "kind")},
         {"status", Str(c, "status") == "error" ? "error: " + Str(c, "error") : Str(c, "status")},
         {"bot token", settings.value("bot_token", "")},
         {"api base", settings.value("api_base", "")},
         {"role", settings.value("role", "")},
         {"created", Str(c, "created_at")}});
    return kExitOk;
  }
  PrintFields(
      {{"id", Str(c, "id")},
       {"name", Str(c, "name")},
       {"agent", Str(c, "agent_id")},
       {"kind", Str(c, "kind")},
       {"status", Str(c, "status") == "error" ? "error: " + Str(c, "error") : Str(c, "status")},
       {"url", ctx.client.url() + Str(c, "url")},
       {"secret", settings.value("signing_secret", "")},
       {"template", settings.value("template", "")},
       {"conversation", settings.value("conversation", "")},
       {"role", settings.value("role", "")},
       {"created", Str(c, "created_at")}});
  return kExitOk;
}

}  // namespace

int ChannelShow(Context& ctx, const std::string& id) {
  Reply c = Request(ctx, "GET", "/v1/channels/" + Escape(id));
  if (!c.ok()) return c.exit_code;
  return PrintChannel(ctx, c.body);
}

int ChannelSetEnabled(Context& ctx, const std::string& id, bool enabled) {
  Reply c = Request(ctx, "PATCH", "/v1/channels/" + Escape(id), Json{{"enabled", enabled}});
  if (!c.ok()) return c.exit_code;
  if (ctx.json) return PrintChannel(ctx, c.body);
  std::cout << "channel " << Str(c.body, "name") << " is " << (enabled ? "enabled" : "disabled")
            << "\n";
  return kExitOk;
}

int ChannelReplies(Context& ctx, const std::string& id) {
  Reply list = ListAll(ctx, "/v1/channels/" + Escape(id) + "/replies");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& r : Items(list.body)) {
    const std::string status = Str(r, "status");
    const bool failed = status == "dead" || status == "unknown";
    rows.push_back({Str(r, "delivery_id"), status, std::to_string(r.value("attempts", 0)),
                    Str(r, "run_id"), OneLine(failed ? Str(r, "error") : Str(r, "text"), 60)});
  }
  PrintTable({"UPDATE", "STATUS", "ATTEMPTS", "RUN", "TEXT OR ERROR"}, rows);
  return kExitOk;
}

namespace {

// "PLATFORM:ID" split; reports and returns false when it is not that.
bool SplitIdentity(const std::string& identity, std::string* platform, std::string* id) {
  const auto colon = identity.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == identity.size()) {
    std::cerr << "keel: an identity is PLATFORM:ID (telegram:123456789, slack:U0123ABC, "
                 "discord:80351110224678912), not '"
              << identity << "'\n";
    return false;
  }
  *platform = identity.substr(0, colon);
  *id = identity.substr(colon + 1);
  return true;
}

std::string Identities(const Json& user) {
  std::string out;
  for (const Json& i : user.value("identities", Json::array())) {
    out += (out.empty() ? "" : ", ") + Str(i, "platform") + ":" + Str(i, "platform_user_id");
  }
  return out.empty() ? "-" : out;
}

int PrintUser(Context& ctx, const Json& u) {
  if (ctx.json) {
    PrintJson(ctx, u);
    return kExitOk;
  }
  std::vector<std::pair<std::string, std::string>> fields = {
      {"id", Str(u, "id")}, {"name", Str(u, "name")}, {"identities", Identities(u)}};
  if (u.value("merged_into", Json()).is_string()) {
    fields.push_back({"merged into", Str(u, "merged_into")});
  }
  if (u.contains("roles")) {
    std::string roles;
    for (const Json& r : u["roles"]) {
      roles += (roles.empty() ? "" : ", ") + Str(r, "role") + " of " + Str(r, "agent_id");
    }
    fields.push_back({"roles", roles.empty() ? "-" : roles});
  }
  PrintFields(fields);
  return kExitOk;
}

}  // namespace

int UserList(Context& ctx) {
  Reply list = ListAll(ctx, "/v1/users");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& u : Items(list.body)) {
    const Json into = u.value("merged_into", Json());
    rows.push_back({Str(u, "id"), OneLine(Str(u, "name"), 30), OneLine(Identities(u), 50),
                    into.is_string() ? "merged into " + into.get<std::string>() : ""});
  }
  PrintTable({"ID", "NAME", "IDENTITIES", ""}, rows);
  return kExitOk;
}

int UserAdd(Context& ctx, const std::string& name, const std::vector<std::string>& identities) {
  Json body = {{"name", name}, {"identities", Json::array()}};
  for (const auto& identity : identities) {
    std::string platform, id;
    if (!SplitIdentity(identity, &platform, &id)) return kExitUsage;
    body["identities"].push_back({{"platform", platform}, {"platform_user_id", id}});
  }
  Reply u = Request(ctx, "POST", "/v1/users", body);
  if (!u.ok()) return u.exit_code;
  return PrintUser(ctx, u.body);
}

int UserShow(Context& ctx, const std::string& id) {
  Reply u = Request(ctx, "GET", "/v1/users/" + Escape(id));
  if (!u.ok()) return u.exit_code;
  return PrintUser(ctx, u.body);
}

int UserLink(Context& ctx, const std::string& id, const std::string& identity, bool link) {
  std::string platform, platform_id;
  if (!SplitIdentity(identity, &platform, &platform_id)) return kExitUsage;
  Reply r = link ? Request(ctx, "POST", "/v1/users/" + Escape(id) + "/identities",
                           Json{{"platform", platform}, {"platform_user_id", platform_id}})
                 : Request(ctx, "DELETE",
                           "/v1/users/" + Escape(id) + "/identities/" + Escape(platform) + "/" +
                               Escape(platform_id));
  if (!r.ok()) return r.exit_code;
  if (ctx.json) {
    PrintJson(ctx, r.body);
  } else {
    std::cout << identity << (link ? " is user " : " is no longer user ") << id << "\n";
  }
  return kExitOk;
}

int UserMerge(Context& ctx, const std::string& into, const std::string& from) {
  Reply u = Request(ctx, "POST", "/v1/users/" + Escape(into) + "/merge", Json{{"from", from}});
  if (!u.ok()) return u.exit_code;
  if (!ctx.json) std::cout << "merged user " << from << " into " << into << "\n";
  return PrintUser(ctx, u.body);
}

int MemberList(Context& ctx, const std::string& agent) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  Reply list = ListAll(ctx, "/v1/agents/" + Escape(agent_id) + "/members");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& m : Items(list.body)) {
    rows.push_back({Str(m, "user_id"), OneLine(Str(m, "name"), 30), Str(m, "role")});
  }
  PrintTable({"USER", "NAME", "ROLE"}, rows);
  return kExitOk;
}

int MemberSet(Context& ctx, const std::string& agent, const std::string& user,
              const std::string& role) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  Reply m = Request(ctx, "PUT", "/v1/agents/" + Escape(agent_id) + "/members/" + Escape(user),
                    Json{{"role", role}});
  if (!m.ok()) return m.exit_code;
  if (ctx.json) {
    PrintJson(ctx, m.body);
  } else {
    std::cout << Str(m.body, "name") << " is " << role << " of " << agent << "\n";
  }
  return kExitOk;
}

int MemberRemove(Context& ctx, const std::string& agent, const std::string& user) {
  std::string agent_id;
  if (int code = ResolveAgent(ctx, agent, &agent_id); code != kExitOk) return code;
  Reply gone =
      Request(ctx, "DELETE", "/v1/agents/" + Escape(agent_id) + "/members/" + Escape(user));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "user " << user << " is no longer a member of " << agent << "\n";
  return kExitOk;
}

int AccessSet(Context& ctx, const std::string& agent, const std::string& level,
              const std::string& code, bool new_code, int64_t guest_daily_tokens) {
  std::string agent_id;
  if (int exit = ResolveAgent(ctx, agent, &agent_id); exit != kExitOk) return exit;
  const std::string path = "/v1/agents/" + Escape(agent_id) + "/access";
  Reply a;
  if (level.empty() && (!code.empty() || new_code)) {
    std::cerr << "keel: give the level (public, protected or private) with --code or "
                 "--new-code\n";
    return kExitUsage;
  }
  if (level.empty() && guest_daily_tokens < 0) {
    a = Request(ctx, "GET", path);
  } else {
    Json body = Json::object();
    if (!level.empty()) body["level"] = level;
    if (!code.empty()) body["code"] = code;
    if (new_code) body["new_code"] = true;
    if (guest_daily_tokens >= 0) body["guest_daily_tokens"] = guest_daily_tokens;
    a = Request(ctx, "PUT", path, body);
  }
  if (!a.ok()) return a.exit_code;
  if (ctx.json) {
    PrintJson(ctx, a.body);
    return kExitOk;
  }
  PrintFields({{"agent", agent},
               {"access", Str(a.body, "level")},
               {"access code", a.body.value("code_set", false) ? "set" : "none"},
               {"guest daily tokens",
                a.body.value("guest_daily_tokens", int64_t{0}) == 0
                    ? std::string("no allowance")
                    : std::to_string(a.body.value("guest_daily_tokens", int64_t{0}))}});
  if (a.body.contains("code")) {
    std::cout << "The access code, shown this once: " << Str(a.body, "code") << "\n";
  }
  return kExitOk;
}

int ChannelRemove(Context& ctx, const std::string& id) {
  Reply gone = Request(ctx, "DELETE", "/v1/channels/" + Escape(id));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "deleted channel " << id << "\n";
  return kExitOk;
}

}  // namespace keel::cli

// ---- usage and budgets

namespace keel::cli {
namespace {

// A JSON number of USD as text, to the micro-dollar, without trailing zeros ("5", "0.000546").
std::string Usd(const Json& usd) {
  if (!usd.is_number()) return "-";
  const double value = usd.get<double>();
  const int64_t micros = std::llround((value < 0 ? -value : value) * 1e6);
  std::string fraction = std::to_string(1000000 + micros % 1000000).substr(1);
  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
  return std::string(value < 0 ? "-" : "") + std::to_string(micros / 1000000) +
         (fraction.empty() ? "" : "." + fraction);
}

// --scope as the API takes it: "tenant", or "agent:ID|NAME" as the agent's id. Reports and
// returns the exit code when it is neither.
int BudgetScope(Context& ctx, const std::string& scope, std::string* out) {
  if (scope == "tenant") {
    *out = scope;
    return kExitOk;
  }
  if (scope.rfind("agent:", 0) != 0 || scope.size() == 6) {
    std::cerr << "keel: --scope takes tenant or agent:ID (an agent's id or name), not '" << scope
              << "'\n";
    return kExitUsage;
  }
  return ResolveAgent(ctx, scope.substr(6), out);
}

// A budget's scope as --scope takes it.
std::string ScopeText(const std::string& scope) {
  return scope == "tenant" ? scope : "agent:" + scope;
}

std::vector<std::string> UsageRow(const std::string& who, const std::string& name,
                                  const Json& u) {
  return {who,
          name,
          Str(u, "model_calls"),
          Str(u, "cached_calls"),
          Str(u, "input_tokens"),
          Str(u, "output_tokens"),
          Usd(Field(u, "cost_usd")),
          Usd(Field(u, "cache_savings_usd"))};
}

}  // namespace

int Usage(Context& ctx, const UsageArgs& args) {
  std::string path = "/v1/usage?period=" + Escape(args.period);
  if (!args.agent.empty()) {
    std::string agent_id;
    if (int code = ResolveAgent(ctx, args.agent, &agent_id); code != kExitOk) return code;
    path += "&agent_id=" + Escape(agent_id);
  }
  Reply usage = Request(ctx, "GET", path);
  if (!usage.ok()) return usage.exit_code;
  if (ctx.json) {
    PrintJson(ctx, usage.body);
    return kExitOk;
  }
  // The agents' names, to show beside their ids (an agent deleted since has none).
  std::map<std::string, std::string> names;
  const Json& agents = Field(usage.body, "agents");
  if (agents.is_array() && !agents.empty()) {
    Reply list = ListAll(ctx, "/v1/agents");
    if (!list.ok()) return list.exit_code;
    for (const Json& a : Items(list.body)) names[Str(a, "id")] = Str(a, "name");
  }
  std::cout << "period: " << Str(usage.body, "period") << " (since "
            << Str(usage.body, "period_start") << ", UTC)\n\n";
  std::vector<std::vector<std::string>> rows;
  if (agents.is_array()) {
    for (const Json& a : agents) {
      std::string id = Str(a, "agent_id");
      rows.push_back(UsageRow(id, names.count(id) ? names[id] : "-", a));
    }
  }
  if (args.agent.empty()) rows.push_back(UsageRow("tenant", "(all agents)", Field(usage.body, "tenant")));
  PrintTable({"AGENT", "NAME", "CALLS", "CACHED", "INPUT_TOKENS", "OUTPUT_TOKENS", "COST_USD",
              "CACHE_SAVINGS_USD"},
             rows);
  return kExitOk;
}

int BudgetSet(Context& ctx, const BudgetSetArgs& args) {
  std::string scope;
  if (int code = BudgetScope(ctx, args.scope, &scope); code != kExitOk) return code;
  Json body = {{"scope", scope}, {"period", args.period}, {"limit_usd", args.limit_usd}};
  Reply set = Request(ctx, "PUT", "/v1/budgets", body);
  if (!set.ok()) return set.exit_code;
  if (ctx.json) {
    PrintJson(ctx, set.body);
    return kExitOk;
  }
  std::cout << "budget " << ScopeText(Str(set.body, "scope")) << " per "
            << Str(set.body, "period") << ": " << Usd(Field(set.body, "limit_usd"))
            << " USD; spent " << Usd(Field(set.body, "spent_usd")) << " USD since "
            << Str(set.body, "period_start") << "\n";
  return kExitOk;
}

int BudgetList(Context& ctx) {
  Reply list = ListAll(ctx, "/v1/budgets");
  if (!list.ok()) return list.exit_code;
  if (ctx.json) {
    PrintJson(ctx, list.body);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Json& b : Items(list.body)) {
    rows.push_back({ScopeText(Str(b, "scope")), Str(b, "period"), Usd(Field(b, "limit_usd")),
                    Usd(Field(b, "spent_usd")), Str(b, "period_start"), Str(b, "updated_at")});
  }
  PrintTable({"SCOPE", "PERIOD", "LIMIT_USD", "SPENT_USD", "PERIOD_START", "UPDATED"}, rows);
  return kExitOk;
}

int BudgetRemove(Context& ctx, const std::string& scope_arg, const std::string& period) {
  std::string scope;
  if (int code = BudgetScope(ctx, scope_arg, &scope); code != kExitOk) return code;
  Reply gone = Request(ctx, "DELETE",
                       "/v1/budgets?scope=" + Escape(scope) + "&period=" + Escape(period));
  if (!gone.ok()) return gone.exit_code;
  if (!ctx.json) std::cout << "deleted budget " << ScopeText(scope) << " per " << period << "\n";
  return kExitOk;
}

}  // namespace keel::cli

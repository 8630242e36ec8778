#include "keel/tools/gateway.h"

#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>

#include "keel/approvals/approvals.h"
#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/io_work.h"
#include "keel/common/log.h"
#include "keel/mcp/child_process.h"
#include "keel/mcp/manager.h"
#include "keel/secrets/vault.h"
#include "keel/common/time.h"
#include "keel/policy/policy.h"
#include "keel/policy/stored.h"
#include "keel/runs/run_state.h"
#include "keel/store/async.h"
#include "keel/tools/schema.h"
#include "keel/tools/tool_pool.h"
#include "keel/tools/workspace.h"

namespace keel::tools {

namespace asio = boost::asio;

Gateway::Gateway(store::Store& store, ToolRegistry& registry, std::string workspaces_root,
                 GatewayOptions options, mcp::McpManager* mcp, const secrets::Vault* vault)
    : store_(store),
      registry_(registry),
      workspaces_root_(std::move(workspaces_root)),
      options_(options),
      mcp_(mcp),
      vault_(vault),
      pool_(std::make_unique<ToolPool>(options.tool_threads, options.tenant_tool_threads)) {}

template <typename T>
asio::awaitable<T> Gateway::OnPool(std::string tenant, std::function<T()> fn) {
  auto executor = co_await asio::this_coro::executor;
  ToolPool* pool = pool_.get();
  // The coroutine waits as an asynchronous operation: the pool runs `fn` and posts its value
  // back to the coroutine's executor. The handler is shared because std::function copies.
  auto initiate = [pool, executor, tenant = std::move(tenant), fn = std::move(fn)](
                      auto handler) mutable {
    auto shared = std::make_shared<decltype(handler)>(std::move(handler));
    pool->Post(tenant, [fn = std::move(fn), shared, executor]() mutable {
      auto value = std::make_shared<T>(fn());
      asio::post(executor, [shared, value]() mutable { (*shared)(std::move(*value)); });
    });
  };
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(T)>(
      std::move(initiate), asio::use_awaitable);
}

namespace {

constexpr std::string_view kMcpPrefix = "mcp__";
constexpr std::string_view kPluginPrefix = "plugin__";

// mcp__{server}__{tool} -> (server, tool); false for anything else.
bool SplitMcpName(const std::string& name, std::string* server, std::string* tool) {
  if (name.compare(0, kMcpPrefix.size(), kMcpPrefix) != 0) return false;
  size_t sep = name.find("__", kMcpPrefix.size());
  if (sep == std::string::npos || sep == kMcpPrefix.size() || sep + 2 >= name.size()) return false;
  *server = name.substr(kMcpPrefix.size(), sep - kMcpPrefix.size());
  *tool = name.substr(sep + 2);
  return true;
}

// Whether an entry of an agent's tools list can name a tool of some MCP server: "*",
// "mcp__..." or a pattern whose literal part is a prefix of "mcp__" ("m*").
bool MayReachMcp(const Json& allowed_tools) {
  for (const auto& a : allowed_tools) {
    if (!a.is_string()) continue;
    std::string_view p = a.get_ref<const std::string&>();
    const bool pattern = !p.empty() && p.back() == '*';
    if (pattern) p.remove_suffix(1);
    if (p.substr(0, kMcpPrefix.size()) == kMcpPrefix) return true;
    if (pattern && kMcpPrefix.substr(0, p.size()) == p) return true;
  }
  return false;
}

// An MCP server's tool as a Keel tool. What it may do is what its annotations say: read-only
// tools need `read` and are pure (a read has no effect to repeat); others need `write`, plus
// `send` unless they say they do not reach the outside world (openWorldHint false); effects
// are `once` unless the server says the tool is idempotent.
class McpToolAdapter final : public Tool {
 public:
  McpToolAdapter(mcp::McpManager& manager, mcp::ServerLaunch launch, mcp::McpTool tool)
      : manager_(manager), launch_(std::move(launch)), tool_(std::move(tool)) {}
  std::string name() const override {
    return std::string(kMcpPrefix) + launch_.name + "__" + tool_.name;
  }
  std::string description() const override { return tool_.description; }
  Json parameters() const override { return tool_.input_schema; }
  EffectClass effect_class() const override {
    if (Hint("readOnlyHint")) return EffectClass::kPure;
    if (Hint("idempotentHint")) return EffectClass::kIdempotent;
    return EffectClass::kOnce;
  }
  std::vector<std::string> rights() const override {
    if (Hint("readOnlyHint")) return {"read"};
    // As the MCP spec says: a tool reaches the outside world unless it says it does not.
    if (Hint("openWorldHint", true)) return {"write", "send"};
    return {"write"};
  }
  bool blocking() const override { return true; }
  Result<Json> Execute(const ToolContext&, const Json& arguments) override {
    KEEL_ASSIGN_OR_RETURN(Json result, manager_.Call(launch_, tool_.name, arguments, 0));
    // Text content reads best as text; anything else goes to the model as the MCP result.
    std::string text;
    bool all_text = result.contains("content") && result["content"].is_array();
    if (all_text) {
      for (const auto& part : result["content"]) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          all_text = false;
          break;
        }
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
    }
    if (result.value("isError", false)) {
      return Unavailable(all_text ? text : DumpJson(result.value("content", Json::array())));
    }
    if (all_text && !result.contains("structuredContent")) return Json(text);
    return result;
  }

 private:
  // A boolean hint; anything else (absent, or not a boolean) is the default.
  bool Hint(const char* name, bool fallback = false) const {
    if (!tool_.annotations.is_object()) return fallback;
    auto it = tool_.annotations.find(name);
    if (it == tool_.annotations.end() || !it->is_boolean()) return fallback;
    return it->get<bool>();
  }
  mcp::McpManager& manager_;
  mcp::ServerLaunch launch_;
  mcp::McpTool tool_;
};

// The directories a sandboxed stdio server needs to see, read-only: its program's prefix (the
// parent of a bin/ directory holding it, so an interpreter finds its libraries) and, for each
// argument that is an existing absolute path, its directory, or the node_modules directory
// holding it (a package needs its dependencies).
std::vector<std::string> CommandDirectories(const std::string& program,
                                            const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  auto prefix_of = [&](const fs::path& exe) {
    fs::path dir = exe.parent_path();
    if (dir.filename() == "bin") dir = dir.parent_path();
    out.push_back(dir.string());
  };
  std::error_code ec;
  prefix_of(program);
  fs::path real = fs::canonical(program, ec);
  if (!ec && real != fs::path(program)) prefix_of(real);
  for (const auto& arg : args) {
    if (arg.empty() || arg[0] != '/') continue;
    fs::path p = fs::weakly_canonical(arg, ec);
    if (ec || !fs::exists(p, ec)) continue;
    std::string text = p.string();
    size_t nm = text.find("/node_modules/");
    if (nm != std::string::npos) {
      out.push_back(text.substr(0, nm + std::string("/node_modules").size()));
    } else {
      out.push_back(fs::is_directory(p, ec) ? text : p.parent_path().string());
    }
  }
  return out;
}

// Where a stdio server runs: in the sandbox (no network, the system and its own directories
// read-only, nothing of Keel's), or, where the platform admin allowed the tenant unsandboxed
// servers, as the exec user. Never as Keel's own user.
Status Confine(const ExecOptions& exec, bool unsandboxed, mcp::StdioServerSpec& spec) {
  if (spec.command.empty() || spec.command[0].empty()) return InvalidArgument("no command");
  // Keel's own HOME (mcp_client.h) is not the server's to see.
  if (!spec.env.count("HOME")) spec.env["HOME"] = "/tmp";
  if (unsandboxed) {
    if (Status can = CanRunAs(exec.uid, exec.gid); !can.ok()) {
      return Status(can.code(), "unsandboxed stdio MCP servers refused: " + can.message());
    }
    spec.run_as_uid = exec.uid;
    spec.run_as_gid = exec.gid;
    spec.cwd = "/";
    return Status::Ok();
  }
  const char* keel_path = std::getenv("PATH");
  std::string path_var = spec.env.count("PATH") ? spec.env["PATH"] : (keel_path ? keel_path : "");
  std::string program = mcp::FindExecutable(spec.command[0], path_var);
  if (program.empty() || ::access(program.c_str(), X_OK) != 0) {
    return NotFound("command '" + spec.command[0] + "' not found in PATH (" + path_var + ")");
  }
  SandboxSpec sandbox;
  sandbox.argv = spec.command;
  sandbox.argv[0] = program;
  sandbox.read_only = CommandDirectories(
      program, std::vector<std::string>(spec.command.begin() + 1, spec.command.end()));
  sandbox.hidden = exec.hidden;
  // The environment (secrets included) reaches the server through bwrap's own, never its
  // command line, which other users can read.
  KEEL_ASSIGN_OR_RETURN(spec.command, SandboxArgv(sandbox));
  return Status::Ok();
}

// The launch of a registered server, its secrets opened (inside a read).
Result<mcp::ServerLaunch> LaunchOf(store::Tx& tx, const secrets::Vault* vault,
                                   const ExecOptions& exec, const store::McpServer& s) {
  mcp::ServerLaunch l;
  l.server_id = s.id;
  l.tenant_id = s.tenant_id;
  l.name = s.name;
  l.transport = s.transport;
  l.spec.name = s.name;
  l.http.name = s.name;
  const Json& c = s.config;
  l.http.url = c.value("url", "");
  // A value, or a secret by reference, opened now.
  auto value_of = [&](const std::string& what, const Json& v) -> Result<std::string> {
    if (v.is_string()) return v.get<std::string>();
    if (!v.is_object() || !v.contains("secret")) return InvalidArgument(what + " is malformed");
    if (!vault) return Unavailable("secrets are not available to MCP servers here");
    std::string secret = v["secret"].get<std::string>();
    auto value = vault->Get(tx, s.tenant_id, secret);
    if (!value.ok()) {
      return Status(value.status().code(), "MCP server " + s.name + " needs secret " + secret +
                                               ": " + value.status().message());
    }
    // The manager takes the value back out of everything the server sends.
    if (Status st = l.redactor.Add(secret, *value); !st.ok()) {
      return Status(st.code(), "MCP server " + s.name + ": " + st.message());
    }
    return std::move(value).value();
  };
  std::string resolved_headers;
  const Json headers = c.value("headers", Json::object());
  for (auto it = headers.begin(); it != headers.end(); ++it) {
    KEEL_ASSIGN_OR_RETURN(std::string v, value_of("headers." + it.key(), it.value()));
    l.http.headers.emplace_back(it.key(), v);
    resolved_headers += it.key() + ": " + v + "\n";
  }
  for (const auto& arg : c.value("command", Json::array())) {
    if (arg.is_string()) l.spec.command.push_back(arg.get<std::string>());
  }
  std::string resolved;
  const Json env = c.value("env", Json::object());
  for (auto it = env.begin(); it != env.end(); ++it) {
    KEEL_ASSIGN_OR_RETURN(l.spec.env[it.key()], value_of("env." + it.key(), it.value()));
    resolved += it.key() + "=" + l.spec.env[it.key()] + "\n";
  }
  if (c.contains("timeout_ms") && c["timeout_ms"].is_number_integer()) {
    l.options.request_timeout_ms = c["timeout_ms"].get<int64_t>();
  }
  bool unsandboxed = false;
  if (s.transport != "http") {
    KEEL_ASSIGN_OR_RETURN(store::Tenant tenant, tx.tenants().GetTenant(s.tenant_id));
    unsandboxed = tenant.allow_stdio_mcp;
    Status confined = Confine(exec, unsandboxed, l.spec);
    if (!confined.ok()) {
      return Status(confined.code(),
                    "MCP server " + s.name + " is not available: " + confined.message());
    }
  }
  // A change of the tenant's setting restarts the server in its new confinement.
  l.fingerprint = Sha256Hex(s.transport + "\n" + DumpJson(c.value("command", Json::array())) +
                            "\n" + l.http.url + "\n" + resolved + resolved_headers +
                            (unsandboxed ? "unsandboxed" : "sandboxed"));
  return l;
}

}  // namespace

asio::awaitable<Result<std::shared_ptr<Tool>>> Gateway::Resolve(std::string tenant_id,
                                                                 std::string agent_id,
                                                                 std::string name) {
  if (Tool* t = registry_.Find(name)) {
    co_return std::shared_ptr<Tool>(t, [](Tool*) {});  // owned by the registry
  }
  if (name.rfind(kPluginPrefix, 0) == 0) {
    if (agent_tools_) {
      for (auto& t : agent_tools_(agent_id)) {
        if (t->name() == name) co_return t;
      }
    }
    co_return NotFound("unknown tool: " + name + " (no enabled plugin of the agent adds it)");
  }
  std::string server, tool;
  if (!mcp_ || !SplitMcpName(name, &server, &tool)) co_return NotFound("unknown tool: " + name);
  mcp::ServerLaunch launch;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    auto found = tx.mcp_servers().GetMcpServerByName(tenant_id, server);
    if (!found.ok()) {
      if (found.status().code() == Code::kNotFound) {
        return NotFound("unknown tool: " + name + " (no MCP server named " + server + ")");
      }
      return found.status();
    }
    KEEL_ASSIGN_OR_RETURN(launch, LaunchOf(tx, vault_, options_.exec, *found));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  mcp::McpManager* manager = mcp_;
  // A named std::function: g++ 12 destroys a capturing temporary in a co_await twice.
  std::function<Result<std::vector<mcp::McpTool>>()> list = [manager, launch]() {
    return manager->Tools(launch);
  };
  auto tools = co_await OnPool(tenant_id, std::move(list));
  if (!tools.ok()) {
    co_return Status(tools.status().code(),
                     "MCP server " + server + " is not available: " + tools.status().message());
  }
  for (const auto& t : *tools) {
    if (t.name == tool) co_return std::shared_ptr<Tool>(std::make_shared<McpToolAdapter>(*mcp_, launch, t));
  }
  co_return NotFound("unknown tool: " + name + " (MCP server " + server + " has no tool " + tool +
                     ")");
}

asio::awaitable<Result<std::vector<std::shared_ptr<Tool>>>> Gateway::McpServerTools(
    store::McpServer server) {
  if (!mcp_) co_return Unavailable("MCP servers are not enabled");
  mcp::ServerLaunch launch;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(launch, LaunchOf(tx, vault_, options_.exec, server));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  mcp::McpManager* manager = mcp_;
  // A named std::function: g++ 12 destroys a capturing temporary in a co_await twice.
  std::function<Result<std::vector<mcp::McpTool>>()> list = [manager, launch]() {
    return manager->Tools(launch);
  };
  auto tools = co_await OnPool(server.tenant_id, std::move(list));
  if (!tools.ok()) co_return tools.status();
  std::vector<std::shared_ptr<Tool>> out;
  for (const auto& t : *tools) out.push_back(std::make_shared<McpToolAdapter>(*mcp_, launch, t));
  co_return out;
}

asio::awaitable<void> Gateway::ForgetMcpServer(std::string server_id) {
  if (!mcp_) co_return;
  mcp::McpManager* manager = mcp_;
  std::function<bool()> forget = [manager, server_id]() {
    manager->Forget(server_id);
    return true;
  };
  (void)co_await OnPool(std::string(), std::move(forget));  // the runtime's own work
}

asio::awaitable<std::vector<std::shared_ptr<Tool>>> Gateway::Offered(std::string tenant_id,
                                                                     std::string agent_id,
                                                                     Json allowed_tools) {
  std::vector<std::shared_ptr<Tool>> out;
  for (const Tool* t : registry_.All()) {
    if (Allowed(allowed_tools, t->name())) {
      out.push_back(std::shared_ptr<Tool>(const_cast<Tool*>(t), [](Tool*) {}));
    }
  }
  if (agent_tools_) {
    for (auto& t : agent_tools_(agent_id)) {
      if (Allowed(allowed_tools, t->name())) out.push_back(t);
    }
  }
  // An agent whose list reaches no MCP server's tool reads no servers (the common turn).
  if (!mcp_ || !MayReachMcp(allowed_tools)) co_return out;
  std::vector<store::McpServer> servers;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(servers, tx.mcp_servers().ListMcpServers(tenant_id));
    return Status::Ok();
  });
  if (!read.ok()) co_return out;
  // Servers deleted through another node: stop their processes here too (rarely any, so the
  // check stays on the event loop and only stopping goes to the pool).
  std::vector<std::string> ids;
  for (const auto& s : servers) ids.push_back(s.id);
  for (const auto& stale : mcp_->Stale(tenant_id, ids)) co_await ForgetMcpServer(stale);
  for (const auto& s : servers) {
    // Only servers the agent's list can reach at all are started.
    std::string prefix = std::string(kMcpPrefix) + s.name + "__";
    bool any = false;
    for (const auto& a : allowed_tools) {
      if (!a.is_string()) continue;
      const std::string& p = a.get_ref<const std::string&>();
      if (p == "*" || p.compare(0, prefix.size(), prefix) == 0 ||
          (!p.empty() && p.back() == '*' &&
           prefix.compare(0, p.size() - 1, p, 0, p.size() - 1) == 0)) {
        any = true;
      }
    }
    if (!any) continue;
    auto tools = co_await McpServerTools(s);
    if (!tools.ok()) {
      LogError("MCP server " + s.name + " (tenant " + tenant_id +
               ") offers no tools: " + tools.status().message());
      continue;
    }
    for (auto& t : *tools) {
      if (Allowed(allowed_tools, t->name())) out.push_back(std::move(t));
    }
  }
  co_return out;
}

Gateway::~Gateway() { pool_->Join(); }

std::string CallOutcome::ForModel() const {
  if (result.is_string()) return result.get<std::string>();
  if (result.is_object() && result.contains("error") && result["error"].is_string()) {
    return "error: " + result["error"].get<std::string>();
  }
  return DumpJson(result);
}

bool Gateway::Allowed(const Json& allowed_tools, const std::string& tool) {
  // An agent has the tools it was given: none unless listed (exec and MCP servers reach far).
  if (!allowed_tools.is_array()) return false;
  for (const auto& t : allowed_tools) {
    if (!t.is_string()) continue;
    const std::string& pattern = t.get_ref<const std::string&>();
    if (pattern == tool || pattern == "*") return true;
    if (pattern.size() > 1 && pattern.back() == '*' &&
        tool.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0) {
      return true;
    }
  }
  return false;
}

asio::awaitable<Status> Gateway::CheckToolList(std::string tenant_id, Json tools) {
  if (!tools.is_array()) co_return InvalidArgument("tools must be an array of tool names");
  std::vector<store::McpServer> servers;
  if (mcp_) {
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(servers, tx.mcp_servers().ListMcpServers(tenant_id));
      return Status::Ok();
    });
    if (!read.ok()) co_return read;
  }
  auto starts_with = [](const std::string& s, std::string_view p) {
    return s.compare(0, p.size(), p) == 0;
  };
  for (const auto& t : tools) {
    if (!t.is_string()) co_return InvalidArgument("tools must be an array of non-empty strings");
    const std::string& name = t.get_ref<const std::string&>();
    bool glob = !name.empty() && name.back() == '*';
    std::string stem = glob ? name.substr(0, name.size() - 1) : name;
    bool known = false;
    for (const Tool* r : registry_.All()) {
      known = known || (glob ? starts_with(r->name(), stem) : r->name() == name);
    }
    // A plugin's tools appear when it is enabled for the agent, which may come later.
    known = known || starts_with(name, kPluginPrefix) ||
            (glob && std::string(kPluginPrefix).compare(0, stem.size(), stem) == 0);
    for (const auto& s : servers) {
      // Its tools are the server's to list (it may be down now): the server must exist.
      std::string prefix = std::string(kMcpPrefix) + s.name + "__";
      known = known || (starts_with(name, prefix) && name.size() > prefix.size()) ||
              (glob && prefix.compare(0, stem.size(), stem) == 0);
    }
    if (!known) {
      co_return InvalidArgument(
          "tools: '" + name + "' names no tool: not a registered tool" +
          (glob ? " pattern" : "") + ", nor mcp__{server}__{tool} of a registered MCP server, "
          "nor plugin__{plugin}__{tool}");
    }
  }
  co_return Status::Ok();
}

std::vector<const Tool*> Gateway::ToolsFor(const Json& allowed_tools) const {
  std::vector<const Tool*> out;
  for (const Tool* t : registry_.All()) {
    if (Allowed(allowed_tools, t->name())) out.push_back(t);
  }
  return out;
}

namespace {

// What the gateway reads before deciding a call.
struct Guards {
  std::optional<policy::Policy> frame;
  std::optional<policy::Policy> narrowing;
  std::vector<store::EmergencyStop> stops;
  std::vector<store::StandingApproval> standing;
};

// Writes a large result whole into the workspace; returns what the model sees instead.
Result<Json> KeepLargeResult(const std::string& workspace, const store::ToolCall& call,
                             const std::string& text, bool is_text, size_t limit) {
  // Head and tail of at most a quarter of the limit each: the preview stays under it.
  const size_t kPreview = std::min<size_t>(4096, limit / 4);
  std::string rel = ".keel/results/" + call.run_id + "-" + call.call_id + (is_text ? ".txt" : ".json");
  KEEL_ASSIGN_OR_RETURN(std::string dir, ResolveInWorkspace(workspace, ".keel/results"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Unavailable(ec.message());
  // Checked again once the directories exist, and written without following a symlink: the
  // agent's own commands can plant links in its workspace.
  KEEL_ASSIGN_OR_RETURN(std::string path, ResolveInWorkspace(workspace, rel));
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Unavailable("cannot write " + rel + ": " + std::strerror(errno));
  ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) return Unavailable("cannot write " + rel);
  // Head and tail, cut on UTF-8 character boundaries.
  auto cut = [&](size_t at) {
    while (at > 0 && at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
    return at;
  };
  size_t head_end = cut(kPreview);
  size_t tail_start = cut(text.size() - kPreview);
  std::string preview = text.substr(0, head_end) + "\n[... " +
                        std::to_string(tail_start - head_end) + " bytes omitted ...]\n" +
                        text.substr(tail_start);
  return Json{{"preview", preview},
              {"file", rel},
              {"bytes", text.size()},
              {"note", "the whole result is in the workspace file " + rel +
                           " (read it in parts with files.read and offset/length)"}};
}

}  // namespace

asio::awaitable<Result<CallOutcome>> Gateway::Deny(store::ToolCall call, store::Step step,
                                                   const CallRequest& req, std::string reason) {
  Tool* tool = registry_.Find(req.tool);
  call.effect_class = tool ? EffectClassName(tool->effect_class()) : "once";
  const runs::Holder holder{store_.origin(), req.attempt};
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    return runs::DenyCall(tx, holder, call, step, reason, /*recorded=*/false, NowMillis());
  });
  if (!written.ok()) co_return written.status();
  co_return CallOutcome{"denied", call.result};
}

asio::awaitable<Result<CallOutcome>> Gateway::Call(const CallRequest& req) {
  Millis now = NowMillis();
  store::ToolCall call;
  call.id = NewId();
  call.tenant_id = req.tenant_id;
  call.run_id = req.run_id;
  call.call_id = req.call_id;
  call.tool = req.tool;
  call.arguments = req.arguments.is_object() ? req.arguments : Json::object();
  call.effect_key = req.run_id + ":" + req.call_id;
  call.created_at = call.updated_at = now;

  store::Step step;
  step.id = NewId();
  step.tenant_id = req.tenant_id;
  step.run_id = req.run_id;
  step.seq = req.step_seq;
  step.kind = "tool";
  step.input = {{"tool", req.tool}, {"call_id", req.call_id}, {"arguments", call.arguments}};
  step.started_at = now;
  call.step_id = step.id;

  // Checks that need no policy: the tool exists, the agent may use it, the arguments fit.
  std::string server, mcp_tool;
  if (!registry_.Find(req.tool) && !SplitMcpName(req.tool, &server, &mcp_tool) &&
      req.tool.rfind(kPluginPrefix, 0) != 0) {
    co_return co_await Deny(call, step, req, "unknown tool: " + req.tool);
  }
  if (!Allowed(req.allowed_tools, req.tool)) {
    co_return co_await Deny(call, step, req, "the agent may not call " + req.tool);
  }
  auto resolved = co_await Resolve(req.tenant_id, req.agent_id, req.tool);
  if (!resolved.ok()) co_return co_await Deny(call, step, req, resolved.status().message());
  std::shared_ptr<Tool> tool = *resolved;
  if (!req.arguments.is_object()) {
    co_return co_await Deny(call, step, req, "tool arguments must be a JSON object");
  }
  if (Status fits = CheckArguments(tool->parameters(), req.arguments); !fits.ok()) {
    co_return co_await Deny(call, step, req,
                            "the arguments do not match " + req.tool + "'s schema: " +
                                fits.message());
  }
  for (const auto& hook : veto_hooks_) {
    std::optional<Veto> veto;
    try {
      veto = co_await hook(req);
    } catch (const std::exception& e) {
      veto = Veto{std::string("a veto hook failed: ") + e.what()};  // fail closed
    }
    if (!veto) continue;
    auto denied = co_await Deny(call, step, req, "vetoed: " + veto->reason);
    if (denied.ok()) denied->abort_turn = veto->abort_turn;
    co_return denied;
  }
  auto role = policy::ParseRole(req.caller_role);
  if (!role.ok()) co_return co_await Deny(call, step, req, role.status().message());

  Guards guards;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(guards.frame, policy::LoadPolicy(tx, req.tenant_id, ""));
    KEEL_ASSIGN_OR_RETURN(guards.narrowing,
                          policy::LoadPolicy(tx, req.tenant_id, req.agent_id));
    KEEL_ASSIGN_OR_RETURN(guards.stops, tx.policies().ListStops(req.tenant_id));
    KEEL_ASSIGN_OR_RETURN(guards.standing, tx.approvals().ActiveStanding(
                                               req.tenant_id, req.agent_id, req.tool, now));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  if (auto stop = policy::StopReason(guards.stops, req.agent_id)) {
    co_return co_await Deny(call, step, req, *stop);
  }
  policy::Decision decision =
      policy::Decide(guards.frame ? &*guards.frame : nullptr,
                     guards.narrowing ? &*guards.narrowing : nullptr, *role,
                     {tool->name(), tool->rights()}, call.arguments);
  if (decision.kind == policy::Decision::Kind::kDeny) {
    co_return co_await Deny(call, step, req, decision.reason);
  }
  std::string allowed_by = guards.frame || guards.narrowing ? "the policy allows it"
                                                            : "no policy is set";
  if (decision.kind == policy::Decision::Kind::kNeedsApproval) {
    for (const auto& standing : guards.standing) {
      if (approvals::StandingCovers(standing, call.arguments)) {
        decision.kind = policy::Decision::Kind::kAllow;
        allowed_by = "standing approval " + standing.id + " (" + decision.reason + ")";
        break;
      }
    }
  }
  call.effect_class = EffectClassName(tool->effect_class());

  if (decision.kind == policy::Decision::Kind::kNeedsApproval) {
    // Park: the call, its step and a pending approval; the run waits with its lease released.
    store::Approval approval;
    approval.id = NewId();
    approval.tenant_id = req.tenant_id;
    approval.run_id = req.run_id;
    approval.session_id = req.session_id;
    approval.agent_id = req.agent_id;
    approval.call_id = req.call_id;
    approval.tool = req.tool;
    approval.arguments = call.arguments;
    approval.reason = decision.reason;
    approval.requested_by = req.requested_by;
    approval.created_at = now;
    approval.expires_at = now + options_.approval_ttl_ms;
    const runs::Holder holder{store_.origin(), req.attempt};
    auto parked = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      return runs::ParkCall(tx, holder, call, step, approval, now);
    });
    if (!parked.ok()) co_return parked.status();
    co_return CallOutcome{"awaiting_approval", {{"approval_id", approval.id}}};
  }

  // Journal: the call is durably `started` before it runs.
  const runs::Holder holder{store_.origin(), req.attempt};
  const Json allow = {{"outcome", "allow"}, {"reason", allowed_by}};
  auto journaled = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    return runs::StartCall(tx, holder, call, step, allow, /*recorded=*/false, NowMillis());
  });
  if (!journaled.ok()) co_return journaled.status();
  co_return co_await ExecuteAndRecord(std::move(call), std::move(step), req.agent_id,
                                      req.session_id, req.agent_config, req.attempt);
}

asio::awaitable<Result<CallOutcome>> Gateway::ExecuteApproved(const store::ToolCall& approved,
                                                              const store::Step& approved_step,
                                                              const std::string& agent_id,
                                                              const std::string& session_id,
                                                              const Json& agent_config,
                                                              int attempt) {
  const runs::Holder holder{store_.origin(), attempt};
  store::ToolCall call = approved;
  store::Step step = approved_step;
  std::vector<store::EmergencyStop> stops;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(stops, tx.policies().ListStops(call.tenant_id));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  Millis now = NowMillis();
  std::string refusal;
  if (auto stop = policy::StopReason(stops, agent_id)) {
    refusal = *stop;
  } else if (auto tool = co_await Resolve(call.tenant_id, agent_id, call.tool); !tool.ok()) {
    refusal = tool.status().message();
  } else if (Status fits = CheckArguments((*tool)->parameters(), call.arguments); !fits.ok()) {
    // The approver may have amended them.
    refusal = "the approved arguments do not match " + call.tool + "'s schema: " + fits.message();
  }
  if (!refusal.empty()) {
    auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      return runs::DenyCall(tx, holder, call, step, refusal, /*recorded=*/true, now);
    });
    if (!written.ok()) co_return written.status();
    co_return CallOutcome{"denied", call.result};
  }
  const Json approved_by = {{"outcome", "approved"}, {"reason", "approved by a human"}};
  auto journaled = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    return runs::StartCall(tx, holder, call, step, approved_by, /*recorded=*/true, now);
  });
  if (!journaled.ok()) co_return journaled.status();
  co_return co_await ExecuteAndRecord(std::move(call), std::move(step), agent_id, session_id,
                                      agent_config, attempt);
}

asio::awaitable<Result<CallOutcome>> Gateway::Resume(const store::ToolCall& call,
                                                     const store::Step& step,
                                                     const std::string& agent_id,
                                                     const std::string& session_id,
                                                     const Json& agent_config, int attempt) {
  if (call.effect_class == "pure" || call.effect_class == "idempotent") {
    co_return co_await ExecuteAndRecord(call, step, agent_id, session_id, agent_config, attempt);
  }
  // A `once` call may have had its effect: never repeat it, surface it as unknown.
  const runs::Holder holder{store_.origin(), attempt};
  store::ToolCall c = call;
  store::Step s = step;
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    return runs::CallUnknown(tx, holder, c, s, NowMillis());
  });
  if (!written.ok()) co_return written.status();
  co_return CallOutcome{"unknown", c.result};
}

asio::awaitable<Result<CallOutcome>> Gateway::ExecuteAndRecord(store::ToolCall call,
                                                               store::Step step,
                                                               std::string agent_id,
                                                               std::string session_id,
                                                               Json agent_config, int attempt) {
  const runs::Holder holder{store_.origin(), attempt};
  auto resolved = co_await Resolve(call.tenant_id, agent_id, call.tool);
  // Host execution is the platform admin's to grant, per tenant, and the grant is read now
  // (a withdrawn one stops the next command); whatever the agent's config says is overwritten.
  if (agent_config.is_object()) agent_config.erase(kHostExecGranted);
  if (resolved.ok() && agent_config.is_object() &&
      agent_config.value("exec_backend", "") == "host") {
    store::Tenant tenant;
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(tenant, tx.tenants().GetTenant(call.tenant_id));
      return Status::Ok();
    });
    if (!read.ok()) co_return read;
    agent_config[kHostExecGranted] = tenant.allow_host_exec;
  }
  const auto started = std::chrono::steady_clock::now();
  Result<Json> result = resolved.ok() ? Result<Json>(Status::Ok()) : Result<Json>(resolved.status());
  if (resolved.ok()) {
    std::shared_ptr<Tool> tool = *resolved;
    ToolContext ctx{call.tenant_id,        agent_id,     session_id,
                    call.run_id,           call.call_id, call.effect_key,
                    WorkspaceOf(agent_id), agent_config};
    if (tool->blocking()) {
      // Off the event loop, in the tenant's share of the pool; the coroutine resumes on its
      // own executor when the tool returns.
      std::function<Result<Json>()> on_pool = [tool, ctx, args = call.arguments]() -> Result<Json> {
        try {
          return tool->Execute(ctx, args);
        } catch (const std::exception& e) {
          return Internal(std::string("tool threw: ") + e.what());
        }
      };
      result = co_await OnPool(call.tenant_id, std::move(on_pool));
    } else {
      // On the io thread: the watchdog names this call while it holds it (a tool that
      // suspends takes the marker down meanwhile: Tool::ExecuteOnLoop).
      IoWork work(call.tenant_id, call.run_id,
                  "tool " + call.tool + " at step " + std::to_string(step.seq));
      try {
        // Named, not a temporary of the co_await: g++ 12 mishandles temporaries there.
        asio::awaitable<Result<Json>> running = tool->ExecuteOnLoop(ctx, call.arguments);
        result = co_await std::move(running);
      } catch (const std::exception& e) {
        result = Internal(std::string("tool threw: ") + e.what());
      }
    }
  }
  std::string status = "failed";
  Json outcome;
  if (result.ok()) {
    status = "succeeded";
    outcome = *result;
    std::string text = result->is_string() ? result->get<std::string>() : DumpJson(*result);
    if (text.size() > options_.large_result_bytes) {
      auto kept = KeepLargeResult(WorkspaceOf(agent_id), call, text, result->is_string(),
                                  options_.large_result_bytes);
      if (kept.ok()) {
        outcome = *kept;
      } else {
        status = "failed";
        outcome = {{"error", "the result (" + std::to_string(text.size()) +
                                 " bytes) could not be kept: " + kept.status().message()}};
      }
    }
  } else {
    outcome = {{"error", result.status().message()}};
  }
  runs::Ended(call, step, status, std::move(outcome), NowMillis());
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started);
  const CallRecord record{call.tenant_id, agent_id, session_id, call.run_id, &call,
                          step.input.value("decision", Json::object()), took.count()};
  std::vector<store::PluginDelivery> outbox;
  if (outbox_hook_) outbox = outbox_hook_(record);
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(runs::EndCall(tx, holder, call, step));
    for (const auto& d : outbox) {
      // A plugin deleted meanwhile takes nothing; the call's result must be recorded anyway.
      if (!tx.plugins().GetPlugin(d.tenant_id, d.plugin_id).ok()) continue;
      KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
    }
    return Status::Ok();
  });
  if (!written.ok()) co_return written.status();
  if (after_hook_) co_await after_hook_(record);
  co_return CallOutcome{call.status, call.result};
}

}  // namespace keel::tools

// `keel serve`: the wiring of concrete parts. Everything here is glue; the parts live in
// src/keel/ and are tested there.

#include "server/serve.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "keel/api/api.h"
#include "keel/channels/relay.h"
#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/log.h"
#include "keel/config/config.h"
#include "keel/config/http_config.h"
#include "keel/config/limits_config.h"
#include "keel/http/outbound_guard.h"
#include "keel/http/router.h"
#include "keel/http/server.h"
#include "keel/mcp/manager.h"
#include "keel/metrics.h"
#include "keel/model/anthropic_provider.h"
#include "keel/model/local_model.h"
#include "keel/model/openai_provider.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/runtime.h"
#include "keel/runtime/watchdog.h"
#include "keel/schedule/schedule_tools.h"
#include "keel/secrets/vault.h"
#include "keel/skills/skills.h"
#include "keel/store/audit.h"
#include "keel/store/migrate.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"
#include "keel/tenants/tenants.h"
#include "keel/tools/gateway.h"
#include "keel/tools/introspection_tools.h"
#include "keel/tools/tool.h"
#include "keel/tools/workspace.h"

namespace keel::server {

namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

void Log(const std::string& line) { LogInfo(line); }

// Writes `content` to `path` with `mode`, atomically (temp file + rename).
Status WriteFileAtomic(const std::string& path, const std::string& content, mode_t mode) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return Unavailable("cannot write " + tmp);
  bool ok = ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  ok = ok && ::fchmod(fd, mode) == 0 && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) return Unavailable("cannot write " + path);
  return Status::Ok();
}

// This node's origin id for the event log, kept in KEEL_HOME across restarts.
Result<std::string> LoadOrigin(const std::string& home) {
  std::string path = home + "/origin";
  std::ifstream in(path);
  std::string origin;
  if (in && std::getline(in, origin) && !origin.empty()) return origin;
  origin = NewId();
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(path, origin + "\n", 0600));
  return origin;
}

// First start: the default tenant and its owner token. Returns the admin (first) tenant's id.
Result<std::string> Bootstrap(store::Store& store, const std::string& home) {
  std::vector<store::Tenant> tenants;
  KEEL_RETURN_IF_ERROR(store.Read([&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(tenants, tx.tenants().ListTenants());
    return Status::Ok();
  }));
  if (!tenants.empty()) {
    // Ids are time-ordered: the first tenant is the oldest.
    return tenants.front().id;
  }
  tenants::NewTenant created = tenants::MakeTenant("default");
  // The token file first: a crash before the commit leaves a stale file that the next start
  // overwrites; the other order could leave a tenant whose owner token nobody has.
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(home + "/owner.token", created.secret + "\n", 0600));
  KEEL_RETURN_IF_ERROR(
      store.WriteSync([&](store::Tx& tx) { return tenants::InsertTenant(tx, created); }));
  const std::string& secret = created.secret;
  const store::Tenant& tenant = created.tenant;
  std::fprintf(stderr,
               "\n  Created the default tenant and its owner token (shown once):\n\n    %s\n\n"
               "  It is saved in %s/owner.token (mode 0600) for the keel CLI.\n\n",
               secret.c_str(), home.c_str());
  return tenant.id;
}

Status EnsureDemoAgent(store::Store& store, const std::string& tenant_id) {
  return store.WriteSync([&](store::Tx& tx) -> Status {
    if (tx.agents().GetAgentByName(tenant_id, "demo").ok()) return Status::Ok();
    store::Agent a;
    a.id = NewId();
    a.tenant_id = tenant_id;
    a.name = "demo";
    a.model = "local";
    a.instructions = "You are Keel's demo agent on the built-in local model.";
    a.tools = Json::array({"time.now", "notes.append"});
    a.created_at = a.updated_at = NowMillis();
    KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
    tx.Carry("agents", store::RowImage(a));
    return tx.events()
        .Append({tenant_id, "agent.created@v1", a.id, "", "", {{"name", a.name}, {"model", a.model}}});
  });
}

// The URL without its password, for logs: "postgres://keel:***@host/db".
std::string RedactUrl(const std::string& url) {
  auto scheme = url.find("://");
  auto at = url.find('@');
  if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
  auto colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

// The server's io_context. Stopping it leaves the handlers still pending, and the coroutine
// frames they own, to its destructor, after the objects those frames use (the event hub, the
// runtime, the server's connection table) are gone. Shutdown() destroys them earlier, while
// everything is alive.
class IoContext : public asio::io_context {
 public:
  using asio::io_context::io_context;
  void Shutdown() { shutdown(); }
};

// Every connection holds a descriptor: raises the soft limit toward the hard one so that
// max_connections can be reached, and says so when it cannot.
void RaiseDescriptorLimit(int max_connections) {
  constexpr rlim_t kOtherDescriptors = 256;  // the store, logs, tools, MCP servers
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  rlim_t wanted = static_cast<rlim_t>(max_connections) + kOtherDescriptors;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < wanted) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, lim.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < wanted) {
    Log("the descriptor limit (" + std::to_string(lim.rlim_cur) + ") is below max_connections (" +
        std::to_string(max_connections) + ") plus " + std::to_string(kOtherDescriptors) +
        ": connections beyond it wait until others close");
  }
}

// glibc gives the top of its heap back to the kernel whenever more than 128 KiB of it is free,
// and a turn frees and allocates about that much (SQLite drops a reader's page cache each time
// the database changed): each turn then faulted a dozen pages in again. The heap keeps what it
// had, up to a bound; blocks of 4 MiB and more still get a mapping of their own. jemalloc (the
// release build's allocator) keeps freed pages for seconds on its own.
void KeepFreedMemory() {
#ifndef KEEL_JEMALLOC
  ::mallopt(M_TRIM_THRESHOLD, 32 << 20);
  ::mallopt(M_TOP_PAD, 4 << 20);
  ::mallopt(M_MMAP_THRESHOLD, 4 << 20);
#endif
}

int Fail(const Status& st) {
  std::fprintf(stderr, "keel serve: %s\n", st.message().c_str());
  return st.code() == Code::kInvalidArgument ? 2 : 1;
}

}  // namespace

int ServeMain(const ServeFlags& flags) {
  // Files the server creates (the database, tokens, workspaces) are its own.
  ::umask(077);
  // No core dumps, and no other user's process (a command it runs, even as another user) may
  // read its memory or /proc/PID/environ.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  KeepFreedMemory();  // before any thread starts
  config::Overrides overrides{flags.home, flags.config_file, flags.listen, flags.store_url};
  auto cfg = config::Load(overrides);
  config::ForgetSecretKekInEnvironment();  // it is in cfg now, and only there
  if (!cfg.ok()) return Fail(cfg.status());
  const config::Config& config = *cfg;
  auto http_cfg = config::LoadHttp(overrides);
  if (!http_cfg.ok()) return Fail(http_cfg.status());
  const config::HttpConfig& http_config = *http_cfg;
  auto limits_cfg = config::LoadLimits(overrides);
  if (!limits_cfg.ok()) return Fail(limits_cfg.status());
  const config::LimitsConfig& limits = *limits_cfg;
  if (!flags.print_routes) {
    if (Status st = http::CheckCanListen(config.listen); !st.ok()) return Fail(st);
  }

  std::error_code ec;
  fs::create_directories(config.home, ec);
  if (ec) return Fail(Unavailable("cannot create KEEL_HOME " + config.home + ": " + ec.message()));
  ::chmod(config.home.c_str(), 0700);
  fs::create_directories(config.workspaces, ec);
  if (ec) return Fail(Unavailable("cannot create workspaces " + config.workspaces + ": " + ec.message()));

  auto origin = LoadOrigin(config.home);
  if (!origin.ok()) return Fail(origin.status());
  store::StoreOptions store_options;
  store_options.origin = *origin;
  store_options.sync_full = config.durable;
  // The schema's version before this start, to say when it moved (an upgrade).
  auto schema_before = store::StoreSchemaVersion(config.store_url);
  if (!config.store_owner_url.empty()) {
    if (Status st = store::MigrateStore(config.store_url, config.store_owner_url); !st.ok()) {
      return Fail(st);
    }
  }
  // The audit chain's heads are signed with a key derived from the KEK; without one (or with
  // one that does not parse, which also disables secrets) they are written unsigned, and
  // `keel audit verify` reports them so.
  auto audit_key = store::AuditKeyFromKek(config.secret_kek);
  if (!audit_key.ok() || audit_key->empty()) {
    Log("the event log's audit chain heads are unsigned: " +
        (audit_key.ok() ? std::string("KEEL_SECRET_KEK is not set")
                        : audit_key.status().message()));
  }
  auto opened = store::OpenStore(config.store_url, store_options,
                                 audit_key.ok() ? *audit_key : std::string());
  if (!opened.ok()) return Fail(opened.status());
  std::unique_ptr<store::Store> store = std::move(opened).value();
  if (schema_before.ok() && *schema_before > 0 &&
      *schema_before < store::SchemaVersionOf(config.store_url)) {
    Log("the store's schema went from version " + std::to_string(*schema_before) + " to " +
        std::to_string(store::SchemaVersionOf(config.store_url)));
  }
  if (!config.durable) Log("durable = false: commits are not fsynced; a power loss may lose the last writes");

  auto admin_tenant = Bootstrap(*store, config.home);
  if (!admin_tenant.ok()) return Fail(admin_tenant.status());
  if (flags.demo) {
    if (Status st = EnsureDemoAgent(*store, *admin_tenant); !st.ok()) return Fail(st);
  }

  IoContext io(1);
  Metrics metrics;
  runtime::EventHub hub(io.get_executor());
  store->SetCommitListener([&hub](const std::vector<store::Event>& events) { hub.OnCommit(events); });

  secrets::Vault vault = secrets::Vault::FromKekText(config.secret_kek);
  if (!vault.ready().ok()) LogInfo(vault.ready().message());

  model::ProviderRegistry providers;
  (void)providers.Register("local", std::make_unique<model::LocalModel>());
  (void)providers.Register("openai", std::make_unique<model::OpenAiProvider>(config.openai));
  (void)providers.Register("anthropic",
                           std::make_unique<model::AnthropicProvider>(config.anthropic));
  tools::ToolRegistry tool_registry;
  if (Status st = tools::RegisterBuiltinTools(tool_registry); !st.ok()) return Fail(st);
  tools::ExecOptions exec_options;
  exec_options.uid = config.exec_uid;
  exec_options.gid = config.exec_gid;
  exec_options.hidden = {config.home, config.workspaces};
  if (Status st = tools::RegisterWorkspaceTools(tool_registry, exec_options); !st.ok()) {
    return Fail(st);
  }
  // The agents' schedule tools run on the tool pool; a new schedule wakes the runtime's
  // schedule loop on the io thread (the runtime is made below, before io.run()).
  runtime::Runtime* schedules_runtime = nullptr;
  auto wake_schedules = [&io, &schedules_runtime] {
    asio::post(io, [&schedules_runtime] { schedules_runtime->WakeSchedules(); });
  };
  if (Status st = schedule::RegisterScheduleTools(tool_registry, *store, wake_schedules);
      !st.ok()) {
    return Fail(st);
  }
  if (Status st = tools::RegisterMemoryTools(tool_registry, *store); !st.ok()) return Fail(st);
  if (Status st = skills::RegisterSkillTools(tool_registry, *store); !st.ok()) return Fail(st);
  if (Status st = tools::RegisterIntrospectionTools(tool_registry, *store); !st.ok()) {
    return Fail(st);
  }
  tools::GatewayOptions gateway_options;
  gateway_options.approval_ttl_ms = config.approval_timeout_ms;
  gateway_options.large_result_bytes = static_cast<size_t>(config.large_result_bytes);
  gateway_options.exec = exec_options;
  gateway_options.tool_threads = limits.tool_threads;
  gateway_options.tenant_tool_threads = limits.tenant_tool_threads;
  // MCP servers over HTTP and webhook receivers are at URLs tenants chose: reached only at
  // public addresses and those the platform admin allows (model providers are the operator's).
  auto outbound = http::OutboundGuard::FromAllowList(config.outbound_allow);
  if (!outbound.ok()) return Fail(outbound.status());
  mcp::McpManager mcp_servers(*outbound);
  // Optional only to end it first at the stop (below).
  std::optional<tools::Gateway> gateway_holder;
  tools::Gateway& gateway = gateway_holder.emplace(*store, tool_registry, config.workspaces,
                                                   gateway_options, &mcp_servers, &vault);

  runtime::RuntimeOptions runtime_options;
  runtime_options.max_concurrent_runs = config.max_concurrent_runs;
  runtime_options.tenant_max_running = limits.tenant_max_running;
  runtime_options.lease_ms = config.lease_ms;
  runtime_options.default_max_steps = config.max_steps;
  runtime_options.history_limit = config.history_limit;
  runtime_options.tenant_run_cap = config.tenant_run_cap;
  runtime_options.audit_dir = config.home + "/audit";
  runtime_options.crash_note = config.home + "/crash.note";
  runtime_options.prices = config.prices;
  runtime_options.cache = config.cache;
  runtime_options.outbound = *outbound;
  runtime::Runtime runtime(io.get_executor(), *store, hub, providers, gateway, metrics,
                           runtime_options, &vault);
  schedules_runtime = &runtime;

  // The chat platforms' bots: polled, and their answers sent, by the leader (started below).
  channels::Relay relay(io.get_executor(), *store, runtime, hub, vault, *outbound,
                        config.public_url);
  api::ApiContext api_context{*store, runtime, hub,         metrics,       config, providers,
                              vault,  gateway, mcp_servers, *admin_tenant, &relay};
  http::Router router(api::MakeAuthenticator(api_context));
  api::RegisterAllRoutes(router, api_context);
  if (flags.print_routes) {
    for (const auto& route : router.Routes()) {
      std::printf("%s %s %s\n", route.method.c_str(), route.pattern.c_str(),
                  route.requires_auth ? "auth" : "public");
    }
    store->Close();
    return 0;
  }
  http::ServerOptions server_options;
  server_options.max_body_bytes = config.max_body_bytes;
  server_options.max_connections = http_config.max_connections;
  server_options.max_connections_per_address = http_config.max_connections_per_address;
  server_options.header_timeout = std::chrono::milliseconds(http_config.header_timeout_ms);
  server_options.body_timeout = std::chrono::milliseconds(http_config.body_timeout_ms);
  server_options.idle_timeout = std::chrono::milliseconds(http_config.idle_timeout_ms);
  server_options.cors.origins = config.cors_origins;
  RaiseDescriptorLimit(http_config.max_connections);
  http::Server server(io, router, metrics, server_options);
  auto bound = server.Listen(config.listen);
  if (!bound.ok()) return Fail(bound.status());
  if (Status st = WriteFileAtomic(config.home + "/listen.addr", *bound + "\n", 0600); !st.ok()) {
    return Fail(st);
  }
  if (Status st = runtime.Start(); !st.ok()) return Fail(st);
  relay.Start();
  server.Start();
  runtime::WatchdogOptions watchdog_options;
  watchdog_options.warn = std::chrono::milliseconds(limits.io_stall_warn_ms);
  watchdog_options.limit = std::chrono::milliseconds(limits.io_stall_limit_ms);
  runtime::Watchdog watchdog(io.get_executor(), *store, watchdog_options);
  watchdog.Start();
  // Another node committed (PostgreSQL LISTEN/NOTIFY): live readers re-read the log, and the
  // dispatcher looks for runs that node queued. Set last, after every early return above: the
  // store's listener thread posts to `io` until store->Close().
  store->SetRemoteCommitListener([&hub, &runtime, ex = io.get_executor()] {
    hub.OnRemoteCommit();
    asio::post(ex, [&runtime] { runtime.Wake(); });
  });
  // What this node tells the fleet (GET /v1/nodes); the store calls it until store->Close().
  store->SetNodeReport([&metrics, address = *bound, started = NowMillis()] {
    store::NodeInfo self;
    self.address = address;
    self.started_at = started;
    self.runs_executing = metrics.runs_executing.load();
    self.runs_finished =
        metrics.runs_done.load() + metrics.runs_failed.load() + metrics.runs_cancelled.load();
    return self;
  });

  Log("listening on http://" + *bound + " (store " + RedactUrl(config.store_url) + ", origin " +
      *origin + ")");
  if (std::error_code exists_ec; fs::exists(config.home + "/owner.token", exists_ec)) {
    Log("owner token: " + config.home + "/owner.token");
  } else {
    // Another node (or an import) created this store's first tenant: its token is there.
    Log("no owner token in " + config.home + ": use a token of this store (the owner.token of "
        "the node that created it, or one made with `keel tokens create`)");
  }

  // The first SIGTERM or SIGINT drains (runtime.h: Drain) for at most drain_timeout_ms while
  // the server goes on answering (reads, decisions, /readyz 503); then it stops. A second one
  // stops at once.
  asio::signal_set signals(io, SIGINT, SIGTERM);
  bool draining = false;
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& e, int sig) {
        if (e) return;
        const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
        if (draining) {
          Log("received " + name + " again: stopping now");
          watchdog.Stop();
          io.stop();
          return;
        }
        draining = true;
        Log("received " + name + ", draining for at most " +
            std::to_string(config.drain_timeout_ms) + " ms (send it again to stop at once)");
        signals.async_wait(on_signal);
        asio::co_spawn(
            io,
            [&]() -> asio::awaitable<void> {
              relay.Stop();
              co_await runtime.Drain(std::chrono::milliseconds(config.drain_timeout_ms));
              server.Stop();
              watchdog.Stop();  // a stopped io thread is not a frozen one
              io.stop();
            },
            asio::detached);
      };
  signals.async_wait(on_signal);
  io.run();
  watchdog.Stop();  // whatever ended io.run(): the stop below may take long and is no freeze
  // The threads that post to `io` finish first, the tool pool (its blocking tools may still use
  // the store) and then the store's: what they posted is then pending, and Shutdown() destroys
  // it with the rest while the runtime and the hub it refers to are alive.
  gateway_holder.reset();
  store->Close();
  io.Shutdown();
  Log("stopped");
  return 0;
}

}  // namespace keel::server

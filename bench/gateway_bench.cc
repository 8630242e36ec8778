// The tool gateway's cost and the exec sandbox's, on a real SQLite store and real processes.
//
//   BM_GatewayAllowedCall   one allowed `time.now` call through Gateway::Call with a tenant
//                           policy set: the checks, the policy decision (reads of the policy,
//                           stops and standing approvals), the journal unit (durable), the
//                           execution and the result unit (durable). Microseconds per call.
//   BM_ToolDirect           the same tool's Execute alone, for scale.
//   BM_ForkExecTrue         /bin/true as a plain child process (tools::RunProcess).
//   BM_SandboxExecTrue      /bin/true inside the exec tool's bubblewrap sandbox, same runner.
//   BM_McpDirect            tools/call `echo` on an MCP stdio server (tests/fakes/
//                           fake_mcp_stdio.py) straight through mcp::McpClient.
//   BM_McpThroughKeel       the same call as mcp__fake__echo through Gateway::Call (policy,
//                           journal, the server's connection from the manager, result).
// scripts/bench.sh reports gateway overhead = allowed call - direct, and sandbox/fork ratio.

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdlib>
#include <filesystem>

#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/mcp/manager.h"
#include "keel/mcp/mcp_client.h"
#include "keel/store/store.h"
#include "keel/tools/gateway.h"
#include "keel/tools/process.h"
#include "keel/tools/workspace.h"

namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;

struct GatewayFixture {
  fs::path dir;
  std::unique_ptr<keel::store::Store> store;
  keel::tools::ToolRegistry registry;
  std::unique_ptr<keel::tools::Gateway> gateway;
  std::string tenant = keel::NewId(), agent = keel::NewId(), session = keel::NewId(),
              run = keel::NewId();

  GatewayFixture() {
    const char* base = std::getenv("TMPDIR");
    dir = fs::path(base && *base ? base : "/tmp") / ("keel-gw-bench-" + keel::NewId());
    fs::create_directories(dir);
    keel::store::StoreOptions o;
    o.origin = "bench";
    store = std::move(keel::store::OpenStore("sqlite://" + (dir / "keel.db").string(), o)).value();
    (void)keel::tools::RegisterBuiltinTools(registry);
    gateway = std::make_unique<keel::tools::Gateway>(*store, registry, (dir / "ws").string());
    (void)store->WriteSync([&](keel::store::Tx& tx) -> keel::Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant({tenant, "t", 0}));
      keel::store::Agent a;
      a.id = agent;
      a.tenant_id = tenant;
      a.name = "a";
      a.model = "local";
      KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
      KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession({session, tenant, agent, "idle", "", 0, 0}));
      keel::store::Run r;
      r.id = run;
      r.tenant_id = tenant;
      r.session_id = session;
      r.agent_id = agent;
      KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(r));
      keel::Json frame = {{"rules", {{{"tool", "*"}, {"rights", {"read", "write", "send"}}}}}};
      return tx.policies().PutPolicy({tenant, "", frame, 1});
    });
  }
  ~GatewayFixture() {
    gateway.reset();
    store.reset();
    fs::remove_all(dir);
  }
};

void BM_GatewayAllowedCall(benchmark::State& state) {
  GatewayFixture f;
  asio::io_context io;
  int seq = 0;
  for (auto _ : state) {
    keel::tools::CallRequest req;
    req.tenant_id = f.tenant;
    req.agent_id = f.agent;
    req.session_id = f.session;
    req.run_id = f.run;
    req.step_seq = ++seq;
    req.call_id = "call_" + std::to_string(seq);
    req.tool = "time.now";
    auto fut = asio::co_spawn(io, f.gateway->Call(req), asio::use_future);
    io.restart();
    io.run();
    auto out = fut.get();
    if (!out.ok() || out->status != "succeeded") {
      state.SkipWithError("the call did not succeed");
      break;
    }
  }
}

void BM_ToolDirect(benchmark::State& state) {
  keel::tools::ToolRegistry registry;
  (void)keel::tools::RegisterBuiltinTools(registry);
  keel::tools::Tool* tool = registry.Find("time.now");
  keel::tools::ToolContext ctx;
  for (auto _ : state) benchmark::DoNotOptimize(tool->Execute(ctx, keel::Json::object()));
}

void BM_ForkExecTrue(benchmark::State& state) {
  keel::tools::ProcessLimits limits;
  for (auto _ : state) {
    auto r = keel::tools::RunProcess({"/bin/true"}, {"PATH=/usr/bin:/bin"}, "", "", limits);
    if (!r.ok() || r->exit_code != 0) {
      state.SkipWithError("fork/exec failed");
      break;
    }
  }
}

void BM_SandboxExecTrue(benchmark::State& state) {
  fs::path ws = fs::temp_directory_path() / ("keel-sb-bench-" + keel::NewId());
  fs::create_directories(ws);
  auto argv = keel::tools::SandboxArgv(ws.string(), "/bin/true");
  if (!argv.ok()) {
    state.SkipWithError(argv.status().message().c_str());
    return;
  }
  // The command line runs `/bin/sh -c /bin/true`; the shell execs it without forking again.
  keel::tools::ProcessLimits limits;
  for (auto _ : state) {
    auto r = keel::tools::RunProcess(*argv, {"PATH=/usr/bin:/bin"}, "", "", limits);
    if (!r.ok() || r->exit_code != 0) {
      state.SkipWithError("the sandboxed command failed");
      break;
    }
  }
  fs::remove_all(ws);
}

const std::string kFakeMcp = std::string(KEEL_TEST_FAKES_DIR) + "/fake_mcp_stdio.py";

void BM_McpDirect(benchmark::State& state) {
  keel::mcp::StdioServerSpec spec;
  spec.command = {"python3", kFakeMcp};
  auto client = keel::mcp::McpClient::StartStdio(spec, {});
  if (!client.ok()) {
    state.SkipWithError(client.status().message().c_str());
    return;
  }
  for (auto _ : state) {
    auto r = (*client)->CallTool("echo", {{"text", "hello"}});
    if (!r.ok()) {
      state.SkipWithError(r.status().message().c_str());
      break;
    }
  }
}

void BM_McpThroughKeel(benchmark::State& state) {
  GatewayFixture f;
  keel::mcp::McpManager manager;
  auto gateway = std::make_unique<keel::tools::Gateway>(*f.store, f.registry, (f.dir / "ws2").string(),
                                                        keel::tools::GatewayOptions{}, &manager);
  keel::store::McpServer server{keel::NewId(), f.tenant, "fake", "stdio",
                                {{"command", {"python3", kFakeMcp}}, {"env", keel::Json::object()}},
                                1};
  (void)f.store->WriteSync(
      [&](keel::store::Tx& tx) { return tx.mcp_servers().InsertMcpServer(server); });
  asio::io_context io;
  int seq = 0;
  for (auto _ : state) {
    keel::tools::CallRequest req;
    req.tenant_id = f.tenant;
    req.agent_id = f.agent;
    req.session_id = f.session;
    req.run_id = f.run;
    req.step_seq = ++seq;
    req.call_id = "call_" + std::to_string(seq);
    req.tool = "mcp__fake__echo";
    req.arguments = {{"text", "hello"}};
    auto fut = asio::co_spawn(io, gateway->Call(req), asio::use_future);
    io.restart();
    io.run();
    auto out = fut.get();
    if (!out.ok() || out->status != "succeeded") {
      state.SkipWithError(out.ok() ? out->ForModel().c_str() : out.status().message().c_str());
      break;
    }
  }
  gateway.reset();
}

}  // namespace

BENCHMARK(BM_McpDirect)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_McpThroughKeel)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_GatewayAllowedCall)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_ToolDirect)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ForkExecTrue)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_SandboxExecTrue)->Unit(benchmark::kMicrosecond)->UseRealTime();

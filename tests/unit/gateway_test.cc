#include "keel/tools/gateway.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/plugins/host.h"
#include "keel/plugins/lua_plugin.h"
#include "keel/store/store.h"

namespace keel::tools {
namespace {

namespace asio = boost::asio;

class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("keel-gw-" + NewId());
    std::filesystem::create_directories(dir_);
    store::StoreOptions o;
    o.origin = "node";
    auto s = store::OpenStore((dir_ / "keel.db").string(), o);
    ASSERT_TRUE(s.ok());
    store_ = std::move(s).value();
    ASSERT_TRUE(RegisterBuiltinTools(registry_).ok());
    ASSERT_TRUE(RegisterWorkspaceTools(registry_).ok());
    gateway_ = std::make_unique<Gateway>(*store_, registry_, (dir_ / "ws").string());
    tenant_ = NewId();
    run_id_ = NewId();
    ASSERT_TRUE(store_->WriteSync([&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant({tenant_, "t", 0}));
      store::Agent a;
      a.id = agent_ = NewId();
      a.tenant_id = tenant_;
      a.name = "a";
      a.model = "local";
      KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
      KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession({session_ = NewId(), tenant_, a.id, "idle", "", 0, 0}));
      // The run is executing on this node (origin "node"), attempt 1.
      store::Run r;
      r.id = run_id_;
      r.tenant_id = tenant_;
      r.session_id = session_;
      r.agent_id = a.id;
      r.status = "running";
      r.attempt = 1;
      r.lease_owner = "node";
      return tx.runs().InsertRun(r);
    }).ok());
  }
  void TearDown() override {
    gateway_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // On the fixture's io_context, which outlives the store: the store's writer thread may still
  // be returning from posting a completion to it after run() returned.
  template <typename T>
  T RunCoro(asio::awaitable<T> aw) {
    io_.restart();
    auto fut = asio::co_spawn(io_, std::move(aw), asio::use_future);
    io_.run();
    return fut.get();
  }

  CallRequest Req(const std::string& tool, Json args, int seq) {
    CallRequest r;
    r.tenant_id = tenant_;
    r.agent_id = agent_;
    r.session_id = session_;
    r.run_id = run_id_;
    r.step_seq = seq;
    r.call_id = "call_" + std::to_string(seq);
    r.tool = tool;
    r.arguments = args;
    r.allowed_tools = Json::array({"time.now", "notes.append", "files.*"});
    r.attempt = 1;
    return r;
  }

  std::string Notes() {
    std::ifstream in(gateway_->WorkspaceOf(agent_) + "/notes.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // A call and its step as the journal recorded them (status `started`, `approved`, ...).
  struct Recorded {
    store::ToolCall call;
    store::Step step;
  };
  Recorded Record(const std::string& call_id, const std::string& tool, Json arguments,
                  const std::string& effect_class, const std::string& status, int seq) {
    Recorded r;
    r.call.id = NewId();
    r.call.tenant_id = tenant_;
    r.call.run_id = run_id_;
    r.call.call_id = call_id;
    r.call.tool = tool;
    r.call.arguments = std::move(arguments);
    r.call.effect_class = effect_class;
    r.call.effect_key = run_id_ + ":" + call_id;
    r.call.status = status;
    r.step.id = r.call.step_id = NewId();
    r.step.tenant_id = tenant_;
    r.step.run_id = run_id_;
    r.step.seq = seq;
    r.step.kind = "tool";
    r.step.status = status;
    EXPECT_TRUE(store_->WriteSync([&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(r.step));
      return tx.runs().InsertToolCall(r.call);
    }).ok());
    return r;
  }

  std::vector<store::ToolCall> Calls() {
    std::vector<store::ToolCall> calls;
    EXPECT_TRUE(store_->Read([&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(calls, tx.runs().ListToolCalls(tenant_, run_id_));
      return Status::Ok();
    }).ok());
    return calls;
  }

  std::filesystem::path dir_;
  asio::io_context io_;  // declared before the store: destroyed after it
  std::unique_ptr<store::Store> store_;
  ToolRegistry registry_;
  std::unique_ptr<Gateway> gateway_;
  std::string tenant_, agent_, session_, run_id_;
};

TEST_F(GatewayTest, ExecutesAndJournalsACall) {
  auto out = RunCoro(gateway_->Call(Req("notes.append", {{"line", "one"}}, 2)));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, "succeeded");
  EXPECT_EQ(Notes(), "one\n");
  auto calls = Calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].status, "succeeded");
  EXPECT_EQ(calls[0].effect_class, "once");
  EXPECT_EQ(calls[0].effect_key, run_id_ + ":call_2");
}

TEST_F(GatewayTest, DeniesToolsOffTheAgentsList) {
  CallRequest req = Req("time.now", Json::object(), 2);
  req.allowed_tools = Json::array({"notes.append"});
  auto out = RunCoro(gateway_->Call(req));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, "denied");
  auto unknown = RunCoro(gateway_->Call(Req("no.such.tool", Json::object(), 3)));
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, "denied");
  EXPECT_NE(unknown->ForModel().find("unknown tool"), std::string::npos);
}

// An agent has the tools it is given: an empty list (or none) is no tool, exec included.
TEST_F(GatewayTest, AnEmptyToolListAllowsAndOffersNothing) {
  EXPECT_FALSE(Gateway::Allowed(Json::array(), "exec"));
  EXPECT_FALSE(Gateway::Allowed(Json(), "time.now"));
  EXPECT_FALSE(Gateway::Allowed(Json::array(), "mcp__any__tool"));
  EXPECT_TRUE(Gateway::Allowed(Json::array({"*"}), "exec"));
  EXPECT_TRUE(gateway_->ToolsFor(Json::array()).empty());
  EXPECT_TRUE(RunCoro(gateway_->Offered(tenant_, agent_, Json::array())).empty());
  CallRequest req = Req("exec", {{"command", "id"}}, 2);
  req.allowed_tools = Json::array();
  auto out = RunCoro(gateway_->Call(req));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, "denied");
  EXPECT_NE(out->ForModel().find("may not call exec"), std::string::npos) << out->ForModel();
}

TEST_F(GatewayTest, AToolListNamingNothingIsRefused) {
  auto check = [&](Json tools) { return RunCoro(gateway_->CheckToolList(tenant_, tools)); };
  EXPECT_TRUE(check(Json::array()).ok());
  EXPECT_TRUE(check(Json::array({"time.now", "files.*", "*", "plugin__p__t"})).ok());
  Status typo = check(Json::array({"time.now", "time.nwo"}));
  EXPECT_EQ(typo.code(), Code::kInvalidArgument);
  EXPECT_NE(typo.message().find("'time.nwo'"), std::string::npos) << typo.message();
  EXPECT_EQ(check(Json::array({"nosuch.*"})).code(), Code::kInvalidArgument);
  // No MCP source is known to this gateway: no mcp__ name is.
  EXPECT_EQ(check(Json::array({"mcp__gone__tool"})).code(), Code::kInvalidArgument);
}

// exec_backend "host" in an agent's config is not enough: the tenant needs the platform
// admin's grant, which the gateway reads at each call.
TEST_F(GatewayTest, HostExecutionNeedsTheTenantsGrant) {
  CallRequest req = Req("exec", {{"command", "id -u"}}, 2);
  req.allowed_tools = Json::array({"exec"});
  req.agent_config = {{"exec_backend", "host"}, {kHostExecGranted, true}};  // forged
  auto out = RunCoro(gateway_->Call(req));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, "failed");
  EXPECT_NE(out->ForModel().find("host execution is not allowed"), std::string::npos)
      << out->ForModel();
}

TEST_F(GatewayTest, ToolErrorsAreOutcomesNotFailures) {
  auto out = RunCoro(gateway_->Call(Req("notes.append", {{"line", "two\nlines"}}, 2)));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, "failed");
  EXPECT_EQ(out->ForModel(), "error: notes.append takes one line (no newline characters)");
  EXPECT_EQ(Notes(), "");
}

TEST_F(GatewayTest, ArgumentsThatDoNotMatchTheSchemaAreDeniedBeforeTheJournal) {
  auto wrong_type = RunCoro(gateway_->Call(Req("notes.append", {{"line", 42}}, 2)));
  ASSERT_TRUE(wrong_type.ok());
  EXPECT_EQ(wrong_type->status, "denied");
  EXPECT_EQ(wrong_type->ForModel(),
            "error: the arguments do not match notes.append's schema: arguments.line: expected "
            "string, got integer");
  auto missing = RunCoro(gateway_->Call(Req("notes.append", Json::object(), 3)));
  EXPECT_EQ(missing->ForModel(), "error: the arguments do not match notes.append's schema: "
                                 "arguments: missing required field 'line'");
  auto extra = RunCoro(gateway_->Call(Req("time.now", {{"zone", "UTC"}}, 4)));
  EXPECT_EQ(extra->ForModel(), "error: the arguments do not match time.now's schema: "
                               "arguments.zone: unknown field");
  // Not an object at all: refused, never run with {} in their place.
  auto array = RunCoro(gateway_->Call(Req("time.now", Json::array({"UTC"}), 5)));
  EXPECT_EQ(array->status, "denied");
  EXPECT_EQ(array->ForModel(), "error: tool arguments must be a JSON object");
  EXPECT_EQ(Notes(), "");
}

TEST_F(GatewayTest, PolicyEmergencyStopAndRoleDecideWithReasons) {
  const store::PolicyDoc read_only{tenant_, "", {{"rules", {{{"tool", "*"}, {"rights", {"read"}}}}}},
                                   1};
  ASSERT_TRUE(store_->WriteSync([&](store::Tx& tx) { return tx.policies().PutPolicy(read_only); })
                  .ok());
  auto write = RunCoro(gateway_->Call(Req("notes.append", {{"line", "x"}}, 2)));
  EXPECT_EQ(write->status, "denied");
  EXPECT_EQ(write->ForModel(), "error: the tenant policy's rule * does not grant write to "
                               "notes.append");
  auto read = RunCoro(gateway_->Call(Req("time.now", Json::object(), 3)));
  EXPECT_EQ(read->status, "succeeded");

  CallRequest guest = Req("notes.append", {{"line", "x"}}, 4);
  guest.caller_role = "guest";
  ASSERT_TRUE(store_->WriteSync([&](store::Tx& tx) {
    return tx.policies().DeletePolicy(tenant_, "");
  }).ok());
  auto as_guest = RunCoro(gateway_->Call(guest));
  EXPECT_EQ(as_guest->status, "denied");
  EXPECT_EQ(as_guest->ForModel(), "error: guests may only use read tools; notes.append needs write");

  const store::EmergencyStop stop{tenant_, agent_, "runaway", "tok", 1};
  ASSERT_TRUE(store_->WriteSync([&](store::Tx& tx) { return tx.policies().PutStop(stop); }).ok());
  auto stopped = RunCoro(gateway_->Call(Req("time.now", Json::object(), 5)));
  EXPECT_EQ(stopped->status, "denied");
  EXPECT_EQ(stopped->ForModel(), "error: an emergency stop is in force for this agent: runaway");
  EXPECT_EQ(Notes(), "");
  // Every decision is a step with its reason.
  store::Step last;
  ASSERT_TRUE(store_->Read([&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto steps, tx.runs().ListSteps(tenant_, run_id_));
    last = steps.back();
    return Status::Ok();
  }).ok());
  EXPECT_EQ(last.input["decision"]["outcome"], "deny");
  EXPECT_EQ(last.input["decision"]["reason"], "an emergency stop is in force for this agent: runaway");
}

TEST_F(GatewayTest, ACallThatNeedsApprovalParksTheRunAtomically) {
  // The run is executing on this node (origin "node"), attempt 1.
  const store::PolicyDoc always{
      tenant_, "",
      {{"rules", {{{"tool", "notes.*"}, {"rights", {"write"}}, {"approval", "always"}}}}}, 1};
  ASSERT_TRUE(store_->WriteSync([&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(tenant_, run_id_));
    run.status = "running";
    run.attempt = 1;
    run.lease_owner = "node";
    run.lease_expires_at = NowMillis() + 60000;
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateRun(run));
    return tx.policies().PutPolicy(always);
  }).ok());
  CallRequest req = Req("notes.append", {{"line", "needs a human"}}, 2);
  req.attempt = 2;  // not the run's attempt: this execution lost the run
  auto lost = RunCoro(gateway_->Call(req));
  EXPECT_EQ(lost.status().code(), Code::kConflict);
  req.attempt = 1;
  req.requested_by = "token-1";
  auto out = RunCoro(gateway_->Call(req));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status, "awaiting_approval");
  std::string approval_id = out->result["approval_id"];
  EXPECT_EQ(Notes(), "");
  ASSERT_TRUE(store_->Read([&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(tenant_, run_id_));
    EXPECT_EQ(run.status, "waiting_for_approval");
    EXPECT_EQ(run.lease_owner, "");
    KEEL_ASSIGN_OR_RETURN(auto session, tx.sessions().GetSession(tenant_, session_));
    EXPECT_EQ(session.status, "awaiting_approval");
    KEEL_ASSIGN_OR_RETURN(auto approval, tx.approvals().GetApproval(tenant_, approval_id));
    EXPECT_EQ(approval.status, "pending");
    EXPECT_EQ(approval.requested_by, "token-1");
    EXPECT_EQ(approval.arguments, Json({{"line", "needs a human"}}));
    EXPECT_NE(approval.reason.find("always"), std::string::npos) << approval.reason;
    KEEL_ASSIGN_OR_RETURN(auto calls, tx.runs().ListToolCalls(tenant_, run_id_));
    EXPECT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].status, "awaiting_approval");
    return Status::Ok();
  }).ok());
}

// A call journaled as started whose process died: `once` is never repeated.
TEST_F(GatewayTest, ResumeOfAStartedOnceCallResolvesToUnknown) {
  auto [call, step] = Record("call_9", "notes.append", {{"line", "maybe"}}, "once", "started", 2);
  auto out = RunCoro(gateway_->Resume(call, step, agent_, session_, Json::object(), 1));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, "unknown");
  EXPECT_EQ(Notes(), "");  // not repeated
  EXPECT_EQ(Calls()[0].status, "unknown");
}

TEST_F(GatewayTest, ResumeOfAStartedPureCallRunsItAgain) {
  auto [call, step] = Record("call_3", "time.now", Json::object(), "pure", "started", 2);
  auto out = RunCoro(gateway_->Resume(call, step, agent_, session_, Json::object(), 1));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, "succeeded");
  EXPECT_TRUE(out->result.is_string());
}

}  // namespace
}  // namespace keel::tools

namespace keel::tools {
namespace {

TEST_F(GatewayTest, ALargeResultIsKeptInTheWorkspaceAndPreviewed) {
  std::string big;
  for (int i = 0; i < 5000; ++i) big += "line " + std::to_string(i) + "\n";
  std::filesystem::create_directories(gateway_->WorkspaceOf(agent_));
  std::ofstream(gateway_->WorkspaceOf(agent_) + "/big.txt") << big;
  auto out = RunCoro(gateway_->Call(Req("files.read", {{"path", "big.txt"}}, 2)));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, "succeeded");
  const Json& r = out->result;
  ASSERT_TRUE(r.contains("file")) << r.dump().substr(0, 300);
  std::string file = r["file"];
  EXPECT_EQ(file, ".keel/results/" + run_id_ + "-call_2.json");
  std::string preview = r["preview"];
  EXPECT_LT(preview.size(), 9000u);
  EXPECT_NE(preview.find("line 0\\n"), std::string::npos);     // the head (JSON-escaped)
  EXPECT_NE(preview.find("line 4999\\n"), std::string::npos);  // and the tail
  EXPECT_NE(preview.find("bytes omitted"), std::string::npos);
  std::ifstream in(gateway_->WorkspaceOf(agent_) + "/" + file);
  std::stringstream whole;
  whole << in.rdbuf();
  Json kept = Json::parse(whole.str());
  EXPECT_EQ(kept["content"], big);
  EXPECT_EQ(r["bytes"], whole.str().size());
}

}  // namespace
}  // namespace keel::tools

namespace keel::tools {
namespace {

asio::awaitable<std::optional<Veto>> Decided(std::optional<Veto> veto) { co_return veto; }

// A veto hook that decides at once.
VetoHook Now(std::function<std::optional<Veto>(const CallRequest&)> decide) {
  return [decide = std::move(decide)](const CallRequest& c) { return Decided(decide(c)); };
}

TEST_F(GatewayTest, AVetoHookRefusesACallBeforeThePolicyWithItsReason) {
  std::vector<std::string> seen;
  gateway_->AddVetoHook(Now([&seen](const CallRequest& c) -> std::optional<Veto> {
    seen.push_back(c.tool);
    if (c.tool == "notes.append" && c.arguments.value("line", "").find("password") != std::string::npos) {
      return Veto{"lines may not mention passwords"};
    }
    return std::nullopt;
  }));
  gateway_->AddVetoHook(
      Now([](const CallRequest&) -> std::optional<Veto> { throw std::runtime_error("boom"); }));
  auto vetoed = RunCoro(gateway_->Call(Req("notes.append", {{"line", "my password is x"}}, 2)));
  ASSERT_TRUE(vetoed.ok());
  EXPECT_EQ(vetoed->status, "denied");
  EXPECT_EQ(vetoed->ForModel(), "error: vetoed: lines may not mention passwords");
  EXPECT_EQ(Notes(), "");
  // A hook that throws refuses the call (fail closed).
  auto thrown = RunCoro(gateway_->Call(Req("time.now", Json::object(), 3)));
  EXPECT_EQ(thrown->ForModel(), "error: vetoed: a veto hook failed: boom");
  EXPECT_EQ(seen, std::vector<std::string>({"notes.append", "time.now"}));
}

}  // namespace
}  // namespace keel::tools

namespace keel::tools {
namespace {

TEST_F(GatewayTest, PlantedSymlinksDoNotLeadWritesOutOfTheWorkspace) {
  namespace fs = std::filesystem;
  fs::path outside = fs::temp_directory_path() / ("keel-outside-" + NewId());
  fs::create_directories(outside);
  std::string ws = gateway_->WorkspaceOf(agent_);
  fs::create_directories(ws);
  fs::create_symlink(outside / "stolen.txt", fs::path(ws) / "notes.txt");
  fs::create_symlink(outside, fs::path(ws) / ".keel");
  auto notes = RunCoro(gateway_->Call(Req("notes.append", {{"line", "x"}}, 2)));
  ASSERT_TRUE(notes.ok());
  EXPECT_EQ(notes->status, "failed") << notes->ForModel();
  EXPECT_FALSE(fs::exists(outside / "stolen.txt"));
  std::string big(40000, 'z');
  std::ofstream(fs::path(ws) / "big.txt") << big;
  auto read = RunCoro(gateway_->Call(Req("files.read", {{"path", "big.txt"}}, 3)));
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->status, "failed") << read->ForModel();
  EXPECT_NE(read->ForModel().find("leaves the workspace"), std::string::npos) << read->ForModel();
  EXPECT_TRUE(fs::is_empty(outside));
  fs::remove_all(outside);
}

TEST_F(GatewayTest, FilesReadReadsLargeFilesInParts) {
  std::string ws = gateway_->WorkspaceOf(agent_);
  std::filesystem::create_directories(ws);
  std::ofstream(ws + "/part.txt") << "0123456789";
  auto part = RunCoro(gateway_->Call(Req("files.read", {{"path", "part.txt"}, {"offset", 3}, {"length", 4}}, 2)));
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part->result["content"], "3456");
  EXPECT_EQ(part->result["truncated"], true);
  EXPECT_EQ(part->result["bytes"], 10);
}

// A node that lost the run (paused past its lease while another node took it at attempt 2)
// neither records nor runs anything more for it: the journal, an approved call, a resumed call
// and a refusal each check, in their unit, that this execution still holds the run.
TEST_F(GatewayTest, AnExecutionThatLostTheRunWritesAndRunsNothing) {
  auto taken = [&](const std::string& owner, int attempt) {
    ASSERT_TRUE(store_->WriteSync([&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(tenant_, run_id_));
      run.status = "running";
      run.attempt = attempt;
      run.lease_owner = owner;
      return tx.runs().UpdateRun(run);
    }).ok());
  };
  taken("other-node", 2);
  // A new call: not journaled, not run.
  auto call = RunCoro(gateway_->Call(Req("notes.append", {{"line", "twice?"}}, 2)));
  EXPECT_EQ(call.status().code(), Code::kConflict) << call.status().ToString();
  // A refused call is not recorded either.
  auto denied = RunCoro(gateway_->Call(Req("mcp__nowhere__x", Json::object(), 3)));
  EXPECT_EQ(denied.status().code(), Code::kConflict);
  EXPECT_TRUE(Calls().empty());
  EXPECT_EQ(Notes(), "");

  // A call a human approved, and a `once` call interrupted while it ran, both recorded by the
  // first execution: the stale execution runs neither and changes neither.
  auto [approved, step] =
      Record("call_7", "notes.append", {{"line", "approved once"}}, "once", "approved", 4);
  auto [started, started_step] =
      Record("call_8", "notes.append", {{"line", "approved once"}}, "once", "started", 5);
  auto ran = RunCoro(gateway_->ExecuteApproved(approved, step, agent_, session_, Json::object(), 1));
  EXPECT_EQ(ran.status().code(), Code::kConflict);
  auto resumed =
      RunCoro(gateway_->Resume(started, started_step, agent_, session_, Json::object(), 1));
  EXPECT_EQ(resumed.status().code(), Code::kConflict);
  EXPECT_EQ(Notes(), "");
  for (const auto& c : Calls()) {
    EXPECT_EQ(c.status, c.call_id == "call_7" ? "approved" : "started") << c.call_id;
  }

  // The node that holds the run does run the approved call.
  taken("node", 2);
  auto owner = RunCoro(gateway_->ExecuteApproved(approved, step, agent_, session_, Json::object(), 2));
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_EQ(owner->status, "succeeded");
  EXPECT_EQ(Notes(), "approved once\n");
}

}  // namespace
}  // namespace keel::tools

namespace keel::tools {
namespace {

asio::awaitable<Result<Json>> SlowRecall(std::string query) {
  asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::milliseconds(50));
  co_await timer.async_wait(asio::use_awaitable);
  co_return Json::array({{{"id", "m1"}, {"text", "remembered " + query}}});
}

// A Lua plugin's tool that reads the agent's memories goes through the gateway like any tool,
// and its read (here 50 ms on a timer) suspends the call, not the event loop.
TEST_F(GatewayTest, ALuaToolReadsMemoryThroughTheGatewayWithoutHoldingTheLoop) {
  plugins::PluginHost host((dir_ / "audit").string(), [](const std::string&, const std::string&) {
    plugins::MemoryReader reader;
    reader.search = [](std::string query, std::string, int) { return SlowRecall(query); };
    return reader;
  });
  store::Plugin plugin;
  plugin.tenant_id = tenant_;
  plugin.id = "mem";
  plugin.kind = "lua";
  plugin.manifest = {{"id", "mem"},
                     {"name", "mem"},
                     {"version", "1"},
                     {"kind", "lua"},
                     {"events", {"tool.after@v1"}}};
  plugin.source = R"(
    ctx.tools.add{name = "recall", schema = {type = "object", properties = {q = {type = "string"}}},
                  handler = function(a) return {text = ctx.memory.search(a.q)[1].text} end})";
  auto loaded = host.For(tenant_, agent_, {plugin});
  ASSERT_TRUE(loaded.errors.empty()) << loaded.errors[0].message;
  gateway_->SetAgentTools([&host](const std::string& agent_id) {
    std::vector<std::shared_ptr<Tool>> out;
    if (auto p = host.Find(agent_id)) {
      for (const auto& [name, tool] : p->tools) out.push_back(tool);
    }
    return out;
  });
  CallRequest req = Req("plugin__mem__recall", {{"q", "kafka"}}, 2);
  req.allowed_tools = Json::array({"plugin__mem__recall"});
  io_.restart();
  auto call = asio::co_spawn(io_, gateway_->Call(req), asio::use_future);
  int ticks = 0;
  asio::co_spawn(
      io_,
      [&]() -> asio::awaitable<void> {
        while (call.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
          asio::steady_timer tick(io_, std::chrono::milliseconds(5));
          co_await tick.async_wait(asio::use_awaitable);
          ++ticks;
        }
      },
      asio::detached);
  io_.run();
  auto out = call.get();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status, "succeeded") << out->ForModel();
  EXPECT_EQ(out->result, (Json{{"text", "remembered kafka"}}));
  EXPECT_GE(ticks, 5);
  auto calls = Calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].status, "succeeded");
}

}  // namespace
}  // namespace keel::tools

// McpClient against real MCP servers from npm (@modelcontextprotocol/server-everything and
// server-filesystem: `scripts/install-mcp-test-servers.sh` installs them, KEEL_TEST_MCP_DIR
// names the directory; those tests skip without it), and against tests/fakes/fake_mcp_stdio.py
// for what real servers do not show: crashes, garbage, hangs, pings from the server, stubborn
// processes.

#include "keel/mcp/mcp_client.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifndef KEEL_TEST_FAKES_DIR
#define KEEL_TEST_FAKES_DIR "tests/fakes"
#endif

namespace keel::mcp {
namespace {

using Clock = std::chrono::steady_clock;

// Expects `part` in the string `text`, and shows `text` when it is not there.
#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "expected \"" << (part) << "\" in: " << (text)

int64_t MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// Polls `done` every 10 ms for up to `ms`; true once it holds.
bool WaitFor(const std::function<bool()>& done, int64_t ms = 3000) {
  auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// The text of the first content item of a tools/call result, or "".
std::string FirstText(const Json& result) {
  auto content = result.find("content");
  if (content == result.end() || !content->is_array() || content->empty()) return "";
  const Json& item = (*content)[0];
  auto text = item.find("text");
  return text != item.end() && text->is_string() ? text->get<std::string>() : "";
}

bool IsError(const Json& result) { return result.value("isError", false); }

std::string ToolNames(const std::vector<McpTool>& tools) {
  std::string names;
  for (const auto& t : tools) names += t.name + " ";
  return names;
}

const McpTool* FindTool(const std::vector<McpTool>& tools, const std::string& name) {
  for (const auto& t : tools) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// Whether `pid` is gone (or a zombie nobody has reaped yet, which is as good as gone).
bool ProcessGone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "keel-mcp-test.XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------------
// The reference servers from npm.

std::string NpmPackageEntry(const std::string& package) {
  const char* dir = std::getenv("KEEL_TEST_MCP_DIR");
  if (!dir || !*dir) return "";
  std::string entry =
      std::string(dir) + "/node_modules/@modelcontextprotocol/" + package + "/dist/index.js";
  return std::filesystem::exists(entry) ? entry : "";
}

#define REQUIRE_NPM_SERVER(var, package)                                                    \
  std::string var = NpmPackageEntry(package);                                               \
  if (var.empty()) {                                                                        \
    GTEST_SKIP() << "@modelcontextprotocol/" package                                        \
                    " is not installed: run "                                               \
                    "scripts/install-mcp-test-servers.sh and set KEEL_TEST_MCP_DIR to its " \
                    "directory (default $HOME/.cache/keel-mcp-servers)";                    \
  }

std::unique_ptr<McpClient> StartOrFail(const StdioServerSpec& spec,
                                       const ClientOptions& options = {}) {
  auto client = McpClient::StartStdio(spec, options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

// `node .../server-everything/dist/index.js stdio`: the first argument picks the transport.
StdioServerSpec EverythingSpec(const std::string& entry) {
  StdioServerSpec spec;
  spec.command = {"node", entry, "stdio"};
  spec.name = "everything";
  return spec;
}

TEST(McpEverythingServer, InitializesAndListsTools) {
  REQUIRE_NPM_SERVER(entry, "server-everything");
  auto client = StartOrFail(EverythingSpec(entry));
  ASSERT_TRUE(client);
  EXPECT_TRUE(client->alive());
  EXPECT_EQ(client->server_name(), "mcp-servers/everything");
  EXPECT_EQ(client->protocol_version(), "2025-06-18");
  auto tools = client->ListTools();
  ASSERT_TRUE(tools.ok()) << tools.status().ToString();
  const McpTool* echo = FindTool(*tools, "echo");
  ASSERT_NE(echo, nullptr) << ToolNames(*tools);
  EXPECT_FALSE(echo->description.empty());
  EXPECT_EQ(echo->input_schema["type"], "object");
  EXPECT_TRUE(echo->input_schema["properties"].contains("message")) << echo->input_schema.dump();
  EXPECT_EQ(echo->annotations.value("readOnlyHint", false), true) << echo->annotations.dump();
  EXPECT_TRUE(FindTool(*tools, "get-sum") || FindTool(*tools, "add")) << ToolNames(*tools);
  std::set<std::string> names;
  for (const auto& t : *tools) EXPECT_TRUE(names.insert(t.name).second) << "twice: " << t.name;
}

TEST(McpEverythingServer, CallsEchoSumAndImageTools) {
  REQUIRE_NPM_SERVER(entry, "server-everything");
  auto client = StartOrFail(EverythingSpec(entry));
  ASSERT_TRUE(client);
  auto echo = client->CallTool("echo", {{"message", "hello, keel \"quoted\"\nnext line"}});
  ASSERT_TRUE(echo.ok()) << echo.status().ToString();
  EXPECT_FALSE(IsError(*echo));
  EXPECT_EQ(FirstText(*echo), "Echo: hello, keel \"quoted\"\nnext line");

  auto tools = client->ListTools();
  ASSERT_TRUE(tools.ok());
  std::string sum_tool = FindTool(*tools, "get-sum") ? "get-sum" : "add";
  auto sum = client->CallTool(sum_tool, {{"a", 2}, {"b", 40}});
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_FALSE(IsError(*sum));
  EXPECT_CONTAINS(FirstText(*sum), "42");

  if (FindTool(*tools, "get-tiny-image")) {
    auto image = client->CallTool("get-tiny-image", Json::object());
    ASSERT_TRUE(image.ok()) << image.status().ToString();
    bool found = false;
    for (const auto& item : (*image)["content"]) {
      if (item.value("type", "") != "image") continue;
      found = true;
      EXPECT_EQ(item.value("mimeType", ""), "image/png");
      EXPECT_GT(item.value("data", "").size(), 100u);
    }
    EXPECT_TRUE(found) << image->dump().substr(0, 500);
  }
}

TEST(McpEverythingServer, BadArgumentsAreAToolErrorOrRpcError) {
  REQUIRE_NPM_SERVER(entry, "server-everything");
  auto client = StartOrFail(EverythingSpec(entry));
  ASSERT_TRUE(client);
  auto bad = client->CallTool("get-sum", {{"a", "not a number"}});
  if (bad.ok()) {
    EXPECT_TRUE(IsError(*bad)) << bad->dump();
  } else {
    EXPECT_EQ(bad.status().code(), Code::kInvalidArgument) << bad.status().ToString();
  }
  auto unknown = client->CallTool("no-such-tool", Json::object());
  if (unknown.ok()) {
    EXPECT_TRUE(IsError(*unknown)) << unknown->dump();
  } else {
    EXPECT_EQ(unknown.status().code(), Code::kInvalidArgument) << unknown.status().ToString();
  }
  auto not_object = client->CallTool("echo", Json::array({1, 2}));
  EXPECT_EQ(not_object.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(client->alive());
  EXPECT_TRUE(client->CallTool("echo", {{"message", "still here"}}).ok());
}

TEST(McpEverythingServer, SlowToolTimesOutAndTheClientStaysUsable) {
  REQUIRE_NPM_SERVER(entry, "server-everything");
  auto client = StartOrFail(EverythingSpec(entry));
  ASSERT_TRUE(client);
  auto tools = client->ListTools();
  ASSERT_TRUE(tools.ok());
  std::string slow = FindTool(*tools, "trigger-long-running-operation")
                         ? "trigger-long-running-operation"
                         : "longRunningOperation";
  ASSERT_TRUE(FindTool(*tools, slow)) << ToolNames(*tools);
  auto start = Clock::now();
  auto r = client->CallTool(slow, {{"duration", 10}, {"steps", 5}}, /*timeout_ms=*/300);
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_CONTAINS(r.status().message(), "within 300 ms");
  EXPECT_LT(MillisSince(start), 2000);
  EXPECT_TRUE(client->alive());
  auto echo = client->CallTool("echo", {{"message", "after the timeout"}});
  ASSERT_TRUE(echo.ok()) << echo.status().ToString();
  EXPECT_EQ(FirstText(*echo), "Echo: after the timeout");
}

TEST(McpEverythingServer, ManyThreadsShareOneClient) {
  REQUIRE_NPM_SERVER(entry, "server-everything");
  auto client = StartOrFail(EverythingSpec(entry));
  ASSERT_TRUE(client);
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        std::string text = "thread " + std::to_string(t) + " call " + std::to_string(i);
        auto r = client->CallTool("echo", {{"message", text}});
        if (r.ok() && FirstText(*r) == "Echo: " + text) ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 200);
}

TEST(McpEverythingServer, ShutsDownPromptlyWhenStdinCloses) {
  REQUIRE_NPM_SERVER(entry, "server-everything");
  auto client = StartOrFail(EverythingSpec(entry));
  ASSERT_TRUE(client);
  auto start = Clock::now();
  client.reset();
  EXPECT_LT(MillisSince(start), 1500);
}

TEST(McpFilesystemServer, ListsAndReadsInsideTheAllowedDirectoryOnly) {
  REQUIRE_NPM_SERVER(entry, "server-filesystem");
  TempDir dir;
  std::string allowed = std::filesystem::canonical(dir.path()).string();
  std::ofstream(allowed + "/hello.txt") << "hi from keel\n";
  std::filesystem::create_directory(allowed + "/sub");
  StdioServerSpec spec;
  spec.command = {"node", entry, allowed};
  auto client = StartOrFail(spec);
  ASSERT_TRUE(client);
  auto tools = client->ListTools();
  ASSERT_TRUE(tools.ok()) << tools.status().ToString();
  ASSERT_TRUE(FindTool(*tools, "list_directory")) << ToolNames(*tools);
  std::string read_tool = FindTool(*tools, "read_text_file") ? "read_text_file" : "read_file";

  auto listing = client->CallTool("list_directory", {{"path", allowed}});
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  EXPECT_FALSE(IsError(*listing)) << listing->dump();
  EXPECT_CONTAINS(FirstText(*listing), "[FILE] hello.txt");
  EXPECT_CONTAINS(FirstText(*listing), "[DIR] sub");

  auto file = client->CallTool(read_tool, {{"path", allowed + "/hello.txt"}});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_CONTAINS(FirstText(*file), "hi from keel");

  auto outside = client->CallTool(read_tool, {{"path", "/etc/hostname"}});
  if (outside.ok()) {
    EXPECT_TRUE(IsError(*outside)) << outside->dump();
    EXPECT_CONTAINS(FirstText(*outside), "denied");
  } else {
    EXPECT_EQ(outside.status().code(), Code::kInvalidArgument);
  }
}

// ---------------------------------------------------------------------------------------------
// The fake server.

// The system's interpreter where there is one: a version manager's `python3` shim would add its
// own variables to the fake's environment.
std::string Python() {
  return ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

StdioServerSpec FakeSpec(std::vector<std::string> flags = {}) {
  StdioServerSpec spec;
  spec.command = {Python(), std::string(KEEL_TEST_FAKES_DIR) + "/fake_mcp_stdio.py"};
  spec.command.insert(spec.command.end(), flags.begin(), flags.end());
  spec.name = "fake";
  return spec;
}

TEST(McpFakeServer, ListsToolsAcrossPages) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  EXPECT_EQ(client->server_name(), "fake-mcp-stdio");
  auto tools = client->ListTools();
  ASSERT_TRUE(tools.ok()) << tools.status().ToString();
  ASSERT_EQ(tools->size(), 22u) << ToolNames(*tools);  // eleven pages of two
  EXPECT_EQ((*tools)[0].name, "echo");
  EXPECT_EQ((*tools)[18].name, "close_stdin");
  EXPECT_EQ((*tools)[0].description, "fake tool echo");
  EXPECT_TRUE((*tools)[0].annotations.is_object());
}

TEST(McpFakeServer, NoToolsCapabilityMeansNoTools) {
  auto client = StartOrFail(FakeSpec({"--no-tools"}));
  ASSERT_TRUE(client);
  auto tools = client->ListTools();
  ASSERT_TRUE(tools.ok());
  EXPECT_TRUE(tools->empty());
}

TEST(McpFakeServer, AcceptsOlderProtocolVersions) {
  for (const char* version : {"2025-03-26", "2024-11-05"}) {
    auto client = StartOrFail(FakeSpec({"--version", version}));
    ASSERT_TRUE(client);
    EXPECT_EQ(client->protocol_version(), version);
    EXPECT_TRUE(client->CallTool("echo", {{"text", "hi"}}).ok());
  }
}

TEST(McpFakeServer, RefusesAnUnknownProtocolVersion) {
  auto r = McpClient::StartStdio(FakeSpec({"--version", "1999-01-01"}), {});
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "'1999-01-01'");
}

TEST(McpFakeServer, RefusedInitializeIsUnavailable) {
  auto r = McpClient::StartStdio(FakeSpec({"--error-init"}), {});
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "Unsupported protocol version");
  EXPECT_CONTAINS(r.status().message(), "-32602");
}

TEST(McpFakeServer, CommandNotFound) {
  StdioServerSpec spec;
  spec.command = {"keel-no-such-mcp-server"};
  auto r = McpClient::StartStdio(spec, {});
  EXPECT_EQ(r.status().code(), Code::kNotFound) << r.status().ToString();
  EXPECT_CONTAINS(r.status().message(), "keel-no-such-mcp-server");
  spec.command = {"/nonexistent/bin/server"};
  EXPECT_EQ(McpClient::StartStdio(spec, {}).status().code(), Code::kNotFound);
  spec.command = {};
  EXPECT_EQ(McpClient::StartStdio(spec, {}).status().code(), Code::kInvalidArgument);
  spec.command = {"/etc/hostname"};  // exists, not executable
  EXPECT_EQ(McpClient::StartStdio(spec, {}).status().code(), Code::kUnavailable);
}

TEST(McpFakeServer, ExitDuringInitializeNamesStatusAndStderr) {
  auto start = Clock::now();
  auto r = McpClient::StartStdio(FakeSpec({"--exit-at-start", "4"}), {});
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "failed to initialize");
  EXPECT_CONTAINS(r.status().message(), "exited with status 4");
  EXPECT_CONTAINS(r.status().message(), "missing configuration file");
  EXPECT_LT(MillisSince(start), 3000);
}

TEST(McpFakeServer, HangingInitializeTimesOut) {
  ClientOptions options;
  options.init_timeout_ms = 500;
  auto start = Clock::now();
  auto r = McpClient::StartStdio(FakeSpec({"--hang-init"}), options);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "no answer within 500 ms");
  EXPECT_CONTAINS(r.status().message(), "hanging in initialize");  // its stderr
  EXPECT_LT(MillisSince(start), 2500);  // the timeout, then SIGTERM: no graceful 2 s wait
}

TEST(McpFakeServer, CrashMidCallFailsFastWithStderr) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto start = Clock::now();
  auto r = client->CallTool("crash", {{"code", 3}}, /*timeout_ms=*/30000);
  EXPECT_LT(MillisSince(start), 2000);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "exited with status 3");
  EXPECT_CONTAINS(r.status().message(), "crashing on purpose");
  EXPECT_FALSE(client->alive());
  EXPECT_CONTAINS(client->stderr_tail(), "crashing on purpose");
  auto later = client->CallTool("echo", {{"text", "anyone?"}});
  EXPECT_EQ(later.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(later.status().message(), "exited with status 3");
  EXPECT_EQ(client->ListTools().status().code(), Code::kUnavailable);
}

TEST(McpFakeServer, EveryWaitingCallFailsWhenTheServerIsKilled) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto pid = client->CallTool("pid", Json::object());
  ASSERT_TRUE(pid.ok());
  std::vector<Status> results(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = client->CallTool("slow", {{"seconds", 30}}, 60000).status();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto start = Clock::now();
  ASSERT_EQ(::kill(std::stoi(FirstText(*pid)), SIGKILL), 0);
  for (auto& t : threads) t.join();
  EXPECT_LT(MillisSince(start), 1000);
  for (const auto& s : results) {
    EXPECT_EQ(s.code(), Code::kUnavailable);
    EXPECT_CONTAINS(s.message(), "killed by signal 9");
  }
}

TEST(McpFakeServer, AnswerWrittenJustBeforeExitArrives) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto r = client->CallTool("answer_then_exit", Json::object());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(FirstText(*r), "last words");
  EXPECT_TRUE(WaitFor([&] { return !client->alive(); }));
  auto later = client->CallTool("echo", {{"text", "hi"}});
  EXPECT_CONTAINS(later.status().message(), "exited with status 0");
}

TEST(McpFakeServer, ServerThatClosesItsStdoutIsBroken) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto start = Clock::now();
  auto r = client->CallTool("close_stdout", Json::object(), 30000);
  EXPECT_LT(MillisSince(start), 2000);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "closed its stdout");
  EXPECT_FALSE(client->alive());
}

TEST(McpFakeServer, ServerThatClosesItsStdinIsBrokenAndSigpipeIsHarmless) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto r = client->CallTool("close_stdin", Json::object());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // The next write meets a pipe without a reader: EPIPE (and SIGPIPE, which must not kill us).
  auto start = Clock::now();
  auto next = client->CallTool("echo", {{"text", "hello?"}}, 30000);
  EXPECT_LT(MillisSince(start), 2000);
  EXPECT_EQ(next.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(next.status().message(), "stopped reading its stdin");
  EXPECT_FALSE(client->alive());
}

TEST(McpFakeServer, GarbageLinesAreIgnoredUpToTheLimit) {
  auto client = StartOrFail(FakeSpec({"--garbage-at-start", "3"}));
  ASSERT_TRUE(client);
  auto some = client->CallTool("garbage", {{"n", 5}});
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ(FirstText(*some), "after garbage");
  EXPECT_TRUE(client->alive());
  auto flood = client->CallTool("garbage", {{"n", 200}});
  EXPECT_EQ(flood.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(flood.status().message(), "not JSON-RPC messages");
  EXPECT_FALSE(client->alive());
}

TEST(McpFakeServer, OversizedMessageBreaksTheConnection) {
  ClientOptions options;
  options.max_message_bytes = 64 * 1024;
  auto client = StartOrFail(FakeSpec(), options);
  ASSERT_TRUE(client);
  auto r = client->CallTool("huge", {{"bytes", 300000}});
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "65536");
  EXPECT_FALSE(client->alive());
}

TEST(McpFakeServer, DeeplyNestedMessageBreaksTheConnection) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto fine = client->CallTool("deep", {{"levels", 20}});
  EXPECT_TRUE(fine.ok()) << fine.status().ToString();
  auto r = client->CallTool("deep", {{"levels", 100000}});
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "nested");
}

TEST(McpFakeServer, RequestLargerThanTheLimitIsRefused) {
  ClientOptions options;
  options.max_message_bytes = 1024;
  auto client = StartOrFail(FakeSpec(), options);
  ASSERT_TRUE(client);
  auto r = client->CallTool("echo", {{"text", std::string(2000, 'x')}});
  EXPECT_EQ(r.status().code(), Code::kPayloadTooLarge);
  EXPECT_TRUE(client->alive());
  EXPECT_TRUE(client->CallTool("echo", {{"text", "small"}}).ok());
}

TEST(McpFakeServer, ToolsListChangedIsReportedOnce) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  EXPECT_FALSE(client->tools_changed());
  auto r = client->CallTool("change", Json::object());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // The server sent the notification before the answer, and messages are handled in order.
  EXPECT_TRUE(client->tools_changed());
  EXPECT_FALSE(client->tools_changed());
}

TEST(McpFakeServer, AnswersPingsAndRefusesOtherServerRequests) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto r = client->CallTool("ping_client", Json::object(), 5000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Json replies = Json::parse(FirstText(*r));
  EXPECT_EQ(replies["srv-ping"]["id"], "srv-ping");
  EXPECT_EQ(replies["srv-ping"]["result"], Json::object());
  EXPECT_EQ(replies["99"]["id"], 99);
  EXPECT_EQ(replies["99"]["error"]["code"], -32601);
}

TEST(McpFakeServer, RpcErrorIsInvalidArgumentWithCodeAndMessage) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto r = client->CallTool("rpc_error", Json::object());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(r.status().message(), "-32602");
  EXPECT_CONTAINS(r.status().message(), "bad params for rpc_error");
  EXPECT_CONTAINS(r.status().message(), "rpc_error");
  EXPECT_TRUE(client->alive());
  auto tool_error = client->CallTool("tool_error", Json::object());
  ASSERT_TRUE(tool_error.ok());
  EXPECT_TRUE(IsError(*tool_error));
  EXPECT_EQ(FirstText(*tool_error), "the tool failed");
}

TEST(McpFakeServer, TimeoutSendsCancellationAndIgnoresTheLateAnswer) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto start = Clock::now();
  auto r = client->CallTool("slow", {{"seconds", 1}}, /*timeout_ms=*/200);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(r.status().message(), "request cancelled");
  EXPECT_LT(MillisSince(start), 800);
  // The fake is single-threaded: this waits for `slow` to end and sees the cancellation.
  auto cancelled = client->CallTool("cancellations", Json::object());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  Json ids = Json::parse(FirstText(*cancelled));
  ASSERT_EQ(ids.size(), 1u) << ids.dump();
  EXPECT_TRUE(ids[0].is_number_integer());
  EXPECT_TRUE(client->alive());
  auto echo = client->CallTool("echo", {{"text", "fine"}});
  ASSERT_TRUE(echo.ok());
  EXPECT_EQ(FirstText(*echo), "fine");
}

TEST(McpFakeServer, EnvironmentIsTheSpecsPlusPathAndHome) {
  ::setenv("KEEL_TEST_MCP_SECRET", "must not leak", 1);
  StdioServerSpec spec = FakeSpec();
  spec.env = {{"FOO", "bar"}, {"EMPTY", ""}};
  auto client = StartOrFail(spec);
  ASSERT_TRUE(client);
  auto r = client->CallTool("env", Json::object());
  ASSERT_TRUE(r.ok());
  Json env = Json::parse(FirstText(*r));
  EXPECT_EQ(env["FOO"], "bar");
  EXPECT_EQ(env["EMPTY"], "");
  EXPECT_EQ(env["PATH"], std::string(std::getenv("PATH")));
  EXPECT_EQ(env["HOME"], std::string(std::getenv("HOME")));
  for (const auto& [name, value] : env.items()) {
    // Python sets LC_CTYPE itself when it finds the C locale (PEP 538).
    EXPECT_TRUE(name == "FOO" || name == "EMPTY" || name == "PATH" || name == "HOME" ||
                name == "LC_CTYPE")
        << name;
  }

  spec.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/nonexistent-home"}};
  client = StartOrFail(spec);
  ASSERT_TRUE(client);
  r = client->CallTool("env", Json::object());
  ASSERT_TRUE(r.ok());
  env = Json::parse(FirstText(*r));
  EXPECT_EQ(env["PATH"], "/usr/local/bin:/usr/bin:/bin");
  EXPECT_EQ(env["HOME"], "/nonexistent-home");
}

TEST(McpFakeServer, RunsInTheSpecsWorkingDirectory) {
  TempDir dir;
  StdioServerSpec spec = FakeSpec();
  spec.command[1] = std::filesystem::absolute(spec.command[1]).string();
  spec.cwd = dir.path();
  auto client = StartOrFail(spec);
  ASSERT_TRUE(client);
  auto r = client->CallTool("cwd", Json::object());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(FirstText(*r), std::filesystem::canonical(dir.path()).string());

  spec.cwd = dir.path() + "/missing";
  auto bad = McpClient::StartStdio(spec, {});
  EXPECT_EQ(bad.status().code(), Code::kUnavailable);
  EXPECT_CONTAINS(bad.status().message(), "cannot change to directory");
}

TEST(McpFakeServer, StderrTailKeepsTheEnd) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->CallTool("stderr", {{"text", std::string(20000, 'e') + "THE END"}}).ok());
  EXPECT_TRUE(WaitFor([&] { return client->stderr_tail().find("THE END") != std::string::npos; }));
  EXPECT_LE(client->stderr_tail().size(), 4096u);
}

TEST(McpFakeServer, ShutdownEscalatesToSigkillOfTheWholeGroup) {
  auto client = StartOrFail(FakeSpec({"--stubborn", "--grandchild"}));
  ASSERT_TRUE(client);
  auto pid = client->CallTool("pid", Json::object());
  auto grandchild = client->CallTool("grandchild_pid", Json::object());
  ASSERT_TRUE(pid.ok() && grandchild.ok());
  pid_t server_pid = std::stoi(FirstText(*pid));
  pid_t grandchild_pid = std::stoi(FirstText(*grandchild));
  ASSERT_GT(grandchild_pid, 0);
  EXPECT_FALSE(ProcessGone(grandchild_pid));
  auto start = Clock::now();
  client.reset();
  int64_t took = MillisSince(start);
  EXPECT_GE(took, 2900);  // 2 s for stdin's end, 1 s for SIGTERM, both ignored
  EXPECT_LT(took, 4500);
  EXPECT_TRUE(ProcessGone(server_pid));
  EXPECT_TRUE(WaitFor([&] { return ProcessGone(grandchild_pid); }, 1000));
}

TEST(McpFakeServer, ShutdownOfAWellBehavedServerIsQuick) {
  auto client = StartOrFail(FakeSpec());
  ASSERT_TRUE(client);
  auto start = Clock::now();
  client.reset();
  EXPECT_LT(MillisSince(start), 1000);
}

}  // namespace
}  // namespace keel::mcp

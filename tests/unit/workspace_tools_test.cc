// The workspace tools on a real file system and real processes: path confinement, the exec
// sandbox (bubblewrap) and its limits, the host backend. The sandbox cases need bwrap
// (scripts/install-deps.sh installs it).

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/common/ids.h"
#include "keel/tools/process.h"
#include "keel/tools/tool.h"
#include "keel/tools/workspace.h"

namespace keel::tools {
namespace {

namespace fs = std::filesystem;

class WorkspaceToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("keel-ws-" + NewId());
    fs::create_directories(root_ / "agent");
    fs::create_directories(root_ / "outside");
    std::ofstream(root_ / "outside" / "secret.txt") << "top secret";
    ASSERT_TRUE(RegisterWorkspaceTools(registry_).ok());
    ctx_.workspace = (root_ / "agent").string();
    ctx_.agent_config = Json::object();
  }
  void TearDown() override { fs::remove_all(root_); }

  Result<Json> Call(const std::string& tool, const Json& args) {
    return registry_.Find(tool)->Execute(ctx_, args);
  }

  fs::path root_;
  ToolRegistry registry_;
  ToolContext ctx_;
};

TEST_F(WorkspaceToolsTest, FilesRoundTripInsideTheWorkspace) {
  auto w = Call("files.write", {{"path", "notes/today.md"}, {"content", "# hello\n"}});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)["bytes"], 8);
  auto r = Call("files.read", {{"path", "notes/today.md"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["content"], "# hello\n");
  auto l = Call("files.list", {{"path", "notes"}});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)["entries"], Json::array({{{"name", "today.md"}, {"type", "file"}, {"size", 8}}}));
  auto top = Call("files.list", Json::object());
  EXPECT_EQ((*top)["entries"][0]["name"], "notes");
  EXPECT_EQ((*top)["entries"][0]["type"], "dir");
  EXPECT_EQ(Call("files.read", {{"path", "missing.txt"}}).status().code(), Code::kNotFound);
}

TEST_F(WorkspaceToolsTest, PathsThatEscapeAreRefused) {
  fs::create_symlink(root_ / "outside", root_ / "agent" / "link");
  fs::create_symlink(root_ / "outside" / "secret.txt", root_ / "agent" / "file-link");
  for (const char* path : {"../outside/secret.txt", "a/../../outside/secret.txt", "link/secret.txt"}) {
    auto r = Call("files.read", {{"path", path}});
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << path << ": " << r.status().ToString();
    auto w = Call("files.write", {{"path", path}, {"content", "x"}});
    EXPECT_EQ(w.status().code(), Code::kPermissionDenied) << path;
  }
  EXPECT_EQ(Call("files.read", {{"path", "file-link"}}).status().code(), Code::kPermissionDenied);
  EXPECT_EQ(Call("files.list", {{"path", "link"}}).status().code(), Code::kPermissionDenied);
  EXPECT_EQ(Call("files.read", {{"path", "/etc/hostname"}}).status().code(),
            Code::kInvalidArgument);
  std::ifstream in(root_ / "outside" / "secret.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "top secret");
}

bool HaveBwrap() { return SandboxArgv("/tmp", "true").ok(); }

TEST_F(WorkspaceToolsTest, SandboxedExecWritesOnlyTheWorkspaceAndHasNoNetwork) {
  if (!HaveBwrap()) GTEST_SKIP() << "bubblewrap is not installed";
  ::setenv("KEEL_SECRET_KEK", "must-not-leak", 1);
  auto r = Call("exec", {{"command",
                          "echo made > made.txt; pwd; id -u; env | sort; "
                          "cat " + (root_ / "outside" / "secret.txt").string() + " 2>&1; "
                          "touch /usr/x 2>&1; "
                          "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)' "
                          "2>&1 | tail -1"}});
  ::unsetenv("KEEL_SECRET_KEK");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::string out = (*r)["stdout"];
  EXPECT_EQ((*r)["exit_code"], 0) << out;
  EXPECT_NE(out.find("/workspace\n65534\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("must-not-leak"), std::string::npos) << "the environment leaked: " << out;
  EXPECT_EQ(out.find("top secret"), std::string::npos) << "a host file was readable: " << out;
  EXPECT_NE(out.find("Read-only file system"), std::string::npos) << out;
  EXPECT_NE(out.find("Network is unreachable"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(root_ / "agent" / "made.txt"));
}

TEST_F(WorkspaceToolsTest, ExecLimitsKillRunawayCommands) {
  if (!HaveBwrap()) GTEST_SKIP() << "bubblewrap is not installed";
  auto slow = Call("exec", {{"command", "sleep 30"}, {"timeout_s", 1}});
  EXPECT_EQ(slow.status().code(), Code::kUnavailable);
  EXPECT_NE(slow.status().message().find("did not finish within 1 s"), std::string::npos);
  auto flood = Call("exec", {{"command", "yes"}});
  EXPECT_EQ(flood.status().code(), Code::kUnavailable);
  EXPECT_NE(flood.status().message().find("MiB of output"), std::string::npos);
  auto hog = Call("exec", {{"command", "python3 -c 'x = bytearray(4 << 30)' 2>&1 | tail -1"}});
  ASSERT_TRUE(hog.ok());
  EXPECT_NE((*hog)["stdout"].get<std::string>().find("MemoryError"), std::string::npos)
      << (*hog)["stdout"];
  auto big = Call("exec", {{"command", "head -c 200000 /dev/zero | tr '\\\\0' a"}});
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*big)["stdout"].get<std::string>().size(), 64u * 1024);
  EXPECT_EQ((*big)["truncated"], true);
  auto code = Call("exec", {{"command", "echo oops >&2; exit 3"}, {"stdin", "ignored"}});
  ASSERT_TRUE(code.ok());
  EXPECT_EQ((*code)["exit_code"], 3);
  EXPECT_EQ((*code)["stderr"], "oops\n");
}

// A command that exits without reading its input fails the write with EPIPE: SIGPIPE (blocked
// in the writing thread) would otherwise end the whole server. The command itself starts with
// no signal blocked or ignored, as from a shell.
TEST_F(WorkspaceToolsTest, ACommandThatLeavesItsInputUnreadEndsAloneNotTheServer) {
  if (!HaveBwrap()) GTEST_SKIP() << "bubblewrap is not installed";
  auto r = Call("exec", {{"command", "exit 0"}, {"stdin", std::string(1 << 20, 'x')}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["exit_code"], 0);
  auto masks = Call("exec", {{"command", "grep -E '^Sig(Blk|Ign)' /proc/self/status"}});
  ASSERT_TRUE(masks.ok()) << masks.status().ToString();
  std::istringstream lines((*masks)["stdout"].get<std::string>());
  std::string name;
  uint64_t blocked = 0, ignored = 0;
  lines >> name >> std::hex >> blocked >> name >> std::hex >> ignored;
  EXPECT_EQ(blocked, 0u) << (*masks)["stdout"];
  EXPECT_EQ(ignored & (uint64_t{1} << (SIGPIPE - 1)), 0u) << (*masks)["stdout"];
}

TEST_F(WorkspaceToolsTest, HostBackendNeedsTheGrant) {
  ctx_.agent_config = {{"exec_backend", "host"}};
  auto r = Call("exec", {{"command", "id -u"}});
  EXPECT_EQ(r.status().code(), Code::kPermissionDenied);
  EXPECT_NE(r.status().message().find("platform admin"), std::string::npos)
      << r.status().message();
}

// Granted, host commands run as the exec user (65534 by default), never as Keel's own user;
// where Keel cannot switch users they are refused, not run as Keel.
TEST_F(WorkspaceToolsTest, HostBackendRunsAsTheExecUserInTheWorkspaceWithACleanEnvironment) {
  ctx_.agent_config = {{"exec_backend", "host"}, {kHostExecGranted, true}};
  if (!CanRunAs(65534, 65534).ok()) {
    auto refused = Call("exec", {{"command", "id -u"}});
    EXPECT_EQ(refused.status().code(), Code::kUnavailable);
    EXPECT_NE(refused.status().message().find("CAP_SETUID"), std::string::npos)
        << refused.status().message();
    return;
  }
  ASSERT_TRUE(Call("files.write", {{"path", "sub/from-keel.txt"}, {"content", "written"}}).ok());
  ::setenv("KEEL_SECRET_KEK", "must-not-leak", 1);
  auto r = Call("exec", {{"command", "pwd; id -u; id -g; env; cat sub/from-keel.txt; echo; "
                                     "cat " + (root_ / "outside" / "secret.txt").string() +
                                     " 2>&1; touch made; cat"},
                         {"stdin", "from stdin"}});
  ::unsetenv("KEEL_SECRET_KEK");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::string out = (*r)["stdout"];
  EXPECT_EQ(out.rfind(fs::canonical(root_ / "agent").string() + "\n65534\n65534\n", 0), 0u)
      << out;
  EXPECT_EQ(out.find("must-not-leak"), std::string::npos) << out;
  EXPECT_NE(out.find("written"), std::string::npos) << out;
  EXPECT_NE(out.find("from stdin"), std::string::npos);
  EXPECT_TRUE(fs::exists(root_ / "agent" / "made"));
  auto slow = Call("exec", {{"command", "sleep 30"}, {"timeout_s", 1}});
  EXPECT_EQ(slow.status().code(), Code::kUnavailable);
}

TEST(CanRunAsTest, NeverRootOrKeelsOwnUser) {
  EXPECT_FALSE(CanRunAs(0, 0).ok());
  EXPECT_FALSE(CanRunAs(static_cast<int>(::geteuid()), static_cast<int>(::getegid())).ok());
  EXPECT_FALSE(CanRunAs(-1, -1).ok());
}

// What the sandbox binds does not expose what it must hide: a hidden directory inside a bound
// one is an empty tmpfs there.
TEST_F(WorkspaceToolsTest, TheSandboxHidesDirectoriesInsideWhatItBinds) {
  if (!HaveBwrap()) GTEST_SKIP() << "bubblewrap is not installed";
  fs::create_directories(root_ / "tree" / "home");
  std::ofstream(root_ / "tree" / "home" / "owner.token") << "the-token";
  std::ofstream(root_ / "tree" / "visible.txt") << "visible";
  SandboxSpec spec;
  spec.argv = {"/bin/sh", "-c", "cat " + (root_ / "tree" / "visible.txt").string() + "; ls -a " +
                                    (root_ / "tree" / "home").string() + "; cat " +
                                    (root_ / "tree" / "home" / "owner.token").string() + " 2>&1"};
  spec.read_only = {(root_ / "tree").string()};
  spec.hidden = {(root_ / "tree" / "home").string()};
  auto argv = SandboxArgv(spec);
  ASSERT_TRUE(argv.ok()) << argv.status().ToString();
  auto r = RunProcess(*argv, {"PATH=/usr/bin:/bin"}, "", "", ProcessLimits{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->stdout_text.find("visible"), std::string::npos) << r->stdout_text << r->stderr_text;
  EXPECT_EQ(r->stdout_text.find("the-token"), std::string::npos) << r->stdout_text;
  EXPECT_NE(r->stdout_text.find("No such file"), std::string::npos) << r->stdout_text;
}

TEST(ProcessTest, ABackgroundChildDoesNotHoldTheCallPastItsEnd) {
  ProcessLimits limits;
  limits.timeout_ms = 5000;
  auto r = RunProcess({"/bin/sh", "-c", "sleep 20 & echo started"}, {}, "", "", limits);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(r->stdout_text, "started\n");
  EXPECT_LT(r->elapsed_ms, 3000);
  auto missing = RunProcess({"/no/such/binary"}, {}, "", "", limits);
  EXPECT_EQ(missing.status().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace keel::tools

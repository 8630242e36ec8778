// McpManager against the fake stdio server: connections are started on first use, started
// again after the server died, replaced when the registration changes, and pruned when the
// server is no longer registered.

#include <gtest/gtest.h>

#include "keel/mcp/manager.h"

namespace keel::mcp {
namespace {

ServerLaunch FakeLaunch(const std::string& id, const std::string& tenant,
                        const std::string& fingerprint = "v1") {
  ServerLaunch l;
  l.server_id = id;
  l.tenant_id = tenant;
  l.name = "fake";
  l.spec.command = {"python3", std::string(KEEL_TEST_FAKES_DIR) + "/fake_mcp_stdio.py"};
  l.fingerprint = fingerprint;
  return l;
}

std::string Text(const Json& result) { return result["content"][0]["text"].get<std::string>(); }

TEST(McpManagerTest, StartsRestartsReplacesAndPrunes) {
  McpManager manager;
  EXPECT_EQ(manager.StatusOf("s1"), "not_connected");
  auto tools = manager.Tools(FakeLaunch("s1", "t1"));
  ASSERT_TRUE(tools.ok()) << tools.status().ToString();
  EXPECT_FALSE(tools->empty());
  EXPECT_EQ(manager.StatusOf("s1"), "ready");
  auto pid = manager.Call(FakeLaunch("s1", "t1"), "pid", Json::object(), 0);
  ASSERT_TRUE(pid.ok());

  // The server dies mid-call; the next call starts it again.
  auto crashed = manager.Call(FakeLaunch("s1", "t1"), "crash", {{"code", 3}}, 0);
  EXPECT_EQ(crashed.status().code(), Code::kUnavailable);
  auto again = manager.Call(FakeLaunch("s1", "t1"), "pid", Json::object(), 0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(Text(*again), Text(*pid));

  // A changed registration (another fingerprint) gets a new process.
  auto changed = manager.Call(FakeLaunch("s1", "t1", "v2"), "pid", Json::object(), 0);
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(Text(*changed), Text(*again));

  // Pruning stops only the tenant's servers that are no longer registered.
  ASSERT_TRUE(manager.Tools(FakeLaunch("s2", "t2")).ok());
  EXPECT_EQ(manager.Stale("t1", {"other"}), std::vector<std::string>({"s1"}));
  EXPECT_TRUE(manager.Stale("t2", {"s2"}).empty());
  manager.Forget("s1");
  EXPECT_EQ(manager.StatusOf("s1"), "not_connected");
  EXPECT_EQ(manager.StatusOf("s2"), "ready");
  EXPECT_TRUE(manager.Stale("t1", {}).empty());
}

}  // namespace
}  // namespace keel::mcp

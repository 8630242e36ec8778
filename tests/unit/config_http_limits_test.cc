// The HTTP connection settings of config::LoadHttp: defaults, keel.toml keys, KEEL_* variables
// (which win), and out-of-range values refused with the setting's name.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "keel/config/http_config.h"

namespace keel::config {
namespace {

namespace fs = std::filesystem;

class ConfigHttpLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = fs::temp_directory_path() /
            ("keel-config-test-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(home_);
    for (const char* v : kVars) ::unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
    fs::remove_all(home_);
  }
  void WriteToml(const std::string& text) { std::ofstream(home_ / "keel.toml") << text; }
  Result<HttpConfig> LoadHere() {
    Overrides o;
    o.home = home_.string();
    return LoadHttp(o);
  }

  static constexpr const char* kVars[] = {
      "KEEL_MAX_CONNECTIONS", "KEEL_MAX_CONNECTIONS_PER_ADDRESS", "KEEL_HEADER_TIMEOUT_MS",
      "KEEL_BODY_TIMEOUT_MS", "KEEL_IDLE_TIMEOUT_MS", "KEEL_CONFIG"};
  fs::path home_;
};

TEST_F(ConfigHttpLimitsTest, DefaultsBoundEveryConnection) {
  auto c = LoadHere();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->max_connections, 1024);
  EXPECT_EQ(c->max_connections_per_address, 256);
  EXPECT_EQ(c->header_timeout_ms, 10000);
  EXPECT_EQ(c->body_timeout_ms, 30000);
  EXPECT_EQ(c->idle_timeout_ms, 30000);
}

TEST_F(ConfigHttpLimitsTest, TomlSetsThemAndEnvironmentWins) {
  WriteToml(
      "max_connections = 100\nmax_connections_per_address = 10\nheader_timeout_ms = 2000\n"
      "body_timeout_ms = 3000\nidle_timeout_ms = 4000\n");
  ::setenv("KEEL_MAX_CONNECTIONS_PER_ADDRESS", "20", 1);
  ::setenv("KEEL_IDLE_TIMEOUT_MS", "5000", 1);
  auto c = LoadHere();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->max_connections, 100);
  EXPECT_EQ(c->max_connections_per_address, 20);
  EXPECT_EQ(c->header_timeout_ms, 2000);
  EXPECT_EQ(c->body_timeout_ms, 3000);
  EXPECT_EQ(c->idle_timeout_ms, 5000);
}

TEST_F(ConfigHttpLimitsTest, OutOfRangeValuesAreRefusedByName) {
  WriteToml("max_connections = 0\n");
  auto c = LoadHere();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("max_connections must be an integer from 1"),
            std::string::npos)
      << c.status().message();

  WriteToml("");
  ::setenv("KEEL_HEADER_TIMEOUT_MS", "0", 1);
  c = LoadHere();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("KEEL_HEADER_TIMEOUT_MS must be an integer from 100"),
            std::string::npos)
      << c.status().message();
  ::setenv("KEEL_HEADER_TIMEOUT_MS", "ten", 1);
  EXPECT_FALSE(LoadHere().ok());
  // The rest of the configuration is refused with it.
  Overrides o;
  o.home = home_.string();
  EXPECT_FALSE(Load(o).ok());
}

}  // namespace
}  // namespace keel::config

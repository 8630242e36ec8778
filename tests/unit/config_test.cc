// The settings that keep Keel's keys, users and tenants apart: the key-encryption key from a
// file, its removal from the environment, the exec user, the tenants' fair shares, and the
// browser pages that may call the API.

#include "keel/config/config.h"
#include "keel/config/limits_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "keel/common/ids.h"

namespace keel::config {
namespace {

namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("keel-config-" + NewId());
    fs::create_directories(dir_);
    overrides_.home = dir_.string();
  }
  void TearDown() override {
    for (const char* v :
         {"KEEL_SECRET_KEK", "KEEL_SECRET_KEK_FILE", "KEEL_EXEC_UID", "KEEL_MAX_CONCURRENT_RUNS",
          "KEEL_TENANT_MAX_RUNNING", "KEEL_TOOL_THREADS", "KEEL_TENANT_TOOL_THREADS",
          "KEEL_IO_STALL_WARN_MS", "KEEL_IO_STALL_LIMIT_MS", "KEEL_CORS_ORIGINS"}) {
      ::unsetenv(v);
    }
    fs::remove_all(dir_);
  }
  fs::path dir_;
  Overrides overrides_;
};

TEST_F(ConfigTest, ReadsTheKeyEncryptionKeyFromAFile) {
  std::ofstream(dir_ / "kek") << "a2V5LWJ5dGVz\n";
  ::setenv("KEEL_SECRET_KEK_FILE", (dir_ / "kek").c_str(), 1);
  auto c = Load(overrides_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->secret_kek, "a2V5LWJ5dGVz");
  ::setenv("KEEL_SECRET_KEK", "a2V5LWJ5dGVz", 1);
  EXPECT_EQ(Load(overrides_).status().code(), Code::kInvalidArgument);  // both: which one?
  ::unsetenv("KEEL_SECRET_KEK");
  ::setenv("KEEL_SECRET_KEK_FILE", (dir_ / "missing").c_str(), 1);
  auto missing = Load(overrides_);
  EXPECT_EQ(missing.status().code(), Code::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("KEEL_SECRET_KEK_FILE"), std::string::npos);
}

TEST_F(ConfigTest, TheKeyLeavesTheEnvironment) {
  ::setenv("KEEL_SECRET_KEK", "a2V5LWJ5dGVz", 1);
  ::setenv("KEEL_HOME_NEIGHBOUR", "stays", 1);
  ForgetSecretKekInEnvironment();
  EXPECT_EQ(::getenv("KEEL_SECRET_KEK"), nullptr);
  EXPECT_STREQ(::getenv("KEEL_HOME_NEIGHBOUR"), "stays");
  ::unsetenv("KEEL_HOME_NEIGHBOUR");
  ForgetSecretKekInEnvironment();  // nothing to forget: nothing happens
}

TEST_F(ConfigTest, TheExecUserDefaultsToNobodyAndIsNeverRoot) {
  auto c = Load(overrides_);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->exec_uid, 65534);
  EXPECT_EQ(c->exec_gid, 65534);
  ::setenv("KEEL_EXEC_UID", "0", 1);
  EXPECT_EQ(Load(overrides_).status().code(), Code::kInvalidArgument);
  ::setenv("KEEL_EXEC_UID", "1500", 1);
  auto set = Load(overrides_);
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->exec_uid, 1500);
}

TEST_F(ConfigTest, ATenantsSharesDefaultToAQuarterOfTheNode) {
  auto shares = LoadLimits(overrides_);
  ASSERT_TRUE(shares.ok()) << shares.status().ToString();
  EXPECT_EQ(shares->tenant_max_running, 64);  // of 256 run slots
  EXPECT_EQ(shares->tool_threads, 16);
  EXPECT_EQ(shares->tenant_tool_threads, 4);
  ::setenv("KEEL_MAX_CONCURRENT_RUNS", "2", 1);
  ::setenv("KEEL_TOOL_THREADS", "40", 1);
  shares = LoadLimits(overrides_);
  ASSERT_TRUE(shares.ok()) << shares.status().ToString();
  EXPECT_EQ(shares->tenant_max_running, 1);  // never none
  EXPECT_EQ(shares->tenant_tool_threads, 10);
  std::ofstream(dir_ / "keel.toml") << "tenant_max_running = 2\ntenant_tool_threads = 3\n";
  shares = LoadLimits(overrides_);
  ASSERT_TRUE(shares.ok()) << shares.status().ToString();
  EXPECT_EQ(shares->tenant_max_running, 2);
  EXPECT_EQ(shares->tenant_tool_threads, 3);
  ::setenv("KEEL_TENANT_TOOL_THREADS", "5", 1);  // the environment wins over the file
  shares = LoadLimits(overrides_);
  ASSERT_TRUE(shares.ok()) << shares.status().ToString();
  EXPECT_EQ(shares->tenant_tool_threads, 5);
}

TEST_F(ConfigTest, AShareLargerThanItsWholeIsRefused) {
  ::setenv("KEEL_MAX_CONCURRENT_RUNS", "8", 1);
  ::setenv("KEEL_TENANT_MAX_RUNNING", "9", 1);
  for (auto status : {Load(overrides_).status(), LoadLimits(overrides_).status()}) {
    EXPECT_EQ(status.code(), Code::kInvalidArgument);
    EXPECT_NE(status.message().find("tenant_max_running (9) must not exceed max_concurrent_runs"),
              std::string::npos)
        << status.message();
  }
  ::unsetenv("KEEL_TENANT_MAX_RUNNING");
  ::setenv("KEEL_TOOL_THREADS", "2", 1);
  ::setenv("KEEL_TENANT_TOOL_THREADS", "3", 1);
  auto status = LoadLimits(overrides_).status();
  EXPECT_NE(status.message().find("tenant_tool_threads (3) must not exceed tool_threads (2)"),
            std::string::npos)
      << status.message();
  ::setenv("KEEL_TENANT_TOOL_THREADS", "0", 1);
  EXPECT_EQ(LoadLimits(overrides_).status().code(), Code::kInvalidArgument);
}

TEST_F(ConfigTest, TheIoWatchdogWarnsBeforeItsLimit) {
  auto limits = LoadLimits(overrides_);
  ASSERT_TRUE(limits.ok());
  EXPECT_EQ(limits->io_stall_warn_ms, 1000);
  EXPECT_EQ(limits->io_stall_limit_ms, 30000);
  ::setenv("KEEL_IO_STALL_LIMIT_MS", "1000", 1);
  auto status = LoadLimits(overrides_).status();
  EXPECT_NE(status.message().find("io_stall_warn_ms (1000) must be below io_stall_limit_ms (1000)"),
            std::string::npos)
      << status.message();
  ::setenv("KEEL_IO_STALL_WARN_MS", "300", 1);
  limits = LoadLimits(overrides_);
  ASSERT_TRUE(limits.ok()) << limits.status().ToString();
  EXPECT_EQ(limits->io_stall_warn_ms, 300);
  ::setenv("KEEL_IO_STALL_LIMIT_MS", "999", 1);  // below the floor
  EXPECT_EQ(LoadLimits(overrides_).status().code(), Code::kInvalidArgument);
}

TEST_F(ConfigTest, CrossOriginPagesAreNoneUnlessListedAndEachIsAnOrigin) {
  auto c = Load(overrides_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->cors_origins.empty());
  std::ofstream(dir_ / "keel.toml")
      << "cors_origins = [\"https://app.example.com\", \"http://[::1]:5173\"]\n";
  c = Load(overrides_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cors_origins,
            (std::vector<std::string>{"https://app.example.com", "http://[::1]:5173"}));
  ::setenv("KEEL_CORS_ORIGINS", " * ", 1);  // the environment replaces the file's list
  c = Load(overrides_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cors_origins, std::vector<std::string>{"*"});
  ::unsetenv("KEEL_CORS_ORIGINS");
  for (const char* bad : {"\"https://app.example.com/\"", "\"//app.example.com\"", "\"https://\"",
                          "\"https://a.example.com:0x50\"", "42"}) {
    std::ofstream(dir_ / "keel.toml") << "cors_origins = [" << bad << "]\n";
    auto refused = Load(overrides_).status();
    EXPECT_EQ(refused.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(refused.message().find("cors_origins"), std::string::npos) << refused.message();
  }
}

}  // namespace
}  // namespace keel::config

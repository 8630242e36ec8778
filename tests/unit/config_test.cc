// The settings that keep Keel's keys and users apart: the key-encryption key from a file, its
// removal from the environment, and the exec user.

#include "keel/config/config.h"

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
    for (const char* v : {"KEEL_SECRET_KEK", "KEEL_SECRET_KEK_FILE", "KEEL_EXEC_UID"}) {
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

}  // namespace
}  // namespace keel::config

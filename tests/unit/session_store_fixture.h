#pragma once
// A conformance fixture for the store ports that work on one session's records: each case runs
// against each backend (`Suite/Test.<Case>/sqlite` and `.../postgres`; the PostgreSQL cases skip
// without KEEL_TEST_PG_ADMIN_URL, see store_conformance_test.cc) on a fresh store holding one
// tenant, one agent and one session of it. Instantiate with KEEL_BACKENDS(Suite, Fixture).

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "keel/common/ids.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store::test {
namespace {  // as pg_test_database.h: one copy per test file

enum class Backend { kSqlite, kPostgres };
inline std::string BackendName(Backend b) { return b == Backend::kSqlite ? "sqlite" : "postgres"; }

class SessionStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kPostgres && !PgAdminUrl()) GTEST_SKIP() << kPgSkip;
    std::string url;
    if (GetParam() == Backend::kPostgres) {
      Status st = pg_.Create();
      ASSERT_TRUE(st.ok()) << st.ToString();
      url = pg_.url();
    } else {
      dir_ = std::filesystem::temp_directory_path() / ("keel-session-store-" + NewId());
      std::filesystem::create_directories(dir_);
      url = "sqlite://" + (dir_ / "keel.db").string();
    }
    StoreOptions o;
    o.origin = "node-a";
    auto opened = OpenStore(url, o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
    tenant_ = NewId();
    agent_ = NewId();
    session_ = NewId();
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant({tenant_, "t", NowMillis()}));
      Agent a;
      a.id = agent_;
      a.tenant_id = tenant_;
      a.name = "a";
      a.model = "local";
      KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
      return tx.sessions().InsertSession(
          Session{session_, tenant_, agent_, "idle", "s", NowMillis(), NowMillis(), ""});
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A message of the session; returns its id.
  std::string AddMessage(const std::string& role, const std::string& content) {
    Message m;
    m.id = NewId();
    m.tenant_id = tenant_;
    m.session_id = session_;
    m.role = role;
    m.content = content;
    m.created_at = NowMillis();
    Status st = store_->WriteSync([&](Tx& tx) { return tx.messages().InsertMessage(m); });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return m.id;
  }

  std::filesystem::path dir_;
  PgTestDatabase pg_;
  std::unique_ptr<Store> store_;
  std::string tenant_, agent_, session_;
};

}  // namespace
}  // namespace keel::store::test

#define KEEL_BACKENDS(suite, fixture)                                                      \
  INSTANTIATE_TEST_SUITE_P(                                                                \
      suite, fixture,                                                                      \
      ::testing::Values(::keel::store::test::Backend::kSqlite,                             \
                        ::keel::store::test::Backend::kPostgres),                          \
      [](const ::testing::TestParamInfo<::keel::store::test::Backend>& info) {             \
        return ::keel::store::test::BackendName(info.param);                               \
      })

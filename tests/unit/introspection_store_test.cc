// IntrospectionStore conformance: every case runs against each backend (`IntrospectionStore/
// IntrospectionStoreTest.<Case>/sqlite` and `.../postgres`; the PostgreSQL cases skip without
// KEEL_TEST_PG_ADMIN_URL, see store_conformance_test.cc).

#include "keel/store/introspection_store.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "keel/common/ids.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

enum class Backend { kSqlite, kPostgres };
std::string BackendName(Backend b) { return b == Backend::kSqlite ? "sqlite" : "postgres"; }

class IntrospectionStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kPostgres && !PgAdminUrl()) GTEST_SKIP() << kPgSkip;
    std::string url;
    if (GetParam() == Backend::kPostgres) {
      Status st = pg_.Create();
      ASSERT_TRUE(st.ok()) << st.ToString();
      url = pg_.url();
    } else {
      dir_ = std::filesystem::temp_directory_path() / ("keel-introspection-" + NewId());
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
          Session{session_, tenant_, agent_, "idle", "s", NowMillis(), NowMillis()});
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

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

INSTANTIATE_TEST_SUITE_P(IntrospectionStore, IntrospectionStoreTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

TEST_P(IntrospectionStoreTest, TheDescriptionIsPartOfTheSession) {
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) {
                    return tx.introspection().SetSessionDescription(tenant_, session_,
                                                                    "About: trips", 42);
                  })
                  .ok());
  Status missing = store_->WriteSync(
      [&](Tx& tx) { return tx.introspection().SetSessionDescription(tenant_, NewId(), "x", 42); });
  EXPECT_EQ(missing.code(), Code::kNotFound);
  Status st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto s, tx.sessions().GetSession(tenant_, session_));
    EXPECT_EQ(s.description, "About: trips");
    EXPECT_EQ(s.updated_at, 42);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_P(IntrospectionStoreTest, TurnsAreCountedSinceTheLastIntrospection) {
  auto turns = [&] {
    int64_t n = -1;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(n, tx.introspection().TurnsSinceIntrospection(tenant_, session_));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return n;
  };
  EXPECT_EQ(turns(), 0);
  AddMessage("user", "a");
  AddMessage("assistant", "b");
  AddMessage("user", "c");
  EXPECT_EQ(turns(), 2);
  AddMessage("introspection", "{}");
  EXPECT_EQ(turns(), 0);
  AddMessage("user", "d");
  AddMessage("call", "{}");
  EXPECT_EQ(turns(), 1);
}

TEST_P(IntrospectionStoreTest, DueIntrospectionsAreMovedClearedAndFoundAcrossTenants) {
  std::string other_session = NewId();
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    return tx.sessions().InsertSession(
                        Session{other_session, tenant_, agent_, "idle", "s", 1, 1});
                  })
                  .ok());
  auto put = [&](const std::string& session, Millis at) {
    Status st = store_->WriteSync([&](Tx& tx) {
      return tx.introspection().PutIntrospectionDue({tenant_, session, agent_, at});
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
  };
  auto due = [&](Millis now) {
    std::vector<std::string> out;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto got, tx.introspection().DueIntrospections(now, 10));
      for (const auto& d : got) out.push_back(d.session_id + "@" + std::to_string(d.due_at));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  };
  using V = std::vector<std::string>;
  put(session_, 100);
  put(other_session, 50);
  put(session_, 200);  // moved by a later turn
  EXPECT_EQ(due(150), V{other_session + "@50"});
  EXPECT_EQ(due(300), (V{other_session + "@50", session_ + "@200"}));
  // Clearing what was read at 100 leaves the moved one.
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) {
                    return tx.introspection().ClearIntrospectionDue(tenant_, session_, 100);
                  })
                  .ok());
  EXPECT_EQ(due(300), (V{other_session + "@50", session_ + "@200"}));
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) {
                    return tx.introspection().ClearIntrospectionDue(tenant_, session_, 200);
                  })
                  .ok());
  EXPECT_EQ(due(300), V{other_session + "@50"});
}

}  // namespace
}  // namespace keel::store

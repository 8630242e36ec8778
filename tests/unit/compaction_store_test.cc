// CompactionStore conformance: every case runs against each backend (`CompactionStore/
// CompactionStoreTest.<Case>/sqlite` and `.../postgres`; the PostgreSQL cases skip without
// KEEL_TEST_PG_ADMIN_URL, see store_conformance_test.cc).

#include "keel/store/compaction_store.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "keel/common/ids.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

enum class Backend { kSqlite, kPostgres };
std::string BackendName(Backend b) { return b == Backend::kSqlite ? "sqlite" : "postgres"; }

class CompactionStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kPostgres && !PgAdminUrl()) GTEST_SKIP() << kPgSkip;
    std::string url;
    if (GetParam() == Backend::kPostgres) {
      Status st = pg_.Create();
      ASSERT_TRUE(st.ok()) << st.ToString();
      url = pg_.url();
    } else {
      dir_ = std::filesystem::temp_directory_path() / ("keel-compactions-" + NewId());
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

  Compaction NewCompaction(const std::string& last, const std::string& summary) {
    Compaction c;
    c.id = NewId();
    c.tenant_id = tenant_;
    c.session_id = session_;
    c.run_id = "run-1";
    c.last_message_id = last;
    c.summary = summary;
    c.messages = 3;
    c.tokens_before = 900;
    c.tokens_after = 300;
    c.created_at = NowMillis();
    return c;
  }

  std::filesystem::path dir_;
  PgTestDatabase pg_;
  std::unique_ptr<Store> store_;
  std::string tenant_, agent_, session_;
};

INSTANTIATE_TEST_SUITE_P(CompactionStore, CompactionStoreTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

TEST_P(CompactionStoreTest, TheLatestCompactionAndTheListInOrder) {
  Status st = store_->Read([&](Tx& tx) -> Status {
    auto none = tx.compactions().LatestCompaction(tenant_, session_);
    EXPECT_TRUE(none.ok() && !none->has_value());
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok());
  std::vector<Compaction> made;
  for (int i = 0; i < 5; ++i) {
    made.push_back(
        NewCompaction(AddMessage("user", "m" + std::to_string(i)), "summary " + std::to_string(i)));
    ASSERT_TRUE(
        store_->WriteSync([&](Tx& tx) { return tx.compactions().InsertCompaction(made.back()); })
            .ok());
  }
  Status dup =
      store_->WriteSync([&](Tx& tx) { return tx.compactions().InsertCompaction(made[0]); });
  EXPECT_EQ(dup.code(), Code::kConflict) << dup.ToString();

  st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto latest, tx.compactions().LatestCompaction(tenant_, session_));
    EXPECT_TRUE(latest.has_value());
    if (latest) {
      EXPECT_EQ(latest->id, made.back().id);
      EXPECT_EQ(latest->summary, "summary 4");
      EXPECT_EQ(latest->last_message_id, made.back().last_message_id);
      EXPECT_EQ(latest->messages, 3);
      EXPECT_EQ(latest->tokens_before, 900);
      EXPECT_EQ(latest->tokens_after, 300);
      EXPECT_EQ(latest->run_id, "run-1");
    }
    std::vector<std::string> ids;
    Page page{"", 2};
    do {
      KEEL_ASSIGN_OR_RETURN(auto got, tx.compactions().ListCompactions(tenant_, session_, page));
      for (const auto& c : got.items) ids.push_back(c.id);
      page.cursor = got.next_cursor;
    } while (!page.cursor.empty());
    EXPECT_EQ(ids.size(), 5u);
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], made[i].id);
    // Another tenant sees none.
    KEEL_ASSIGN_OR_RETURN(auto other, tx.compactions().LatestCompaction(NewId(), session_));
    EXPECT_FALSE(other.has_value());
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_P(CompactionStoreTest, ConversationSinceIsTheUserAndAssistantMessagesBetween) {
  std::string a = AddMessage("user", "a");
  std::string b = AddMessage("assistant", "b");
  AddMessage("introspection", "{}");
  AddMessage("call", "{}");
  std::string c = AddMessage("user", "c");
  std::string d = AddMessage("assistant", "d");
  std::string prompt = AddMessage("user", "prompt");
  AddMessage("user", "after the prompt");
  auto contents = [&](const std::string& after, const std::string& before, int limit) {
    std::vector<std::string> out;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(
          auto got, tx.compactions().ConversationSince(tenant_, session_, after, before, limit));
      for (const auto& m : got) out.push_back(m.content);
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(contents("", prompt, 100), (V{"a", "b", "c", "d"}));
  EXPECT_EQ(contents(b, prompt, 100), (V{"c", "d"}));
  EXPECT_EQ(contents("", prompt, 3), (V{"a", "b", "c"}));
  EXPECT_EQ(contents(d, prompt, 100), V{});
  EXPECT_EQ(contents(a, c, 100), (V{"b"}));
}

}  // namespace
}  // namespace keel::store

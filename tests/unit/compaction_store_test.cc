// CompactionStore conformance: every case runs against each backend (`CompactionStore/
// CompactionStoreTest.<Case>/sqlite` and `.../postgres`; the PostgreSQL cases skip without
// KEEL_TEST_PG_ADMIN_URL, see store_conformance_test.cc).

#include "keel/store/compaction_store.h"

#include <gtest/gtest.h>

#include "keel/common/ids.h"
#include "session_store_fixture.h"

namespace keel::store {
namespace {

class CompactionStoreTest : public test::SessionStoreTest {
 protected:
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
};

KEEL_BACKENDS(CompactionStore, CompactionStoreTest);

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

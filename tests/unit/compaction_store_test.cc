// CompactionStore conformance: every case runs against each backend (`CompactionStore/
// CompactionStoreTest.<Case>/sqlite` and `.../postgres`; the PostgreSQL cases skip without
// KEEL_TEST_PG_ADMIN_URL, see store_conformance_test.cc).

#include "keel/store/compaction_store.h"

#include <gtest/gtest.h>

#include <tuple>

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
  // A Later read is filled by the end of the read (store.h): looked at after it.
  std::optional<Compaction> none;
  Status st = store_->Read(
      [&](Tx& tx) { return tx.compactions().LatestCompactionLater(tenant_, session_, none); });
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(none.has_value());
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

  std::optional<Compaction> latest;
  std::optional<Compaction> other;
  std::vector<std::string> ids;
  st = store_->Read([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.compactions().LatestCompactionLater(tenant_, session_, latest));
    // Another tenant sees none.
    KEEL_RETURN_IF_ERROR(tx.compactions().LatestCompactionLater(NewId(), session_, other));
    Page page{"", 2};
    do {
      KEEL_ASSIGN_OR_RETURN(auto got, tx.compactions().ListCompactions(tenant_, session_, page));
      for (const auto& c : got.items) ids.push_back(c.id);
      page.cursor = got.next_cursor;
    } while (!page.cursor.empty());
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->id, made.back().id);
  EXPECT_EQ(latest->summary, "summary 4");
  EXPECT_EQ(latest->last_message_id, made.back().last_message_id);
  EXPECT_EQ(latest->messages, 3);
  EXPECT_EQ(latest->tokens_before, 900);
  EXPECT_EQ(latest->tokens_after, 300);
  EXPECT_EQ(latest->run_id, "run-1");
  EXPECT_FALSE(other.has_value());
  EXPECT_EQ(ids.size(), 5u);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], made[i].id);
}

TEST_P(CompactionStoreTest, ConversationSinceIsTheUserAndAssistantMessagesAfterACompaction) {
  std::string a = AddMessage("user", "a");
  std::string b = AddMessage("assistant", "b");
  AddMessage("introspection", "{}");
  AddMessage("call", "{}");
  std::string c = AddMessage("user", "c");
  std::string d = AddMessage("assistant", "d");
  auto read = [&](const std::string& after, int64_t after_seq, int limit) {
    Conversation out;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(out, tx.compactions().ConversationSince(tenant_, session_, after,
                                                                    after_seq, limit));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  };
  auto contents = [](const Conversation& c) {
    std::vector<std::string> out;
    for (const auto& m : c.messages) out.push_back(m.content);
    return out;
  };
  using V = std::vector<std::string>;
  Conversation all = read("", 0, 100);
  EXPECT_EQ(contents(all), (V{"a", "b", "c", "d"}));
  EXPECT_EQ(all.last_seq, 6);  // every role counts
  std::vector<int64_t> seqs;
  for (const auto& m : all.messages) seqs.push_back(m.seq);
  EXPECT_EQ(seqs, (std::vector<int64_t>{1, 2, 5, 6}));
  EXPECT_EQ(all.messages[0].id, a);
  EXPECT_EQ(contents(read(b, 0, 100)), (V{"c", "d"}));
  EXPECT_EQ(contents(read("", 0, 3)), (V{"a", "b", "c"}));
  EXPECT_EQ(contents(read(d, 0, 100)), V{});
  EXPECT_EQ(contents(read("", 2, 100)), (V{"c", "d"}));  // what came after seq 2
  Conversation none = read("", 6, 100);
  EXPECT_EQ(contents(none), V{});
  EXPECT_EQ(none.last_seq, 6);
  // Another tenant's reader sees nothing of the session.
  Status st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto other, tx.compactions().ConversationSince(NewId(), session_, "",
                                                                         0, 100));
    EXPECT_TRUE(other.messages.empty());
    EXPECT_EQ(other.last_seq, 0);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  (void)c;
}

// The conversation after the newest compaction, read with it: the same as ConversationSince
// after that compaction's message, from the first before any compaction.
TEST_P(CompactionStoreTest, ConversationSinceLatestIsAfterTheNewestCompaction) {
  std::string a = AddMessage("user", "a");
  std::string b = AddMessage("assistant", "b");
  AddMessage("user", "c");
  AddMessage("assistant", "d");
  auto read = [&](int64_t after_seq, int limit) {
    std::pair<std::optional<Compaction>, Conversation> out;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.compactions().LatestCompactionLater(tenant_, session_, out.first));
      KEEL_ASSIGN_OR_RETURN(out.second, tx.compactions().ConversationSinceLatest(tenant_, session_,
                                                                                 after_seq, limit));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::vector<std::string> contents;
    for (const auto& m : out.second.messages) contents.push_back(m.content);
    return std::make_tuple(out.first, contents, out.second.last_seq);
  };
  using V = std::vector<std::string>;
  auto [none, all, last] = read(0, 100);
  EXPECT_FALSE(none.has_value());
  EXPECT_EQ(all, (V{"a", "b", "c", "d"}));
  EXPECT_EQ(last, 4);
  EXPECT_EQ(std::get<1>(read(0, 2)), (V{"a", "b"}));
  EXPECT_EQ(std::get<1>(read(3, 100)), V{"d"});

  Compaction first = NewCompaction(a, "one");
  Compaction second = NewCompaction(b, "two");
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    KEEL_RETURN_IF_ERROR(tx.compactions().InsertCompaction(first));
                    return tx.compactions().InsertCompaction(second);
                  })
                  .ok());
  auto [newest, after, last_after] = read(0, 100);
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->id, second.id);
  EXPECT_EQ(after, (V{"c", "d"}));
  EXPECT_EQ(last_after, 4);
  EXPECT_EQ(std::get<1>(read(4, 100)), V{});

  // A message after it; another tenant reads nothing of the session.
  AddMessage("user", "e");
  EXPECT_EQ(std::get<1>(read(0, 100)), (V{"c", "d", "e"}));
  Status st = store_->Read([&](Tx& tx) -> Status {
    std::optional<Compaction> theirs;
    KEEL_RETURN_IF_ERROR(tx.compactions().LatestCompactionLater(NewId(), session_, theirs));
    KEEL_ASSIGN_OR_RETURN(auto other,
                          tx.compactions().ConversationSinceLatest(NewId(), session_, 0, 100));
    EXPECT_FALSE(theirs.has_value());
    EXPECT_TRUE(other.messages.empty());
    EXPECT_EQ(other.last_seq, 0);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// seq follows commit order, not ids: a message committed after others with an earlier id (a
// node whose clock is behind) is still found by a reader that saw everything up to its seq.
TEST_P(CompactionStoreTest, AMessageCommittedLateWithAnEarlierIdIsFoundBySeq) {
  std::string early_id = NewId();  // made first, committed last
  AddMessage("user", "one");
  AddMessage("assistant", "two");
  int64_t seen = 0;
  Status st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto c, tx.compactions().ConversationSince(tenant_, session_, "", 0, 100));
    seen = c.last_seq;
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok());
  Message late;
  late.id = early_id;
  late.tenant_id = tenant_;
  late.session_id = session_;
  late.role = "user";
  late.content = "late";
  late.created_at = NowMillis();
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.messages().InsertMessage(late); }).ok());
  st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto c,
                          tx.compactions().ConversationSince(tenant_, session_, "", seen, 100));
    EXPECT_EQ(c.messages.size(), 1u);
    if (!c.messages.empty()) {
      EXPECT_EQ(c.messages[0].content, "late");
      EXPECT_EQ(c.messages[0].seq, seen + 1);
    }
    EXPECT_EQ(c.last_seq, seen + 1);
    // Read whole, it is last: the conversation is in commit order, whatever the ids.
    KEEL_ASSIGN_OR_RETURN(auto whole, tx.compactions().ConversationSince(tenant_, session_, "", 0, 100));
    EXPECT_EQ(whole.messages.size(), 3u);
    if (whole.messages.size() == 3u) EXPECT_EQ(whole.messages[2].content, "late");
    // After a compaction that ends at it (by seq, although its id is the smallest): nothing.
    KEEL_ASSIGN_OR_RETURN(auto after,
                          tx.compactions().ConversationSince(tenant_, session_, early_id, 0, 100));
    EXPECT_TRUE(after.messages.empty());
    if (whole.messages.empty()) return Internal("the conversation read nothing");
    // After the first message: the second and the late one.
    KEEL_ASSIGN_OR_RETURN(auto after_first, tx.compactions().ConversationSince(
                                                tenant_, session_, whole.messages[0].id, 0, 100));
    EXPECT_EQ(after_first.messages.size(), 2u);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

}  // namespace
}  // namespace keel::store

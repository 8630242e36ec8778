// The conversation a node keeps between turns: what it asks the store for, and how it merges the
// answer, checked against what reading the conversation whole would give.

#include "keel/runtime/conversation_cache.h"

#include <gtest/gtest.h>

namespace keel::runtime {
namespace {

store::Message M(const std::string& id, int64_t seq, const std::string& content = "") {
  store::Message m;
  m.id = id;
  m.seq = seq;
  m.role = "user";
  m.content = content.empty() ? "text of " + id : content;
  return m;
}

std::vector<std::string> Ids(const ConversationEntry& e) {
  std::vector<std::string> out;
  for (const auto& m : e.messages) out.push_back(m.id);
  return out;
}

using V = std::vector<std::string>;

TEST(ConversationCacheTest, AWholeReadThenOnlyWhatCameAfter) {
  EXPECT_EQ(FetchFrom(nullptr, ""), 0);
  auto e = Merge(nullptr, 0, "", {{M("a", 1), M("b", 2)}, 2}, 10);
  EXPECT_EQ(Ids(*e), (V{"a", "b"}));
  EXPECT_EQ(e->last_seq, 2);
  EXPECT_FALSE(e->cut);
  EXPECT_EQ(FetchFrom(e.get(), ""), 2);
  e = Merge(std::move(e), 2, "", {{M("c", 3), M("d", 4)}, 5}, 10);  // seq 5: another role
  EXPECT_EQ(Ids(*e), (V{"a", "b", "c", "d"}));
  EXPECT_EQ(e->last_seq, 5);
  // Nothing new: the same entry.
  e = Merge(std::move(e), 5, "", {{}, 5}, 10);
  EXPECT_EQ(Ids(*e), (V{"a", "b", "c", "d"}));
}

TEST(ConversationCacheTest, AMessageCommittedLateWithAnEarlierIdComesAfterWhatWasBefore) {
  // The conversation is in commit order: ids (made by clocks) do not place a message.
  auto e = Merge(nullptr, 0, "", {{M("b", 1), M("d", 2)}, 2}, 10);
  e = Merge(std::move(e), 2, "", {{M("a", 3), M("c", 4), M("e", 5)}, 5}, 10);
  EXPECT_EQ(Ids(*e), (V{"b", "d", "a", "c", "e"}));
  // A compaction that ends at "a" (by seq, after "b" and "d") folds those three.
  EXPECT_EQ(FetchFrom(e.get(), "a"), 5);
  e = Merge(std::move(e), 5, "a", {{}, 5}, 10);
  EXPECT_EQ(Ids(*e), (V{"c", "e"}));
}

TEST(ConversationCacheTest, ANewerCompactionDropsTheFront) {
  auto e = Merge(nullptr, 0, "", {{M("a", 1), M("b", 2), M("c", 3)}, 3}, 10);
  EXPECT_EQ(FetchFrom(e.get(), "b"), 3);
  e = Merge(std::move(e), 3, "b", {{M("d", 4)}, 4}, 10);
  EXPECT_EQ(Ids(*e), (V{"c", "d"}));
  EXPECT_EQ(e->after_id, "b");
  // Its size follows what it holds: the entry and two messages of 9 characters.
  EXPECT_EQ(e->bytes, 256u + 2 * (96 + 9));
  // A compaction whose message the entry does not hold (an older one, not something the store
  // makes, or one past what the entry read): read whole.
  EXPECT_EQ(FetchFrom(e.get(), "a"), 0);
  EXPECT_EQ(FetchFrom(e.get(), "x"), 0);
}

TEST(ConversationCacheTest, ACutEntryIsReadWholeAfterANewerCompaction) {
  // At the limit, the entry holds the first `limit` by seq and knows it left some out.
  auto e = Merge(nullptr, 0, "", {{M("a", 1), M("b", 2)}, 3}, 2);
  EXPECT_TRUE(e->cut);
  EXPECT_EQ(FetchFrom(e.get(), ""), 3);  // the same compaction: the first two stay the first
  e = Merge(std::move(e), 3, "", {{M("0", 4)}, 4}, 2);
  EXPECT_EQ(Ids(*e), (V{"a", "b"}));  // what came later is past the limit, whatever its id
  EXPECT_EQ(e->last_seq, 4);
  EXPECT_EQ(FetchFrom(e.get(), "a"), 0);  // its tail is unknown: read whole
  // A whole read replaces what was known.
  e = Merge(std::move(e), 0, "a", {{M("b", 2), M("z", 9)}, 9}, 2);
  EXPECT_EQ(Ids(*e), (V{"b", "z"}));
}

TEST(ConversationCacheTest, MoreNewMessagesThanTheLimitCutTheEntryAfterWhatItHeld) {
  auto e = Merge(nullptr, 0, "", {{M("a", 1)}, 1}, 3);
  e = Merge(std::move(e), 1, "", {{M("b", 2), M("c", 3), M("d", 4)}, 9}, 3);
  EXPECT_EQ(Ids(*e), (V{"a", "b", "c"}));
  EXPECT_TRUE(e->cut);
  EXPECT_EQ(e->last_seq, 9);
}

TEST(ConversationCacheTest, TakeRemovesAndPutKeepsWithinTheSize) {
  ConversationCache cache(4 * 2000);
  EXPECT_EQ(cache.Take("t", "s"), nullptr);
  cache.Put("t", "s1", Merge(nullptr, 0, "", {{M("a", 1, std::string(1000, 'x'))}, 1}, 10));
  cache.Put("t", "s2", Merge(nullptr, 0, "", {{M("b", 1, std::string(1000, 'y'))}, 1}, 10));
  // Another tenant's session of the same id is another entry.
  EXPECT_EQ(cache.Take("other", "s1"), nullptr);
  auto s1 = cache.Take("t", "s1");
  ASSERT_NE(s1, nullptr);
  EXPECT_EQ(Ids(*s1), V{"a"});
  EXPECT_EQ(cache.Take("t", "s1"), nullptr);  // taken
  cache.Put("t", "s1", std::move(s1));
  // Over the size, the least recently used goes: s2 (s1 was put back after it).
  for (int i = 0; i < 5; ++i) {
    cache.Put("t", "n" + std::to_string(i),
              Merge(nullptr, 0, "", {{M("c", 1, std::string(1000, 'z'))}, 1}, 10));
  }
  EXPECT_EQ(cache.Take("t", "s2"), nullptr);
  // One entry bigger than a quarter of the cache is not kept.
  cache.Put("t", "big", Merge(nullptr, 0, "", {{M("d", 1, std::string(3000, 'w'))}, 1}, 10));
  EXPECT_EQ(cache.Take("t", "big"), nullptr);
}

}  // namespace
}  // namespace keel::runtime

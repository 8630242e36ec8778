// A node's run slots: a tenant holds at most its share, the node at most its total, and a
// slot comes back when its Hold goes.

#include "keel/runtime/run_slots.h"

#include <gtest/gtest.h>

#include <vector>

namespace keel::runtime {
namespace {

TEST(RunSlotsTest, ATenantTakesAtMostItsShareAndOthersTheRest) {
  RunSlots slots(4, 2);
  std::vector<RunSlots::Hold> held;
  held.push_back(slots.Take("noisy"));
  held.push_back(slots.Take("noisy"));
  EXPECT_FALSE(slots.Take("noisy"));  // at its share
  held.push_back(slots.Take("quiet"));
  held.push_back(slots.Take("third"));
  for (const auto& h : held) EXPECT_TRUE(h);
  EXPECT_EQ(slots.free(), 0);
  EXPECT_FALSE(slots.Take("fourth"));  // the node is full
  held[0].Release();
  EXPECT_EQ(slots.free(), 1);
  EXPECT_TRUE(slots.Take("noisy"));  // taken and given back at once (a temporary)
  RunSlots::Hold moved = std::move(held[1]);
  EXPECT_FALSE(held[1]);
  EXPECT_EQ(slots.free(), 1);
  held.clear();
  EXPECT_EQ(slots.free(), 3);  // `moved` still holds one of noisy's
  EXPECT_TRUE(slots.Take("noisy"));
}

}  // namespace
}  // namespace keel::runtime

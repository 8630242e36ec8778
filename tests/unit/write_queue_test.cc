// The queue in front of both stores' writer threads (store/write_queue.h): the order units are
// taken in, a closed queue, and how a batch's outcome reaches each unit.

#include "keel/store/write_queue.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace keel::store {
namespace {

// A unit whose outcome is recorded in `ended` as "name:ok" or "name:message".
PendingUnit Named(std::vector<std::string>& ended, std::string name) {
  return {[](Tx&) { return Status::Ok(); },
          [&ended, name](Status st, std::vector<Event>) {
            ended.push_back(name + (st.ok() ? ":ok" : ":" + st.message()));
          }};
}

TEST(WriteQueueTest, UrgentUnitsGoFirstInTheirOwnOrder) {
  WriteQueue q;
  std::vector<std::string> ended;
  for (const char* name : {"a", "b"}) {
    auto u = Named(ended, name);
    q.Push(std::move(u));
  }
  for (const char* name : {"u1", "u2"}) {
    auto u = Named(ended, name);
    q.Push(std::move(u), /*urgent=*/true);
  }
  auto c = Named(ended, "c");
  q.Push(std::move(c));

  std::vector<PendingUnit> batch;
  ASSERT_TRUE(q.Take(3, batch));  // at most `max`
  ASSERT_EQ(batch.size(), 3u);
  // An urgent unit queued after the first ones were taken still goes ahead of the rest.
  auto u3 = Named(ended, "u3");
  q.Push(std::move(u3), /*urgent=*/true);
  ASSERT_TRUE(q.Take(10, batch));
  ASSERT_EQ(batch.size(), 6u);
  std::vector<Status> results(batch.size());
  std::vector<std::vector<Event>> events(batch.size());
  q.Finish(batch, results, events, Status::Ok(), 6, nullptr);
  EXPECT_EQ(ended, (std::vector<std::string>{"u1:ok", "u2:ok", "a:ok", "u3:ok", "b:ok", "c:ok"}));
}

TEST(WriteQueueTest, AClosedQueueRefusesUnitsAndHandsOverTheOnesLeft) {
  WriteQueue q;
  std::vector<std::string> ended;
  auto kept = Named(ended, "kept");
  q.Push(std::move(kept));
  q.Close();
  auto late = Named(ended, "late");
  q.Push(std::move(late));
  EXPECT_EQ(ended, (std::vector<std::string>{"late:store is closed"}));

  std::vector<PendingUnit> batch;
  ASSERT_TRUE(q.Take(10, batch));  // queued before the close: still the writer's
  ASSERT_EQ(batch.size(), 1u);
  batch.clear();
  EXPECT_FALSE(q.Take(10, batch));  // closed and empty: the writer stops
}

TEST(WriteQueueTest, CloseWakesAWaitingWriter) {
  WriteQueue q;
  bool taken = true;
  std::thread writer([&] {
    std::vector<PendingUnit> batch;
    taken = q.Take(10, batch);
  });
  q.Close();
  writer.join();
  EXPECT_FALSE(taken);
}

TEST(WriteQueueTest, AFailedCommitFailsEveryUnitAndShowsNoEvent) {
  WriteQueue q;
  std::vector<std::string> ended;
  for (const char* name : {"good", "bad"}) {
    auto u = Named(ended, name);
    q.Push(std::move(u));
  }
  std::vector<PendingUnit> batch;
  ASSERT_TRUE(q.Take(10, batch));
  std::vector<Status> results = {Status::Ok(), InvalidArgument("its own failure")};
  std::vector<std::vector<Event>> events(2);
  events[0].push_back(Event{});
  int heard = 0;
  q.Finish(batch, results, events, Unavailable("disk full"), 1,
           [&](const std::vector<Event>&) { ++heard; });
  EXPECT_EQ(ended, (std::vector<std::string>{"good:disk full", "bad:its own failure"}));
  EXPECT_EQ(heard, 0);
  StoreStats stats = q.stats();
  EXPECT_EQ(stats.commits, 0);
  EXPECT_EQ(stats.units, 0);
  EXPECT_EQ(stats.failed_units, 2);
}

TEST(WriteQueueTest, ACommitTellsTheListenerUnitByUnitThenTheUnits) {
  WriteQueue q;
  std::vector<std::string> ended;
  for (const char* name : {"one", "two", "three"}) {
    auto u = Named(ended, name);
    q.Push(std::move(u));
  }
  std::vector<PendingUnit> batch;
  ASSERT_TRUE(q.Take(10, batch));
  std::vector<Status> results = {Status::Ok(), Conflict("rolled back"), Status::Ok()};
  std::vector<std::vector<Event>> events(3);
  events[0].resize(2);
  events[2].resize(1);
  std::vector<size_t> heard;
  q.Finish(batch, results, events, Status::Ok(), 2, [&](const std::vector<Event>& ev) {
    EXPECT_TRUE(ended.empty()) << "the listener hears a commit before any unit's callback";
    heard.push_back(ev.size());
  });
  EXPECT_EQ(heard, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(ended, (std::vector<std::string>{"one:ok", "two:rolled back", "three:ok"}));
  StoreStats stats = q.stats();
  EXPECT_EQ(stats.commits, 1);
  EXPECT_EQ(stats.units, 2);
  EXPECT_EQ(stats.failed_units, 1);
}

}  // namespace
}  // namespace keel::store

// EventHub (runtime/event_hub.h): which subscriptions a committed event wakes, and the run a
// node's execution ended, which a waiter may take instead of reading the run back only while
// nothing it does not know of may have changed the run.

#include "keel/runtime/event_hub.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

namespace keel::runtime {
namespace {

store::Event EventOf(const std::string& tenant, const std::string& run, const std::string& type,
                     int64_t position) {
  store::Event e;
  e.tenant_id = tenant;
  e.agent_id = "agent";
  e.session_id = "session";
  e.run_id = run;
  e.type = type;
  e.position = position;
  return e;
}

store::Run Ended(const std::string& tenant, const std::string& id) {
  store::Run r;
  r.id = id;
  r.tenant_id = tenant;
  r.status = "done";
  r.output = "the answer";
  r.input_tokens = 12;
  return r;
}

class EventHubTest : public ::testing::Test {
 protected:
  // Runs what OnCommit and OnRemoteCommit posted.
  void Drain() {
    io_.restart();
    io_.poll();
  }
  boost::asio::io_context io_;
  EventHub hub_{io_.get_executor()};
};

// The unit ending a run gives the hub the run as it writes it; its commit hands the run to the
// subscriptions of that run with their wake-up.
TEST_F(EventHubTest, AnEndingReachesTheSubscriptionsOfItsRunWhenItCommits) {
  auto mine = hub_.Subscribe({"tenant-a", "", "", "run-1", false});
  auto other_run = hub_.Subscribe({"tenant-a", "", "", "run-2", false});
  auto other_tenant = hub_.Subscribe({"tenant-b", "", "", "run-1", false});
  auto session = hub_.Subscribe({"tenant-a", "", "session", "", false});
  hub_.Ending(Ended("tenant-a", "run-1"));
  EXPECT_FALSE(hub_.TakeSettled(mine).has_value()) << "not before its commit";
  hub_.OnCommit({EventOf("tenant-a", "run-1", "run.step@v1", 1),
                 EventOf("tenant-a", "run-1", "run.completed@v1", 2)});
  Drain();
  hub_.ForgetEnding("run-1");

  auto got = hub_.TakeSettled(mine);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status, "done");
  EXPECT_EQ(got->output, "the answer");
  EXPECT_EQ(got->input_tokens, 12);
  EXPECT_FALSE(hub_.TakeSettled(mine).has_value()) << "taken once";
  EXPECT_FALSE(hub_.TakeSettled(other_run).has_value());
  EXPECT_FALSE(hub_.TakeSettled(other_tenant).has_value());
  EXPECT_FALSE(hub_.TakeSettled(session).has_value()) << "only a run's own subscriptions";
}

// A unit that ended the run but did not commit hands nothing, even when the run ends later
// another way (here: another tenant's event of the same id, and a step).
TEST_F(EventHubTest, AnEndingThatDidNotCommitIsNeverHandedOver) {
  auto sub = hub_.Subscribe({"tenant-a", "", "", "run-1", false});
  hub_.Ending(Ended("tenant-a", "run-1"));
  hub_.OnCommit({EventOf("tenant-b", "run-1", "run.completed@v1", 1),
                 EventOf("tenant-a", "run-1", "run.step@v1", 2)});
  Drain();
  EXPECT_FALSE(hub_.TakeSettled(sub).has_value());
  hub_.ForgetEnding("run-1");  // its write failed
  hub_.OnCommit({EventOf("tenant-a", "run-1", "run.failed@v1", 3)});
  Drain();
  EXPECT_FALSE(hub_.TakeSettled(sub).has_value());
  EXPECT_TRUE(hub_.TakeMayHaveEnded(sub));
}

// A cancel request committed while the run worked sets a flag the execution may not have seen:
// its ending could show the run without it, so the waiter must read the run.
TEST_F(EventHubTest, ACancelRequestMeanwhileMakesTheWaiterReadTheRun) {
  auto sub = hub_.Subscribe({"tenant-a", "", "", "run-1", false});
  hub_.OnCommit({EventOf("tenant-a", "run-1", "run.step@v1", 1),
                 EventOf("tenant-a", "run-1", "run.cancel_requested@v1", 2)});
  hub_.Ending(Ended("tenant-a", "run-1"));
  hub_.OnCommit({EventOf("tenant-a", "run-1", "run.completed@v1", 3)});
  Drain();
  EXPECT_FALSE(hub_.TakeSettled(sub).has_value());
  EXPECT_TRUE(hub_.TakeDirty(sub));

  // Another run's cancel request does not concern this one.
  auto calm = hub_.Subscribe({"tenant-a", "", "", "run-3", false});
  hub_.OnCommit({EventOf("tenant-a", "run-4", "run.cancel_requested@v1", 4)});
  hub_.Ending(Ended("tenant-a", "run-3"));
  hub_.OnCommit({EventOf("tenant-a", "run-3", "run.completed@v1", 5)});
  Drain();
  EXPECT_TRUE(hub_.TakeSettled(calm).has_value());
}

// Another node committed something: it may have changed the run (taken it after its lease ran
// out, asked to cancel it); the waiter reads.
TEST_F(EventHubTest, AnotherNodesCommitMakesTheWaiterReadTheRun) {
  auto sub = hub_.Subscribe({"tenant-a", "", "", "run-1", false});
  hub_.OnRemoteCommit();
  hub_.Ending(Ended("tenant-a", "run-1"));
  hub_.OnCommit({EventOf("tenant-a", "run-1", "run.completed@v1", 1)});
  Drain();
  EXPECT_FALSE(hub_.TakeSettled(sub).has_value());
}

// A waiter reads its run only after an event that may have ended or parked it: a run's claim,
// steps and messages do not; its ending, an approval it waits for, an event of a kind the hub
// does not know, and another node's commit do.
TEST_F(EventHubTest, OnlyWhatMayEndARunMakesItsWaiterRead) {
  auto sub = hub_.Subscribe({"tenant-a", "", "", "run-1", false});
  hub_.OnCommit({EventOf("tenant-a", "run-1", "run.started@v1", 1),
                 EventOf("tenant-a", "run-1", "run.step@v1", 2),
                 EventOf("tenant-a", "run-1", "message.created@v1", 3),
                 EventOf("tenant-a", "run-1", "tool.call.started@v1", 4),
                 EventOf("tenant-a", "run-1", "tool.call.completed@v1", 5),
                 EventOf("tenant-a", "run-1", "session.compacted@v1", 5)});
  Drain();
  EXPECT_TRUE(hub_.TakeDirty(sub));
  EXPECT_FALSE(hub_.TakeMayHaveEnded(sub));

  for (const char* type :
       {"run.completed@v1", "run.failed@v1", "run.cancelled@v1", "run.waiting_for_approval@v1",
        "run.crashed@v1", "run.queued@v1", "run.something_new@v9"}) {
    hub_.OnCommit(
        {EventOf("tenant-a", "run-1", "run.step@v1", 6), EventOf("tenant-a", "run-1", type, 7)});
    Drain();
    EXPECT_TRUE(hub_.TakeMayHaveEnded(sub)) << type;
    EXPECT_FALSE(hub_.TakeMayHaveEnded(sub)) << type << ": cleared";
  }
  // Another run's ending does not concern this one.
  hub_.OnCommit({EventOf("tenant-a", "run-2", "run.completed@v1", 8)});
  Drain();
  EXPECT_FALSE(hub_.TakeMayHaveEnded(sub));
  hub_.OnRemoteCommit();
  Drain();
  EXPECT_TRUE(hub_.TakeMayHaveEnded(sub));
}

}  // namespace
}  // namespace keel::runtime

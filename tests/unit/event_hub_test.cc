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

// Each subscription is woken by exactly the events and deltas its filter matches, at every level
// of filter (tenant, agent, session, run), whatever other subscriptions share its keys; once
// unsubscribed (twice is harmless) it is woken by nothing.
TEST_F(EventHubTest, EventsAndDeltasWakeExactlyTheMatchingSubscriptions) {
  struct Case {
    SubscriptionFilter filter;
    EventHub::SubscriptionPtr sub;
  };
  std::vector<Case> subs;
  for (const char* tenant : {"tenant-a", "tenant-b"}) {
    for (bool deltas : {true, false}) {
      subs.push_back({{tenant, "", "", "", deltas}, nullptr});
      subs.push_back({{tenant, "agent", "", "", deltas}, nullptr});
      subs.push_back({{tenant, "agent-2", "", "", deltas}, nullptr});
      subs.push_back({{tenant, "", "session", "", deltas}, nullptr});
      subs.push_back({{tenant, "agent", "session", "", deltas}, nullptr});
      subs.push_back({{tenant, "agent-2", "session", "", deltas}, nullptr});
      subs.push_back({{tenant, "", "", "run-1", deltas}, nullptr});
      subs.push_back({{tenant, "", "session-2", "run-1", deltas}, nullptr});
      subs.push_back({{tenant, "", "", "run-2", deltas}, nullptr});
    }
  }
  for (auto& c : subs) c.sub = hub_.Subscribe(c.filter);
  auto matches = [](const SubscriptionFilter& f, const std::string& tenant,
                    const std::string& agent, const std::string& session, const std::string& run) {
    return f.tenant_id == tenant && (f.agent_id.empty() || f.agent_id == agent) &&
           (f.session_id.empty() || f.session_id == session) &&
           (f.run_id.empty() || f.run_id == run);
  };
  struct Fields {
    std::string tenant, agent, session, run;
  };
  const Fields events[] = {{"tenant-a", "agent", "session", "run-1"},
                           {"tenant-b", "agent", "session", "run-1"},
                           {"tenant-a", "agent", "session", ""},
                           {"tenant-a", "agent", "", ""},
                           {"tenant-a", "", "", ""},
                           {"tenant-a", "agent-2", "session-2", "run-2"},
                           {"tenant-c", "agent", "session", "run-1"}};
  int64_t position = 0;
  for (const Fields& f : events) {
    store::Event e = EventOf(f.tenant, f.run, "run.step@v1", ++position);
    e.agent_id = f.agent;
    e.session_id = f.session;
    hub_.OnCommit({e});
    Drain();
    hub_.PublishDelta({f.tenant, f.agent, f.session, f.run, "text", 0});
    for (auto& c : subs) {
      const bool want = matches(c.filter, f.tenant, f.agent, f.session, f.run);
      EXPECT_EQ(hub_.TakeDirty(c.sub), want)
          << position << ": " << c.filter.tenant_id << "/" << c.filter.agent_id << "/"
          << c.filter.session_id << "/" << c.filter.run_id;
      EXPECT_EQ(hub_.TakeDeltas(c.sub).size(), want && c.filter.deltas ? 1u : 0u) << position;
    }
  }
  EXPECT_EQ(hub_.subscriber_count(), subs.size());
  for (size_t i = 0; i < subs.size(); i += 2) {
    hub_.Unsubscribe(subs[i].sub);
    hub_.Unsubscribe(subs[i].sub);
  }
  EXPECT_EQ(hub_.subscriber_count(), subs.size() / 2);
  hub_.OnCommit({EventOf("tenant-a", "run-1", "run.step@v1", ++position)});
  Drain();
  hub_.PublishDelta({"tenant-a", "agent", "session", "run-1", "text", 0});
  for (size_t i = 0; i < subs.size(); ++i) {
    const bool want =
        i % 2 == 1 && matches(subs[i].filter, "tenant-a", "agent", "session", "run-1");
    EXPECT_EQ(hub_.TakeDirty(subs[i].sub), want) << i;
    EXPECT_EQ(hub_.TakeDeltas(subs[i].sub).size(), want && subs[i].filter.deltas ? 1u : 0u) << i;
  }
}

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

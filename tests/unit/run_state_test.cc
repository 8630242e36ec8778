// The run state machine (runs/run_state.h) on both backends: each transition leaves only from
// the states it may, an execution that lost its run writes nothing, and each writes its event.

#include "keel/runs/run_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "keel/common/ids.h"
#include "keel/store/row_images.h"
#include "session_store_fixture.h"

namespace keel::store::test {
namespace {

constexpr int64_t kLeaseMs = 30000;

class RunStateTest : public SessionStoreTest {
 protected:
  // A new run of the session, written queued (or claimed by node-a at once).
  store::Run NewRun(bool claim = false) {
    auto written = CreateRun(claim, std::nullopt);
    EXPECT_TRUE(written.ok()) << written.status().ToString();
    return written.ok() ? *written : store::Run();
  }

  // runs::Create of a new run of the session, claimed by node-a when `claim`, with `guard`.
  Result<store::Run> CreateRun(bool claim, const std::optional<runs::IdleGuard>& guard) {
    store::Run r;
    r.id = NewId();
    r.tenant_id = tenant_;
    r.session_id = session_;
    r.agent_id = agent_;
    r.message_id = NewId();
    r.created_at = NowMillis();
    store::Run written;
    std::optional<runs::Lease> lease;
    if (claim) lease = runs::Lease{"node-a", NowMillis() + kLeaseMs};
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(
          written, runs::Create(tx, r, {{"message_id", r.message_id}}, NowMillis(), lease, guard));
      return Status::Ok();
    });
    if (!st.ok()) return st;
    return written;
  }

  Result<runs::Claim> Claim(const std::string& origin, Millis now, const store::Run& run) {
    runs::Claim out;
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(out, runs::ClaimRun(tx, tenant_, run.id, origin, now, kLeaseMs));
      return Status::Ok();
    });
    if (!st.ok()) return st;
    return out;
  }

  store::Run Stored(const std::string& run_id) {
    store::Run r;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(r, tx.runs().GetRun(tenant_, run_id));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return r;
  }

  std::string SessionStatus() {
    Session s;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(s, tx.sessions().GetSession(tenant_, session_));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return s.status;
  }

  // The types of the run's events, in order.
  std::vector<std::string> EventTypes(const std::string& run_id) {
    std::vector<std::string> types;
    Status st = store_->Read([&](Tx& tx) -> Status {
      EventFilter f;
      f.run_id = run_id;
      KEEL_ASSIGN_OR_RETURN(auto events, tx.events().ReadEvents(tenant_, 0, f, 1000));
      for (const auto& e : events) types.push_back(e.type);
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return types;
  }

  // A tool call proposed in `run`, with its step, not yet recorded.
  std::pair<ToolCall, Step> Proposed(const store::Run& run, int seq) {
    ToolCall c;
    c.id = NewId();
    c.tenant_id = tenant_;
    c.run_id = run.id;
    c.call_id = "call_" + std::to_string(seq);
    c.tool = "notes.append";
    c.arguments = {{"line", "x"}};
    c.effect_class = "once";
    c.effect_key = run.id + ":" + c.call_id;
    c.created_at = c.updated_at = NowMillis();
    Step s;
    s.id = NewId();
    s.tenant_id = tenant_;
    s.run_id = run.id;
    s.seq = seq;
    s.kind = "tool";
    s.started_at = c.created_at;
    c.step_id = s.id;
    return {c, s};
  }
};

TEST_P(RunStateTest, ANewRunIsQueuedOrClaimedAtOnceWithItsEvents) {
  store::Run queued = NewRun();
  EXPECT_EQ(queued.status, "queued");
  EXPECT_EQ(Stored(queued.id).attempt, 0);
  EXPECT_EQ(SessionStatus(), "idle");
  EXPECT_EQ(EventTypes(queued.id), std::vector<std::string>{"run.queued@v1"});

  store::Run claimed = NewRun(/*claim=*/true);
  store::Run stored = Stored(claimed.id);
  EXPECT_EQ(stored.status, "running");
  EXPECT_EQ(stored.attempt, 1);
  EXPECT_EQ(stored.lease_owner, "node-a");
  EXPECT_EQ(SessionStatus(), "running");
  EXPECT_EQ(EventTypes(claimed.id),
            (std::vector<std::string>{"run.queued@v1", "run.started@v1"}));

  // Only a queued run is created: nothing is written for any other.
  store::Run odd = queued;
  odd.id = NewId();
  odd.status = "done";
  Status st = store_->WriteSync(
      [&](Tx& tx) { return runs::Create(tx, odd, Json::object(), NowMillis(), {}).status(); });
  EXPECT_EQ(st.code(), Code::kInternal);
}

// A claim whose unit did not read the session (intake read it just before, outside the
// writer) marks the session running only while it is still idle, its agent's, active, and its
// tenant under the cap: otherwise the unit fails with kConflict, all of it (on PostgreSQL the
// count arrives after the unit's other statements), and intake runs it again, reading first.
TEST_P(RunStateTest, AClaimWhoseUnitDidNotReadTheSessionTakesItOnlyWhileItIsIdle) {
  auto create = [&](const std::string& agent, int64_t max_active) {
    return CreateRun(/*claim=*/true, runs::IdleGuard{agent, max_active});
  };
  auto no_trace = [&](const Result<store::Run>& refused) {
    EXPECT_EQ(refused.status().code(), Code::kConflict) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find("changed since intake read it"), std::string::npos);
    Status read = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto runs,
                            tx.runs().ListRuns(tenant_, {.session_id = session_}, {"", 100}));
      EXPECT_EQ(runs.items.size(), 1u);  // the first run's alone
      return Status::Ok();
    });
    EXPECT_TRUE(read.ok()) << read.ToString();
  };
  auto first = create(agent_, 64);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(Stored(first->id).status, "running");
  EXPECT_EQ(SessionStatus(), "running");
  EXPECT_EQ(EventTypes(first->id), (std::vector<std::string>{"run.queued@v1", "run.started@v1"}));

  no_trace(create(agent_, 64));  // busy: the first run is unfinished
  Status ended = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(store::Run cur, runs::Held(tx, *first));
    return runs::Finish(tx, cur, {"done", "ok", Json(), Json::object()}, NowMillis());
  });
  ASSERT_TRUE(ended.ok()) << ended.ToString();
  no_trace(create(NewId(), 64));  // idle, but another agent's
  no_trace(create(agent_, 0));    // idle, but the tenant is at its cap
  Status inactive = store_->WriteSync([&](Tx& tx) {
    return tx.sessions().UpdateSessionStatus(tenant_, session_, "inactive", NowMillis());
  });
  ASSERT_TRUE(inactive.ok()) << inactive.ToString();
  no_trace(create(agent_, 64));  // inactive
  EXPECT_EQ(SessionStatus(), "inactive");
}

TEST_P(RunStateTest, AClaimTakesAQueuedRunOrAnExpiredLeaseAndNothingElse) {
  store::Run run = NewRun();
  Millis now = NowMillis();
  auto first = Claim("node-a", now, run);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->resumed);
  EXPECT_EQ(first->run.attempt, 1);
  // Its lease is live: another node (or this one) cannot take it.
  EXPECT_EQ(Claim("node-b", now + 1000, run).status().code(), Code::kConflict);
  // Once the lease ran out, another node resumes it at the next attempt.
  auto second = Claim("node-b", now + kLeaseMs + 1, run);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(second->resumed);
  EXPECT_EQ(second->run.attempt, 2);
  EXPECT_EQ(second->run.lease_owner, "node-b");
  EXPECT_TRUE(second->poison.empty());
  // An ended run is never claimed.
  Status st = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(store::Run cur, runs::Held(tx, second->run));
    return runs::Finish(tx, cur, {"done", "ok", Json(), Json::object()}, NowMillis());
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Claim("node-a", now + 10 * kLeaseMs, run).status().code(), Code::kConflict);
}

TEST_P(RunStateTest, ARunThatStoppedItsNodeTenTimesInARowIsPoison) {
  store::Run run = NewRun();
  Millis now = NowMillis();
  for (int attempt = 1; attempt <= 10; ++attempt) {
    auto c = Claim("node-a", now + attempt * (kLeaseMs + 1), run);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->poison.empty()) << "attempt " << attempt;
  }
  auto eleventh = Claim("node-a", now + 11 * (kLeaseMs + 1), run);
  ASSERT_TRUE(eleventh.ok()) << eleventh.status().ToString();
  EXPECT_NE(eleventh->poison.find("10 times in a row"), std::string::npos) << eleventh->poison;
  // Not claimed: the run as found, for its claimer to fail in the same unit; no try started.
  EXPECT_EQ(eleventh->run.attempt, 10);
  EXPECT_EQ(Stored(run.id).attempt, 10);
  EXPECT_EQ(Stored(run.id).lease_expires_at, now + 10 * (kLeaseMs + 1) + kLeaseMs);
  std::vector<std::string> types = EventTypes(run.id);
  EXPECT_EQ(std::count(types.begin(), types.end(), "run.started@v1"), 10);
  Status failed = store_->WriteSync([&](Tx& tx) {
    store::Run cur = eleventh->run;
    return runs::Finish(tx, cur, {"failed", "", {{"code", "poison_run"}}, Json::object()},
                        NowMillis());
  });
  ASSERT_TRUE(failed.ok()) << failed.ToString();
  EXPECT_EQ(Stored(run.id).status, "failed");
  EXPECT_EQ(SessionStatus(), "idle");

  // Progress between the tries (a recorded step) means it is not stuck at one point.
  store::Run other = NewRun();
  for (int attempt = 1; attempt <= 12; ++attempt) {
    auto c = Claim("node-a", now + attempt * (kLeaseMs + 1), other);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->poison.empty()) << "attempt " << attempt;
    Status st = store_->WriteSync([&](Tx& tx) {
      return tx.events().Append({tenant_, "run.step@v1", agent_, session_, other.id, {}});
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
}

// The check reads the run's events newest first, back to its last progress: other runs' events
// between and after its tries, and a long history before its last step, change nothing.
TEST_P(RunStateTest, PoisonCountsTheTriesSinceTheLastProgressAmongOtherRunsEvents) {
  store::Run run = NewRun();
  Millis now = NowMillis();
  auto noise = [&](int n) {
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      for (int i = 0; i < n; ++i) {
        KEEL_RETURN_IF_ERROR(
            tx.events().Append({tenant_, "run.started@v1", agent_, session_, NewId(), {}}));
      }
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  };
  int attempt = 0;
  auto claim = [&]() {
    ++attempt;
    auto c = Claim("node-a", now + attempt * (kLeaseMs + 1), run);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? c->poison : std::string("claim failed");
  };
  // A long history of tries with progress between them.
  for (int i = 0; i < 80; ++i) {
    EXPECT_EQ(claim(), "");
    Status st = store_->WriteSync([&](Tx& tx) {
      return tx.events().Append({tenant_, "run.step@v1", agent_, session_, run.id, {}});
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // Then ten tries without progress, other runs' events between them.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(claim(), "") << "try " << i;
    noise(30);
  }
  std::string poison = claim();
  EXPECT_NE(poison.find("10 times in a row"), std::string::npos) << poison;
}

TEST_P(RunStateTest, ARunItsNodeCrashedInThreeTimesInARowIsPoison) {
  store::Run run = NewRun();
  Millis now = NowMillis();
  auto crash = [&](int64_t attempt) {
    return store_->WriteSync(
        [&](Tx& tx) { return runs::RecordCrash(tx, tenant_, run.id, attempt, 11); });
  };
  for (int attempt = 1; attempt <= 3; ++attempt) {
    auto c = Claim("node-a", now + attempt * (kLeaseMs + 1), run);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->poison.empty()) << "attempt " << attempt;
    // A note about another attempt (another node resumed the run meanwhile) counts nothing.
    ASSERT_TRUE(crash(attempt + 1).ok());
    ASSERT_TRUE(crash(attempt).ok());
  }
  auto fourth = Claim("node-a", now + 4 * (kLeaseMs + 1), run);
  ASSERT_TRUE(fourth.ok()) << fourth.status().ToString();
  EXPECT_NE(fourth->poison.find("crashed 3 times in a row"), std::string::npos) << fourth->poison;
  std::vector<std::string> types = EventTypes(run.id);
  EXPECT_EQ(std::count(types.begin(), types.end(), "run.crashed@v1"), 3);

  // Two crashes, then a stop with no cause known: not poison yet. A run that ended, or that is
  // gone, gets no crash recorded.
  store::Run other = NewRun();
  for (int attempt = 1; attempt <= 3; ++attempt) {
    auto c = Claim("node-a", now + attempt * (kLeaseMs + 1), other);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->poison.empty()) << "attempt " << attempt;
    if (attempt < 3) {
      ASSERT_TRUE(store_
                      ->WriteSync([&](Tx& tx) {
                        return runs::RecordCrash(tx, tenant_, other.id, attempt, 6);
                      })
                      .ok());
    }
  }
  ASSERT_TRUE(
      store_->WriteSync([&](Tx& tx) { return runs::RecordCrash(tx, tenant_, NewId(), 1, 6); })
          .ok());
  Status st = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(store::Run cur, tx.runs().GetRun(tenant_, other.id));
    return runs::Finish(tx, cur, {"done", "ok", Json(), Json::object()}, NowMillis());
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(
      store_->WriteSync([&](Tx& tx) { return runs::RecordCrash(tx, tenant_, other.id, 3, 6); })
          .ok());
  types = EventTypes(other.id);
  EXPECT_EQ(std::count(types.begin(), types.end(), "run.crashed@v1"), 2);
}

TEST_P(RunStateTest, AnExecutionThatLostItsRunWritesNothingForIt) {
  store::Run run = NewRun(/*claim=*/true);
  const std::vector<std::string> before = EventTypes(run.id);
  auto proposed = Proposed(run, 1);  // no structured binding: lambdas capture these
  ToolCall call = proposed.first;
  Step step = proposed.second;
  for (const runs::Holder& stale : {runs::Holder{"node-b", 1}, runs::Holder{"node-a", 2}}) {
    ToolCall c = call;
    Step s = step;
    Status denied = store_->WriteSync([&](Tx& tx) {
      return runs::DenyCall(tx, stale, c, s, "no", /*recorded=*/false, NowMillis());
    });
    EXPECT_EQ(denied.code(), Code::kConflict) << stale.origin << " " << stale.attempt;
    Status started = store_->WriteSync([&](Tx& tx) {
      return runs::StartCall(tx, stale, c, s, {{"outcome", "allow"}}, false, NowMillis());
    });
    EXPECT_EQ(started.code(), Code::kConflict);
    Status finished = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(store::Run cur, runs::Held(tx, tenant_, run.id, stale));
      return runs::Finish(tx, cur, {"done", "", Json(), Json::object()}, NowMillis());
    });
    EXPECT_EQ(finished.code(), Code::kConflict);
  }
  EXPECT_EQ(EventTypes(run.id), before);
  // The holder itself is let through: the refusals above were for the stale holders only.
  Status denied = store_->WriteSync([&](Tx& tx) {
    return runs::DenyCall(tx, runs::HolderOf(run), call, step, "no", false, NowMillis());
  });
  ASSERT_TRUE(denied.ok()) << denied.ToString();
  EXPECT_EQ(EventTypes(run.id).back(), "tool.call.denied@v1");
}

TEST_P(RunStateTest, AParkedCallIsSettledOnceAndItsRunQueuedAgain) {
  store::Run run = NewRun(/*claim=*/true);
  auto proposed = Proposed(run, 1);  // no structured binding: lambdas capture these
  ToolCall call = proposed.first;
  Step step = proposed.second;
  Approval a;
  a.id = NewId();
  a.tenant_id = tenant_;
  a.run_id = run.id;
  a.session_id = session_;
  a.agent_id = agent_;
  a.call_id = call.call_id;
  a.tool = call.tool;
  a.arguments = call.arguments;
  a.reason = "a human decides";
  a.created_at = NowMillis();
  a.expires_at = a.created_at + 60000;
  const runs::Holder holder = runs::HolderOf(run);
  Status parked = store_->WriteSync(
      [&](Tx& tx) { return runs::ParkCall(tx, holder, call, step, a, NowMillis()); });
  ASSERT_TRUE(parked.ok()) << parked.ToString();
  store::Run waiting = Stored(run.id);
  EXPECT_EQ(waiting.status, "waiting_for_approval");
  EXPECT_EQ(waiting.lease_owner, "");
  EXPECT_EQ(SessionStatus(), "awaiting_approval");
  // The parked run is held by nobody: its former holder can no longer write for it.
  Status late = store_->WriteSync([&](Tx& tx) { return runs::Held(tx, run).status(); });
  EXPECT_EQ(late.code(), Code::kConflict);

  const Json amended = {{"line", "y"}};
  // The images of what it writes ride the event its caller appends (approvals::Decide's
  // approval.decided@v1); a unit that appends none fails.
  auto settle = [&](const std::string& status, bool with_event = true) {
    return store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(runs::SettleParkedCall(tx, tenant_, run.id, call.call_id, status, "",
                                                  amended, NowMillis()));
      if (!with_event) return Status::Ok();
      return tx.events().Append(
          {tenant_, "approval.decided@v1", run.agent_id, run.session_id, run.id, Json::object()});
    });
  };
  EXPECT_EQ(settle("approved", /*with_event=*/false).code(), Code::kInternal);
  ASSERT_TRUE(settle("approved").ok());
  EXPECT_EQ(settle("rejected").code(), Code::kInternal);  // decided already
  EXPECT_EQ(settle("started").code(), Code::kInternal);   // not a decision
  Status read = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto calls, tx.runs().ListToolCalls(tenant_, run.id));
    KEEL_ASSIGN_OR_RETURN(auto steps, tx.runs().ListSteps(tenant_, run.id));
    if (calls.size() != 1 || steps.size() != 1) return Internal("one call and one step expected");
    EXPECT_EQ(calls[0].status, "approved");
    EXPECT_EQ(calls[0].arguments, amended);
    EXPECT_EQ(steps[0].status, "approved");
    EXPECT_EQ(steps[0].input["arguments"], amended);
    EXPECT_EQ(steps[0].input["amended_from"], call.arguments);
    return Status::Ok();
  });
  ASSERT_TRUE(read.ok()) << read.ToString();

  auto requeue = [&] {
    return store_->WriteSync(
        [&](Tx& tx) { return runs::Requeue(tx, tenant_, run.id, a.id, NowMillis()); });
  };
  ASSERT_TRUE(requeue().ok());
  EXPECT_EQ(Stored(run.id).status, "queued");
  EXPECT_EQ(SessionStatus(), "idle");
  const auto events = EventTypes(run.id);
  ASSERT_TRUE(requeue().ok());  // queued already: nothing more
  EXPECT_EQ(EventTypes(run.id), events);
  EXPECT_EQ(events.back(), "run.queued@v1");
}

TEST_P(RunStateTest, AStartedCallEndsSucceededOrFailedOnly) {
  store::Run run = NewRun(/*claim=*/true);
  auto proposed = Proposed(run, 1);  // no structured binding: lambdas capture these
  ToolCall call = proposed.first;
  Step step = proposed.second;
  const runs::Holder holder = runs::HolderOf(run);
  Status started = store_->WriteSync([&](Tx& tx) {
    return runs::StartCall(tx, holder, call, step, {{"outcome", "allow"}}, false, NowMillis());
  });
  ASSERT_TRUE(started.ok()) << started.ToString();
  ToolCall odd = call;
  Step odd_step = step;
  runs::Ended(odd, odd_step, "approved", Json::object(), NowMillis());
  Status refused =
      store_->WriteSync([&](Tx& tx) { return runs::EndCall(tx, holder, odd, odd_step); });
  EXPECT_EQ(refused.code(), Code::kInternal);
  runs::Ended(call, step, "succeeded", {{"ok", true}}, NowMillis());
  Status ended = store_->WriteSync([&](Tx& tx) { return runs::EndCall(tx, holder, call, step); });
  ASSERT_TRUE(ended.ok()) << ended.ToString();
  EXPECT_EQ(EventTypes(run.id),
            (std::vector<std::string>{"run.queued@v1", "run.started@v1", "tool.call.started@v1",
                                      "tool.call.completed@v1"}));
}

TEST_P(RunStateTest, ACancelStopsARunningRunAtItsBoundaryAndEndsAnyOtherAtOnce) {
  auto cancel = [&](const store::Run& run, int* withdrawn) -> Result<store::Run> {
    store::Run out;
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(out, runs::Cancel(tx, tenant_, run.id, NowMillis(),
                                              [&](Tx&, const store::Run&) {
                                                ++*withdrawn;
                                                return Status::Ok();
                                              }));
      return Status::Ok();
    });
    if (!st.ok()) return st;
    return out;
  };
  int withdrawn = 0;
  store::Run running = NewRun(/*claim=*/true);
  auto asked = cancel(running, &withdrawn);
  ASSERT_TRUE(asked.ok()) << asked.status().ToString();
  EXPECT_EQ(asked->status, "running");
  EXPECT_TRUE(asked->cancel_requested);
  const auto events = EventTypes(running.id);
  EXPECT_EQ(events.back(), "run.cancel_requested@v1");
  ASSERT_TRUE(cancel(running, &withdrawn).ok());  // asked already: nothing more
  EXPECT_EQ(EventTypes(running.id), events);
  EXPECT_EQ(withdrawn, 0);

  store::Run queued = NewRun();
  auto ended = cancel(queued, &withdrawn);
  ASSERT_TRUE(ended.ok()) << ended.status().ToString();
  EXPECT_EQ(ended->status, "cancelled");
  EXPECT_EQ(Stored(queued.id).status, "cancelled");
  EXPECT_EQ(withdrawn, 1);
  EXPECT_EQ(EventTypes(queued.id).back(), "run.cancelled@v1");
  EXPECT_EQ(cancel(queued, &withdrawn).status().code(), Code::kConflict);  // ended already
}

TEST_P(RunStateTest, AFinishedRunIsIdleWithItsOutcomeInItsEvent) {
  store::Run run = NewRun(/*claim=*/true);
  const Json usage = {{"input_tokens", 7}, {"output_tokens", 3}};
  const Json error = {{"code", "model_error"}, {"message", "down"}};
  Millis at = NowMillis();
  Status st = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(store::Run cur, runs::Held(tx, run));
    return runs::Finish(tx, cur, {"failed", "", error, usage}, at);
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  store::Run done = Stored(run.id);
  EXPECT_EQ(done.status, "failed");
  EXPECT_EQ(done.error, error);
  EXPECT_EQ(done.finished_at, at);
  EXPECT_EQ(done.lease_expires_at, 0);
  EXPECT_EQ(SessionStatus(), "idle");
  Status read = store_->Read([&](Tx& tx) -> Status {
    EventFilter f;
    f.run_id = run.id;
    KEEL_ASSIGN_OR_RETURN(auto events, tx.events().ReadEvents(tenant_, 0, f, 100));
    if (events.empty()) return Internal("no event");
    EXPECT_EQ(events.back().type, "run.failed@v1");
    // The ending's outcome, and the state it wrote (store/row_images.h): the run as stored,
    // the session idle.
    Json payload = events.back().payload;
    const Json rows = payload[store::kRowsField];
    payload.erase(store::kRowsField);
    EXPECT_EQ(payload, (Json{{"status", "failed"}, {"error", error}, {"usage", usage}}));
    EXPECT_EQ(rows["runs"], Json::array({*ParseJson(store::RunEndImage(done))}));
    EXPECT_EQ(rows["sessions"],
              Json::array({*ParseJson(store::SessionStatusImage(done.session_id, "idle", at))}));
    return Status::Ok();
  });
  ASSERT_TRUE(read.ok()) << read.ToString();
  // A run ends once: a second ending finds it no longer held.
  Status again = store_->WriteSync([&](Tx& tx) { return runs::Held(tx, run).status(); });
  EXPECT_EQ(again.code(), Code::kConflict);
  // And no transition invents an ending.
  store::Run other = NewRun(/*claim=*/true);
  Status odd = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(store::Run cur, runs::Held(tx, other));
    return runs::Finish(tx, cur, {"paused", "", Json(), Json::object()}, NowMillis());
  });
  EXPECT_EQ(odd.code(), Code::kInternal);
  EXPECT_EQ(Stored(other.id).status, "running");
}

// An ending needs no read of the run: the execution's own copy will do, and the ending's update
// checks that the execution still holds the run. When the lease ran out and another node took
// the run, or a cancel ended it meanwhile, the ending's unit fails whole: nothing it wrote beside
// (here an answer) is kept, and the run stays as the other execution left it.
TEST_P(RunStateTest, AnEndingFromTheExecutionsOwnCopyChecksItStillHoldsTheRun) {
  store::Run mine = NewRun(/*claim=*/true);
  // The lease runs out; node-b resumes the run (attempt 2).
  auto taken = Claim("node-b", NowMillis() + 2 * kLeaseMs, mine);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  auto end_with_answer = [&](const store::Run& copy, const std::string& answer) {
    return store_->WriteSync([&](Tx& tx) -> Status {
      store::Run cur = copy;
      store::Message reply;
      reply.id = NewId();
      reply.tenant_id = tenant_;
      reply.session_id = session_;
      reply.run_id = copy.id;
      reply.role = "assistant";
      reply.content = answer;
      reply.created_at = NowMillis();
      KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(reply));
      tx.Carry("messages", store::RowImage(reply));
      return runs::Finish(tx, cur, {"done", answer, Json(), Json::object()}, NowMillis());
    });
  };
  Status stale = end_with_answer(mine, "from the paused node");
  EXPECT_EQ(stale.code(), Code::kConflict) << stale.ToString();
  store::Run now = Stored(mine.id);
  EXPECT_EQ(now.status, "running");
  EXPECT_EQ(now.lease_owner, "node-b");
  EXPECT_EQ(now.attempt, 2);
  EXPECT_EQ(SessionStatus(), "running");
  std::vector<std::string> contents;
  ASSERT_TRUE(store_
                  ->Read([&](Tx& tx) -> Status {
                    KEEL_ASSIGN_OR_RETURN(auto page,
                                          tx.messages().ListMessages(tenant_, session_, {}));
                    for (const auto& m : page.items) contents.push_back(m.content);
                    return Status::Ok();
                  })
                  .ok());
  EXPECT_EQ(contents, std::vector<std::string>{});
  // The holder's own copy ends it, with its tokens; a second ending finds it ended.
  store::Run theirs = taken->run;
  theirs.input_tokens += 5;
  Status ended = end_with_answer(theirs, "from node-b");
  ASSERT_TRUE(ended.ok()) << ended.ToString();
  EXPECT_EQ(Stored(mine.id).status, "done");
  EXPECT_EQ(Stored(mine.id).input_tokens, theirs.input_tokens);
  EXPECT_EQ(Stored(mine.id).lease_expires_at, 0);
  EXPECT_EQ(end_with_answer(theirs, "twice").code(), Code::kConflict);
}

TEST_P(RunStateTest, ACancelledWaitingRunWithdrawsFirstAndLeavesItsSessionIdle) {
  store::Run run = NewRun(/*claim=*/true);
  Status parked = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(store::Run cur, runs::Held(tx, run));
    return runs::Park(tx, cur, "approval-1", NowMillis());
  });
  ASSERT_TRUE(parked.ok()) << parked.ToString();
  EXPECT_EQ(SessionStatus(), "awaiting_approval");
  std::string seen_status;
  Status st = store_->WriteSync([&](Tx& tx) -> Status {
    return runs::Cancel(tx, tenant_, run.id, NowMillis(), [&](Tx&, const store::Run& r) {
             seen_status = r.status;  // what it withdraws from: the run as it waited
             return Status::Ok();
           }).status();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(seen_status, "waiting_for_approval");
  EXPECT_EQ(Stored(run.id).status, "cancelled");
  EXPECT_EQ(SessionStatus(), "idle");
  // A withdrawal that fails leaves the run as it was.
  store::Run queued = NewRun();
  Status failed = store_->WriteSync([&](Tx& tx) -> Status {
    return runs::Cancel(tx, tenant_, queued.id, NowMillis(), [](Tx&, const store::Run&) {
             return Unavailable("the store failed");
           }).status();
  });
  EXPECT_EQ(failed.code(), Code::kUnavailable);
  EXPECT_EQ(Stored(queued.id).status, "queued");
}

KEEL_BACKENDS(RunState, RunStateTest);

}  // namespace
}  // namespace keel::store::test

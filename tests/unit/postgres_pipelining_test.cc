// What the PostgreSQL store leaves unanswered for a while, on a fresh database: a write that
// must change a row (PgSql::ExecChanging) still fails its unit, alone and among others in one
// transaction, with the code it would have returned at once; and a read's COMMIT, sent without
// waiting for its answer (Conn::CommitUnanswered), ends the transaction on the server at once,
// so no reader sits idle in a transaction holding its snapshot.
//
// Needs KEEL_TEST_PG_ADMIN_URL (`make test` sets it); skipped without it.

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hold_writer.h"
#include "keel/common/ids.h"
#include "keel/store/audit.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

class PostgresPipeliningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PgAdminUrl()) GTEST_SKIP() << kPgSkip;
    Status created = db_.Create();
    ASSERT_TRUE(created.ok()) << created.ToString();
    StoreOptions o;
    o.origin = "node-pipe";
    auto opened = OpenStore(db_.url(), o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
    tenant_ = Tenant{NewId(), "t", NowMillis()};
    agent_.id = NewId();
    agent_.tenant_id = tenant_.id;
    agent_.name = "a";
    agent_.model = "local";
    agent_.created_at = agent_.updated_at = NowMillis();
    session_ =
        Session{NewId(), tenant_.id, agent_.id, "idle", "s", NowMillis(), NowMillis(), "", ""};
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(tenant_));
      KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(agent_));
      return tx.sessions().InsertSession(session_);
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void TearDown() override { store_.reset(); }

  Message NewMessage(const std::string& content) {
    Message m;
    m.id = NewId();
    m.tenant_id = tenant_.id;
    m.session_id = session_.id;
    m.role = "user";
    m.content = content;
    m.created_at = NowMillis();
    return m;
  }

  // The session's messages' contents, in order.
  std::vector<std::string> Contents() {
    std::vector<std::string> out;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto page, tx.messages().ListMessages(tenant_.id, session_.id, {}));
      for (const auto& m : page.items) out.push_back(m.content);
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  std::shared_ptr<std::promise<void>> HoldWriter() { return store::HoldWriter(*store_); }

  PgTestDatabase db_;
  std::unique_ptr<Store> store_;
  Tenant tenant_;
  Agent agent_;
  Session session_;
};

// Three units in one transaction (a gate holds the writer until all are queued). Nothing in
// them reads, so the writer waits for the server only before COMMIT: there it finds that the
// middle unit updated a run that does not exist. That unit fails alone with the update's
// kNotFound, its message rolled back; the transaction is rolled back and the units around it
// run again and commit. When a unit reads after such a write, the answer comes within the unit:
// it is rolled back to its savepoint, and the others run once.
TEST_F(PostgresPipeliningTest, AWriteThatChangesNoRowFailsItsUnitAndOnlyItsUnit) {
  std::vector<std::future<Status>> ends;
  auto queue = [&](WriteFn fn) {
    auto done = std::make_shared<std::promise<Status>>();
    ends.push_back(done->get_future());
    store_->Write(std::move(fn), [done](Status st, std::vector<Event>) { done->set_value(st); });
  };
  store::Run missing;
  missing.id = NewId();
  missing.tenant_id = tenant_.id;
  missing.session_id = session_.id;
  missing.agent_id = agent_.id;
  missing.status = "running";
  // Each statement prepared once beforehand (preparing one waits for the server).
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.runs().UpdateRun(missing); }).code(),
            Code::kNotFound);
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(NewMessage("warm")));
                    return tx.sessions().GetSession(tenant_.id, session_.id).status();
                  })
                  .ok());

  auto gate = HoldWriter();
  const Message before = NewMessage("before"), lost = NewMessage("lost"),
                after = NewMessage("after");
  int before_runs = 0, after_runs = 0;
  queue([&](Tx& tx) {
    ++before_runs;
    return tx.messages().InsertMessage(before);
  });
  queue([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(lost));
    return tx.runs().UpdateRun(missing);  // answered before COMMIT, after the unit's release
  });
  queue([&](Tx& tx) {
    ++after_runs;
    return tx.messages().InsertMessage(after);
  });
  gate->set_value();
  std::vector<Status> got;
  for (auto& e : ends) got.push_back(e.get());
  EXPECT_TRUE(got[0].ok()) << got[0].ToString();
  EXPECT_EQ(got[1].code(), Code::kNotFound) << got[1].ToString();
  EXPECT_EQ(got[1].message(), "run not found: " + missing.id);
  EXPECT_TRUE(got[2].ok()) << got[2].ToString();
  EXPECT_EQ(Contents(), (std::vector<std::string>{"warm", "before", "after"}));
  EXPECT_EQ(before_runs, 2);
  EXPECT_EQ(after_runs, 2);

  // The same write, then a read in the unit: the read brings the count within the unit. Three
  // units, the middle one failing so; returns how many times the first and the last ran.
  auto fail_within = [&](const std::string& tag) {
    auto held = HoldWriter();
    ends.clear();
    before_runs = after_runs = 0;
    bool read_went_on = false;
    const Message b = NewMessage("before" + tag), l = NewMessage("lost" + tag),
                  a = NewMessage("after" + tag);
    queue([&](Tx& tx) {
      ++before_runs;
      return tx.messages().InsertMessage(b);
    });
    queue([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(l));
      KEEL_RETURN_IF_ERROR(tx.runs().UpdateRun(missing));
      KEEL_RETURN_IF_ERROR(tx.sessions().GetSession(tenant_.id, session_.id).status());
      read_went_on = true;  // the read does not fail: the unit carries on, and fails at its end
      return Status::Ok();
    });
    queue([&](Tx& tx) {
      ++after_runs;
      return tx.messages().InsertMessage(a);
    });
    held->set_value();
    got.clear();
    for (auto& e : ends) got.push_back(e.get());
    EXPECT_TRUE(got[0].ok()) << got[0].ToString();
    EXPECT_EQ(got[1].code(), Code::kNotFound) << got[1].ToString();
    EXPECT_TRUE(got[2].ok()) << got[2].ToString();
    EXPECT_TRUE(read_went_on);
    return std::make_pair(before_runs, after_runs);
  };
  // The transaction has no savepoints (none failed in a while), so the unit cannot be undone
  // alone: the transaction is rolled back, the unit fails alone, and the unit before it runs
  // again (the one after it had not run). Transactions take savepoints for a while after.
  EXPECT_EQ(fail_within("2"), std::make_pair(2, 1));
  EXPECT_EQ(Contents(), (std::vector<std::string>{"warm", "before", "after", "before2", "after2"}));
  // The same again, now with savepoints: the unit is rolled back to its savepoint, and the
  // units around it run once each.
  EXPECT_EQ(fail_within("3"), std::make_pair(1, 1));
  EXPECT_EQ(Contents(), (std::vector<std::string>{"warm", "before", "after", "before2", "after2",
                                                  "before3", "after3"}));

  // The same insert twice in one unit: the second meets the first's row, and the unit fails
  // with its conflict, alone in its transaction.
  Status twice = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(before));
    return Status::Ok();
  });
  EXPECT_EQ(twice.code(), Code::kConflict) << twice.ToString();
  EXPECT_EQ(Contents(), (std::vector<std::string>{"warm", "before", "after", "before2", "after2",
                                                  "before3", "after3"}));

  // A statement that fails on the server, in the middle unit of three: PostgreSQL skips
  // everything sent behind it; the failure, found before COMMIT, is that unit's alone, and the
  // units around it run again and commit.
  auto gate2 = HoldWriter();
  ends.clear();
  int first_runs = 0;
  const Message first = NewMessage("first"), conflicting = NewMessage("conflicting"),
                last = NewMessage("last");
  queue([&](Tx& tx) {
    ++first_runs;
    return tx.messages().InsertMessage(first);
  });
  // Not UTF-8: the server refuses the text (nothing above the store lets such text through).
  const Message refused = NewMessage("refused \xff");
  queue([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(conflicting));
    return tx.messages().InsertMessage(refused);
  });
  queue([&](Tx& tx) { return tx.messages().InsertMessage(last); });
  gate2->set_value();
  got.clear();
  for (auto& e : ends) got.push_back(e.get());
  EXPECT_TRUE(got[0].ok()) << got[0].ToString();
  EXPECT_FALSE(got[1].ok());
  EXPECT_EQ(got[1].code(), Code::kInvalidArgument) << got[1].ToString();
  EXPECT_NE(got[1].message().find("UTF8"), std::string::npos) << got[1].ToString();
  EXPECT_TRUE(got[2].ok()) << got[2].ToString();
  EXPECT_EQ(first_runs, 2);
  EXPECT_EQ(Contents(), (std::vector<std::string>{"warm", "before", "after", "before2", "after2",
                                                  "before3", "after3", "first", "last"}));
}

// A unit's events are held back and go out as one insert per tenant and origin at the unit's
// end, or before the unit next waits for the server: a read in the unit sees the events it
// appended, rows written for another tenant in between keep their own tenant (row security
// checks both), a failed unit's held events never reach the table, and positions stay gapless
// and in append order.
TEST_F(PostgresPipeliningTest, AUnitsHeldEventsAreInsertedTogetherAndSeenByItsOwnReads) {
  const Tenant other{NewId(), "other", NowMillis()};
  Agent other_agent = agent_;
  other_agent.id = NewId();
  other_agent.tenant_id = other.id;
  auto event = [](const Tenant& t, const std::string& n) {
    return NewEvent{t.id, "test.event@v1", "", "", "", Json{{"n", n}}};
  };
  int64_t seen_in_unit = -1;
  std::vector<Event> committed;
  Status st = store_->WriteSync(
      [&](Tx& tx) -> Status {
        KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(other));
        KEEL_RETURN_IF_ERROR(tx.events().Append(event(tenant_, "a1")));
        KEEL_RETURN_IF_ERROR(tx.events().Append(event(tenant_, "a2")));
        // Another tenant's row and event between this tenant's events.
        KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(other_agent));
        KEEL_RETURN_IF_ERROR(tx.events().Append(event(other, "b1")));
        // A read in the unit, bound to this tenant: the held events go out before it, the
        // other tenant's last, and the read still reads as this tenant.
        KEEL_ASSIGN_OR_RETURN(auto mine, tx.events().ReadEvents(tenant_.id, 0, {}, 100));
        seen_in_unit = static_cast<int64_t>(mine.size());
        KEEL_RETURN_IF_ERROR(tx.events().Append(event(tenant_, "a3")));
        return tx.messages().InsertMessage(NewMessage("after the read"));
      },
      &committed);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(seen_in_unit, 2);
  ASSERT_EQ(committed.size(), 4u);
  EXPECT_EQ(committed[0].position, 1);
  EXPECT_EQ(committed[1].position, 2);
  EXPECT_EQ(committed[2].position, 1);  // the other tenant's first
  EXPECT_EQ(committed[3].position, 3);
  EXPECT_EQ(committed[3].origin_seq, 3);
  EXPECT_EQ(Contents(), (std::vector<std::string>{"after the read"}));

  // A unit that appends and then fails: its events are not inserted, and the next unit's take
  // the positions it would have had.
  Status failed = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.events().Append(event(tenant_, "lost")));
    return InvalidArgument("the unit gives up");
  });
  EXPECT_EQ(failed.code(), Code::kInvalidArgument);
  committed.clear();
  st = store_->WriteSync([&](Tx& tx) { return tx.events().Append(event(tenant_, "a4")); },
                         &committed);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(committed.size(), 1u);
  EXPECT_EQ(committed[0].position, 4);
  std::vector<std::string> ns;
  st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto all, tx.events().ReadEvents(tenant_.id, 0, {}, 100));
    for (const auto& e : all) {
      if (e.type == "test.event@v1") ns.push_back(e.payload.value("n", ""));
    }
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ns, (std::vector<std::string>{"a1", "a2", "a3", "a4"}));
}

// Units released without waiting learn their events' positions only when the transaction's
// statements are answered, before COMMIT: each unit is still told its own, gapless and in
// queue order, and the audit chain's head names the last event with its origin_seq, so the
// chain verifies.
TEST_F(PostgresPipeliningTest, UnitsReleasedWithoutWaitingAreToldTheirPositionsAndKeepTheChain) {
  auto gate = HoldWriter();
  std::vector<std::future<std::vector<Event>>> told;
  for (int u = 0; u < 3; ++u) {
    auto done = std::make_shared<std::promise<std::vector<Event>>>();
    told.push_back(done->get_future());
    store_->Write(
        [this, u](Tx& tx) -> Status {
          for (int i = 0; i < 2; ++i) {
            KEEL_RETURN_IF_ERROR(tx.events().Append(
                NewEvent{tenant_.id, "test.event@v1", "", "", "", Json{{"n", u * 2 + i}}}));
          }
          return Status::Ok();
        },
        [done](Status st, std::vector<Event> events) {
          EXPECT_TRUE(st.ok()) << st.ToString();
          done->set_value(std::move(events));
        });
  }
  gate->set_value();
  std::vector<int64_t> positions, seqs;
  for (auto& f : told) {
    for (const Event& e : f.get()) {
      positions.push_back(e.position);
      seqs.push_back(e.origin_seq);
    }
  }
  // The fixture's setup appended none for the tenant.
  EXPECT_EQ(positions, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(seqs, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  std::vector<store::ChainReport> chains;
  ASSERT_TRUE(store_
                  ->Read([&](Tx& tx) -> Status {
                    KEEL_ASSIGN_OR_RETURN(chains, VerifyTenantChains(tx, "", tenant_.id));
                    return Status::Ok();
                  })
                  .ok());
  ASSERT_EQ(chains.size(), 1u);
  EXPECT_EQ(chains[0].events, 6);
  EXPECT_EQ(chains[0].status, "unsigned") << chains[0].problem;  // the store has no key
}

// After reads, no connection of the store's role is left idle in a transaction: each read's
// COMMIT reached the server, though nobody waited for its answer; and the pooled connections go
// on answering reads.
TEST_F(PostgresPipeliningTest, AReadsTransactionEndsOnTheServerWithoutAWaitForItsCommit) {
  for (int i = 0; i < 20; ++i) {
    Status st = store_->Read(
        [&](Tx& tx) { return tx.sessions().GetSession(tenant_.id, session_.id).status(); });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  PGconn* admin = PQconnectdb(PgAdminUrl());
  ASSERT_EQ(PQstatus(admin), CONNECTION_OK) << PQerrorMessage(admin);
  const std::string count = "SELECT count(*) FROM pg_stat_activity WHERE datname = '" + db_.name() +
                            "' AND state = 'idle in transaction'";
  std::string in_transaction;
  // The server runs each COMMIT as soon as it arrives; give the last one a moment to be seen.
  for (int i = 0; i < 50; ++i) {
    PGresult* r = PQexec(admin, count.c_str());
    in_transaction = PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0) : "<error>";
    PQclear(r);
    if (in_transaction == "0") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  PQfinish(admin);
  EXPECT_EQ(in_transaction, "0") << "a reader connection was left inside its transaction";
  EXPECT_EQ(Contents(), std::vector<std::string>{});
}

}  // namespace
}  // namespace keel::store

// The tenant write locks of the PostgreSQL store (docs/decisions/0014-postgres-tenant-write-
// locks.md), between two real stores ("nodes") on one fresh database: a tenant's writes wait
// for each other across the nodes and commit in position order, another tenant's do not wait,
// two nodes writing two tenants in opposite orders do not deadlock, and a unit that finds one of
// its tenants held runs again, whole, with all of them locked first.
//
// Needs KEEL_TEST_PG_ADMIN_URL (`make test` sets it); skipped without it.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hold_writer.h"
#include "keel/common/ids.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

using std::chrono::milliseconds;

// PostgreSQL ends a writer session idle in a transaction for 1 s (PostgresStore); a unit that
// holds its transaction open to let the test look stays well below that.
constexpr milliseconds kHold{700};

class PostgresWriteLocksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PgAdminUrl()) GTEST_SKIP() << kPgSkip;
    Status created = db_.Create();
    ASSERT_TRUE(created.ok()) << created.ToString();
    node1_ = Open("node-1");
    node2_ = Open("node-2");
    ASSERT_TRUE(node1_ && node2_);
    a_ = Tenant{NewId(), "a", NowMillis()};
    b_ = Tenant{NewId(), "b", NowMillis()};
    Status st = node1_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(a_));
      return tx.tenants().InsertTenant(b_);
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void TearDown() override {
    node1_.reset();
    node2_.reset();
  }

  std::unique_ptr<Store> Open(const std::string& origin) {
    StoreOptions o;
    o.origin = origin;
    auto opened = OpenStore(db_.url(), o);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    return opened.ok() ? std::move(opened).value() : nullptr;
  }

  static Status Note(Tx& tx, const Tenant& t, const std::string& what) {
    return tx.events().Append({t.id, "test.note@v1", "", "", "", {{"what", what}}});
  }

  // The tenant's events in position order, as "<origin> <what>".
  std::vector<std::string> Notes(const Tenant& t) {
    std::vector<std::string> out;
    Status st = node1_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto events, tx.events().ReadEvents(t.id, 0, {}, 1000));
      int64_t expected = 0;
      for (const auto& e : events) {
        EXPECT_EQ(e.position, ++expected) << "positions of tenant " << t.name << " have a gap";
        if (e.type == "test.note@v1") out.push_back(e.origin + " " + e.payload.value("what", ""));
      }
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  // Queues on `node` a unit that writes a note of `t`, reads (so that its lock is taken
  // before it says so), says `holding`, and keeps its transaction open until `release` or
  // kHold. Returns when the unit ended.
  std::future<Status> Hold(Store& node, const Tenant& t, std::promise<void>& holding,
                           std::shared_future<void> release) {
    auto done = std::make_shared<std::promise<Status>>();
    auto said = std::make_shared<bool>(false);
    node.Write(
        [&, t, release, said](Tx& tx) -> Status {
          KEEL_RETURN_IF_ERROR(Note(tx, t, "held"));
          KEEL_RETURN_IF_ERROR(tx.tenants().GetTenant(t.id).status());
          if (!*said) holding.set_value();
          *said = true;
          release.wait_for(kHold);
          return Status::Ok();
        },
        [done](Status st, std::vector<Event>) { done->set_value(st); });
    return done->get_future();
  }

  PgTestDatabase db_;
  std::unique_ptr<Store> node1_, node2_;
  Tenant a_, b_;
};

// While node 1 holds tenant A's lock, node 2 writes tenant B at once; its write of A waits,
// and commits after node 1's, with the next position.
TEST_F(PostgresWriteLocksTest, OneTenantsWritesWaitForEachOtherAndNotForAnotherTenants) {
  std::promise<void> holding, released;
  std::shared_future<void> release = released.get_future().share();
  std::future<Status> held = Hold(*node1_, a_, holding, release);
  holding.get_future().wait();

  Status b = node2_->WriteSync([&](Tx& tx) { return Note(tx, b_, "b while a held"); });
  EXPECT_TRUE(b.ok()) << b.ToString();
  const bool b_while_held = release.wait_for(milliseconds(0)) != std::future_status::ready &&
                            held.wait_for(milliseconds(0)) != std::future_status::ready;
  EXPECT_TRUE(b_while_held) << "tenant B's write waited for node 1's transaction of tenant A";

  auto a_done = std::make_shared<std::promise<Status>>();
  std::future<Status> a = a_done->get_future();
  node2_->Write([&](Tx& tx) { return Note(tx, a_, "a after"); },
                [a_done](Status st, std::vector<Event>) { a_done->set_value(st); });
  EXPECT_EQ(a.wait_for(milliseconds(200)), std::future_status::timeout)
      << "node 2 wrote tenant A while node 1 held its lock";
  released.set_value();
  EXPECT_TRUE(held.get().ok());
  Status after = a.get();
  EXPECT_TRUE(after.ok()) << after.ToString();

  EXPECT_EQ(Notes(a_), (std::vector<std::string>{"node-1 held", "node-2 a after"}));
  EXPECT_EQ(Notes(b_), (std::vector<std::string>{"node-2 b while a held"}));
}

// Each node commits one batch of two units, one node A then B, the other B then A, and each
// holds its first tenant until the other node holds its own: waiting for the second lock
// while holding the first would deadlock them (PostgreSQL would abort one). Neither may fail,
// and each tenant's positions stay gapless. Then both nodes queue many such units at once.
TEST_F(PostgresWriteLocksTest, TwoNodesWritingTwoTenantsInOppositeOrdersNeverDeadlock) {
  std::atomic<int> holding{0};
  std::atomic<int> failed{0};
  std::mutex mu;
  std::string first_failure;
  auto count = [&](Status st) {
    if (st.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (failed++ == 0) first_failure = st.ToString();
  };
  std::vector<std::future<Status>> ends;
  for (Store* node : {node1_.get(), node2_.get()}) {
    const Tenant& first = node == node1_.get() ? a_ : b_;
    const Tenant& second = node == node1_.get() ? b_ : a_;
    // A unit that holds the writer until both units behind it are queued, so that they share a
    // batch.
    auto gate = std::make_shared<std::promise<void>>();
    std::shared_future<void> open = gate->get_future().share();
    node->Write(
        [open](Tx&) -> Status {
          open.wait_for(kHold);
          return Status::Ok();
        },
        [&](Status st, std::vector<Event>) { count(st); });
    node->Write(
        [&, first, said = std::make_shared<bool>(false)](Tx& tx) -> Status {
          KEEL_RETURN_IF_ERROR(Note(tx, first, "first"));
          KEEL_RETURN_IF_ERROR(tx.tenants().GetTenant(first.id).status());  // its lock is held
          if (!*said) ++holding;
          *said = true;
          for (int i = 0; i < 100 && holding.load() < 2; ++i) {
            std::this_thread::sleep_for(milliseconds(5));
          }
          return Status::Ok();
        },
        [&](Status st, std::vector<Event>) { count(st); });
    auto end = std::make_shared<std::promise<Status>>();
    ends.push_back(end->get_future());
    node->Write([&, second](Tx& tx) { return Note(tx, second, "second"); },
                [&, end](Status st, std::vector<Event>) {
                  count(st);
                  end->set_value(st);
                });
    gate->set_value();
  }
  for (auto& e : ends) e.wait();
  EXPECT_EQ(holding.load(), 2) << "the two nodes did not hold their first tenants at once";
  EXPECT_EQ(failed.load(), 0) << first_failure;

  constexpr int kUnits = 300;
  std::vector<std::future<void>> all;
  for (Store* node : {node1_.get(), node2_.get()}) {
    auto finished = std::make_shared<std::promise<void>>();
    all.push_back(finished->get_future());
    auto left = std::make_shared<std::atomic<int>>(kUnits);
    for (int i = 0; i < kUnits; ++i) {
      const Tenant& t = (node == node1_.get()) == (i % 2 == 0) ? a_ : b_;
      node->Write([&, t, i](Tx& tx) { return Note(tx, t, std::to_string(i)); },
                  [&, left, finished](Status st, std::vector<Event>) {
                    count(st);
                    if (--*left == 0) finished->set_value();
                  });
    }
  }
  for (auto& e : all) e.wait();
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_EQ(Notes(a_).size() + Notes(b_).size(), 2u * kUnits + 4u);
}

// A unit of two tenants whose second is held by another node rolls back, runs again first in
// a new transaction that takes both locks before anything else, and writes once.
TEST_F(PostgresWriteLocksTest, AUnitThatFindsATenantHeldRunsAgainWithAllItsTenantsLocked) {
  std::promise<void> holding, released;
  std::shared_future<void> release = released.get_future().share();
  std::future<Status> held = Hold(*node2_, b_, holding, release);
  holding.get_future().wait();

  std::atomic<int> runs{0};
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> both = done->get_future();
  node1_->Write(
      [&](Tx& tx) -> Status {
        ++runs;
        KEEL_RETURN_IF_ERROR(Note(tx, a_, "both"));
        KEEL_RETURN_IF_ERROR(tx.tenants().GetTenant(a_.id).status());
        return Note(tx, b_, "both");
      },
      [done](Status st, std::vector<Event>) { done->set_value(st); });
  EXPECT_EQ(both.wait_for(milliseconds(200)), std::future_status::timeout)
      << "node 1 wrote tenant B while node 2 held its lock";
  released.set_value();
  EXPECT_TRUE(held.get().ok());
  Status st = both.get();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(runs.load(), 2) << "once refused at B, once with A and B locked first";
  EXPECT_EQ(Notes(a_), (std::vector<std::string>{"node-1 both"}));
  EXPECT_EQ(Notes(b_), (std::vector<std::string>{"node-2 held", "node-1 both"}));
}

// The same in a transaction of two units, which has no savepoints: the unit that finds tenant
// B held cannot be rolled back alone, so the transaction is; that unit runs again first with A
// and B locked, and the unit before it runs again after it. Each writes once.
TEST_F(PostgresWriteLocksTest, InATransactionWithoutSavepointsTheOthersRunAgainToo) {
  std::promise<void> holding, released;
  std::shared_future<void> release = released.get_future().share();
  std::future<Status> held = Hold(*node2_, b_, holding, release);
  holding.get_future().wait();

  // Node 1's writer waits in a unit until both units below are queued: they share the next
  // transaction.
  auto gate = HoldWriter(*node1_, kHold);
  std::atomic<int> one_runs{0}, both_runs{0};
  auto one_done = std::make_shared<std::promise<Status>>();
  auto both_done = std::make_shared<std::promise<Status>>();
  std::future<Status> one = one_done->get_future(), both = both_done->get_future();
  node1_->Write(
      [&](Tx& tx) -> Status {
        ++one_runs;
        return Note(tx, a_, "one");
      },
      [one_done](Status st, std::vector<Event>) { one_done->set_value(st); });
  node1_->Write(
      [&](Tx& tx) -> Status {
        ++both_runs;
        KEEL_RETURN_IF_ERROR(Note(tx, a_, "both"));
        KEEL_RETURN_IF_ERROR(tx.tenants().GetTenant(a_.id).status());
        return Note(tx, b_, "both");
      },
      [both_done](Status st, std::vector<Event>) { both_done->set_value(st); });
  gate->set_value();
  EXPECT_EQ(both.wait_for(milliseconds(200)), std::future_status::timeout)
      << "node 1 wrote tenant B while node 2 held its lock";
  released.set_value();
  EXPECT_TRUE(held.get().ok());
  Status st = both.get();
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = one.get();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(both_runs.load(), 2) << "once refused at B, once with A and B locked first";
  EXPECT_EQ(one_runs.load(), 2) << "rolled back with the other, then again after it";
  EXPECT_EQ(Notes(a_), (std::vector<std::string>{"node-1 both", "node-1 one"}));
  EXPECT_EQ(Notes(b_), (std::vector<std::string>{"node-2 held", "node-1 both"}));
}

}  // namespace
}  // namespace keel::store

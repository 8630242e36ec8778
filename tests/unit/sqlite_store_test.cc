#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <set>
#include <thread>

#include "keel/common/ids.h"
#include "keel/store/store.h"

namespace keel::store {
namespace {

class SqliteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("keel-store-" + NewId());
    std::filesystem::create_directories(dir_);
    Open();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Open() {
    store_.reset();
    StoreOptions o;
    o.origin = "node-a";
    auto s = OpenStore("sqlite://" + (dir_ / "keel.db").string(), o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }
  Tenant MakeTenant() {
    Tenant t{NewId(), "t", NowMillis()};
    EXPECT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.tenants().InsertTenant(t); }).ok());
    return t;
  }
  Agent MakeAgent(const Tenant& t, const std::string& name) {
    Agent a;
    a.id = NewId();
    a.tenant_id = t.id;
    a.name = name;
    a.model = "local";
    a.created_at = a.updated_at = NowMillis();
    Status st = store_->WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(a); });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return a;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(SqliteStoreTest, AppendAssignsGaplessOriginSeqAndIncreasingPositions) {
  Tenant t = MakeTenant();
  for (int i = 0; i < 10; ++i) {
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "x.happened@v1", "", "", "", {{"i", i}}}));
      // A failing unit in between must not leave a gap.
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok());
    Status bad = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "x.rolled_back@v1", "", "", "", {}}));
      return Conflict("roll me back");
    });
    ASSERT_EQ(bad.code(), Code::kConflict);
  }
  std::vector<Event> events;
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(events, tx.events().ReadEvents(t.id, 0, {}, 100));
    return Status::Ok();
  }).ok());
  ASSERT_EQ(events.size(), 10u);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].origin, "node-a");
    EXPECT_EQ(events[i].origin_seq, static_cast<int64_t>(i + 1));
    EXPECT_EQ(events[i].type, "x.happened@v1");
    if (i > 0) {
      EXPECT_GT(events[i].position, events[i - 1].position);
    }
  }
}

TEST_F(SqliteStoreTest, FailedUnitRollsBackOnlyItselfWithinABatch) {
  Tenant t = MakeTenant();
  constexpr int kUnits = 200;
  std::vector<std::promise<Status>> done(kUnits);
  for (int i = 0; i < kUnits; ++i) {
    store_->Write(
        [&, i](Tx& tx) -> Status {
          Agent a;
          a.id = NewId();
          a.tenant_id = t.id;
          a.name = "agent-" + std::to_string(i % 2 == 0 ? i : 0);  // odd units collide on a name
          a.model = "local";
          KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
          return tx.events().Append({t.id, "agent.created@v1", a.id, "", "", {}});
        },
        [&done, i](Status s, std::vector<Event>) { done[i].set_value(s); });
  }
  int ok = 0, conflicts = 0;
  for (auto& d : done) {
    Status s = d.get_future().get();
    if (s.ok()) {
      ++ok;
    } else if (s.code() == Code::kConflict) {
      ++conflicts;
    }
  }
  EXPECT_EQ(ok, kUnits / 2);  // the even ones, agent-0 included
  EXPECT_EQ(conflicts, kUnits / 2);
  Paged<Agent> page;
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(page, tx.agents().ListAgents(t.id, {"", 500}));
    return Status::Ok();
  }).ok());
  EXPECT_EQ(page.items.size(), static_cast<size_t>(kUnits / 2));
  // Group commit: far fewer fsyncs than units.
  auto stats = store_->stats();
  EXPECT_EQ(stats.failed_units, kUnits / 2);
  EXPECT_LT(stats.commits, stats.units);
}

TEST_F(SqliteStoreTest, PaginationReturnsEveryItemOnce) {
  Tenant t = MakeTenant();
  for (int i = 0; i < 23; ++i) MakeAgent(t, "a" + std::to_string(i));
  std::set<std::string> seen;
  std::string cursor;
  int pages = 0;
  do {
    Paged<Agent> page;
    ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(page, tx.agents().ListAgents(t.id, {cursor, 5}));
      return Status::Ok();
    }).ok());
    for (const auto& a : page.items) EXPECT_TRUE(seen.insert(a.id).second);
    cursor = page.next_cursor;
    ++pages;
  } while (!cursor.empty());
  EXPECT_EQ(seen.size(), 23u);
  EXPECT_EQ(pages, 5);
}

TEST_F(SqliteStoreTest, TenantsDoNotSeeEachOther) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  Agent agent = MakeAgent(a, "mine");
  Status st = store_->Read([&](Tx& tx) -> Status {
    EXPECT_TRUE(tx.agents().GetAgent(a.id, agent.id).ok());
    EXPECT_EQ(tx.agents().GetAgent(b.id, agent.id).status().code(), Code::kNotFound);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok());
  // The same name is free in another tenant, taken in the same one.
  MakeAgent(b, "mine");
  Agent dup;
  dup.id = NewId();
  dup.tenant_id = a.id;
  dup.name = "mine";
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(dup); }).code(),
            Code::kConflict);
}

TEST_F(SqliteStoreTest, ReopenKeepsDataAndContinuesTheSequence) {
  Tenant t = MakeTenant();
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.events().Append({t.id, "a@v1", "", "", "", {}});
  }).ok());
  Open();
  std::vector<Event> appended;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.events().Append({t.id, "b@v1", "", "", "", {}});
  }, &appended).ok());
  ASSERT_EQ(appended.size(), 1u);
  EXPECT_EQ(appended[0].origin_seq, 2);
}

TEST_F(SqliteStoreTest, ClaimableRunsAreSerialPerSession) {
  Tenant t = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  Session s1{NewId(), t.id, agent.id, "idle", "", 0, 0};
  Session s2{NewId(), t.id, agent.id, "idle", "", 0, 0};
  std::vector<store::Run> runs;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s1));
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s2));
    for (const auto* s : {&s1, &s1, &s2}) {
      store::Run r;
      r.id = NewId();
      r.tenant_id = t.id;
      r.session_id = s->id;
      r.agent_id = agent.id;
      KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(r));
      runs.push_back(r);
    }
    return Status::Ok();
  }).ok());
  std::vector<store::Run> claimable;
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(claimable, tx.runs().ClaimableRuns(NowMillis(), 10));
    return Status::Ok();
  }).ok());
  ASSERT_EQ(claimable.size(), 2u);  // the first of s1 and the one of s2
  EXPECT_EQ(claimable[0].id, runs[0].id);
  EXPECT_EQ(claimable[1].id, runs[2].id);
}

TEST(StoreUrlTest, RejectsUnknownSchemes) {
  StoreOptions o;
  o.origin = "x";
  EXPECT_EQ(OpenStore("mysql://x", o).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(OpenStore("sqlite://", o).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace keel::store

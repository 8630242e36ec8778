// Conformance of the model router's storage port (store/usage_store.h): every case runs against
// each backend (`Conformance/UsageStoreTest.<Case>/sqlite` and `.../postgres`). The PostgreSQL
// cases need KEEL_TEST_PG_ADMIN_URL (see store_conformance_test.cc) and skip without it.

#include "keel/store/usage_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>

#include "hold_writer.h"
#include "keel/common/ids.h"
#include "keel/model/metering.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

enum class Backend { kSqlite, kPostgres };
std::string BackendName(Backend b) { return b == Backend::kSqlite ? "sqlite" : "postgres"; }

// 2026-03-31T23:00:00Z and the next day, in another month.
constexpr Millis kMarch31 = 1774998000000;
constexpr Millis kApril1 = kMarch31 + 3600 * 1000;

class UsageStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kPostgres) {
      if (!PgAdminUrl()) GTEST_SKIP() << kPgSkip;
      Status st = pg_.Create();
      ASSERT_TRUE(st.ok()) << st.ToString();
      url_ = pg_.url();
    } else {
      dir_ = std::filesystem::temp_directory_path() / ("keel-usage-" + NewId());
      std::filesystem::create_directories(dir_);
      url_ = "sqlite://" + (dir_ / "keel.db").string();
    }
    StoreOptions o;
    o.origin = "node-a";
    auto opened = OpenStore(url_, o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
    tenant_ = MakeTenant();
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::string MakeTenant() {
    Tenant t{NewId(), "t", NowMillis()};
    Status st = store_->WriteSync([&](Tx& tx) { return tx.tenants().InsertTenant(t); });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return t.id;
  }

  UsageRecord Usage(const std::string& agent, const std::string& run, Millis at, int64_t cost,
                    bool cached = false) {
    UsageRecord u;
    u.id = NewId();
    u.tenant_id = tenant_;
    u.agent_id = agent;
    u.run_id = run;
    u.step_id = NewId();
    u.model = "openai/m";
    u.input_tokens = 100;
    u.output_tokens = 10;
    u.cost_micros = cached ? 0 : cost;
    u.saved_micros = cached ? cost : 0;
    u.cached = cached;
    u.created_at = at;
    return u;
  }

  Status Write(const std::function<Status(Tx&)>& fn) { return store_->WriteSync(fn); }

  template <typename T>
  T Read(const std::function<Result<T>(Tx&)>& fn) {
    T out{};
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(out, fn(tx));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  UsageTotals Period(const std::string& tenant, const std::string& agent, const char* period,
                     Millis at) {
    return Read<UsageTotals>([&](Tx& tx) {
      return tx.usage().PeriodUsage(tenant, agent, period, model::PeriodStart(period, at));
    });
  }

  std::filesystem::path dir_;
  PgTestDatabase pg_;
  std::string url_;
  std::unique_ptr<Store> store_;
  std::string tenant_;
};

INSTANTIATE_TEST_SUITE_P(Conformance, UsageStoreTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

TEST_P(UsageStoreTest, UsageAddsUpPerRunAgentTenantDayAndMonth) {
  std::vector<UsageRecord> records = {
      Usage("agent-a", "run-1", kMarch31, 1000),
      Usage("agent-a", "run-1", kMarch31 + 1, 500, /*cached=*/true),
      Usage("agent-b", "run-2", kMarch31 + 2, 300),
      Usage("agent-a", "run-3", kApril1, 7),
  };
  for (const auto& u : records) {
    ASSERT_TRUE(Write([&](Tx& tx) { return tx.usage().InsertUsage(u); }).ok());
  }
  auto run1 = Read<UsageTotals>([&](Tx& tx) { return tx.usage().RunUsage(tenant_, "run-1"); });
  EXPECT_EQ(run1.calls, 2);
  EXPECT_EQ(run1.cached_calls, 1);
  EXPECT_EQ(run1.input_tokens, 200);
  EXPECT_EQ(run1.output_tokens, 20);
  EXPECT_EQ(run1.cost_micros, 1000);
  EXPECT_EQ(run1.saved_micros, 500);
  auto none = Read<UsageTotals>([&](Tx& tx) { return tx.usage().RunUsage(tenant_, "run-9"); });
  EXPECT_EQ(none.calls, 0);
  EXPECT_EQ(none.cost_micros, 0);

  // March 31 (UTC) and April 1 are different days and months.
  auto a_day = Period(tenant_, "agent-a", "day", kMarch31);
  EXPECT_EQ(a_day.calls, 2);
  EXPECT_EQ(a_day.cost_micros, 1000);
  EXPECT_EQ(a_day.saved_micros, 500);
  EXPECT_EQ(Period(tenant_, "", "day", kMarch31).cost_micros, 1300);
  EXPECT_EQ(Period(tenant_, "", "month", kMarch31).calls, 3);
  EXPECT_EQ(Period(tenant_, "agent-a", "month", kApril1).cost_micros, 7);
  EXPECT_EQ(Period(tenant_, "", "day", kApril1).calls, 1);

  auto by_agent = Read<std::vector<AgentUsage>>([&](Tx& tx) {
    return tx.usage().PeriodUsageByAgent(tenant_, "month", model::PeriodStart("month", kMarch31));
  });
  ASSERT_EQ(by_agent.size(), 2u);
  EXPECT_EQ(by_agent[0].agent_id, "agent-a");
  EXPECT_EQ(by_agent[0].totals.cost_micros, 1000);
  EXPECT_EQ(by_agent[1].agent_id, "agent-b");
  EXPECT_EQ(by_agent[1].totals.calls, 1);

  // Another tenant sees none of it.
  std::string other = MakeTenant();
  EXPECT_EQ(Period(other, "", "day", kMarch31).calls, 0);
  EXPECT_EQ(Read<UsageTotals>([&](Tx& tx) { return tx.usage().RunUsage(other, "run-1"); }).calls,
            0);

  // The same record twice is a conflict, and a failed unit adds nothing to the totals.
  Status again = Write([&](Tx& tx) { return tx.usage().InsertUsage(records[0]); });
  EXPECT_EQ(again.code(), Code::kConflict) << again.ToString();
  EXPECT_EQ(Period(tenant_, "", "day", kMarch31).cost_micros, 1300);
}

// The totals rows are written once per transaction, from the additions of the units that
// committed in it. Four units share a transaction: one fails within itself after adding its
// call, one adds its call and then updates a run that does not exist (on PostgreSQL that answer
// comes only before COMMIT, so the transaction is rolled back and the others run again). The
// totals hold the two calls that committed, once each.
TEST_P(UsageStoreTest, OnlyCommittedCallsReachTheTotalsOnceEach) {
  store::Run missing;
  missing.id = NewId();
  missing.tenant_id = tenant_;
  missing.status = "running";
  // Each statement prepared once beforehand (on PostgreSQL, preparing one waits for the server).
  EXPECT_EQ(Write([&](Tx& tx) { return tx.runs().UpdateRun(missing); }).code(), Code::kNotFound);
  ASSERT_TRUE(Write([&](Tx& tx) {
                return tx.usage().InsertUsage(Usage("agent-w", "run-w", kApril1, 1));
              }).ok());

  std::vector<std::future<Status>> ends;
  auto queue = [&](WriteFn fn) {
    auto done = std::make_shared<std::promise<Status>>();
    ends.push_back(done->get_future());
    store_->Write(std::move(fn), [done](Status st, std::vector<Event>) { done->set_value(st); });
  };
  int first_runs = 0;
  auto gate = HoldWriter(*store_);
  queue([&](Tx& tx) {
    ++first_runs;
    return tx.usage().InsertUsage(Usage("agent-a", "run-1", kMarch31, 1000));
  });
  queue([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.usage().InsertUsage(Usage("agent-a", "run-2", kMarch31, 20000)));
    return Internal("refused after its call");
  });
  queue([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.usage().InsertUsage(Usage("agent-a", "run-3", kMarch31, 300000)));
    return tx.runs().UpdateRun(missing);
  });
  queue([&](Tx& tx) {
    return tx.usage().InsertUsage(Usage("agent-b", "run-4", kMarch31, 4000000, true));
  });
  gate->set_value();
  std::vector<Status> got;
  for (auto& e : ends) got.push_back(e.get());
  EXPECT_TRUE(got[0].ok()) << got[0].ToString();
  EXPECT_EQ(got[1].code(), Code::kInternal) << got[1].ToString();
  EXPECT_EQ(got[2].code(), Code::kNotFound) << got[2].ToString();
  EXPECT_TRUE(got[3].ok()) << got[3].ToString();
  EXPECT_GE(first_runs, 1);

  UsageTotals tenant_day = Period(tenant_, "", "day", kMarch31);
  EXPECT_EQ(tenant_day.calls, 2);
  EXPECT_EQ(tenant_day.cached_calls, 1);
  EXPECT_EQ(tenant_day.input_tokens, 200);
  EXPECT_EQ(tenant_day.cost_micros, 1000);
  EXPECT_EQ(tenant_day.saved_micros, 4000000);
  EXPECT_EQ(Period(tenant_, "", "month", kMarch31).cost_micros, 1000);
  EXPECT_EQ(Period(tenant_, "agent-a", "day", kMarch31).calls, 1);
  EXPECT_EQ(Period(tenant_, "agent-a", "month", kMarch31).cost_micros, 1000);
  EXPECT_EQ(Period(tenant_, "agent-b", "month", kMarch31).saved_micros, 4000000);
  // The warm-up's call, on another day and month, is apart.
  EXPECT_EQ(Period(tenant_, "", "day", kApril1).calls, 1);
}

// A provider may report any token count: sums that would pass 2^63 stop there instead of
// failing the transaction, whose other units (here another tenant's) commit.
TEST_P(UsageStoreTest, TotalsStopAtTheLargestCountAndFailNothing) {
  const std::string other = MakeTenant();
  const int64_t max = std::numeric_limits<int64_t>::max();
  UsageRecord huge = Usage("agent-a", "run-1", kMarch31, max - 5);
  huge.input_tokens = max;
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.usage().InsertUsage(huge); }).ok());
  std::vector<std::future<Status>> ends;
  auto gate = HoldWriter(*store_);
  for (int i = 0; i < 2; ++i) {
    UsageRecord more = Usage("agent-a", "run-" + std::to_string(i + 2), kMarch31, max - 5);
    more.input_tokens = max;
    auto done = std::make_shared<std::promise<Status>>();
    ends.push_back(done->get_future());
    store_->Write([more](Tx& tx) { return tx.usage().InsertUsage(more); },
                  [done](Status st, std::vector<Event>) { done->set_value(st); });
  }
  UsageRecord theirs = Usage("agent-b", "run-9", kMarch31, 7);
  theirs.tenant_id = other;
  auto done = std::make_shared<std::promise<Status>>();
  ends.push_back(done->get_future());
  store_->Write([theirs](Tx& tx) { return tx.usage().InsertUsage(theirs); },
                [done](Status st, std::vector<Event>) { done->set_value(st); });
  gate->set_value();
  for (auto& e : ends) EXPECT_TRUE(e.get().ok());
  UsageTotals mine = Period(tenant_, "", "day", kMarch31);
  EXPECT_EQ(mine.calls, 3);
  EXPECT_EQ(mine.input_tokens, max);
  EXPECT_EQ(mine.cost_micros, max);
  EXPECT_EQ(Period(other, "", "day", kMarch31).cost_micros, 7);
}

TEST_P(UsageStoreTest, BudgetsArePutReplacedListedAndDeleted) {
  Budget day{tenant_, "tenant", "day", 5000000, 100, 100};
  Budget month{tenant_, "agent-a", "month", 1, 200, 200};
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.usage().PutBudget(day); }).ok());
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.usage().PutBudget(month); }).ok());
  Budget raised = day;
  raised.limit_micros = 9000000;
  raised.created_at = raised.updated_at = 300;
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.usage().PutBudget(raised); }).ok());

  auto list = Read<std::vector<Budget>>([&](Tx& tx) { return tx.usage().ListBudgets(tenant_); });
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].scope, "agent-a");  // by scope
  EXPECT_EQ(list[1].scope, "tenant");
  EXPECT_EQ(list[1].limit_micros, 9000000);
  EXPECT_EQ(list[1].created_at, 100);  // kept on replace
  EXPECT_EQ(list[1].updated_at, 300);

  std::string other = MakeTenant();
  EXPECT_TRUE(
      Read<std::vector<Budget>>([&](Tx& tx) { return tx.usage().ListBudgets(other); }).empty());
  Status foreign = Write([&](Tx& tx) { return tx.usage().DeleteBudget(other, "tenant", "day"); });
  EXPECT_EQ(foreign.code(), Code::kNotFound);

  ASSERT_TRUE(
      Write([&](Tx& tx) { return tx.usage().DeleteBudget(tenant_, "tenant", "day"); }).ok());
  Status gone = Write([&](Tx& tx) { return tx.usage().DeleteBudget(tenant_, "tenant", "day"); });
  EXPECT_EQ(gone.code(), Code::kNotFound);
  EXPECT_NE(gone.message().find("day budget"), std::string::npos) << gone.message();
  EXPECT_EQ(
      Read<std::vector<Budget>>([&](Tx& tx) { return tx.usage().ListBudgets(tenant_); }).size(),
      1u);
}

TEST_P(UsageStoreTest, CacheEntriesAreScopedExpireAndArePruned) {
  auto entry = [&](const std::string& group, const std::string& key, Millis at) {
    CacheEntry e;
    e.tenant_id = tenant_;
    e.cache_group = group;
    e.key = key;
    e.model = "local";
    e.response = {{"text", "answer " + key}, {"tool_calls", Json::array()}};
    e.input_tokens = 3;
    e.output_tokens = 2;
    e.created_at = at;
    return e;
  };
  auto get = [&](const std::string& tenant, const std::string& group, const std::string& key,
                 Millis not_before) {
    return Read<std::optional<CacheEntry>>(
        [&](Tx& tx) { return tx.usage().GetCacheEntry(tenant, group, key, not_before); });
  };
  for (const auto& e :
       {entry("g1", "k1", 1000), entry("g1", "k2", 2000), entry("g2", "k1", 3000)}) {
    ASSERT_TRUE(Write([&](Tx& tx) { return tx.usage().PutCacheEntry(e); }).ok());
  }
  auto hit = get(tenant_, "g1", "k1", 0);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->response["text"], "answer k1");
  EXPECT_EQ(hit->input_tokens, 3);
  EXPECT_EQ(hit->created_at, 1000);
  EXPECT_FALSE(get(tenant_, "g1", "k1", 1001).has_value());    // too old
  EXPECT_FALSE(get(tenant_, "g3", "k1", 0).has_value());       // another group
  EXPECT_FALSE(get(MakeTenant(), "g1", "k1", 0).has_value());  // another tenant

  // Putting the same key replaces the entry.
  CacheEntry newer = entry("g1", "k1", 4000);
  newer.response["text"] = "fresher";
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.usage().PutCacheEntry(newer); }).ok());
  EXPECT_EQ(get(tenant_, "g1", "k1", 3500)->response["text"], "fresher");

  // Prune: k2 (2000) is expired; of the other two, only the newest is kept.
  int64_t deleted = -1;
  ASSERT_TRUE(Write([&](Tx& tx) -> Status {
                KEEL_ASSIGN_OR_RETURN(deleted, tx.usage().PruneCache(2500, 1));
                return Status::Ok();
              }).ok());
  EXPECT_EQ(deleted, 2);
  EXPECT_TRUE(get(tenant_, "g1", "k1", 0).has_value());
  EXPECT_FALSE(get(tenant_, "g1", "k2", 0).has_value());
  EXPECT_FALSE(get(tenant_, "g2", "k1", 0).has_value());
}

}  // namespace
}  // namespace keel::store

// ScheduleStore conformance: every case runs against both backends
// (`Conformance/ScheduleStoreTest.<Case>/sqlite` and `.../postgres`; the PostgreSQL cases skip
// without KEEL_TEST_PG_ADMIN_URL, see store_conformance_test.cc).

#include "keel/store/schedule_store.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "keel/common/ids.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

enum class Backend { kSqlite, kPostgres };

std::string BackendName(Backend b) { return b == Backend::kSqlite ? "sqlite" : "postgres"; }

class ScheduleStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kPostgres) {
      if (!PgAdminUrl()) GTEST_SKIP() << kPgSkip;
      Status st = pg_.Create();
      ASSERT_TRUE(st.ok()) << st.ToString();
      url_ = pg_.url();
    } else {
      dir_ = std::filesystem::temp_directory_path() / ("keel-sched-" + NewId());
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
    EXPECT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.tenants().InsertTenant(t); }).ok());
    return t.id;
  }

  Schedule NewSchedule(const std::string& agent, std::optional<Millis> next,
                       const std::string& status = "active") {
    Schedule s;
    s.id = NewId();
    s.tenant_id = tenant_;
    s.agent_id = agent;
    s.name = "n";
    s.kind = "cron";
    s.cron = "* * * * *";
    s.timezone = "Europe/Berlin";
    s.prompt = "p";
    s.status = status;
    s.next_fire_at = next;
    s.created_by = "tok";
    s.caller_role = "user";
    s.created_at = s.updated_at = 1000;
    return s;
  }

  Status Write(const std::function<Status(ScheduleStore&)>& fn) {
    return store_->WriteSync([&](Tx& tx) { return fn(tx.schedules()); });
  }
  template <typename T>
  T Read(const std::function<Result<T>(ScheduleStore&)>& fn) {
    T out{};
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(out, fn(tx.schedules()));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  PgTestDatabase pg_;
  std::filesystem::path dir_;
  std::string url_;
  std::unique_ptr<Store> store_;
  std::string tenant_;
};

INSTANTIATE_TEST_SUITE_P(Conformance, ScheduleStoreTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

TEST_P(ScheduleStoreTest, InsertGetUpdateListDelete) {
  Schedule s = NewSchedule("agent-1", 5000);
  s.session_id = "sess";
  s.missed = "catch_up_one";
  s.user_id = "user-1";
  s.channel_id = "channel-1";
  ASSERT_TRUE(Write([&](ScheduleStore& x) { return x.InsertSchedule(s); }).ok());
  EXPECT_EQ(Write([&](ScheduleStore& x) { return x.InsertSchedule(s); }).code(), Code::kConflict);
  Schedule got = Read<Schedule>([&](ScheduleStore& x) { return x.GetSchedule(tenant_, s.id); });
  EXPECT_EQ(got.agent_id, "agent-1");
  EXPECT_EQ(got.cron, "* * * * *");
  EXPECT_EQ(got.timezone, "Europe/Berlin");
  EXPECT_EQ(got.session_id, "sess");
  EXPECT_EQ(got.missed, "catch_up_one");
  EXPECT_EQ(got.next_fire_at, std::optional<Millis>(5000));
  EXPECT_FALSE(got.at);
  EXPECT_FALSE(got.last_fired_at);
  EXPECT_EQ(got.caller_role, "user");
  EXPECT_EQ(got.user_id, "user-1");
  EXPECT_EQ(got.channel_id, "channel-1");

  got.status = "done";
  got.user_id.clear();  // reassigned to a token: it acts for that token's holder
  got.channel_id.clear();
  got.next_fire_at.reset();
  got.last_fired_at = 5000;
  got.updated_at = 6000;
  ASSERT_TRUE(Write([&](ScheduleStore& x) { return x.UpdateSchedule(got); }).ok());
  Schedule after = Read<Schedule>([&](ScheduleStore& x) { return x.GetSchedule(tenant_, s.id); });
  EXPECT_EQ(after.status, "done");
  EXPECT_FALSE(after.next_fire_at);
  EXPECT_EQ(after.last_fired_at, std::optional<Millis>(5000));
  EXPECT_EQ(after.updated_at, 6000);
  EXPECT_EQ(after.user_id, "");
  EXPECT_EQ(after.channel_id, "");

  Schedule other = NewSchedule("agent-2", 7000);
  Schedule once = NewSchedule("agent-1", 8000);
  once.kind = "once";
  once.cron.clear();
  once.at = 8000;
  ASSERT_TRUE(Write([&](ScheduleStore& x) -> Status {
                KEEL_RETURN_IF_ERROR(x.InsertSchedule(other));
                return x.InsertSchedule(once);
              }).ok());
  auto all = Read<Paged<Schedule>>([&](ScheduleStore& x) {
    return x.ListSchedules(tenant_, "", Page{"", 2});
  });
  ASSERT_EQ(all.items.size(), 2u);
  EXPECT_FALSE(all.next_cursor.empty());
  auto rest = Read<Paged<Schedule>>([&](ScheduleStore& x) {
    return x.ListSchedules(tenant_, "", Page{all.next_cursor, 2});
  });
  ASSERT_EQ(rest.items.size(), 1u);
  EXPECT_TRUE(rest.next_cursor.empty());
  auto mine = Read<Paged<Schedule>>(
      [&](ScheduleStore& x) { return x.ListSchedules(tenant_, "agent-1", Page{}); });
  ASSERT_EQ(mine.items.size(), 2u);
  EXPECT_EQ(mine.items[0].id, s.id);  // by id (time-ordered)
  EXPECT_EQ(mine.items[1].at, std::optional<Millis>(8000));

  // Another tenant sees none of them.
  std::string t2 = MakeTenant();
  EXPECT_EQ(
      store_->Read([&](Tx& tx) { return tx.schedules().GetSchedule(t2, s.id).status(); }).code(),
      Code::kNotFound);
  EXPECT_TRUE(Read<Paged<Schedule>>([&](ScheduleStore& x) {
                return x.ListSchedules(t2, "", Page{});
              }).items.empty());

  ASSERT_TRUE(Write([&](ScheduleStore& x) { return x.DeleteSchedule(tenant_, s.id); }).ok());
  EXPECT_EQ(Write([&](ScheduleStore& x) { return x.DeleteSchedule(tenant_, s.id); }).code(),
            Code::kNotFound);
  EXPECT_EQ(Write([&](ScheduleStore& x) { return x.UpdateSchedule(got); }).code(), Code::kNotFound);
}

TEST_P(ScheduleStoreTest, ASlotIsRecordedOnceAndTheUnitGoesOn) {
  Schedule s = NewSchedule("a", 5000);
  ASSERT_TRUE(Write([&](ScheduleStore& x) { return x.InsertSchedule(s); }).ok());
  ScheduleFire f{tenant_, s.id, 5000, 5001, "posted", "sess", "run", "msg", ""};
  ASSERT_TRUE(Write([&](ScheduleStore& x) { return x.InsertFire(f); }).ok());
  // A second record of the slot is a conflict; the same unit may still write (and commit).
  Status second = store_->WriteSync([&](Tx& tx) -> Status {
    Status dup = tx.schedules().InsertFire(f);
    EXPECT_EQ(dup.code(), Code::kConflict);
    s.last_fired_at = 5000;
    return tx.schedules().UpdateSchedule(s);
  });
  EXPECT_TRUE(second.ok()) << second.ToString();
  EXPECT_EQ(
      Read<Schedule>([&](ScheduleStore& x) { return x.GetSchedule(tenant_, s.id); }).last_fired_at,
      std::optional<Millis>(5000));
  ScheduleFire refused{tenant_, s.id, 6000, 6100, "refused", "", "", "", "busy"};
  ASSERT_TRUE(Write([&](ScheduleStore& x) { return x.InsertFire(refused); }).ok());
  auto fires = Read<std::vector<ScheduleFire>>(
      [&](ScheduleStore& x) { return x.RecentFires(tenant_, s.id, 10); });
  ASSERT_EQ(fires.size(), 2u);
  EXPECT_EQ(fires[0].slot, 6000);  // newest first
  EXPECT_EQ(fires[0].outcome, "refused");
  EXPECT_EQ(fires[0].error, "busy");
  EXPECT_EQ(fires[1].run_id, "run");
  EXPECT_EQ(Read<std::vector<ScheduleFire>>([&](ScheduleStore& x) {
              return x.RecentFires(tenant_, s.id, 1);
            }).size(),
            1u);
  // A run's fire, by the run's id: only in its own tenant; none for another run or no run.
  using MaybeFire = std::optional<ScheduleFire>;
  auto of_run = Read<MaybeFire>([&](ScheduleStore& x) { return x.FireOfRun(tenant_, "run"); });
  ASSERT_TRUE(of_run.has_value());
  EXPECT_EQ(of_run->schedule_id, s.id);
  EXPECT_EQ(of_run->slot, 5000);
  EXPECT_EQ(of_run->message_id, "msg");
  EXPECT_FALSE(Read<MaybeFire>([&](ScheduleStore& x) { return x.FireOfRun(tenant_, "other"); }));
  EXPECT_FALSE(Read<MaybeFire>([&](ScheduleStore& x) { return x.FireOfRun(tenant_, ""); }));
  std::string t2 = MakeTenant();
  EXPECT_FALSE(Read<MaybeFire>([&](ScheduleStore& x) { return x.FireOfRun(t2, "run"); }));
  // The fires go with their schedule.
  ASSERT_TRUE(Write([&](ScheduleStore& x) { return x.DeleteSchedule(tenant_, s.id); }).ok());
  EXPECT_TRUE(Read<std::vector<ScheduleFire>>([&](ScheduleStore& x) {
                return x.RecentFires(tenant_, s.id, 10);
              }).empty());
  EXPECT_FALSE(Read<MaybeFire>([&](ScheduleStore& x) { return x.FireOfRun(tenant_, "run"); }));
}

TEST_P(ScheduleStoreTest, DueSchedulesAndTheEarliestNextSlotAreRuntimeWide) {
  EXPECT_FALSE(Read<std::optional<Millis>>([](ScheduleStore& x) { return x.NextFireAt(); }));
  std::string t2 = MakeTenant();
  Schedule late = NewSchedule("a", 3000);
  Schedule early = NewSchedule("a", 1000);
  Schedule future = NewSchedule("a", 9000);
  Schedule paused = NewSchedule("a", 500, "paused");
  Schedule done = NewSchedule("a", std::nullopt, "done");
  Schedule elsewhere = NewSchedule("b", 2000);
  elsewhere.tenant_id = t2;
  ASSERT_TRUE(Write([&](ScheduleStore& x) -> Status {
                for (const auto* s : {&late, &early, &future, &paused, &done, &elsewhere}) {
                  KEEL_RETURN_IF_ERROR(x.InsertSchedule(*s));
                }
                return Status::Ok();
              }).ok());
  auto due = Read<std::vector<Schedule>>([](ScheduleStore& x) { return x.DueSchedules(5000, 10); });
  std::vector<std::string> ids;
  for (const auto& s : due) ids.push_back(s.id);
  EXPECT_EQ(ids, (std::vector<std::string>{early.id, elsewhere.id, late.id}));
  EXPECT_EQ(
      Read<std::vector<Schedule>>([](ScheduleStore& x) { return x.DueSchedules(5000, 1); }).size(),
      1u);
  EXPECT_EQ(Read<std::optional<Millis>>([](ScheduleStore& x) { return x.NextFireAt(); }),
            std::optional<Millis>(1000));
}

}  // namespace
}  // namespace keel::store

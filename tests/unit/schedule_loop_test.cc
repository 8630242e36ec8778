// The runtime's schedule loop on a clock the test moves (RuntimeOptions::clock), against a real
// SQLite store: a cron slot on New York's spring-forward day fires at the end of the gap, into
// a new session, once; after a "restart" three days later, catch_up_one fires only the latest
// missed slot and skip fires none, and both go on from the new now.

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <filesystem>

#include "keel/common/ids.h"
#include "keel/metrics.h"
#include "keel/model/local_model.h"
#include "keel/model/provider.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/runtime.h"
#include "keel/schedule/schedule.h"
#include "keel/store/schedule_store.h"
#include "keel/store/store.h"
#include "keel/tools/gateway.h"
#include "keel/tools/tool.h"

namespace keel::runtime {
namespace {

namespace asio = boost::asio;

Millis T(const std::string& s) { return ParseRfc3339(s).value(); }

class ScheduleLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("keel-loop-" + NewId());
    std::filesystem::create_directories(dir_);
    store::StoreOptions o;
    o.origin = "node-a";
    auto opened = store::OpenStore("sqlite://" + (dir_ / "keel.db").string(), o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
    ASSERT_TRUE(providers_.Register("local", std::make_unique<model::LocalModel>()).ok());
    ASSERT_TRUE(tools::RegisterBuiltinTools(registry_).ok());
    tenant_ = NewId();
    agent_.id = NewId();
    agent_.tenant_id = tenant_;
    agent_.name = "a";
    agent_.model = "local";
    ASSERT_TRUE(store_
                    ->WriteSync([&](store::Tx& tx) -> Status {
                      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant({tenant_, "t", 0}));
                      return tx.agents().InsertAgent(agent_);
                    })
                    .ok());
  }
  void TearDown() override {
    StopRuntime();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A daily 02:30 New York schedule, created (last changed) at `created`.
  store::Schedule AddSchedule(const std::string& missed, Millis created) {
    schedule::ScheduleRequest r;
    r.agent_id = agent_.id;
    r.cron = "30 2 * * *";
    r.timezone = "America/New_York";
    r.prompt = "daily " + missed;
    r.missed = missed;
    auto s = schedule::MakeSchedule(r, tenant_, "tok", "owner", created);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(
        store_->WriteSync([&](store::Tx& tx) { return schedule::InsertSchedule(tx, *s); }).ok());
    return *s;
  }

  void StartRuntime() {
    io_ = std::make_unique<asio::io_context>(1);
    hub_ = std::make_unique<EventHub>(io_->get_executor());
    gateway_ = std::make_unique<tools::Gateway>(*store_, registry_, (dir_ / "ws").string());
    RuntimeOptions options;
    options.clock = [this] { return now_.load(); };
    runtime_ = std::make_unique<Runtime>(io_->get_executor(), *store_, *hub_, providers_, *gateway_,
                                         metrics_, options);
    ASSERT_TRUE(runtime_->Start().ok());
  }
  void StopRuntime() {
    if (!runtime_) return;
    bool drained = false;
    asio::co_spawn(
        *io_,
        [&]() -> asio::awaitable<void> {
          co_await runtime_->Drain(std::chrono::seconds(5));
          drained = true;
        },
        asio::detached);
    while (!drained) io_->run_one_for(std::chrono::milliseconds(50));
    io_->stop();
    runtime_.reset();
    gateway_.reset();
    hub_.reset();
    io_.reset();
  }
  // Moves the clock, wakes the loop, and runs the io loop until `done` or `timeout`.
  template <typename Pred>
  bool RunUntil(Millis now, Pred done,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
    now_ = now;
    runtime_->WakeSchedules();
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      io_->run_for(std::chrono::milliseconds(20));
      if (done()) return true;
    }
    return false;
  }
  store::Schedule Get(const std::string& id) {
    store::Schedule s;
    EXPECT_TRUE(store_
                    ->Read([&](store::Tx& tx) -> Status {
                      KEEL_ASSIGN_OR_RETURN(s, tx.schedules().GetSchedule(tenant_, id));
                      return Status::Ok();
                    })
                    .ok());
    return s;
  }
  std::vector<store::ScheduleFire> Fires(const std::string& id) {
    std::vector<store::ScheduleFire> f;
    EXPECT_TRUE(store_
                    ->Read([&](store::Tx& tx) -> Status {
                      KEEL_ASSIGN_OR_RETURN(f, tx.schedules().RecentFires(tenant_, id, 100));
                      return Status::Ok();
                    })
                    .ok());
    return f;
  }
  std::vector<store::Message> UserMessages(const std::string& session_id) {
    std::vector<store::Message> out;
    EXPECT_TRUE(store_
                    ->Read([&](store::Tx& tx) -> Status {
                      KEEL_ASSIGN_OR_RETURN(auto page,
                                            tx.messages().ListMessages(tenant_, session_id, {}));
                      for (auto& m : page.items) {
                        if (m.role == "user") out.push_back(m);
                      }
                      return Status::Ok();
                    })
                    .ok());
    return out;
  }

  std::filesystem::path dir_;
  std::unique_ptr<store::Store> store_;
  model::ProviderRegistry providers_;
  tools::ToolRegistry registry_;
  Metrics metrics_;
  std::atomic<Millis> now_{0};
  std::unique_ptr<asio::io_context> io_;
  std::unique_ptr<EventHub> hub_;
  std::unique_ptr<tools::Gateway> gateway_;
  std::unique_ptr<Runtime> runtime_;
  std::string tenant_;
  store::Agent agent_;
};

TEST_F(ScheduleLoopTest, FiresOnATestClockAndAppliesTheMissedPolicyAfterARestart) {
  store::Schedule catch_up = AddSchedule("catch_up_one", T("2024-03-09T12:00:00.000Z"));
  store::Schedule skip = AddSchedule("skip", T("2024-03-09T12:00:00.000Z"));
  // 02:30 does not exist on 2024-03-10 in New York: the slot is 03:00 EDT.
  ASSERT_EQ(FormatRfc3339(*catch_up.next_fire_at), "2024-03-10T07:00:00.000Z");

  now_ = T("2024-03-10T06:59:59.000Z");
  StartRuntime();
  RunUntil(
      T("2024-03-10T06:59:59.500Z"), [] { return false; }, std::chrono::milliseconds(300));
  EXPECT_TRUE(Fires(catch_up.id).empty()) << "fired before its slot";
  ASSERT_TRUE(RunUntil(T("2024-03-10T07:00:00.250Z"), [&] {
    return Fires(catch_up.id).size() == 1 && Fires(skip.id).size() == 1;
  }));
  for (const auto& s : {catch_up, skip}) {
    auto fires = Fires(s.id);
    EXPECT_EQ(FormatRfc3339(fires[0].slot), "2024-03-10T07:00:00.000Z");
    EXPECT_EQ(fires[0].fired_at, T("2024-03-10T07:00:00.250Z"));  // the test clock's time
    EXPECT_EQ(fires[0].outcome, "posted");
    EXPECT_EQ(FormatRfc3339(*Get(s.id).next_fire_at), "2024-03-11T06:30:00.000Z");
    auto msgs = UserMessages(fires[0].session_id);
    ASSERT_EQ(msgs.size(), 1u);
    EXPECT_EQ(msgs[0].content, s.prompt);
  }
  StopRuntime();

  // Down until the 13th at noon: the 11th, 12th and 13th 02:30 slots were missed.
  now_ = T("2024-03-13T12:00:00.000Z");
  StartRuntime();
  ASSERT_TRUE(RunUntil(T("2024-03-13T12:00:00.000Z"), [&] {
    return Fires(catch_up.id).size() == 2 &&
           *Get(skip.id).next_fire_at == T("2024-03-14T06:30:00.000Z");
  }));
  auto fires = Fires(catch_up.id);
  EXPECT_EQ(FormatRfc3339(fires[0].slot), "2024-03-13T06:30:00.000Z");  // only the latest
  EXPECT_EQ(FormatRfc3339(*Get(catch_up.id).next_fire_at), "2024-03-14T06:30:00.000Z");
  EXPECT_EQ(Fires(skip.id).size(), 1u);  // none of the missed ones
  // Nothing more fires until the next slot.
  RunUntil(
      T("2024-03-14T06:29:59.000Z"), [] { return false; }, std::chrono::milliseconds(300));
  EXPECT_EQ(Fires(catch_up.id).size(), 2u);
  EXPECT_EQ(Fires(skip.id).size(), 1u);
}

}  // namespace
}  // namespace keel::runtime

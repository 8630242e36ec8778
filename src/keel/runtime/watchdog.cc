#include "keel/runtime/watchdog.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <memory>

#include "keel/common/log.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Describe(const std::optional<IoHolder>& holder) {
  if (!holder) return "no run marked its work (outside plugin hooks and io-thread tools)";
  std::string out = holder->what;
  if (!holder->run_id.empty()) out += " of run " + holder->run_id;
  if (!holder->tenant_id.empty()) out += " (tenant " + holder->tenant_id + ")";
  return out;
}

}  // namespace

Watchdog::Watchdog(asio::any_io_executor io, store::Store& store, WatchdogOptions options)
    : io_(std::move(io)), store_(store), options_(options) {}

Watchdog::~Watchdog() { Stop(); }

void Watchdog::Start() {
  last_beat_ms_ = SteadyMillis();
  asio::co_spawn(io_, Heartbeat(), ReportExceptions{"io watchdog heartbeat"});
  checker_ = std::thread([this] {
    NameThread("keel-watchdog");
    Check();
  });
}

void Watchdog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  stop_cv_.notify_all();
  if (checker_.joinable()) checker_.join();
}

asio::awaitable<void> Watchdog::Heartbeat() {
  asio::steady_timer timer(io_);
  // Several beats per warning period, so a stall is measured to within a fraction of it.
  const auto beat = std::max(std::chrono::milliseconds(10), options_.warn / 10);
  while (!stopped_) {
    last_beat_ms_ = SteadyMillis();
    timer.expires_after(beat);
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

void Watchdog::Check() {
  const auto period = std::max(std::chrono::milliseconds(10), options_.warn / 10);
  int64_t warned_beat = -1;  // the beat after which a stall was reported already
  // When this thread itself did not run for a warning period, the whole process was stopped
  // (SIGSTOP, a suspended machine), not the io thread alone: time is counted from then.
  int64_t checked = SteadyMillis();
  int64_t resumed = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stopped_.load(); })) {
    const int64_t now = SteadyMillis();
    if (now - checked >= options_.warn.count()) resumed = now;
    checked = now;
    const int64_t beat = std::max<int64_t>(last_beat_ms_, resumed);
    const int64_t held = now - beat;
    if (held < options_.warn.count()) continue;
    std::optional<IoHolder> holder = CurrentIoWork();
    if (warned_beat != beat) {
      warned_beat = beat;
      LogError("io watchdog: the io thread has not turned over for " + std::to_string(held) +
               " ms; held by " + Describe(holder));
    }
    if (held < options_.limit.count()) continue;
    LogError("io watchdog: the io thread was held for " + std::to_string(held) +
             " ms (io_stall_limit_ms " + std::to_string(options_.limit.count()) + ") by " +
             Describe(holder) + "; aborting so that the server starts again");
    if (holder && !holder->run_id.empty()) RecordPoison(*holder, held);
    std::abort();
  }
}

void Watchdog::RecordPoison(const IoHolder& holder, int64_t held_ms) {
  // Shared with the writer's callback, which may come after this thread stopped waiting.
  auto done = std::make_shared<std::promise<Status>>();
  auto written = done->get_future();
  store_.Write(
      [holder, held_ms](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(holder.tenant_id, holder.run_id));
        if (run.status != "running") return Status::Ok();  // it ended meanwhile
        return tx.events().Append({run.tenant_id, "run.stalled@v1", run.agent_id,
                                   run.session_id, run.id,
                                   {{"held_ms", held_ms}, {"work", holder.what}}});
      },
      [done](Status st, std::vector<store::Event>) { done->set_value(std::move(st)); });
  if (written.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    LogError("io watchdog: the store did not record run " + holder.run_id + " as poison in 5 s");
    return;
  }
  Status st = written.get();
  if (!st.ok()) {
    LogError("io watchdog: recording run " + holder.run_id + " as poison failed: " + st.message());
  }
}

}  // namespace keel::runtime

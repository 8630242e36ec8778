#include "keel/runtime/dispatcher.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

#include "keel/common/log.h"
#include "keel/common/time.h"
#include "keel/store/async.h"

namespace keel::runtime {

namespace asio = boost::asio;

Dispatcher::Dispatcher(asio::any_io_executor executor, store::Store& store, Options options,
                       Execute execute)
    : executor_(executor),
      store_(store),
      options_(options),
      execute_(std::move(execute)),
      wake_timer_(executor),
      slots_(options.max_concurrent_runs,
             std::clamp(options.tenant_max_running, 1, options.max_concurrent_runs)) {}

Status Dispatcher::Start() {
  // Whatever this origin was running before a restart belongs to a dead process: make it
  // claimable now rather than after its lease would have run out.
  std::string origin = store_.origin();
  KEEL_RETURN_IF_ERROR(store_.WriteSync(
      [origin](store::Tx& tx) { return tx.runs().ExpireLeasesOf(origin); }));
  asio::co_spawn(executor_, DispatchLoop(), ReportExceptions{"run dispatcher"});
  asio::co_spawn(executor_, LeaseLoop(), ReportExceptions{"lease keeper"});
  return Status::Ok();
}

void Dispatcher::Wake() {
  wake_pending_ = true;
  wake_timer_.cancel();
}

RunSlots::Hold Dispatcher::TakeSlot(const std::string& tenant_id) {
  if (draining_) return {};
  return slots_.Take(tenant_id);
}

void Dispatcher::Finished(const std::string& run_id) {
  executing_.erase(run_id);
  cancel_requested_.erase(run_id);
  Wake();
}

asio::awaitable<void> Dispatcher::DispatchLoop() {
  while (!draining_) {
    if (!wake_pending_) {
      // Poll now and then: a lease may expire without anyone waking us.
      wake_timer_.expires_after(std::chrono::milliseconds(500));
      boost::system::error_code ec;
      co_await wake_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    wake_pending_ = false;
    if (draining_) break;
    if (slots_.free() <= 0) continue;
    std::vector<store::Run> runs;
    Millis now = NowMillis();
    // ClaimableRuns takes the tenants in turn (each one's oldest first, then each one's second,
    // ...), so a tenant with a long queue does not crowd the others out of this page.
    int want = options_.max_concurrent_runs;
    Status st = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(runs, tx.runs().ClaimableRuns(now, want));
      return Status::Ok();
    });
    if (!st.ok()) continue;
    for (auto& run : runs) {
      if (slots_.free() <= 0) break;
      if (executing_.count(run.id)) continue;
      // A tenant at its share: its run stays queued, and the next tenant's is looked at.
      RunSlots::Hold slot = slots_.Take(run.tenant_id);
      if (!slot) continue;
      Launch(std::move(run), std::nullopt, std::move(slot));
    }
  }
}

void Dispatcher::Launch(store::Run run, std::optional<KnownRun> known, RunSlots::Hold slot) {
  executing_.insert(run.id);
  asio::co_spawn(executor_, execute_(std::move(run), std::move(known), std::move(slot)),
                 ReportExceptions{"run execution"});
}

asio::awaitable<void> Dispatcher::LeaseLoop() {
  asio::steady_timer timer(executor_);
  while (!draining_) {
    timer.expires_after(std::chrono::milliseconds(std::max(100, options_.lease_ms / 3)));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (executing_.empty()) continue;
    std::vector<std::string> ids(executing_.begin(), executing_.end());
    std::string origin = store_.origin();
    Millis until = NowMillis() + options_.lease_ms;
    (void)co_await store::AsyncWrite(store_, [&](store::Tx& tx) {
      return tx.runs().RenewLeases(origin, ids, until);
    });
  }
}

asio::awaitable<void> Dispatcher::Drain(std::chrono::milliseconds grace) {
  draining_ = true;
  wake_timer_.cancel();
  asio::steady_timer timer(executor_);
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (!executing_.empty() && std::chrono::steady_clock::now() < deadline) {
    timer.expires_after(std::chrono::milliseconds(20));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

}  // namespace keel::runtime

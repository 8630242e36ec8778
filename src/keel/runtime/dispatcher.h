#pragma once
// runtime::Dispatcher — which runs execute on this node, and their leases (dispatcher.cc).
//
// A run executes on one node at a time, under a lease that its node renews (runs/run_state.h
// writes every claim). The dispatcher finds runnable runs (queued, or running under a lease
// that expired because its node died), takes a run slot for each (run_slots.h: one tenant
// cannot take them all) and starts it through the Execute function it was given, which claims
// the run and executes it. Intake claims the run of an idle session in its own unit of work
// and hands it over with Launch. While runs execute here, their leases are renewed every
// lease_ms / 3. A cancel of an executing run is noted (RequestCancel) and seen by the run at
// its next step boundary (CancelRequested).
//
// Runs on the server's io executor; no member needs a lock.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/runtime/run_slots.h"
#include "keel/store/types.h"

namespace keel::plugins {
struct AgentPlugins;  // plugins/host.h
}

namespace keel::store {
class Store;
}

namespace keel::runtime {

// What intake already read for a run it claimed, so that its execution need not read it again.
struct KnownRun {
  store::Agent agent;
  store::Message prompt;
  std::string session_instructions;  // its session's own (store::Session::instructions)
  // The agent's plugins as intake found them current (a schedule's run has none: it looks).
  std::shared_ptr<plugins::AgentPlugins> plugins;
};

class Dispatcher {
 public:
  struct Options {
    int max_concurrent_runs = 256;
    int tenant_max_running = 64;  // clamped to [1, max_concurrent_runs]
    int lease_ms = 30000;
  };
  // Claims and executes one run in `slot`, which it gives back when it ends (Finished); with
  // `known`, the caller already holds its lease.
  using Execute = std::function<boost::asio::awaitable<void>(
      store::Run run, std::optional<KnownRun> known, RunSlots::Hold slot)>;

  Dispatcher(boost::asio::any_io_executor executor, store::Store& store, Options options,
             Execute execute);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Expires the leases this origin held before a restart (its runs are claimable at once) and
  // starts looking for runs and renewing leases. REQUIRES: once, on the executor.
  Status Start();
  // Stops claiming runs; waits up to `grace` for the executing ones to end.
  boost::asio::awaitable<void> Drain(std::chrono::milliseconds grace);
  bool draining() const { return draining_; }

  // Looks for runnable runs now.
  void Wake();
  // A slot for one of the tenant's runs, taken before the run is claimed; empty when none is
  // free or the node is draining.
  RunSlots::Hold TakeSlot(const std::string& tenant_id);
  // Starts executing a run in `slot` (intake claimed it: `known` is what it read).
  void Launch(store::Run run, std::optional<KnownRun> known, RunSlots::Hold slot);
  // A run executing here was cancelled: it stops at its next step boundary.
  void RequestCancel(const std::string& run_id) { cancel_requested_.insert(run_id); }
  bool CancelRequested(const std::string& run_id) const {
    return cancel_requested_.count(run_id) > 0;
  }
  // An execution ended (its slot is given back by its Hold): forgets the run and looks for
  // the next.
  void Finished(const std::string& run_id);

 private:
  boost::asio::awaitable<void> DispatchLoop();
  boost::asio::awaitable<void> LeaseLoop();

  boost::asio::any_io_executor executor_;
  store::Store& store_;
  const Options options_;
  Execute execute_;
  boost::asio::steady_timer wake_timer_;
  bool wake_pending_ = false;
  bool draining_ = false;
  std::set<std::string> executing_;         // run ids claimed or running on this node
  std::set<std::string> cancel_requested_;  // executing runs asked to stop
  RunSlots slots_;
};

}  // namespace keel::runtime

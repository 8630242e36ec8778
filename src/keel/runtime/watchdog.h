#pragma once
// runtime::Watchdog — notices when the io thread stops turning over (DESIGN.md invariant 13:
// nothing anyone sends may freeze the server).
//
// A heartbeat timer on the io executor stamps the time every beat; a plain thread of the
// watchdog's own checks the stamp. When the io thread has not turned over for `warn`, it logs
// what holds it: the run and the work an IoWork marked (common/io_work.h). Held for `limit`,
// it appends run.stalled@v1 to that run, so that the next start fails the run with poison_run
// at once instead of after several tries (runs::ClaimRun's poison check, runs/run_state.cc), and aborts the
// process: a frozen server must not stay frozen, and its supervisor starts it again.
//
// Owned by ServeMain. Start and Stop on the io thread; the heartbeat runs there, the check on
// the watchdog's thread, which touches only the atomic stamp, the IoWork marker and the store
// (Store::Write is safe from any thread).

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "keel/common/io_work.h"
#include "keel/store/store.h"

namespace keel::runtime {

struct WatchdogOptions {
  std::chrono::milliseconds warn{1000};
  std::chrono::milliseconds limit{30000};  // REQUIRES: > warn
};

class Watchdog {
 public:
  Watchdog(boost::asio::any_io_executor io, store::Store& store, WatchdogOptions options);
  ~Watchdog();  // Stop()
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts the heartbeat and the check. REQUIRES: once.
  void Start();
  // Ends the check (before the io thread stops on purpose, which would look like a freeze).
  void Stop();

 private:
  boost::asio::awaitable<void> Heartbeat();
  void Check();
  // Appends run.stalled@v1 to the holder's run, waiting for the store a few seconds at most.
  void RecordPoison(const IoHolder& holder, int64_t held_ms);

  boost::asio::any_io_executor io_;
  store::Store& store_;
  const WatchdogOptions options_;
  std::atomic<int64_t> last_beat_ms_{0};  // steady clock; 0 until the first beat
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::condition_variable stop_cv_;
  std::thread checker_;
};

}  // namespace keel::runtime

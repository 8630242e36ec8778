#pragma once
// IoWork — what the io thread is doing for a run right now, for the watchdog to name when the
// io thread stops turning over (runtime/watchdog.h).
//
// An IoWork lives around synchronous work done for a run on the io thread that may take long
// (plugin hooks, tools that run there); the innermost one is current, and when it ends the one
// around it is current again. Process-wide, because a process has one io thread: marked there,
// read from the watchdog's thread under a mutex.

#include <optional>
#include <string>

namespace keel {

struct IoHolder {
  std::string tenant_id;
  std::string run_id;  // empty: work for no run (an API request's plugin hook)
  std::string what;    // "plugin hook model.before", "tool plugin__x__y at step 3", ...
};

class IoWork {
 public:
  // REQUIRES: on the io thread; no co_await while it lives (it would mark the suspension).
  IoWork(std::string tenant_id, std::string run_id, std::string what);
  ~IoWork();
  IoWork(const IoWork&) = delete;
  IoWork& operator=(const IoWork&) = delete;

 private:
  std::optional<IoHolder> outer_;  // the work this one is inside of, current again after it
};

// The innermost IoWork alive now, if any. Any thread.
std::optional<IoHolder> CurrentIoWork();

}  // namespace keel

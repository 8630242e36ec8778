#pragma once
// IoWork — what the io thread is doing for a run right now, for the watchdog to name when the
// io thread stops turning over (runtime/watchdog.h).
//
// An IoWork lives around work done for a run on the io thread that may take long (plugin hooks,
// tools that run there); the innermost one is current, and when it ends the one around it is
// current again. Such work may suspend (a Lua handler waiting on a memory read): each suspension
// inside an IoWork is wrapped in an IoWorkPause, so that the marker is down while other work
// runs on the io thread and up again when the work resumes. Process-wide, because a process has
// one io thread: marked there, read from the watchdog's thread under a mutex.

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
  // REQUIRES: on the io thread; every co_await that may suspend while it lives is inside an
  // IoWorkPause (else it would name this work while other work holds the io thread).
  IoWork(std::string tenant_id, std::string run_id, std::string what);
  ~IoWork();
  IoWork(const IoWork&) = delete;
  IoWork& operator=(const IoWork&) = delete;

 private:
  std::optional<IoHolder> outer_;  // the work this one is inside of, current again after it
};

// Takes the current marker down for a suspension (a co_await) and puts it back when the
// suspended work resumes, i.e. when the pause ends. Markers made and ended by other work meanwhile
// nest inside their own stretches, so they find nothing current and leave nothing behind.
// REQUIRES: on the io thread; ends on it.
class IoWorkPause {
 public:
  IoWorkPause();
  ~IoWorkPause();
  IoWorkPause(const IoWorkPause&) = delete;
  IoWorkPause& operator=(const IoWorkPause&) = delete;

 private:
  std::optional<IoHolder> paused_;
};

// The innermost IoWork alive now, if any. Any thread.
std::optional<IoHolder> CurrentIoWork();

}  // namespace keel

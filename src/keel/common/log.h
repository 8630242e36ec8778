#pragma once
// Minimal logging to stderr, one line per message with a UTC timestamp. Thread-safe.

#include <exception>
#include <string>

namespace keel {

void LogInfo(const std::string& line);
void LogError(const std::string& line);

// Names the calling thread as `top -H`, `perf` and gdb show it (at most 15 characters; longer
// names are cut): "keel-writer", "keel-pg-read", ...
void NameThread(const char* name);

// A completion handler for detached coroutines: a coroutine that ends with an exception is a
// bug, so it is logged with `what` instead of vanishing.
struct ReportExceptions {
  const char* what;
  void operator()(std::exception_ptr e) const;
};

}  // namespace keel

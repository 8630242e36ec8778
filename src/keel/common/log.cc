#include "keel/common/log.h"

#include <pthread.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "keel/common/time.h"

namespace keel {
namespace {
std::mutex log_mu;
void Write(const char* level, const std::string& line) {
  std::lock_guard<std::mutex> lock(log_mu);
  std::fprintf(stderr, "%s %s keel: %s\n", FormatRfc3339(NowMillis()).c_str(), level, line.c_str());
}
}  // namespace

void LogInfo(const std::string& line) { Write("INFO", line); }
void LogError(const std::string& line) { Write("ERROR", line); }

void NameThread(const char* name) {
  (void)pthread_setname_np(pthread_self(), std::string(name).substr(0, 15).c_str());
}

void ReportExceptions::operator()(std::exception_ptr e) const {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    LogError(std::string(what) + " ended with an exception: " + ex.what());
  } catch (...) {
    LogError(std::string(what) + " ended with an unknown exception");
  }
}

}  // namespace keel

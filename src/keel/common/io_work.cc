#include "keel/common/io_work.h"

#include <mutex>

namespace keel {

namespace {

std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}

std::optional<IoHolder>& Current() {  // guarded by Mu()
  static std::optional<IoHolder> current;
  return current;
}

}  // namespace

IoWork::IoWork(std::string tenant_id, std::string run_id, std::string what) {
  std::lock_guard<std::mutex> lock(Mu());
  outer_ = std::move(Current());
  Current() = IoHolder{std::move(tenant_id), std::move(run_id), std::move(what)};
}

IoWork::~IoWork() {
  std::lock_guard<std::mutex> lock(Mu());
  Current() = std::move(outer_);
}

IoWorkPause::IoWorkPause() {
  std::lock_guard<std::mutex> lock(Mu());
  paused_ = std::move(Current());
  Current().reset();
}

IoWorkPause::~IoWorkPause() {
  std::lock_guard<std::mutex> lock(Mu());
  Current() = std::move(paused_);
}

std::optional<IoHolder> CurrentIoWork() {
  std::lock_guard<std::mutex> lock(Mu());
  return Current();
}

}  // namespace keel

#include "keel/tools/tool_pool.h"

#include <algorithm>

#include "keel/common/log.h"

namespace keel::tools {

ToolPool::ToolPool(int threads, int per_tenant)
    : per_tenant_(std::clamp(per_tenant, 1, std::max(1, threads))) {
  for (int i = 0; i < std::max(1, threads); ++i)
    threads_.emplace_back([this] {
      NameThread("keel-tools");
      Worker();
    });
}

ToolPool::~ToolPool() { Join(); }

void ToolPool::Post(const std::string& tenant, std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    queues_[tenant].work.push_back(std::move(work));
  }
  // Every waiting thread looks: the one woken may find this tenant at its share while another
  // tenant's work could run.
  ready_.notify_all();
}

void ToolPool::Join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

std::map<std::string, ToolPool::Queue>::iterator ToolPool::NextLocked() {
  if (queues_.empty()) return queues_.end();
  // Round robin in name order, starting after the tenant served last.
  auto start = queues_.upper_bound(last_);
  for (size_t i = 0; i < queues_.size(); ++i) {
    if (start == queues_.end()) start = queues_.begin();
    if (!start->second.work.empty() && start->second.running < per_tenant_) return start;
    ++start;
  }
  return queues_.end();
}

void ToolPool::Worker() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto next = NextLocked();
    if (next == queues_.end()) {
      bool idle = std::none_of(queues_.begin(), queues_.end(),
                               [](const auto& q) { return !q.second.work.empty(); });
      if (stopping_ && idle) return;
      ready_.wait(lock);
      continue;
    }
    const std::string tenant = next->first;
    std::function<void()> work = std::move(next->second.work.front());
    next->second.work.pop_front();
    ++next->second.running;
    last_ = tenant;
    lock.unlock();
    work();
    work = nullptr;  // what it captured goes before the lock is taken again
    lock.lock();
    auto q = queues_.find(tenant);
    if (--q->second.running == 0 && q->second.work.empty()) queues_.erase(q);
    // A thread of this tenant's share is free: a thread waiting for it may go on.
    ready_.notify_all();
  }
}

}  // namespace keel::tools

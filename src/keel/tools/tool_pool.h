#pragma once
// tools::ToolPool — the threads blocking tool work runs on (exec commands, MCP calls and
// connections, the tools that use the store synchronously), shared fairly between tenants
// (DESIGN.md invariant 13).
//
// Each tenant's work waits in a queue of its own and uses at most `per_tenant` threads at once,
// so one tenant's slow commands occupy only its share of the pool and another tenant's call
// never queues behind them; a free thread takes the next tenant with work in turn.
//
// Owned by the Gateway. Post is safe from any thread; the work runs on one of the pool's
// threads. Invariants: running(t) <= per_tenant for every tenant t; a queue is dropped from
// the table when it is empty and nothing of its tenant runs.

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace keel::tools {

class ToolPool {
 public:
  // REQUIRES: 1 <= per_tenant <= threads.
  ToolPool(int threads, int per_tenant);
  ToolPool(const ToolPool&) = delete;
  ToolPool& operator=(const ToolPool&) = delete;
  ~ToolPool();  // Join()

  // Queues `work` for `tenant` (the empty name is the runtime's own work). `work` must not
  // throw.
  void Post(const std::string& tenant, std::function<void()> work);
  // Runs what is queued to its end, then stops the threads. Posts after it are dropped.
  void Join();

  int threads() const { return static_cast<int>(threads_.size()); }
  int per_tenant() const { return per_tenant_; }

 private:
  struct Queue {
    std::deque<std::function<void()>> work;
    int running = 0;
  };
  void Worker();
  // The next tenant in turn (after last_) with queued work and a thread to spare; end() if
  // none. REQUIRES: mu_ held.
  std::map<std::string, Queue>::iterator NextLocked();

  const int per_tenant_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::map<std::string, Queue> queues_;  // GUARDED_BY(mu_)
  std::string last_;                     // GUARDED_BY(mu_): the tenant served last
  bool stopping_ = false;                // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace keel::tools

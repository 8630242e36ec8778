// The tool pool's fair share: one tenant's blocked work holds at most its share of the
// threads, and another tenant's work runs at once beside it.

#include "keel/tools/tool_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace keel::tools {
namespace {

// A gate the blocked work waits at until the test opens it.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    open_cv_.wait(lock, [&] { return open_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    open_cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable open_cv_;
  bool open_ = false;
};

// Counts work that started, and lets a test wait for a count.
class Started {
 public:
  void Add(const std::string& who) {
    std::lock_guard<std::mutex> lock(mu_);
    ++by_[who];
    cv_.notify_all();
  }
  // Whether `who` reached `n` within a generous time (never a measure of speed).
  bool WaitFor(const std::string& who, int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return by_[who] >= n; });
  }
  int Of(const std::string& who) {
    std::lock_guard<std::mutex> lock(mu_);
    return by_[who];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> by_;
};

TEST(ToolPoolTest, ATenantUsesAtMostItsShareAndOthersRunBesideIt) {
  ToolPool pool(4, 2);
  Gate gate;
  Started started;
  for (int i = 0; i < 6; ++i) {
    pool.Post("noisy", [&] {
      started.Add("noisy");
      gate.Wait();
    });
  }
  ASSERT_TRUE(started.WaitFor("noisy", 2));
  // The quiet tenant's work runs while the noisy one's first two still block.
  pool.Post("quiet", [&] { started.Add("quiet"); });
  ASSERT_TRUE(started.WaitFor("quiet", 1));
  EXPECT_EQ(started.Of("noisy"), 2);  // the other four wait in the noisy tenant's own queue
  gate.Open();
  ASSERT_TRUE(started.WaitFor("noisy", 6));  // and all of them run once it is unblocked
}

TEST(ToolPoolTest, JoinRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    ToolPool pool(1, 1);
    for (int i = 0; i < 20; ++i) pool.Post(i % 2 ? "a" : "b", [&] { ++ran; });
  }  // the destructor joins
  EXPECT_EQ(ran.load(), 20);
}

}  // namespace
}  // namespace keel::tools

#pragma once
// Internal to the store backends: the queue in front of a store's writer thread, the same on
// every backend. Write and WriteUrgent queue units of work; the writer takes them in batches,
// runs a batch in one transaction as its backend does, and hands the outcome back to Finish,
// which tells every unit how it ended, the same way on every backend.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "keel/store/store.h"

namespace keel::store {

// One queued unit of work and whom to tell how it ended.
struct PendingUnit {
  WriteFn fn;
  WriteDone done;         // emptied once called (a deferred unit's may be before its commit)
  bool deferred = false;  // Store::WriteDeferred
};

class WriteQueue {
 public:
  // Queues a unit behind the others; an urgent one goes behind the urgent units only, ahead of
  // the rest. Once closed, `done` gets kUnavailable ("store is closed") at once.
  void Push(PendingUnit unit, bool urgent = false);

  // The writer's wait: moves up to `max` units into `batch`, in queue order, and returns true;
  // false once the queue is closed and empty.
  bool Take(size_t max, std::vector<PendingUnit>& batch);
  // Take that waits until `deadline` at most: false when no unit came (or the queue closed).
  bool TakeUntil(size_t max, std::vector<PendingUnit>& batch,
                 std::chrono::steady_clock::time_point deadline);

  // Takes no unit after this; the writer still takes the ones queued before.
  void Close();

  // Tells each unit of `batch` how it ended once its transaction committed or failed.
  // `results[i]` and `events[i]` belong to `batch[i]`; `committed_units` counts the units that
  // committed. A failed `commit` fails every unit that had succeeded, with the commit's status,
  // and drops their events. The counters move; `listener` sees the committed events in order,
  // unit by unit; then the callback of each unit not yet told runs.
  void Finish(std::vector<PendingUnit>& batch, std::vector<Status>& results,
              std::vector<std::vector<Event>>& events, const Status& commit, int committed_units,
              const std::function<void(const std::vector<Event>&)>& listener);

  StoreStats stats() const;

 private:
  // REQUIRES: mu_ held. Take's move; false when the queue is empty.
  bool MoveFront(size_t max, std::vector<PendingUnit>& batch);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PendingUnit> queue_;  // GUARDED_BY(mu_)
  size_t urgent_ = 0;              // GUARDED_BY(mu_): the urgent units at the front of queue_
  bool closed_ = false;            // GUARDED_BY(mu_)
  StoreStats stats_;               // GUARDED_BY(mu_)
};

// What both backends' stores do the same way: units go into a WriteQueue that the backend's
// writer thread drains, and its commits are announced to one listener.
class QueuedStore : public Store {
 public:
  void Write(WriteFn fn, WriteDone done) override { queue_.Push({std::move(fn), std::move(done)}); }
  void WriteUrgent(WriteFn fn, WriteDone done) override {
    queue_.Push({std::move(fn), std::move(done)}, /*urgent=*/true);
  }
  // Marked for the backend's writer, which may tell it early (SQLite) or not (PostgreSQL).
  void WriteDeferred(WriteFn fn, WriteDone done) override {
    queue_.Push({std::move(fn), std::move(done), /*deferred=*/true});
  }
  // REQUIRES: before the writer starts.
  void SetCommitListener(std::function<void(const std::vector<Event>&)> listener) override {
    listener_ = std::move(listener);
  }
  StoreStats stats() const override { return queue_.stats(); }

 protected:
  WriteQueue queue_;
  std::function<void(const std::vector<Event>&)> listener_;  // called on the writer thread
};

}  // namespace keel::store

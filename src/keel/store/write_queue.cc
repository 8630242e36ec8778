#include "keel/store/write_queue.h"

#include <utility>

namespace keel::store {

void WriteQueue::Push(PendingUnit unit, bool urgent) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      auto at = urgent ? queue_.begin() + static_cast<std::ptrdiff_t>(urgent_++) : queue_.end();
      queue_.insert(at, std::move(unit));
      cv_.notify_one();
      return;
    }
  }
  unit.done(Unavailable("store is closed"), {});
}

bool WriteQueue::Take(size_t max, std::vector<PendingUnit>& batch) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
  return MoveFront(max, batch);
}

bool WriteQueue::TakeUntil(size_t max, std::vector<PendingUnit>& batch,
                           std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return closed_ || !queue_.empty(); });
  return MoveFront(max, batch);
}

bool WriteQueue::MoveFront(size_t max, std::vector<PendingUnit>& batch) {
  if (queue_.empty()) return false;
  while (!queue_.empty() && batch.size() < max) {
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
    if (urgent_ > 0) --urgent_;
  }
  return true;
}

void WriteQueue::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

void WriteQueue::Finish(std::vector<PendingUnit>& batch, std::vector<Status>& results,
                        std::vector<std::vector<Event>>& events, const Status& commit,
                        int committed_units,
                        const std::function<void(const std::vector<Event>&)>& listener) {
  if (!commit.ok()) {
    for (size_t i = 0; i < batch.size(); ++i) {
      if (results[i].ok()) results[i] = commit;
      events[i].clear();
    }
    committed_units = 0;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (committed_units > 0) ++stats_.commits;
    stats_.units += committed_units;
    stats_.failed_units += static_cast<int64_t>(batch.size()) - committed_units;
  }
  if (listener && committed_units > 0) {
    for (const auto& ev : events) {
      if (!ev.empty()) listener(ev);  // unit by unit: no copy of the batch's events
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].done)
      std::exchange(batch[i].done, nullptr)(std::move(results[i]), std::move(events[i]));
  }
}

StoreStats WriteQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace keel::store

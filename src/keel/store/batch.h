#pragma once
// Internal to the store backends: how a writer finishes a batch of units once its transaction
// committed or failed, the same way on every backend. A failed commit fails every unit that
// had succeeded, with the commit's status, and drops their events; the store's counters move;
// the commit listener sees the committed events in order; then each unit's callback runs.

#include <functional>
#include <mutex>
#include <vector>

#include "keel/store/store.h"

namespace keel::store {

// One queued unit of work and whom to tell how it ended.
struct PendingUnit {
  WriteFn fn;
  WriteDone done;
};

// `results[i]` and `events[i]` belong to `batch[i]`; `committed_units` counts the units that
// committed (0 when `commit` failed).
inline void FinishBatch(std::vector<PendingUnit>& batch, std::vector<Status>& results,
                        std::vector<std::vector<Event>>& events, const Status& commit,
                        int committed_units, std::mutex& stats_mu, StoreStats& stats,
                        const std::function<void(const std::vector<Event>&)>& listener) {
  if (!commit.ok()) {
    for (size_t i = 0; i < batch.size(); ++i) {
      if (results[i].ok()) results[i] = commit;
      events[i].clear();
    }
    committed_units = 0;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    if (committed_units > 0) ++stats.commits;
    stats.units += committed_units;
    stats.failed_units += static_cast<int64_t>(batch.size()) - committed_units;
  }
  if (listener && committed_units > 0) {
    for (const auto& ev : events) {
      if (!ev.empty()) listener(ev);  // unit by unit: no copy of the batch's events
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].done) batch[i].done(std::move(results[i]), std::move(events[i]));
  }
}

}  // namespace keel::store

#pragma once
// Holds a store's writer in a unit of its own (for at most `most`) until the returned promise
// is set, so that the units queued meanwhile share the next transaction. Returns once the
// writer is inside that unit.

#include <chrono>
#include <future>
#include <memory>
#include <utility>

#include "keel/store/store.h"

namespace keel::store {

inline std::shared_ptr<std::promise<void>> HoldWriter(
    Store& store, std::chrono::milliseconds most = std::chrono::milliseconds(500)) {
  auto gate = std::make_shared<std::promise<void>>();
  std::shared_future<void> open = gate->get_future().share();
  auto started = std::make_shared<std::promise<void>>();
  std::future<void> running = started->get_future();
  store.Write(
      [open, started, most, told = false](Tx&) mutable -> Status {
        if (!std::exchange(told, true)) started->set_value();
        open.wait_for(most);
        return Status::Ok();
      },
      nullptr);
  running.wait();
  return gate;
}

}  // namespace keel::store

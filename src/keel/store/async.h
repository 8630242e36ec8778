#pragma once
// Awaitable bridges to the store for coroutines: AsyncWrite suspends the caller until its unit
// of work is durable (or failed), AsyncRead until its read is done (Store::ReadAsync: off the
// event loop when reads wait on a network); both resume it on the caller's executor.

#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <functional>
#include <memory>
#include <vector>

#include "keel/store/store.h"

namespace keel::store {

// Returns the events the unit appended, or the unit's failure; `kind` says which of
// Store::Write, WriteUrgent and WriteDeferred queues it (a deferred unit's events come with the
// commit, not here).
inline boost::asio::awaitable<Result<std::vector<Event>>> AsyncWrite(
    Store& store, WriteFn fn, WriteKind kind = WriteKind::kNormal) {
  auto [status, events] = co_await boost::asio::async_initiate<const boost::asio::use_awaitable_t<>,
                                                               void(Status, std::vector<Event>)>(
      [&store, &fn, kind](auto handler) {
        auto ex = boost::asio::get_associated_executor(handler);
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        WriteDone done = [h, ex](Status s, std::vector<Event> ev) {
          boost::asio::post(ex, [h, s = std::move(s), ev = std::move(ev)]() mutable {
            (*h)(std::move(s), std::move(ev));
          });
        };
        switch (kind) {
          case WriteKind::kNormal:
            store.Write(std::move(fn), std::move(done));
            break;
          case WriteKind::kUrgent:
            store.WriteUrgent(std::move(fn), std::move(done));
            break;
          case WriteKind::kDeferred:
            store.WriteDeferred(std::move(fn), std::move(done));
            break;
        }
      },
      boost::asio::use_awaitable);
  if (!status.ok()) co_return status;
  co_return std::move(events);
}

// Returns once every unit queued before it is durable (or failed): what a caller of
// WriteDeferred awaits before it acknowledges its unit to anyone.
inline boost::asio::awaitable<Status> AsyncFlush(Store& store) {
  auto flushed = co_await AsyncWrite(store, [](Tx&) { return Status::Ok(); });
  co_return flushed.status();
}

// Runs `fn` in a read-only snapshot; returns its status.
inline boost::asio::awaitable<Status> AsyncRead(Store& store, std::function<Status(Tx&)> fn) {
  co_return co_await boost::asio::async_initiate<const boost::asio::use_awaitable_t<>,
                                                 void(Status)>(
      [&store, &fn](auto handler) {
        auto ex = boost::asio::get_associated_executor(handler);
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        store.ReadAsync(std::move(fn), [h, ex](Status s) {
          boost::asio::post(ex, [h, s = std::move(s)]() mutable { (*h)(std::move(s)); });
        });
      },
      boost::asio::use_awaitable);
}

}  // namespace keel::store

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

// Returns the events the unit appended, or the unit's failure. `urgent`: Store::WriteUrgent.
inline boost::asio::awaitable<Result<std::vector<Event>>> AsyncWrite(Store& store, WriteFn fn,
                                                                    bool urgent = false) {
  auto [status, events] = co_await boost::asio::async_initiate<
      const boost::asio::use_awaitable_t<>, void(Status, std::vector<Event>)>(
      [&store, &fn, urgent](auto handler) {
        auto ex = boost::asio::get_associated_executor(handler);
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        WriteDone done = [h, ex](Status s, std::vector<Event> ev) {
          boost::asio::post(ex, [h, s = std::move(s), ev = std::move(ev)]() mutable {
            (*h)(std::move(s), std::move(ev));
          });
        };
        if (urgent) {
          store.WriteUrgent(std::move(fn), std::move(done));
        } else {
          store.Write(std::move(fn), std::move(done));
        }
      },
      boost::asio::use_awaitable);
  if (!status.ok()) co_return status;
  co_return std::move(events);
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

#pragma once
// Await: runs an awaitable to its end on an io_context of its own, for tests of code that is
// awaited on the event loop (plugins, the bus). Whatever it co_spawned meanwhile runs too.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <utility>

namespace keel {

template <typename T>
T Await(boost::asio::awaitable<T> awaitable) {
  boost::asio::io_context io;
  auto done = boost::asio::co_spawn(io, std::move(awaitable), boost::asio::use_future);
  io.run();
  return done.get();
}

}  // namespace keel

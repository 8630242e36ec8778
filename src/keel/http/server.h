#pragma once
// The HTTP/1.1 server on Boost.Beast with C++20 coroutines: accepts connections, reads requests
// (bodies over the limit are answered 413), dispatches them through the Router and writes the
// answers, keeping connections alive. Streaming responses (SSE) hold their connection.
//
// Runs on the io_context it is given; Stop() closes the acceptor and open connections.

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "keel/common/status.h"

namespace keel {
struct Metrics;
}

namespace keel::http {

class Router;

class Server {
 public:
  Server(boost::asio::io_context& io, const Router& router, Metrics& metrics,
         int64_t max_body_bytes);
  ~Server();

  // Binds "HOST:PORT" (port 0 picks a free one). Returns the bound "HOST:PORT".
  Result<std::string> Listen(const std::string& address);
  void Start();
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::http

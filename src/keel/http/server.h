#pragma once
// The HTTP/1.1 server on Boost.Beast with C++20 coroutines: accepts connections, reads requests
// (bodies over the limit are answered 413), dispatches them through the Router and writes the
// answers, keeping connections alive. Streaming responses (SSE, WebSocket) hold their
// connection.
//
// Every open connection, streams included, counts toward ServerOptions' limits; a connection
// over a limit is answered 503 and closed. Slow heads, slow bodies and idle kept-alive
// connections are closed after their timeouts. A refused request (413, malformed) is answered,
// then the rest of what the client sends is read and dropped for a bounded time and size, so
// the client reads the answer instead of a reset connection.
//
// Runs on the io_context it is given (one thread); Stop() closes the acceptor and ends reading
// on open connections: idle ones close at once, a request in flight still gets its answer.

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "keel/common/status.h"
#include "keel/http/cors.h"

namespace keel {
struct Metrics;
}

namespace keel::http {

class Router;

struct ServerOptions {
  int64_t max_body_bytes = 1 << 20;
  int max_connections = 1024;             // open connections on this server
  int max_connections_per_address = 256;  // open connections from one client IP address
  // A request's head must arrive within this, from the connection's start or (on a kept-alive
  // connection) from its first byte.
  std::chrono::milliseconds header_timeout{10000};
  // A request's body must arrive within this, from the end of its head.
  std::chrono::milliseconds body_timeout{30000};
  // A kept-alive connection without a request in flight is closed after this.
  std::chrono::milliseconds idle_timeout{30000};
  CorsPolicy cors;  // which browser pages of other origins may read the answers
};

// Whether a server could listen on "HOST:PORT" now: checked before a server writes anything, so
// that one started on a port another server holds stops before it touches its store.
Status CheckCanListen(const std::string& address);

class Server {
 public:
  Server(boost::asio::io_context& io, const Router& router, Metrics& metrics,
         ServerOptions options);
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

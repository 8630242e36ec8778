#pragma once
// A small async HTTP/1.1 client for calls to upstream services (model providers). It speaks
// http:// and https:// (TLS with SNI, peer and host name verified against the system's default
// trust store), applies a timeout to every network wait, and can hand a response over while its
// body is still arriving, which Server-Sent Events need. Chunked transfer encoding is decoded.
//
// A response read to its end leaves its connection idle for the next request of the same
// client to the same origin on the same io_context (HTTP/1.1 keep-alive; at most 32 idle per
// context, each for at most 30 s, closed when the context shuts down), so that a model call does not
// pay a new connection and TLS handshake each time; a reused connection the server closed
// meanwhile is replaced once, before any byte of an answer. Redirects are not followed (a 3xx is an answer like any other). Callers see plain values and keel
// Statuses; Beast and OpenSSL stay inside client.cc.

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "keel/common/status.h"
#include "keel/http/outbound_guard.h"

namespace keel::http {

struct ClientRequest {
  std::string method = "GET";
  std::string url;  // http://host[:port]/path?query or https://...
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Bounds each wait on the network: resolving and connecting, the TLS handshake, sending the
  // request, the response head, and the gap between two pieces of the body. A stream that keeps
  // delivering bytes is never cut by it.
  std::chrono::milliseconds timeout{30000};
  // false for a request that must not reach the server twice (a chat message: the platform takes
  // no idempotency key): sent on a new connection, never on an idle one the server may have
  // closed, since a request lost that way is sent once more and one lost on a new connection
  // is reported (kUnavailable) for the caller to judge.
  bool may_repeat = true;
  // Bounds the whole request, from connecting to the end of the body, however its bytes
  // trickle in (0: only `timeout`, per wait). For servers a tenant chose.
  std::chrono::milliseconds total{0};
};

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-cased names; repeated ones joined by ", "
  std::string body;

  // The header's value, or "" when absent.
  std::string Header(const std::string& lower_name) const;
};

// A response whose head has arrived and whose body is read piece by piece as the server sends
// it. It owns the connection and closes it when destroyed.
//
// Executor: it belongs to the executor of the coroutine that opened it; calls to Next/ReadAll
// must come from that executor and must not overlap.
class ResponseStream {
 public:
  ~ResponseStream();
  ResponseStream(const ResponseStream&) = delete;
  ResponseStream& operator=(const ResponseStream&) = delete;

  int status() const;
  const std::map<std::string, std::string>& headers() const;  // lower-cased names
  // The header's value, or "" when absent.
  std::string Header(const std::string& lower_name) const;

  // The next piece of the body, as soon as some of it has arrived (chunk framing removed);
  // nullopt once the body is complete. Failures are kUnavailable: the connection dropped before
  // the body was complete, or no bytes came within the timeout.
  boost::asio::awaitable<Result<std::optional<std::string>>> Next();
  // Reads the rest of the body; kUnavailable when it exceeds `max_bytes`.
  boost::asio::awaitable<Result<std::string>> ReadAll(size_t max_bytes);
  // Body bytes delivered so far (after chunk decoding).
  int64_t body_bytes() const;

 private:
  friend class Client;
  struct Impl;
  explicit ResponseStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Sends requests. Thread-safe: it holds only the TLS configuration, and each request runs on the
// executor of the coroutine that awaits it. Owned by whoever calls out (e.g. a model provider).
class Client {
 public:
  struct Options {
    bool verify_peer = true;  // false only for tests against self-signed servers
    std::string ca_file;      // extra trust anchors (PEM), besides the system's defaults
    std::string user_agent = "keel/0.1";
    // Checked on every address a connection is about to use, after resolving: a request whose
    // host has no allowed address fails with kPermissionDenied and sends nothing. Unset: any
    // address, for upstreams the operator configured (model providers) only; whatever calls a
    // URL a tenant chose sets it.
    std::optional<OutboundGuard> outbound;
  };

  Client();
  explicit Client(Options options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends the request and returns once the response head has arrived; the body is left for the
  // caller to read. kInvalidArgument for a malformed URL; kPermissionDenied when the outbound
  // guard refuses every address of the host; kUnavailable when the server cannot be
  // reached, the TLS handshake fails, the connection drops or a wait times out. Any HTTP status
  // is a successful result.
  boost::asio::awaitable<Result<std::unique_ptr<ResponseStream>>> Open(
      const ClientRequest& request);

  // Open followed by ReadAll(max_body_bytes).
  boost::asio::awaitable<Result<ClientResponse>> Fetch(const ClientRequest& request,
                                                       size_t max_body_bytes = 32 << 20);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::http

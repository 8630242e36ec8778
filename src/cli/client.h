#pragma once
// cli::HttpClient — the CLI's small synchronous HTTP/1.1 client for the Keel API.
//
// Plain TCP only: the server binds loopback by default, and a TLS terminator in front of it is
// out of scope for the CLI. Each call opens its own connection, so a client is cheap to copy
// and holds no socket between calls. Not thread-safe; the CLI uses it from its one thread.
//
// Transport failures (cannot resolve, connect, read or write; a timeout) come back as a
// kUnavailable Status. Any HTTP answer, including 4xx and 5xx, is a successful HttpResult: the
// caller decides what a status code means.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::cli {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpResult {
  int status = 0;
  std::string body;
};

// One Server-Sent Event. `id` and `event` are empty when the server sent none.
struct SseEvent {
  std::string id;
  std::string event;
  std::string data;
};

// An open SSE response, read one event at a time. Owns its connection; destroying it closes
// the connection. Obtained from HttpClient::OpenStream once the response headers arrived, so a
// caller can open the stream, then trigger what it wants to watch, without missing events.
class SseStream {
 public:
  struct Impl;
  explicit SseStream(std::unique_ptr<Impl> impl);
  ~SseStream();
  SseStream(const SseStream&) = delete;
  SseStream& operator=(const SseStream&) = delete;

  // Blocks until the next event. nullopt when the server ended the stream; kUnavailable on a
  // transport error or when the deadline passed.
  Result<std::optional<SseEvent>> Next();

  // Bounds how long Next() may wait in total; by default it waits forever.
  void SetDeadline(std::chrono::steady_clock::time_point deadline);

 private:
  std::unique_ptr<Impl> impl_;
};

class HttpClient {
 public:
  // Accepts "http://host:port", "http://host:port/prefix" and a bare "host:port" (the form the
  // server writes to listen.addr). https:// is rejected with kInvalidArgument.
  static Result<HttpClient> Create(std::string_view url, std::string token);

  // Sends one request with `Authorization: Bearer <token>` (when a token is set) and, when
  // `body` is given, a JSON body. `timeout` bounds the whole exchange.
  Result<HttpResult> Call(std::string_view method, std::string_view target,
                          const std::optional<Json>& body = std::nullopt,
                          const Headers& extra_headers = {},
                          std::chrono::seconds timeout = std::chrono::seconds(60)) const;

  // Opens a Server-Sent Events stream with GET. When the server answers with a status other
  // than 200, the result is a successful HttpResult carrying it (and the stream is closed);
  // otherwise the stream, with its headers already read.
  struct Opened {
    std::unique_ptr<SseStream> stream;  // set on a 200 answer
    HttpResult error;                   // the answer otherwise
  };
  Result<Opened> OpenStream(std::string_view target, const Headers& extra_headers = {}) const;

  // Convenience over OpenStream: calls `on_event` for each event until it returns false or the
  // server ends the stream. A non-200 answer is returned as the HttpResult.
  Result<HttpResult> Stream(std::string_view target, const Headers& extra_headers,
                            const std::function<bool(const SseEvent&)>& on_event) const;

  // The base URL as the user should see it in messages ("http://127.0.0.1:7878").
  const std::string& url() const { return url_; }

 private:
  HttpClient() = default;

  std::string url_;
  std::string host_;
  std::string port_;
  std::string prefix_;  // path prefix without a trailing slash; usually empty
  std::string token_;
};

}  // namespace keel::cli

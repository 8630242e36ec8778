#pragma once
// One attempt of an HTTP model call, shared by the openai and anthropic providers (and included
// by their .cc files only): opens the request; turns an error answer into a retryable or final
// failure (provider_http.h); reads a streamed answer event by event through the wire format's
// accumulator, passing text deltas on as they arrive; or parses a whole answer from a server
// that ignored "stream".
//
// `Wire` describes a wire format:
//   Names, Accumulator (constructed from const Names&; done(), Finish())
//   static Status Add(Accumulator&, const openai::SseEvent&, std::string& delta)
//   static bool Complete(const Accumulator&)   // what was read makes a whole answer
//   static std::string ErrorMessage(std::string_view body)
//   static Result<ModelResponse> ParseWhole(std::string_view body, const Names&)
//   static constexpr const char* kIncomplete  // why a stream that ended early failed

#include <boost/asio/awaitable.hpp>

#include <string>
#include <utility>
#include <vector>

#include "keel/http/client.h"
#include "keel/model/openai_wire.h"
#include "keel/model/provider_http.h"

namespace keel::model {

inline constexpr size_t kMaxErrorBody = 1 << 20;
inline constexpr size_t kMaxWholeBody = 32 << 20;

// Reads an event stream until the accumulator is done or the body ends.
template <typename Wire>
boost::asio::awaitable<Attempt> ReadEventStream(http::ResponseStream& stream,
                                                const typename Wire::Names& names,
                                                const DeltaSink& on_delta) {
  openai::SseParser sse;
  typename Wire::Accumulator message(names);
  std::vector<openai::SseEvent> events;
  std::string delta;
  bool ended = false;
  while (!message.done() && !ended) {
    auto piece = co_await stream.Next();
    if (!piece.ok()) {
      if (stream.body_bytes() == 0) co_return FailedAttempt(piece.status(), true);
      co_return FailedAttempt(
          Unavailable("the response stream broke off: " + piece.status().message()), false);
    }
    if (piece->has_value()) {
      Status fed = sse.Feed(**piece, events);
      if (!fed.ok()) co_return FailedAttempt(fed, false);
    } else {
      ended = true;
      if (auto last = sse.Finish()) events.push_back(std::move(*last));
    }
    for (const auto& event : events) {
      Status added = Wire::Add(message, event, delta);
      if (!added.ok()) co_return FailedAttempt(added, false);
      if (!delta.empty() && on_delta) on_delta(delta);
      if (message.done()) break;
    }
    events.clear();
  }
  if (!Wire::Complete(message)) {
    co_return FailedAttempt(Unavailable(Wire::kIncomplete), stream.body_bytes() == 0);
  }
  Attempt a;
  a.result = message.Finish();
  co_return a;
}

template <typename Wire>
boost::asio::awaitable<Attempt> AttemptOnce(http::Client& client, const http::ClientRequest& req,
                                            const typename Wire::Names& names,
                                            const DeltaSink& on_delta) {
  auto opened = co_await client.Open(req);
  if (!opened.ok()) {
    co_return FailedAttempt(opened.status(), opened.status().code() == Code::kUnavailable);
  }
  http::ResponseStream& stream = **opened;
  const int status = stream.status();
  if (status < 200 || status > 299) {
    auto body = co_await stream.ReadAll(kMaxErrorBody);
    std::string what = "HTTP " + std::to_string(status) + " from " + req.url + ": " +
                       (body.ok() ? Wire::ErrorMessage(*body) : body.status().message());
    if (RetryableHttpStatus(status)) {
      Attempt a = FailedAttempt(Unavailable(std::move(what)), true);
      a.retry_after = ParseRetryAfter(stream.Header("retry-after"));
      co_return a;
    }
    co_return FailedAttempt(StatusForHttp(status, std::move(what)), false);
  }
  if (LowerAscii(stream.Header("content-type")).find("text/event-stream") != std::string::npos) {
    co_return co_await ReadEventStream<Wire>(stream, names, on_delta);
  }
  auto body = co_await stream.ReadAll(kMaxWholeBody);
  if (!body.ok()) co_return FailedAttempt(body.status(), stream.body_bytes() == 0);
  Attempt a;
  a.result = Wire::ParseWhole(*body, names);
  if (a.result.ok() && !a.result->text.empty() && on_delta) on_delta(a.result->text);
  co_return a;
}

}  // namespace keel::model

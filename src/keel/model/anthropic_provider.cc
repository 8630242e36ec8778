#include "keel/model/anthropic_provider.h"

#include <functional>
#include <utility>
#include <vector>

#include "keel/http/client.h"
#include "keel/model/anthropic_wire.h"

namespace keel::model {
namespace {

using std::chrono::milliseconds;

constexpr size_t kMaxErrorBody = 1 << 20;
constexpr size_t kMaxMessageBody = 32 << 20;

std::string MessagesUrl(std::string base) {
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/v1/messages";
}

// Reads an event stream to its end (message_stop), passing text deltas on as they arrive.
boost::asio::awaitable<Attempt> ReadEventStream(http::ResponseStream& stream,
                                                const anthropic::ToolNameMap& names,
                                                const DeltaSink& on_delta) {
  anthropic::SseParser sse;
  anthropic::MessageStreamAccumulator message(names);
  std::vector<anthropic::SseEvent> events;
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
      Status added = message.Add(event, delta);
      if (!added.ok()) co_return FailedAttempt(added, false);
      if (!delta.empty() && on_delta) on_delta(delta);
      if (message.done()) break;
    }
    events.clear();
  }
  if (!message.done()) {
    co_return FailedAttempt(
        Unavailable("the response stream ended before message_stop (the message is incomplete)"),
        stream.body_bytes() == 0);
  }
  Attempt a;
  a.result = message.Finish();
  co_return a;
}

boost::asio::awaitable<Attempt> AttemptOnce(http::Client& client, const http::ClientRequest& req,
                                            const anthropic::ToolNameMap& names,
                                            const DeltaSink& on_delta) {
  auto opened = co_await client.Open(req);
  if (!opened.ok()) {
    co_return FailedAttempt(opened.status(), opened.status().code() == Code::kUnavailable);
  }
  http::ResponseStream& stream = **opened;
  const int status = stream.status();
  if (status < 200 || status > 299) {
    auto body = co_await stream.ReadAll(kMaxErrorBody);
    std::string what =
        "HTTP " + std::to_string(status) + " from " + req.url + ": " +
        (body.ok() ? anthropic::ErrorMessageFromBody(*body) : body.status().message());
    if (RetryableHttpStatus(status)) {
      Attempt a = FailedAttempt(Unavailable(std::move(what)), true);
      a.retry_after = ParseRetryAfter(stream.Header("retry-after"));
      co_return a;
    }
    co_return FailedAttempt(StatusForHttp(status, std::move(what)), false);
  }
  if (LowerAscii(stream.Header("content-type")).find("text/event-stream") != std::string::npos) {
    co_return co_await ReadEventStream(stream, names, on_delta);
  }
  // A server that ignored "stream" answers with the whole message.
  auto body = co_await stream.ReadAll(kMaxMessageBody);
  if (!body.ok()) co_return FailedAttempt(body.status(), stream.body_bytes() == 0);
  Attempt a;
  a.result = anthropic::ParseMessage(*body, names);
  if (a.result.ok() && !a.result->text.empty() && on_delta) on_delta(a.result->text);
  co_return a;
}

}  // namespace

AnthropicProvider::AnthropicProvider(config::AnthropicConfig config, RetryBackoff backoff)
    : config_(std::move(config)), backoff_(backoff), client_(std::make_unique<http::Client>()) {}

AnthropicProvider::~AnthropicProvider() = default;

boost::asio::awaitable<Result<ModelResponse>> AnthropicProvider::Complete(
    const ModelRequest& request, DeltaSink on_delta) {
  if (config_.api_key.empty()) {
    co_return Unauthenticated(
        "anthropic: no API key: set ANTHROPIC_API_KEY (or api_key in the [anthropic] section of "
        "keel.toml)");
  }
  if (request.model.empty()) co_return InvalidArgument("anthropic: the request names no model");

  anthropic::ToolNameMap names;
  auto body = anthropic::BuildMessagesRequest(request, /*stream=*/true, config_.max_tokens, names);
  if (!body.ok()) co_return Status(body.status().code(), "anthropic: " + body.status().message());

  http::ClientRequest req;
  req.method = "POST";
  req.url = MessagesUrl(config_.base_url);
  req.headers = {{"Content-Type", "application/json"},
                 {"Accept", "text/event-stream"},
                 {"x-api-key", config_.api_key},
                 {"anthropic-version", anthropic::kApiVersion}};
  req.body = DumpJson(*body);
  req.timeout = milliseconds(config_.timeout_ms > 0 ? config_.timeout_ms : 60000);

  std::function<boost::asio::awaitable<Attempt>()> attempt = [&]() {
    return AttemptOnce(*client_, req, names, on_delta);
  };
  std::string prefix = "anthropic";
  co_return co_await CallWithRetries(prefix, config_.max_retries, backoff_, attempt);
}

}  // namespace keel::model

#include "keel/model/openai_provider.h"

#include <functional>
#include <optional>
#include <utility>

#include "keel/http/client.h"
#include "keel/model/openai_wire.h"
#include "keel/model/provider_http.h"

namespace keel::model {
namespace {

using std::chrono::milliseconds;

constexpr size_t kMaxErrorBody = 1 << 20;
constexpr size_t kMaxCompletionBody = 32 << 20;

std::string CompletionsUrl(std::string base) {
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/chat/completions";
}

// True when the base URL points at OpenAI's own API, which always wants a key.
bool IsOpenAiHost(const std::string& base_url) {
  std::string url = LowerAscii(base_url);
  size_t start = url.find("://");
  start = start == std::string::npos ? 0 : start + 3;
  size_t end = url.find_first_of(":/?#", start);
  std::string host = url.substr(start, end == std::string::npos ? std::string::npos : end - start);
  return host == "api.openai.com";
}

// Reads an event stream to its end, passing text deltas on as they arrive.
boost::asio::awaitable<Attempt> ReadEventStream(http::ResponseStream& stream,
                                                const openai::ToolNameMap& names,
                                                const DeltaSink& on_delta) {
  openai::SseParser sse;
  openai::ChatStreamAccumulator chunks(names);
  std::vector<openai::SseEvent> events;
  std::string delta;
  bool ended = false;
  while (!chunks.done() && !ended) {
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
      Status added = chunks.Add(event.data, delta);
      if (!added.ok()) co_return FailedAttempt(added, false);
      if (!delta.empty() && on_delta) on_delta(delta);
      if (chunks.done()) break;
    }
    events.clear();
  }
  if (!chunks.done() && chunks.finish_reason().empty()) {
    co_return FailedAttempt(
        Unavailable("the response stream ended before the response was complete"),
        stream.body_bytes() == 0);
  }
  Attempt a;
  a.result = chunks.Finish();
  co_return a;
}

boost::asio::awaitable<Attempt> AttemptOnce(http::Client& client, const http::ClientRequest& req,
                                            const openai::ToolNameMap& names,
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
                       (body.ok() ? openai::ErrorMessageFromBody(*body) : body.status().message());
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
  // A server that ignored "stream" answers with one JSON completion.
  auto body = co_await stream.ReadAll(kMaxCompletionBody);
  if (!body.ok()) co_return FailedAttempt(body.status(), stream.body_bytes() == 0);
  Attempt a;
  a.result = openai::ParseChatCompletion(*body, names);
  if (a.result.ok() && !a.result->text.empty() && on_delta) on_delta(a.result->text);
  co_return a;
}

}  // namespace

OpenAiProvider::OpenAiProvider(config::OpenAiConfig config)
    : OpenAiProvider(std::move(config), Backoff{}) {}

OpenAiProvider::OpenAiProvider(config::OpenAiConfig config, Backoff backoff)
    : config_(std::move(config)), backoff_(backoff), client_(std::make_unique<http::Client>()) {}

OpenAiProvider::~OpenAiProvider() = default;

boost::asio::awaitable<Result<ModelResponse>> OpenAiProvider::Complete(const ModelRequest& request,
                                                                       DeltaSink on_delta) {
  if (config_.api_key.empty() && IsOpenAiHost(config_.base_url)) {
    co_return Unauthenticated(
        "openai: no API key for " + config_.base_url +
        ": set OPENAI_API_KEY (or api_key in the [openai] section of keel.toml)");
  }
  if (request.model.empty()) co_return InvalidArgument("openai: the request names no model");

  openai::ToolNameMap names;
  auto body = openai::BuildChatRequest(request, /*stream=*/true, names);
  if (!body.ok()) co_return Status(body.status().code(), "openai: " + body.status().message());

  http::ClientRequest req;
  req.method = "POST";
  req.url = CompletionsUrl(config_.base_url);
  req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  if (!config_.api_key.empty())
    req.headers.push_back({"Authorization", "Bearer " + config_.api_key});
  req.body = DumpJson(*body);
  req.timeout = milliseconds(config_.timeout_ms > 0 ? config_.timeout_ms : 60000);

  std::function<boost::asio::awaitable<Attempt>()> attempt = [&]() {
    return AttemptOnce(*client_, req, names, on_delta);
  };
  std::string prefix = "openai";
  co_return co_await CallWithRetries(prefix, config_.max_retries, backoff_, attempt);
}

}  // namespace keel::model

#include "keel/model/openai_provider.h"

#include <algorithm>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cctype>
#include <exception>
#include <optional>
#include <random>
#include <utility>

#include "keel/http/client.h"
#include "keel/model/openai_wire.h"

namespace keel::model {
namespace {

using std::chrono::milliseconds;

constexpr size_t kMaxErrorBody = 1 << 20;
constexpr size_t kMaxCompletionBody = 32 << 20;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string CompletionsUrl(std::string base) {
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/chat/completions";
}

// True when the base URL points at OpenAI's own API, which always wants a key.
bool IsOpenAiHost(const std::string& base_url) {
  std::string url = Lower(base_url);
  size_t start = url.find("://");
  start = start == std::string::npos ? 0 : start + 3;
  size_t end = url.find_first_of(":/?#", start);
  std::string host = url.substr(start, end == std::string::npos ? std::string::npos : end - start);
  return host == "api.openai.com";
}

// Retry-After in seconds ("3", "1.5"); HTTP dates are ignored, as the backoff covers them.
std::optional<milliseconds> ParseRetryAfter(const std::string& value) {
  std::string v;
  for (char c : value) {
    if (c != ' ' && c != '\t') v.push_back(c);
  }
  if (v.empty() || v.size() > 12) return std::nullopt;
  int64_t whole = 0;
  int64_t millis = 0;
  int64_t scale = 100;
  bool fraction = false;
  for (char c : v) {
    if (c == '.' && !fraction) {
      fraction = true;
    } else if (c >= '0' && c <= '9') {
      if (!fraction) {
        whole = whole * 10 + (c - '0');
      } else if (scale > 0) {
        millis += (c - '0') * scale;
        scale /= 10;
      }
    } else {
      return std::nullopt;
    }
  }
  return milliseconds(whole * 1000 + millis);
}

Status StatusForHttp(int status, std::string message) {
  switch (status) {
    case 401:
      return Unauthenticated(std::move(message));
    case 403:
      return PermissionDenied(std::move(message));
    case 404:
      return NotFound(std::move(message));
    case 413:
      return Status(Code::kPayloadTooLarge, std::move(message));
    default:
      return status >= 500 ? Unavailable(std::move(message)) : InvalidArgument(std::move(message));
  }
}

Status WithPrefix(const Status& status, const std::string& suffix = "") {
  return Status(status.code(), "openai: " + status.message() + suffix);
}

// How one attempt ended.
struct Attempt {
  Result<ModelResponse> result = Internal("not attempted");
  bool retryable = false;  // nothing reached the caller, and trying again may succeed
  std::optional<milliseconds> retry_after;
};

Attempt Failed(Status status, bool retryable) {
  Attempt a;
  a.result = std::move(status);
  a.retryable = retryable;
  return a;
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
      if (stream.body_bytes() == 0) co_return Failed(piece.status(), true);
      co_return Failed(Unavailable("the response stream broke off: " + piece.status().message()),
                       false);
    }
    if (piece->has_value()) {
      Status fed = sse.Feed(**piece, events);
      if (!fed.ok()) co_return Failed(fed, false);
    } else {
      ended = true;
      if (auto last = sse.Finish()) events.push_back(std::move(*last));
    }
    for (const auto& event : events) {
      Status added = chunks.Add(event.data, delta);
      if (!added.ok()) co_return Failed(added, false);
      if (!delta.empty() && on_delta) on_delta(delta);
      if (chunks.done()) break;
    }
    events.clear();
  }
  if (!chunks.done() && chunks.finish_reason().empty()) {
    co_return Failed(Unavailable("the response stream ended before the response was complete"),
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
    co_return Failed(opened.status(), opened.status().code() == Code::kUnavailable);
  }
  http::ResponseStream& stream = **opened;
  const int status = stream.status();
  if (status < 200 || status > 299) {
    auto body = co_await stream.ReadAll(kMaxErrorBody);
    std::string what = "HTTP " + std::to_string(status) + " from " + req.url + ": " +
                       (body.ok() ? openai::ErrorMessageFromBody(*body) : body.status().message());
    if (status == 408 || status == 429 || status >= 500) {
      Attempt a = Failed(Unavailable(std::move(what)), true);
      a.retry_after = ParseRetryAfter(stream.Header("retry-after"));
      co_return a;
    }
    co_return Failed(StatusForHttp(status, std::move(what)), false);
  }
  if (Lower(stream.Header("content-type")).find("text/event-stream") != std::string::npos) {
    co_return co_await ReadEventStream(stream, names, on_delta);
  }
  // A server that ignored "stream" answers with one JSON completion.
  auto body = co_await stream.ReadAll(kMaxCompletionBody);
  if (!body.ok()) co_return Failed(body.status(), stream.body_bytes() == 0);
  Attempt a;
  a.result = openai::ParseChatCompletion(*body, names);
  if (a.result.ok() && !a.result->text.empty() && on_delta) on_delta(a.result->text);
  co_return a;
}

milliseconds BackoffDelay(const OpenAiProvider::Backoff& backoff, int retry) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  int64_t base = backoff.initial.count();
  for (int i = 1; i < retry && base < backoff.max.count(); ++i) base *= 2;
  base = std::min<int64_t>(base, backoff.max.count());
  // Jitter spreads clients that failed together: somewhere in [base/2, base].
  std::uniform_int_distribution<int64_t> jitter(0, base / 2);
  return milliseconds(base - jitter(rng));
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
  if (!body.ok()) co_return WithPrefix(body.status());

  http::ClientRequest req;
  req.method = "POST";
  req.url = CompletionsUrl(config_.base_url);
  req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  if (!config_.api_key.empty())
    req.headers.push_back({"Authorization", "Bearer " + config_.api_key});
  req.body = DumpJson(*body);
  req.timeout = milliseconds(config_.timeout_ms > 0 ? config_.timeout_ms : 60000);

  const int attempts = std::max(0, config_.max_retries) + 1;
  Attempt last;
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    if (attempt > 1) {
      milliseconds delay = last.retry_after ? std::min(*last.retry_after, backoff_.max_retry_after)
                                            : BackoffDelay(backoff_, attempt - 1);
      boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
      timer.expires_after(delay);
      boost::system::error_code ignored;
      co_await timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ignored));
    }
    try {
      last = co_await AttemptOnce(*client_, req, names, on_delta);
    } catch (const std::exception& e) {
      last = Failed(Internal(std::string("unexpected failure: ") + e.what()), false);
    }
    if (last.result.ok()) co_return std::move(last.result);
    if (!last.retryable) co_return WithPrefix(last.result.status());
  }
  co_return WithPrefix(last.result.status(),
                       " (gave up after " + std::to_string(attempts) + " attempts)");
}

}  // namespace keel::model

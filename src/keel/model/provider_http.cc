#include "keel/model/provider_http.h"

#include <algorithm>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cctype>
#include <exception>
#include <random>

namespace keel::model {

using std::chrono::milliseconds;

namespace {

milliseconds BackoffDelay(const RetryBackoff& backoff, int retry) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  int64_t base = backoff.initial.count();
  for (int i = 1; i < retry && base < backoff.max.count(); ++i) base *= 2;
  base = std::min<int64_t>(base, backoff.max.count());
  // Jitter spreads clients that failed together: somewhere in [base/2, base].
  std::uniform_int_distribution<int64_t> jitter(0, base / 2);
  return milliseconds(base - jitter(rng));
}

Status WithPrefix(const std::string& prefix, const Status& status, const std::string& suffix) {
  return Status(status.code(), prefix + ": " + status.message() + suffix);
}

}  // namespace

Attempt FailedAttempt(Status status, bool retryable) {
  Attempt a;
  a.result = std::move(status);
  a.retryable = retryable;
  return a;
}

std::string LowerAscii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

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

boost::asio::awaitable<Result<ModelResponse>> CallWithRetries(
    std::string prefix, int max_retries, RetryBackoff backoff,
    std::function<boost::asio::awaitable<Attempt>()> attempt) {
  const int attempts = std::max(0, max_retries) + 1;
  Attempt last;
  for (int n = 1; n <= attempts; ++n) {
    if (n > 1) {
      milliseconds delay = last.retry_after ? std::min(*last.retry_after, backoff.max_retry_after)
                                            : BackoffDelay(backoff, n - 1);
      boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
      timer.expires_after(delay);
      boost::system::error_code ignored;
      co_await timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ignored));
    }
    try {
      last = co_await attempt();
    } catch (const std::exception& e) {
      last = FailedAttempt(Internal(std::string("unexpected failure: ") + e.what()), false);
    }
    if (last.result.ok()) co_return std::move(last.result);
    if (!last.retryable) co_return WithPrefix(prefix, last.result.status(), "");
  }
  co_return WithPrefix(prefix, last.result.status(),
                       " (gave up after " + std::to_string(attempts) + " attempts)");
}

}  // namespace keel::model

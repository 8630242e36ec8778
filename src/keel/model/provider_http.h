#pragma once
// What the HTTP model providers (openai, anthropic) share: the retry loop with exponential
// backoff and jitter, Retry-After, and the mapping of HTTP statuses to Status codes.
//
// A provider makes one Attempt at a time. An attempt is `retryable` only when nothing of it
// reached the caller (no delta was passed on) and trying again may succeed: a 408, 429 or 5xx
// answer, or a connection that failed before any byte of the body arrived. So a retry never
// sends a delta twice.

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "keel/common/status.h"
#include "keel/model/provider.h"

namespace keel::model {

// Retry pacing; tests shorten it.
struct RetryBackoff {
  std::chrono::milliseconds initial{500};  // doubles per retry; each wait drawn from [d/2, d]
  std::chrono::milliseconds max{8000};
  std::chrono::milliseconds max_retry_after{30000};  // cap on a server's Retry-After
};

// How one attempt ended.
struct Attempt {
  Result<ModelResponse> result = Internal("not attempted");
  bool retryable = false;  // nothing reached the caller, and trying again may succeed
  std::optional<std::chrono::milliseconds> retry_after;
};

Attempt FailedAttempt(Status status, bool retryable);

// Retry-After in seconds ("3", "1.5"); HTTP dates are ignored (nullopt), as the backoff covers
// them.
std::optional<std::chrono::milliseconds> ParseRetryAfter(const std::string& value);

// The Status of a non-retryable HTTP error answer: 401 kUnauthenticated, 403 kPermissionDenied,
// 404 kNotFound, 413 kPayloadTooLarge, 5xx kUnavailable, other 4xx kInvalidArgument.
Status StatusForHttp(int status, std::string message);

// Whether an HTTP error status is worth retrying: 408, 429 and every 5xx (529: overloaded).
inline bool RetryableHttpStatus(int status) {
  return status == 408 || status == 429 || status >= 500;
}

std::string LowerAscii(std::string s);

// Makes up to max_retries + 1 attempts, waiting between them (Retry-After when the server gave
// one, capped, else the backoff), and returns the first success or the last failure. Failures
// are prefixed with `prefix` ("openai: ..."); "(gave up after N attempts)" is appended when the
// retries ran out. An exception escaping an attempt is a non-retryable kInternal failure.
boost::asio::awaitable<Result<ModelResponse>> CallWithRetries(
    std::string prefix, int max_retries, RetryBackoff backoff,
    std::function<boost::asio::awaitable<Attempt>()> attempt);

}  // namespace keel::model

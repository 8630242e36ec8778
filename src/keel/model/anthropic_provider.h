#pragma once
// The `anthropic` model provider: Anthropic's Messages API with tools and streaming.
//
// A call POSTs {base_url}/v1/messages with the headers x-api-key and anthropic-version
// (2023-06-01) and "stream": true, and passes text deltas to the DeltaSink as they arrive. The
// request and the events are in anthropic_wire.h. Retries follow provider_http.h: a 408, 429 or
// 5xx answer (529: overloaded), or a connection that failed before any byte of the body
// arrived, is tried again with backoff up to max_retries times; a stream that breaks after that,
// an error event in the stream, or garbage fail the call with kUnavailable, so no delta is sent
// twice and nothing half-parsed is returned. Other 4xx answers fail at once with the server's
// message (401 kUnauthenticated, 403 kPermissionDenied, 404 kNotFound, 413 kPayloadTooLarge,
// else kInvalidArgument). timeout_ms bounds each network wait, not the whole call.
//
// Owned by the server's ProviderRegistry. Thread-safe: it keeps only its configuration and an
// HTTP client; each call runs on the executor of the coroutine that awaits Complete.

#include <memory>

#include "keel/config/config.h"
#include "keel/model/provider.h"
#include "keel/model/provider_http.h"

namespace keel::http {
class Client;
}

namespace keel::model {

class AnthropicProvider final : public Provider {
 public:
  explicit AnthropicProvider(config::AnthropicConfig config, RetryBackoff backoff = RetryBackoff{});
  ~AnthropicProvider() override;

  // Fails at once with kUnauthenticated naming ANTHROPIC_API_KEY when no key is configured
  // (whatever the base URL: the Messages API always wants one).
  boost::asio::awaitable<Result<ModelResponse>> Complete(const ModelRequest& request,
                                                         DeltaSink on_delta) override;

 private:
  config::AnthropicConfig config_;
  RetryBackoff backoff_;
  std::unique_ptr<http::Client> client_;
};

}  // namespace keel::model

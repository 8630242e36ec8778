#pragma once
// The `openai` model provider: OpenAI's Chat Completions API with tools and streaming. It also
// serves any compatible server (Ollama, vLLM, llama.cpp) through its base URL.
//
// A call POSTs {base_url}/chat/completions with "stream": true and passes text deltas to the
// DeltaSink as they arrive. Failures are retried with exponential backoff and jitter, up to
// max_retries times, when retrying cannot repeat output: a 429 or 5xx answer (honouring
// Retry-After, capped), or a connection that failed before any byte of the body arrived. A
// stream that breaks after that fails the call with kUnavailable, so no delta is sent twice.
// Other 4xx answers fail at once with the server's message. Status mapping: 400 and other 4xx
// -> kInvalidArgument, 401 -> kUnauthenticated, 403 -> kPermissionDenied, 404 -> kNotFound,
// 413 -> kPayloadTooLarge; network failures, 5xx, exhausted 429s and malformed output ->
// kUnavailable. The config's timeout_ms bounds each network wait (connecting, the response head,
// the gap between two pieces of the stream), not the whole call, so a long answer that keeps
// streaming is never cut.
//
// Owned by the server's ProviderRegistry. Thread-safe: it keeps only its configuration and an
// HTTP client; each call runs on the executor of the coroutine that awaits Complete.

#include <chrono>
#include <memory>

#include "keel/config/config.h"
#include "keel/model/provider.h"
#include "keel/model/provider_http.h"

namespace keel::http {
class Client;
}

namespace keel::model {

class OpenAiProvider final : public Provider {
 public:
  // Retry pacing; tests shorten it.
  using Backoff = RetryBackoff;

  explicit OpenAiProvider(config::OpenAiConfig config);
  OpenAiProvider(config::OpenAiConfig config, Backoff backoff);
  ~OpenAiProvider() override;

  // Fails with kUnauthenticated naming OPENAI_API_KEY when no key is configured for
  // api.openai.com; servers elsewhere (Ollama, ...) may need none.
  boost::asio::awaitable<Result<ModelResponse>> Complete(const ModelRequest& request,
                                                         DeltaSink on_delta) override;

 private:
  config::OpenAiConfig config_;
  Backoff backoff_;
  std::unique_ptr<http::Client> client_;
};

}  // namespace keel::model

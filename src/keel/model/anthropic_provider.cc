#include "keel/model/anthropic_provider.h"

#include <functional>
#include <utility>
#include <vector>

#include "keel/model/anthropic_wire.h"
#include "keel/model/provider_stream.h"

namespace keel::model {
namespace {

using std::chrono::milliseconds;

std::string MessagesUrl(std::string base) {
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/v1/messages";
}

// The Messages API's streamed events (provider_stream.h).
struct AnthropicWire {
  using Names = anthropic::ToolNameMap;
  using Accumulator = anthropic::MessageStreamAccumulator;
  static Status Add(Accumulator& a, const anthropic::SseEvent& e, std::string& delta) {
    return a.Add(e, delta);
  }
  static bool Complete(const Accumulator& a) { return a.done(); }
  static std::string ErrorMessage(std::string_view body) {
    return anthropic::ErrorMessageFromBody(body);
  }
  static Result<ModelResponse> ParseWhole(std::string_view body, const Names& names) {
    return anthropic::ParseMessage(body, names);
  }
  static constexpr const char* kIncomplete =
      "the response stream ended before message_stop (the message is incomplete)";
};

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
    return AttemptOnce<AnthropicWire>(*client_, req, names, on_delta);
  };
  std::string prefix = "anthropic";
  co_return co_await CallWithRetries(prefix, config_.max_retries, backoff_, attempt);
}

}  // namespace keel::model

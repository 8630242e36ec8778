#include "keel/model/openai_provider.h"

#include <functional>
#include <optional>
#include <utility>

#include "keel/model/openai_wire.h"
#include "keel/model/provider_stream.h"

namespace keel::model {
namespace {

using std::chrono::milliseconds;

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

// Chat Completions' streamed chunks (provider_stream.h).
struct OpenAiWire {
  using Names = openai::ToolNameMap;
  using Accumulator = openai::ChatStreamAccumulator;
  static Status Add(Accumulator& a, const openai::SseEvent& e, std::string& delta) {
    return a.Add(e.data, delta);
  }
  // Some servers end the stream after the finish_reason chunk without "[DONE]".
  static bool Complete(const Accumulator& a) { return a.done() || !a.finish_reason().empty(); }
  static std::string ErrorMessage(std::string_view body) {
    return openai::ErrorMessageFromBody(body);
  }
  static Result<ModelResponse> ParseWhole(std::string_view body, const Names& names) {
    return openai::ParseChatCompletion(body, names);
  }
  static constexpr const char* kIncomplete =
      "the response stream ended before the response was complete";
};

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
  req.body = std::move(*body);
  req.timeout = milliseconds(config_.timeout_ms > 0 ? config_.timeout_ms : 60000);

  std::function<boost::asio::awaitable<Attempt>()> attempt = [&]() {
    return AttemptOnce<OpenAiWire>(*client_, req, names, on_delta);
  };
  std::string prefix = "openai";
  co_return co_await CallWithRetries(prefix, config_.max_retries, backoff_, attempt);
}

}  // namespace keel::model

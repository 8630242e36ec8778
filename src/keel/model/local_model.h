#pragma once
// The built-in `local` model: deterministic, no network. It follows the agent's
// config.local_rules and a small grammar so demos and tests can drive every path:
//   - `/call TOOL {json}` lines in the last user message become tool calls (one per line);
//   - after tool results arrive, it answers with a sentence that includes each result;
//   - a rule {"match", "echo": "system" | "context"} answers with what it was sent: the system
//     prompt, or every message as "ROLE: CONTENT" (for tests of context assembly);
//   - anything else is answered with a short reply quoting the message.
// Token usage is counted as whitespace-separated words (input: every message; output: reply).

#include "keel/model/provider.h"

namespace keel::model {

class LocalModel final : public Provider {
 public:
  boost::asio::awaitable<Result<ModelResponse>> Complete(const ModelRequest& request,
                                                         DeltaSink on_delta) override;

  // The decision without streaming; exposed for tests.
  static Result<ModelResponse> Decide(const ModelRequest& request);
};

}  // namespace keel::model

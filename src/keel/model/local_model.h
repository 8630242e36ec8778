#pragma once
// The built-in `local` model: deterministic, no network. It follows the agent's
// config.local_rules and a small grammar so demos and tests can drive every path:
//   - `/call TOOL {json}` lines in the last user message become tool calls (one per line);
//   - after tool results arrive, it answers with a sentence that includes each result;
//   - a rule {"match", "echo": "system" | "context"} answers with what it was sent: the system
//     prompt, or every message as "ROLE: CONTENT" (for tests of context assembly);
//   - Keel's own requests (context_requests.h) are answered deterministically: a summary for
//     compaction, and the introspection tools' calls in an introspection run;
//   - anything else is answered with a short reply quoting the message.
// Token usage is counted as whitespace-separated words (input: every message; output: reply).

#include "keel/model/provider.h"

namespace keel::model {

class LocalModel final : public Provider {
 public:
  boost::asio::awaitable<Result<ModelResponse>> Complete(const ModelRequest& request,
                                                         DeltaSink on_delta) override;

  // Checks config.local_rules when an agent is written: its shape, and that each 'match' is an
  // RE2 pattern of at most 1 KiB.
  static Status CheckRules(const Json& rules);

  // The decision without streaming; exposed for tests.
  static Result<ModelResponse> Decide(const ModelRequest& request);
};

}  // namespace keel::model

#pragma once
// What bounds a turn's context (docs/CONTEXT.md): the agent config keys compaction and
// introspection read, checked when an agent is written, and the token estimate they use.
// Pure functions; the assembly itself is Runtime::AssembleContext (context.cc).

#include <cstdint>
#include <string_view>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::runtime {

inline constexpr int64_t kDefaultContextTokens = 16000;

struct ContextSettings {
  // The most tokens (estimated) a turn's context may hold before its oldest turns are compacted.
  int64_t context_tokens = kDefaultContextTokens;
  // Introspection triggers; 0 is off (the default).
  int64_t idle_seconds = 0;  // the session has been idle this long after a turn
  int64_t every_turns = 0;   // this many user turns since the last introspection
};

// The settings of an agent's config: `context_tokens` (256 .. 10,000,000) and `introspection`
// ({"idle_seconds": 1 .. 2,592,000, "every_turns": 1 .. 10,000}, both optional). kInvalidArgument
// naming the field.
Result<ContextSettings> ContextSettingsOf(const Json& agent_config);

// About four characters per token, rounded up.
inline int64_t EstimateTokens(std::string_view text) {
  return static_cast<int64_t>((text.size() + 3) / 4);
}

}  // namespace keel::runtime

#pragma once
// The Anthropic Messages API wire format, as pure functions and a small state machine with no
// I/O: request building, the assembly of a streamed message from its events, the parsing of a
// whole (non-streamed) message and of error bodies.
//
// Tool names: Anthropic accepts ^[a-zA-Z0-9_-]{1,64}$ like OpenAI, so the same per-request
// openai::ToolNameMap maps Keel's dotted names to wire names and back (see openai_wire.h);
// Server-Sent Events are split by the same openai::SseParser.
//
// Conversation mapping (Keel's ChatMessage -> Messages API):
//   - system (and developer) messages are joined, in order, into the top-level "system";
//   - user messages become {"role":"user"} with a text block; assistant messages a text block
//     (omitted when empty) and one tool_use block {id, name, input} per tool call;
//   - tool results become tool_result blocks {tool_use_id, content} in a user message;
//   - consecutive messages of one role are merged into one message (the API wants user and
//     assistant turns to alternate, and all results of one assistant turn in the next user
//     message), and an empty message is dropped.
// Tool call ids are sent with every character outside [A-Za-z0-9_-] replaced by '_' (the API's
// pattern for tool_use ids), in tool_use and tool_result alike, so they still pair up.
//
// Everything parsed here is untrusted: malformed input yields a Status (kUnavailable), never an
// assertion or an escaping exception.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/model/openai_wire.h"
#include "keel/model/provider.h"

namespace keel::model::anthropic {

using openai::SseEvent;
using openai::SseParser;
using openai::ToolNameMap;

inline constexpr const char* kApiVersion = "2023-06-01";

// A tool call id in the form the API accepts (see above).
std::string WireToolId(std::string_view id);

// The Messages request body for `request`: model, max_tokens (the agent config's "max_tokens",
// else `default_max_tokens`), system, messages, tools as {name, description, input_schema}, and
// "stream": true when `stream`. The agent config's "temperature", "top_p" (numbers) and "top_k"
// (integer) are passed on. kInvalidArgument for an unknown role or an option of the wrong type.
Result<Json> BuildMessagesRequest(const ModelRequest& request, bool stream, int default_max_tokens,
                                  ToolNameMap& names);

// A text_delta of a content block: the event a stream sends per token or so.
struct TextDelta {
  int64_t index = 0;
  std::string text;
};

// Reads an event's data `text` (`event_name` its "event:" field) when it is a
// content_block_delta carrying a text_delta, through Boost.JSON's parser (quick_json.h, docs/
// decisions/0001); nullopt for every other event, valid or not, which MessageStreamAccumulator
// reads on its full path with ParseJson. The two agree but for a key given twice, where the
// last copy counts here.
std::optional<TextDelta> ReadTextDelta(std::string_view text, std::string_view event_name);

// Assembles the events of a streamed message into a ModelResponse: message_start (input
// tokens), content_block_start / content_block_delta (text_delta, input_json_delta) /
// content_block_stop, message_delta (stop_reason, cumulative output tokens), message_stop, ping;
// an error event fails with the server's message. Unknown event and block types are skipped,
// as the API asks of clients. Not thread-safe; one per response. `names` must outlive it.
class MessageStreamAccumulator {
 public:
  explicit MessageStreamAccumulator(const ToolNameMap& names) : names_(names) {}

  // Applies one event. Sets `delta` to the text it added (often empty). kUnavailable for data
  // that is not a JSON object, a delta or stop for a block that was not started, an error event.
  Status Add(const SseEvent& event, std::string& delta);
  bool done() const { return done_; }  // message_stop arrived
  const std::string& stop_reason() const { return stop_reason_; }

  // The assembled response. kUnavailable when a tool_use block was not closed, or its input is
  // not a JSON object (the message names the tool, and says the output was cut when stop_reason
  // is "max_tokens").
  Result<ModelResponse> Finish() const;

 private:
  struct Block {
    std::string type;  // text | tool_use | anything else (skipped)
    std::string id;
    std::string name;
    Json start_input;          // the input given in content_block_start (usually {})
    std::string partial_json;  // the input_json_delta fragments, joined
    bool stopped = false;
  };

  const ToolNameMap& names_;
  std::string text_;
  std::map<int64_t, Block> blocks_;  // by the event's index
  std::string stop_reason_;
  Usage usage_;
  bool done_ = false;
};

// Parses a whole message body ({"type":"message","content":[...],...}), from a server that
// answered without streaming. kUnavailable for a body that is not a message, an error body, or
// malformed tool_use blocks.
Result<ModelResponse> ParseMessage(std::string_view body, const ToolNameMap& names);

// The readable message of an error body ({"type":"error","error":{"type","message"}}), as
// "TYPE: MESSAGE", or the start of the raw body when it has none.
std::string ErrorMessageFromBody(std::string_view body);

}  // namespace keel::model::anthropic

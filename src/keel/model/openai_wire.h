#pragma once
// The OpenAI Chat Completions wire format, as pure functions and small state machines with no
// I/O, so every piece is testable on its own: tool-name mapping, request building, the
// Server-Sent Events parser, and the assembly of streamed chunks into a ModelResponse.
//
// Everything parsed here is untrusted (a server, possibly not OpenAI's, and a model wrote it):
// malformed input yields a Status, never an assertion or an escaping exception.
//
// Tool names. OpenAI accepts function names matching ^[a-zA-Z0-9_-]{1,64}$, while Keel's are
// dotted ("notes.append", "keel.tool.time_now", "mcp__fs__read_file"). A ToolNameMap, built
// afresh for each request, gives every Keel name in the request a distinct wire name:
//   1. A "plain" name -- one or more segments of [A-Za-z0-9_]+ joined by single dots, at most 64
//      characters -- is sent with each dot replaced by one hyphen: "notes.append" becomes
//      "notes-append"; "mcp__fs__read_file" is sent unchanged. Since a plain name has no hyphen,
//      this is exactly reversible, underscores included, and the model sees a readable name.
//   2. Any other name (too long, containing a hyphen, a doubled, leading or trailing dot, or
//      another character) is sent as a readable prefix of at most 52 characters, "--", and 10
//      hex digits of a 64-bit FNV-1a hash of the full name ("<prefix>--1a2b3c4d5e"). Plain
//      encodings never contain "--", so the two forms cannot collide; a clash between two hashed
//      names of one request is resolved by rehashing with a counter.
// Decoding goes through the map alone, so whatever the model returns maps back to the name that
// was offered, and a name that was never offered is an error.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/model/provider.h"

namespace keel::model::openai {

// True when `name` matches OpenAI's ^[a-zA-Z0-9_-]{1,64}$.
bool IsValidWireToolName(std::string_view name);

// Rule 1 of the scheme above: the wire name of a plain Keel name, or nullopt when the name is
// not plain.
std::optional<std::string> EncodePlainToolName(std::string_view keel_name);

// The per-request mapping between Keel tool names and wire names. Owned by one request; not
// thread-safe.
// Invariant: the two directions are inverse bijections over the names encoded so far.
class ToolNameMap {
 public:
  // The wire name for `keel_name`, registering it. Encoding one name twice gives the same result.
  std::string Encode(const std::string& keel_name);
  // The Keel name behind a wire name the model returned. kUnavailable naming it when this
  // request never offered it.
  Result<std::string> Decode(const std::string& wire_name) const;
  size_t size() const { return to_wire_.size(); }

 private:
  std::map<std::string, std::string> to_wire_;  // keel name -> wire name
  std::map<std::string, std::string> to_keel_;  // wire name -> keel name
};

// The Chat Completions request body (JSON text) for `request`: messages (assistant tool_calls with
// their arguments as JSON strings, role=tool messages with tool_call_id), tools as
// {"type":"function","function":{name,description,parameters}}, and, when `stream`,
// "stream": true with "stream_options": {"include_usage": true}. The agent config's
// "temperature", "top_p", "max_tokens" and "seed" are passed on. Every tool name goes through
// `names`. kInvalidArgument for an unknown role or an option of the wrong type.
Result<std::string> BuildChatRequest(const ModelRequest& request, bool stream, ToolNameMap& names);

struct SseEvent {
  std::string event;  // the "event:" field; empty for the default "message"
  std::string data;   // the "data:" lines joined by "\n"
};

// An incremental Server-Sent Events parser: bytes may be split anywhere, including between the
// CR and LF of a line ending. Lines end with LF, CRLF or CR; lines starting with ':' are
// comments; a blank line ends an event. Events without data are dropped, as the SSE standard
// says. Not thread-safe; one per response.
class SseParser {
 public:
  static constexpr size_t kMaxLineBytes = 8 << 20;

  // Parses the next bytes, appending each completed event to `events`. kUnavailable when a line
  // grows beyond kMaxLineBytes.
  Status Feed(std::string_view bytes, std::vector<SseEvent>& events);
  // The end of the stream: an event that lacks only its closing blank line is returned, to be
  // lenient with servers that close right after their last "data:" line.
  std::optional<SseEvent> Finish();

 private:
  void ProcessLine(std::string_view line, std::vector<SseEvent>& events);

  std::string line_;
  bool skip_lf_ = false;  // the previous byte was a CR ending a line
  bool seen_first_line_ = false;
  std::string event_;
  std::string data_;
  bool has_data_ = false;
};

// Assembles the chunks of a streamed completion ("chat.completion.chunk" objects, and the final
// "[DONE]") into a ModelResponse: content deltas, tool-call deltas split over many chunks (by
// index; id, name and argument fragments), finish_reason, and the usage chunk. Only choice 0 is
// used. Not thread-safe; one per response. `names` must outlive it.
// What a chunk of the usual shape holds: text, or none, in its one choice (or no choice), with no
// error, refusal or tool call; perhaps the usage. A stream sends one such chunk per token or so,
// and one with the usage at its end.
struct TextChunk {
  std::string content;
  std::optional<std::string> finish_reason;
  std::optional<Usage> usage;  // when the chunk has a usage object
};

// Reads `text` when it is a chunk of the usual shape, through Boost.JSON's parser, which takes a
// tenth of ParseJson's time for it (docs/decisions/0001); nullopt for every other text, valid or
// not, which ChatStreamAccumulator reads on its full path, with ParseJson's rules and messages.
// The same limits hold here (depth, well-formed UTF-8, nothing after the value) but for a key
// given twice, where the last copy counts: Keel is the only reader of the stream.
std::optional<TextChunk> ReadTextChunk(std::string_view text);

class ChatStreamAccumulator {
 public:
  explicit ChatStreamAccumulator(const ToolNameMap& names) : names_(names) {}

  // Applies the data of one event. Sets `delta` to the text this chunk added (often empty).
  // kUnavailable for a chunk that is not JSON or is shaped wrongly, and for an error object sent
  // in the stream (with the server's message).
  Status Add(std::string_view data, std::string& delta);
  bool done() const { return done_; }  // "[DONE]" arrived
  const std::string& finish_reason() const { return finish_reason_; }

  // The assembled response: tool names decoded through the map, arguments parsed. kUnavailable
  // when a tool call has no name, a name that was not offered, or arguments that are not a JSON
  // object (the message says which tool, and that the output was cut when finish_reason is
  // "length").
  Result<ModelResponse> Finish() const;

 private:
  struct PartialCall {
    std::string id;
    std::string name;
    std::string arguments;
  };

  const ToolNameMap& names_;
  std::string text_;
  std::map<int64_t, PartialCall> calls_;  // by the delta's index
  int64_t last_index_ = -1;
  std::string finish_reason_;
  Usage usage_;
  bool done_ = false;
};

// Parses a complete, non-streamed "chat.completion" body (from servers that ignore "stream").
// kUnavailable for bodies that are not a completion, or carry malformed tool calls.
Result<ModelResponse> ParseChatCompletion(std::string_view body, const ToolNameMap& names);

// The human-readable message of an error body ({"error":{"message":...}} and the variants
// compatible servers send), or the start of the raw body when it has none.
std::string ErrorMessageFromBody(std::string_view body);

}  // namespace keel::model::openai

#include "keel/model/anthropic_wire.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace keel::model::anthropic {
namespace {

std::string Event(const std::string& type, Json fields = Json::object()) {
  fields["type"] = type;
  return "event: " + type + "\ndata: " + fields.dump() + "\n\n";
}

std::string MessageStart(int input_tokens) {
  return Event("message_start",
               {{"message",
                 {{"id", "msg_1"},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"content", Json::array()},
                  {"usage", {{"input_tokens", input_tokens}, {"output_tokens", 1}}}}}});
}

std::string BlockStart(int index, const Json& block) {
  return Event("content_block_start", {{"index", index}, {"content_block", block}});
}

std::string TextDelta(int index, const std::string& text) {
  return Event("content_block_delta",
               {{"index", index}, {"delta", {{"type", "text_delta"}, {"text", text}}}});
}

std::string JsonDelta(int index, const std::string& part) {
  return Event(
      "content_block_delta",
      {{"index", index}, {"delta", {{"type", "input_json_delta"}, {"partial_json", part}}}});
}

std::string BlockStop(int index) { return Event("content_block_stop", {{"index", index}}); }

std::string MessageEnd(const std::string& stop_reason, int output_tokens) {
  return Event("message_delta", {{"delta", {{"stop_reason", stop_reason}}},
                                 {"usage", {{"output_tokens", output_tokens}}}}) +
         Event("message_stop");
}

Json ToolUse(const std::string& id, const std::string& name) {
  return {{"type", "tool_use"}, {"id", id}, {"name", name}, {"input", Json::object()}};
}

// Runs a whole event stream, cut into `piece`-byte reads, through the parser and accumulator.
Result<ModelResponse> Assemble(const std::string& stream, const ToolNameMap& names, size_t piece,
                               std::vector<std::string>* deltas = nullptr, bool* done = nullptr) {
  SseParser parser;
  MessageStreamAccumulator acc(names);
  std::vector<SseEvent> events;
  std::string delta;
  for (size_t pos = 0; pos < stream.size(); pos += piece) {
    Status fed = parser.Feed(std::string_view(stream).substr(pos, piece), events);
    if (!fed.ok()) return fed;
    for (const auto& e : events) {
      Status added = acc.Add(e, delta);
      if (!added.ok()) return added;
      if (deltas && !delta.empty()) deltas->push_back(delta);
    }
    events.clear();
  }
  if (done) *done = acc.done();
  return acc.Finish();
}

ModelRequest Conversation() {
  ModelRequest r;
  r.model = "claude-test";
  r.messages = {
      {"system", "Be brief.", {}, "", ""},
      {"user", "earlier question", {}, "", ""},
      {"assistant", "earlier answer", {}, "", ""},
      {"user", "", {}, "", ""},  // empty: dropped
      {"user", "note this and tell the time", {}, "", ""},
      {"assistant",
       "Sure.",
       {{"call_1", "notes.append", {{"line", "x"}}}, {"call:2", "time.now", Json::object()}},
       "",
       ""},
      {"tool", "appended", {}, "call_1", "notes.append"},
      {"tool", "2026-11-30T12:00:00Z", {}, "call:2", "time.now"},
  };
  r.tools = {{"notes.append", "Append a line", {{"type", "object"}}},
             {"time.now", "", Json::object()}};
  return r;
}

TEST(AnthropicWireTest, BuildsAMessagesRequest) {
  ToolNameMap names;
  auto body = BuildMessagesRequest(Conversation(), /*stream=*/true, 4096, names);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  const Json& b = *body;
  EXPECT_EQ(b["model"], "claude-test");
  EXPECT_EQ(b["max_tokens"], 4096);
  EXPECT_EQ(b["system"], "Be brief.");
  EXPECT_EQ(b["stream"], true);
  ASSERT_EQ(b["tools"].size(), 2u);
  EXPECT_EQ(b["tools"][0], (Json{{"name", "notes-append"},
                                 {"description", "Append a line"},
                                 {"input_schema", {{"type", "object"}}}}));
  EXPECT_EQ(b["tools"][1]["name"], "time-now");
  EXPECT_FALSE(b["tools"][1].contains("description"));

  const Json& m = b["messages"];
  ASSERT_EQ(m.size(), 5u) << m.dump(2);
  std::vector<std::string> roles;
  for (const auto& msg : m) roles.push_back(msg["role"]);
  EXPECT_EQ(roles, (std::vector<std::string>{"user", "assistant", "user", "assistant", "user"}));
  EXPECT_EQ(m[0]["content"], Json::array({{{"type", "text"}, {"text", "earlier question"}}}));
  EXPECT_EQ(m[1]["content"], Json::array({{{"type", "text"}, {"text", "earlier answer"}}}));
  // The empty user message is dropped (the API refuses empty text blocks).
  EXPECT_EQ(m[2]["content"],
            Json::array({{{"type", "text"}, {"text", "note this and tell the time"}}}));
  EXPECT_EQ(m[3]["content"].size(), 3u);
  EXPECT_EQ(m[4]["content"].size(), 2u);
}

TEST(AnthropicWireTest, MergesConsecutiveMessagesOfOneRole) {
  ModelRequest r;
  r.model = "m";
  r.messages = {{"system", "one", {}, "", ""},    {"user", "a", {}, "", ""},
                {"developer", "two", {}, "", ""}, {"user", "b", {}, "", ""},
                {"assistant", "", {}, "", ""},    {"user", "c", {}, "", ""}};
  ToolNameMap names;
  auto body = BuildMessagesRequest(r, true, 10, names);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  EXPECT_EQ((*body)["system"], "one\n\ntwo");
  EXPECT_EQ((*body)["messages"], Json::array({{{"role", "user"},
                                               {"content",
                                                {{{"type", "text"}, {"text", "a"}},
                                                 {{"type", "text"}, {"text", "b"}},
                                                 {{"type", "text"}, {"text", "c"}}}}}}));
}

TEST(AnthropicWireTest, MapsToolCallsAndMergesConsecutiveToolResults) {
  ToolNameMap names;
  ModelRequest r = Conversation();
  r.messages.erase(r.messages.begin() + 1, r.messages.begin() + 4);  // no earlier turn
  auto body = BuildMessagesRequest(r, /*stream=*/false, 1000, names);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  const Json& m = (*body)["messages"];
  ASSERT_EQ(m.size(), 3u) << m.dump(2);
  EXPECT_EQ(m[0],
            (Json{{"role", "user"},
                  {"content", {{{"type", "text"}, {"text", "note this and tell the time"}}}}}));
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["content"], (Json{{{"type", "text"}, {"text", "Sure."}},
                                   {{"type", "tool_use"},
                                    {"id", "call_1"},
                                    {"name", "notes-append"},
                                    {"input", {{"line", "x"}}}},
                                   {{"type", "tool_use"},
                                    {"id", "call_2"},
                                    {"name", "time-now"},
                                    {"input", Json::object()}}}));
  // Both results in one user message, ids as the tool_use blocks have them.
  EXPECT_EQ(m[2],
            (Json{{"role", "user"},
                  {"content",
                   {{{"type", "tool_result"}, {"tool_use_id", "call_1"}, {"content", "appended"}},
                    {{"type", "tool_result"},
                     {"tool_use_id", "call_2"},
                     {"content", "2026-11-30T12:00:00Z"}}}}}));
  EXPECT_FALSE(body->contains("stream"));
}

TEST(AnthropicWireTest, PassesOptionsAndRefusesWrongTypes) {
  ModelRequest r;
  r.model = "m";
  r.messages = {{"user", "hi", {}, "", ""}};
  r.agent_config = {
      {"max_tokens", 77}, {"temperature", 0.5}, {"top_p", 1}, {"top_k", 5}, {"seed", 3}};
  ToolNameMap names;
  auto body = BuildMessagesRequest(r, true, 4096, names);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ((*body)["max_tokens"], 77);
  EXPECT_EQ((*body)["temperature"], 0.5);
  EXPECT_EQ((*body)["top_k"], 5);
  EXPECT_FALSE(body->contains("seed"));  // the Messages API has none

  for (const Json& bad : {Json{{"max_tokens", "many"}}, Json{{"max_tokens", 0}},
                          Json{{"temperature", "hot"}}, Json{{"top_k", 1.5}}}) {
    r.agent_config = bad;
    auto refused = BuildMessagesRequest(r, true, 4096, names);
    ASSERT_FALSE(refused.ok()) << bad.dump();
    EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  }
  r.agent_config = Json::object();
  r.messages.push_back({"narrator", "x", {}, "", ""});
  auto odd = BuildMessagesRequest(r, true, 4096, names);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("narrator"), std::string::npos);
}

TEST(AnthropicWireTest, WireToolIdsFitThePattern) {
  EXPECT_EQ(WireToolId("toolu_01A-b"), "toolu_01A-b");
  EXPECT_EQ(WireToolId("call:2/x"), "call_2_x");
  EXPECT_EQ(WireToolId(""), "call");
}

TEST(AnthropicWireTest, StreamsTextDeltasAndUsageWhateverTheReadSizes) {
  const std::string stream = MessageStart(25) + Event("ping") +
                             BlockStart(0, {{"type", "text"}, {"text", ""}}) + TextDelta(0, "Hel") +
                             TextDelta(0, "lo, ") + TextDelta(0, "world") + BlockStop(0) +
                             MessageEnd("end_turn", 15);
  ToolNameMap names;
  for (size_t piece : {1u, 2u, 7u, 64u, 100000u}) {
    std::vector<std::string> deltas;
    bool done = false;
    auto r = Assemble(stream, names, piece, &deltas, &done);
    ASSERT_TRUE(r.ok()) << piece << ": " << r.status().ToString();
    EXPECT_TRUE(done);
    EXPECT_EQ(r->text, "Hello, world");
    EXPECT_EQ(deltas, (std::vector<std::string>{"Hel", "lo, ", "world"}));
    EXPECT_TRUE(r->tool_calls.empty());
    EXPECT_EQ(r->usage.input_tokens, 25);
    EXPECT_EQ(r->usage.output_tokens, 15);  // message_delta's count is cumulative
  }
}

TEST(AnthropicWireTest, AssemblesToolUseFromInputJsonDeltas) {
  ToolNameMap names;
  names.Encode("notes.append");
  names.Encode("time.now");
  const std::string stream = MessageStart(40) + BlockStart(0, {{"type", "text"}, {"text", ""}}) +
                             TextDelta(0, "Let me check.") + BlockStop(0) +
                             BlockStart(1, ToolUse("toolu_a", "notes-append")) + JsonDelta(1, "") +
                             JsonDelta(1, "{\"li") + JsonDelta(1, "ne\": \"h") +
                             JsonDelta(1, "i\"}") + BlockStop(1) +
                             BlockStart(2, ToolUse("toolu_b", "time-now")) + BlockStop(2) +
                             BlockStart(3, ToolUse("toolu_c", "never_offered")) +
                             JsonDelta(3, "{}") + BlockStop(3) + MessageEnd("tool_use", 30);
  for (size_t piece : {1u, 5u, 4096u}) {
    auto r = Assemble(stream, names, piece);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->text, "Let me check.");
    ASSERT_EQ(r->tool_calls.size(), 3u);
    EXPECT_EQ(r->tool_calls[0].id, "toolu_a");
    EXPECT_EQ(r->tool_calls[0].name, "notes.append");
    EXPECT_EQ(r->tool_calls[0].arguments, (Json{{"line", "hi"}}));
    EXPECT_EQ(r->tool_calls[1].name, "time.now");
    EXPECT_EQ(r->tool_calls[1].arguments, Json::object());  // no deltas: the start's input
    // A name that was not offered passes through; the gateway denies it as unknown.
    EXPECT_EQ(r->tool_calls[2].name, "never_offered");
    EXPECT_EQ(r->usage.output_tokens, 30);
  }
}

TEST(AnthropicWireTest, SkipsUnknownEventsAndBlocks) {
  ToolNameMap names;
  const std::string stream =
      MessageStart(1) + Event("something_new", {{"x", 1}}) +
      BlockStart(0, {{"type", "thinking"}, {"thinking", ""}}) +
      Event("content_block_delta",
            {{"index", 0}, {"delta", {{"type", "thinking_delta"}, {"thinking", "hmm"}}}}) +
      BlockStop(0) + BlockStart(1, {{"type", "text"}, {"text", ""}}) + TextDelta(1, "ok") +
      BlockStop(1) + MessageEnd("end_turn", 2);
  auto r = Assemble(stream, names, 9);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, "ok");
}

TEST(AnthropicWireTest, AnErrorEventFailsWithTheServersMessage) {
  ToolNameMap names;
  const std::string stream =
      MessageStart(1) + BlockStart(0, {{"type", "text"}, {"text", ""}}) + TextDelta(0, "Part") +
      Event("error", {{"error", {{"type", "overloaded_error"}, {"message", "Overloaded"}}}});
  auto r = Assemble(stream, names, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("overloaded_error: Overloaded"), std::string::npos)
      << r.status().message();
}

TEST(AnthropicWireTest, MalformedEventsAreErrorsNotCrashes) {
  ToolNameMap names;
  const std::vector<std::string> bad = {
      "event: message_start\ndata: {not json\n\n",
      "data: [1,2]\n\n",
      Event("content_block_delta",
            {{"index", 0}, {"delta", {{"type", "text_delta"}, {"text", "x"}}}}),
      BlockStart(0, {{"type", "text"}}) + BlockStart(0, {{"type", "text"}}),
      Event("content_block_start", {{"content_block", {{"type", "text"}}}}),
      Event("content_block_start", {{"index", "zero"}, {"content_block", {{"type", "text"}}}}),
      BlockStart(0, {{"type", "text"}}) + Event("content_block_delta", {{"index", 0}}),
      BlockStart(0, {{"type", "text"}}) +
          Event("content_block_delta",
                {{"index", 0}, {"delta", {{"type", "text_delta"}, {"text", 5}}}}),
      BlockStart(0, ToolUse("t", "x")) +
          Event("content_block_delta",
                {{"index", 0}, {"delta", {{"type", "input_json_delta"}, {"partial_json", 7}}}}),
      BlockStart(0, {{"type", "text"}}) + BlockStop(0) + TextDelta(0, "after stop"),
  };
  for (const auto& stream : bad) {
    auto r = Assemble(MessageStart(1) + stream, names, 4);
    ASSERT_FALSE(r.ok()) << stream;
    EXPECT_EQ(r.status().code(), Code::kUnavailable) << stream;
  }
}

TEST(AnthropicWireTest, AToolCallCutOffIsAnErrorNotAPartialCall) {
  ToolNameMap names;
  names.Encode("notes.append");
  // The stream broke inside the tool's input: no stop for its block.
  const std::string open_block = MessageStart(1) + BlockStart(0, ToolUse("t", "notes-append")) +
                                 JsonDelta(0, "{\"line\": \"ne");
  auto r = Assemble(open_block, names, 6);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("notes-append"), std::string::npos) << r.status().message();

  // The block was closed but its input is not JSON: max_tokens cut it.
  auto cut = Assemble(open_block + BlockStop(0) + MessageEnd("max_tokens", 4096), names, 6);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("max_tokens"), std::string::npos);

  auto not_object = Assemble(MessageStart(1) + BlockStart(0, ToolUse("t", "notes-append")) +
                                 JsonDelta(0, "[1]") + BlockStop(0) + MessageEnd("tool_use", 2),
                             names, 6);
  ASSERT_FALSE(not_object.ok());
  EXPECT_NE(not_object.status().message().find("notes.append"), std::string::npos);

  // The same in the block's start, with no delta after it: refused, not replaced by {}.
  Json start = ToolUse("t", "notes-append");
  start["input"] = "x";
  auto start_not_object = Assemble(
      MessageStart(1) + BlockStart(0, start) + BlockStop(0) + MessageEnd("tool_use", 2), names, 6);
  ASSERT_FALSE(start_not_object.ok());
  EXPECT_NE(start_not_object.status().message().find("is not a JSON object"), std::string::npos)
      << start_not_object.status().message();
}

TEST(AnthropicWireTest, EventsAfterMessageStopAreIgnored) {
  ToolNameMap names;
  bool done = false;
  auto r = Assemble(MessageStart(1) + BlockStart(0, {{"type", "text"}, {"text", ""}}) +
                        TextDelta(0, "a") + BlockStop(0) + MessageEnd("end_turn", 1) +
                        "data: {garbage after the end\n\n",
                    names, 100, nullptr, &done);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(done);
  EXPECT_EQ(r->text, "a");
}

TEST(AnthropicWireTest, ParsesAWholeMessage) {
  ToolNameMap names;
  names.Encode("notes.append");
  auto r = ParseMessage(
      R"({"id":"msg_1","type":"message","role":"assistant","content":[
           {"type":"text","text":"Done."},
           {"type":"tool_use","id":"toolu_1","name":"notes-append","input":{"line":"x"}}],
          "stop_reason":"tool_use",
          "usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":3}})",
      names);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, "Done.");
  ASSERT_EQ(r->tool_calls.size(), 1u);
  EXPECT_EQ(r->tool_calls[0].name, "notes.append");
  EXPECT_EQ(r->tool_calls[0].arguments, (Json{{"line", "x"}}));
  EXPECT_EQ(r->usage.input_tokens, 15);  // cached prompt tokens are billed input too
  EXPECT_EQ(r->usage.output_tokens, 3);

  for (const char* bad : {"<html>502</html>", "[]", R"({"type":"message"})",
                          R"({"content":[{"type":"tool_use","id":"t","name":"x","input":[1]}]})"}) {
    auto refused = ParseMessage(bad, names);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), Code::kUnavailable) << bad;
  }
  auto error =
      ParseMessage(R"({"type":"error","error":{"type":"api_error","message":"boom"}})", names);
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.status().message().find("api_error: boom"), std::string::npos);
}

TEST(AnthropicWireTest, ReadsErrorBodies) {
  EXPECT_EQ(ErrorMessageFromBody(
                R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})"),
            "overloaded_error: Overloaded");
  EXPECT_EQ(ErrorMessageFromBody(R"({"message":"plain"})"), "plain");
  EXPECT_EQ(ErrorMessageFromBody("  "), "(empty body)");
  EXPECT_EQ(ErrorMessageFromBody("<html>bad gateway</html>"), "<html>bad gateway</html>");
}

}  // namespace
}  // namespace keel::model::anthropic

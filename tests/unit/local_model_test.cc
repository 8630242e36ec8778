#include <gtest/gtest.h>

#include "keel/model/local_model.h"

namespace keel::model {
namespace {

ModelRequest Req(const std::string& prompt) {
  ModelRequest r;
  r.model = "local";
  r.messages.push_back({"user", prompt, {}, "", ""});
  return r;
}

TEST(LocalModelTest, QuotesPlainMessages) {
  auto r = LocalModel::Decide(Req("hello there"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "You said: \"hello there\"");
  EXPECT_TRUE(r->tool_calls.empty());
  EXPECT_EQ(r->usage.input_tokens, 2);
  EXPECT_EQ(r->usage.output_tokens, 4);
}

TEST(LocalModelTest, CallLinesBecomeToolCallsInOneStep) {
  auto r = LocalModel::Decide(Req("/call time.now\n/call notes.append {\"line\": \"hi\"}"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->tool_calls.size(), 2u);
  EXPECT_EQ(r->tool_calls[0].name, "time.now");
  EXPECT_EQ(r->tool_calls[1].name, "notes.append");
  EXPECT_EQ(r->tool_calls[1].arguments["line"], "hi");
  EXPECT_NE(r->tool_calls[0].id, r->tool_calls[1].id);
}

TEST(LocalModelTest, AnswersWithToolResults) {
  ModelRequest req = Req("/call time.now {}");
  req.messages.push_back({"assistant", "", {{"call_1", "time.now", Json::object()}}, "", ""});
  req.messages.push_back({"tool", "2026-11-30T12:00:00.000Z", {}, "call_1", "time.now"});
  auto r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tool_calls.empty());
  EXPECT_NE(r->text.find("2026-11-30T12:00:00.000Z"), std::string::npos);
}

TEST(LocalModelTest, MalformedArgumentsAreAnsweredNotThrown) {
  auto r = LocalModel::Decide(Req("/call notes.append {not json"));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tool_calls.empty());
  EXPECT_NE(r->text.find("not a JSON object"), std::string::npos);
}

TEST(LocalModelTest, FollowsLocalRules) {
  ModelRequest req = Req("what time is it?");
  req.agent_config = {{"local_rules",
                       {{{"match", "weather"}, {"reply", "sunny"}},
                        {{"match", "time"}, {"call", {{"tool", "time.now"}}}}}}};
  auto r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->tool_calls.size(), 1u);
  EXPECT_EQ(r->tool_calls[0].name, "time.now");
  req.messages[0].content = "the weather?";
  r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "sunny");
}

TEST(LocalModelTest, InvalidRuleRegexIsAnError) {
  ModelRequest req = Req("x");
  req.agent_config = {{"local_rules", {{{"match", "(unclosed"}, {"reply", "y"}}}}};
  EXPECT_EQ(LocalModel::Decide(req).status().code(), Code::kInvalidArgument);
}

TEST(LocalModelTest, EchoRulesAnswerWithWhatTheModelWasSent) {
  ModelRequest req;
  req.messages = {{"system", "Be brief.", {}, "", ""},
                  {"user", "earlier", {}, "", ""},
                  {"assistant", "ok", {}, "", ""},
                  {"user", "show system", {}, "", ""}};
  req.agent_config = {{"local_rules",
                       {{{"match", "^show system"}, {"echo", "system"}},
                        {{"match", "^show all"}, {"echo", "context"}}}}};
  auto r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "Be brief.");
  req.messages.back().content = "show all";
  r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "system: Be brief.\nuser: earlier\nassistant: ok\nuser: show all");
}

}  // namespace
}  // namespace keel::model

#include <gtest/gtest.h>

#include "keel/model/context_requests.h"
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

// Input tokens are the words of every message: runs of bytes other than ' ', '\n', '\t', '\r',
// counted eight bytes at a time. Checked against the plain count on texts of every length
// around the eight-byte steps, of spaces, words, and bytes that are near a space's value.
TEST(LocalModelTest, CountsTheWordsOfEveryMessageAsInput) {
  const char alphabet[] = {' ',    '\n',   '\t',   '\r',   'a',    '!',    '\0',
                           '\x80', '\xa0', '\x19', '\x21', '\x89', '\x0c', '\xff'};
  auto plain = [](const std::string& s) {
    int64_t n = 0;
    bool in_word = false;
    for (char c : s) {
      const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
      if (!space && !in_word) ++n;
      in_word = !space;
    }
    return n;
  };
  uint64_t state = 88172645463325252ULL;  // xorshift: the same texts every run
  for (int round = 0; round < 3000; ++round) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const size_t length = state % 41;
    std::string text;
    for (size_t i = 0; i < length; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      text += alphabet[state % sizeof(alphabet)];
    }
    ModelRequest req = Req("q");
    req.messages.insert(req.messages.begin(), {"assistant", text, {}, "", ""});
    auto r = LocalModel::Decide(req);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->usage.input_tokens, plain(text) + 1) << "text of " << length << " bytes";
  }
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

// A rule kept from before its arguments were checked: the call carries them as written, for
// the gateway to refuse; {} in their place ran the tool with arguments nobody wrote.
TEST(LocalModelTest, RuleArgumentsThatAreNotAnObjectAreNotReplaced) {
  ModelRequest req = Req("what time is it?");
  req.agent_config = {
      {"local_rules",
       {{{"match", "time"},
         {"call", {{"tool", "notes.append"}, {"arguments", Json::array({"a", "b"})}}}}}}};
  auto r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->tool_calls.size(), 1u);
  EXPECT_EQ(r->tool_calls[0].arguments, Json::array({"a", "b"}));
}

TEST(LocalModelTest, InvalidRuleRegexIsAnError) {
  ModelRequest req = Req("x");
  req.agent_config = {{"local_rules", {{{"match", "(unclosed"}, {"reply", "y"}}}}};
  EXPECT_EQ(LocalModel::Decide(req).status().code(), Code::kInvalidArgument);
}

TEST(LocalModelTest, BacktrackingPatternsRunInLinearTime) {
  // Under a backtracking engine the first takes 2^40 steps and the second overflows the stack.
  Json rules = {{{"match", "^(a+)+$"}, {"reply", "nested"}},
                {{"match", "(a|b)*c"}, {"reply", "alternation"}}};
  ASSERT_TRUE(LocalModel::CheckRules(rules).ok());
  ModelRequest req = Req(std::string(40, 'a') + "!");
  req.agent_config = {{"local_rules", rules}};
  auto r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->text.rfind("You said", 0), 0u);
  std::string ab;
  for (int i = 0; i < 100000; ++i) ab += "ab";
  req.messages[0].content = ab;
  r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->text.rfind("You said", 0), 0u);
  req.messages[0].content = ab + "c";
  r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "alternation");
}

TEST(LocalModelTest, RulesAreCheckedWhenWritten) {
  auto rule = [](std::string match) { return Json::array({{{"match", match}, {"reply", "x"}}}); };
  EXPECT_TRUE(LocalModel::CheckRules(rule("^ping\\b")).ok());
  EXPECT_TRUE(LocalModel::CheckRules(rule(std::string(1024, 'a'))).ok());
  auto long_one = LocalModel::CheckRules(rule(std::string(1025, 'a')));
  ASSERT_FALSE(long_one.ok());
  EXPECT_NE(long_one.message().find("1024 bytes"), std::string::npos) << long_one.message();
  for (const char* bad : {"(unclosed", "(a)\\1", "(?=a)", "a{1001}{1001}"}) {
    auto st = LocalModel::CheckRules(rule(bad));
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(LocalModel::CheckRules(Json::array({{{"match", "x"}}})).ok());  // no action
  for (const Json& args : {Json::array({1}), Json("line"), Json(nullptr)}) {
    auto st = LocalModel::CheckRules(
        Json::array({{{"match", "x"}, {"call", {{"tool", "time.now"}, {"arguments", args}}}}}));
    EXPECT_EQ(st.message(), "config.local_rules: a call's 'arguments' must be a JSON object")
        << args;
  }
  EXPECT_FALSE(LocalModel::CheckRules(Json::object()).ok());
}

TEST(LocalModelTest, DeepCallArgumentsAreRefusedNotWalked) {
  std::string deep = "{\"a\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  auto r = LocalModel::Decide(Req("/call time.now " + deep));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tool_calls.empty());
  EXPECT_NE(r->text.find("64 levels"), std::string::npos) << r->text.substr(0, 300);
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

// Keel's summarization request, as context.cc builds it.
ModelRequest SummaryRequest(const std::string& previous, const std::vector<std::string>& said,
                            int limit) {
  std::string material = std::string(kSummarySoFar) + "\n" + previous + "\n\n" +
                         std::string(kConversationToAdd) + "\n";
  for (const auto& s : said) material += "user: " + s + "\nassistant: ok\n";
  ModelRequest req;
  req.messages = {{"system", std::string(kSummarizeRequest) + "\n... " +
                                 std::string(kSummaryLimit) + " " + std::to_string(limit) +
                                 " characters.", {}, "", ""},
                  {"user", material, {}, "", ""}};
  return req;
}

TEST(LocalModelTest, SummariesKeepTheUsersStatementsFirstAndLastWithinTheLimit) {
  auto r = LocalModel::Decide(SummaryRequest("(none)", {"my name is Ada", "I like tea"}, 4000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "Earlier in this session the user said:\n- my name is Ada\n- I like tea");
  EXPECT_TRUE(r->tool_calls.empty());

  // Folding the summary in again: the statements carry over, repeats once.
  auto again = LocalModel::Decide(SummaryRequest(r->text, {"I like tea", "it is late"}, 4000));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->text,
            "Earlier in this session the user said:\n- my name is Ada\n- I like tea\n- it is late");

  // Many statements: the first 8 and the last 8.
  std::vector<std::string> many;
  for (int i = 0; i < 30; ++i) many.push_back("fact " + std::to_string(i));
  auto kept = LocalModel::Decide(SummaryRequest("(none)", many, 4000));
  ASSERT_TRUE(kept.ok());
  EXPECT_NE(kept->text.find("- fact 0\n"), std::string::npos);
  EXPECT_NE(kept->text.find("- fact 7\n"), std::string::npos);
  EXPECT_EQ(kept->text.find("- fact 8\n"), std::string::npos);
  EXPECT_NE(kept->text.find("- fact 29"), std::string::npos);

  // A tight limit: the middle goes first; the first statement stays.
  auto tight = LocalModel::Decide(SummaryRequest("(none)", many, 80));
  ASSERT_TRUE(tight.ok());
  EXPECT_LE(tight->text.size(), 80u) << tight->text;
  EXPECT_NE(tight->text.find("- fact 0"), std::string::npos) << tight->text;
  // And the same request gets the same answer.
  EXPECT_EQ(LocalModel::Decide(SummaryRequest("(none)", many, 80))->text, tight->text);
}

TEST(LocalModelTest, AnIntrospectionRunSetsDescriptionAndWorkingMemoryThenEnds) {
  ModelRequest req;
  req.messages = {{"system", std::string(kIntrospectRequest) + "\n...", {}, "", ""},
                  {"user", "I plan a trip to Lisbon.", {}, "", ""},
                  {"assistant", "ok", {}, "", ""},
                  {"user", "Find a hotel.", {}, "", ""},
                  {"user", "Look back over the conversation above ...", {}, "", ""}};
  auto r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->tool_calls.size(), 2u);
  EXPECT_EQ(r->tool_calls[0].name, "introspection.set_description");
  EXPECT_EQ(r->tool_calls[0].arguments, (Json{{"description", "About: I plan a trip to Lisbon."}}));
  EXPECT_EQ(r->tool_calls[1].name, "introspection.set_working_memory");
  EXPECT_EQ(r->tool_calls[1].arguments,
            (Json{{"content", "Recent requests:\n- I plan a trip to Lisbon.\n- Find a hotel."}}));
  // With the tools' results, it ends.
  req.messages.push_back({"assistant", "", r->tool_calls, "", ""});
  req.messages.push_back({"tool", "{}", {}, "call_1", "introspection.set_description"});
  req.messages.push_back({"tool", "{}", {}, "call_2", "introspection.set_working_memory"});
  r = LocalModel::Decide(req);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tool_calls.empty());
}

}  // namespace
}  // namespace keel::model

// The Telegram channel without a Bot API: the settings' checks, which updates an agent takes and
// where each answer goes, how an answer becomes the parts sendMessage takes (4096 UTF-16 code
// units, cut at newlines, then spaces, never inside a character; escaped after the cut) and the
// sendMessage bodies.

#include "keel/channels/telegram.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace keel::channels {
namespace {

// ---- settings

TEST(TelegramSettingsTest, DefaultsTrimmingAndRoundTrip) {
  auto s = ParseTelegramSettings({{"bot_token", "TG_BOT"}});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->bot_token, "TG_BOT");
  EXPECT_EQ(s->api_base, "https://api.telegram.org");
  EXPECT_EQ(s->role, "guest");
  EXPECT_EQ(s->poll_timeout, 25);
  EXPECT_EQ(TelegramSettingsJson(*s), (Json{{"bot_token", "TG_BOT"},
                                            {"api_base", "https://api.telegram.org"},
                                            {"role", "guest"},
                                            {"poll_timeout", 25},
                                            {"mode", "polling"}}));

  // Every field given; trailing slashes trimmed (the relay appends "/bot<token>/<method>").
  auto full = ParseTelegramSettings({{"bot_token", "B"},
                                     {"api_base", "http://127.0.0.1:8081/proxy///"},
                                     {"role", "user"},
                                     {"poll_timeout", 7},
                                     {"mode", "webhook"}});
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(full->api_base, "http://127.0.0.1:8081/proxy");
  EXPECT_EQ(full->role, "user");
  EXPECT_EQ(full->poll_timeout, 7);
  EXPECT_EQ(ParseTelegramSettings({{"bot_token", "B"}, {"api_base", "https://api.telegram.org/"}})
                ->api_base,
            "https://api.telegram.org");

  // What TelegramSettingsJson writes parses back to the same settings, and writes the same.
  const Json written = TelegramSettingsJson(*full);
  EXPECT_EQ(written, (Json{{"bot_token", "B"},
                           {"api_base", "http://127.0.0.1:8081/proxy"},
                           {"role", "user"},
                           {"poll_timeout", 7},
                           {"mode", "webhook"}}));
  auto again = ParseTelegramSettings(written);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->bot_token, full->bot_token);
  EXPECT_EQ(again->api_base, full->api_base);
  EXPECT_EQ(again->role, full->role);
  EXPECT_EQ(again->poll_timeout, full->poll_timeout);
  EXPECT_EQ(again->mode, "webhook");
  EXPECT_EQ(TelegramSettingsJson(*again), written);
  for (const Json& mode : {Json("push"), Json(""), Json("Webhook"), Json(1), Json(nullptr)}) {
    EXPECT_FALSE(ParseTelegramSettings({{"bot_token", "B"}, {"mode", mode}}).ok()) << mode;
  }
}

// The secret a webhook-mode channel gives setWebhook: the same for the same token and channel,
// another for another channel or a new token, and only characters Telegram takes.
TEST(TelegramSettingsTest, WebhookSecretIsPerTokenAndChannel) {
  const std::string a = TelegramWebhookSecret("123:abc", "ch1");
  EXPECT_EQ(a, TelegramWebhookSecret("123:abc", "ch1"));
  EXPECT_NE(a, TelegramWebhookSecret("123:abc", "ch2"));
  EXPECT_NE(a, TelegramWebhookSecret("123:abd", "ch1"));
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(a.find("123:abc"), std::string::npos);
}

TEST(TelegramSettingsTest, PollTimeoutBoundsAndApiBaseLength) {
  for (int timeout : {0, 50}) {
    auto s = ParseTelegramSettings({{"bot_token", "B"}, {"poll_timeout", timeout}});
    ASSERT_TRUE(s.ok()) << timeout << ": " << s.status().ToString();
    EXPECT_EQ(s->poll_timeout, timeout);
    EXPECT_EQ(TelegramSettingsJson(*s)["poll_timeout"], timeout);
  }
  // 512 characters is the longest api_base; the trailing slash is trimmed before it is counted.
  const std::string at_limit = "https://" + std::string(512 - 8, 'a');
  ASSERT_EQ(at_limit.size(), 512u);
  EXPECT_EQ(ParseTelegramSettings({{"bot_token", "B"}, {"api_base", at_limit}})->api_base,
            at_limit);
  EXPECT_EQ(ParseTelegramSettings({{"bot_token", "B"}, {"api_base", at_limit + "/"}})->api_base,
            at_limit);
  EXPECT_EQ(
      ParseTelegramSettings({{"bot_token", "B"}, {"api_base", at_limit + "a"}}).status().code(),
      Code::kInvalidArgument);
}

TEST(TelegramSettingsTest, RefusesWhatCouldChangeWhereTheTokenGoes) {
  const Json bad[] = {
      Json::array(),
      Json("bot_token"),
      Json::object(),  // no bot_token
      {{"bot_token", ""}},
      {{"bot_token", 7}},
      {{"bot_token", nullptr}},
      {{"bot_token", Json::array({"B"})}},
      {{"api_base", "https://api.telegram.org"}},     // still no bot_token
      {{"bot_token", "B"}, {"chat_id", 5}},           // an unknown field
      {{"bot_token", "B"}, {"signing_secret", "S"}},  // a webhook's field
      {{"bot_token", "B"}, {"api_base", ""}},
      {{"bot_token", "B"}, {"api_base", "/"}},
      {{"bot_token", "B"}, {"api_base", 443}},
      {{"bot_token", "B"}, {"api_base", "api.telegram.org"}},
      {{"bot_token", "B"}, {"api_base", "ftp://api.telegram.org"}},
      {{"bot_token", "B"}, {"api_base", "file:///etc/passwd"}},
      {{"bot_token", "B"}, {"api_base", "//api.telegram.org"}},
      {{"bot_token", "B"}, {"api_base", " https://api.telegram.org"}},
      {{"bot_token", "B"}, {"api_base", "https://"}},
      {{"bot_token", "B"}, {"api_base", "https://evil.example/?x="}},
      {{"bot_token", "B"}, {"api_base", "https://evil.example?"}},
      {{"bot_token", "B"}, {"api_base", "https://evil.example/#"}},
      {{"bot_token", "B"}, {"api_base", "https://evil.example#frag/"}},
      {{"bot_token", "B"}, {"api_base", "https://api.telegram .org"}},
      {{"bot_token", "B"}, {"api_base", "https://api.telegram.org\t"}},
      {{"bot_token", "B"}, {"api_base", "https://api.telegram.org\r\nHost: evil"}},
      {{"bot_token", "B"}, {"api_base", std::string("https://a\x01", 10)}},
      {{"bot_token", "B"}, {"api_base", std::string("https://a\0b", 11)}},
      {{"bot_token", "B"}, {"api_base", "https://a\x7f"}},
      {{"bot_token", "B"}, {"api_base", "https://a\xc3\xa9.org"}},  // not ASCII
      {{"bot_token", "B"}, {"api_base", "https://" + std::string(600, 'a')}},
      {{"bot_token", "B"}, {"role", "owner"}},
      {{"bot_token", "B"}, {"role", "admin"}},
      {{"bot_token", "B"}, {"role", "Guest"}},
      {{"bot_token", "B"}, {"role", ""}},
      {{"bot_token", "B"}, {"role", 1}},
      {{"bot_token", "B"}, {"poll_timeout", -1}},
      {{"bot_token", "B"}, {"poll_timeout", 51}},
      {{"bot_token", "B"}, {"poll_timeout", 2.5}},
      {{"bot_token", "B"}, {"poll_timeout", 25.0}},
      {{"bot_token", "B"}, {"poll_timeout", "5"}},
      {{"bot_token", "B"}, {"poll_timeout", true}},
      {{"bot_token", "B"}, {"poll_timeout", nullptr}},
      {{"bot_token", "B"}, {"poll_timeout", 4294967321LL}},  // 2^32 + 25: not cut to 25
      {{"bot_token", "B"}, {"poll_timeout", Json(18446744073709551615ULL)}},
  };
  for (const Json& settings : bad) {
    EXPECT_EQ(ParseTelegramSettings(settings).status().code(), Code::kInvalidArgument)
        << settings.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  // The message says what is wrong without repeating an unbounded value.
  auto unknown = ParseTelegramSettings({{"bot_token", "B"}, {std::string(5000, 'k'), 1}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_LT(unknown.status().message().size(), 500u);
  auto role = ParseTelegramSettings({{"bot_token", "B"}, {"role", std::string(5000, 'r')}});
  ASSERT_FALSE(role.ok());
  EXPECT_LT(role.status().message().size(), 500u);
}

TEST(TelegramSettingsTest, ValidBotToken) {
  EXPECT_TRUE(ValidBotToken("123456:ABC-def_g"));
  EXPECT_TRUE(ValidBotToken("7000001:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"));
  EXPECT_TRUE(ValidBotToken(std::string(256, '1')));
  const std::string bad[] = {
      "",
      "123456:ABC/def",
      "123456:ABC/../getMe",
      "123456:ABC?x=1",
      "123456:ABC#f",
      "123456:ABC def",
      "123456:ABC%2Fdef",
      "123456:ABC..def",
      "..",
      "123456:ABC.def",
      "123456:ABC\ndef",
      "123456:ABC\r\n",
      std::string("123456:ABC\0def", 14),
      "123456:ABC@evil.example",
      "123456:ABC\\def",
      "123456:AB\xc3\xa9",  // é: a letter, but not an ASCII one
      std::string(257, '1'),
      std::string(256, '1') + ":",
  };
  for (const std::string& token : bad) {
    EXPECT_FALSE(ValidBotToken(token)) << "'" << token << "' (" << token.size() << " bytes)";
  }
}

// ---- routing

constexpr int64_t kBotId = 7000001;
const TelegramBot kBot{kBotId, "keel_test_bot"};
constexpr int64_t kGroup = -1001234567890;  // a supergroup's id: negative, past 32 bits

Json Person(int64_t id) {
  return {{"id", id},
          {"is_bot", false},
          {"first_name", "First"},
          {"last_name", "Last"},
          {"username", "first_last"}};
}

// Update 9001: message 55 from Person(42) in chat `chat_id` of `type`, holding `text`.
Json TextUpdate(int64_t chat_id, const std::string& type, const std::string& text) {
  return {{"update_id", 9001},
          {"message",
           {{"message_id", 55},
            {"from", Person(42)},
            {"chat", {{"id", chat_id}, {"type", type}}},
            {"date", 1700000000},
            {"text", text}}}};
}

Json GroupUpdate(const std::string& text) { return TextUpdate(kGroup, "supergroup", text); }

TelegramInbound Route(const Json& update, const TelegramBot& bot = kBot) {
  auto routed = RouteUpdate(update, bot);
  EXPECT_TRUE(routed.ok()) << routed.status().ToString() << " for " << update.dump();
  return routed.ok() ? *routed : TelegramInbound{};
}

// Taken: for the agent, with its content and where the answer goes.
void ExpectTaken(const Json& update, const std::string& content, const Json& target,
                 const TelegramBot& bot = kBot) {
  SCOPED_TRACE(update.dump());
  TelegramInbound in = Route(update, bot);
  EXPECT_TRUE(in.take) << in.ignored;
  EXPECT_TRUE(in.addressed);
  EXPECT_EQ(in.ignored, "");
  EXPECT_EQ(in.sender_id, "42");
  EXPECT_EQ(in.direct, update["message"]["chat"]["type"] == "private");
  EXPECT_EQ(in.update_id, std::to_string(update["update_id"].get<int64_t>()));
  EXPECT_EQ(in.content, content);
  EXPECT_EQ(in.target, target);
  EXPECT_EQ(in.conversation,
            "chat:" + std::to_string(update["message"]["chat"]["id"].get<int64_t>()));
}

// Not for the agent, with a reason; the update_id is still read (the offset moves past it).
void ExpectIgnored(const Json& update, const TelegramBot& bot = kBot) {
  SCOPED_TRACE(update.dump());
  TelegramInbound in = Route(update, bot);
  EXPECT_FALSE(in.take);
  EXPECT_NE(in.ignored, "");
  EXPECT_EQ(in.update_id, "9001");
  EXPECT_EQ(in.content, "");
}

// A group message that does not call the bot: taken, but only its agent's owners are heard
// without calling it (access::AdmitSender).
void ExpectUnaddressed(const Json& update, const TelegramBot& bot = kBot) {
  SCOPED_TRACE(update.dump());
  TelegramInbound in = Route(update, bot);
  EXPECT_TRUE(in.take) << in.ignored;
  EXPECT_FALSE(in.addressed);
  EXPECT_FALSE(in.direct);
  EXPECT_EQ(in.text, update["message"]["text"]);
  EXPECT_EQ(in.content, "First Last: " + update["message"]["text"].get<std::string>());
}

TEST(TelegramRouteTest, AnUpdateWithoutANumericIdIsAnError) {
  Json update = TextUpdate(111, "private", "hi");
  const Json no_id[] = {Json::array(), Json("update"), Json(9001), Json::object()};
  for (const Json& u : no_id) {
    EXPECT_EQ(RouteUpdate(u, kBot).status().code(), Code::kInvalidArgument) << u.dump();
  }
  for (const Json& id : {Json(nullptr), Json("9001"), Json(9001.5), Json(true), Json::array({9001}),
                         Json::object(), Json(-1), Json(uint64_t{1} << 63), Json(~uint64_t{0})}) {
    update["update_id"] = id;
    EXPECT_EQ(RouteUpdate(update, kBot).status().code(), Code::kInvalidArgument) << update.dump();
  }
  update.erase("update_id");
  EXPECT_EQ(RouteUpdate(update, kBot).status().code(), Code::kInvalidArgument);
  // A large id is kept whole, in decimal.
  update["update_id"] = 123456789012LL;
  EXPECT_EQ(Route(update).update_id, "123456789012");
  update["update_id"] = (uint64_t{1} << 63) - 1;  // the largest taken
  EXPECT_EQ(Route(update).update_id, "9223372036854775807");
}

TEST(TelegramRouteTest, APrivateChatsTextGoesAsItIs) {
  // No prefix, no escaping, no trimming; a mention changes nothing; the answer replies to
  // nothing and goes to no thread.
  const std::string text = "  1 < 2 & <b>bold</b> &amp; \xF0\x9F\x98\x80 @keel_test_bot \n";
  ExpectTaken(TextUpdate(111, "private", text), text, Json{{"chat_id", 111}});
  TelegramInbound in = Route(TextUpdate(111, "private", "hello"));
  EXPECT_EQ(in.conversation, "chat:111");
  ASSERT_TRUE(in.target.contains("chat_id"));
  EXPECT_TRUE(in.target["chat_id"].is_number_integer()) << in.target.dump();
  EXPECT_EQ(in.target.size(), 1u) << in.target.dump();
  // Another chat is another conversation.
  EXPECT_EQ(Route(TextUpdate(222, "private", "hello")).conversation, "chat:222");
}

TEST(TelegramRouteTest, NothingFromABotNoOtherUpdateNoOtherMessage) {
  Json from_bot = TextUpdate(111, "private", "hello");
  from_bot["message"]["from"]["is_bot"] = true;
  ExpectIgnored(from_bot);
  Json bot_in_group = GroupUpdate("@keel_test_bot do it");
  bot_in_group["message"]["from"]["is_bot"] = true;
  ExpectIgnored(bot_in_group);
  // Even the bot itself answering in a chat, replying to its own message.
  Json itself = GroupUpdate("@keel_test_bot loop");
  itself["message"]["from"] = {{"id", kBotId}, {"is_bot", true}, {"first_name", "Keel"}};
  itself["message"]["reply_to_message"] = {{"message_id", 3}, {"from", {{"id", kBotId}}}};
  ExpectIgnored(itself);

  // Updates that are not a new message.
  Json edited = TextUpdate(111, "private", "edited");
  edited["edited_message"] = edited["message"];
  edited.erase("message");
  ExpectIgnored(edited);
  Json channel_post = TextUpdate(-100555, "channel", "@keel_test_bot news");
  channel_post["channel_post"] = channel_post["message"];
  channel_post.erase("message");
  ExpectIgnored(channel_post);
  ExpectIgnored({{"update_id", 9001},
                 {"callback_query", {{"id", "cb1"}, {"from", Person(42)}, {"data", "x"}}}});
  ExpectIgnored({{"update_id", 9001}});
  ExpectIgnored({{"update_id", 9001}, {"message", "hello"}});
  ExpectIgnored({{"update_id", 9001}, {"message", nullptr}});

  // Messages without text: a photo with a caption mentioning the bot, a sticker, a text
  // that is not a string.
  Json photo = TextUpdate(111, "private", "");
  photo["message"].erase("text");
  photo["message"]["photo"] = Json::array({{{"file_id", "p"}, {"width", 9}, {"height", 9}}});
  photo["message"]["caption"] = "@keel_test_bot look";
  ExpectIgnored(photo);
  Json in_group = photo;
  in_group["message"]["chat"] = {{"id", kGroup}, {"type", "supergroup"}};
  ExpectIgnored(in_group);
  Json not_text = TextUpdate(111, "private", "");
  not_text["message"]["text"] = 5;
  ExpectIgnored(not_text);

  // A channel, or a chat of no known type, even mentioning the bot.
  ExpectIgnored(TextUpdate(-100555, "channel", "@keel_test_bot news"));
  ExpectIgnored(TextUpdate(111, "secret", "@keel_test_bot hi"));
  ExpectIgnored(TextUpdate(111, "Private", "hi"));
  // No chat, or one without an integer id or a type.
  Json no_chat = TextUpdate(111, "private", "hi");
  no_chat["message"].erase("chat");
  ExpectIgnored(no_chat);
  Json string_id = TextUpdate(111, "private", "hi");
  string_id["message"]["chat"]["id"] = "111";
  ExpectIgnored(string_id);
  Json no_type = TextUpdate(111, "private", "hi");
  no_type["message"]["chat"].erase("type");
  ExpectIgnored(no_type);
}

TEST(TelegramRouteTest, AGroupTakesMentionsOfTheBotAsAWholeWordInAnyCase) {
  const Json reply_55 = {{"chat_id", kGroup}, {"reply_to", 55}};
  for (const char* text : {"hey @Keel_Test_Bot what's up", "@KEEL_TEST_BOT", "@keel_test_bot",
                           "ping @keel_test_bot", "@keel_test_bot, hi", "(@keel_test_bot)",
                           "@keel_test_bot\nline two", "@keel_test_botty and @keel_test_bot"}) {
    ExpectTaken(GroupUpdate(text), std::string("First Last: ") + text, reply_55);
  }
  // A plain group as a supergroup.
  ExpectTaken(TextUpdate(-42, "group", "ping @keel_test_bot"), "First Last: ping @keel_test_bot",
              Json{{"chat_id", -42}, {"reply_to", 55}});
  for (const char* text :
       {"hello everyone", "@other_bot do it", "@keel_test_botty is another",
        "@keel_test_bot_2 is another", "@keel_test_bot1", "keel_test_bot", "@keel_test_bo",
        "@ keel_test_bot", "mail@keel_test_bot", "x_@keel_test_bot", ""}) {
    ExpectUnaddressed(GroupUpdate(text));
    ExpectUnaddressed(TextUpdate(-42, "group", text));
  }
  // A command for this bot in the form Telegram gives it where several bots are: addressed;
  // another bot's command, or a bare one, is not.
  ExpectTaken(GroupUpdate("/help@Keel_Test_Bot now"), "First Last: /help@Keel_Test_Bot now",
              reply_55);
  for (const char* text :
       {"/help@other_bot", "/help", "x /help@keel_test_botx", "/help@keel_test_bot2"}) {
    ExpectUnaddressed(GroupUpdate(text));
  }
  // A bot without a username (getMe gave none) is mentioned by nothing: not by a bare "@".
  const TelegramBot nameless{kBotId, ""};
  for (const char* text : {"@", "@ hi", "mail me @ home", "@keel_test_bot"}) {
    ExpectUnaddressed(GroupUpdate(text), nameless);
  }
}

TEST(TelegramRouteTest, AGroupTakesRepliesToTheBotWithoutAMention) {
  Json reply = GroupUpdate("thanks!");
  reply["message"]["reply_to_message"] = {
      {"message_id", 50},
      {"from", {{"id", kBotId}, {"is_bot", true}, {"first_name", "Keel"}}},
      {"chat", {{"id", kGroup}, {"type", "supergroup"}}},
      {"text", "an answer"}};
  ExpectTaken(reply, "First Last: thanks!", Json{{"chat_id", kGroup}, {"reply_to", 55}});
  // A reply to someone else, to a message without a sender, to a bot of another id: no.
  Json to_user = reply;
  to_user["message"]["reply_to_message"]["from"] = Person(43);
  ExpectUnaddressed(to_user);
  Json to_other_bot = reply;
  to_other_bot["message"]["reply_to_message"]["from"]["id"] = kBotId + 1;
  ExpectUnaddressed(to_other_bot);
  Json to_nobody = reply;
  to_nobody["message"]["reply_to_message"].erase("from");
  ExpectUnaddressed(to_nobody);
  Json string_id = reply;
  string_id["message"]["reply_to_message"]["from"]["id"] = std::to_string(kBotId);
  ExpectUnaddressed(string_id);
  Json not_object = reply;
  not_object["message"]["reply_to_message"] = 50;
  ExpectUnaddressed(not_object);
  // Telegram's own bot id elsewhere in the message is not a reply to the bot.
  Json from_id = GroupUpdate("thanks!");
  from_id["message"]["from"]["id"] = kBotId;
  ExpectUnaddressed(from_id);
  // A reply to someone else that mentions the bot is taken.
  Json mentions = to_user;
  mentions["message"]["text"] = "@keel_test_bot look at this";
  ExpectTaken(mentions, "First Last: @keel_test_bot look at this",
              Json{{"chat_id", kGroup}, {"reply_to", 55}});
}

TEST(TelegramRouteTest, TopicsAndSenderNames) {
  Json topic = GroupUpdate("@keel_test_bot in a topic");
  topic["message"]["message_thread_id"] = 77;
  topic["message"]["is_topic_message"] = true;
  ExpectTaken(topic, "First Last: @keel_test_bot in a topic",
              Json{{"chat_id", kGroup}, {"reply_to", 55}, {"thread_id", 77}});
  // A reply thread of a group without topics has a message_thread_id but is no topic: the
  // answer goes to the chat (a message_thread_id there would be refused).
  Json thread = topic;
  thread["message"].erase("is_topic_message");
  ExpectTaken(thread, "First Last: @keel_test_bot in a topic",
              Json{{"chat_id", kGroup}, {"reply_to", 55}});
  Json not_topic = topic;
  not_topic["message"]["is_topic_message"] = false;
  ExpectTaken(not_topic, "First Last: @keel_test_bot in a topic",
              Json{{"chat_id", kGroup}, {"reply_to", 55}});
  // A topic flag without a thread id names no thread.
  Json no_thread = topic;
  no_thread["message"].erase("message_thread_id");
  ExpectTaken(no_thread, "First Last: @keel_test_bot in a topic",
              Json{{"chat_id", kGroup}, {"reply_to", 55}});

  // The sender's name as Telegram has it; "someone" when there is none.
  const std::string text = "@keel_test_bot hi";
  const Json target = {{"chat_id", kGroup}, {"reply_to", 55}};
  Json first_only = GroupUpdate(text);
  first_only["message"]["from"].erase("last_name");
  ExpectTaken(first_only, "First: " + text, target);
  Json last_only = GroupUpdate(text);
  last_only["message"]["from"].erase("first_name");
  ExpectTaken(last_only, "Last: " + text, target);
  Json nameless = last_only;
  nameless["message"]["from"].erase("last_name");
  ExpectTaken(nameless, "someone: " + text, target);
  // Without a sender (or one without an id) there is no one to answer to: passed over.
  Json no_from = GroupUpdate(text);
  no_from["message"].erase("from");
  ExpectIgnored(no_from);
  Json no_id = GroupUpdate(text);
  no_id["message"]["from"].erase("id");
  ExpectIgnored(no_id);
  Json odd_names = GroupUpdate(text);
  odd_names["message"]["from"]["first_name"] = 5;
  odd_names["message"]["from"]["last_name"] = nullptr;
  ExpectTaken(odd_names, "someone: " + text, target);
  // The username is not the name.
  Json user = GroupUpdate(text);
  user["message"]["from"] = {{"id", 42}, {"is_bot", false}, {"username", "ann"}};
  ExpectTaken(user, "someone: " + text, target);
  // A message without a message_id is answered without a reply.
  Json no_message_id = GroupUpdate(text);
  no_message_id["message"].erase("message_id");
  ExpectTaken(no_message_id, "First Last: " + text, Json{{"chat_id", kGroup}});
}

// A Bot API server is the tenant's choice (api_base): fields of the wrong type are read as absent,
// never thrown on (an update that threw would be fetched and thrown on again, forever).
TEST(TelegramRouteTest, FieldsOfTheWrongTypeDoNotThrow) {
  Json u = TextUpdate(42, "private", "hi");
  u["message"]["from"]["is_bot"] = "false";
  EXPECT_NO_THROW(RouteUpdate(u, kBot));
  EXPECT_TRUE(Route(u).take);
  Json topic = GroupUpdate("@keel_test_bot hi");
  topic["message"]["is_topic_message"] = 1;
  topic["message"]["message_thread_id"] = 9;
  EXPECT_NO_THROW(RouteUpdate(topic, kBot));
  EXPECT_FALSE(Route(topic).target.contains("thread_id"));
  for (Json odd : {Json("text"), Json(nullptr), Json::array({1, 2}), Json(5)}) {
    Json m = TextUpdate(42, "private", "hi");
    m["message"]["chat"] = odd;
    EXPECT_NO_THROW(RouteUpdate(m, kBot));
    m = TextUpdate(42, "private", "hi");
    m["message"]["from"] = odd;
    EXPECT_NO_THROW(RouteUpdate(m, kBot));
    m = TextUpdate(42, "group", "@keel_test_bot");
    m["message"]["reply_to_message"] = odd;
    EXPECT_NO_THROW(RouteUpdate(m, kBot));
  }
}

TEST(TelegramRouteTest, NegativeChatIdsStayNumbers) {
  TelegramInbound in = Route(GroupUpdate("@keel_test_bot hi"));
  ASSERT_TRUE(in.take);
  EXPECT_EQ(in.conversation, "chat:-1001234567890");
  ASSERT_TRUE(in.target["chat_id"].is_number_integer()) << in.target.dump();
  EXPECT_EQ(in.target["chat_id"].get<int64_t>(), kGroup);
  EXPECT_EQ(in.target.dump(), R"({"chat_id":-1001234567890,"reply_to":55})");
  // And through to sendMessage.
  Json body = SendMessageBody(in.target, "x", 0);
  ASSERT_TRUE(body["chat_id"].is_number_integer());
  EXPECT_EQ(body["chat_id"].get<int64_t>(), kGroup);
  EXPECT_NE(body.dump().find("\"chat_id\":-1001234567890"), std::string::npos) << body.dump();
  // A private chat with a large id too.
  EXPECT_EQ(Route(TextUpdate(5000000000LL, "private", "hi")).target.dump(),
            R"({"chat_id":5000000000})");
}

// ---- answers

const std::string kEmoji = "\xF0\x9F\x98\x80";  // U+1F600: 4 bytes of UTF-8, 2 UTF-16 units
const std::string kCjk = "\xE4\xB8\xAD";        // U+4E2D: 3 bytes, 1 unit

std::string Repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// A part as Telegram shows it. Fails when the part holds a '<' or '>', or a '&' that starts
// none of the three entities: escaping must leave nothing Telegram parses as markup.
std::string Unescape(const std::string& html) {
  std::string out;
  for (size_t i = 0; i < html.size();) {
    if (html.compare(i, 4, "&lt;") == 0) {
      out += '<';
      i += 4;
    } else if (html.compare(i, 4, "&gt;") == 0) {
      out += '>';
      i += 4;
    } else if (html.compare(i, 5, "&amp;") == 0) {
      out += '&';
      i += 5;
    } else {
      if (html[i] == '<' || html[i] == '>' || html[i] == '&') {
        ADD_FAILURE() << "unescaped '" << html[i] << "' at byte " << i;
      }
      out += html[i++];
    }
  }
  return out;
}

// The UTF-16 length of `s`, or -1 when it is not valid UTF-8 (a sequence cut or unfinished).
long Utf16Units(const std::string& s) {
  long units = 0;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80           ? 1
                       : (c >> 5) == 0x6  ? 2
                       : (c >> 4) == 0xE  ? 3
                       : (c >> 3) == 0x1E ? 4
                                          : 0;
    if (len == 0 || i + len > s.size()) return -1;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return -1;
    }
    units += len == 4 ? 2 : 1;
    i += len;
  }
  return units;
}

// Where the part of `answer` starting at `start` ends by the rule, and where the next one
// starts: the longest text within kTelegramMaxText UTF-16 units when it is the rest, else cut
// at the last newline within it (dropped), else the last space (dropped), else after the last
// character that fits.
std::pair<size_t, size_t> RuleCut(const std::string& answer, size_t start) {
  size_t i = start;
  size_t units = 0;
  while (i < answer.size()) {
    const unsigned char c = static_cast<unsigned char>(answer[i]);
    const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    const size_t u = len == 4 ? 2 : 1;
    if (units + u > kTelegramMaxText) break;
    units += u;
    i += len;
  }
  if (i >= answer.size()) return {answer.size(), answer.size()};
  for (char separator : {'\n', ' '}) {
    size_t at = answer.rfind(separator, i - 1);
    if (at != std::string::npos && at > start) return {at, at + 1};
  }
  return {i, i};
}

// Checks every part (escaped, non-empty, valid UTF-8, at most kTelegramMaxText UTF-16 units
// unescaped, cut where the rule says) and that together with the separators cut at they make
// up the answer. Returns the parts unescaped.
std::vector<std::string> ExpectParts(const std::string& answer,
                                     const std::vector<std::string>& parts) {
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    SCOPED_TRACE("part " + std::to_string(k) + " of " + std::to_string(parts.size()));
    const std::string text = Unescape(parts[k]);
    texts.push_back(text);
    const long units = Utf16Units(text);
    EXPECT_NE(units, -1) << "not UTF-8: a character was cut";
    EXPECT_GE(units, 1) << "an empty part";
    EXPECT_LE(units, static_cast<long>(kTelegramMaxText));
    EXPECT_LT(pos, answer.size()) << "a part past the answer's end";
    auto [end, next] = RuleCut(answer, pos);
    EXPECT_EQ(text.size(), end - pos) << "not cut where the rule says";
    EXPECT_EQ(answer.compare(pos, text.size(), text), 0) << "not the answer's next text";
    if (text.size() != end - pos) return texts;
    pos = next;
  }
  EXPECT_EQ(pos, answer.size()) << "the parts do not make up the answer";
  return texts;
}

TEST(TelegramReplyTest, ShortAnswersAreOneEscapedPart) {
  EXPECT_TRUE(ReplyParts("").empty());
  EXPECT_EQ(ReplyParts("a<b & c>d"), std::vector<std::string>{"a&lt;b &amp; c&gt;d"});
  // Already-escaped text is escaped again: Telegram shows what the agent wrote.
  EXPECT_EQ(ReplyParts("&amp; <i>x</i>"),
            std::vector<std::string>{"&amp;amp; &lt;i&gt;x&lt;/i&gt;"});
  // Quotes need no escaping outside attributes, and are left as they are.
  EXPECT_EQ(ReplyParts("\"q\" 'a'"), std::vector<std::string>{"\"q\" 'a'"});
  // Newlines and spaces in a short answer stay.
  EXPECT_EQ(ReplyParts("line 1\nline 2 \n"), std::vector<std::string>{"line 1\nline 2 \n"});
  const std::string emoji = "hi " + kEmoji + " " + kCjk;
  EXPECT_EQ(ReplyParts(emoji), std::vector<std::string>{emoji});
}

TEST(TelegramReplyTest, SplitsAtTheLimitPreferringNewlinesThenSpaces) {
  const std::string exact(kTelegramMaxText, 'x');
  EXPECT_EQ(ReplyParts(exact), std::vector<std::string>{exact});
  EXPECT_EQ(ReplyParts(exact + "y"), (std::vector<std::string>{exact, "y"}));

  // A newline at 3000: the first part is what comes before it, though a space comes later
  // within the limit; the newline is dropped, the space kept.
  std::string lines =
      std::string(3000, 'a') + "\n" + std::string(499, 'b') + " " + std::string(1499, 'c');
  ASSERT_EQ(lines.size(), 5000u);
  auto parts = ReplyParts(lines);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], std::string(3000, 'a'));
  EXPECT_EQ(parts[1], lines.substr(3001));
  ExpectParts(lines, parts);
  // The last newline within the limit, not the first.
  std::string two =
      std::string(100, 'a') + "\n" + std::string(2900, 'b') + "\n" + std::string(2000, 'c');
  parts = ReplyParts(two);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], two.substr(0, 3001));
  EXPECT_EQ(parts[1], std::string(2000, 'c'));
  // A newline past the limit is not where the first part ends.
  std::string late = std::string(1000, 'a') + " " + std::string(3500, 'b') + "\n" + "c";
  parts = ReplyParts(late);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], std::string(1000, 'a'));
  EXPECT_EQ(parts[1], std::string(3500, 'b') + "\nc");

  // No newline: the last space within the limit (not the first, not one past it).
  std::string words = std::string(10, 'z') + " " + std::string(3989, 'a') + " " +
                      std::string(500, 'b') + " " + std::string(500, 'c');
  parts = ReplyParts(words);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], words.substr(0, 4000));
  EXPECT_EQ(parts[1], std::string(500, 'b') + " " + std::string(500, 'c'));
  ExpectParts(words, parts);

  // Neither: cut at 4096 characters, then again.
  std::string solid(10000, 'w');
  parts = ReplyParts(solid);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], std::string(4096, 'w'));
  EXPECT_EQ(parts[1], std::string(4096, 'w'));
  EXPECT_EQ(parts[2], std::string(10000 - 2 * 4096, 'w'));
  // A separator at the part's very start leaves no empty part; the cut is at the limit.
  std::string leading = " " + std::string(5000, 'v');
  parts = ReplyParts(leading);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], leading.substr(0, 4096));
  EXPECT_EQ(parts[1], leading.substr(4096));
}

TEST(TelegramReplyTest, CountsUtf16UnitsAndNeverCutsACharacter) {
  // 2048 emoji are 4096 units: one part. 2049 are 4098: two, the first 2048 whole emoji.
  EXPECT_EQ(ReplyParts(Repeat(kEmoji, 2048)), std::vector<std::string>{Repeat(kEmoji, 2048)});
  auto parts = ReplyParts(Repeat(kEmoji, 2049));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], Repeat(kEmoji, 2048));
  EXPECT_EQ(parts[1], kEmoji);
  // The 4096th unit is the first half of an emoji: the part ends before it (4095 units).
  const std::string odd = "a" + Repeat(kEmoji, 2048);
  parts = ReplyParts(odd);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], "a" + Repeat(kEmoji, 2047));
  EXPECT_EQ(parts[1], kEmoji);
  ExpectParts(odd, parts);
  // Entities and emoji with no separator (tests/integration/test_telegram.py's LONG).
  const std::string mixed = "abc" + Repeat(kEmoji + "<&", 1500);
  parts = ReplyParts(mixed);
  ASSERT_EQ(parts.size(), 2u);
  auto texts = ExpectParts(mixed, parts);
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts[0], "abc" + Repeat(kEmoji + "<&", 1023));
  EXPECT_EQ(Utf16Units(texts[0]), 4095);

  // 3-byte characters are one unit each: 4096 of them (12288 bytes) are one part.
  EXPECT_EQ(ReplyParts(Repeat(kCjk, 4096)), std::vector<std::string>{Repeat(kCjk, 4096)});
  parts = ReplyParts(Repeat(kCjk, 4097));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], Repeat(kCjk, 4096));
  EXPECT_EQ(parts[1], kCjk);
  // 2-byte ones too.
  const std::string e_acute = "\xC3\xA9";
  EXPECT_EQ(ReplyParts(Repeat(e_acute, 4096)).size(), 1u);
  EXPECT_EQ(ReplyParts(Repeat(e_acute, 4097)).size(), 2u);
  // Emoji then CJK around the boundary: 2047 emoji (4094) + 3 CJK: 4097 units.
  const std::string around = Repeat(kEmoji, 2047) + Repeat(kCjk, 3);
  parts = ReplyParts(around);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], Repeat(kEmoji, 2047) + Repeat(kCjk, 2));
  EXPECT_EQ(parts[1], kCjk);
}

// Telegram refuses a message of only whitespace: no part is one, and an answer that is only
// whitespace has none (its reply is skipped, not refused forever).
TEST(TelegramReplyTest, NoPartIsOnlyWhitespace) {
  EXPECT_TRUE(ReplyParts("  \n\t\r\n ").empty());
  const std::string a(4096, 'a');
  // A newline exactly at the limit is the cut: the second part is "b", not "\nb".
  EXPECT_EQ(ReplyParts(a + "\nb"), (std::vector<std::string>{a, "b"}));
  EXPECT_EQ(ReplyParts(a + " b"), (std::vector<std::string>{a, "b"}));
  for (const auto& part : ReplyParts(a + std::string(5000, '\n') + "end")) {
    EXPECT_NE(part.find_first_not_of(" \t\r\n"), std::string::npos);
  }
}

TEST(TelegramReplyTest, EscapesAfterSplitting) {
  // 4097 '<': counted unescaped, the first part is 4096 of them (16384 bytes escaped).
  auto parts = ReplyParts(std::string(4097, '<'));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], Repeat("&lt;", 4096));
  EXPECT_EQ(parts[1], "&lt;");
  // An '&' as the last character that fits is escaped whole in the first part.
  parts = ReplyParts(std::string(4095, 'a') + "&bb");
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], std::string(4095, 'a') + "&amp;");
  EXPECT_EQ(parts[1], "bb");
  // Markup near the boundary after a space: the cut is at the space, the rest escaped.
  const std::string near = std::string(4000, 'x') + " " + std::string(95, '>') + "yy";
  parts = ReplyParts(near);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], std::string(4000, 'x'));
  EXPECT_EQ(parts[1], Repeat("&gt;", 95) + "yy");
  // A short answer full of markup is one part however long its escaped form.
  EXPECT_EQ(ReplyParts(std::string(4096, '&')), std::vector<std::string>{Repeat("&amp;", 4096)});
}

TEST(TelegramReplyTest, LongMixedAnswersMakeUpTheAnswer) {
  // Lines of markup, emoji and CJK (the integration test's LINES, and more).
  std::string lines;
  for (int i = 0; i < 150; ++i) {
    if (i) lines += "\n";
    lines += std::to_string(i) + " <tag> & \"q\" " + kEmoji + " " + Repeat(kCjk, i % 7) +
             std::string(50, 'x');
  }
  auto parts = ReplyParts(lines);
  EXPECT_GE(parts.size(), 3u);
  auto texts = ExpectParts(lines, parts);
  // Every line is short: every cut is at a newline, which is all that was left out.
  std::string joined;
  for (size_t k = 0; k < texts.size(); ++k) joined += (k ? "\n" : "") + texts[k];
  EXPECT_EQ(joined, lines);
  // Words without newlines, a long run without separators, emoji at odd offsets.
  std::string prose;
  for (int i = 0; prose.size() < 30000; ++i) {
    prose += (i % 13 == 0 ? Repeat(kEmoji, 1 + i % 5)
                          : std::string(1 + i % 9, static_cast<char>('a' + i % 26)));
    prose += i % 41 == 40 ? std::string(5000, 'r') : "";
    prose += i % 3 ? " " : "<&> ";
  }
  ExpectParts(prose, ReplyParts(prose));
  // Only separators: the split ends, with no empty part and none past the limit.
  for (char separator : {' ', '\n'}) {
    auto blank = ReplyParts(std::string(9000, separator));
    EXPECT_LE(blank.size(), 3u);
    for (const std::string& p : blank) {
      EXPECT_FALSE(p.empty());
      EXPECT_LE(p.size(), kTelegramMaxText);
    }
  }
}

// ---- sendMessage

TEST(TelegramSendTest, BodiesReplyWithTheFirstPartOnlyAndStayInTheTopic) {
  const Json target = {{"chat_id", kGroup}, {"reply_to", 55}, {"thread_id", 77}};
  EXPECT_EQ(SendMessageBody(target, "first &amp;", 0),
            (Json{{"chat_id", kGroup},
                  {"text", "first &amp;"},
                  {"parse_mode", "HTML"},
                  {"reply_parameters", {{"message_id", 55}, {"allow_sending_without_reply", true}}},
                  {"message_thread_id", 77}}));
  for (size_t index : {size_t{1}, size_t{2}}) {
    EXPECT_EQ(SendMessageBody(target, "more", index), (Json{{"chat_id", kGroup},
                                                            {"text", "more"},
                                                            {"parse_mode", "HTML"},
                                                            {"message_thread_id", 77}}))
        << index;
  }
  // A private chat's target: chat_id, text and parse_mode, nothing else, for every part.
  for (size_t index : {size_t{0}, size_t{1}}) {
    EXPECT_EQ(SendMessageBody(Json{{"chat_id", 111}}, "hi", index),
              (Json{{"chat_id", 111}, {"text", "hi"}, {"parse_mode", "HTML"}}))
        << index;
  }
  // A reply without a topic.
  EXPECT_EQ(
      SendMessageBody(Json{{"chat_id", -42}, {"reply_to", 9}}, "x", 0),
      (Json{{"chat_id", -42},
            {"text", "x"},
            {"parse_mode", "HTML"},
            {"reply_parameters", {{"message_id", 9}, {"allow_sending_without_reply", true}}}}));
  // chat_id stays an integer, as RouteUpdate's target has it (read back from the outbox too).
  Json body = SendMessageBody(Json::parse(R"({"chat_id":-1001234567890,"reply_to":55})"), "x", 0);
  ASSERT_TRUE(body["chat_id"].is_number_integer()) << body.dump();
  EXPECT_EQ(body["chat_id"].get<int64_t>(), kGroup);
  ASSERT_TRUE(body["reply_parameters"]["message_id"].is_number_integer());
  EXPECT_TRUE(body["reply_parameters"]["allow_sending_without_reply"].is_boolean());

  // From a routed update to the bodies of its answer's parts.
  Json update = GroupUpdate("@keel_test_bot long one");
  update["message"]["is_topic_message"] = true;
  update["message"]["message_thread_id"] = 77;
  TelegramInbound in = Route(update);
  ASSERT_TRUE(in.take);
  auto parts = ReplyParts(std::string(5000, 'a'));
  ASSERT_EQ(parts.size(), 2u);
  for (size_t i = 0; i < parts.size(); ++i) {
    Json b = SendMessageBody(in.target, parts[i], i);
    EXPECT_EQ(b["text"], parts[i]);
    EXPECT_EQ(b["message_thread_id"], 77);
    EXPECT_EQ(b.contains("reply_parameters"), i == 0) << i;
  }
}

}  // namespace
}  // namespace keel::channels

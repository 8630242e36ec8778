// Approval cards' pure parts (channels/cards.h): the buttons' data, each platform's press as it
// reports it, the requests that show and edit a card, and the text a card shows.

#include "keel/channels/cards.h"

#include <gtest/gtest.h>

#include "keel/store/types.h"

namespace keel::channels {
namespace {

constexpr const char* kId = "01a24d9e-b8dd-73f3-9425-0de728880142";

TEST(CardButtonTest, DataNamesTheApprovalAndTheVerdictWithinTelegramsLimit) {
  EXPECT_LE(ButtonData(kId, true).size(), 64u);
  EXPECT_LE(ButtonData(kId, false).size(), 64u);
  EXPECT_EQ(ParseButtonData(ButtonData(kId, true)), std::pair(std::string(kId), true));
  EXPECT_EQ(ParseButtonData(ButtonData(kId, false)), std::pair(std::string(kId), false));
  for (const char* other :
       {"", "keel:approve:", "keel:maybe:x", "approve:x", "keel:reject", "KEEL:approve:x"}) {
    EXPECT_FALSE(ParseButtonData(other).has_value()) << other;
  }
  EXPECT_FALSE(ParseButtonData("keel:approve:" + std::string(65, 'a')).has_value());
}

TEST(CardPressTest, TelegramsCallbackQuery) {
  Json update = Json::parse(R"({"update_id": 9, "callback_query": {
      "id": "4382bfdwdsb323b2d9", "chat_instance": "-1",
      "from": {"id": 111, "is_bot": false, "first_name": "Ann", "username": "ann"},
      "message": {"message_id": 77, "chat": {"id": 111, "type": "private"}, "date": 1,
                  "text": "Approval needed"},
      "data": "keel:reject:abc"}})");
  auto p = TelegramPress(update);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->approval_id, "abc");
  EXPECT_FALSE(p->approve);
  EXPECT_EQ(p->sender.platform, "telegram");
  EXPECT_EQ(p->sender.id, "111");
  EXPECT_EQ(p->sender.name, "ann");
  EXPECT_EQ(p->handle, "4382bfdwdsb323b2d9");
  EXPECT_EQ(p->message, Json::parse(R"({"chat_id": 111, "message_id": 77})"));

  // Another button is a press of no approval (answered all the same).
  Json other = update;
  other["callback_query"]["data"] = "vote:1";
  ASSERT_TRUE(TelegramPress(other).has_value());
  EXPECT_EQ(TelegramPress(other)->approval_id, "");
  // Not a press at all: a bot's, no one's, without a query id, fields of the wrong types (a
  // server posing as Telegram), a message.
  Json odd = update;
  odd["callback_query"]["from"]["is_bot"] = "false";
  ASSERT_TRUE(TelegramPress(odd).has_value()) << "a string is not true";
  odd["callback_query"]["from"] = "someone";
  EXPECT_FALSE(TelegramPress(odd).has_value());
  odd = update;
  odd["callback_query"]["message"] = 7;
  ASSERT_TRUE(TelegramPress(odd).has_value());
  EXPECT_TRUE(TelegramPress(odd)->message.is_null());
  odd = update;
  odd["callback_query"]["data"] = Json::array();
  EXPECT_EQ(TelegramPress(odd)->approval_id, "");
  Json bot = update;
  bot["callback_query"]["from"]["is_bot"] = true;
  EXPECT_FALSE(TelegramPress(bot).has_value());
  Json anonymous = update;
  anonymous["callback_query"].erase("from");
  EXPECT_FALSE(TelegramPress(anonymous).has_value());
  Json no_id = update;
  no_id["callback_query"].erase("id");
  EXPECT_FALSE(TelegramPress(no_id).has_value());
  EXPECT_FALSE(TelegramPress(Json::parse(R"({"update_id": 1, "message": {}})")).has_value());
  EXPECT_FALSE(TelegramPress(Json::parse(R"({"update_id": 1, "callback_query": 5})")).has_value());
}

TEST(CardPressTest, SlacksBlockActions) {
  Json payload = Json::parse(R"({"type": "block_actions",
      "user": {"id": "U0ANN", "username": "ann", "name": "ann", "team_id": "T1"},
      "container": {"type": "message", "message_ts": "1700000000.000100", "channel_id": "D1"},
      "channel": {"id": "D1", "name": "directmessage"},
      "message": {"ts": "1700000000.000100", "text": "Approval needed"},
      "actions": [{"action_id": "keel_approve", "block_id": "keel_approval",
                   "value": "keel:approve:abc", "type": "button", "action_ts": "1"}]})");
  auto p = SlackPress(payload);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->approval_id, "abc");
  EXPECT_TRUE(p->approve);
  EXPECT_EQ(p->sender.platform, "slack");
  EXPECT_EQ(p->sender.id, "U0ANN");
  EXPECT_EQ(p->message, Json::parse(R"({"channel": "D1", "ts": "1700000000.000100"})"));
  Json other = payload;
  other["type"] = "view_submission";
  EXPECT_FALSE(SlackPress(other).has_value());
  Json foreign = payload;
  foreign["actions"][0]["value"] = "their-app:1";
  EXPECT_FALSE(SlackPress(foreign).has_value());
  Json none = payload;
  none["actions"] = Json::array();
  EXPECT_FALSE(SlackPress(none).has_value());
}

TEST(CardPressTest, DiscordsComponentInteraction) {
  Json in_server = Json::parse(R"({"id": "1", "type": 3, "token": "t", "channel_id": "5",
      "guild_id": "9", "member": {"user": {"id": "222", "username": "bob"}},
      "message": {"id": "88", "channel_id": "5"},
      "data": {"custom_id": "keel:approve:abc", "component_type": 2}})");
  auto p = DiscordPress(in_server);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->sender.id, "222");
  EXPECT_EQ(p->sender.name, "bob");
  EXPECT_TRUE(p->approve);
  EXPECT_EQ(p->message, Json::parse(R"({"channel_id": "5", "message_id": "88"})"));
  Json in_dm = in_server;
  in_dm.erase("member");
  in_dm.erase("guild_id");
  in_dm["user"] = {{"id", "333"}, {"username", "cy"}};
  ASSERT_TRUE(DiscordPress(in_dm).has_value());
  EXPECT_EQ(DiscordPress(in_dm)->sender.id, "333");
  Json command = in_server;
  command["type"] = 2;
  EXPECT_FALSE(DiscordPress(command).has_value());
  Json bot = in_dm;
  bot["user"]["bot"] = true;
  EXPECT_FALSE(DiscordPress(bot).has_value());
  bot["user"]["bot"] = "yes";
  EXPECT_TRUE(DiscordPress(bot).has_value()) << "only true is a bot";
  Json odd = in_server;
  odd["member"] = "x";
  odd["data"] = 5;
  EXPECT_FALSE(DiscordPress(odd).has_value());
}

TEST(CardFormTest, FieldsAreDecoded) {
  const std::string body = "a=1&payload=%7B%22type%22%3A+%22x%22%7D&b=%ZZ%4";
  EXPECT_EQ(FormField(body, "payload"), "{\"type\": \"x\"}");
  EXPECT_EQ(FormField(body, "a"), "1");
  EXPECT_EQ(FormField(body, "b"), "%ZZ%4") << "a broken escape is kept as written";
  EXPECT_EQ(FormField(body, "c"), "");
  EXPECT_EQ(FormField("", "payload"), "");
  EXPECT_EQ(FormField("payload", "payload"), "");
}

store::Approval Waiting() {
  store::Approval a;
  a.id = kId;
  a.tool = "notes.append";
  a.arguments = {{"line", std::string(5000, 'x')}};
  a.reason = "notes.append: the tenant policy's rule says always";
  a.expires_at = 1700000000000;
  return a;
}

TEST(CardTextTest, SaysWhatWaitsWithinEveryPlatformsLimit) {
  const std::string text = CardText(Waiting(), "helper");
  EXPECT_LE(text.size(), 1900u);
  EXPECT_NE(text.find("helper wants to run notes.append"), std::string::npos) << text;
  EXPECT_NE(text.find("Why: notes.append"), std::string::npos);
  EXPECT_NE(text.find(kId), std::string::npos);
  store::Approval a = Waiting();
  a.status = "approved";
  EXPECT_EQ(DecidedText(a, "Ann (u1)").rfind("Approved by Ann (u1): notes.append", 0), 0u);
  a.status = "expired";
  EXPECT_EQ(DecidedText(a, "Keel").rfind("Expired", 0), 0u);
}

TEST(CardBodyTest, EachPlatformGetsItsButtonsAndLosesThemWhenEdited) {
  const Json tg = TelegramCardBody({{"chat_id", 111}, {"thread_id", 4}}, "text", kId);
  EXPECT_EQ(tg["chat_id"], 111);
  EXPECT_FALSE(tg.contains("parse_mode")) << "a card is plain text";
  EXPECT_EQ(tg["message_thread_id"], 4);
  EXPECT_EQ(tg["reply_markup"]["inline_keyboard"][0][0]["callback_data"], ButtonData(kId, true));
  EXPECT_EQ(tg["reply_markup"]["inline_keyboard"][0][1]["callback_data"], ButtonData(kId, false));
  const Json tg_edit = TelegramEditBody({{"chat_id", 111}, {"message_id", 7}}, "done");
  EXPECT_EQ(tg_edit["message_id"], 7);
  EXPECT_TRUE(tg_edit["reply_markup"]["inline_keyboard"].empty());

  const Json slack = SlackCardBody({{"channel", "D1"}}, "<!channel> & co", kId);
  EXPECT_EQ(slack["text"], "&lt;!channel&gt; &amp; co") << "nobody is pinged";
  // Escapes count against Slack's 3,000 characters: a text of them is cut short, whole.
  const std::string many = SlackCardBody({{"channel", "D1"}}, std::string(1900, '&') + "é",
                                         kId)["blocks"][0]["text"]["text"];
  EXPECT_LE(many.size(), 2900u);
  EXPECT_EQ(many.substr(many.size() - 8), "&amp;...");

  EXPECT_EQ(slack["blocks"][1]["elements"][0]["value"], ButtonData(kId, true));
  EXPECT_EQ(slack["blocks"][1]["elements"][1]["value"], ButtonData(kId, false));
  const Json slack_edit = SlackEditBody({{"channel", "D1"}, {"ts", "1.2"}}, "done");
  EXPECT_EQ(slack_edit["ts"], "1.2");
  EXPECT_EQ(slack_edit["blocks"].size(), 1u);

  const Json discord = DiscordCardBody("text", kId);
  EXPECT_TRUE(discord["allowed_mentions"]["parse"].empty());
  EXPECT_EQ(discord["components"][0]["components"][1]["custom_id"], ButtonData(kId, false));
  EXPECT_TRUE(DiscordEditBody("done")["components"].empty());
}

TEST(CardMessageTest, WhereEachPlatformSaysTheCardIs) {
  EXPECT_EQ(*CardMessage("telegram", Json::parse(
                                         R"({"ok": true, "result": {"message_id": 5,
                                             "chat": {"id": -100}}})")),
            Json::parse(R"({"chat_id": -100, "message_id": 5})"));
  EXPECT_EQ(*CardMessage("slack", Json::parse(R"({"ok": true, "channel": "D1", "ts": "1.2"})")),
            Json::parse(R"({"channel": "D1", "ts": "1.2"})"));
  EXPECT_EQ(*CardMessage("discord", Json::parse(R"({"id": "88", "channel_id": "5"})")),
            Json::parse(R"({"channel_id": "5", "message_id": "88"})"));
  EXPECT_FALSE(CardMessage("telegram", Json::parse(R"({"ok": true, "result": true})")).ok());
  EXPECT_FALSE(CardMessage("slack", Json::parse(R"({"ok": true})")).ok());
  EXPECT_FALSE(CardMessage("discord", Json()).ok());
}

}  // namespace
}  // namespace keel::channels

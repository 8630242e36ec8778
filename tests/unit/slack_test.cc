// The Slack channel's pure parts (channels/slack.h): settings, the v0 request signature (Slack's
// own documented example), and which events an agent takes and where each goes.

#include "keel/channels/slack.h"

#include <gtest/gtest.h>

namespace keel::channels {
namespace {

// Slack's documented example (api.slack.com, "Verifying requests from Slack").
constexpr const char* kSecret = "8f742231b10e8888abcd99yyyzzz85a5";
constexpr const char* kTimestamp = "1531420618";
constexpr const char* kBody =
    "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id="
    "G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-"
    "collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%"
    "2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121."
    "803a0bc887a14d10d2c447fce8b6703c";
constexpr const char* kSignature =
    "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
constexpr Millis kThen = 1531420618LL * 1000;

TEST(SlackSignatureTest, SlacksExampleVerifies) {
  EXPECT_TRUE(VerifySlackSignature(kSecret, kTimestamp, kSignature, kBody, kThen).ok());
  // Five minutes either way, no more.
  EXPECT_TRUE(VerifySlackSignature(kSecret, kTimestamp, kSignature, kBody, kThen + 300000).ok());
  EXPECT_TRUE(VerifySlackSignature(kSecret, kTimestamp, kSignature, kBody, kThen - 300000).ok());
  EXPECT_EQ(VerifySlackSignature(kSecret, kTimestamp, kSignature, kBody, kThen + 300001).code(),
            Code::kUnauthenticated);
  EXPECT_EQ(VerifySlackSignature(kSecret, kTimestamp, kSignature, kBody, kThen - 300001).code(),
            Code::kUnauthenticated);
}

TEST(SlackSignatureTest, AnythingChangedIsRefused) {
  const std::string body = kBody;
  const std::string sig = kSignature;
  for (const auto& [secret, ts, signature, text] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"8f742231b10e8888abcd99yyyzzz85a6", kTimestamp, sig, body},  // another secret
           {kSecret, "1531420619", sig, body},                           // another time
           {kSecret, kTimestamp, sig, body + " "},                       // another body
           {kSecret, kTimestamp, "v1=" + sig.substr(3), body},           // another version
           {kSecret, kTimestamp, sig.substr(3), body},                   // no version
           {kSecret, kTimestamp, sig.substr(0, sig.size() - 1), body},   // cut short
           {kSecret, kTimestamp,
            "v0=A2114D57B48EAC39B9AD189DD8316235A7B4A8D21A10BD27519666489C69B503",
            body},  // upper case
           {kSecret, kTimestamp, "", body},
           {kSecret, "", sig, body},
           {kSecret, "1531420618.5", sig, body},
           {kSecret, "-1531420618", sig, body},
           {kSecret, "99999999999999999999", sig, body},
       }) {
    EXPECT_EQ(VerifySlackSignature(secret, ts, signature, text, kThen).code(),
              Code::kUnauthenticated)
        << ts << " " << signature;
  }
  // The checks that need no key alone.
  EXPECT_TRUE(CheckSlackHeaders(kTimestamp, "anything", kThen).ok());
  EXPECT_FALSE(CheckSlackHeaders(kTimestamp, "", kThen).ok());
  EXPECT_FALSE(CheckSlackHeaders("abc", "v0=00", kThen).ok());
}

TEST(SlackSettingsTest, DefaultsAndRefusals) {
  auto s = ParseSlackSettings({{"signing_secret", "S"}, {"bot_token", "B"}});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(SlackSettingsJson(*s), (Json{{"signing_secret", "S"},
                                         {"bot_token", "B"},
                                         {"api_base", "https://slack.com/api"},
                                         {"role", "guest"}}));
  auto trimmed = ParseSlackSettings(
      {{"signing_secret", "S"}, {"bot_token", "B"}, {"api_base", "http://127.0.0.1:9/api//"}});
  ASSERT_TRUE(trimmed.ok());
  EXPECT_EQ(trimmed->api_base, "http://127.0.0.1:9/api");
  for (const Json& bad : {
           Json{{"bot_token", "B"}},
           Json{{"signing_secret", "S"}},
           Json{{"signing_secret", ""}, {"bot_token", "B"}},
           Json{{"signing_secret", "S"}, {"bot_token", 5}},
           Json{{"signing_secret", "S"}, {"bot_token", "B"}, {"mode", "webhook"}},
           Json{{"signing_secret", "S"}, {"bot_token", "B"}, {"api_base", "ftp://x"}},
           Json{{"signing_secret", "S"}, {"bot_token", "B"}, {"api_base", "https://x/?a=1"}},
           Json{{"signing_secret", "S"}, {"bot_token", "B"}, {"api_base", "https://x y"}},
           // Credentials in the URL would be stored and shown with the settings.
           Json{{"signing_secret", "S"}, {"bot_token", "B"}, {"api_base", "https://u:p@x/api"}},
           Json{{"signing_secret", "S"}, {"bot_token", "B"}, {"role", "owner"}},
           Json::array(),
       }) {
    EXPECT_EQ(ParseSlackSettings(bad).status().code(), Code::kInvalidArgument) << bad.dump();
  }
}

Json Envelope(Json event, const std::string& id = "Ev01") {
  return {{"type", "event_callback"},
          {"event_id", id},
          {"team_id", "T1"},
          {"authorizations", Json::array({{{"user_id", "UBOT"}, {"is_bot", true}}})},
          {"event", std::move(event)}};
}

Json Dm(const std::string& text) {
  return {{"type", "message"}, {"channel", "D1"},    {"user", "U1"},
          {"text", text},      {"ts", "100.000001"}, {"channel_type", "im"}};
}

Json Mention(const std::string& text) {
  return {{"type", "app_mention"},
          {"channel", "C1"},
          {"user", "U1"},
          {"text", text},
          {"ts", "200.000002"}};
}

TEST(SlackRouteTest, ADirectMessageIsTakenAsItIs) {
  auto in = RouteSlackEvent(Envelope(Dm("hello <there> & you")));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_TRUE(in->take);
  EXPECT_EQ(in->event_id, "Ev01");
  EXPECT_EQ(in->conversation, "im:D1");
  EXPECT_EQ(in->content, "hello <there> & you");
  EXPECT_EQ(in->target, (Json{{"channel", "D1"}}));
  Json threaded = Dm("in a thread");
  threaded["thread_ts"] = "90.000000";
  EXPECT_EQ(RouteSlackEvent(Envelope(threaded))->target,
            (Json{{"channel", "D1"}, {"thread_ts", "90.000000"}}));
  EXPECT_EQ(RouteSlackEvent(Envelope(threaded))->conversation, "im:D1");
}

TEST(SlackRouteTest, AMentionIsTakenPerThreadWithoutTheMention) {
  auto in = RouteSlackEvent(Envelope(Mention("<@UBOT> what is up?")));
  ASSERT_TRUE(in.ok());
  EXPECT_TRUE(in->take);
  EXPECT_EQ(in->conversation, "thread:C1:200.000002");  // it starts a thread
  EXPECT_EQ(in->content, "what is up?");
  EXPECT_EQ(in->target, (Json{{"channel", "C1"}, {"thread_ts", "200.000002"}}));
  Json reply = Mention("and <@UBOT|keel> again, <@UOTHER>");
  reply["thread_ts"] = "150.000000";
  auto again = RouteSlackEvent(Envelope(reply));
  EXPECT_EQ(again->conversation, "thread:C1:150.000000");
  EXPECT_EQ(again->content, "and  again, <@UOTHER>");
  EXPECT_EQ(again->target, (Json{{"channel", "C1"}, {"thread_ts", "150.000000"}}));
  // What Slack escaped comes back as it was typed (its markup, a user mention, stays).
  EXPECT_EQ(RouteSlackEvent(Envelope(Mention("<@UBOT> is 1 &lt; 2 &amp;&amp; 3 &gt; 2? &amp;lt;")))
                ->content,
            "is 1 < 2 && 3 > 2? &lt;");
  EXPECT_EQ(RouteSlackEvent(Envelope(Dm("a &lt;b&gt; &amp; <@U2>")))->content, "a <b> & <@U2>");
  // Only a mention: the text as it is.
  EXPECT_EQ(RouteSlackEvent(Envelope(Mention("<@UBOT>")))->content, "<@UBOT>");
  // A mention of a user whose id starts with the bot's is not the bot's.
  EXPECT_EQ(RouteSlackEvent(Envelope(Mention("<@UBOTX> hi")))->content, "<@UBOTX> hi");
}

TEST(SlackRouteTest, WhatIsPassedOver) {
  Json channel_message = Dm("in a channel");
  channel_message["channel_type"] = "channel";
  Json from_bot = Dm("beep");
  from_bot["bot_id"] = "B1";
  Json edited = Dm("edited");
  edited["subtype"] = "message_changed";
  Json itself = Dm("me");
  itself["user"] = "UBOT";
  Json no_text = Dm("x");
  no_text.erase("text");
  Json reaction = {{"type", "reaction_added"}, {"user", "U1"}, {"reaction", "+1"}};
  Json no_channel = Dm("x");
  no_channel["channel"] = 5;
  // A channel's message that mentions the bot comes again as an app_mention: taken there.
  Json mentioning = Dm("hey <@UBOT> look");
  mentioning["channel_type"] = "channel";
  for (const Json& e : {mentioning, from_bot, edited, itself, no_text, reaction, no_channel}) {
    auto in = RouteSlackEvent(Envelope(e));
    ASSERT_TRUE(in.ok()) << e.dump();
    EXPECT_FALSE(in->take) << e.dump();
    EXPECT_FALSE(in->ignored.empty());
  }
  // A channel's other messages are taken to their thread, calling no one (only the agent's
  // owners are heard so).
  for (const char* type : {"channel", "group"}) {
    channel_message["channel_type"] = type;
    auto in = RouteSlackEvent(Envelope(channel_message));
    ASSERT_TRUE(in.ok());
    EXPECT_TRUE(in->take);
    EXPECT_FALSE(in->addressed);
    EXPECT_FALSE(in->direct);
    EXPECT_EQ(in->content, "in a channel");
    EXPECT_EQ(in->conversation.rfind("thread:", 0), 0u) << in->conversation;
  }
  // Not an event callback at all.
  EXPECT_FALSE(RouteSlackEvent(Json{{"type", "app_rate_limited"}})->take);
  EXPECT_FALSE(RouteSlackEvent(Json::array())->take);
}

TEST(SlackRouteTest, AnEventCallbackNeedsAnIdAndAnEvent) {
  Json no_id = Envelope(Dm("x"));
  no_id.erase("event_id");
  Json bad_id = Envelope(Dm("x"), "Ev 1");
  Json number_id = Envelope(Dm("x"));
  number_id["event_id"] = 5;
  Json no_event = Envelope(Dm("x"));
  no_event["event"] = "text";
  for (const Json& e : {no_id, bad_id, number_id, no_event}) {
    EXPECT_EQ(RouteSlackEvent(e).status().code(), Code::kInvalidArgument) << e.dump();
  }
}

TEST(SlackRouteTest, ThePostBodyGoesToTheTarget) {
  EXPECT_EQ(SlackPostBody(Json{{"channel", "C1"}, {"thread_ts", "1.2"}}, "hi &amp; bye"),
            (Json{{"channel", "C1"}, {"text", "hi &amp; bye"}, {"thread_ts", "1.2"}}));
  EXPECT_EQ(SlackPostBody(Json{{"channel", "D1"}}, "x"), (Json{{"channel", "D1"}, {"text", "x"}}));
}

}  // namespace
}  // namespace keel::channels

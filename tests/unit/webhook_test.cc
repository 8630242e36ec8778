// The webhook channel without a server: Standard Webhooks signatures (the specification's own
// example), the settings' checks, the template and the conversation.

#include "keel/channels/webhook.h"

#include <gtest/gtest.h>

namespace keel::channels {
namespace {

// The example of the Standard Webhooks specification (a secret, a message, its signature).
constexpr const char* kSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr const char* kId = "msg_p5jXN8AQM9LWM0D4loKWxJek";
constexpr const char* kTimestamp = "1614265330";
constexpr const char* kBody = "{\"test\": 2432232314}";
constexpr const char* kSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
constexpr Millis kThen = 1614265330LL * 1000;

Status Verify(std::string_view signatures, Millis now = kThen, std::string_view body = kBody,
              std::string_view id = kId, std::string_view secret = kSecret) {
  return VerifySignature(secret, id, kTimestamp, signatures, body, now);
}

TEST(WebhookSignatureTest, AcceptsTheSpecificationsExample) {
  EXPECT_TRUE(Verify(kSignature).ok());
  // One of several (a key being rotated), in any place of the list.
  EXPECT_TRUE(Verify(std::string("v1,AAAA ") + kSignature).ok());
  EXPECT_TRUE(Verify(std::string(kSignature) + " v1a,whatever").ok());
  // Within five minutes either way.
  EXPECT_TRUE(Verify(kSignature, kThen + kSignatureTolerance).ok());
  EXPECT_TRUE(Verify(kSignature, kThen - kSignatureTolerance).ok());
}

TEST(WebhookSignatureTest, RefusesEveryChangeOfWhatIsSigned) {
  const Code kUnauth = Code::kUnauthenticated;
  EXPECT_EQ(Verify(kSignature, kThen, "{\"test\": 2432232315}").code(), kUnauth);
  EXPECT_EQ(Verify(kSignature, kThen, kBody, "msg_other").code(), kUnauth);
  EXPECT_EQ(Verify(kSignature, kThen, kBody, kId, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSx").code(),
            kUnauth);
  // The whsec_ text itself is not the key; nor is a key given raw the same as its base64.
  EXPECT_EQ(Verify(kSignature, kThen, kBody, kId, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").code(),
            kUnauth);
  EXPECT_EQ(Verify("v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=").code(), kUnauth);
  EXPECT_EQ(Verify("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE").code(), kUnauth);
  EXPECT_EQ(Verify("v1,").code(), kUnauth);
  EXPECT_EQ(Verify(" ").code(), kUnauth);
  EXPECT_EQ(Verify("").code(), kUnauth);
  EXPECT_EQ(Verify(kSignature, kThen + kSignatureTolerance + 1000).code(), kUnauth);
  EXPECT_EQ(Verify(kSignature, kThen - kSignatureTolerance - 1000).code(), kUnauth);
  for (const char* ts : {"", "-1614265330", "1614265330.0", " 1614265330", "16142653300000000"}) {
    EXPECT_EQ(VerifySignature(kSecret, kId, ts, kSignature, kBody, kThen).code(), kUnauth) << ts;
  }
  EXPECT_EQ(VerifySignature(kSecret, "", kTimestamp, kSignature, kBody, kThen).code(), kUnauth);
  // A whsec_ secret whose rest is not base64, or a key shorter than 16 bytes, is the channel's
  // fault, not the caller's.
  EXPECT_EQ(Verify(kSignature, kThen, kBody, kId, "whsec_!!!").code(), Code::kUnavailable);
  EXPECT_EQ(Verify(kSignature, kThen, kBody, kId, "fifteen-bytes!!").code(), Code::kUnavailable);
  EXPECT_EQ(
      Verify(kSignature, kThen, kBody, kId, "whsec_" + std::string("AAAAAAAAAAAAAAAAAAAA")).code(),
      Code::kUnavailable);  // 15 bytes
  // The checks without a key alone.
  EXPECT_TRUE(CheckDeliveryHeaders(kId, kTimestamp, "v1,x", kThen).ok());
  EXPECT_EQ(CheckDeliveryHeaders(kId, kTimestamp, "", kThen).code(), kUnauth);
  EXPECT_EQ(CheckDeliveryHeaders(kId, "x", "v1,x", kThen).code(), kUnauth);
}

TEST(WebhookSettingsTest, DefaultsAndChecks) {
  auto s = ParseWebhookSettings({{"signing_secret", "HOOK"}});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->message_template, "{{}}");
  EXPECT_EQ(s->conversation, "");
  EXPECT_EQ(s->role, "guest");
  EXPECT_EQ(WebhookSettingsJson(*s)["signing_secret"], "HOOK");
  const Json bad[] = {
      Json::object(),
      Json::array(),
      {{"signing_secret", ""}},
      {{"signing_secret", 7}},
      {{"signing_secret", "HOOK"}, {"colour", "red"}},
      {{"signing_secret", "HOOK"}, {"role", "owner"}},
      {{"signing_secret", "HOOK"}, {"template", ""}},
      {{"signing_secret", "HOOK"}, {"template", "{{/a"}},
      {{"signing_secret", "HOOK"}, {"template", "{{a}}"}},  // not a pointer
      {{"signing_secret", "HOOK"}, {"template", "{{/a~2}}"}},
      {{"signing_secret", "HOOK"}, {"template", std::string(kMaxTemplateBytes + 1, 'x')}},
      {{"signing_secret", "HOOK"}, {"conversation", "thread"}},
  };
  for (const Json& settings : bad) {
    EXPECT_EQ(ParseWebhookSettings(settings).status().code(), Code::kInvalidArgument)
        << settings.dump();
  }
  std::string many;
  for (int i = 0; i <= kMaxPlaceholders; ++i) many += "{{/a}}";
  EXPECT_EQ(ParseWebhookSettings({{"signing_secret", "H"}, {"template", many}}).status().code(),
            Code::kInvalidArgument);
}

TEST(WebhookTemplateTest, FillsPointersOnceAndNamesWhatIsMissing) {
  Json body = {{"issue", {{"title", "Crash {{/sender}}"}, {"number", 42}}},
               {"sender", "alice"},
               {"a/b", {{"m~n", true}}},
               {"labels", {"bug", "p1"}}};
  auto m = RenderMessage("#{{/issue/number}} {{/issue/title}} by {{/sender}}", body);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // A value that looks like a placeholder is text: it is not filled in again.
  EXPECT_EQ(*m, "#42 Crash {{/sender}} by alice");
  EXPECT_EQ(*RenderMessage("{{/a~1b/m~0n}} {{/labels}} {{/labels/1}}", body),
            "true [\"bug\",\"p1\"] p1");
  EXPECT_EQ(*RenderMessage("{{}}", Json{{"x", 1}}), "{\"x\":1}");
  EXPECT_EQ(*RenderMessage("no placeholders", body), "no placeholders");
  for (const char* t : {"{{/nope}}", "{{/issue/title/x}}", "{{/labels/9}}", "{{/labels/-}}"}) {
    auto r = RenderMessage(t, body);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << t;
  }
  EXPECT_EQ(RenderMessage("{{/sender}}", Json{{"sender", ""}}).status().code(),
            Code::kInvalidArgument);  // an empty message
  // Placeholders repeat values: the message is bounded, not only the body.
  Json big = {{"a", std::string(kMaxMessageBytes / 4 + 1, 'x')}};
  EXPECT_TRUE(RenderMessage("{{/a}}{{/a}}{{/a}}", big).ok());
  EXPECT_EQ(RenderMessage("{{/a}}{{/a}}{{/a}}{{/a}}", big).status().code(), Code::kInvalidArgument);
}

TEST(WebhookConversationTest, StringsAndNumbersOnly) {
  Json body = {{"repo", "acme/app"}, {"pr", 7}, {"obj", {{"a", 1}}}, {"none", nullptr}};
  EXPECT_EQ(*ConversationOf("", body), "");
  EXPECT_EQ(*ConversationOf("/repo", body), "acme/app");
  EXPECT_EQ(*ConversationOf("/pr", body), "7");
  for (const char* p : {"/obj", "/none", "/missing"}) {
    EXPECT_EQ(ConversationOf(p, body).status().code(), Code::kInvalidArgument) << p;
  }
  EXPECT_EQ(ConversationOf("/long", Json{{"long", std::string(513, 'x')}}).status().code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace keel::channels

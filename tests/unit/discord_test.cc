// The Discord channel's pure parts (channels/discord.h) and Ed25519 verification
// (common/crypto.h): RFC 8032's test vectors, the request signature over TIMESTAMP + BODY, the
// settings, and which interactions an agent takes.

#include "keel/channels/discord.h"

#include <gtest/gtest.h>

#include "keel/common/crypto.h"

namespace keel::channels {
namespace {

// RFC 8032, section 7.1, tests 1 and 2.
constexpr const char* kKey1 = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
constexpr const char* kSig1 =
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9"
    "b46bd25bf5f0595bbe24655141438e7a100b";
constexpr const char* kKey2 = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";
constexpr const char* kSig2 =
    "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f1"
    "1d8c387b2eaeb4302aeeb00d291612bb0c00";

std::string Bytes(const char* hex) { return *HexDecode(hex); }

TEST(Ed25519Test, Rfc8032Vectors) {
  EXPECT_TRUE(Ed25519Verify(Bytes(kKey1), "", Bytes(kSig1)));
  EXPECT_TRUE(Ed25519Verify(Bytes(kKey2), "\x72", Bytes(kSig2)));
  // Another message, another key, a flipped bit, wrong sizes.
  EXPECT_FALSE(Ed25519Verify(Bytes(kKey1), "x", Bytes(kSig1)));
  EXPECT_FALSE(Ed25519Verify(Bytes(kKey2), "", Bytes(kSig1)));
  std::string flipped = Bytes(kSig2);
  flipped[10] ^= 1;
  EXPECT_FALSE(Ed25519Verify(Bytes(kKey2), "\x72", flipped));
  EXPECT_FALSE(Ed25519Verify(Bytes(kKey2).substr(1), "\x72", Bytes(kSig2)));
  EXPECT_FALSE(Ed25519Verify(Bytes(kKey2), "\x72", Bytes(kSig2).substr(1)));
  EXPECT_FALSE(Ed25519Verify(std::string(32, '\0'), "", std::string(64, '\0')));
}

TEST(Ed25519Test, HexDecode) {
  EXPECT_EQ(HexDecode("00ffA0"), std::string("\x00\xff\xa0", 3));
  EXPECT_EQ(HexDecode(""), std::string());
  EXPECT_FALSE(HexDecode("0"));
  EXPECT_FALSE(HexDecode("zz"));
  EXPECT_FALSE(HexDecode("0x00"));
}

// The request signature: the key signs TIMESTAMP + BODY. Signed with RFC 8032 test 1's secret
// key (by python3-cryptography) over "1700000000" + {"type":1}.
constexpr const char* kPingSig =
    "1695961a47c91a1ec033b819b7e87e3dbc583dd0cee6d1fd0216f58ac87b6228ae531ddbf91fb7bc28d7edf7f086"
    "04da16f54624f38a6bc0614e4dc13cd47f0f";

TEST(DiscordSignatureTest, OverTimestampAndBody) {
  const Millis then = 1700000000000;
  EXPECT_TRUE(VerifyDiscordSignature(kKey1, "1700000000", kPingSig, R"({"type":1})", then).ok());
  // Another body, another timestamp, another key, upper-case hex is the same signature.
  EXPECT_FALSE(VerifyDiscordSignature(kKey1, "1700000000", kPingSig, R"({"type":2})", then).ok());
  EXPECT_FALSE(VerifyDiscordSignature(kKey1, "1700000001", kPingSig, R"({"type":1})", then).ok());
  EXPECT_FALSE(VerifyDiscordSignature(kKey2, "1700000000", kPingSig, R"({"type":1})", then).ok());
  EXPECT_FALSE(
      VerifyDiscordSignature(kKey1, "1700000000", kPingSig, R"({"type":1})", then + 300001).ok());
  // A timestamp's last digit moved into the body signs the same bytes (Discord's scheme has no
  // separator): the timestamp is then ten times too small, and the window refuses it.
  EXPECT_FALSE(VerifyDiscordSignature(kKey1, "170000000", kPingSig, R"(0{"type":1})", then).ok());
  // Test 1 signs the empty message: no timestamp can make it, so it never verifies.
  EXPECT_FALSE(VerifyDiscordSignature(kKey1, "1", kSig1, "", 1000).ok());
  // Headers are checked first: unix seconds within five minutes, 128 hex characters.
  EXPECT_EQ(CheckDiscordHeaders("1700000000", kSig1, 1700000000000).code(), Code::kOk);
  EXPECT_EQ(CheckDiscordHeaders("1700000000", kSig1, 1700000300001).code(), Code::kUnauthenticated);
  EXPECT_EQ(CheckDiscordHeaders("1700000000", std::string(kSig1).substr(2), 1700000000000).code(),
            Code::kUnauthenticated);
  EXPECT_EQ(CheckDiscordHeaders("", kSig1, 0).code(), Code::kUnauthenticated);
  EXPECT_EQ(CheckDiscordHeaders("17e8", kSig1, 0).code(), Code::kUnauthenticated);
  EXPECT_EQ(CheckDiscordHeaders("1700000000", std::string(128, 'g'), 1700000000000).code(),
            Code::kUnauthenticated);
}

const Json kSettings = {
    {"application_id", "1100000000000000001"}, {"public_key", kKey1}, {"bot_token", "DISCORD_BOT"}};

TEST(DiscordSettingsTest, DefaultsAndRefusals) {
  auto s = ParseDiscordSettings(kSettings);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(DiscordSettingsJson(*s), (Json{{"application_id", "1100000000000000001"},
                                           {"public_key", kKey1},
                                           {"bot_token", "DISCORD_BOT"},
                                           {"command", "ask"},
                                           {"api_base", "https://discord.com/api/v10"},
                                           {"role", "guest"}}));
  auto with = [](const char* key, Json value) {
    Json s = kSettings;
    if (value.is_null()) {
      s.erase(key);
    } else {
      s[key] = std::move(value);
    }
    return s;
  };
  for (const Json& bad :
       {with("application_id", nullptr), with("application_id", "12a"),
        with("application_id", 1100000000000000001ULL),
        with("application_id", std::string(21, '1')), with("public_key", "abc"),
        with("public_key", std::string(64, 'g')), with("public_key", std::string(66, 'a')),
        with("bot_token", ""), with("bot_token", nullptr), with("command", "Ask"),
        with("command", "ask me"), with("command", std::string(33, 'a')), with("command", ""),
        with("api_base", "discord.com"), with("role", "owner"), with("mode", "webhook")}) {
    EXPECT_EQ(ParseDiscordSettings(bad).status().code(), Code::kInvalidArgument) << bad.dump();
  }
}

Json Command(const std::string& text, bool in_server = true) {
  Json i = {
      {"id", "1200000000000000000"},
      {"type", 2},
      {"token", "aW50ZXJhY3Rpb24"},
      {"channel_id", "2200000000000000001"},
      {"data",
       {{"name", "ask"}, {"options", {{{"type", 3}, {"name", "message"}, {"value", text}}}}}}};
  Json user = {{"id", "3"}, {"username", "ann"}, {"global_name", "Ann B"}};
  if (in_server) {
    i["guild_id"] = "9";
    i["member"] = {{"user", user}, {"nick", "annie"}};
  } else {
    i["user"] = user;
  }
  return i;
}

TEST(DiscordRouteTest, TheCommandIsTakenOneSessionPerChannel) {
  const auto s = *ParseDiscordSettings(kSettings);
  const Millis now = 1800000000000;
  auto in = RouteInteraction(Command("what is up?"), s, now);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_TRUE(in->take);
  EXPECT_EQ(in->interaction_id, "1200000000000000000");
  EXPECT_EQ(in->conversation, "channel:2200000000000000001");
  EXPECT_EQ(in->content, "annie: what is up?");
  // The token's age counts from the id's time (a snowflake), earlier than `now` here.
  const Millis made = (1200000000000000000LL >> 22) + 1420070400000LL;
  EXPECT_EQ(in->target, (Json{{"application_id", "1100000000000000001"},
                              {"token", "aW50ZXJhY3Rpb24"},
                              {"channel_id", "2200000000000000001"},
                              {"at", made}}));
  Json no_nick = Command("hi");
  no_nick["member"].erase("nick");
  EXPECT_EQ(RouteInteraction(no_nick, s, now)->content, "Ann B: hi");
  auto dm = RouteInteraction(Command("hi", false), s, now);
  EXPECT_EQ(dm->conversation, "dm:2200000000000000001");
  EXPECT_EQ(dm->content, "hi");
  // An id from the future does not make the token younger than its arrival.
  Json future = Command("hi");
  future["id"] = "18446744073709551615";
  EXPECT_EQ(RouteInteraction(future, s, now)->target["at"], now);
}

TEST(DiscordRouteTest, PingsNoticesAndRefusals) {
  const auto s = *ParseDiscordSettings(kSettings);
  auto ping = RouteInteraction(Json{{"type", 1}, {"id", "1"}}, s, 0);
  ASSERT_TRUE(ping.ok());
  EXPECT_EQ(ping->type, 1);
  EXPECT_FALSE(ping->take);
  Json other = Command("x");
  other["data"]["name"] = "other";
  Json bot = Command("x");
  bot["member"]["user"]["bot"] = true;
  Json empty = Command("");
  for (const Json& i : {other, bot, empty}) {
    auto in = RouteInteraction(i, s, 0);
    ASSERT_TRUE(in.ok()) << i.dump();
    EXPECT_FALSE(in->take) << i.dump();
    EXPECT_FALSE(in->notice.empty());
  }
  Json no_token = Command("x");
  no_token.erase("token");
  Json no_channel = Command("x");
  no_channel["channel_id"] = 5;
  Json no_id = Command("x");
  no_id["id"] = "abc";
  for (const Json& i : {no_token, no_channel, no_id, Json{{"type", "2"}}, Json::array()}) {
    EXPECT_EQ(RouteInteraction(i, s, 0).status().code(), Code::kInvalidArgument) << i.dump();
  }
  // Fields of the wrong type are never thrown on.
  Json odd = Command("x");
  odd["member"] = "text";
  odd["data"]["options"] = "text";
  EXPECT_NO_THROW(RouteInteraction(odd, s, 0));
}

}  // namespace
}  // namespace keel::channels

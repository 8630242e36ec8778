#include <gtest/gtest.h>

#include <set>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/json_util.h"
#include "keel/common/time.h"

namespace keel {
namespace {

TEST(IdsTest, NewIdsAreUuidV7AndStrictlyIncreasing) {
  std::string prev;
  for (int i = 0; i < 10000; ++i) {
    std::string id = NewId();
    ASSERT_TRUE(IsUuid(id)) << id;
    ASSERT_EQ(id[14], '7');
    ASSERT_GT(id, prev);
    prev = id;
  }
}

TEST(TimeTest, Rfc3339RoundTrips) {
  Millis t = 1796040000123;  // 2026-11-30T...
  std::string s = FormatRfc3339(t);
  EXPECT_EQ(s.size(), 24u);
  EXPECT_EQ(ParseRfc3339(s), t);
  EXPECT_EQ(ParseRfc3339("2026-11-30T12:00:00+01:00"), ParseRfc3339("2026-11-30T11:00:00Z"));
  EXPECT_FALSE(ParseRfc3339("2026-13-30T12:00:00Z"));
  EXPECT_FALSE(ParseRfc3339("yesterday"));
}

TEST(CryptoTest, Base64UrlRoundTripsAndTokensAreDistinct) {
  for (std::string s : {"", "a", "ab", "abc", "abcd", "\xff\x00\x10"}) {
    EXPECT_EQ(Base64UrlDecode(Base64UrlEncode(s)), s);
  }
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::set<std::string> tokens;
  for (int i = 0; i < 100; ++i) tokens.insert(NewToken());
  EXPECT_EQ(tokens.size(), 100u);
}

TEST(JsonTest, UntrustedBodiesFailCleanly) {
  EXPECT_EQ(ParseJsonObject("{bad").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseJsonObject("[1,2]").status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(ParseJsonObject("").ok());
  auto j = ParseJsonObject(R"({"name": 3})");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(ReqString(*j, "name").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ReqString(*j, "missing").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ErrorBody(NotFound("x")), R"({"error":{"code":"not_found","message":"x"}})");
}

}  // namespace
}  // namespace keel

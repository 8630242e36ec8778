#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <set>
#include <vector>

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

TEST(IdsTest, AnIdCarriesItsMillisecondAndTheRfc9562Variant) {
  Millis before = NowMillis();
  std::string id = NewId();
  Millis after = NowMillis();
  Millis at = std::stoll(id.substr(0, 8) + id.substr(9, 4), nullptr, 16);
  EXPECT_GE(at, before);
  EXPECT_LE(at, after);
  EXPECT_NE(std::string("89ab").find(id[19]), std::string::npos) << id;
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

// The same text as gmtime_r and printf give, across days, leap years, negative times and
// years past four digits.
TEST(TimeTest, Rfc3339FormatsAsTheCLibraryDoes) {
  auto libc = [](Millis ms) {
    std::time_t secs = static_cast<std::time_t>(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
    int frac = static_cast<int>(ms - static_cast<Millis>(secs) * 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[80];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
    return std::string(buf);
  };
  std::vector<Millis> times = {0,
                               1,
                               -1,
                               -1000,
                               -86400001,
                               951782400000,     // 2000-02-29
                               4107542399999,    // 2100-02-28T23:59:59.999
                               253402300799999,  // 9999-12-31T23:59:59.999
                               253402300800000,  // 10000-01-01
                               -62167219200000,  // 0000-01-01
                               -62167219200001};
  uint64_t x = 88172645463325252ull;  // xorshift: times over three millennia
  for (int i = 0; i < 20000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    times.push_back(static_cast<Millis>(x % 100000000000000ull) - 30000000000000);
  }
  for (Millis t : times) EXPECT_EQ(FormatRfc3339(t), libc(t)) << t;
}

TEST(TimeTest, Rfc3339OffsetsStayWithinADay) {
  EXPECT_EQ(ParseRfc3339("2026-11-30T12:00:00+23:59"), ParseRfc3339("2026-11-29T12:01:00Z"));
  EXPECT_EQ(ParseRfc3339("2026-11-30T12:00:00-23:59"), ParseRfc3339("2026-12-01T11:59:00Z"));
  for (const char* bad :
       {"2026-11-30T12:00:00+25:00", "2026-11-30T12:00:00-24:00", "2026-11-30T12:00:00+01:60",
        "2026-11-30T12:00:00+99:99", "2026-11-30T12:00:00+-1:00", "2026-11-30T12:00:00+ 1:00",
        "2026-11-30T12:00:00+0100", "2026-11-30T12:00:00+01:0"}) {
    EXPECT_FALSE(ParseRfc3339(bad)) << bad;
  }
}

TEST(TimeTest, Rfc3339TakesOnlyDaysItsMonthHasAndOnlyDigits) {
  // mktime-style normalisation would have made these the 3rd of March and the 1st of May.
  for (const char* bad : {"2026-02-29T00:00:00Z", "2026-02-31T00:00:00Z", "2026-04-31T00:00:00Z",
                          "2100-02-29T00:00:00Z", "2026-00-10T00:00:00Z", "2026-01-00T00:00:00Z",
                          "+026-01-10T00:00:00Z", " 2026-1-10T00:00:00Z", "2026-01-10T-1:00:00Z",
                          "2026-01-10 00:00:00Z", "2026-01-10T00:00:0Z", "2026-01-10T24:00:00Z"}) {
    EXPECT_FALSE(ParseRfc3339(bad)) << bad;
  }
  EXPECT_EQ(ParseRfc3339("2028-02-29T00:00:00Z"), *ParseRfc3339("2028-03-01T00:00:00Z") - 86400000);
  EXPECT_TRUE(ParseRfc3339("2000-02-29T00:00:00Z"));
  EXPECT_EQ(ParseRfc3339("2026-12-31t23:59:59z"), ParseRfc3339("2026-12-31T23:59:59Z"));
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

std::string Nested(char open, char close, int levels) {
  return std::string(levels, open) + std::string(levels, close);
}

TEST(JsonTest, AppendJsonStringWritesWhatDumpJsonWrites) {
  const std::string cases[] = {
      "",
      "plain",
      "quote \" backslash \\ slash /",
      std::string("controls \b\f\n\r\t \x01 \x1f \x7f and a NUL: ") + std::string(1, '\0'),
      "two bytes \xc3\xa9, three \xe2\x82\xac, four \xf0\x9f\x98\x80",
      "invalid: lone continuation \x80",
      "invalid: truncated \xe2\x82",
      "invalid: overlong \xc0\xaf and \xe0\x80\xaf",
      "invalid: surrogate \xed\xa0\x80",
      "invalid: past U+10FFFF \xf4\x90\x80\x80",
      "invalid: 0xFF \xff",
  };
  for (const std::string& s : cases) {
    std::string out = "prefix";
    AppendJsonString(out, s);
    EXPECT_EQ(out, "prefix" + DumpJson(Json(s))) << s;
    auto parsed = ParseJson(out.substr(6));
    ASSERT_TRUE(parsed.ok()) << s;
  }
  // Runs of plain text between escapes and multi-byte characters, at every boundary.
  const std::string pieces[] = {"a",
                                "bc",
                                "\"",
                                "\\",
                                "\n",
                                std::string(1, '\0'),
                                "\x7f",
                                "\xc3\xa9",
                                "\xe2\x82\xac",
                                "\xf0\x9f\x98\x80",
                                "\x80",
                                " ",
                                "a plain run longer than sixteen bytes"};
  uint32_t x = 2463534242u;  // xorshift
  for (int i = 0; i < 5000; ++i) {
    std::string s;
    for (int k = 0; k < i % 40; ++k) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      s += pieces[x % std::size(pieces)];
    }
    std::string out;
    AppendJsonString(out, s);
    ASSERT_EQ(out, DumpJson(Json(s))) << i;
  }
}

TEST(JsonTest, DumpJsonWritesWhatNlohmannWrites) {
  // Random trees of every JSON type: nested objects and arrays, integers at the limits of both
  // integer types, floats, strings with escapes and invalid UTF-8, keys that need escaping.
  const std::string strings[] = {"",
                                 "k",
                                 "a \"q\" \\ \n",
                                 std::string(1, '\0'),
                                 "\xc3\xa9\xe2\x82\xac",
                                 "bad \xff \x80",
                                 "\xed\xa0\x80",
                                 "z"};
  const Json scalars[] = {nullptr,
                          true,
                          false,
                          0,
                          -1,
                          std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max(),
                          std::numeric_limits<uint64_t>::max(),
                          uint64_t{1} << 63,
                          0.5,
                          -1e300,
                          3.141592653589793,
                          1e-7,
                          Json::array(),
                          Json::object()};
  uint32_t x = 88172645u;  // xorshift
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
  };
  std::function<Json(int)> make = [&](int depth) -> Json {
    const uint32_t pick = next() % 6;
    if (depth > 0 && pick == 0) {
      Json o = Json::object();
      for (uint32_t i = next() % 5; i > 0; --i)
        o[strings[next() % std::size(strings)]] = make(depth - 1);
      return o;
    }
    if (depth > 0 && pick == 1) {
      Json a = Json::array();
      for (uint32_t i = next() % 5; i > 0; --i) a.push_back(make(depth - 1));
      return a;
    }
    if (pick == 2) return strings[next() % std::size(strings)];
    return scalars[next() % std::size(scalars)];
  };
  for (int i = 0; i < 3000; ++i) {
    Json j = make(4);
    ASSERT_EQ(DumpJson(j), j.dump(-1, ' ', false, Json::error_handler_t::replace)) << i;
  }
  Json deep = 1;
  for (int i = 0; i < 300; ++i) deep = Json::array({deep, Json{{"k", deep.size()}}});
  EXPECT_EQ(DumpJson(deep), deep.dump(-1, ' ', false, Json::error_handler_t::replace));
}

TEST(JsonTest, TruncateUtf8CutsBetweenCharacters) {
  EXPECT_EQ(TruncateUtf8("short", 10), "short");
  EXPECT_EQ(TruncateUtf8("abcdef", 3), "abc");
  const std::string euros = "\xe2\x82\xac\xe2\x82\xac";  // two 3-byte characters
  EXPECT_EQ(TruncateUtf8(euros, 6), euros);
  EXPECT_EQ(TruncateUtf8(euros, 5), "\xe2\x82\xac");
  EXPECT_EQ(TruncateUtf8(euros, 4), "\xe2\x82\xac");
  EXPECT_EQ(TruncateUtf8(euros, 3), "\xe2\x82\xac");
  EXPECT_EQ(TruncateUtf8(euros, 2), "");
  EXPECT_EQ(TruncateUtf8("a\xf0\x9f\x98\x80", 4), "a");
}

TEST(JsonTest, RefusesNestingDeeperThan64Levels) {
  EXPECT_TRUE(ParseJson(Nested('[', ']', 64)).ok());
  auto deep = ParseJson(Nested('[', ']', 65));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), Code::kInvalidArgument);
  EXPECT_NE(deep.status().message().find("64 levels"), std::string::npos) << deep.status().message();
  // 200,000 levels (the attack): refused in one pass, no stack overflow
  for (char open : {'[', '{'}) {
    std::string text;
    if (open == '[') {
      text = Nested('[', ']', 200000);
    } else {
      for (int i = 0; i < 200000; ++i) text += "{\"a\":";
      text += "1" + std::string(200000, '}');
    }
    EXPECT_EQ(ParseJson(text).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(ParseJsonObject("{\"params\":" + text + "}").status().code(), Code::kInvalidArgument);
  }
  // brackets inside strings do not count
  EXPECT_TRUE(ParseJson("[\"" + std::string(1000, '[') + "\"]").ok());
  // an unclosed deep text is refused too
  EXPECT_FALSE(ParseJson(std::string(100000, '[')).ok());
}

TEST(JsonTest, RefusesDuplicateKeys) {
  auto dup = ParseJsonObject(R"({"name": "a", "name": "b"})");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), Code::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("'name' appears twice"), std::string::npos);
  EXPECT_FALSE(ParseJson(R"({"a": {"x": 1, "x": 1}})").ok());
  EXPECT_FALSE(ParseJson(R"([{"k": 1, "j": 2, "k": 3}])").ok());
  // the same key in sibling or nested objects is fine
  EXPECT_TRUE(ParseJson(R"({"a": {"a": 1}, "b": {"a": 2}, "c": [{"a": 1}, {"a": 2}]})").ok());
  // a duplicate after containers, in containers that follow others, whatever the value
  EXPECT_FALSE(ParseJson(R"({"a": {}, "a": 1})").ok());
  EXPECT_FALSE(ParseJson(R"({"a": [1, {"x": 1}, {"y": 2, "z": [], "y": 3}]})").ok());
  EXPECT_FALSE(ParseJson(R"({"a": {"b": {"c": 1}}, "d": {"b": {"c": 1, "c": [2]}}})").ok());
  EXPECT_FALSE(ParseJson(R"([[], [[{"k": {"k": 1}, "k": 2}]]])").ok());
  // what is accepted is what nlohmann's own parser builds
  const std::string mixed =
      R"({"z": [1, {"y": [], "x": {"w": [[{"v": null}], {"u": true}]}}, "s"], "a": {"b": {}},)"
      R"( "c": [[[]], [{}], {"d": -1.5e3, "e": "\u00e9"}], "f": {"g": [{"h": {"i": [0]}}]}})";
  auto parsed = ParseJson(mixed);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(*parsed, Json::parse(mixed));
}

TEST(JsonTest, RequestBodiesRefuseNulAndInvalidUtf8) {
  EXPECT_FALSE(ParseJsonObject(R"({"name": "a\u0000b"})").ok());
  EXPECT_FALSE(ParseJsonObject(R"({"na\u0000me": "x"})").ok());
  EXPECT_FALSE(ParseJsonObject(std::string("{\"name\": \"a\0b\"}", 15)).ok());
  EXPECT_FALSE(ParseJsonObject("{\"name\": \"\xff\xfe\"}").ok());
  EXPECT_FALSE(ParseJsonObject("{\"name\": \"\xc0\xaf\"}").ok());  // an overlong '/'
  EXPECT_FALSE(ParseJsonObject(R"({"name": "\ud800"})").ok());     // a lone surrogate
  // a value from inside the process read back (a stored tool output) may hold a NUL
  auto stored = ParseJson(R"({"output": "a\u0000b"})");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ((*stored)["output"].get<std::string>(), std::string("a\0b", 3));
}

TEST(JsonTest, NumbersOutOfRangeAndTrailingTextAreRefused) {
  EXPECT_FALSE(ParseJson("1e400").ok());
  EXPECT_FALSE(ParseJson("-1e400").ok());
  EXPECT_FALSE(ParseJson("{} {}").ok());
  EXPECT_FALSE(ParseJson("").ok());
  auto big = ParseJson("123456789012345678901234567890");  // read as a double, not wrapped
  ASSERT_TRUE(big.ok());
  EXPECT_TRUE(big->is_number_float());
  auto syntax = ParseJsonObject("{\"a\": }");
  ASSERT_FALSE(syntax.ok());
  EXPECT_EQ(syntax.status().message().rfind("request body is not valid JSON: parse error at line 1", 0), 0u)
      << syntax.status().message();
}

}  // namespace
}  // namespace keel

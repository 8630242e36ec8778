// Metering (model/metering.h), the router's settings in keel.toml (config.h), and the request
// normalization the response cache keys on (runtime/model_calls.h).

#include "keel/model/metering.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "keel/common/ids.h"
#include "keel/config/config.h"
#include "keel/runtime/conversation_cache.h"
#include "keel/runtime/model_calls.h"

namespace keel {
namespace {

TEST(MeteringTest, CostsAreIntegerMicroDollarsRoundedToTheNearest) {
  config::ModelPrice price{150000, 600000};  // $0.15 / $0.60 per million tokens
  EXPECT_EQ(model::CostMicros(price, {1000000, 0}), 150000);
  EXPECT_EQ(model::CostMicros(price, {1000, 1000}), 750);
  EXPECT_EQ(model::CostMicros(price, {10, 0}), 2);  // 1.5 rounds up
  EXPECT_EQ(model::CostMicros(price, {3, 0}), 0);   // 0.45 rounds down
  EXPECT_EQ(model::CostMicros(config::ModelPrice{}, {1000000, 1000000}), 0);
  // Large counts and prices do not overflow.
  EXPECT_EQ(model::CostMicros({int64_t(1) << 40, 0}, {int64_t(1) << 30, 0}),
            static_cast<int64_t>(((__int128(1) << 70) + 500000) / 1000000));

  model::PriceTable prices = {{"openai/gpt-4o-mini", price}};
  EXPECT_EQ(model::PriceOf(prices, "openai/gpt-4o-mini").output_microusd_per_mtok, 600000);
  EXPECT_EQ(model::PriceOf(prices, "local").input_microusd_per_mtok, 0);  // unpriced: free
}

TEST(MeteringTest, EstimatesAndConversions) {
  EXPECT_EQ(model::EstimateInputTokens(0), 0);
  EXPECT_EQ(model::EstimateInputTokens(1), 1);
  EXPECT_EQ(model::EstimateInputTokens(400), 100);
  EXPECT_EQ(model::EstimateInputTokens(401), 101);
  EXPECT_DOUBLE_EQ(model::MicrosToUsd(1500), 0.0015);
  int64_t micros = 0;
  ASSERT_TRUE(model::UsdToMicros(0.15, &micros));
  EXPECT_EQ(micros, 150000);
  ASSERT_TRUE(model::UsdToMicros(0, &micros));
  EXPECT_EQ(micros, 0);
  EXPECT_FALSE(model::UsdToMicros(-1, &micros));
  EXPECT_FALSE(model::UsdToMicros(1e12, &micros));
}

TEST(MeteringTest, PeriodsAreUtcDaysAndMonths) {
  const Millis at = 1774998000000 + 1234;  // 2026-03-31T23:00:01.234Z
  EXPECT_EQ(FormatRfc3339(model::PeriodStart("day", at)), "2026-03-31T00:00:00.000Z");
  EXPECT_EQ(FormatRfc3339(model::PeriodStart("month", at)), "2026-03-01T00:00:00.000Z");
  const Millis new_year = 1798761600000;  // 2027-01-01T00:00:00Z
  EXPECT_EQ(model::PeriodStart("day", new_year), new_year);
  EXPECT_EQ(model::PeriodStart("month", new_year), new_year);
  EXPECT_EQ(FormatRfc3339(model::PeriodStart("month", new_year - 1)), "2026-12-01T00:00:00.000Z");
  EXPECT_TRUE(model::IsPeriod("day"));
  EXPECT_FALSE(model::IsPeriod("week"));
}

model::ModelRequest Request() {
  model::ModelRequest r;
  r.model = "ignored";
  r.messages = {{"system", "be brief", {}, "", ""},
                {"user", "hello", {}, "", ""},
                {"assistant", "", {{"call_1", "time.now", Json::object()}}, "", ""},
                {"tool", "noon", {}, "call_1", "time.now"}};
  r.tools = {{"time.now", "the time", {{"type", "object"}}}};
  r.agent_config = {{"temperature", 0.2}, {"busy", "queue"}};
  return r;
}

TEST(MeteringTest, TheCacheKeyCoversWhatChangesAnAnswerAndNothingElse) {
  auto key = [](const std::string& model, const model::ModelRequest& r) {
    return runtime::CacheKeyOf(model, r).key;
  };
  const std::string base = key("openai/m", Request());
  EXPECT_EQ(base, key("openai/m", Request()));

  model::ModelRequest busy = Request();
  busy.agent_config["busy"] = "reject";
  busy.agent_config["local_latency_ms"] = 5;
  busy.model = "another provider name";
  EXPECT_EQ(base, key("openai/m", busy));

  std::vector<model::ModelRequest> changed(9, Request());
  changed[0].messages[1].content = "hello!";
  changed[1].messages[2].tool_calls[0].arguments = {{"tz", "UTC"}};
  changed[2].messages[3].content = "one o'clock";
  changed[3].tools[0].description = "the time now";
  changed[4].agent_config["temperature"] = 0.3;
  changed[5].agent_config["local_rules"] = Json::array();
  // Text moved from one field to the next, or from one message into two, is another request.
  changed[6].messages[0].content = "be";
  changed[6].messages[1].content = " briefhello";
  changed[7].messages[1].role = "user";
  changed[7].messages.insert(changed[7].messages.begin() + 2, {"user", "", {}, "", ""});
  changed[8].messages[3].tool_call_id = "";
  changed[8].messages[3].tool_name = "call_1time.now";
  std::set<std::string> keys = {base};
  for (const auto& r : changed) keys.insert(key("openai/m", r));
  EXPECT_EQ(keys.size(), changed.size() + 1) << "each change gives a key of its own";
  EXPECT_NE(base, key("openai/other", Request()));
  EXPECT_EQ(base.size(), 64u);
}

store::Message Stored(const std::string& id, const std::string& role, const std::string& content) {
  store::Message m;
  m.id = id;
  m.role = role;
  m.content = content;
  return m;
}

// A turn's request as context assembly builds it: the system prompt, the history, the prompt.
model::ModelRequest TurnRequest(const std::vector<store::Message>& history) {
  model::ModelRequest r;
  r.messages.push_back({"system", "be brief", {}, "", ""});
  for (const auto& m : history) {
    if (runtime::InConversation(m)) r.messages.push_back({m.role, m.content, {}, "", ""});
  }
  r.messages.push_back({"user", "and now?", {}, "", ""});
  return r;
}

TEST(MeteringTest, AKeptHistoryDigestGoesOnToTheDigestOfTheWholeHistory) {
  std::vector<store::Message> h;
  for (int i = 0; i < 40; ++i) {
    h.push_back(Stored("m" + std::to_string(100 + i), i % 2 ? "assistant" : "user",
                       "message " + std::to_string(i)));
  }
  h.insert(h.begin() + 7, Stored("m106z", "tool", "not sent"));  // another role: left out
  runtime::HistoryHash kept;
  std::span<const store::Message> all(h);
  // Turn by turn, each turn's history one longer, against a digest taken from nothing.
  for (size_t n = 1; n <= h.size(); ++n) {
    auto grown = runtime::HashHistory(all.first(n), 1, &kept);
    auto fresh = runtime::HashHistory(all.first(n), 1, nullptr);
    ASSERT_EQ(grown.digest, fresh.digest) << n;
    ASSERT_EQ(grown.count, fresh.count);
    ASSERT_EQ(grown.bytes, fresh.bytes);
    EXPECT_EQ(kept.count, n);
  }
  EXPECT_EQ(kept.sent, h.size() - 1);

  // A message that committed late with an earlier id, or a front cut by a compaction, or a
  // window that slid: the kept state does not cover the new history, which is hashed again.
  auto late = h;
  late.insert(late.begin() + 20, Stored("m118a", "user", "late"));
  auto after_late = runtime::HashHistory(late, 1, &kept);
  EXPECT_EQ(after_late.digest, runtime::HashHistory(late, 1, nullptr).digest);
  std::span<const store::Message> rest(late);
  auto cut = runtime::HashHistory(rest.subspan(10), 1, &kept);
  EXPECT_EQ(cut.digest, runtime::HashHistory(rest.subspan(10), 1, nullptr).digest);
  EXPECT_NE(cut.digest, after_late.digest);

  // The same text under other ids hashes alike: the digest is of what the model is sent.
  auto renamed = h;
  for (auto& m : renamed) m.id = "x" + m.id;
  EXPECT_EQ(runtime::HashHistory(renamed, 1, nullptr).digest,
            runtime::HashHistory(h, 1, nullptr).digest);
}

TEST(MeteringTest, AMarkedHistoryKeysLikeItsTextAndCountsItsBytes) {
  std::vector<store::Message> h = {Stored("a", "user", "hello"), Stored("b", "assistant", "hi"),
                                   Stored("c", "user", "what time is it?")};
  auto key = [](const std::vector<store::Message>& history, bool marked) {
    runtime::HistoryMark mark;
    if (marked) mark = runtime::HashHistory(history, 1, nullptr);
    return runtime::CacheKeyOf("openai/m", TurnRequest(history), mark);
  };
  const auto base = key(h, true);
  EXPECT_EQ(base.key, key(h, true).key);
  // The mark stands for the same text: the bytes a budget estimates from are the same.
  EXPECT_EQ(base.bytes, key(h, false).bytes);
  std::set<std::string> keys = {base.key};
  auto changed = h;
  changed[1].content = "hi!";
  keys.insert(key(changed, true).key);
  changed = h;
  changed[2].role = "assistant";
  keys.insert(key(changed, true).key);
  changed = h;
  changed.pop_back();
  keys.insert(key(changed, true).key);
  changed = h;
  changed[0].content = "hellohi";  // text moved from one message into the next
  changed[1].content = "";
  keys.insert(key(changed, true).key);
  EXPECT_EQ(keys.size(), 5u) << "each change of the history gives a key of its own";

  // A mark that no longer fits the request (messages dropped after it was taken) is not used.
  auto mark = runtime::HashHistory(h, 1, nullptr);
  model::ModelRequest shorter = TurnRequest({});
  EXPECT_EQ(runtime::CacheKeyOf("openai/m", shorter, mark).key,
            runtime::CacheKeyOf("openai/m", shorter).key);
}

class RouterConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("keel-config-" + NewId());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Result<config::Config> Load(const std::string& toml) {
    std::string path = (dir_ / "keel.toml").string();
    std::ofstream(path) << toml;
    config::Overrides o;
    o.home = dir_.string();
    o.config_file = path;
    return config::Load(o);
  }

  std::filesystem::path dir_;
};

TEST_F(RouterConfigTest, ReadsPricesAnthropicAndCache) {
  auto c = Load(R"(
[prices."openai/gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[prices.local]
input_per_mtok = 1
[anthropic]
base_url = "http://127.0.0.1:9"
timeout_ms = 5000
max_retries = 1
max_tokens = 1024
[cache]
enabled = false
ttl_ms = 60000
max_entries = 10
)");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->prices.at("openai/gpt-4o-mini").input_microusd_per_mtok, 150000);
  EXPECT_EQ(c->prices.at("openai/gpt-4o-mini").output_microusd_per_mtok, 600000);
  EXPECT_EQ(c->prices.at("local").input_microusd_per_mtok, 1000000);
  EXPECT_EQ(c->prices.at("local").output_microusd_per_mtok, 0);
  EXPECT_EQ(c->anthropic.base_url, "http://127.0.0.1:9");
  EXPECT_EQ(c->anthropic.max_retries, 1);
  EXPECT_EQ(c->anthropic.max_tokens, 1024);
  EXPECT_FALSE(c->cache.enabled);
  EXPECT_EQ(c->cache.ttl_ms, 60000);
  EXPECT_EQ(c->cache.max_entries, 10);
}

TEST_F(RouterConfigTest, RefusesBadRouterSettingsNamingThem) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[prices.\"x/y\"]\ninput_per_mtok = -1\n", "prices.\"x/y\".input_per_mtok"},
      {"[prices.\"x/y\"]\ninput_per_mtok = \"cheap\"\n", "input_per_mtok"},
      {"[prices.\"x/y\"]\nper_call = 1\n", "prices.\"x/y\".per_call"},
      {"[prices]\n\"x/y\" = 3\n", "prices.\"x/y\""},
      {"[anthropic]\nmax_tokens = 0\n", "anthropic.max_tokens"},
      {"[anthropic]\nkey = \"k\"\n", "anthropic.key"},
      {"[cache]\nenabled = \"yes\"\n", "cache.enabled"},
      {"[cache]\nttl_ms = 5\n", "cache.ttl_ms"},
  };
  for (const auto& [toml, names] : bad) {
    auto c = Load(toml);
    ASSERT_FALSE(c.ok()) << toml;
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find(names), std::string::npos)
        << toml << " -> " << c.status().message();
  }
}

}  // namespace
}  // namespace keel

// PlanLeases (channels/leases.h): which channels a node renews, takes and gives up.

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "keel/channels/leases.h"

namespace keel::channels {
namespace {

constexpr Millis kNow = 1'000'000;

std::vector<store::Channel> Channels(int n) {
  std::vector<store::Channel> out;
  for (int i = 0; i < n; ++i) {
    store::Channel c;
    c.id = "ch" + std::to_string(i);
    c.tenant_id = "t";
    c.updated_at = kNow - 1000;  // created a moment ago
    out.push_back(c);
  }
  return out;
}

store::ChannelLease Held(const std::string& id, const std::string& holder, Millis until) {
  return {"t", id, holder, until};
}

// The plan as channel -> until.
std::map<std::string, Millis> Plan(const std::vector<store::Channel>& polled,
                                   const std::vector<store::ChannelLease>& leases, size_t nodes,
                                   const std::set<std::string>& believed = {}) {
  std::map<std::string, Millis> out;
  for (const auto& a : PlanLeases(polled, leases, nodes, "me", kNow,
                                  [&](const std::string& id) { return believed.count(id) > 0; })) {
    EXPECT_TRUE(out.emplace(a.channel_id, a.until).second) << "asked twice: " << a.channel_id;
  }
  return out;
}

TEST(ChannelLeasesTest, ANodeTakesItsShareOfTheFreeChannels) {
  const auto polled = Channels(5);
  auto plan = Plan(polled, {}, 2);  // a share of 3
  EXPECT_EQ(plan.size(), 3u);
  for (const auto& [id, until] : plan) EXPECT_EQ(until, kNow + kChannelLeaseMs) << id;
  EXPECT_EQ(Plan(polled, {}, 1).size(), 5u);  // one node: all of them
  EXPECT_EQ(Plan(polled, {}, 0).size(), 5u);  // none seen (a store of one node): all
  EXPECT_EQ(Plan({}, {}, 3).size(), 0u);
}

TEST(ChannelLeasesTest, AnotherNodesLiveLeaseIsLeftAndAnExpiredOneTaken) {
  const auto polled = Channels(2);
  auto plan = Plan(polled, {Held("ch0", "other", kNow), Held("ch1", "other", kNow - 1)}, 1);
  EXPECT_EQ(plan.count("ch0"), 0u) << "taken from a node whose lease still runs";
  EXPECT_EQ(plan.at("ch1"), kNow + kChannelLeaseMs);
}

TEST(ChannelLeasesTest, WhatItHoldsIsRenewedOnlyWhenDueOrNotBelieved) {
  const auto polled = Channels(3);
  std::vector<store::ChannelLease> leases = {
      Held("ch0", "me", kNow + kChannelRenewMs + 1),  // plenty left
      Held("ch1", "me", kNow + kChannelRenewMs - 1),  // due
      Held("ch2", "me", kNow + kChannelLeaseMs)};     // fresh, but not believed (a restart)
  auto plan = Plan(polled, leases, 1, {"ch0", "ch1"});
  EXPECT_EQ(plan.count("ch0"), 0u);
  EXPECT_EQ(plan.at("ch1"), kNow + kChannelLeaseMs);
  EXPECT_EQ(plan.at("ch2"), kNow + kChannelLeaseMs);
}

TEST(ChannelLeasesTest, OneBeyondTheShareIsGivenUpPerLookAndTheRestKept) {
  const auto polled = Channels(4);
  std::vector<store::ChannelLease> leases;
  for (const auto& c : polled) leases.push_back(Held(c.id, "me", kNow + 1));  // all due
  std::set<std::string> believed = {"ch0", "ch1", "ch2", "ch3"};
  auto plan = Plan(polled, leases, 4, believed);  // a share of 1
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan.at("ch0"), kNow + kChannelLeaseMs);
  EXPECT_EQ(plan.at("ch1"), kNow) << "the one just beyond the share is given up";
  EXPECT_EQ(plan.at("ch2"), kNow + kChannelLeaseMs) << "the others are renewed until their turn";
  EXPECT_EQ(plan.at("ch3"), kNow + kChannelLeaseMs);
}

TEST(ChannelLeasesTest, ItsOwnEndedLeaseIsFreeNotHeld) {
  // Given up at its last look (held_until = then): not renewed as its own, taken again only
  // within its share.
  const auto polled = Channels(2);
  auto plan = Plan(polled, {Held("ch0", "me", kNow - 2000), Held("ch1", "other", kNow + 5000)}, 2);
  EXPECT_EQ(plan.at("ch0"), kNow + kChannelLeaseMs);  // a share of 1, and it holds none
  plan = Plan(polled, {Held("ch0", "me", kNow - 2000), Held("ch1", "me", kNow + 5000)}, 2, {"ch1"});
  EXPECT_EQ(plan.count("ch0"), 0u) << "taken back beyond its share";
}

TEST(ChannelLeasesTest, AChannelNobodyTookForALeaseIsTakenWhateverTheShare) {
  auto polled = Channels(3);
  polled[2].updated_at = kNow - kChannelLeaseMs - 1;  // enabled long ago, never leased
  std::vector<store::ChannelLease> leases = {
      Held("ch0", "me", kNow + kChannelLeaseMs),
      Held("ch1", "other", kNow - kChannelLeaseMs - 1)};  // its holder stopped long ago
  auto plan = Plan(polled, leases, 3, {"ch0"});           // a share of 1, which ch0 fills
  EXPECT_EQ(plan.count("ch0"), 0u);
  EXPECT_EQ(plan.at("ch1"), kNow + kChannelLeaseMs);
  EXPECT_EQ(plan.at("ch2"), kNow + kChannelLeaseMs);
  // Free only a moment: left to the node whose share it is.
  leases[1].held_until = kNow - 1;
  polled[2].updated_at = kNow - 1;
  EXPECT_TRUE(Plan(polled, leases, 3, {"ch0"}).empty());
}

// Telegram channels polling the Bot API server `api_base`.
std::vector<store::Channel> Bots(int n, const std::string& api_base = "http://127.0.0.1:9") {
  auto out = Channels(n);
  for (auto& c : out) {
    c.kind = "telegram";
    c.settings = R"({"bot_token":"tg","api_base":")" + api_base + R"("})";
  }
  return out;
}

store::ChannelLease Polled(const std::string& id, const std::string& holder, Millis until,
                           const std::string& bot) {
  return {"t", id, holder, until, bot};
}

TEST(ChannelLeasesTest, ABotBehindTwoChannelsIsPolledByOneNode) {
  // ch0 and ch1 hold bot 42's token; the node holding ch0 (its first channel) keeps the bot.
  const auto polled = Bots(3);
  std::vector<store::ChannelLease> leases = {Polled("ch0", "other", kNow + kChannelLeaseMs, "42"),
                                             Polled("ch1", "me", kNow + kChannelLeaseMs, "42"),
                                             Polled("ch2", "me", kNow + kChannelLeaseMs, "43")};
  auto plan = Plan(polled, leases, 2, {"ch1", "ch2"});
  EXPECT_EQ(plan.at("ch1"), kNow) << "held by a node that does not poll its bot: given up";
  EXPECT_EQ(plan.count("ch2"), 0u) << "another bot's channel is kept";
  // Given up, or never leased with a known bot: not taken, whatever the share or how long
  // it was free.
  leases[1] = Polled("ch1", "me", kNow - kChannelLeaseMs - 1, "42");
  plan = Plan(polled, leases, 2, {"ch2"});
  EXPECT_EQ(plan.count("ch1"), 0u) << "a channel of a bot another node polls was taken";
  // The bot's node takes it (and polls only one of the two).
  leases[0].holder = "me";
  leases[2].holder = "other";
  plan = Plan(polled, leases, 2, {"ch0"});
  EXPECT_EQ(plan.at("ch1"), kNow + kChannelLeaseMs);
  // Once the lease of its first channel ran out, the bot is nobody's: its channels are free.
  leases[0] = Polled("ch0", "other", kNow - 1, "42");
  plan = Plan(polled, leases, 1);
  EXPECT_EQ(plan.at("ch0"), kNow + kChannelLeaseMs);
  EXPECT_EQ(plan.at("ch1"), kNow + kChannelLeaseMs);
}

TEST(ChannelLeasesTest, ABotsChannelsCountAsOneAndAreNotGivenUpForTheShare) {
  // This node holds bot 42's two channels and two more; with two nodes its share is 2. Were a
  // bot's channels given up for the share, they would go back and forth between the nodes.
  const auto polled = Bots(4);
  std::vector<store::ChannelLease> leases = {
      Polled("ch0", "me", kNow + 1, "42"), Polled("ch1", "me", kNow + 1, "42"),
      Polled("ch2", "me", kNow + 1, "43"), Polled("ch3", "me", kNow + 1, "44")};
  auto plan = Plan(polled, leases, 2, {"ch0", "ch1", "ch2", "ch3"});
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan.at("ch0"), kNow + kChannelLeaseMs);
  EXPECT_EQ(plan.at("ch1"), kNow + kChannelLeaseMs);
  EXPECT_EQ(plan.at("ch2"), kNow + kChannelLeaseMs);
  EXPECT_EQ(plan.at("ch3"), kNow) << "the channel beyond the share (the bot's two count once)";
  // Whatever their place among the channels: a bot's channels before the last ordinary one
  // still leave that one given up (ids: o1-o4, then the bot's x1 and x2, then o5).
  std::vector<store::Channel> mixed = Bots(7);
  const char* ids[] = {"o1", "o2", "o3", "o4", "x1", "x2", "o5"};
  std::vector<store::ChannelLease> all;
  std::set<std::string> every;
  for (int i = 0; i < 7; ++i) {
    mixed[i].id = ids[i];
    all.push_back(Polled(ids[i], "me", kNow + kChannelLeaseMs, ids[i][0] == 'x' ? "42" : ""));
    every.insert(ids[i]);
  }
  plan = Plan(mixed, all, 2, every);  // a share of 4: o1-o4 and the bot make 5
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan.at("o5"), kNow) << "a node kept more than its share for good";
  // The bot's other channel, free, is taken at once whatever the share.
  leases[1] = Polled("ch1", "other", kNow - 1, "42");
  leases[3] = Polled("ch3", "other", kNow + kChannelLeaseMs, "44");
  plan = Plan(polled, leases, 2, {"ch0", "ch2"});
  EXPECT_EQ(plan.at("ch1"), kNow + kChannelLeaseMs);
}

TEST(ChannelLeasesTest, BotsAreOneOnlyOnTheSameServer) {
  // Bot ids are per Bot API server: the same id on another server is another bot.
  auto polled = Bots(1, "http://127.0.0.1:9");
  auto more = Bots(2, "http://127.0.0.1:10");
  polled.push_back(more[1]);  // ch1
  std::vector<store::ChannelLease> leases = {Polled("ch0", "other", kNow + kChannelLeaseMs, "42"),
                                             Polled("ch1", "me", kNow + kChannelLeaseMs, "42")};
  auto plan = Plan(polled, leases, 2, {"ch1"});
  EXPECT_EQ(plan.count("ch1"), 0u) << "kept: its bot is another server's";
  // A webhook channel's lease and a channel before its first poll have no bot.
  leases[1].bot = "";
  leases[1].held_until = kNow - 1;
  polled[1].settings = R"({"bot_token":"tg","api_base":"http://127.0.0.1:9"})";
  EXPECT_EQ(Plan(polled, leases, 2).at("ch1"), kNow + kChannelLeaseMs);
}

}  // namespace
}  // namespace keel::channels

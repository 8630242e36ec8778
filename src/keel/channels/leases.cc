// PlanLeases (leases.h).

#include "keel/channels/leases.h"

#include <algorithm>
#include <map>
#include <set>

#include "keel/channels/telegram.h"
#include "keel/common/json_util.h"

namespace keel::channels {

namespace {

// The Telegram bot channel `c` polled last, with its Bot API server (bot ids are per server);
// "" when not known.
std::string BotKey(const store::Channel& c, const store::ChannelLease* l) {
  if (c.kind != "telegram" || l == nullptr || l->bot.empty()) return "";
  auto json = ParseJson(c.settings);
  if (!json.ok()) return "";
  auto settings = ParseTelegramSettings(*json);
  return settings.ok() ? settings->api_base + " " + l->bot : "";
}

}  // namespace

std::vector<LeaseAsk> PlanLeases(const std::vector<store::Channel>& polled,
                                 const std::vector<store::ChannelLease>& leases, size_t nodes,
                                 const std::string& me, Millis now,
                                 const std::function<bool(const std::string&)>& believed) {
  std::map<std::string, const store::ChannelLease*> lease_of;
  for (const auto& l : leases) lease_of[l.channel_id] = &l;
  auto lease = [&](const store::Channel& c) -> const store::ChannelLease* {
    auto it = lease_of.find(c.id);
    return it == lease_of.end() ? nullptr : it->second;
  };
  // A bot behind two channels or more is one node's: the holder of the live lease of its
  // first channel (by id) takes and keeps all of them (and polls through one, relay.h); the
  // other nodes leave them. They count as one channel of that node's share, and none of them
  // is given up for the share (a bot's channels would move between nodes each look).
  std::vector<std::string> bot_of;  // BotKey of each polled channel, in order
  std::map<std::string, int> channels_of_bot;
  for (const auto& c : polled) {
    bot_of.push_back(BotKey(c, lease(c)));
    if (!bot_of.back().empty()) ++channels_of_bot[bot_of.back()];
  }
  std::map<std::string, std::string> bot_node;  // of the bots behind two channels or more
  for (size_t i = 0; i < polled.size(); ++i) {
    const store::ChannelLease* l = lease(polled[i]);
    if (!bot_of[i].empty() && channels_of_bot[bot_of[i]] > 1 && l->held_until >= now) {
      bot_node.emplace(bot_of[i], l->holder);
    }
  }
  std::vector<LeaseAsk> asks;
  std::vector<const store::Channel*> free, overdue;
  std::set<std::string> bots_counted;
  size_t mine = 0;
  bool gave_one_up = false;  // for the share, one a look
  const size_t share =
      (polled.size() + std::max<size_t>(nodes, 1) - 1) / std::max<size_t>(nodes, 1);
  for (size_t i = 0; i < polled.size(); ++i) {
    const store::Channel& c = polled[i];
    const store::ChannelLease* l = lease(c);
    const bool live = l && l->held_until >= now;
    const bool held = live && l->holder == me;
    if (auto it = bot_node.find(bot_of[i]); it != bot_node.end()) {
      if (it->second != me) {
        if (held) asks.push_back({c.tenant_id, c.id, now});  // given up
      } else {
        if (bots_counted.insert(it->first).second) ++mine;
        const bool due = held && (!believed(c.id) || l->held_until - now < kChannelRenewMs);
        if (!live || due) asks.push_back({c.tenant_id, c.id, now + kChannelLeaseMs});
      }
      continue;
    }
    if (held) {
      if (++mine > share && !gave_one_up) {
        asks.push_back({c.tenant_id, c.id, now});
        gave_one_up = true;
      } else if (!believed(c.id) || l->held_until - now < kChannelRenewMs) {
        asks.push_back({c.tenant_id, c.id, now + kChannelLeaseMs});
      }
    } else if (!live) {
      const Millis free_since = l ? l->held_until : c.updated_at;
      (free_since < now - kChannelLeaseMs ? overdue : free).push_back(&c);
    }
  }
  for (const auto* c : free) {
    if (mine >= share) break;
    asks.push_back({c->tenant_id, c->id, now + kChannelLeaseMs});
    ++mine;
  }
  for (const auto* c : overdue) asks.push_back({c->tenant_id, c->id, now + kChannelLeaseMs});
  return asks;
}

}  // namespace keel::channels

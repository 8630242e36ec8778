// PlanLeases (leases.h).

#include "keel/channels/leases.h"

#include <algorithm>
#include <map>

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
  // Each bot's node: the holder of the live lease of its first channel (by id). A bot behind
  // two channels is polled by that node only (it polls one of them, channels/relay.h).
  std::map<std::string, std::string> bot_node;
  for (const auto& c : polled) {
    const store::ChannelLease* l = lease(c);
    const std::string bot = BotKey(c, l);
    if (!bot.empty() && l->held_until >= now) bot_node.emplace(bot, l->holder);
  }
  auto bot_elsewhere = [&](const store::Channel& c, const store::ChannelLease* l) {
    auto it = bot_node.find(BotKey(c, l));
    return it != bot_node.end() && it->second != me;
  };
  std::vector<LeaseAsk> asks;
  std::vector<const store::Channel*> free, overdue;
  size_t mine = 0;
  const size_t share =
      (polled.size() + std::max<size_t>(nodes, 1) - 1) / std::max<size_t>(nodes, 1);
  for (const auto& c : polled) {
    const store::ChannelLease* l = lease(c);
    const bool live = l && l->held_until >= now;
    if (bot_elsewhere(c, l)) {
      if (live && l->holder == me) asks.push_back({c.tenant_id, c.id, now});  // given up
      continue;
    }
    if (live && l->holder == me) {
      if (++mine == share + 1) {
        asks.push_back({c.tenant_id, c.id, now});
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

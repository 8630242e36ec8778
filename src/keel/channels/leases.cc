// PlanLeases (leases.h).

#include "keel/channels/leases.h"

#include <algorithm>
#include <map>

namespace keel::channels {

std::vector<LeaseAsk> PlanLeases(const std::vector<store::Channel>& polled,
                                 const std::vector<store::ChannelLease>& leases, size_t nodes,
                                 const std::string& me, Millis now,
                                 const std::function<bool(const std::string&)>& believed) {
  std::map<std::string, const store::ChannelLease*> lease_of;
  for (const auto& l : leases) lease_of[l.channel_id] = &l;
  std::vector<LeaseAsk> asks;
  std::vector<const store::Channel*> free, overdue;
  size_t mine = 0;
  const size_t share =
      (polled.size() + std::max<size_t>(nodes, 1) - 1) / std::max<size_t>(nodes, 1);
  for (const auto& c : polled) {
    auto it = lease_of.find(c.id);
    const store::ChannelLease* l = it == lease_of.end() ? nullptr : it->second;
    const bool live = l && l->held_until >= now;
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

#pragma once
// Which node polls a channel (docs/CHANNELS.md, decisions/0020): each polled channel (a
// Telegram bot's getUpdates, a Discord command's registration) has a lease in its poll state's
// row that one node holds at a time. Every two seconds each node plans its leases from what
// the store shows (PlanLeases) and writes the plan (ChannelStore::LeaseChannel, one unit):
//
//   renew    what it holds, once less than kChannelRenewMs is left (or when it does not
//            believe it holds it any more: restarted with the same origin)
//   take     free channels (no lease, or one that ran out) up to its share, the channels
//            divided by the nodes seen lately (rounded up)
//   give up  the one channel just beyond its share, per look, so that a node that joins gets
//            its part (its lease ends now, and another node takes it at its next look)
//   overdue  a channel free for a whole lease, whatever its share: a node counted among the
//            nodes that takes none (its writes fail, an older version) leaves it to the others
//   one bot  a Telegram bot behind two channels is one node's: the node that holds the live
//            lease of its first channel (by id) takes and keeps its others whatever its share
//            (they count as one channel of it, and none is given up for the share), the other
//            nodes leave them and give up those they hold (a channel's bot is known from its
//            first poll, ChannelLease::bot)
//
// Pure: the caller reads and writes.

#include <functional>
#include <string>
#include <vector>

#include "keel/common/time.h"
#include "keel/store/channel_store.h"

namespace keel::channels {

// A lease is written for kChannelLeaseMs by the writer's clock, renewed once less than
// kChannelRenewMs is left, and believed by its holder for kChannelBelievedMs after the write
// that took it began (by its steady clock).
inline constexpr Millis kChannelLeaseMs = 15000;
inline constexpr Millis kChannelRenewMs = 10000;
inline constexpr Millis kChannelBelievedMs = 12000;

struct LeaseAsk {
  std::string tenant_id;
  std::string channel_id;
  Millis until = 0;  // at or before the plan's `now`: given up
};

// Node `me`'s asks at `now`: `polled` the enabled channels, `leases` their rows, `nodes` the
// nodes seen lately (at least 1), `believed(id)` whether `me` believes it holds the channel.
std::vector<LeaseAsk> PlanLeases(const std::vector<store::Channel>& polled,
                                 const std::vector<store::ChannelLease>& leases, size_t nodes,
                                 const std::string& me, Millis now,
                                 const std::function<bool(const std::string&)>& believed);

}  // namespace keel::channels

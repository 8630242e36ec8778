#pragma once
// Channels (docs/CHANNELS.md): where an agent is reached from outside the API. A channel
// belongs to an agent; its kind says how messages arrive (today "webhook": signed HTTP
// deliveries to POST /v1/hooks/{id}), its settings how they become messages, and each of its
// conversations (a value the settings pick out of a delivery) is one session of the agent,
// recorded once: (channel_id, conversation) is unique.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {

struct Channel {
  std::string id;
  std::string tenant_id;
  std::string agent_id;
  std::string kind = "webhook";
  std::string name;      // unique among the agent's channels
  std::string settings;  // the kind's settings, a JSON object's text (channels/channels.h)
  bool enabled = true;
  std::string created_by;  // token id of whoever created it
  Millis created_at = 0;
  Millis updated_at = 0;
};

// One conversation of a channel and the session it talks in.
struct ChannelConversation {
  std::string tenant_id;
  std::string channel_id;
  std::string conversation;  // "" for a channel that puts everything in one session
  std::string session_id;
  Millis created_at = 0;
  // A direct conversation's person: the platform's id of who talks to the bot there ("" for a
  // group, or a conversation older than approval cards). Where an approver's card goes.
  std::string contact;
};

// One delivery a channel took (a webhook's webhook-id) and the session it went to: a delivery
// again, whatever its body says, goes to that session, where its message's idempotency key
// makes it a replay.
struct ChannelDelivery {
  std::string tenant_id;
  std::string channel_id;
  std::string delivery_id;
  std::string session_id;
  Millis created_at = 0;
};

// A polled channel's place in its platform's update stream (a Telegram bot's last handled
// update_id), durable so that a restart neither skips nor repeats an update, and why its last
// poll failed ("" when it did not). Runtime state: not exported, not in the log (a copy that
// lost it fetches again what channel_deliveries then deduplicates).
struct ChannelPoll {
  std::string tenant_id;
  std::string channel_id;
  std::string cursor;  // "" before the first update
  std::string error;
  Millis updated_at = 0;
};

// Which node polls a channel (or registers its command), until when by that node's clock
// (the row of channel_polls; decisions/0020).
struct ChannelLease {
  std::string tenant_id;
  std::string channel_id;
  std::string holder;  // the node's origin
  Millis held_until = 0;
  // The Telegram bot its polls last asked for updates (the bot's id, from the poll's cursor,
  // recorded at the first poll, or when the bot was found polled through another channel);
  // "" before that, and for other kinds.
  std::string bot;
};

// One answer owed to a channel's conversation: the outbox (docs/CHANNELS.md, decisions/0020).
// Recorded when its delivery's message is posted ("waiting" for the run), filled from the run
// once it ends, sent by the leader. Runtime state like plugin deliveries: not exported (an
// imported copy would send again what its platform has).
//
// An approval card is one too (approval_id set, channels/cards.h): recorded "pending" when the
// leader finds a channel run's approval waiting, "shown" once the platform has it (its
// `message` says where), and edited to say how it was decided ("sent") once it is.
struct ChannelReply {
  std::string id;
  std::string tenant_id;
  std::string channel_id;
  std::string agent_id;
  std::string session_id;
  std::string run_id;
  std::string delivery_id;  // the delivery it answers (a Telegram update_id); for a card
                            // "approval:APPROVAL_ID[:USER_ID]"
  std::string target;       // where it goes, the kind's JSON object's text (chat, thread)
  std::string approval_id;  // a card's approval ("" for an answer)
  std::string user_id;      // a card's approver; an answer's asker ("" when not a user)
  std::string message;      // a shown card on its platform, a JSON object's text ("" before)
  // waiting (its run has not ended) | pending (due at next_attempt_at) | sending (a request may
  // be on its way; at a restart it is unknown) | sent | skipped (nothing to say, or <NO_REPLY>)
  // | unknown (a send cut between its request and its answer: never repeated) | dead; a card
  // also: shown (its approval waits)
  std::string status = "waiting";
  std::string text;    // the answer, once its run ended
  int parts_sent = 0;  // of a long answer's parts, those the platform took
  int attempts = 0;
  Millis next_attempt_at = 0;  // pending: due then; sending: the claim's end
  std::string origin;          // the node sending it (sending)
  std::string error;
  Millis created_at = 0;
  Millis updated_at = 0;

  bool Ended() const {
    return status == "sent" || status == "skipped" || status == "unknown" || status == "dead";
  }
};

class ChannelStore {
 public:
  virtual ~ChannelStore() = default;
  // kConflict when the id exists or the agent has a channel of that name.
  virtual Status InsertChannel(const Channel& c) = 0;
  // By tenant and id: writes name, settings, enabled and updated_at. kNotFound "channel not
  // found: ID"; kConflict when the agent has another channel of that name.
  virtual Status UpdateChannel(const Channel& c) = 0;
  // kNotFound "channel not found: ID".
  virtual Result<Channel> GetChannel(const std::string& tenant_id, const std::string& id) = 0;
  // The agent's channels by id; `agent_id` empty for every agent's.
  virtual Result<Paged<Channel>> ListChannels(const std::string& tenant_id,
                                              const std::string& agent_id, const Page& page) = 0;
  // Deletes the channel, its conversations and its deliveries (their sessions stay). kNotFound
  // "channel not found: ID".
  virtual Status DeleteChannel(const std::string& tenant_id, const std::string& id) = 0;
  // Runtime-wide: the tenant of channel `id` (an unauthenticated delivery names only the
  // channel). kNotFound "channel not found: ID".
  virtual Result<std::string> ChannelTenant(const std::string& id) = 0;
  // The conversation (its session, its contact); nullopt when the channel has no such
  // conversation yet.
  virtual Result<std::optional<ChannelConversation>> GetConversation(
      const std::string& tenant_id, const std::string& channel_id,
      const std::string& conversation) = 0;
  // kConflict when the channel has that conversation already (another delivery opened it).
  virtual Status InsertConversation(const ChannelConversation& c) = 0;
  // Records the person of a direct conversation that has none yet (one opened before contacts
  // were recorded); false when it had one, or there is no such conversation.
  virtual Result<bool> SetConversationContact(const std::string& tenant_id,
                                              const std::string& channel_id,
                                              const std::string& conversation,
                                              const std::string& contact) = 0;
  // The session a delivery went to; nullopt when the channel has not taken it.
  virtual Result<std::optional<std::string>> DeliverySession(const std::string& tenant_id,
                                                             const std::string& channel_id,
                                                             const std::string& delivery_id) = 0;
  // kConflict when the channel has taken that delivery already.
  virtual Status InsertDelivery(const ChannelDelivery& d) = 0;

  // ---- Polled channels and the outbox (channels/relay.h)
  // Runtime-wide: every enabled channel the leader tends, by id: telegram (polled, or its
  // webhook registered) and discord (its command registered).
  virtual Result<std::vector<Channel>> PolledChannels() = 0;
  // nullopt before the channel's first poll.
  virtual Result<std::optional<ChannelPoll>> GetPoll(const std::string& tenant_id,
                                                     const std::string& channel_id) = 0;
  virtual Status PutPoll(const ChannelPoll& p) = 0;  // inserted or replaced
  // Runtime-wide: the leases held or once held, by channel id.
  virtual Result<std::vector<ChannelLease>> ChannelLeases() = 0;
  // Takes or renews node `origin`'s lease on the channel until `until`: true when `origin`
  // holds it now (it held it, nobody did, or the holder's ran out before `now`), false while
  // another node's runs, or when the channel is gone. An `until` at or before `now` gives it up.
  virtual Result<bool> LeaseChannel(const std::string& tenant_id, const std::string& channel_id,
                                    const std::string& origin, Millis now, Millis until) = 0;
  // kConflict when the channel has a reply to that delivery already.
  virtual Status InsertReply(const ChannelReply& r) = 0;
  // By tenant and id: everything but the ids, the target and created_at. kNotFound.
  virtual Status UpdateReply(const ChannelReply& r) = 0;
  // The channel's replies by id (`page.newest_first`: descending); with `status` only those.
  virtual Result<Paged<ChannelReply>> ListReplies(const std::string& tenant_id,
                                                  const std::string& channel_id,
                                                  const std::string& status, const Page& page) = 0;
  // Runtime-wide, oldest first: replies waiting whose run ended, pending ones due at `now`,
  // sending ones whose claim ran out or that `origin` (this node, restarted) was sending, and
  // shown cards whose approval was decided.
  virtual Result<std::vector<ChannelReply>> DueReplies(Millis now, const std::string& origin,
                                                       int limit) = 0;

  // ---- Approval cards (channels/cards.h)
  // The direct conversation of the channel whose contact is `contact`; nullopt when none.
  virtual Result<std::optional<std::string>> ContactConversation(const std::string& tenant_id,
                                                                 const std::string& channel_id,
                                                                 const std::string& contact) = 0;
  // Runtime-wide, oldest first: (tenant, approval id) of pending approvals whose run a channel
  // owes an answer (a reply waiting) and that have no card yet.
  virtual Result<std::vector<std::pair<std::string, std::string>>> ApprovalsToCard(int limit) = 0;
  // The cards of an approval, by id.
  virtual Result<std::vector<ChannelReply>> ApprovalCards(const std::string& tenant_id,
                                                          const std::string& approval_id) = 0;
  // The model tokens (input and output) of the runs that answered `user_id`'s messages to the
  // agent on chat platforms (their replies recorded since `since`).
  virtual Result<int64_t> UserTokensSince(const std::string& tenant_id, const std::string& agent_id,
                                          const std::string& user_id, Millis since) = 0;
  // The answer a channel owes for the run (not a card); nullopt when none.
  virtual Result<std::optional<ChannelReply>> RunReply(const std::string& tenant_id,
                                                       const std::string& run_id) = 0;
};

}  // namespace keel::store

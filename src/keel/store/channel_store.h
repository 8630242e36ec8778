#pragma once
// Channels (docs/CHANNELS.md): where an agent is reached from outside the API. A channel
// belongs to an agent; its kind says how messages arrive (today "webhook": signed HTTP
// deliveries to POST /v1/hooks/{id}), its settings how they become messages, and each of its
// conversations (a value the settings pick out of a delivery) is one session of the agent,
// recorded once: (channel_id, conversation) is unique.

#include <optional>
#include <string>

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
  // The conversation's session; nullopt when the channel has no such conversation yet.
  virtual Result<std::optional<std::string>> ConversationSession(
      const std::string& tenant_id, const std::string& channel_id,
      const std::string& conversation) = 0;
  // kConflict when the channel has that conversation already (another delivery opened it).
  virtual Status InsertConversation(const ChannelConversation& c) = 0;
  // The session a delivery went to; nullopt when the channel has not taken it.
  virtual Result<std::optional<std::string>> DeliverySession(const std::string& tenant_id,
                                                             const std::string& channel_id,
                                                             const std::string& delivery_id) = 0;
  // kConflict when the channel has taken that delivery already.
  virtual Status InsertDelivery(const ChannelDelivery& d) = 0;
};

}  // namespace keel::store

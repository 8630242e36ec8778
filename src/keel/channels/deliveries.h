#pragma once
// Where a channel's delivery goes (decisions/0019): shared by the webhook route and the relay's
// pollers.

#include <boost/asio/awaitable.hpp>
#include <string>

#include "keel/access/users.h"
#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::store {
class Store;
struct Channel;
}  // namespace keel::store
namespace keel::secrets {
class Vault;
}

namespace keel::channels {

// The session a delivery goes to, recorded with it (channel_deliveries) in one unit with
// channel.delivered@v1: the one it went to before (a retry, whatever its body says now), else
// its conversation's, opened when new (in the channel creator's name). kNotFound when the
// channel was deleted or disabled meanwhile; kPermissionDenied once its creator's token is
// revoked. `contact`: the person of a direct conversation (recorded when it is opened; "" for a
// group).
boost::asio::awaitable<Result<std::string>> RecordDelivery(store::Store& store,
                                                           const store::Channel& channel,
                                                           const std::string& delivery_id,
                                                           const std::string& conversation,
                                                           const std::string& contact = "");

// A message a chat platform brought, as the routing rules made it.
struct ChatMessage {
  std::string delivery_id;   // the platform's id of it (update_id, event_id)
  std::string conversation;  // the session it goes to, by the routing rules
  std::string content;       // what the agent gets
  std::string text;          // what the sender wrote (an access code is looked for in it)
  access::Sender sender;
  bool direct = true;     // a direct conversation with the bot
  bool addressed = true;  // it calls the bot (always, in a direct conversation)
  Json target;            // where its answer goes
  // It calls the bot only by being written in a thread the agent talks in: refused, it is
  // passed over in silence rather than answered with a notice.
  bool quiet = false;
};

// Who sent `m` and whether the agent takes it (access::AdmitSender, with the channel's role as
// its settings say in the unit), decided once per delivery:
// a delivery recorded before is taken again as it was (a replay) or passed over (it was
// refused). A decision that writes (a new guest, an access code accepted) is made in a unit
// of its own; a refusal's notice is recorded in that unit as the delivery's reply (the outbox
// sends it) with the delivery, so that the delivery again is passed over. `recent`: the
// sender's messages to the agent this minute, this one included (access::AdmitSender).
boost::asio::awaitable<Result<access::Admission>> AdmitDelivery(store::Store& store,
                                                                const secrets::Vault& vault,
                                                                const store::Channel& channel,
                                                                const ChatMessage& m, int recent);

}  // namespace keel::channels

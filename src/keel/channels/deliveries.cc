#include "keel/channels/deliveries.h"

#include "keel/access/access.h"
#include "keel/common/ids.h"
#include "keel/common/json_util.h"
#include "keel/common/time.h"
#include "keel/runs/open_session.h"
#include "keel/store/async.h"
#include "keel/store/channel_store.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"

namespace keel::channels {

namespace asio = boost::asio;

asio::awaitable<Result<std::string>> RecordDelivery(store::Store& store, const store::Channel& c,
                                                    const std::string& delivery_id,
                                                    const std::string& conversation) {
  Result<std::string> out = Internal("no session");
  // Twice at most: a unit that loses a race for the delivery (or the conversation) to another
  // request fails with kConflict, and the next finds what that request recorded.
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string session_id;
    auto written = co_await store::AsyncWrite(store, [&](store::Tx& tx) -> Status {
      auto& channels = tx.channels();
      // Deleted or disabled since the delivery's read: as if it had been before.
      KEEL_ASSIGN_OR_RETURN(auto now_is, channels.GetChannel(c.tenant_id, c.id));
      if (!now_is.enabled) return NotFound("channel not found: " + c.id);
      // Its runs act for its creator: not once that token is revoked (a poll asked before the
      // revocation may bring updates after it).
      KEEL_ASSIGN_OR_RETURN(bool revoked, access::Revoked(tx, c.tenant_id, c.created_by));
      if (revoked) {
        return PermissionDenied("this channel is suspended: the token that created it was revoked");
      }
      KEEL_ASSIGN_OR_RETURN(auto went, channels.DeliverySession(c.tenant_id, c.id, delivery_id));
      if (went) {
        session_id = *went;
        return Status::Ok();
      }
      const Millis now = NowMillis();
      KEEL_ASSIGN_OR_RETURN(auto known,
                            channels.ConversationSession(c.tenant_id, c.id, conversation));
      if (known) {
        session_id = *known;
      } else {
        KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(c.tenant_id, c.agent_id).status());
        store::Session session;
        session.id = NewId();
        session.tenant_id = c.tenant_id;
        session.agent_id = c.agent_id;
        session.title =
            conversation.empty() ? c.name : c.name + ": " + TruncateUtf8(conversation, 200);
        session.created_by = c.created_by;
        session.created_at = session.updated_at = now;
        store::ChannelConversation row{c.tenant_id, c.id, conversation, session.id, now};
        KEEL_RETURN_IF_ERROR(channels.InsertConversation(row));
        tx.Carry("channel_conversations", store::RowImage(row));
        KEEL_RETURN_IF_ERROR(runs::OpenSession(tx, session, "channel"));
        session_id = session.id;
      }
      store::ChannelDelivery delivery{c.tenant_id, c.id, delivery_id, session_id, now};
      KEEL_RETURN_IF_ERROR(channels.InsertDelivery(delivery));
      tx.Carry("channel_deliveries", store::RowImage(delivery));
      return tx.events().Append({c.tenant_id,
                                 "channel.delivered@v1",
                                 c.agent_id,
                                 session_id,
                                 "",
                                 {{"channel_id", c.id}, {"delivery_id", delivery_id}}});
    });
    if (written.ok()) co_return session_id;
    out = written.status();
    if (written.status().code() != Code::kConflict) break;
  }
  co_return out;
}

}  // namespace keel::channels

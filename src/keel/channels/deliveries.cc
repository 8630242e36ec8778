#include "keel/channels/deliveries.h"

#include "keel/access/access.h"
#include "keel/channels/webhook.h"
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

namespace {

// Whether the channel still takes deliveries, inside the unit that records one: deleted or
// disabled since the delivery's read, it is as if it had been before; its runs act for its
// creator, so not once that token is revoked (a poll asked before the revocation may bring
// updates after it), and nothing is answered for it then either.
Status StillTaking(store::Tx& tx, const store::Channel& c, store::Channel* now = nullptr) {
  KEEL_ASSIGN_OR_RETURN(auto now_is, tx.channels().GetChannel(c.tenant_id, c.id));
  if (!now_is.enabled) return NotFound("channel not found: " + c.id);
  KEEL_ASSIGN_OR_RETURN(bool revoked, access::Revoked(tx, c.tenant_id, c.created_by));
  if (revoked) {
    return PermissionDenied("this channel is suspended: the token that created it was revoked");
  }
  if (now) *now = std::move(now_is);
  return Status::Ok();
}

// The role the channel's runs act with at most, as its settings say now (a poll that began
// before they changed must not carry the old one).
Result<std::string> ChannelRole(store::Tx& tx, const store::Channel& c) {
  store::Channel now;
  KEEL_RETURN_IF_ERROR(StillTaking(tx, c, &now));
  KEEL_ASSIGN_OR_RETURN(auto settings, ParseJson(now.settings));
  return SettingsRole(settings);
}

}  // namespace

asio::awaitable<Result<std::string>> RecordDelivery(store::Store& store, const store::Channel& c,
                                                    const std::string& delivery_id,
                                                    const std::string& conversation,
                                                    const std::string& contact) {
  Result<std::string> out = Internal("no session");
  // Twice at most: a unit that loses a race for the delivery (or the conversation) to another
  // request fails with kConflict, and the next finds what that request recorded.
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string session_id;
    auto written = co_await store::AsyncWrite(store, [&](store::Tx& tx) -> Status {
      auto& channels = tx.channels();
      KEEL_RETURN_IF_ERROR(StillTaking(tx, c));
      KEEL_ASSIGN_OR_RETURN(auto went, channels.DeliverySession(c.tenant_id, c.id, delivery_id));
      if (went) {
        session_id = *went;
        return Status::Ok();
      }
      const Millis now = NowMillis();
      KEEL_ASSIGN_OR_RETURN(auto known, channels.GetConversation(c.tenant_id, c.id, conversation));
      if (known) {
        session_id = known->session_id;
        if (!contact.empty() && known->contact.empty()) {
          KEEL_ASSIGN_OR_RETURN(
              bool set, channels.SetConversationContact(c.tenant_id, c.id, conversation, contact));
          if (set) {
            tx.Carry("channel_conversations", store::ColumnsImage({{"channel_id", c.id},
                                                                   {"conversation", conversation},
                                                                   {"contact", contact}}));
          }
        }
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
        store::ChannelConversation row{c.tenant_id, c.id, conversation, session.id, now, contact};
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

asio::awaitable<Result<access::Admission>> AdmitDelivery(store::Store& store,
                                                         const secrets::Vault& vault,
                                                         const store::Channel& c,
                                                         const ChatMessage& m, int recent) {
  // What a delivery recorded before was owed: its session's run again, or nothing more.
  auto again = [&](store::Tx& tx, const std::string& channel_role,
                   const std::optional<std::string>& went) -> Result<access::Admission> {
    access::Admission a;
    a.replay = true;
    if (went->empty()) return a;  // refused (its notice is its reply)
    KEEL_ASSIGN_OR_RETURN(auto identity,
                          tx.users().FindIdentity(c.tenant_id, m.sender.platform, m.sender.id));
    std::string role = "guest";
    if (identity) {
      KEEL_ASSIGN_OR_RETURN(auto user, access::CurrentUser(tx, c.tenant_id, identity->user_id));
      KEEL_ASSIGN_OR_RETURN(auto member, tx.users().GetMember(c.tenant_id, c.agent_id, user.id));
      if (member) role = member->role;
      a.user_id = user.id;
    }
    a.take = true;
    a.role = access::LowerRole(channel_role, role);
    return a;
  };
  access::Admission out;
  // The decision, in a read (`may_write` false) or in the unit that writes what it makes; whether
  // the delivery was taken before (nothing to write then).
  auto decide = [&](store::Tx& tx, bool may_write, Millis now) -> Result<bool> {
    KEEL_ASSIGN_OR_RETURN(auto channel_role, ChannelRole(tx, c));
    KEEL_ASSIGN_OR_RETURN(auto went,
                          tx.channels().DeliverySession(c.tenant_id, c.id, m.delivery_id));
    if (went) {
      KEEL_ASSIGN_OR_RETURN(out, again(tx, channel_role, went));
      return true;
    }
    KEEL_ASSIGN_OR_RETURN(
        out, access::AdmitSender(tx, vault, c.tenant_id, c.agent_id, channel_role, m.sender, m.text,
                                 m.direct, m.addressed, recent, may_write, now));
    if (m.quiet && !out.take && !out.notice.empty()) {
      out.notice.clear();  // nothing to record: the delivery is passed over
      out.needs_write = false;
    }
    return false;
  };
  Status read = co_await store::AsyncRead(
      store, [&](store::Tx& tx) { return decide(tx, false, NowMillis()).status(); });
  if (!read.ok()) co_return read;
  if (!out.needs_write) co_return out;
  Status last = Status::Ok();
  // Twice at most: a unit that loses a race for a new identity to another delivery of the same
  // sender fails with kConflict, and the next finds what that one made.
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto written = co_await store::AsyncWrite(store, [&](store::Tx& tx) -> Status {
      const Millis now = NowMillis();
      KEEL_ASSIGN_OR_RETURN(bool replay, decide(tx, true, now));
      if (replay || out.take || out.notice.empty()) return Status::Ok();
      // Refused (or let in by its access code): the notice is the delivery's answer.
      store::ChannelDelivery delivery{c.tenant_id, c.id, m.delivery_id, "", now};
      KEEL_RETURN_IF_ERROR(tx.channels().InsertDelivery(delivery));
      tx.Carry("channel_deliveries", store::RowImage(delivery));
      store::ChannelReply reply;
      reply.id = NewId();
      reply.tenant_id = c.tenant_id;
      reply.channel_id = c.id;
      reply.agent_id = c.agent_id;
      reply.delivery_id = m.delivery_id;
      reply.target = DumpJson(m.target);
      reply.status = "pending";
      reply.text = out.notice;
      reply.next_attempt_at = now;
      reply.created_at = reply.updated_at = now;
      KEEL_RETURN_IF_ERROR(tx.channels().InsertReply(reply));
      return tx.events().Append({c.tenant_id,
                                 "channel.delivered@v1",
                                 c.agent_id,
                                 "",
                                 "",
                                 {{"channel_id", c.id},
                                  {"delivery_id", m.delivery_id},
                                  {"admitted", false},
                                  {"sender", m.sender.platform + ":" + m.sender.id}}});
    });
    if (written.ok()) co_return out;
    last = written.status();
    if (last.code() != Code::kConflict) break;
  }
  co_return last;
}

}  // namespace keel::channels

#pragma once
// channels::Relay: the chat platforms' side of channels (docs/CHANNELS.md). It long-polls the
// enabled telegram channels' bots whose lease this node holds (a new one within two seconds)
// for updates, and on the leader sends the answers runs owe (the outbox, decisions/0020):
//
//   lease    each polled channel has a lease that one node holds at a time (Lease); the nodes
//            share the channels, and a stopped or dead node's move to the others once their
//            leases run out (at most 17 s)
//   poll     getUpdates from the durable cursor; each update the routing rules take
//            (telegram.h) is recorded as a delivery of its chat's session (deliveries.h), posted
//            through intake with the key "telegram:UPDATE_ID", and owed an answer (a reply
//            "waiting" for its run); then the cursor moves past the batch. A crash anywhere in
//            between fetches the batch again and each update is a replay.
//   send     a reply whose run ended is claimed ("sending", durable before any request), its
//            answer passed through channel.message.out@v1 and sent part by part; a 2xx moves
//            it on, 429 and 5xx put it back with a delay, a refusal kills it, and a request
//            that may have reached Telegram without its answer reaching Keel (a dropped
//            connection, this node's crash) makes it "unknown": never sent again.
//   cards    an approval a channel's run waits for is carded (channels/cards.h), its cards sent
//            through the outbox like answers and edited once it is decided; a press of a card's
//            button decides it (Pressed).
//
// Everything runs on the server's io executor; no member needs a lock.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "keel/channels/cards.h"
#include "keel/channels/deliveries.h"
#include "keel/channels/telegram.h"
#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/http/outbound_guard.h"

namespace keel {
namespace http {
class Client;
}
namespace runtime {
class Runtime;
class EventHub;
struct EndingWork;
}  // namespace runtime
namespace secrets {
class Vault;
}
namespace store {
class Store;
struct Channel;
struct ChannelLease;
struct ChannelReply;
}  // namespace store
}  // namespace keel

namespace keel::channels {

struct BotAnswer;

class Relay {
 public:
  // `outbound`: where a channel's api_base may point (it is the tenant's choice).
  // `public_url`: where the internet reaches this server ("" when nowhere): webhook-mode
  // channels have Telegram post their updates there.
  Relay(boost::asio::any_io_executor executor, store::Store& store, runtime::Runtime& runtime,
        runtime::EventHub& hub, const secrets::Vault& vault, http::OutboundGuard outbound,
        std::string public_url);
  ~Relay();

  // Starts the loops. REQUIRES: called once, on the executor.
  void Start();
  // The channels this node polls (or registers the command of) now. On the executor.
  size_t Polling() const { return polling_.size(); }
  // The node drains: no new poll, no new send (a send under way finishes).
  void Stop();
  // An update Telegram posted to POST /v1/hooks/{id} for a webhook-mode channel, with the
  // X-Telegram-Bot-Api-Secret-Token it came with: authenticated (kUnauthenticated, checked in
  // constant time before the body is read), then taken as a polled one is. The status to answer
  // (200 once its message is durable, or when the agent passes it over); an error for Telegram
  // to retry (kUnavailable, kRateLimited) or not: kNotFound (no such enabled webhook-mode
  // channel), kInvalidArgument (not an update), kPermissionDenied (its creator revoked).
  boost::asio::awaitable<Result<int>> Pushed(std::string channel_id, std::string secret,
                                             std::string body);
  // An Events API request Slack posted to POST /v1/hooks/{id} for a slack channel, with its
  // X-Slack-Request-Timestamp and X-Slack-Signature: authenticated (kUnauthenticated, the
  // headers checked before anything is read, the signature before the body is parsed), then a
  // url_verification's challenge answered, or the event taken (channels/slack.h's routing; its
  // event_id the delivery's id). The JSON to answer 200 with; errors as for Pushed.
  boost::asio::awaitable<Result<Json>> PushedSlack(std::string channel_id, std::string timestamp,
                                                   std::string signature, std::string body);
  // An interaction Discord posted to POST /v1/hooks/{id} for a discord channel, with its
  // X-Signature-Timestamp and X-Signature-Ed25519 (checked as PushedSlack checks Slack's, with
  // the channel's public key): a PING answered, the channel's command taken (the JSON says
  // "deferred" once its message is durable), anything else answered with an ephemeral notice.
  boost::asio::awaitable<Result<Json>> PushedDiscord(std::string channel_id, std::string timestamp,
                                                     std::string signature, std::string body);

 private:
  struct PollRead;
  boost::asio::awaitable<void> Supervise();
  // Takes, renews and gives up this node's leases on the `polled` channels (decisions/0020):
  // its share of them among `nodes` live nodes.
  boost::asio::awaitable<void> Lease(const std::vector<store::Channel>& polled,
                                     const std::vector<store::ChannelLease>& leases, size_t nodes);
  // Forgets the leases of channels no longer polled (disabled or deleted): they run out.
  void ForgetUnlisted(const std::vector<store::Channel>& polled);
  // Ends this node's leases on the channels, (tenant, channel id) each, in a unit of their own
  // (not awaited), so that another node takes them at its next look.
  void GiveUp(std::vector<std::pair<std::string, std::string>> channels);
  // Whether this node holds the channel's lease, by its own steady clock.
  bool Holds(const std::string& channel_id) const;
  // The channel, its settings, token and poll state, in one read (`r.gone`, `r.problem`).
  boost::asio::awaitable<Status> ReadChannel(const std::string& tenant_id,
                                             const std::string& channel_id, PollRead& r);
  // A Bot API method of the channel's bot.
  boost::asio::awaitable<BotAnswer> CallBot(const PollRead& r, const std::string& method,
                                            const Json& body, std::chrono::milliseconds timeout);
  // The bot as getMe describes it, asked once per token.
  boost::asio::awaitable<Result<TelegramBot>> BotOf(const PollRead& r);
  boost::asio::awaitable<void> Poll(std::string tenant_id, std::string channel_id);
  // A discord channel's slash command registered (again when its settings change).
  boost::asio::awaitable<void> Register(std::string tenant_id, std::string channel_id);
  // The updates of a poll the agent takes, by conversation: the conversations at once, each
  // one's in order. Ok when all are dealt with and the cursor may pass them; else the first
  // error (the batch is fetched again).
  boost::asio::awaitable<Status> TakeAll(
      const PollRead& read, const std::map<std::string, std::vector<TelegramInbound>>& updates);
  // One update the agent takes: Ok when it is posted (or refused for good), an error when it is
  // to be fetched again (intake full, the store unavailable). The chat shows the bot typing.
  boost::asio::awaitable<Status> Take(const PollRead& read, const TelegramInbound& update);
  // A message a chat platform brought, whatever the platform: admitted by who sent it
  // (AdmitDelivery; a refusal's notice is its answer), passed through channel.message.in@v1,
  // recorded as a delivery of its conversation's session, posted with the key `key_prefix` +
  // its id, and owed a reply. Whether it started a run (false for a replay, a refusal, a
  // message passed over); an error when it is to be taken again (intake full, the store
  // unavailable).
  boost::asio::awaitable<Result<bool>> Deliver(const store::Channel& c,
                                               const std::string& key_prefix,
                                               const ChatMessage& in);
  // The sender's messages to the agent in the current minute (after counting one more when
  // `count`).
  int SenderRate(const std::string& agent_id, const access::Sender& sender, bool count);
  // Records why the channel's last poll failed ("" for none) and its cursor.
  boost::asio::awaitable<void> RecordPoll(const PollRead& read, std::string cursor,
                                          std::string error);
  // Wakes the sender once the run ended. With the id of the answer it owes (`reply_id`), the
  // run's ending may claim that answer meanwhile (ClaimAtEnd).
  boost::asio::awaitable<void> AwaitRun(std::string tenant_id, std::string run_id,
                                        std::string reply_id = "");
  // Runtime::SetEndingWork: the claim of a run's answer written with the run's end, for a run
  // AwaitRun waits for when this node sends (the leader, with room): in flight from the ask,
  // sent once the ending commits (without a claim unit of its own after the run's), given back
  // if it fails. A crash between that unit and the request leaves the answer sending, which
  // the restart makes unknown, as after the sweep's claim.
  runtime::EndingWork ClaimAtEnd(const store::Run& run);
  boost::asio::awaitable<void> SendLoop();
  boost::asio::awaitable<void> Send(store::ChannelReply reply);
  // Shows a card with its buttons, or edits a shown one to say how its approval was decided.
  boost::asio::awaitable<void> SendCard(store::ChannelReply card, std::string kind,
                                        std::string api_base, std::string token);
  // A press of a card's button on channel `c`, decided (DecidePress) in a unit; what the
  // presser is told.
  boost::asio::awaitable<PressOutcome> Pressed(const store::Channel& c, const Press& p);
  // A Telegram press decided, and answered (answerCallbackQuery) with its notice.
  boost::asio::awaitable<void> TakePress(const PollRead& read, const Press& p);
  // Records a reply's new state (with its event when it ended, or when `card_shown`: a card
  // the platform has just shown); false when the write failed.
  boost::asio::awaitable<bool> Record(const store::ChannelReply& reply, bool card_shown = false);
  boost::asio::awaitable<void> Sleep(std::chrono::milliseconds how_long);
  void WakeSender();

  boost::asio::any_io_executor executor_;
  store::Store& store_;
  runtime::Runtime& runtime_;
  runtime::EventHub& hub_;
  const secrets::Vault& vault_;
  std::unique_ptr<http::Client> client_;
  const std::string public_url_;
  // Each channel's bot, by channel id: the token getMe was asked with, and its answer.
  std::map<std::string, std::pair<std::string, TelegramBot>> bots_;
  boost::asio::steady_timer supervise_timer_;
  boost::asio::steady_timer send_timer_;
  bool supervise_wake_ = true;
  bool send_wake_ = true;
  bool stopping_ = false;
  std::set<std::string> polling_;  // channels this node polls
  // The channels whose lease this node holds, by id: believed until when (steady clock).
  struct Held {
    std::string tenant_id;
    std::chrono::steady_clock::time_point believed_until;
  };
  std::map<std::string, Held> held_;
  size_t nodes_ = 1;    // the live nodes at the last look
  uint64_t looks_ = 0;  // looks done (Supervise)
  // The replies this node sends (or holds to send), by id: changed on the executor, read also
  // by the sweep's unit on the store's writer thread.
  class InFlight {
   public:
    void Add(const std::string& id) {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.insert(id);
    }
    void Remove(const std::string& id) {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.erase(id);
    }
    bool Has(const std::string& id) const {
      std::lock_guard<std::mutex> lock(mu_);
      return ids_.count(id) > 0;
    }
    size_t Size() const {
      std::lock_guard<std::mutex> lock(mu_);
      return ids_.size();
    }

   private:
    mutable std::mutex mu_;
    std::set<std::string> ids_;  // GUARDED_BY(mu_)
  };
  InFlight sending_;
  std::map<std::string, int> tenant_sending_;  // of those, by tenant
  // The runs AwaitRun waits for with the answer each owes; `reserved` while an ending that
  // ClaimAtEnd gave the answer's claim is being written (the answer in sending_).
  struct Awaited {
    std::string tenant_id;
    std::string reply_id;
    bool reserved = false;
  };
  std::map<std::string, Awaited> awaited_;     // by run id
  std::map<std::string, int> typing_;          // typing actions on their way, by channel
  // The channel polling each bot, by its Bot API server and id.
  std::map<std::string, std::string> bot_pollers_;
  // Messages per sender of each agent in the current minute: (minute's start, count).
  std::map<std::string, std::pair<Millis, int>> sender_rates_;
};

}  // namespace keel::channels

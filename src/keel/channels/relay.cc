#include "keel/channels/relay.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "keel/access/access.h"
#include "keel/channels/deliveries.h"
#include "keel/channels/discord.h"
#include "keel/channels/leases.h"
#include "keel/channels/slack.h"
#include "keel/channels/telegram.h"
#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/log.h"
#include "keel/common/time.h"
#include "keel/http/client.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/intake.h"
#include "keel/runtime/runtime.h"
#include "keel/secrets/vault.h"
#include "keel/store/async.h"
#include "keel/store/channel_store.h"
#include "keel/store/store.h"

namespace keel::channels {

namespace asio = boost::asio;
using std::chrono::milliseconds;

// A Bot API answer: {"ok": true, "result": ...} or {"ok": false, "error_code", "description",
// "parameters": {"retry_after"}}.
struct BotAnswer {
  int status = 0;   // HTTP status; 0 when no answer came
  bool ok = false;  // "ok": true
  Json result;
  std::string error;  // why it failed, for the owner
  Millis retry_after = 0;
};

namespace {

constexpr int kBatch = 32;           // replies claimed per round
constexpr size_t kMaxInFlight = 64;  // replies sent at once by this node
constexpr size_t kMaxInboundBytes = 64 * 1024;  // the longest platform message taken
// Of those, the most one tenant's take: a tenant whose platform (its api_base) holds requests
// open does not hold every other tenant's answers back.
constexpr int kMaxTenantInFlight = 8;
constexpr int kMaxTypingInFlight = 16;  // typing actions on their way, per channel
constexpr int kMaxAttempts = 8;      // sends of a reply Telegram answered 5xx, before it is dead
constexpr Millis kMaxBackoffMs = 3600 * 1000;
// A claimed reply is unknown after this if its send never reports (its node stopped).
constexpr Millis kClaimMs = 2 * 60 * 1000;
constexpr Millis kNodeSeenMs = 5000;  // the nodes that share the channels: seen this recently
constexpr milliseconds kSendTimeout{30000};
constexpr size_t kMaxAnswerBytes = 1 << 20;
// The updates a Telegram bot is asked for (a webhook is set again when they change).
constexpr const char* kTelegramUpdates = "message,callback_query";

Millis Backoff(int attempts) {
  return std::min<Millis>(kMaxBackoffMs, Millis{1000} << std::min(std::max(attempts - 1, 0), 20));
}

// A platform's answer (Telegram's Bot API, Slack's Web API: both {"ok": true|false, ...}, the
// reason in "description" or "error", a wait in parameters.retry_after or Retry-After).
// `token` may be in the request's URL, and so in the client's errors: it is cut out of them.
BotAnswer ReadAnswer(const std::string& method, const Result<http::ClientResponse>& got,
                     const std::string& token, const std::string& platform = "Telegram") {
  BotAnswer a;
  if (!got.ok()) {
    a.error = method + ": " + got.status().message();
    for (size_t at = a.error.find(token); !token.empty() && at != std::string::npos;
         at = a.error.find(token, at)) {
      a.error.replace(at, token.size(), "<token>");
    }
    return a;
  }
  a.status = got->status;
  auto body = ParseJson(got->body);
  if (body.ok() && body->is_object()) {
    a.ok = a.status / 100 == 2 &&
           (platform == "Discord" || (body->contains("ok") && (*body)["ok"] == true));
    if (body->contains("result")) a.result = (*body)["result"];
    const Json params = body->value("parameters", Json::object());
    if (params.is_object() && params.contains("retry_after") &&
        params["retry_after"].is_number_integer()) {
      a.retry_after = std::clamp<Millis>(params["retry_after"].get<int64_t>(), 0, 3600) * 1000;
    }
    if (body->contains("retry_after") && (*body)["retry_after"].is_number()) {  // Discord's
      a.retry_after =
          static_cast<Millis>(std::clamp((*body)["retry_after"].get<double>(), 0.0, 3600.0) * 1000);
    }
    if (!a.ok) {
      const char* field = body->contains("description") ? "description"
                          : body->contains("message")   ? "message"
                                                        : "error";
      const Json& why = body->contains(field) ? (*body)[field] : Json();
      a.error = method + ": " + platform + " answered " + std::to_string(a.status) + ": " +
                TruncateUtf8(why.is_string() ? why.get<std::string>() : "no description", 300);
    }
  } else if (platform == "Discord" && a.status == 204) {
    a.ok = true;
  } else {
    a.error = method + ": " + platform + " answered " + std::to_string(a.status) + " without JSON";
  }
  if (const std::string after = got->Header("retry-after"); !after.empty() && a.retry_after == 0) {
    int64_t seconds = 0;
    bool digits = after.size() <= 6;
    for (char c : after) {
      digits = digits && c >= '0' && c <= '9';
      if (digits) seconds = seconds * 10 + (c - '0');
    }
    if (digits) a.retry_after = std::min<int64_t>(seconds, 3600) * 1000;
  }
  return a;
}

// Whether a request that got no answer surely never reached the server: it failed while
// resolving, connecting or setting up TLS (http/client.h's messages), or the outbound guard
// refused it. Anything later (sending it, waiting for the head) may have reached Telegram.
bool NeverSent(const Status& st) {
  const std::string& m = st.message();
  return st.code() == Code::kPermissionDenied || st.code() == Code::kInvalidArgument ||
         m.find(": resolving '") != std::string::npos ||
         m.find(": connecting to ") != std::string::npos || m.find(": TLS ") != std::string::npos;
}

std::string AnswerOf(const store::Run& run) {
  if (run.status == "done") return run.output;
  if (run.status == "failed") {
    std::string code = run.error.is_object() ? run.error.value("code", "internal") : "internal";
    return "The agent could not answer (error: " + code + ").";
  }
  return "";  // cancelled: nothing to say
}

// A waiting answer whose run ended, with the run's answer: claimed by `origin` (sending), or
// skipped when the run has nothing to say.
void ClaimAnswer(store::ChannelReply& r, const store::Run& run, const std::string& origin,
                 Millis now) {
  r.updated_at = now;
  r.text = TruncateUtf8(AnswerOf(run), kMaxAnswerBytes);
  if (ReplyParts(r.text).empty() || r.text.find(kNoReply) != std::string::npos) {
    r.status = "skipped";
    return;
  }
  r.status = "sending";
  r.origin = origin;
  r.next_attempt_at = now + kClaimMs;
}

// How a reply is sent on its channel's platform: where, with which token, or why it cannot be
// now (nothing was sent); the agent's plugin stamps for channel.message.out@v1.
struct SendingHow {
  std::string kind, api_base, token;
  std::string refusal;
  std::optional<std::vector<store::PluginStamp>> stamps;
};

// Reads how `r` is sent. kNotFound once its channel is deleted.
Status ReadHow(store::Tx& tx, const secrets::Vault& vault, const store::ChannelReply& r,
               SendingHow& how) {
  KEEL_ASSIGN_OR_RETURN(auto c, tx.channels().GetChannel(r.tenant_id, r.channel_id));
  how.kind = c.kind;
  auto json = ParseJson(c.settings);
  std::string secret;
  Status parsed = json.status();
  if (json.ok() && c.kind == "slack") {
    auto s = ParseSlackSettings(*json);
    parsed = s.status();
    if (s.ok()) std::tie(how.api_base, secret) = std::pair(s->api_base, s->bot_token);
  } else if (json.ok() && c.kind == "discord") {
    auto s = ParseDiscordSettings(*json);
    parsed = s.status();
    if (s.ok()) std::tie(how.api_base, secret) = std::pair(s->api_base, s->bot_token);
  } else if (json.ok()) {
    auto s = ParseTelegramSettings(*json);
    parsed = s.status();
    if (s.ok()) std::tie(how.api_base, secret) = std::pair(s->api_base, s->bot_token);
  }
  if (!parsed.ok()) {
    how.refusal = "its channel's settings are refused: " + parsed.message();
    return Status::Ok();
  }
  auto opened = vault.Get(tx, r.tenant_id, secret);
  if (!opened.ok()) {
    how.refusal =
        "the bot token secret '" + secret + "' cannot be opened: " + opened.status().message();
  } else if (c.kind == "telegram"
                 ? !ValidBotToken(*opened)
                 : opened->empty() || opened->find_first_of("\r\n") != std::string::npos) {
    how.refusal = "the bot token secret '" + secret + "' does not hold a bot token";
  } else {
    how.token = std::move(*opened);
  }
  if (r.approval_id.empty() && r.parts_sent == 0) {
    how.stamps.emplace();
    KEEL_RETURN_IF_ERROR(
        tx.plugins().PluginStampsForAgentLater(r.tenant_id, r.agent_id, *how.stamps));
  }
  return Status::Ok();
}

}  // namespace

// What one round of a channel's poll needs, read in one unit.
struct Relay::PollRead {
  store::Channel channel;
  TelegramSettings settings;
  std::string token;
  std::string cursor;
  std::string error;    // the last poll's failure, as recorded
  std::string problem;  // why it cannot be polled now
  bool suspended = false;  // its creator's token was revoked
  bool gone = false;    // deleted, disabled, or no longer polled
};

Relay::Relay(asio::any_io_executor executor, store::Store& store, runtime::Runtime& runtime,
             runtime::EventHub& hub, const secrets::Vault& vault, http::OutboundGuard outbound,
             std::string public_url)
    : executor_(executor),
      store_(store),
      runtime_(runtime),
      hub_(hub),
      vault_(vault),
      client_(std::make_unique<http::Client>([&] {
        http::Client::Options o;
        o.outbound = std::move(outbound);
        return o;
      }())),
      public_url_(std::move(public_url)),
      supervise_timer_(executor),
      send_timer_(executor) {}

Relay::~Relay() = default;

void Relay::Start() {
  runtime_.SetEndingWork([this](const store::Run& run) { return ClaimAtEnd(run); });
  asio::co_spawn(executor_, Supervise(), ReportExceptions{"channel polls"});
  asio::co_spawn(executor_, SendLoop(), ReportExceptions{"channel replies"});
}

void Relay::Stop() {
  runtime_.SetEndingWork(nullptr);
  stopping_ = true;
  // The channels this node polls go to another at its next look, not after their leases.
  std::vector<std::pair<std::string, std::string>> given;  // (tenant, channel)
  for (const auto& [id, h] : held_) given.emplace_back(h.tenant_id, id);
  held_.clear();
  GiveUp(std::move(given));
  supervise_timer_.cancel();
  send_timer_.cancel();
}

void Relay::WakeSender() {
  send_wake_ = true;
  send_timer_.cancel();
}

asio::awaitable<void> Relay::Sleep(milliseconds how_long) {
  asio::steady_timer timer(executor_, how_long);
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

// ---- Polling

asio::awaitable<void> Relay::Supervise() {
  while (!stopping_) {
    if (!supervise_wake_) {
      supervise_timer_.expires_after(std::chrono::seconds(2));
      boost::system::error_code ec;
      co_await supervise_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    supervise_wake_ = false;
    if (stopping_) break;
    std::vector<store::Channel> polled;
    std::vector<store::ChannelLease> leases;
    size_t nodes = 1;
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(polled, tx.channels().PolledChannels());
      KEEL_ASSIGN_OR_RETURN(leases, tx.channels().ChannelLeases());
      KEEL_ASSIGN_OR_RETURN(auto seen, tx.runs().ListNodes(kNodeSeenMs));
      nodes = std::max<size_t>(1, seen.size());
      return Status::Ok();
    });
    if (!read.ok() || stopping_) continue;
    co_await Lease(polled, leases, nodes);
    nodes_ = nodes;
    ++looks_;
    for (const auto& c : polled) {
      if (!Holds(c.id) || !polling_.insert(c.id).second) continue;
      if (c.kind == "discord") {
        asio::co_spawn(executor_, Register(c.tenant_id, c.id), ReportExceptions{"channel command"});
      } else {
        asio::co_spawn(executor_, Poll(c.tenant_id, c.id), ReportExceptions{"channel poll"});
      }
    }
  }
}

void Relay::ForgetUnlisted(const std::vector<store::Channel>& polled) {
  std::set<std::string> listed;
  for (const auto& c : polled) listed.insert(c.id);
  std::erase_if(held_, [&](const auto& h) { return !listed.count(h.first); });
}

void Relay::GiveUp(std::vector<std::pair<std::string, std::string>> channels) {
  if (channels.empty()) return;
  store_.Write(
      [channels = std::move(channels), me = store_.origin()](store::Tx& tx) -> Status {
        const Millis now = NowMillis();
        for (const auto& [tenant_id, id] : channels) {
          KEEL_RETURN_IF_ERROR(tx.channels().LeaseChannel(tenant_id, id, me, now, now).status());
        }
        return Status::Ok();
      },
      [](Status st, std::vector<store::Event>) {
        if (!st.ok()) LogError("giving up channel leases: " + st.message());
      });
}

bool Relay::Holds(const std::string& channel_id) const {
  auto it = held_.find(channel_id);
  return it != held_.end() && std::chrono::steady_clock::now() < it->second.believed_until;
}

asio::awaitable<void> Relay::Lease(const std::vector<store::Channel>& polled,
                                   const std::vector<store::ChannelLease>& leases, size_t nodes) {
  const std::string me = store_.origin();
  const Millis now = NowMillis();
  ForgetUnlisted(polled);
  const std::vector<LeaseAsk> asks = PlanLeases(
      polled, leases, nodes, me, now, [this](const std::string& id) { return Holds(id); });
  // Given up: no poll of it goes on here (the loop ends at its next look).
  for (const auto& a : asks) {
    if (a.until <= now) held_.erase(a.channel_id);
  }
  if (asks.empty()) co_return;
  const auto asked = std::chrono::steady_clock::now();
  std::vector<char> got(asks.size(), 0);
  // Named, not a temporary of the co_await: g++ 12 destroys a temporary lambda's captured
  // string there twice.
  store::WriteFn write = [&asks, &got, &me, now](store::Tx& tx) -> Status {
    for (size_t i = 0; i < asks.size(); ++i) {
      const LeaseAsk& a = asks[i];
      KEEL_ASSIGN_OR_RETURN(
          bool held, tx.channels().LeaseChannel(a.tenant_id, a.channel_id, me, now, a.until));
      got[i] = held ? 1 : 0;
    }
    return Status::Ok();
  };
  auto wrote = co_await store::AsyncWrite(store_, std::move(write));
  if (!wrote.ok()) {
    LogError("channel leases: " + wrote.status().message());
    co_return;
  }
  if (stopping_) {  // Stop gave up what it knew of; these came meanwhile
    std::vector<std::pair<std::string, std::string>> taken;
    for (size_t i = 0; i < asks.size(); ++i) {
      if (got[i] && asks[i].until > now) taken.emplace_back(asks[i].tenant_id, asks[i].channel_id);
    }
    GiveUp(std::move(taken));
    co_return;
  }
  for (size_t i = 0; i < asks.size(); ++i) {
    if (asks[i].until <= now) continue;
    if (got[i]) {
      held_[asks[i].channel_id] = {asks[i].tenant_id,
                                   asked + std::chrono::milliseconds(kChannelBelievedMs)};
    } else {
      held_.erase(asks[i].channel_id);  // another node took it: this one was stopped past it
    }
  }
}

asio::awaitable<Status> Relay::ReadChannel(const std::string& tenant_id,
                                           const std::string& channel_id, PollRead& r) {
  co_return co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    auto c = tx.channels().GetChannel(tenant_id, channel_id);
    if (c.status().code() == Code::kNotFound) {
      r.gone = true;
      return Status::Ok();
    }
    KEEL_ASSIGN_OR_RETURN(r.channel, std::move(c));
    if (!r.channel.enabled || r.channel.kind != "telegram") {
      r.gone = true;
      return Status::Ok();
    }
    KEEL_ASSIGN_OR_RETURN(auto poll, tx.channels().GetPoll(tenant_id, channel_id));
    if (poll) {
      r.cursor = poll->cursor;
      r.error = poll->error;
    }
    auto settings = ParseJson(r.channel.settings);
    auto parsed = settings.ok() ? ParseTelegramSettings(*settings)
                                : Result<TelegramSettings>(settings.status());
    if (!parsed.ok()) {
      r.problem = "its settings are refused: " + parsed.status().message();
      return Status::Ok();
    }
    r.settings = std::move(*parsed);
    KEEL_ASSIGN_OR_RETURN(auto agent, tx.agents().GetAgent(tenant_id, r.channel.agent_id));
    if (agent.status == "deleted") r.gone = true;
    KEEL_ASSIGN_OR_RETURN(bool revoked, access::Revoked(tx, tenant_id, r.channel.created_by));
    if (revoked) {
      r.suspended = true;
      r.problem = "the token that created it (" + r.channel.created_by + ") was revoked";
      return Status::Ok();
    }
    if (r.settings.mode == "webhook" && public_url_.empty()) {
      r.problem =
          "webhook mode needs the server's public_url (keel.toml public_url or "
          "KEEL_PUBLIC_URL), which is not set";
      return Status::Ok();
    }
    auto token = vault_.Get(tx, tenant_id, r.settings.bot_token);
    if (!token.ok()) {
      r.problem = "its bot token secret '" + r.settings.bot_token +
                  "' cannot be opened: " + token.status().message();
    } else if (!ValidBotToken(*token)) {
      r.problem = "its bot token secret '" + r.settings.bot_token +
                  "' does not hold a bot token (digits, ':', letters, '-' and '_')";
    } else {
      r.token = std::move(*token);
    }
    return Status::Ok();
  });
}

asio::awaitable<BotAnswer> Relay::CallBot(const PollRead& r, const std::string& method,
                                          const Json& body, milliseconds timeout) {
  http::ClientRequest req;
  req.method = "POST";
  req.url = r.settings.api_base + "/bot" + r.token + "/" + method;
  req.headers = {{"Content-Type", "application/json"}};
  req.body = DumpJson(body);
  req.timeout = timeout;
  req.total = timeout;  // however the server trickles its answer
  co_return ReadAnswer(method, co_await client_->Fetch(req, 32 << 20), r.token);
}

asio::awaitable<Result<TelegramBot>> Relay::BotOf(const PollRead& r) {
  // Asked again when the token or the server changes: a bot's id is its server's answer.
  const std::string asked_with = r.settings.api_base + " " + r.token;
  auto known = bots_.find(r.channel.id);
  if (known != bots_.end() && known->second.first == asked_with) co_return known->second.second;
  Json none = Json::object();
  BotAnswer me = co_await CallBot(r, "getMe", none, kSendTimeout);
  if (!me.ok || !me.result.is_object() || !me.result.contains("id") ||
      !me.result["id"].is_number_integer()) {
    co_return Unavailable(me.error.empty() ? "getMe: an answer without the bot's id" : me.error);
  }
  const Json& name = me.result.contains("username") ? me.result["username"] : Json();
  TelegramBot bot{me.result["id"].get<int64_t>(),
                  name.is_string() ? name.get<std::string>() : std::string()};
  bots_[r.channel.id] = {asked_with, bot};
  co_return bot;
}

asio::awaitable<void> Relay::Poll(std::string tenant_id, std::string channel_id) {
  struct Done {
    Relay* relay;
    std::string id;
    ~Done() {
      relay->polling_.erase(id);
      std::erase_if(relay->bot_pollers_, [&](const auto& p) { return p.second == id; });
    }
  } done{this, channel_id};
  int failures = 0;
  while (!stopping_ && Holds(channel_id)) {
    PollRead r;
    if (!(co_await ReadChannel(tenant_id, channel_id, r)).ok()) {
      co_await Sleep(milliseconds(1000));
      continue;
    }
    if (r.gone) co_return;
    std::string failure = r.problem;
    std::string failed_cursor = r.cursor;  // what a failed round records as the poll's place
    Millis retry_after = 0;
    // Where a webhook-mode channel's updates go, and with what secret: the cursor records
    // that setWebhook took them ("webhook:HASH"; a polled channel's is "BOT_ID/UPDATE_ID").
    const std::string hook = public_url_ + "/v1/hooks/" + channel_id;
    const std::string secret = r.token.empty() ? "" : TelegramWebhookSecret(r.token, channel_id);
    const std::string marker =
        "webhook:" + Sha256Hex(hook + "\n" + secret + "\n" + kTelegramUpdates).substr(0, 16);
    const bool hooked = r.cursor.rfind("webhook:", 0) == 0;
    if (failure.empty() && r.settings.mode == "webhook") {
      if (r.cursor != marker) {
        Json set = {{"url", hook},
                    {"secret_token", secret},
                    {"allowed_updates", Json::array({"message", "callback_query"})}};
        BotAnswer got = co_await CallBot(r, "setWebhook", set, kSendTimeout);
        if (got.ok) {
          co_await RecordPoll(r, marker, "");
        } else {
          failure = got.error;
          retry_after = got.retry_after;
        }
      }
      if (failure.empty()) {
        failures = 0;
        co_await Sleep(milliseconds(2000));  // only settings changes are looked for now
        continue;
      }
    } else if (failure.empty() && hooked) {
      // Back from webhook mode: Telegram answers getUpdates 409 while a webhook is set.
      Json drop = Json::object();
      BotAnswer got = co_await CallBot(r, "deleteWebhook", drop, kSendTimeout);
      if (got.ok) {
        co_await RecordPoll(r, "", "");
        continue;
      }
      failure = got.error;
    }
    if (failure.empty()) {
      auto bot = co_await BotOf(r);
      if (!bot.ok()) failure = bot.status().message();
      // The last update handled ("BOT_ID/UPDATE_ID"). A channel keeps its bot once it handled
      // an update: update ids are per bot, and another bot's would be taken for this one's
      // (and passed over as replays). Before that ("BOT_ID/0") its token may change bots.
      std::optional<int64_t> last;
      const size_t slash = r.cursor.find('/');
      if (failure.empty() && slash != std::string::npos) {
        if (r.cursor.substr(slash + 1) == "0") {
          last = 0;
        } else if (r.cursor.substr(0, slash) != std::to_string(bot->id)) {
          failure = "its bot token is now another bot's (id " + std::to_string(bot->id) +
                    "; the channel polled bot " + r.cursor.substr(0, slash) +
                    "): a channel keeps its bot, so create a channel for the new one or put the "
                    "old token back";
        } else {
          last = std::stoll(r.cursor.substr(slash + 1));
        }
      }
      // One channel polls a bot (Telegram answers a second poller 409, and both would answer).
      // Keyed by the Bot API server too: another tenant's server may call itself any bot.
      if (failure.empty()) {
        const std::string key = r.settings.api_base + " " + std::to_string(bot->id);
        // A channel moved to another bot (or server) lets go of the one it polled.
        std::erase_if(bot_pollers_,
                      [&](const auto& p) { return p.second == channel_id && p.first != key; });
        auto [claim, fresh] = bot_pollers_.try_emplace(key, channel_id);
        if (!fresh && claim->second != channel_id && polling_.count(claim->second)) {
          failure = "its bot (id " + std::to_string(bot->id) + ") is polled by channel " +
                    claim->second + " already: a bot answers through one channel";
          // Its bot recorded all the same, so that the nodes keep it with the bot's other
          // channels (leases.h) rather than let another node poll the bot through it.
          if (!last || *last == 0) failed_cursor = std::to_string(bot->id) + "/0";
        } else {
          claim->second = channel_id;
        }
      }
      const std::string mine = failure.empty() ? std::to_string(bot->id) + "/" : "";
      // In a fleet a channel's bot is recorded before the channel's first poll of it (a new
      // channel, or one whose corrected token is another bot's), which waits for two more
      // looks: by then the nodes' plans have the bot and keep its channels on one node
      // (leases.h), so that two channels of one bot are not polled by two nodes at once (each
      // would take the same updates into its agent). Recorded only while the lease holds
      // (getMe may have taken long): the channel's new holder may have recorded more.
      const bool recorded_bot = last && r.cursor.rfind(mine, 0) == 0;
      if (failure.empty() && !recorded_bot && nodes_ > 1 && Holds(channel_id)) {
        co_await RecordPoll(r, mine + "0", "");
        const uint64_t recorded = looks_;
        while (!stopping_ && Holds(channel_id) && looks_ < recorded + 2) {
          co_await Sleep(milliseconds(500));
        }
        continue;
      }
      // Asked only while the lease holds (getMe may have taken long): a poll of a channel now
      // another node's would cut that node's poll off (409).
      if (failure.empty() && Holds(channel_id)) {
        Json ask = {{"timeout", r.settings.poll_timeout},
                    {"allowed_updates", Json::array({"message", "callback_query"})}};
        if (last && *last < INT64_MAX) ask["offset"] = *last + 1;
        const Millis asked = NowMillis();
        BotAnswer got = co_await CallBot(r, "getUpdates", ask,
                                         milliseconds(r.settings.poll_timeout * 1000 + 10000));
        if (!Holds(channel_id)) {
          // A lease that ran out meanwhile (this node was stopped, or gave the channel up):
          // the channel's new poller has these updates (and Telegram answered this poll 409).
          // The loop ends at its next look.
        } else if (!got.ok || !got.result.is_array()) {
          failure = got.error.empty() ? "getUpdates: an answer without updates" : got.error;
          retry_after = got.retry_after;
        } else {
          // The batch's updates the agent takes, by conversation: conversations at once, each
          // one's updates in order. The cursor passes the batch only when all of it is dealt
          // with (taken or passed over); else it is fetched again, and what was taken replays.
          std::optional<int64_t> highest = last;
          std::map<std::string, std::vector<TelegramInbound>> by_conversation;
          std::vector<Press> presses;  // of cards' buttons
          for (const Json& update : got.result) {
            auto routed = RouteUpdate(update, *bot);
            if (!routed.ok()) continue;  // no update_id: nothing to take, nothing to pass
            const int64_t id = std::stoll(routed->update_id);
            if (last && id <= *last) continue;  // handled before: a server that repeats itself
            if (!highest || id > *highest) highest = id;
            if (routed->take) by_conversation[routed->conversation].push_back(std::move(*routed));
            if (auto press = TelegramPress(update)) presses.push_back(std::move(*press));
          }
          // The bot goes in at the first poll, updates or not ("BOT_ID/0": offset 1 asks for
          // what no offset does), so that the nodes keep a bot's channels on one (leases.h).
          std::string cursor = highest ? mine + std::to_string(*highest)
                               : last  ? r.cursor
                                       : mine + "0";
          // A press fetched again decides nothing more ("already decided").
          for (const auto& press : presses) co_await TakePress(r, press);
          Status taken = co_await TakeAll(r, by_conversation);
          if (!taken.ok()) {
            failure = "the last updates are taken again later: " + taken.message();
            cursor = r.cursor;
          }
          if (cursor != r.cursor || failure != r.error) {
            co_await RecordPoll(r, cursor, failure);
            r.error = failure;
          }
          // A poll that brought nothing sooner than a second (a poll_timeout of 0, or a server
          // that does not wait) is not repeated at once.
          if (got.result.empty() && NowMillis() - asked < 1000) {
            co_await Sleep(milliseconds(1000 - (NowMillis() - asked)));
          }
        }
      }
    }
    if (failure.empty()) {
      failures = 0;
      continue;
    }
    if (failure != r.error || failed_cursor != r.cursor) {
      co_await RecordPoll(r, failed_cursor, failure);
    }
    ++failures;
    co_await Sleep(
        milliseconds(std::max<Millis>(retry_after, std::min<Millis>(60000, Backoff(failures)))));
  }
}

asio::awaitable<Result<int>> Relay::Pushed(std::string channel_id, std::string secret,
                                           std::string body) {
  PollRead r;
  std::string tenant_id;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(tenant_id, tx.channels().ChannelTenant(channel_id));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  if (Status st = co_await ReadChannel(tenant_id, channel_id, r); !st.ok()) co_return st;
  if (r.gone || r.settings.mode != "webhook")
    co_return NotFound("channel not found: " + channel_id);
  if (r.token.empty()) {
    // Not authenticated yet: the sender learns the channel cannot check it now, not why.
    co_return Unavailable("this channel cannot take updates now; its owner can see why");
  }
  if (!ConstantTimeEquals(secret, TelegramWebhookSecret(r.token, channel_id))) {
    co_return Unauthenticated("X-Telegram-Bot-Api-Secret-Token does not match this channel's");
  }
  if (r.suspended) co_return PermissionDenied("this channel is suspended: " + r.problem);
  if (!r.problem.empty()) co_return Unavailable("this channel cannot take updates now");
  auto update = ParseJsonObject(body);
  if (!update.ok()) co_return update.status();
  auto bot = co_await BotOf(r);
  if (!bot.ok())
    co_return Unavailable("the bot's name cannot be read now: " + bot.status().message());
  auto routed = RouteUpdate(*update, *bot);
  if (!routed.ok()) co_return routed.status();
  if (auto press = TelegramPress(*update)) {
    co_await TakePress(r, *press);
    co_return 200;
  }
  if (!routed->take) co_return 200;
  if (Status st = co_await Take(r, *routed); !st.ok()) co_return st;
  co_return 200;
}

asio::awaitable<void> Relay::Register(std::string tenant_id, std::string channel_id) {
  struct Done {
    Relay* relay;
    std::string id;
    ~Done() { relay->polling_.erase(id); }
  } done{this, channel_id};
  int failures = 0;
  while (!stopping_ && Holds(channel_id)) {
    PollRead r;  // its Telegram fields unused
    DiscordSettings settings;
    bool gone = false;
    Status st = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      auto c = tx.channels().GetChannel(tenant_id, channel_id);
      if (c.status().code() == Code::kNotFound) {
        gone = true;
        return Status::Ok();
      }
      KEEL_ASSIGN_OR_RETURN(r.channel, std::move(c));
      if (!r.channel.enabled || r.channel.kind != "discord") {
        gone = true;
        return Status::Ok();
      }
      KEEL_ASSIGN_OR_RETURN(auto agent, tx.agents().GetAgent(tenant_id, r.channel.agent_id));
      if (agent.status == "deleted") gone = true;
      KEEL_ASSIGN_OR_RETURN(auto poll, tx.channels().GetPoll(tenant_id, channel_id));
      if (poll) {
        r.cursor = poll->cursor;
        r.error = poll->error;
      }
      KEEL_ASSIGN_OR_RETURN(auto json, ParseJson(r.channel.settings));
      KEEL_ASSIGN_OR_RETURN(settings, ParseDiscordSettings(json));
      auto token = vault_.Get(tx, tenant_id, settings.bot_token);
      if (!token.ok()) {
        r.problem = "its bot token secret '" + settings.bot_token +
                    "' cannot be opened: " + token.status().message();
      } else if (token->empty() || token->find_first_of("\r\n") != std::string::npos) {
        r.problem = "its bot token secret '" + settings.bot_token + "' does not hold a bot token";
      } else {
        r.token = std::move(*token);
      }
      return Status::Ok();
    });
    if (!st.ok() || gone) {
      if (gone) co_return;
      co_await Sleep(milliseconds(1000));
      continue;
    }
    // The command Discord has, as the cursor records it: registered again when it changes.
    const std::string marker =
        "command:" + Sha256Hex(settings.application_id + "\n" + settings.command + "\n" +
                               settings.api_base + "\n" + r.token)
                         .substr(0, 16);
    std::string failure = r.problem;
    Millis retry_after = 0;
    if (failure.empty() && r.cursor != marker) {
      http::ClientRequest req;
      req.method = "POST";
      req.url = settings.api_base + "/applications/" + settings.application_id + "/commands";
      req.headers = {{"Content-Type", "application/json"}, {"Authorization", "Bot " + r.token}};
      req.body = DumpJson(DiscordCommandJson(settings.command));
      req.timeout = kSendTimeout;
      req.total = kSendTimeout;
      BotAnswer got = ReadAnswer("register /" + settings.command,
                                 co_await client_->Fetch(req, 1 << 20), r.token, "Discord");
      if (got.ok) {
        co_await RecordPoll(r, marker, "");
        failures = 0;
      } else {
        failure = got.error;
        retry_after = got.retry_after;
      }
    }
    if (failure.empty()) {
      co_await Sleep(milliseconds(2000));  // only settings changes are looked for now
      continue;
    }
    if (failure != r.error) co_await RecordPoll(r, r.cursor, failure);
    ++failures;
    co_await Sleep(
        milliseconds(std::max<Millis>(retry_after, std::min<Millis>(60000, Backoff(failures)))));
  }
}

asio::awaitable<Result<Json>> Relay::PushedDiscord(std::string channel_id, std::string timestamp,
                                                   std::string signature, std::string body) {
  // What needs no key is checked before anything is read.
  if (Status st = CheckDiscordHeaders(timestamp, signature, NowMillis()); !st.ok()) co_return st;
  store::Channel c;
  DiscordSettings settings;
  bool suspended = false;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(std::string tenant, tx.channels().ChannelTenant(channel_id));
    KEEL_ASSIGN_OR_RETURN(c, tx.channels().GetChannel(tenant, channel_id));
    if (!c.enabled || c.kind != "discord") return NotFound("channel not found: " + channel_id);
    KEEL_ASSIGN_OR_RETURN(auto agent, tx.agents().GetAgent(tenant, c.agent_id));
    if (agent.status == "deleted") return NotFound("channel not found: " + channel_id);
    KEEL_ASSIGN_OR_RETURN(auto json, ParseJson(c.settings));
    KEEL_ASSIGN_OR_RETURN(settings, ParseDiscordSettings(json));
    KEEL_ASSIGN_OR_RETURN(suspended, access::Revoked(tx, tenant, c.created_by));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  if (Status st =
          VerifyDiscordSignature(settings.public_key, timestamp, signature, body, NowMillis());
      !st.ok()) {
    co_return st;
  }
  if (suspended) {
    co_return PermissionDenied("this channel is suspended: the token that created it was revoked");
  }
  auto interaction = ParseJsonObject(body);
  if (!interaction.ok()) co_return interaction.status();
  if (interaction->value("type", Json()) == 3) {  // a button: a card's, or no one's here
    auto press = DiscordPress(*interaction);
    PressOutcome outcome{false, "This button is not one of this channel's approval cards."};
    if (press) outcome = co_await Pressed(c, *press);
    if (outcome.decided) co_return Json{{"type", 6}};  // the card is edited as every card is
    co_return Json{{"type", 4}, {"data", {{"content", outcome.notice}, {"flags", 64}}}};
  }
  auto routed = RouteInteraction(*interaction, settings, NowMillis());
  if (!routed.ok()) co_return routed.status();
  if (routed->type == 1) co_return Json{{"type", 1}};  // PONG
  if (!routed->take) {
    co_return Json{{"type", 4}, {"data", {{"content", routed->notice}, {"flags", 64}}}};
  }
  ChatMessage in{routed->interaction_id,
                 routed->conversation,
                 routed->content,
                 routed->text,
                 {"discord", routed->sender_id, routed->sender_name},
                 routed->direct,
                 routed->addressed,
                 routed->target};
  auto replayed = co_await Deliver(c, "discord:", in);
  if (!replayed.ok()) co_return replayed.status();
  co_return Json{{"type", 5}};  // deferred: the answer edits it
}

asio::awaitable<void> Relay::RecordPoll(const PollRead& read, std::string cursor,
                                        std::string error) {
  store::ChannelPoll p{read.channel.tenant_id, read.channel.id, std::move(cursor),
                       TruncateUtf8(error, 500), NowMillis()};
  // Whether the channel went from working to failing, or back (a failure worded another way,
  // a retry_after counting down, is no news).
  const bool changed = p.error.empty() != read.error.empty();
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    // A channel deleted while its poll was under way has no poll to record.
    KEEL_RETURN_IF_ERROR(tx.channels().GetChannel(p.tenant_id, p.channel_id).status());
    KEEL_RETURN_IF_ERROR(tx.channels().PutPoll(p));
    if (!changed) return Status::Ok();
    return tx.events().Append({p.tenant_id,
                               "channel.status@v1",
                               read.channel.agent_id,
                               "",
                               "",
                               {{"channel_id", p.channel_id},
                                {"status", p.error.empty() ? "ready" : "error"},
                                {"error", p.error}}});
  });
  if (!written.ok() && written.status().code() != Code::kNotFound) {
    LogError("channel " + read.channel.id +
             ": could not record its poll: " + written.status().message());
  }
}

asio::awaitable<Status> Relay::TakeAll(
    const PollRead& read, const std::map<std::string, std::vector<TelegramInbound>>& updates) {
  struct Batch {
    size_t remaining;
    Status first_error;
    asio::steady_timer done;
  };
  if (updates.empty()) co_return Status::Ok();
  auto batch =
      std::make_shared<Batch>(Batch{updates.size(), Status::Ok(), asio::steady_timer(executor_)});
  for (const auto& [conversation, ins] : updates) {
    asio::co_spawn(
        executor_,
        [this, &read, batch, &ins = ins]() -> asio::awaitable<void> {
          for (const auto& in : ins) {
            Status st = co_await Take(read, in);
            if (!st.ok()) {
              if (batch->first_error.ok()) batch->first_error = st;
              break;
            }
          }
        },
        [batch](std::exception_ptr e) {
          if (e) {
            ReportExceptions{"channel update"}(e);
            if (batch->first_error.ok()) batch->first_error = Internal("an update's handler threw");
          }
          if (--batch->remaining == 0) batch->done.cancel();
        });
  }
  while (batch->remaining > 0) {
    batch->done.expires_after(std::chrono::hours(1));
    boost::system::error_code ec;
    co_await batch->done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  co_return batch->first_error;
}

asio::awaitable<Status> Relay::Take(const PollRead& read, const TelegramInbound& update) {
  ChatMessage in{update.update_id,
                 update.conversation,
                 update.content,
                 update.text,
                 {"telegram", update.sender_id, update.sender_name},
                 update.direct,
                 update.addressed,
                 update.target};
  auto started = co_await Deliver(read.channel, "telegram:", in);
  if (!started.ok()) co_return started.status();
  if (*started) {
    // "typing..." while the run works: a courtesy, not retried.
    Json action = {{"chat_id", update.target.at("chat_id")}, {"action", "typing"}};
    if (update.target.contains("thread_id")) {
      action["message_thread_id"] = update.target.at("thread_id");
    }
    // At most a few at once per channel, each bounded in time: a Bot API server that holds
    // them open costs no more than that.
    if (typing_[read.channel.id] < kMaxTypingInFlight) {
      ++typing_[read.channel.id];
      asio::co_spawn(
          executor_,
          [this, r = read, action = std::move(action)]() -> asio::awaitable<void> {
            co_await CallBot(r, "sendChatAction", action, milliseconds(5000));
          },
          [this, id = read.channel.id](std::exception_ptr) {
            if (--typing_[id] <= 0) typing_.erase(id);
          });
    }
  }
  co_return Status::Ok();
}

int Relay::SenderRate(const std::string& agent_id, const access::Sender& sender, bool count) {
  const Millis now = NowMillis();
  const Millis minute = now - now % 60000;
  if (sender_rates_.size() > 10000) {
    std::erase_if(sender_rates_, [&](const auto& kv) { return kv.second.first != minute; });
  }
  auto& [start, sent] = sender_rates_[agent_id + "|" + sender.platform + ":" + sender.id];
  if (start != minute) std::tie(start, sent) = std::pair(minute, 0);
  if (count) ++sent;
  return sent;
}

asio::awaitable<Result<bool>> Relay::Deliver(const store::Channel& c, const std::string& key_prefix,
                                             const ChatMessage& in) {
  // A platform's message is at most this long (Telegram's 4,096 characters, Slack's 40,000): a
  // longer one, which only a server posing as the platform sends, is passed over.
  if (in.content.size() > kMaxInboundBytes) {
    LogError("channel " + c.id + ": delivery " + in.delivery_id + " passed over: its text has " +
             std::to_string(in.content.size()) + " bytes");
    co_return false;
  }
  // This one counts once it is known not to be a replay (a platform's retry, a batch fetched
  // again); two at once may both see the count before the other.
  const int recent = SenderRate(c.agent_id, in.sender, false) + 1;
  auto admitted = co_await AdmitDelivery(store_, vault_, c, in, recent);
  if (!admitted.ok()) co_return admitted.status();
  if (!admitted->replay && in.addressed) SenderRate(c.agent_id, in.sender, true);
  if (!admitted->take) {
    if (!admitted->notice.empty()) WakeSender();
    co_return false;
  }
  Json payload = {{"agent_id", c.agent_id},
                  {"channel_id", c.id},
                  {"kind", c.kind},
                  {"conversation", in.conversation},
                  {"delivery_id", in.delivery_id},
                  {"content", in.content},
                  {"drop", false}};
  auto kept = co_await runtime_.ChannelMessage("channel.message.in", c.tenant_id, c.agent_id,
                                               std::move(payload));
  if (!kept.ok()) {
    LogError("channel " + c.id + ": delivery " + in.delivery_id +
             " refused by a plugin: " + kept.status().message());
    co_return false;
  }
  if (!*kept) co_return false;  // dropped by a plugin
  // An error here (the channel deleted, disabled or suspended meanwhile; the store) leaves the
  // delivery to be taken again: a poll's cursor stays before it, a push is answered non-2xx.
  const std::string contact = in.direct ? in.sender.id : "";
  auto session = co_await RecordDelivery(store_, c, in.delivery_id, in.conversation, contact);
  if (!session.ok()) co_return session.status();
  // The answer the run owes, recorded with the message and its run (waiting for the run's end).
  store::ChannelReply reply;
  reply.id = NewId();
  reply.tenant_id = c.tenant_id;
  reply.channel_id = c.id;
  reply.agent_id = c.agent_id;
  reply.session_id = *session;
  reply.delivery_id = in.delivery_id;
  reply.target = DumpJson(in.target);
  reply.user_id = admitted->user_id;
  reply.created_at = reply.updated_at = NowMillis();
  runtime::IntakeRequest intake;
  intake.tenant_id = c.tenant_id;
  intake.session_id = *session;
  intake.content = std::move(**kept);
  intake.idempotency_key = key_prefix + in.delivery_id;
  intake.requested_by = c.created_by;
  intake.caller_role = admitted->role;
  intake.user_id = admitted->user_id;
  intake.channel_id = c.id;
  intake.with_run = [reply](store::Tx& tx, const store::Run& run) {
    store::ChannelReply r = reply;
    r.run_id = run.id;
    return tx.channels().InsertReply(r);
  };
  auto posted = co_await runtime_.PostMessage(intake);
  if (!posted.ok()) {
    const Code code = posted.status().code();
    if (code == Code::kRateLimited || code == Code::kUnavailable || code == Code::kInternal) {
      co_return posted.status();
    }
    // Refused for good (a closed session, a message too long): the delivery is passed over.
    LogError("channel " + c.id + ": delivery " + in.delivery_id +
             " not posted: " + posted.status().message());
    co_return false;
  }
  if (posted->replayed) {
    // Posted before, by a node that may have stopped before its reply was recorded (a store
    // written before replies were recorded with their runs): recorded now unless it was.
    reply.run_id = posted->run.id;
    auto written = co_await store::AsyncWrite(
        store_, [&](store::Tx& tx) -> Status { return tx.channels().InsertReply(reply); });
    if (!written.ok() && written.status().code() != Code::kConflict) co_return written.status();
  }
  asio::co_spawn(executor_, AwaitRun(c.tenant_id, posted->run.id, posted->replayed ? "" : reply.id),
                 asio::detached);
  co_return !posted->replayed;
}

asio::awaitable<Result<Json>> Relay::PushedSlack(std::string channel_id, std::string timestamp,
                                                 std::string signature, std::string body) {
  // What needs no key is checked before anything is read.
  if (Status st = CheckSlackHeaders(timestamp, signature, NowMillis()); !st.ok()) co_return st;
  store::Channel c;
  SlackSettings settings;
  std::string signing, problem;
  bool suspended = false;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(std::string tenant, tx.channels().ChannelTenant(channel_id));
    KEEL_ASSIGN_OR_RETURN(c, tx.channels().GetChannel(tenant, channel_id));
    if (!c.enabled || c.kind != "slack") return NotFound("channel not found: " + channel_id);
    KEEL_ASSIGN_OR_RETURN(auto agent, tx.agents().GetAgent(tenant, c.agent_id));
    if (agent.status == "deleted") return NotFound("channel not found: " + channel_id);
    KEEL_ASSIGN_OR_RETURN(auto json, ParseJson(c.settings));
    KEEL_ASSIGN_OR_RETURN(settings, ParseSlackSettings(json));
    KEEL_ASSIGN_OR_RETURN(suspended, access::Revoked(tx, tenant, c.created_by));
    auto opened = vault_.Get(tx, tenant, settings.signing_secret);
    if (!opened.ok() || opened->size() < 16) {
      // Not authenticated yet: the sender learns the channel cannot check it now, not why.
      return Unavailable("this channel cannot check signatures now; its owner can see why");
    }
    signing = std::move(*opened);
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  if (Status st = VerifySlackSignature(signing, timestamp, signature, body, NowMillis());
      !st.ok()) {
    co_return st;
  }
  if (suspended) {
    co_return PermissionDenied("this channel is suspended: the token that created it was revoked");
  }
  if (body.rfind("payload=", 0) == 0) {  // an interactivity request: a card's button
    auto payload = ParseJsonObject(FormField(body, "payload"));
    if (!payload.ok()) co_return payload.status();
    auto press = SlackPress(*payload);
    if (!press) co_return Json::object();  // another app's button: nothing to do
    PressOutcome outcome = co_await Pressed(c, *press);
    if (!outcome.decided && !press->message.value("channel", std::string()).empty()) {
      // Told to the presser alone, as a courtesy: not retried.
      asio::co_spawn(
          executor_,
          [this, c, settings, who = press->sender.id, where = press->message,
           notice = outcome.notice]() -> asio::awaitable<void> {
            std::string token;
            Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
              KEEL_ASSIGN_OR_RETURN(token, vault_.Get(tx, c.tenant_id, settings.bot_token));
              return Status::Ok();
            });
            if (!read.ok() || token.empty() || token.find_first_of("\r\n") != std::string::npos) {
              co_return;
            }
            http::ClientRequest req;
            req.method = "POST";
            req.url = settings.api_base + "/chat.postEphemeral";
            req.headers = {{"Content-Type", "application/json; charset=utf-8"},
                           {"Authorization", "Bearer " + token}};
            Json ephemeral = {{"channel", where.value("channel", std::string())},
                              {"user", who},
                              {"text", notice}};
            if (where.contains("thread_ts")) ephemeral["thread_ts"] = where["thread_ts"];
            req.body = DumpJson(ephemeral);
            req.timeout = milliseconds(5000);
            req.total = milliseconds(5000);
            co_await client_->Fetch(req, 1 << 20);
          },
          asio::detached);
    }
    co_return Json::object();
  }
  auto envelope = ParseJsonObject(body);
  if (!envelope.ok()) co_return envelope.status();
  if (envelope->value("type", Json()) == "url_verification") {
    const Json& challenge = envelope->contains("challenge") ? (*envelope)["challenge"] : Json();
    if (!challenge.is_string()) co_return InvalidArgument("a url_verification without a challenge");
    co_return Json{{"challenge", challenge}};
  }
  auto routed = RouteSlackEvent(*envelope);
  if (!routed.ok()) co_return routed.status();
  if (routed->take && routed->in_thread) {
    // A reply in a thread the agent talks in (it was called there before) calls it too.
    bool known = false;
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto found,
                            tx.channels().GetConversation(c.tenant_id, c.id, routed->conversation));
      known = found.has_value();
      return Status::Ok();
    });
    if (!read.ok()) co_return read;
    routed->addressed = known;
  }
  if (routed->take) {
    ChatMessage in{routed->event_id,
                   routed->conversation,
                   routed->content,
                   routed->text,
                   {"slack", routed->sender_id, routed->sender_name},
                   routed->direct,
                   routed->addressed,
                   routed->target};
    in.quiet = routed->in_thread;
    auto replayed = co_await Deliver(c, "slack:", in);
    if (!replayed.ok()) co_return replayed.status();
  }
  co_return Json{{"ok", true}};
}

asio::awaitable<void> Relay::AwaitRun(std::string tenant_id, std::string run_id,
                                      std::string reply_id) {
  runtime::SubscriptionFilter filter;
  filter.tenant_id = tenant_id;
  filter.run_id = run_id;
  filter.deltas = false;
  auto sub = hub_.Subscribe(filter);
  struct Forget {
    Relay& relay;
    runtime::EventHub::SubscriptionPtr sub;
    std::string run_id;
    bool awaited;
    ~Forget() {
      relay.hub_.Unsubscribe(sub);
      if (awaited) relay.awaited_.erase(run_id);
    }
  } forget{*this, sub, run_id, false};
  if (!reply_id.empty())
    forget.awaited = awaited_.try_emplace(run_id, Awaited{tenant_id, reply_id}).second;
  // The sender's sweep finds an ended run within a second anyway: this only spares the wait,
  // for as long as a turn usually takes.
  const Millis until = NowMillis() + 10 * 60 * 1000;
  while (!stopping_ && !hub_.closing() && NowMillis() < until) {
    if (auto settled = hub_.TakeSettled(sub); settled && settled->Terminal()) break;
    bool ended = false, parked = false;
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(tenant_id, run_id));
      ended = run.Terminal();
      parked = run.status == "waiting_for_approval";
      return Status::Ok();
    });
    if (!read.ok() || ended) break;
    if (parked) WakeSender();  // its approval's cards are sent now rather than within a second
    co_await hub_.Wait(sub, milliseconds(30000));
  }
  WakeSender();
}

runtime::EndingWork Relay::ClaimAtEnd(const store::Run& run) {
  auto it = awaited_.find(run.id);
  if (it == awaited_.end() || it->second.reserved || stopping_ || !store_.leader() ||
      sending_.Size() >= kMaxInFlight ||
      (tenant_sending_.count(run.tenant_id) &&
       tenant_sending_.at(run.tenant_id) >= kMaxTenantInFlight)) {
    return {};  // claimed by the sender's next round, as any other
  }
  // In flight from now on: no round of the sender claims it, or takes its claim for a stale one
  // of this node (a round's unit reads sending_ as it runs, whenever it was queued).
  Awaited& a = it->second;
  a.reserved = true;
  sending_.Add(a.reply_id);
  ++tenant_sending_[a.tenant_id];
  // The claim as the ending's unit wrote it (its last run's), handed to `after` by the commit.
  auto claimed = std::make_shared<std::optional<store::ChannelReply>>();
  runtime::EndingWork work;
  work.write = [reply_id = a.reply_id, origin = store_.origin(), claimed](
                   store::Tx& tx, const store::Run& ended) -> Status {
    claimed->reset();
    KEEL_ASSIGN_OR_RETURN(auto reply, tx.channels().RunReply(ended.tenant_id, ended.id));
    if (!reply || reply->id != reply_id || reply->status != "waiting") return Status::Ok();
    ClaimAnswer(*reply, ended, origin, NowMillis());
    KEEL_RETURN_IF_ERROR(tx.channels().UpdateReply(*reply));
    if (reply->status == "sending") *claimed = std::move(*reply);
    return Status::Ok();
  };
  work.after = [this, run_id = run.id, reply_id = a.reply_id, tenant_id = a.tenant_id,
                claimed](bool committed) {
    if (auto found = awaited_.find(run_id); found != awaited_.end()) {
      found->second.reserved = false;  // a later ending may claim it if this one failed
    }
    if (committed && *claimed) {
      // Claimed: sent at once, stopping or not (a claim is sent, as the sweep's are).
      asio::co_spawn(executor_, Send(std::move(**claimed)), ReportExceptions{"channel reply"});
      return;
    }
    sending_.Remove(reply_id);
    if (--tenant_sending_[tenant_id] <= 0) tenant_sending_.erase(tenant_id);
    WakeSender();
  };
  return work;
}

// ---- Sending

asio::awaitable<void> Relay::SendLoop() {
  while (!stopping_) {
    if (!send_wake_) {
      send_timer_.expires_after(std::chrono::seconds(1));
      boost::system::error_code ec;
      co_await send_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    send_wake_ = false;
    if (stopping_ || !store_.leader() || sending_.Size() >= kMaxInFlight) continue;
    // Claimed in one unit, each "sending" before any request of it leaves this node: a crash
    // from here on leaves it sending, which the next round (of this node restarted, or of
    // another once the claim ran out) makes unknown rather than sending it again.
    std::vector<store::ChannelReply> claimed;
    const Millis now = NowMillis();
    const std::string origin = store_.origin();
    const int room = std::min<int>(kBatch, static_cast<int>(kMaxInFlight - sending_.Size()));
    // The unit runs on the store's writer thread: it sees this node's sends as they are when it
    // runs (a run's ending may have claimed one since this round began), and a copy of their
    // count by tenant.
    const InFlight& in_flight = sending_;
    const std::map<std::string, int> tenants_in_flight = tenant_sending_;
    std::vector<std::pair<std::string, std::string>> to_card;  // approvals without cards
    auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      claimed.clear();
      KEEL_ASSIGN_OR_RETURN(to_card, tx.channels().ApprovalsToCard(kBatch));
      KEEL_ASSIGN_OR_RETURN(
          auto due,
          tx.channels().DueReplies(now, origin, 4 * kBatch + static_cast<int>(in_flight.Size())));
      std::map<std::string, int> busy = tenants_in_flight;
      for (auto& r : due) {
        if (in_flight.Has(r.id)) continue;  // this node is sending it now
        // A stale "sending" is settled whatever the room; one to send waits for room.
        if (r.status != "sending" &&
            (static_cast<int>(claimed.size()) >= room || busy[r.tenant_id] >= kMaxTenantInFlight)) {
          continue;
        }
        std::string event;
        r.updated_at = now;
        if (r.status == "sending" && !r.message.empty()) {
          r.status = "shown";  // a card's edit cut: editing again changes nothing more
        } else if (r.status == "sending") {
          r.attempts += 1;  // the one cut
          r.status = "unknown";
          r.error =
              "the node sending it stopped between a request and its answer: the platform may "
              "or may not have it, so it is not sent again";
          event = "channel.reply_failed@v1";
        } else if (r.status == "waiting") {
          KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(r.tenant_id, r.run_id));
          ClaimAnswer(r, run, origin, now);
        } else {
          r.status = "sending";
        }
        if (r.status == "sending") {
          r.origin = origin;
          r.next_attempt_at = now + kClaimMs;
          claimed.push_back(r);
          ++busy[r.tenant_id];
        }
        KEEL_RETURN_IF_ERROR(tx.channels().UpdateReply(r));
        if (!event.empty()) {
          KEEL_RETURN_IF_ERROR(tx.events().Append({r.tenant_id,
                                                   event,
                                                   r.agent_id,
                                                   r.session_id,
                                                   "",
                                                   {{"channel_id", r.channel_id},
                                                    {"reply_id", r.id},
                                                    {"run_id", r.run_id},
                                                    {"status", r.status},
                                                    {"error", r.error}}}));
        }
      }
      return Status::Ok();
    });
    if (!written.ok()) {
      LogError("could not claim channel replies: " + written.status().message());
      continue;
    }
    // Each approval's cards in a unit of its own: one that cannot be carded holds no other back.
    for (const auto& [tenant, approval] : to_card) {
      auto opened = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
        return OpenCards(tx, tenant, approval, NowMillis());
      });
      if (opened.ok()) {
        send_wake_ = true;  // the next round sends them
      } else {
        LogError("approval " + approval +
                 ": could not record its cards: " + opened.status().message());
      }
    }
    for (auto& r : claimed) {
      sending_.Add(r.id);
      ++tenant_sending_[r.tenant_id];
      asio::co_spawn(executor_, Send(std::move(r)), ReportExceptions{"channel reply"});
    }
  }
}

asio::awaitable<bool> Relay::Record(const store::ChannelReply& r, bool card_shown) {
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.channels().UpdateReply(r));
    Json payload = {{"channel_id", r.channel_id}, {"reply_id", r.id}, {"run_id", r.run_id}};
    const char* type = nullptr;
    if (card_shown) {
      type = "channel.card_shown@v1";
      payload["approval_id"] = r.approval_id;
    } else if (r.status == "sent") {
      type = "channel.replied@v1";
      payload["parts"] = r.parts_sent;
    } else if (r.status == "dead" || r.status == "unknown") {
      type = "channel.reply_failed@v1";
      payload["status"] = r.status;
      payload["error"] = r.error;
    }
    if (type == nullptr) return Status::Ok();
    return tx.events().Append(
        {r.tenant_id, type, r.agent_id, r.session_id, "", std::move(payload)});
  });
  if (!written.ok() && written.status().code() != Code::kNotFound) {
    LogError("channel reply " + r.id + ": could not record it " + r.status + ": " +
             written.status().message());
    co_return false;
  }
  co_return true;
}

asio::awaitable<void> Relay::Send(store::ChannelReply r) {
  struct Done {
    Relay* relay;
    std::string id, tenant;
    ~Done() {
      relay->sending_.Remove(id);
      if (--relay->tenant_sending_[tenant] <= 0) relay->tenant_sending_.erase(tenant);
      relay->WakeSender();  // room for the next one
    }
  } done{this, r.id, r.tenant_id};

  // How to send on the channel's platform: where, with which token.
  SendingHow how;
  Status read = co_await store::AsyncRead(
      store_, [&](store::Tx& tx) -> Status { return ReadHow(tx, vault_, r, how); });
  if (!read.ok()) co_return;  // deleted with its channel, or the store: its claim runs out
  std::string kind = std::move(how.kind), api_base = std::move(how.api_base),
              token = std::move(how.token), refusal = std::move(how.refusal);

  auto retry = [&](const std::string& why, Millis after) {
    r.attempts += 1;
    r.error = TruncateUtf8(why, 500);
    r.updated_at = NowMillis();
    if (r.attempts >= kMaxAttempts) {
      r.status = "dead";
    } else {
      r.status = "pending";
      r.next_attempt_at = r.updated_at + std::max(after, Backoff(r.attempts));
    }
  };
  // channel.message.out@v1 before the answer's first request, once: the text it leaves is
  // recorded with the attempt, and an answer tried again (a 429, a 500, a channel refused for
  // now) is that text as it was sent the first time, not transformed again.
  if (r.approval_id.empty() && r.attempts == 0) {
    Json out = {{"agent_id", r.agent_id}, {"channel_id", r.channel_id}, {"kind", kind},
                {"reply_id", r.id},       {"run_id", r.run_id},         {"content", r.text},
                {"drop", false}};
    auto kept = co_await runtime_.ChannelMessage("channel.message.out", r.tenant_id, r.agent_id,
                                                 std::move(out), std::move(how.stamps));
    if (!kept.ok()) {
      r.status = "dead";
      r.error = TruncateUtf8(kept.status().message(), 500);
      r.updated_at = NowMillis();
      co_await Record(r);
      co_return;
    }
    if (!*kept) {
      r.status = "skipped";
      r.updated_at = NowMillis();
      co_await Record(r);
      co_return;
    }
    r.text = std::move(**kept);
  }
  if (!refusal.empty()) {
    retry(refusal, 0);
    co_await Record(r);
    co_return;
  }
  if (!r.approval_id.empty()) {
    co_await SendCard(std::move(r), std::move(kind), std::move(api_base), std::move(token));
    co_return;
  }
  auto target = ParseJson(r.target);
  const bool slack = kind == "slack", discord = kind == "discord";
  std::string token_in_url;
  const std::vector<std::string> parts = ReplyParts(r.text,
                                                    slack     ? kSlackMaxText
                                                    : discord ? kDiscordMaxText
                                                              : kTelegramMaxText,
                                                    /*escape=*/!discord);
  std::string method = slack ? "chat.postMessage" : discord ? "the answer" : "sendMessage";
  const std::string platform = slack ? "Slack" : discord ? "Discord" : "Telegram";
  while (r.parts_sent < static_cast<int>(parts.size())) {
    http::ClientRequest req;
    req.method = "POST";
    const Json& to = target.ok() ? *target : Json::object();
    if (discord) {
      // Through the interaction's token while it is good (the first part edits the deferred
      // response), else to the channel as the bot. No mention in an answer pings anyone.
      const std::string interaction = to.value("token", std::string());
      const std::string app = to.value("application_id", std::string());
      const Json& at = to.contains("at") ? to["at"] : Json();
      const bool fresh = at.is_number_integer() && NowMillis() - at.get<Millis>() < kDiscordTokenMs;
      if (fresh && r.parts_sent == 0) {
        req.method = "PATCH";
        req.url = api_base + "/webhooks/" + app + "/" + interaction + "/messages/@original";
        method = "edit the deferred response";
      } else if (fresh) {
        req.url = api_base + "/webhooks/" + app + "/" + interaction;
        method = "follow-up";
      } else {
        req.url = api_base + "/channels/" + to.value("channel_id", std::string()) + "/messages";
        req.headers = {{"Authorization", "Bot " + token}};
        method = "channel message";
      }
      req.headers.push_back({"Content-Type", "application/json"});
      req.body = DumpJson(
          Json{{"content", parts[r.parts_sent]}, {"allowed_mentions", {{"parse", Json::array()}}}});
      // The interaction's token is a credential in the URL: cut out of errors as the bot's is.
      token_in_url = interaction;
    } else if (slack) {
      req.url = api_base + "/chat.postMessage";
      req.headers = {{"Content-Type", "application/json; charset=utf-8"},
                     {"Authorization", "Bearer " + token}};
      req.body = DumpJson(SlackPostBody(to, parts[r.parts_sent]));
    } else {
      req.url = api_base + "/bot" + token + "/sendMessage";
      req.headers = {{"Content-Type", "application/json"}};
      req.body = DumpJson(SendMessageBody(to, parts[r.parts_sent], r.parts_sent));
    }
    req.timeout = kSendTimeout;
    req.total = kSendTimeout;
    req.may_repeat = false;
    auto got = co_await client_->Fetch(req, 1 << 20);
    BotAnswer a = ReadAnswer(method, got, discord ? token_in_url : token, platform);
    r.updated_at = NowMillis();
    if (a.ok) {
      r.parts_sent += 1;
      r.attempts += 1;
      r.error.clear();
      if (r.parts_sent == static_cast<int>(parts.size())) break;
      r.next_attempt_at = r.updated_at + kClaimMs;  // still sending: the claim goes on
      if (!co_await Record(r)) co_return;
      continue;
    }
    // What may have reached the platform without its answer reaching Keel: a connection cut
    // after the request went, a gateway's 502 or 504 (it may have passed the request on), a
    // 2xx whose body is not the platform's answer.
    const bool cut = !got.ok() && !NeverSent(got.status());
    const bool gateway = got.ok() && (got->status == 502 || got->status == 504);
    const bool unreadable = got.ok() && got->status / 100 == 2 && !ParseJson(got->body).ok();
    if (cut || gateway || unreadable) {
      r.attempts += 1;
      r.status = "unknown";
      r.error = TruncateUtf8(
          a.error + ": " + platform + " may or may not have it, so it is not sent again", 500);
    } else if (got.ok() && got->status == 429) {
      retry(a.error, std::max<Millis>(a.retry_after, 1000));
    } else if (!got.ok() || got->status >= 500) {
      retry(a.error, 0);
    } else {
      r.attempts += 1;
      r.status = "dead";
      r.error = TruncateUtf8(a.error, 500);
    }
    co_await Record(r);
    co_return;
  }
  r.status = parts.empty() ? "skipped" : "sent";
  co_await Record(r);
}

// ---- Approval cards

asio::awaitable<void> Relay::SendCard(store::ChannelReply r, std::string kind, std::string api_base,
                                      std::string token) {
  store::Approval a;
  std::string decider;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(a, tx.approvals().GetApproval(r.tenant_id, r.approval_id));
    // As a person reads it, whoever sees the card: a name, never an id.
    if (a.decided_by.rfind("user:", 0) == 0) {
      auto user = tx.users().GetUser(r.tenant_id, a.decided_by.substr(5));
      decider = user.ok() ? user->name : "a user";
    } else if (a.decided_by == "system") {
      decider = "Keel";
    } else {
      decider = "an API token";
    }
    return Status::Ok();
  });
  if (!read.ok()) {
    // Nothing was sent: put back to be sent later (if the store takes even that, else its claim
    // runs out, and a card not yet shown is then unknown).
    r.status = r.message.empty() ? "pending" : "shown";
    r.next_attempt_at = NowMillis() + 1000;
    r.updated_at = NowMillis();
    co_await Record(r);
    co_return;
  }
  const bool edit = !r.message.empty();
  if (!edit && a.status != "pending") {
    r.status = "skipped";
    r.error = "its approval was decided (" + a.status + ") before the card was shown";
    r.updated_at = NowMillis();
    co_await Record(r);
    co_return;
  }
  if (edit && a.status == "pending") {  // a claim of a card not yet to close
    r.status = "shown";
    co_await Record(r);
    co_return;
  }
  auto target = ParseJson(edit ? r.message : r.target);
  const Json to = target.ok() && target->is_object() ? *target : Json::object();
  const std::string text = edit ? DecidedText(a, decider) : r.text;
  const std::string platform = kind == "slack"     ? "Slack"
                               : kind == "discord" ? "Discord"
                                                   : "Telegram";
  http::ClientRequest req;
  req.method = "POST";
  std::string method;
  if (kind == "slack") {
    method = edit ? "chat.update" : "chat.postMessage";
    req.url = api_base + "/" + method;
    req.headers = {{"Content-Type", "application/json; charset=utf-8"},
                   {"Authorization", "Bearer " + token}};
    req.body = DumpJson(edit ? SlackEditBody(to, text) : SlackCardBody(to, text, a.id));
  } else if (kind == "discord") {
    const std::string channel = to.value("channel_id", std::string());
    method = edit ? "edit the card" : "the card";
    req.method = edit ? "PATCH" : "POST";
    req.url = api_base + "/channels/" + channel + "/messages" +
              (edit ? "/" + to.value("message_id", std::string()) : "");
    req.headers = {{"Content-Type", "application/json"}, {"Authorization", "Bot " + token}};
    req.body = DumpJson(edit ? DiscordEditBody(text) : DiscordCardBody(text, a.id));
  } else {
    method = edit ? "editMessageText" : "sendMessage";
    req.url = api_base + "/bot" + token + "/" + method;
    req.headers = {{"Content-Type", "application/json"}};
    req.body = DumpJson(edit ? TelegramEditBody(to, text) : TelegramCardBody(to, text, a.id));
  }
  req.timeout = kSendTimeout;
  req.total = kSendTimeout;
  req.may_repeat = false;
  auto got = co_await client_->Fetch(req, 1 << 20);
  BotAnswer answer = ReadAnswer(method, got, token, platform);
  r.updated_at = NowMillis();
  r.attempts += 1;
  // Telegram refuses an edit that changes nothing: the card says it already.
  const bool unchanged =
      edit && !answer.ok && answer.error.find("message is not modified") != std::string::npos;
  if (answer.ok || unchanged) {
    r.error.clear();
    if (edit) {
      r.status = "sent";
      r.text = text;
    } else {
      auto body = ParseJson(got->body);
      auto where = CardMessage(kind, body.ok() ? *body : Json());
      r.status = "shown";
      // Shown, but where is not known: it cannot be edited once decided (its buttons then
      // answer "already decided").
      if (where.ok()) {
        r.message = DumpJson(*where);
      } else {
        r.error = method + ": " + where.status().message();
      }
    }
    co_await Record(r, /*card_shown=*/!edit);
    co_return;
  }
  auto again = [&](Millis after) {
    r.error = TruncateUtf8(answer.error, 500);
    if (r.attempts >= kMaxAttempts) {
      r.status = "dead";
    } else {
      r.status = "pending";
      r.next_attempt_at = r.updated_at + std::max(after, Backoff(r.attempts));
    }
  };
  const bool cut = !got.ok() && !NeverSent(got.status());
  const bool gateway = got.ok() && (got->status == 502 || got->status == 504);
  const bool unreadable = got.ok() && got->status / 100 == 2 && !ParseJson(got->body).ok();
  if (!edit && (cut || gateway || unreadable)) {
    // A card the platform may have: never shown twice.
    r.status = "unknown";
    r.error = TruncateUtf8(
        answer.error + ": " + platform + " may or may not have it, so it is not sent again", 500);
  } else if (got.ok() && got->status == 429) {
    again(std::max<Millis>(answer.retry_after, 1000));
  } else if (!got.ok() || got->status >= 500 || cut || gateway || unreadable) {
    again(0);  // an edit again changes nothing more
  } else {
    r.status = "dead";
    r.error = TruncateUtf8(answer.error, 500);
  }
  co_await Record(r);
}

asio::awaitable<PressOutcome> Relay::Pressed(const store::Channel& c, const Press& p) {
  if (p.approval_id.empty()) {
    co_return PressOutcome{false, "This button is not one of this agent's approval cards."};
  }
  PressOutcome outcome;
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(outcome, DecidePress(tx, c, p, NowMillis()));
    return Status::Ok();
  });
  if (!written.ok()) {
    LogError("channel " + c.id + ": a press on approval " + p.approval_id +
             " could not be recorded: " + written.status().message());
    co_return PressOutcome{false, "Keel could not record that now: press again in a moment."};
  }
  if (outcome.decided) {
    runtime_.Wake();  // the run goes on
    WakeSender();     // its cards are edited
  }
  co_return outcome;
}

asio::awaitable<void> Relay::TakePress(const PollRead& read, const Press& p) {
  PressOutcome outcome = co_await Pressed(read.channel, p);
  Json answer = {{"callback_query_id", p.handle},
                 {"text", TruncateUtf8(outcome.notice, 190)},
                 {"show_alert", !outcome.decided}};
  co_await CallBot(read, "answerCallbackQuery", answer, milliseconds(5000));
}

}  // namespace keel::channels

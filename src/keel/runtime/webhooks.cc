// Webhook plugins: events off the hot path, delivered by HTTP POST from the store.
//
// An emitted event that an agent's webhook plugin subscribes to becomes a pending delivery
// (its payload converted to the version the plugin asked for): tool.after in the unit of work
// that records the call's result, the others in a unit of their own right after the commit
// they are about. The leader sends due
// deliveries: a JSON body {"id", "event", "tenant_id", "agent_id", "created_at", "payload"},
// signed with HMAC-SHA256 under the tenant secret the plugin's config names
// (Keel-Signature: v1=HEX over "TIMESTAMP.BODY", Keel-Timestamp: unix seconds). A 2xx answer
// delivers it; anything else (another status, no answer within timeout_ms) is retried after
// 1 s, 2 s, 4 s, ... (at most an hour) until max_attempts, then the delivery is dead and waits
// for a replay (POST /v1/plugins/{id}/deliveries/{delivery}/replay).

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/log.h"
#include "keel/http/client.h"
#include "keel/plugins/catalog.h"
#include "keel/plugins/host.h"
#include "keel/plugins/manifest.h"
#include "keel/runtime/plugin_bridge.h"
#include "keel/secrets/vault.h"
#include "keel/store/async.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

constexpr int kBatch = 32;           // deliveries read per round
constexpr size_t kMaxInFlight = 16;  // sent at once by this node
constexpr Millis kMaxBackoffMs = 3600 * 1000;
// A claimed delivery is due again after this if its attempt never reports (its node died).
constexpr Millis kClaimMs = 5 * 60 * 1000;

}  // namespace

void PluginBridge::QueueDeliveries(const plugins::AgentPlugins& plugins, const std::string& family,
                              const Json& payload) {
  std::vector<store::PluginDelivery> queued = DeliveriesFor(plugins, family, payload);
  if (queued.empty()) return;
  auto insert = [this, queued]() -> asio::awaitable<void> {
    auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      for (const auto& d : queued) KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
      return Status::Ok();
    });
    if (!written.ok()) {
      LogError("could not queue webhook deliveries: " + written.status().message());
      co_return;
    }
    WakeDeliveries();
  };
  asio::co_spawn(executor_, std::move(insert), asio::detached);
}

std::vector<store::PluginDelivery> PluginBridge::DeliveriesFor(const plugins::AgentPlugins& plugins,
                                                          const std::string& family,
                                                          const Json& payload) const {
  const int newest = plugins::NewestVersion(family);
  std::vector<store::PluginDelivery> queued;
  Millis now = NowMillis();
  for (const auto& w : plugins.webhooks) {
    for (const auto& event : w.events) {
      const plugins::EventType* type = plugins::FindEvent(event);
      if (!type || type->family != family) continue;
      store::PluginDelivery d;
      d.id = NewId();
      d.tenant_id = plugins.tenant_id;
      d.plugin_id = w.plugin_id;
      d.agent_id = plugins.agent_id;
      d.event_type = event;
      d.payload = type->version == newest ? payload
                                          : plugins::ConvertDown(family, type->version, payload);
      d.next_attempt_at = now;
      d.created_at = now;
      queued.push_back(std::move(d));
    }
  }
  return queued;
}

void PluginBridge::WakeDeliveries() {
  delivery_wake_ = true;
  delivery_timer_.cancel();
}

asio::awaitable<void> PluginBridge::DeliveryLoop() {
  while (!stopping_) {
    if (!delivery_wake_) {
      delivery_timer_.expires_after(std::chrono::seconds(1));
      boost::system::error_code ec;
      co_await delivery_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    delivery_wake_ = false;
    if (stopping_ || !store_.leader() || delivering_.size() >= kMaxInFlight) continue;
    // Claim what is due in one unit: each is not due again until this attempt has had its
    // time (its answer, or this node's crash, then decides), so a list read while other
    // deliveries were in flight never sends one twice.
    std::vector<store::PluginDelivery> due;
    Millis now = NowMillis();
    int room = std::min<int>(kBatch, static_cast<int>(kMaxInFlight - delivering_.size()));
    auto claimed = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      due.clear();
      KEEL_ASSIGN_OR_RETURN(due, tx.plugins().DueDeliveries(now, room));
      for (auto& d : due) {
        d.next_attempt_at = now + kClaimMs;
        KEEL_RETURN_IF_ERROR(tx.plugins().UpdateDelivery(d));
      }
      return Status::Ok();
    });
    if (!claimed.ok()) continue;
    for (auto& d : due) {
      if (!delivering_.insert(d.id).second) continue;  // still being sent
      asio::co_spawn(executor_, Deliver(std::move(d)), ReportExceptions{"webhook delivery"});
    }
  }
}

asio::awaitable<void> PluginBridge::Deliver(store::PluginDelivery d) {
  struct Done {
    PluginBridge* bridge;
    std::string id;
    ~Done() {
      bridge->delivering_.erase(id);
      bridge->WakeDeliveries();  // room for the next one
    }
  } done{this, d.id};

  store::Plugin plugin;
  std::string secret;
  std::string refusal;  // why it cannot be sent at all
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(plugin, tx.plugins().GetPlugin(d.tenant_id, d.plugin_id));
    std::string name = plugin.config.value("secret", "");
    if (!vault_) {
      refusal = "secrets are disabled: the delivery cannot be signed";
      return Status::Ok();
    }
    auto opened = vault_->Get(tx, d.tenant_id, name);
    if (!opened.ok()) {
      refusal = "the signing secret " + name + " cannot be opened: " + opened.status().message();
    } else {
      secret = *opened;
    }
    return Status::Ok();
  });
  if (!read.ok()) co_return;  // deleted meanwhile (its deliveries went with it), or the store
  auto manifest = plugins::ParseManifest(plugin.manifest);
  if (!manifest.ok()) co_return;

  int status = 0;
  std::string error = refusal;
  if (refusal.empty()) {
    Json body = {{"id", d.id},
                 {"event", d.event_type},
                 {"tenant_id", d.tenant_id},
                 {"agent_id", d.agent_id},
                 {"created_at", FormatRfc3339(d.created_at)},
                 {"payload", d.payload}};
    http::ClientRequest req;
    req.method = "POST";
    req.url = manifest->url;
    req.body = DumpJson(body);
    req.timeout = std::chrono::milliseconds(manifest->timeout_ms);
    std::string timestamp = std::to_string(NowMillis() / 1000);
    req.headers = {{"Content-Type", "application/json"},
                   {"Keel-Delivery", d.id},
                   {"Keel-Event", d.event_type},
                   {"Keel-Timestamp", timestamp},
                   {"Keel-Signature", "v1=" + HmacSha256Hex(secret, timestamp + "." + req.body)}};
    auto answer = co_await webhook_client_->Fetch(req, 64 * 1024);
    if (!answer.ok()) {
      error = answer.status().message();
    } else {
      status = answer->status;
      if (status < 200 || status > 299) {
        error = "the receiver answered " + std::to_string(status);
      }
    }
  }
  Millis now = NowMillis();
  d.attempts += 1;
  d.last_status = status;
  d.last_error = error.substr(0, 500);
  std::string event;
  if (error.empty()) {
    d.status = "delivered";
    d.delivered_at = now;
  } else if (d.attempts >= manifest->max_attempts) {
    d.status = "dead";
    event = "plugin.delivery_dead@v1";
  } else {
    Millis backoff = std::min<Millis>(kMaxBackoffMs, Millis{1000} << std::min(d.attempts - 1, 20));
    d.next_attempt_at = now + backoff;
  }
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.plugins().UpdateDelivery(d));
    if (event.empty()) return Status::Ok();
    return tx.events().Append({d.tenant_id, event, d.agent_id, "", "",
                               {{"plugin_id", d.plugin_id},
                                {"delivery_id", d.id},
                                {"event", d.event_type},
                                {"attempts", d.attempts},
                                {"last_error", d.last_error}}});
  });
  if (!written.ok() && written.status().code() != Code::kNotFound) {
    LogError("could not record webhook delivery " + d.id + ": " + written.status().message());
  }
  if (!error.empty() && d.status == "dead") {
    LogError("webhook delivery " + d.id + " of plugin " + d.plugin_id + " is dead after " +
             std::to_string(d.attempts) + " attempts: " + d.last_error);
  }
}

}  // namespace keel::runtime

// Channels (docs/CHANNELS.md): an agent's bindings to the places messages come from, and the
// webhook ingress. Owners create, change and delete channels; owners and users read them. A
// delivery to POST /v1/hooks/{id} carries no token: its signature, under the channel's signing
// secret, is its authentication, checked before anything of the body is read or written.

#include <set>

#include "keel/access/access.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/channels/deliveries.h"
#include "keel/channels/discord.h"
#include "keel/channels/relay.h"
#include "keel/channels/slack.h"
#include "keel/channels/telegram.h"
#include "keel/channels/webhook.h"
#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/config/config.h"
#include "keel/runs/open_session.h"
#include "keel/runtime/intake.h"
#include "keel/runtime/runtime.h"
#include "keel/secrets/vault.h"
#include "keel/store/async.h"
#include "keel/store/channel_store.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

// The longest webhook-id taken: it becomes the message's idempotency key after "webhook:".
constexpr size_t kMaxWebhookId = 200;

// The name of the tenant secret a channel's settings name: a webhook's or a Slack app's signing
// key, a Telegram bot's token. At most one channel of a tenant names it.
std::string SecretName(const std::string& kind, const Json& settings) {
  return settings.value(kind == "telegram" || kind == "discord" ? "bot_token" : "signing_secret",
                        "");
}

// Every tenant secret the settings name, with what it is for.
std::vector<std::pair<std::string, std::string>> SecretsOf(const std::string& kind,
                                                           const Json& settings) {
  if (kind == "slack") {
    return {{"signing_secret", settings.value("signing_secret", "")},
            {"bot_token", settings.value("bot_token", "")}};
  }
  return {{kind == "telegram" || kind == "discord" ? "bot_token" : "signing_secret",
           SecretName(kind, settings)}};
}

// What keeps an enabled channel from taking deliveries, "" for nothing. Read with the channel,
// so that its owner sees why deliveries fail (a delivery tells its sender nothing of it).
Result<std::string> ChannelProblem(store::Tx& tx, const store::Channel& c) {
  auto settings = ParseJson(c.settings);
  if (!settings.ok()) return std::string("its settings are not JSON");
  for (const auto& [field, name] : SecretsOf(c.kind, *settings)) {
    auto found = tx.secrets().GetSecret(c.tenant_id, name);
    if (found.status().code() == Code::kNotFound) {
      return "its secret '" + name + "' (settings." + field +
             ") is missing: set it (PUT /v1/secrets/" + name + ") or name another";
    }
    if (!found.ok()) return found.status();
  }
  auto agent = tx.agents().GetAgent(c.tenant_id, c.agent_id);
  if (agent.status().code() == Code::kNotFound || (agent.ok() && agent->status == "deleted")) {
    return std::string("its agent was deleted");
  }
  if (!agent.ok()) return agent.status();
  KEEL_ASSIGN_OR_RETURN(bool revoked, access::Revoked(tx, c.tenant_id, c.created_by));
  if (revoked) {
    return "the token that created it (" + c.created_by +
           ") was revoked, and its runs would act for that token: delete the channel and "
           "create it again with an active token";
  }
  // A polled channel's last poll, when it failed (its cursor is not shown).
  KEEL_ASSIGN_OR_RETURN(auto poll, tx.channels().GetPoll(c.tenant_id, c.id));
  if (poll && !poll->error.empty()) return "its last poll failed: " + poll->error;
  return std::string();
}

// Inside a unit: the channel's signing secret must exist (its value is not read here) and sign
// no other channel of the tenant (kConflict), so that a delivery to one channel cannot be
// replayed to another (a signature covers only the delivery's id, time and body).
Status CheckSecret(store::Tx& tx, const std::string& tenant, const std::string& kind,
                   const std::string& settings, const std::string& channel_id) {
  auto parsed = ParseJson(settings);
  if (!parsed.ok()) return parsed.status();
  const std::string secret = SecretName(kind, *parsed);
  for (const auto& [field, name] : SecretsOf(kind, *parsed)) {
    auto found = tx.secrets().GetSecret(tenant, name);
    if (found.status().code() == Code::kNotFound) {
      return InvalidArgument("settings." + field + " names no secret of this tenant: '" + name +
                             "' (set it first: PUT /v1/secrets/" + name + ")");
    }
    KEEL_RETURN_IF_ERROR(found.status());
  }
  store::Page page{"", 500};
  do {
    KEEL_ASSIGN_OR_RETURN(auto found, tx.channels().ListChannels(tenant, "", page));
    for (const auto& c : found.items) {
      auto other = ParseJson(c.settings);
      if (c.id != channel_id && other.ok() && SecretName(c.kind, *other) == secret) {
        return Conflict("secret '" + secret + "' serves channel " + c.name + " (" + c.id +
                        ") already: give each channel its own secret, so that a delivery to "
                        "one cannot be replayed to another, and a bot is polled once");
      }
    }
    page.cursor = found.next_cursor;
  } while (!page.cursor.empty());
  return Status::Ok();
}

// `problem`: ChannelProblem's.
Json ChannelJson(const store::Channel& c, const std::string& problem) {
  auto settings = ParseJson(c.settings);
  return {{"id", c.id},
          {"agent_id", c.agent_id},
          {"kind", c.kind},
          {"name", c.name},
          {"enabled", c.enabled},
          {"status", !c.enabled        ? "disabled"
                     : problem.empty() ? "ready"
                                       : "error"},
          {"error", c.enabled ? problem : std::string()},
          {"settings", settings.ok() ? *settings : Json::object()},
          {"url", c.kind == "webhook" || c.kind == "slack" || c.kind == "discord" ||
                          (settings.ok() && settings->value("mode", "") == "webhook")
                      ? "/v1/hooks/" + c.id
                      : std::string()},
          {"created_by", c.created_by},
          {"created_at", FormatRfc3339(c.created_at)},
          {"updated_at", FormatRfc3339(c.updated_at)}};
}

Json ReplyJson(const store::ChannelReply& r) {
  return {{"id", r.id},
          {"channel_id", r.channel_id},
          {"session_id", r.session_id},
          {"run_id", r.run_id},
          {"delivery_id", r.delivery_id},
          {"kind", r.approval_id.empty() ? "answer" : "approval_card"},
          {"approval_id", r.approval_id.empty() ? Json(nullptr) : Json(r.approval_id)},
          {"user_id", r.user_id.empty() ? Json(nullptr) : Json(r.user_id)},
          {"status", r.status},
          {"text", r.text},
          {"parts_sent", r.parts_sent},
          {"attempts", r.attempts},
          {"error", r.error},
          {"created_at", FormatRfc3339(r.created_at)},
          {"updated_at", FormatRfc3339(r.updated_at)}};
}

Status CheckName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-' || c == '.');
  }
  if (!ok) {
    return InvalidArgument("name must be 1 to 64 letters, digits, '_', '-' or '.', got '" +
                           name.substr(0, 64) + "'");
  }
  return Status::Ok();
}

// The settings of a channel of `kind`, checked, as stored. `public_url`: the server's.
Result<std::string> SettingsText(const std::string& kind, const Json& settings,
                                 const std::string& public_url) {
  if (kind == "telegram") {
    KEEL_ASSIGN_OR_RETURN(auto s, channels::ParseTelegramSettings(settings));
    if (s.mode == "webhook" && public_url.empty()) {
      return InvalidArgument(
          "settings.mode 'webhook' needs the server's public_url (keel.toml public_url or "
          "KEEL_PUBLIC_URL), where Telegram posts updates; without one, use 'polling'");
    }
    return DumpJson(channels::TelegramSettingsJson(s));
  }
  if (kind == "slack") {
    KEEL_ASSIGN_OR_RETURN(auto s, channels::ParseSlackSettings(settings));
    return DumpJson(channels::SlackSettingsJson(s));
  }
  if (kind == "discord") {
    KEEL_ASSIGN_OR_RETURN(auto s, channels::ParseDiscordSettings(settings));
    return DumpJson(channels::DiscordSettingsJson(s));
  }
  if (kind != "webhook") {
    return InvalidArgument(
        "kind must be 'webhook' (signed HTTP deliveries to POST /v1/hooks/{id}), 'telegram' (a "
        "Telegram bot), 'slack' (a Slack app's Events API) or 'discord' (a Discord app's slash "
        "command), got '" +
        kind.substr(0, 32) + "'");
  }
  KEEL_ASSIGN_OR_RETURN(auto s, channels::ParseWebhookSettings(settings));
  return DumpJson(channels::WebhookSettingsJson(s));
}

// What a delivery needs of its channel, read in one unit.
struct Delivery {
  store::Channel channel;
  channels::WebhookSettings settings;
  std::string secret;
  std::string suspended;  // why an authenticated delivery is refused all the same ("" for none)
};

asio::awaitable<Result<Delivery>> ReadDelivery(ApiContext& ctx, const std::string& id) {
  Delivery d;
  Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(std::string tenant, tx.channels().ChannelTenant(id));
    KEEL_ASSIGN_OR_RETURN(d.channel, tx.channels().GetChannel(tenant, id));
    // A polled channel takes no delivery here.
    if (!d.channel.enabled || d.channel.kind != "webhook") {
      return NotFound("channel not found: " + id);
    }
    KEEL_ASSIGN_OR_RETURN(auto agent, tx.agents().GetAgent(tenant, d.channel.agent_id));
    if (agent.status == "deleted") return NotFound("channel not found: " + id);
    KEEL_ASSIGN_OR_RETURN(bool revoked, access::Revoked(tx, tenant, d.channel.created_by));
    if (revoked) {
      d.suspended = "this channel is suspended: the token that created it was revoked";
    }
    KEEL_ASSIGN_OR_RETURN(auto settings, ParseJson(d.channel.settings));
    KEEL_ASSIGN_OR_RETURN(d.settings, channels::ParseWebhookSettings(settings));
    auto secret = ctx.vault.Get(tx, tenant, d.settings.signing_secret);
    if (secret.status().code() == Code::kNotFound) {
      // The caller is not authenticated yet: it learns that the channel cannot check
      // signatures, not the secret's name.
      return Unavailable(
          "this channel cannot check signatures now (its signing secret is "
          "missing); its owner can see why");
    }
    KEEL_ASSIGN_OR_RETURN(d.secret, std::move(secret));
    return Status::Ok();
  });
  if (!st.ok()) co_return st;
  co_return d;
}

asio::awaitable<Response> Deliver(ApiContext& ctx, Request& req) {
  const std::string id = req.Param("id");
  // Discord's interaction to a discord channel (channels/relay.h).
  if (const std::string signature = req.Header("x-signature-ed25519"); !signature.empty()) {
    if (!ctx.relay) co_return Response::Error(NotFound("channel not found: " + id));
    auto answered = co_await ctx.relay->PushedDiscord(id, req.Header("x-signature-timestamp"),
                                                      signature, req.body);
    if (!answered.ok()) co_return IntakeError(answered.status());
    co_return Response::Json(200, *answered);
  }
  // Slack's Events API request to a slack channel (channels/relay.h).
  if (const std::string signature = req.Header("x-slack-signature"); !signature.empty()) {
    if (!ctx.relay) co_return Response::Error(NotFound("channel not found: " + id));
    auto answered = co_await ctx.relay->PushedSlack(id, req.Header("x-slack-request-timestamp"),
                                                    signature, req.body);
    if (!answered.ok()) co_return IntakeError(answered.status());
    co_return Response::Json(200, *answered);
  }
  // Telegram's push to a webhook-mode telegram channel (channels/relay.h).
  if (const std::string secret = req.Header("x-telegram-bot-api-secret-token"); !secret.empty()) {
    if (!ctx.relay) co_return Response::Error(NotFound("channel not found: " + id));
    auto answered = co_await ctx.relay->Pushed(id, secret, req.body);
    if (!answered.ok()) co_return IntakeError(answered.status());
    co_return Response::Json(*answered, {{"ok", true}});
  }
  const std::string webhook_id = req.Header("webhook-id");
  // What needs no key is checked before the channel is read.
  if (Status st = channels::CheckDeliveryHeaders(webhook_id, req.Header("webhook-timestamp"),
                                                 req.Header("webhook-signature"), NowMillis());
      !st.ok()) {
    co_return Response::Error(st);
  }
  auto d = co_await ReadDelivery(ctx, id);
  if (!d.ok()) co_return Response::Error(d.status());
  // Authenticated before the body is parsed or anything is written.
  Status signed_ok =
      channels::VerifySignature(d->secret, webhook_id, req.Header("webhook-timestamp"),
                                req.Header("webhook-signature"), req.body, NowMillis());
  if (!signed_ok.ok()) co_return Response::Error(signed_ok);
  for (char ch : webhook_id) {
    if (ch < 0x21 || ch > 0x7e) signed_ok = InvalidArgument("webhook-id must be printable ASCII");
  }
  if (webhook_id.size() > kMaxWebhookId) {
    signed_ok = InvalidArgument("webhook-id is longer than " + std::to_string(kMaxWebhookId) +
                                " characters");
  }
  if (!signed_ok.ok()) co_return Response::Error(signed_ok);
  if (!d->suspended.empty()) co_return Response::Error(PermissionDenied(d->suspended));
  // An object without NUL characters, as any request body (PostgreSQL stores no NUL).
  auto body = ParseJsonObject(req.body);
  if (!body.ok()) co_return Response::Error(body.status());
  auto content = channels::RenderMessage(d->settings.message_template, *body);
  if (!content.ok()) co_return Response::Error(content.status());
  auto conversation = channels::ConversationOf(d->settings.conversation, *body);
  if (!conversation.ok()) co_return Response::Error(conversation.status());
  // The agent's plugins may rewrite the message or drop the delivery (nothing is recorded of
  // a dropped one: a retry is judged again).
  Json in = {{"agent_id", d->channel.agent_id},
             {"channel_id", d->channel.id},
             {"kind", d->channel.kind},
             {"conversation", *conversation},
             {"delivery_id", webhook_id},
             {"content", std::move(*content)},
             {"drop", false}};
  auto kept = co_await ctx.runtime.ChannelMessage("channel.message.in", d->channel.tenant_id,
                                                  d->channel.agent_id, std::move(in));
  if (!kept.ok()) co_return Response::Error(kept.status());
  if (!*kept) co_return Response::Json(200, {{"dropped", true}, {"replayed", false}});
  auto session =
      co_await channels::RecordDelivery(ctx.store, d->channel, webhook_id, *conversation);
  if (!session.ok()) co_return Response::Error(session.status());
  runtime::IntakeRequest intake;
  intake.tenant_id = d->channel.tenant_id;
  intake.session_id = *session;
  intake.content = std::move(**kept);
  intake.idempotency_key = "webhook:" + webhook_id;
  intake.requested_by = d->channel.created_by;
  intake.caller_role = d->settings.role;
  intake.channel_id = d->channel.id;
  auto result = co_await ctx.runtime.PostMessage(intake);
  if (!result.ok()) co_return IntakeError(result.status());
  co_return Response::Json(result->replayed ? 200 : 202, {{"session_id", *session},
                                                          {"message_id", result->message.id},
                                                          {"run_id", result->run.id},
                                                          {"replayed", result->replayed}});
}

}  // namespace

void RegisterChannelRoutes(http::Router& router, ApiContext& ctx) {
  router.Add("POST", "/v1/agents/{id}/channels", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"kind", "name", "settings", "enabled"}); !st.ok()) {
      co_return Response::Error(st);
    }
    store::Channel c;
    auto kind = ReqString(*body, "kind");
    if (!kind.ok()) co_return Response::Error(kind.status());
    auto name = ReqString(*body, "name");
    if (!name.ok()) co_return Response::Error(name.status());
    if (auto st = CheckName(*name); !st.ok()) co_return Response::Error(st);
    auto settings =
        SettingsText(*kind, body->value("settings", Json::object()), ctx.config.public_url);
    if (!settings.ok()) co_return Response::Error(settings.status());
    if (body->contains("enabled") && !(*body)["enabled"].is_boolean()) {
      co_return Response::Error(InvalidArgument("enabled must be true or false"));
    }
    c.id = NewId();
    c.tenant_id = req.principal.tenant_id;
    c.agent_id = req.Param("id");
    c.kind = *kind;
    c.name = *name;
    c.settings = *settings;
    c.enabled = body->value("enabled", true);
    c.created_by = req.principal.token_id;
    c.created_at = c.updated_at = NowMillis();
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(c.tenant_id, c.agent_id).status());
      KEEL_RETURN_IF_ERROR(CheckSecret(tx, c.tenant_id, c.kind, c.settings, c.id));
      KEEL_RETURN_IF_ERROR(tx.channels().InsertChannel(c));
      tx.Carry("channels", store::RowImage(c));
      return tx.events().Append({c.tenant_id,
                                 "channel.created@v1",
                                 c.agent_id,
                                 "",
                                 "",
                                 {{"channel_id", c.id}, {"kind", c.kind}, {"name", c.name}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(201, ChannelJson(c, ""));
  });

  router.Add("GET", "/v1/agents/{id}/channels", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see channels"); !st.ok()) co_return Response::Error(st);
    auto page = PageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    store::Paged<store::Channel> found;
    std::vector<std::string> problems;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      const std::string& tenant = req.principal.tenant_id;
      KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(tenant, req.Param("id")).status());
      KEEL_ASSIGN_OR_RETURN(found, tx.channels().ListChannels(tenant, req.Param("id"), *page));
      for (const auto& c : found.items) {
        KEEL_ASSIGN_OR_RETURN(auto problem, ChannelProblem(tx, c));
        problems.push_back(std::move(problem));
      }
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    size_t i = 0;
    co_return Response::Json(200, ListJson(found, [&](const store::Channel& c) {
                               return ChannelJson(c, problems[i++]);
                             }));
  });

  router.Add("GET", "/v1/channels/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see channels"); !st.ok()) co_return Response::Error(st);
    store::Channel c;
    std::string problem;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(c, tx.channels().GetChannel(req.principal.tenant_id, req.Param("id")));
      KEEL_ASSIGN_OR_RETURN(problem, ChannelProblem(tx, c));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ChannelJson(c, problem));
  });

  router.Add("GET", "/v1/channels/{id}/replies", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireMember(req, "see channels"); !st.ok()) co_return Response::Error(st);
    auto page = OrderedPageOf(req);
    if (!page.ok()) co_return Response::Error(page.status());
    static const std::set<std::string> kStatuses = {"waiting", "pending", "sending", "shown",
                                                    "sent",    "skipped", "dead",    "unknown"};
    const std::string status = req.Query("status");
    if (!status.empty() && !kStatuses.count(status)) {
      co_return Response::Error(InvalidArgument(
          "status must be one of waiting, pending, sending, shown, sent, skipped, dead or "
          "unknown, got '" +
          TruncateUtf8(status, 64) + "'"));
    }
    store::Paged<store::ChannelReply> found;
    Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
      const std::string& tenant = req.principal.tenant_id;
      KEEL_RETURN_IF_ERROR(tx.channels().GetChannel(tenant, req.Param("id")).status());
      KEEL_ASSIGN_OR_RETURN(found,
                            tx.channels().ListReplies(tenant, req.Param("id"), status, *page));
      return Status::Ok();
    });
    if (!st.ok()) co_return Response::Error(st);
    co_return Response::Json(200, ListJson(found, ReplyJson));
  });

  router.Add("PATCH", "/v1/channels/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    auto body = ParseJsonObject(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    if (auto st = CheckFields(*body, {"name", "settings", "enabled"}); !st.ok()) {
      co_return Response::Error(st);
    }
    std::optional<std::string> name;
    if (body->contains("name")) {
      auto n = ReqString(*body, "name");
      if (!n.ok()) co_return Response::Error(n.status());
      if (auto st = CheckName(*n); !st.ok()) co_return Response::Error(st);
      name = *n;
    }
    if (body->contains("enabled") && !(*body)["enabled"].is_boolean()) {
      co_return Response::Error(InvalidArgument("enabled must be true or false"));
    }
    std::optional<Json> settings;
    if (body->contains("settings")) settings = (*body)["settings"];
    store::Channel c;
    std::string problem;
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(c, tx.channels().GetChannel(req.principal.tenant_id, req.Param("id")));
      if (name) c.name = *name;
      if (body->contains("enabled")) c.enabled = (*body)["enabled"].get<bool>();
      if (settings) {
        KEEL_ASSIGN_OR_RETURN(c.settings, SettingsText(c.kind, *settings, ctx.config.public_url));
        KEEL_RETURN_IF_ERROR(CheckSecret(tx, c.tenant_id, c.kind, c.settings, c.id));
      }
      c.updated_at = NowMillis();
      KEEL_ASSIGN_OR_RETURN(problem, ChannelProblem(tx, c));
      KEEL_RETURN_IF_ERROR(tx.channels().UpdateChannel(c));
      tx.Carry("channels", store::RowImage(c));
      return tx.events().Append({c.tenant_id,
                                 "channel.updated@v1",
                                 c.agent_id,
                                 "",
                                 "",
                                 {{"channel_id", c.id}, {"enabled", c.enabled}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::Json(200, ChannelJson(c, problem));
  });

  router.Add("DELETE", "/v1/channels/{id}", [&ctx](Request& req) -> asio::awaitable<Response> {
    if (auto st = RequireOwner(req); !st.ok()) co_return Response::Error(st);
    const std::string tenant = req.principal.tenant_id;
    const std::string id = req.Param("id");
    auto written = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto c, tx.channels().GetChannel(tenant, id));
      KEEL_RETURN_IF_ERROR(tx.channels().DeleteChannel(tenant, id));
      tx.Carry("channels", store::DeletedImage({{"tenant_id", tenant}, {"id", id}}));
      return tx.events().Append(
          {tenant, "channel.deleted@v1", c.agent_id, "", "", {{"channel_id", id}}});
    });
    if (!written.ok()) co_return Response::Error(written.status());
    co_return Response::NoContent();
  });

  router.Add(
      "POST", "/v1/hooks/{id}",
      [&ctx](Request& req) -> asio::awaitable<Response> { co_return co_await Deliver(ctx, req); },
      /*requires_auth=*/false);
}

}  // namespace keel::api

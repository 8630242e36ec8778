#pragma once
// The webhook channel (docs/CHANNELS.md): deliveries signed as Standard Webhooks sign them
// (webhook-id, webhook-timestamp, webhook-signature: HMAC-SHA256 over "id.timestamp.body"),
// each turned into a message by the channel's template and put in the session of its
// conversation. Pure functions: the route (api/api_channels.cc) reads and writes.

#include <string>
#include <string_view>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"

namespace keel::channels {

// How far a delivery's timestamp may be from now, either way (replays older than this are
// refused; the webhook-id makes the ones within it harmless).
inline constexpr Millis kSignatureTolerance = 5 * 60 * 1000;
inline constexpr size_t kMaxTemplateBytes = 4096;
inline constexpr int kMaxPlaceholders = 64;
// The longest message a template may make (a client's request limit's default): placeholders
// repeat values, so a body within the limit could otherwise make a message many times larger.
inline constexpr size_t kMaxMessageBytes = 1 << 20;
// The shortest key a channel verifies with (Standard Webhooks keys are 24 to 64 bytes).
inline constexpr size_t kMinKeyBytes = 16;

struct WebhookSettings {
  std::string signing_secret;             // the name of the tenant secret holding the key
  std::string message_template = "{{}}";  // {{POINTER}} placeholders (RFC 6901)
  std::string conversation;               // a JSON pointer; "" = one session for every delivery
  std::string role = "guest";             // the role the runs act with: guest | user
};

// settings[name] when it is a string, `fallback` when it is absent; kInvalidArgument otherwise.
Result<std::string> SettingsString(const Json& settings, const char* name, std::string fallback);

// settings.api_base of a platform's channel: `fallback` when absent; else an http:// or
// https:// URL of at most 512 characters without a query, a fragment or credentials, its
// trailing slashes cut (`what` names the server in the error).
Result<std::string> SettingsApiBase(const Json& settings, const std::string& fallback,
                                    const std::string& what);
// settings.role: "guest" (the default) or "user".
Result<std::string> SettingsRole(const Json& settings);

// Checks a channel's settings object (unknown fields, types, the template's placeholders).
Result<WebhookSettings> ParseWebhookSettings(const Json& settings);
Json WebhookSettingsJson(const WebhookSettings& s);

// The checks of VerifySignature that need no key: the three headers present, the timestamp
// unix seconds within kSignatureTolerance of `now` (kUnauthenticated otherwise). Made before
// the channel is read, so that a request without them costs no read.
Status CheckDeliveryHeaders(std::string_view id, std::string_view timestamp,
                            std::string_view signatures, Millis now);

// kUnauthenticated unless `signatures` (webhook-signature: "v1,BASE64" entries separated by
// spaces) holds one that is the HMAC of "id.timestamp.body" under the key in `secret` ("whsec_"
// and base64 of the key's bytes, or the bytes themselves) and `timestamp` (unix seconds) is
// within kSignatureTolerance of `now`. The comparison is constant-time. kUnavailable when the
// key is shorter than kMinKeyBytes or a whsec_ secret is not base64 (the channel's fault).
Status VerifySignature(std::string_view secret, std::string_view id, std::string_view timestamp,
                       std::string_view signatures, std::string_view body, Millis now);

// The message: the template with each {{POINTER}} replaced by the body's value there (a string
// as it is, anything else as compact JSON). kInvalidArgument naming a pointer with nothing
// there, or for a message longer than kMaxMessageBytes.
Result<std::string> RenderMessage(const std::string& message_template, const Json& body);

// The delivery's conversation: "" when `pointer` is "", else the string or number there.
// kInvalidArgument when there is nothing there or something else.
Result<std::string> ConversationOf(const std::string& pointer, const Json& body);

}  // namespace keel::channels

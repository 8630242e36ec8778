#include "keel/channels/webhook.h"

#include "keel/common/crypto.h"

namespace keel::channels {

namespace {

constexpr size_t kMaxConversationBytes = 512;

// The pointer of one placeholder, checked (RFC 6901: "" or "/..." with ~0 and ~1 escapes).
Result<Json::json_pointer> Pointer(const std::string& text, const std::string& where) {
  try {
    return Json::json_pointer(text);
  } catch (const Json::exception&) {
    return InvalidArgument(where + ": '" + text.substr(0, 64) +
                           "' is not a JSON pointer (\"\" or \"/a/b\", RFC 6901)");
  }
}

// The body's value at `pointer`, or nullptr when there is none.
const Json* At(const Json& body, const Json::json_pointer& pointer) {
  try {
    return &body.at(pointer);
  } catch (const Json::exception&) {
    return nullptr;
  }
}

// Calls `each(pointer)` for every placeholder of the template, and `text(literal)` between them.
template <typename Each, typename Text>
Status WalkTemplate(const std::string& t, Each each, Text text) {
  size_t at = 0;
  int count = 0;
  while (at < t.size()) {
    size_t open = t.find("{{", at);
    if (open == std::string::npos) {
      text(std::string_view(t).substr(at));
      break;
    }
    size_t close = t.find("}}", open + 2);
    if (close == std::string::npos) {
      return InvalidArgument("settings.template: '{{' at byte " + std::to_string(open) +
                             " has no '}}'");
    }
    if (++count > kMaxPlaceholders) {
      return InvalidArgument("settings.template: more than " + std::to_string(kMaxPlaceholders) +
                             " placeholders");
    }
    text(std::string_view(t).substr(at, open - at));
    KEEL_RETURN_IF_ERROR(each(t.substr(open + 2, close - open - 2)));
    at = close + 2;
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> SettingsString(const Json& settings, const char* name, std::string fallback) {
  auto it = settings.find(name);
  if (it == settings.end()) return fallback;
  if (!it->is_string())
    return InvalidArgument(std::string("settings.") + name + " must be a string");
  return it->get<std::string>();
}

Result<std::string> SettingsApiBase(const Json& settings, const std::string& fallback,
                                    const std::string& what) {
  KEEL_ASSIGN_OR_RETURN(std::string base, SettingsString(settings, "api_base", fallback));
  while (!base.empty() && base.back() == '/') base.pop_back();
  bool printable = true;
  for (char c : base) printable = printable && c > 0x20 && c < 0x7f;
  if (!printable || base.size() > 512 ||
      (base.rfind("http://", 0) != 0 && base.rfind("https://", 0) != 0) ||
      base.find_first_of("?#@") != std::string::npos) {
    return InvalidArgument(
        "settings.api_base must be an http:// or https:// URL of at most 512 "
        "characters without a query or credentials (" +
        what + "; default " + fallback + ")");
  }
  return base;
}

Result<std::string> SettingsRole(const Json& settings) {
  KEEL_ASSIGN_OR_RETURN(std::string role, SettingsString(settings, "role", "guest"));
  if (role != "guest" && role != "user") {
    return InvalidArgument(
        "settings.role must be 'guest' or 'user' (the role the channel's runs act with), got '" +
        role.substr(0, 32) + "'");
  }
  return role;
}

Result<WebhookSettings> ParseWebhookSettings(const Json& settings) {
  if (!settings.is_object()) return InvalidArgument("settings must be an object");
  for (auto it = settings.begin(); it != settings.end(); ++it) {
    const std::string& k = it.key();
    if (k != "signing_secret" && k != "template" && k != "conversation" && k != "role") {
      return InvalidArgument("unknown field 'settings." + k.substr(0, 64) +
                             "' (a webhook channel takes signing_secret, template, "
                             "conversation, role)");
    }
  }
  WebhookSettings s;
  KEEL_ASSIGN_OR_RETURN(s.signing_secret, SettingsString(settings, "signing_secret", ""));
  if (s.signing_secret.empty()) {
    return InvalidArgument(
        "settings.signing_secret is required: the name of a tenant secret "
        "(PUT /v1/secrets/NAME) holding the key deliveries are signed with");
  }
  KEEL_ASSIGN_OR_RETURN(s.message_template, SettingsString(settings, "template", "{{}}"));
  if (s.message_template.empty()) return InvalidArgument("settings.template must not be empty");
  if (s.message_template.size() > kMaxTemplateBytes) {
    return InvalidArgument("settings.template is longer than " + std::to_string(kMaxTemplateBytes) +
                           " bytes");
  }
  KEEL_RETURN_IF_ERROR(WalkTemplate(
      s.message_template,
      [](const std::string& p) { return Pointer(p, "settings.template").status(); },
      [](std::string_view) {}));
  KEEL_ASSIGN_OR_RETURN(s.conversation, SettingsString(settings, "conversation", ""));
  KEEL_RETURN_IF_ERROR(Pointer(s.conversation, "settings.conversation").status());
  KEEL_ASSIGN_OR_RETURN(s.role, SettingsRole(settings));
  return s;
}

Json WebhookSettingsJson(const WebhookSettings& s) {
  return {{"signing_secret", s.signing_secret},
          {"template", s.message_template},
          {"conversation", s.conversation},
          {"role", s.role}};
}

Status CheckDeliveryHeaders(std::string_view id, std::string_view timestamp,
                            std::string_view signatures, Millis now) {
  if (id.empty() || timestamp.empty() || signatures.empty()) {
    return Unauthenticated(
        "a delivery needs the headers webhook-id, webhook-timestamp and "
        "webhook-signature (Standard Webhooks)");
  }
  int64_t seconds = 0;
  if (timestamp.size() > 12) return Unauthenticated("webhook-timestamp is not unix seconds");
  for (char c : timestamp) {
    if (c < '0' || c > '9') return Unauthenticated("webhook-timestamp is not unix seconds");
    seconds = seconds * 10 + (c - '0');
  }
  const Millis at = seconds * 1000;
  if (at < now - kSignatureTolerance || at > now + kSignatureTolerance) {
    return Unauthenticated("webhook-timestamp is more than 5 minutes from now");
  }
  return Status::Ok();
}

Status VerifySignature(std::string_view secret, std::string_view id, std::string_view timestamp,
                       std::string_view signatures, std::string_view body, Millis now) {
  KEEL_RETURN_IF_ERROR(CheckDeliveryHeaders(id, timestamp, signatures, now));
  std::string key;
  if (secret.substr(0, 6) == "whsec_") {
    key = Base64Decode(secret.substr(6));
    if (key.empty()) {
      return Unavailable(
          "the channel's signing secret starts with 'whsec_' but the rest is not "
          "base64");
    }
  } else {
    key = std::string(secret);
  }
  if (key.size() < kMinKeyBytes) {
    return Unavailable("the channel's signing key is shorter than " + std::to_string(kMinKeyBytes) +
                       " bytes");
  }
  std::string signed_content;
  signed_content.reserve(id.size() + timestamp.size() + body.size() + 2);
  signed_content.append(id).append(".").append(timestamp).append(".").append(body);
  const std::string expected = Base64Encode(HmacSha256(key, signed_content));
  bool matched = false;
  while (!signatures.empty()) {
    size_t space = signatures.find(' ');
    std::string_view one = signatures.substr(0, space);
    signatures.remove_prefix(space == std::string_view::npos ? signatures.size() : space + 1);
    if (one.substr(0, 3) == "v1," && ConstantTimeEquals(one.substr(3), expected)) matched = true;
  }
  if (!matched) return Unauthenticated("no webhook-signature matches the delivery");
  return Status::Ok();
}

Result<std::string> RenderMessage(const std::string& message_template, const Json& body) {
  std::string out;
  KEEL_RETURN_IF_ERROR(WalkTemplate(
      message_template,
      [&](const std::string& text) -> Status {
        KEEL_ASSIGN_OR_RETURN(auto pointer, Pointer(text, "settings.template"));
        const Json* v = At(body, pointer);
        if (!v)
          return InvalidArgument("the channel's template names " + text.substr(0, 128) +
                                 ", which is not in the body");
        out += v->is_string() ? v->get_ref<const std::string&>() : DumpJson(*v);
        if (out.size() > kMaxMessageBytes) {
          return InvalidArgument("the channel's template made a message longer than " +
                                 std::to_string(kMaxMessageBytes) + " bytes");
        }
        return Status::Ok();
      },
      [&](std::string_view literal) { out += literal; }));
  if (out.size() > kMaxMessageBytes) {
    return InvalidArgument("the channel's template made a message longer than " +
                           std::to_string(kMaxMessageBytes) + " bytes");
  }
  if (out.empty()) return InvalidArgument("the channel's template made an empty message");
  return out;
}

Result<std::string> ConversationOf(const std::string& pointer, const Json& body) {
  if (pointer.empty()) return std::string();
  KEEL_ASSIGN_OR_RETURN(auto p, Pointer(pointer, "settings.conversation"));
  const Json* v = At(body, p);
  if (!v)
    return InvalidArgument("the channel's conversation " + pointer.substr(0, 128) +
                           " is not in the body");
  std::string out;
  if (v->is_string()) {
    out = v->get<std::string>();
  } else if (v->is_number()) {
    out = DumpJson(*v);
  } else {
    return InvalidArgument("the channel's conversation " + pointer.substr(0, 128) +
                           " must be a string or a number in the body");
  }
  if (out.size() > kMaxConversationBytes) {
    return InvalidArgument("the delivery's conversation is longer than " +
                           std::to_string(kMaxConversationBytes) + " bytes");
  }
  return out;
}

}  // namespace keel::channels

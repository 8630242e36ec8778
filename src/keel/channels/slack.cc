#include "keel/channels/slack.h"

#include "keel/channels/webhook.h"
#include "keel/common/crypto.h"

namespace keel::channels {

namespace {

constexpr size_t kMaxId = 64;  // a channel id, a ts

// j[key] when it is a string no longer than `most`, else "".
std::string Str(const Json& j, const char* key, size_t most = kMaxId) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  const auto& s = j[key].get_ref<const std::string&>();
  return s.size() <= most ? s : "";
}

// Slack escapes a user's &, < and > (its markup uses the bare ones): the agent gets what was
// typed.
std::string Unescape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 4, "&lt;") == 0) {
      out += '<';
      i += 3;
    } else if (text.compare(i, 4, "&gt;") == 0) {
      out += '>';
      i += 3;
    } else if (text.compare(i, 5, "&amp;") == 0) {
      out += '&';
      i += 4;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string Trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

Result<SlackSettings> ParseSlackSettings(const Json& settings) {
  if (!settings.is_object()) return InvalidArgument("settings must be an object");
  for (auto it = settings.begin(); it != settings.end(); ++it) {
    const std::string& k = it.key();
    if (k != "signing_secret" && k != "bot_token" && k != "api_base" && k != "role") {
      return InvalidArgument("unknown field 'settings." + k.substr(0, 64) +
                             "' (a slack channel takes signing_secret, bot_token, api_base, role)");
    }
  }
  SlackSettings s;
  KEEL_ASSIGN_OR_RETURN(s.signing_secret, SettingsString(settings, "signing_secret", ""));
  KEEL_ASSIGN_OR_RETURN(s.bot_token, SettingsString(settings, "bot_token", ""));
  if (s.signing_secret.empty() || s.bot_token.empty()) {
    return InvalidArgument(
        "settings.signing_secret and settings.bot_token are required: the names of the tenant "
        "secrets holding the Slack app's signing secret and its bot token (xoxb-...)");
  }
  KEEL_ASSIGN_OR_RETURN(s.api_base, SettingsApiBase(settings, kSlackApi, "the Web API's base"));
  KEEL_ASSIGN_OR_RETURN(s.role, SettingsRole(settings));
  return s;
}

Json SlackSettingsJson(const SlackSettings& s) {
  return {{"signing_secret", s.signing_secret},
          {"bot_token", s.bot_token},
          {"api_base", s.api_base},
          {"role", s.role}};
}

Status CheckSlackHeaders(std::string_view timestamp, std::string_view signature, Millis now) {
  if (timestamp.empty() || signature.empty()) {
    return Unauthenticated("X-Slack-Request-Timestamp and X-Slack-Signature are required");
  }
  int64_t seconds = 0;
  bool digits = timestamp.size() <= 12;
  for (char c : timestamp) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) seconds = seconds * 10 + (c - '0');
  }
  if (!digits || std::abs(now - seconds * 1000) > 5 * 60 * 1000) {
    return Unauthenticated("X-Slack-Request-Timestamp is not unix seconds within five minutes");
  }
  return Status::Ok();
}

Status VerifySlackSignature(std::string_view secret, std::string_view timestamp,
                            std::string_view signature, std::string_view body, Millis now) {
  KEEL_RETURN_IF_ERROR(CheckSlackHeaders(timestamp, signature, now));
  std::string base = "v0:";
  base.append(timestamp).append(":").append(body);
  const std::string expected = "v0=" + HmacSha256Hex(secret, base);
  if (!ConstantTimeEquals(expected, signature)) {
    return Unauthenticated("X-Slack-Signature does not match");
  }
  return Status::Ok();
}

Result<SlackInbound> RouteSlackEvent(const Json& envelope) {
  SlackInbound in;
  auto ignore = [&](std::string why) {
    in.ignored = std::move(why);
    return in;
  };
  if (!envelope.is_object() || Str(envelope, "type") != "event_callback") {
    return ignore("not an event callback");
  }
  in.event_id = Str(envelope, "event_id", 200);
  bool printable = !in.event_id.empty();
  for (char c : in.event_id) printable = printable && c > 0x20 && c < 0x7f;
  if (!printable) return InvalidArgument("an event_callback without a printable event_id");
  if (!envelope.contains("event") || !envelope["event"].is_object()) {
    return InvalidArgument("an event_callback without an event");
  }
  const Json& e = envelope["event"];
  if (e.contains("bot_id") || e.contains("subtype"))
    return ignore("from a bot, or not a new message");
  std::string bot_user;
  if (envelope.contains("authorizations") && envelope["authorizations"].is_array() &&
      !envelope["authorizations"].empty()) {
    bot_user = Str(envelope["authorizations"][0], "user_id");
  }
  const std::string user = Str(e, "user");
  if (user.empty() || user == bot_user) return ignore("from the bot, or from no user");
  if (!e.contains("text") || !e["text"].is_string()) return ignore("no text");
  const std::string channel = Str(e, "channel");
  const std::string ts = Str(e, "ts");
  const std::string thread = Str(e, "thread_ts");
  if (channel.empty() || ts.empty()) return ignore("no channel");
  const std::string type = Str(e, "type");
  std::string text = e["text"].get<std::string>();
  if (type == "message" && Str(e, "channel_type") == "im") {
    in.conversation = "im:" + channel;
    in.content = Unescape(text);
    in.target = {{"channel", channel}};
    if (!thread.empty()) in.target["thread_ts"] = thread;
  } else if (type == "app_mention") {
    const std::string root = thread.empty() ? ts : thread;
    in.conversation = "thread:" + channel + ":" + root;
    // The bot's own mention, <@U123> or <@U123|name>, is not part of what is asked.
    const std::string open = "<@" + bot_user;
    for (size_t at = bot_user.empty() ? std::string::npos : text.find(open);
         at != std::string::npos; at = text.find(open, at)) {
      const size_t after = at + open.size();
      const size_t close = text.find('>', after);
      if (after < text.size() && (text[after] == '>' || text[after] == '|') &&
          close != std::string::npos) {
        text.erase(at, close - at + 1);
      } else {
        at = after;
      }
    }
    in.content = Unescape(Trim(text));
    if (in.content.empty()) in.content = Unescape(e["text"].get<std::string>());
    in.target = {{"channel", channel}, {"thread_ts", root}};
  } else if (type == "message" &&
             (Str(e, "channel_type") == "channel" || Str(e, "channel_type") == "group")) {
    // A channel's message that does not call the bot (the agent's owners are heard without
    // calling it). One that mentions the bot comes again as an app_mention, taken there; without
    // the bot's user id that cannot be told, so none is taken.
    if (bot_user.empty() || text.find("<@" + bot_user) != std::string::npos) {
      return ignore("a channel message that mentions the bot (taken as its app_mention)");
    }
    const std::string root = thread.empty() ? ts : thread;
    in.conversation = "thread:" + channel + ":" + root;
    in.content = Unescape(text);
    in.target = {{"channel", channel}, {"thread_ts", root}};
    in.addressed = false;
    in.in_thread = !thread.empty() && thread != ts;
  } else {
    return ignore("a " + type.substr(0, 32) + " event outside a direct conversation");
  }
  in.direct = Str(e, "channel_type") == "im";
  in.sender_id = user;
  in.text = in.content;
  in.take = true;
  return in;
}

Json SlackPostBody(const Json& target, const std::string& part) {
  Json body = {{"channel", target.value("channel", std::string())}, {"text", part}};
  if (target.contains("thread_ts")) body["thread_ts"] = target["thread_ts"];
  return body;
}

}  // namespace keel::channels

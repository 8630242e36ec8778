#include "keel/channels/telegram.h"

#include <cctype>

#include "keel/channels/webhook.h"
#include "keel/common/crypto.h"

namespace keel::channels {

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool WordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Whether `text` holds "@username" as a whole word (Telegram usernames are case-insensitive).
bool Mentions(const std::string& text, const std::string& username) {
  if (username.empty()) return false;
  const std::string hay = Lower(text);
  const std::string needle = "@" + Lower(username);
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) {
    size_t end = at + needle.size();
    bool starts = at == 0 || !WordChar(hay[at - 1]);  // not mail@name
    if (starts && (end == hay.size() || !WordChar(hay[end]))) return true;
  }
  // A command for this bot: "/cmd@name" as the message's first word (Telegram's own form for
  // a command in a group with several bots).
  if (!hay.empty() && hay[0] == '/') {
    const size_t word = hay.find_first_of(" \t\n");
    const std::string first = hay.substr(0, word);
    const size_t at = first.find('@');
    return at != std::string::npos && at > 1 && first.substr(at) == needle;
  }
  return false;
}

std::string SenderName(const Json& from) {
  std::string name;
  if (from.is_object()) {
    if (from.contains("first_name") && from["first_name"].is_string()) {
      name = from["first_name"].get<std::string>();
    }
    if (from.contains("last_name") && from["last_name"].is_string()) {
      name += (name.empty() ? "" : " ") + from["last_name"].get<std::string>();
    }
  }
  return name.empty() ? "someone" : name;
}

bool IsInt(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number_integer();
}

// j[key] when it is true (a platform's field of another type counts as absent).
bool IsTrue(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
}

// The length of the UTF-8 sequence `lead` starts (1 for a byte that starts none).
size_t SequenceBytes(unsigned char lead) {
  if (lead >= 0xF0 && lead <= 0xF7) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

std::string EscapeHtml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

bool ValidBotToken(const std::string& token) {
  if (token.empty() || token.size() > 256) return false;
  for (char c : token) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != ':' && c != '-' && c != '_') {
      return false;
    }
  }
  return true;
}

Result<TelegramSettings> ParseTelegramSettings(const Json& settings) {
  if (!settings.is_object()) return InvalidArgument("settings must be an object");
  for (auto it = settings.begin(); it != settings.end(); ++it) {
    const std::string& k = it.key();
    if (k != "bot_token" && k != "api_base" && k != "role" && k != "poll_timeout" && k != "mode") {
      return InvalidArgument("unknown field 'settings." + k.substr(0, 64) +
                             "' (a telegram channel takes bot_token, api_base, role, "
                             "poll_timeout, mode)");
    }
  }
  TelegramSettings s;
  KEEL_ASSIGN_OR_RETURN(s.bot_token, SettingsString(settings, "bot_token", ""));
  if (s.bot_token.empty()) {
    return InvalidArgument(
        "settings.bot_token is required: the name of the tenant secret holding the bot's "
        "token (PUT /v1/secrets/{name})");
  }
  KEEL_ASSIGN_OR_RETURN(s.api_base, SettingsApiBase(settings, kTelegramApi, "the Bot API server"));
  KEEL_ASSIGN_OR_RETURN(s.role, SettingsRole(settings));
  if (settings.contains("poll_timeout")) {
    const Json& t = settings["poll_timeout"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > 50) {
      return InvalidArgument(
          "settings.poll_timeout must be an integer from 0 to 50 (seconds a getUpdates "
          "call waits for updates)");
    }
    s.poll_timeout = t.get<int>();
  }
  KEEL_ASSIGN_OR_RETURN(s.mode, SettingsString(settings, "mode", "polling"));
  if (s.mode != "polling" && s.mode != "webhook") {
    return InvalidArgument(
        "settings.mode must be 'polling' (Keel asks Telegram for updates) or 'webhook' "
        "(Telegram posts them to the server's public_url), got '" +
        s.mode.substr(0, 32) + "'");
  }
  return s;
}

std::string TelegramWebhookSecret(const std::string& bot_token, const std::string& channel_id) {
  return HmacSha256Hex(bot_token, "keel telegram webhook " + channel_id);
}

Json TelegramSettingsJson(const TelegramSettings& s) {
  return {{"bot_token", s.bot_token},
          {"api_base", s.api_base},
          {"role", s.role},
          {"poll_timeout", s.poll_timeout},
          {"mode", s.mode}};
}

Result<TelegramInbound> RouteUpdate(const Json& update, const TelegramBot& bot) {
  // Telegram's update ids are positive and increase; one below 0 or past int64 (a Bot API
  // server of the tenant's choosing may send anything) is no update_id.
  if (!IsInt(update, "update_id") ||
      (update["update_id"].is_number_unsigned()
           ? update["update_id"].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
           : update["update_id"].get<int64_t>() < 0)) {
    return InvalidArgument("a Telegram update without a numeric update_id");
  }
  TelegramInbound in;
  in.update_id = std::to_string(update["update_id"].get<int64_t>());
  auto ignore = [&](std::string why) {
    in.ignored = std::move(why);
    return in;
  };
  if (!update.contains("message") || !update["message"].is_object()) {
    return ignore("not a new message");
  }
  const Json& msg = update["message"];
  const Json from = msg.value("from", Json::object());
  if (IsTrue(from, "is_bot")) return ignore("from a bot");
  // Anonymous group admins post as the group (is_bot with GroupAnonymousBot), and channel posts
  // have no person: without one there is no identity to answer to.
  if (!IsInt(from, "id")) return ignore("from no one");
  // Posted on behalf of a chat (a linked channel's automatic forwards come "from" Telegram's
  // service account, 777000): no person wrote it.
  if (msg.contains("sender_chat") || IsTrue(msg, "is_automatic_forward")) {
    return ignore("posted on behalf of a chat");
  }
  if (!msg.contains("text") || !msg["text"].is_string()) return ignore("not a text message");
  const Json chat = msg.value("chat", Json::object());
  if (!IsInt(chat, "id") || !chat.contains("type") || !chat["type"].is_string()) {
    return ignore("no chat");
  }
  const std::string type = chat["type"].get<std::string>();
  const std::string text = msg["text"].get<std::string>();
  const int64_t chat_id = chat["id"].get<int64_t>();
  in.target = {{"chat_id", chat_id}};
  if (type == "private") {
    in.content = text;
  } else if (type == "group" || type == "supergroup") {
    const Json replied = msg.value("reply_to_message", Json::object());
    const bool to_bot = replied.is_object() && IsInt(replied.value("from", Json::object()), "id") &&
                        replied["from"]["id"].get<int64_t>() == bot.id;
    in.direct = false;
    in.addressed = to_bot || Mentions(text, bot.username);
    in.content = SenderName(from) + ": " + text;
    if (IsInt(msg, "message_id")) in.target["reply_to"] = msg["message_id"];
  } else {
    return ignore("a " + type.substr(0, 32) + " chat");
  }
  if (IsTrue(msg, "is_topic_message") && IsInt(msg, "message_thread_id")) {
    in.target["thread_id"] = msg["message_thread_id"];
  }
  in.conversation = "chat:" + std::to_string(chat_id);
  in.sender_id = std::to_string(from["id"].get<int64_t>());
  in.sender_name = SenderName(from);
  in.text = text;
  in.take = true;
  return in;
}

std::vector<std::string> ReplyParts(const std::string& answer, size_t max_units, bool escape) {
  std::vector<std::string> parts;
  const size_t n = answer.size();
  size_t start = 0;
  auto keep = [&](size_t from, size_t to) {
    std::string_view part = std::string_view(answer).substr(from, to - from);
    // Telegram refuses a message of only whitespace.
    if (part.find_first_not_of(" \t\r\n") != std::string_view::npos) {
      parts.push_back(escape ? EscapeHtml(part) : std::string(part));
    }
  };
  while (start < n) {
    size_t i = start;
    size_t units = 0;
    while (i < n) {
      size_t bytes = SequenceBytes(static_cast<unsigned char>(answer[i]));
      size_t u = bytes == 4 ? 2 : 1;  // outside the BMP: a surrogate pair
      if (units + u > max_units) break;
      units += u;
      i = std::min(n, i + bytes);
    }
    if (i >= n) {
      keep(start, n);
      break;
    }
    // `i` is the first character that does not fit: cut at a newline, else a space, at or
    // before it (the separator itself is not sent).
    size_t cut = answer.rfind('\n', i);
    if (cut == std::string::npos || cut <= start) cut = answer.rfind(' ', i);
    if (cut == std::string::npos || cut <= start) {
      keep(start, i);
      start = i;
    } else {
      keep(start, cut);
      start = cut + 1;
    }
  }
  return parts;
}

Json SendMessageBody(const Json& target, const std::string& part, size_t index) {
  Json body = {
      {"chat_id", target.value("chat_id", Json(0))}, {"text", part}, {"parse_mode", "HTML"}};
  if (index == 0 && target.contains("reply_to")) {
    body["reply_parameters"] = {{"message_id", target["reply_to"]},
                                {"allow_sending_without_reply", true}};
  }
  if (target.contains("thread_id")) body["message_thread_id"] = target["thread_id"];
  return body;
}

}  // namespace keel::channels

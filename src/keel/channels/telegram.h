#pragma once
// The Telegram channel (docs/CHANNELS.md): a bot whose updates the leader long-polls from the
// Bot API (getUpdates) and whose answers it sends (sendMessage). Pure functions: what a
// binding's settings are, which updates an agent takes and where each goes, how an answer
// becomes the parts Telegram takes. The relay (channels/relay.h) does the I/O.

#include <cstdint>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::channels {

inline constexpr const char* kTelegramApi = "https://api.telegram.org";
// The longest text one sendMessage takes, in UTF-16 code units after entity parsing.
inline constexpr size_t kTelegramMaxText = 4096;
// An answer that holds this is not sent (the agent chose to stay silent).
inline constexpr const char* kNoReply = "<NO_REPLY>";

struct TelegramSettings {
  std::string bot_token;                // the name of the tenant secret holding the bot's token
  std::string api_base = kTelegramApi;  // the Bot API server (a self-hosted one, a proxy, a fake)
  std::string role = "guest";           // the role the runs act with: guest | user
  int poll_timeout = 25;                // getUpdates' long-poll timeout, seconds (0..50)
  // "polling": Keel asks for updates (getUpdates); "webhook": Telegram posts them to
  // POST /v1/hooks/{id} at the server's public_url (setWebhook).
  std::string mode = "polling";
};

// The secret_token Keel gives setWebhook for channel `channel_id`, which Telegram sends back in
// X-Telegram-Bot-Api-Secret-Token with each update: HMAC-SHA256 of the channel's id under the
// bot's token, hex (no secret of its own to keep, and a new one with a new token).
std::string TelegramWebhookSecret(const std::string& bot_token, const std::string& channel_id);

Result<TelegramSettings> ParseTelegramSettings(const Json& settings);
Json TelegramSettingsJson(const TelegramSettings& s);

// Whether a bot token can go in a Bot API URL's path (digits, ':', letters, '-', '_'), so that
// a secret's value cannot change which URL is called.
bool ValidBotToken(const std::string& token);

// The bot as getMe describes it: mentions and replies to it are how a group calls it.
struct TelegramBot {
  int64_t id = 0;
  std::string username;
};

// What an update asks of the agent.
struct TelegramInbound {
  std::string update_id;  // decimal
  bool take = false;      // false: the agent does not see it (`ignored` says why)
  std::string ignored;
  std::string conversation;  // "chat:ID": one session per chat, group or private
  std::string content;       // the message the agent gets
  Json target;               // where its answer goes: {"chat_id", "reply_to"?, "thread_id"?}
  // Who wrote it and how: the platform's id of the person and the name it gives them, what
  // they wrote, whether the conversation is a direct one with the bot and whether the message
  // calls the bot (users.h's rules decide what becomes of it).
  std::string sender_id;
  std::string sender_name;
  std::string text;
  bool direct = true;
  bool addressed = true;
};

// The routing rules: a private chat's every text message; in a group or supergroup, every text
// (prefixed with its sender's name), `addressed` when it mentions the bot or replies to it (the
// agent's owners talk to it without either); nothing from a bot, no other kind of update or
// message. kInvalidArgument for an update without a numeric
// update_id (the poll cannot go past it).
Result<TelegramInbound> RouteUpdate(const Json& update, const TelegramBot& bot);

// An answer as the parts sendMessage takes with parse_mode HTML: split at kTelegramMaxText
// (at the last newline within it when there is one, else the last space, else anywhere
// between characters; the separator is dropped), each part's text escaped; parts of only
// whitespace are left out. Empty for an answer of only whitespace.
// `max_units`: another platform's limit (Slack's mrkdwn escapes the same three characters);
// `escape` false for a platform whose text is not markup (Discord's markdown).
std::vector<std::string> ReplyParts(const std::string& answer, size_t max_units = kTelegramMaxText,
                                    bool escape = true);

// The sendMessage body of part `index` to `target` (RouteUpdate's): the first part of a
// group's answer replies to the message it answers.
Json SendMessageBody(const Json& target, const std::string& part, size_t index);

}  // namespace keel::channels

#pragma once
// The Discord channel (docs/CHANNELS.md): a Discord application whose interactions endpoint is
// POST /v1/hooks/{id}. A slash command (registered by the leader) talks to the agent: Discord
// posts the interaction signed with Ed25519, Keel answers "deferred" once its message is durable,
// and the answer edits that deferred response through the interaction's token (good for 15
// minutes), or after that is posted to the channel as the bot. Pure functions: the settings, the
// signature, which interactions the agent takes and where each goes; the relay does the I/O.

#include <string>
#include <string_view>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"

namespace keel::channels {

inline constexpr const char* kDiscordApi = "https://discord.com/api/v10";
inline constexpr size_t kDiscordMaxText = 2000;
// How long an answer goes through the interaction's token (Discord's limit is 15 minutes);
// later, it is posted to the channel with the bot's token.
inline constexpr Millis kDiscordTokenMs = 14 * 60 * 1000;

struct DiscordSettings {
  std::string application_id;          // the application's id (a snowflake)
  std::string public_key;              // its public key, 64 hex characters (not a secret)
  std::string bot_token;               // the tenant secret holding the bot's token
  std::string command = "ask";         // the slash command that talks to the agent
  std::string api_base = kDiscordApi;  // the HTTP API's base (a proxy, a test fake)
  std::string role = "guest";          // the role the runs act with: guest | user
};

Result<DiscordSettings> ParseDiscordSettings(const Json& settings);
Json DiscordSettingsJson(const DiscordSettings& s);

// The checks that need no key: both headers, the timestamp unix seconds within five minutes of
// `now`, the signature 128 hex characters. kUnauthenticated.
Status CheckDiscordHeaders(std::string_view timestamp, std::string_view signature, Millis now);
// kUnauthenticated unless `signature` (hex) is the Ed25519 signature of TIMESTAMP + BODY under
// `public_key` (hex) and the headers pass CheckDiscordHeaders.
Status VerifyDiscordSignature(std::string_view public_key, std::string_view timestamp,
                              std::string_view signature, std::string_view body, Millis now);

// What an interaction asks of the agent.
struct DiscordInbound {
  int type = 0;  // 1: a PING; 2: an application command
  std::string interaction_id;
  bool take = false;
  std::string notice;        // not taken: what the user is told (ephemerally)
  std::string conversation;  // "channel:ID" in a server, "dm:ID" in a direct message
  std::string content;
  Json target;  // where its answer goes: {"application_id", "token", "channel_id", "at"}
  // Who wrote it and how: the platform's id of the person and the name it gives them, what
  // they wrote, whether the conversation is a direct one with the bot and whether the message
  // calls the bot (users.h's rules decide what becomes of it).
  std::string sender_id;
  std::string sender_name;
  std::string text;
  bool direct = true;
  bool addressed = true;
};

// The rules: a PING is answered; the channel's command from a person is taken (its "message"
// option; in a server prefixed with the member's name), one session per Discord channel; another
// command, or one from a bot, is answered with a notice and not taken. kInvalidArgument for an
// interaction without an id, a token or a channel. `now`: when it came; the token's age counts
// from the interaction's id (a snowflake's time) when that is earlier.
Result<DiscordInbound> RouteInteraction(const Json& interaction, const DiscordSettings& s,
                                        Millis now);

// The slash command as the commands API takes it.
Json DiscordCommandJson(const std::string& command);

}  // namespace keel::channels

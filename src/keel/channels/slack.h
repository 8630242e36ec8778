#pragma once
// The Slack channel (docs/CHANNELS.md): a Slack app whose Events API requests Slack posts to
// POST /v1/hooks/{id}, signed with the app's signing secret, and whose answers Keel posts with
// chat.postMessage. Pure functions: the settings, the request signature, which events an agent
// takes and where each goes. The relay (channels/relay.h) does the I/O.

#include <string>
#include <string_view>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"

namespace keel::channels {

inline constexpr const char* kSlackApi = "https://slack.com/api";
// The longest text Keel puts in one chat.postMessage (Slack truncates past 40,000 and advises
// at most 4,000).
inline constexpr size_t kSlackMaxText = 4000;

struct SlackSettings {
  std::string signing_secret;        // the tenant secret holding the app's signing secret
  std::string bot_token;             // the tenant secret holding the bot's token (xoxb-...)
  std::string api_base = kSlackApi;  // the Web API's base (a proxy, a test fake)
  std::string role = "guest";        // the role the runs act with: guest | user
};

Result<SlackSettings> ParseSlackSettings(const Json& settings);
Json SlackSettingsJson(const SlackSettings& s);

// The checks of VerifySlackSignature that need no key: both headers present, the timestamp unix
// seconds within five minutes of `now`. Made before the channel is read. kUnauthenticated.
Status CheckSlackHeaders(std::string_view timestamp, std::string_view signature, Millis now);

// kUnauthenticated unless `timestamp` (unix seconds) is within five minutes of `now` and
// `signature` is "v0=" and the hex HMAC-SHA256 of "v0:TIMESTAMP:BODY" under `secret`, compared in
// constant time.
Status VerifySlackSignature(std::string_view secret, std::string_view timestamp,
                            std::string_view signature, std::string_view body, Millis now);

// What an Events API request asks of the agent.
struct SlackInbound {
  std::string event_id;
  bool take = false;  // false: the agent does not see it (`ignored` says why)
  std::string ignored;
  std::string conversation;  // "im:CHANNEL" (a direct conversation) or "thread:CHANNEL:ROOT_TS"
  std::string content;
  Json target;  // where its answer goes: {"channel", "thread_ts"?}
  // Who wrote it and how: the platform's id of the person and the name it gives them, what
  // they wrote, whether the conversation is a direct one with the bot and whether the message
  // calls the bot (users.h's rules decide what becomes of it).
  std::string sender_id;
  std::string sender_name;
  std::string text;
  bool direct = true;
  bool addressed = true;
  // Not addressed, but written in a thread (its thread_ts): a reply to the bot when the agent
  // already has the thread's conversation (the relay looks).
  bool in_thread = false;
};

// The routing rules: a direct message (channel_type "im") is taken as it was typed (Slack's
// &amp; &lt; &gt; decoded), one session per
// conversation; in a channel, an app_mention is taken with the bot's mention removed, one session
// per thread (its root: the event's thread_ts, or its own ts), and a message of a public or
// private channel (the app subscribed to message.channels or message.groups) that does not
// mention the bot is taken to the same thread, not `addressed` (only the agent's owners are
// heard so) unless it answers in a thread the agent talks in (`in_thread`); nothing from a bot, no
// edit or other subtype, no other event. kInvalidArgument for an event_callback without an event_id
// or an event.
Result<SlackInbound> RouteSlackEvent(const Json& envelope);

// The chat.postMessage body of part `index` of an answer to `target`.
Json SlackPostBody(const Json& target, const std::string& part);

}  // namespace keel::channels

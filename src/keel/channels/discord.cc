#include "keel/channels/discord.h"

#include "keel/channels/webhook.h"
#include "keel/common/crypto.h"

namespace keel::channels {

namespace {

std::string Str(const Json& j, const char* key, size_t most = 200) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  const auto& s = j[key].get_ref<const std::string&>();
  return s.size() <= most ? s : "";
}

bool Snowflake(const std::string& s) {
  return !s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

Result<DiscordSettings> ParseDiscordSettings(const Json& settings) {
  if (!settings.is_object()) return InvalidArgument("settings must be an object");
  for (auto it = settings.begin(); it != settings.end(); ++it) {
    const std::string& k = it.key();
    if (k != "application_id" && k != "public_key" && k != "bot_token" && k != "command" &&
        k != "api_base" && k != "role") {
      return InvalidArgument("unknown field 'settings." + k.substr(0, 64) +
                             "' (a discord channel takes application_id, public_key, bot_token, "
                             "command, api_base, role)");
    }
  }
  DiscordSettings s;
  KEEL_ASSIGN_OR_RETURN(s.application_id, SettingsString(settings, "application_id", ""));
  if (!Snowflake(s.application_id)) {
    return InvalidArgument("settings.application_id must be the application's id: 1 to 20 digits");
  }
  KEEL_ASSIGN_OR_RETURN(s.public_key, SettingsString(settings, "public_key", ""));
  auto key = HexDecode(s.public_key);
  if (!key || key->size() != 32) {
    return InvalidArgument(
        "settings.public_key must be the application's public key: 64 hex characters");
  }
  KEEL_ASSIGN_OR_RETURN(s.bot_token, SettingsString(settings, "bot_token", ""));
  if (s.bot_token.empty()) {
    return InvalidArgument(
        "settings.bot_token is required: the name of the tenant secret holding the bot's token");
  }
  KEEL_ASSIGN_OR_RETURN(s.command, SettingsString(settings, "command", "ask"));
  bool named = !s.command.empty() && s.command.size() <= 32;
  for (char c : s.command) {
    named = named && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_');
  }
  if (!named) {
    return InvalidArgument(
        "settings.command must be 1 to 32 lower-case letters, digits, '-' or '_' (the slash "
        "command's name)");
  }
  KEEL_ASSIGN_OR_RETURN(s.api_base, SettingsApiBase(settings, kDiscordApi, "the HTTP API's base"));
  KEEL_ASSIGN_OR_RETURN(s.role, SettingsRole(settings));
  return s;
}

Json DiscordSettingsJson(const DiscordSettings& s) {
  return {{"application_id", s.application_id},
          {"public_key", s.public_key},
          {"bot_token", s.bot_token},
          {"command", s.command},
          {"api_base", s.api_base},
          {"role", s.role}};
}

Status CheckDiscordHeaders(std::string_view timestamp, std::string_view signature, Millis now) {
  int64_t seconds = 0;
  bool digits = !timestamp.empty() && timestamp.size() <= 12;
  for (char c : timestamp) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) seconds = seconds * 10 + (c - '0');
  }
  if (!digits || std::abs(now - seconds * 1000) > 5 * 60 * 1000) {
    return Unauthenticated("X-Signature-Timestamp is not unix seconds within five minutes");
  }
  if (signature.size() != 128 || !HexDecode(signature)) {
    return Unauthenticated("X-Signature-Ed25519 is not an Ed25519 signature (128 hex characters)");
  }
  return Status::Ok();
}

Status VerifyDiscordSignature(std::string_view public_key, std::string_view timestamp,
                              std::string_view signature, std::string_view body, Millis now) {
  KEEL_RETURN_IF_ERROR(CheckDiscordHeaders(timestamp, signature, now));
  auto key = HexDecode(public_key);
  auto sig = HexDecode(signature);
  std::string message(timestamp);
  message.append(body);
  if (!key || !sig || !Ed25519Verify(*key, message, *sig)) {
    return Unauthenticated("X-Signature-Ed25519 does not match");
  }
  return Status::Ok();
}

Result<DiscordInbound> RouteInteraction(const Json& interaction, const DiscordSettings& s,
                                        Millis now) {
  DiscordInbound in;
  if (!interaction.is_object() || !interaction.contains("type") ||
      !interaction["type"].is_number_integer()) {
    return InvalidArgument("an interaction without a type");
  }
  in.type = interaction["type"].get<int>();
  in.interaction_id = Str(interaction, "id", 20);
  if (in.type == 1) return in;
  if (!Snowflake(in.interaction_id)) return InvalidArgument("an interaction without an id");
  const std::string token = Str(interaction, "token", 1000);
  const std::string channel = Str(interaction, "channel_id", 20);
  if (token.empty() || !Snowflake(channel)) {
    return InvalidArgument("an interaction without a token or a channel");
  }
  // The token's 15 minutes count from when Discord made the interaction, which its id says
  // (a snowflake: milliseconds since 2015 above its low 22 bits).
  Millis made = now;
  try {
    made = std::min<Millis>(
        now, static_cast<Millis>(std::stoull(in.interaction_id) >> 22) + 1420070400000LL);
  } catch (const std::exception&) {
  }
  in.target = {{"application_id", s.application_id},
               {"token", token},
               {"channel_id", channel},
               {"at", made}};
  const Json data = interaction.value("data", Json::object());
  const bool in_server = interaction.contains("guild_id") && interaction["guild_id"].is_string();
  const Json member = interaction.value("member", Json::object());
  const Json user = in_server && member.is_object() ? member.value("user", Json::object())
                                                    : interaction.value("user", Json::object());
  if (in.type != 2 || !data.is_object() || Str(data, "name", 32) != s.command) {
    in.notice = "This command is not one this app answers: use /" + s.command + ".";
    return in;
  }
  if (user.is_object() && user.contains("bot") && user["bot"] == true) {
    in.notice = "Bots are not answered here.";
    return in;
  }
  std::string text;
  if (data.contains("options") && data["options"].is_array()) {
    for (const auto& o : data["options"]) {
      if (Str(o, "name", 32) == "message" && o.contains("value") && o["value"].is_string()) {
        text = o["value"].get<std::string>();
      }
    }
  }
  if (text.empty()) {
    in.notice = "Say something: /" + s.command + " message:...";
    return in;
  }
  in.sender_id = Str(user, "id", 32);
  if (in.sender_id.empty()) {
    in.notice = "Who sent this is not said: it is not answered.";
    return in;
  }
  std::string name = in_server ? Str(member, "nick", 100) : "";
  if (name.empty()) name = Str(user, "global_name", 100);
  if (name.empty()) name = Str(user, "username", 100);
  in.sender_name = name;
  in.text = text;
  in.direct = !in_server;
  if (in_server) {
    in.content = (name.empty() ? "someone" : name) + ": " + text;
    in.conversation = "channel:" + channel;
  } else {
    in.content = text;
    in.conversation = "dm:" + channel;
  }
  in.take = true;
  return in;
}

Json DiscordCommandJson(const std::string& command) {
  return {{"name", command},
          {"type", 1},
          {"description", "Ask the agent"},
          {"options", Json::array({{{"type", 3},
                                    {"name", "message"},
                                    {"description", "What to ask"},
                                    {"required", true}}})}};
}

}  // namespace keel::channels

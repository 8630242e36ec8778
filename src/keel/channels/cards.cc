#include "keel/channels/cards.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "keel/approvals/approvals.h"
#include "keel/common/ids.h"
#include "keel/policy/policy.h"
#include "keel/policy/stored.h"
#include "keel/store/channel_store.h"
#include "keel/store/store.h"
#include "keel/store/user_store.h"

namespace keel::channels {
namespace {

constexpr const char* kApprovePrefix = "keel:approve:";
constexpr const char* kRejectPrefix = "keel:reject:";
constexpr size_t kMaxCardBytes = 1900;  // under Discord's 2,000 characters, Slack's 3,000

std::string Text(const Json& j, const char* field, size_t max = 200) {
  if (!j.is_object() || !j.contains(field) || !j[field].is_string()) return "";
  std::string s = j[field].get<std::string>();
  return s.size() > max ? "" : s;
}

// Whether `field` is JSON true (anything else, a string "true" included, is not).
bool IsTrue(const Json& j, const char* field) {
  return j.is_object() && j.contains(field) && j[field].is_boolean() && j[field].get<bool>();
}

std::string IdText(const Json& j, const char* field) {
  if (!j.is_object() || !j.contains(field)) return "";
  if (j[field].is_number_integer()) return std::to_string(j[field].get<int64_t>());
  return Text(j, field, 64);
}

// Slack's markup uses bare &, < and > (a "<!channel>" in a tool's arguments would ping a
// channel): escaped as Slack asks, within a section's 3,000 characters (the escapes count; a
// text cut short ends with "...", never inside an escape or a character).
std::string SlackEscape(const std::string& s) {
  constexpr size_t kMax = 2900;
  std::string out;
  out.reserve(std::min(s.size(), kMax));
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const char* piece = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : nullptr;
    size_t n = 1;
    if (piece) {
      n = std::char_traits<char>::length(piece);
    } else {  // a whole UTF-8 character
      const auto lead = static_cast<unsigned char>(c);
      n = lead < 0xC0 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
      n = std::min(n, s.size() - i);
    }
    if (out.size() + n > kMax - 3) {
      out += "...";
      break;
    }
    if (piece) {
      out += piece;
    } else {
      out.append(s, i, n);
      i += n - 1;
    }
  }
  return out;
}

std::string Joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string FormDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && HexDigit(s[i + 1]) >= 0 &&
               HexDigit(s[i + 2]) >= 0) {
      out += static_cast<char>(HexDigit(s[i + 1]) * 16 + HexDigit(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Where a direct conversation's messages go, from its key (channels/*.h's routing).
std::optional<Json> DirectTarget(const std::string& kind, const std::string& conversation) {
  auto rest = [&](const char* prefix) -> std::string {
    const std::string p = prefix;
    return conversation.rfind(p, 0) == 0 ? conversation.substr(p.size()) : "";
  };
  if (kind == "telegram") {
    const std::string id = rest("chat:");
    if (id.empty() || id.size() > 20) return std::nullopt;
    try {
      size_t used = 0;
      const int64_t chat = std::stoll(id, &used);
      if (used != id.size()) return std::nullopt;
      return Json{{"chat_id", chat}};
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (kind == "slack" && !rest("im:").empty()) return Json{{"channel", rest("im:")}};
  if (kind == "discord" && !rest("dm:").empty()) return Json{{"channel_id", rest("dm:")}};
  return std::nullopt;
}

// Where a card in the conversation an answer goes to goes.
Json ConversationTarget(const std::string& kind, const Json& answer_target) {
  if (kind == "discord") {
    return Json{{"channel_id", answer_target.value("channel_id", std::string())}};
  }
  return answer_target;
}

Json Buttons(const std::string& approval_id) {
  return Json::array({{{"text", "Approve"}, {"callback_data", ButtonData(approval_id, true)}},
                      {{"text", "Reject"}, {"callback_data", ButtonData(approval_id, false)}}});
}

// The approvers of the agent's approvals (policy.h's Approvers), as the users they now are:
// named ones, else the agent's owners.
Result<std::vector<std::string>> ApproversOf(store::Tx& tx, const std::string& tenant_id,
                                             const std::string& agent_id) {
  KEEL_ASSIGN_OR_RETURN(auto frame, policy::LoadPolicy(tx, tenant_id, ""));
  KEEL_ASSIGN_OR_RETURN(auto narrowing, policy::LoadPolicy(tx, tenant_id, agent_id));
  std::vector<std::string> named =
      policy::Approvers(frame ? &*frame : nullptr, narrowing ? &*narrowing : nullptr);
  std::vector<std::string> out;
  auto add = [&](const std::string& id) -> Status {
    auto user = access::CurrentUser(tx, tenant_id, id);
    if (user.status().code() == Code::kNotFound) return Status::Ok();  // named, never made
    KEEL_RETURN_IF_ERROR(user.status());
    if (std::find(out.begin(), out.end(), user->id) == out.end()) out.push_back(user->id);
    return Status::Ok();
  };
  if (!named.empty()) {
    for (const auto& id : named) KEEL_RETURN_IF_ERROR(add(id));
    return out;
  }
  store::Page page{"", 200};
  do {
    KEEL_ASSIGN_OR_RETURN(auto members, tx.users().ListMembers(tenant_id, agent_id, page));
    for (const auto& m : members.items) {
      if (m.role == "owner") KEEL_RETURN_IF_ERROR(add(m.user_id));
    }
    page.cursor = members.next_cursor;
  } while (!page.cursor.empty());
  return out;
}

}  // namespace

std::string ButtonData(const std::string& approval_id, bool approve) {
  return (approve ? kApprovePrefix : kRejectPrefix) + approval_id;
}

std::optional<std::pair<std::string, bool>> ParseButtonData(const std::string& data) {
  for (bool approve : {true, false}) {
    const std::string prefix = approve ? kApprovePrefix : kRejectPrefix;
    if (data.rfind(prefix, 0) != 0) continue;
    std::string id = data.substr(prefix.size());
    if (id.empty() || id.size() > 64) return std::nullopt;
    return std::pair(std::move(id), approve);
  }
  return std::nullopt;
}

std::optional<Press> TelegramPress(const Json& update) {
  if (!update.is_object() || !update.contains("callback_query")) return std::nullopt;
  const Json& q = update["callback_query"];
  if (!q.is_object()) return std::nullopt;
  auto button = ParseButtonData(Text(q, "data", 64));
  const Json from = q.value("from", Json::object());
  const std::string who = IdText(from, "id");
  const std::string handle = Text(q, "id", 64);
  if (who.empty() || handle.empty() || IsTrue(from, "is_bot")) return std::nullopt;
  // Another button (none of Keel's) is a press too: answered, so the client stops waiting.
  Press p;
  if (button) std::tie(p.approval_id, p.approve) = *button;
  std::string name = Text(from, "username", 64);
  if (name.empty()) name = Text(from, "first_name", 64);
  p.sender = {"telegram", who, name};
  p.handle = handle;
  const Json msg = q.value("message", Json::object());
  const Json chat = msg.is_object() ? msg.value("chat", Json::object()) : Json::object();
  if (chat.is_object() && chat.contains("id") && chat["id"].is_number_integer() &&
      msg.contains("message_id") && msg["message_id"].is_number_integer()) {
    p.message = {{"chat_id", chat["id"]}, {"message_id", msg["message_id"]}};
  }
  return p;
}

std::optional<Press> SlackPress(const Json& payload) {
  if (!payload.is_object() || Text(payload, "type") != "block_actions") return std::nullopt;
  const Json actions = payload.value("actions", Json::array());
  if (!actions.is_array() || actions.empty() || !actions[0].is_object()) return std::nullopt;
  auto button = ParseButtonData(Text(actions[0], "value", 100));
  const Json user = payload.value("user", Json::object());
  const std::string who = Text(user, "id", 32);
  if (!button || who.empty()) return std::nullopt;
  Press p;
  p.approval_id = button->first;
  p.approve = button->second;
  std::string name = Text(user, "username", 80);
  if (name.empty()) name = Text(user, "name", 80);
  p.sender = {"slack", who, name};
  const Json channel = payload.value("channel", Json::object());
  const Json container = payload.value("container", Json::object());
  const Json message = payload.value("message", Json::object());
  std::string ts = Text(container, "message_ts", 32);
  if (ts.empty()) ts = Text(message, "ts", 32);
  p.message = {{"channel", Text(channel, "id", 32)}, {"ts", ts}};
  std::string thread = Text(container, "thread_ts", 32);
  if (thread.empty()) thread = Text(message, "thread_ts", 32);
  if (!thread.empty()) p.message["thread_ts"] = thread;
  return p;
}

std::optional<Press> DiscordPress(const Json& interaction) {
  if (!interaction.is_object() || !interaction.contains("type") || interaction["type"] != 3) {
    return std::nullopt;
  }
  const Json data = interaction.value("data", Json::object());
  auto button = ParseButtonData(Text(data, "custom_id", 100));
  const Json member = interaction.value("member", Json::object());
  const Json user = member.is_object() && member.contains("user")
                        ? member["user"]
                        : interaction.value("user", Json::object());
  const std::string who = Text(user, "id", 20);
  if (!button || who.empty() || IsTrue(user, "bot")) return std::nullopt;
  Press p;
  p.approval_id = button->first;
  p.approve = button->second;
  p.sender = {"discord", who, Text(user, "username", 64)};
  const Json msg = interaction.value("message", Json::object());
  p.message = {{"channel_id", Text(msg, "channel_id", 20)}, {"message_id", Text(msg, "id", 20)}};
  return p;
}

std::string FormField(const std::string& body, const std::string& field) {
  size_t at = 0;
  while (at <= body.size()) {
    size_t end = body.find('&', at);
    if (end == std::string::npos) end = body.size();
    std::string_view pair(body.data() + at, end - at);
    const size_t eq = pair.find('=');
    if (eq != std::string_view::npos && FormDecode(pair.substr(0, eq)) == field) {
      return FormDecode(pair.substr(eq + 1));
    }
    at = end + 1;
  }
  return "";
}

std::string CardText(const store::Approval& a, const std::string& agent_name) {
  std::string text = "Approval needed: " + TruncateUtf8(agent_name, 100) + " wants to run " +
                     TruncateUtf8(a.tool, 200) +
                     "\nArguments: " + TruncateUtf8(DumpJson(a.arguments), 800);
  if (!a.reason.empty()) text += "\nWhy: " + TruncateUtf8(a.reason, 300);
  text += "\nExpires: " + FormatRfc3339(a.expires_at) + "\nApproval " + a.id;
  return TruncateUtf8(text, kMaxCardBytes);
}

std::string DecidedText(const store::Approval& a, const std::string& decider) {
  std::string how;
  if (a.status == "approved") {
    how = "Approved by " + TruncateUtf8(decider, 200);
  } else if (a.status == "rejected") {
    how = "Rejected by " + TruncateUtf8(decider, 200);
  } else if (a.status == "expired") {
    how = "Expired: nobody decided in time";
  } else if (a.status == "cancelled") {
    how = "Cancelled with its run";
  } else {
    how = "Decided (" + a.status + ")";
  }
  return TruncateUtf8(how + ": " + TruncateUtf8(a.tool, 200) + "\nApproval " + a.id, kMaxCardBytes);
}

Json TelegramCardBody(const Json& target, const std::string& text, const std::string& approval_id) {
  Json body = {{"chat_id", target.value("chat_id", Json(0))},
               {"text", text},
               {"reply_markup", {{"inline_keyboard", Json::array({Buttons(approval_id)})}}}};
  if (target.contains("reply_to")) {
    body["reply_parameters"] = {{"message_id", target["reply_to"]},
                                {"allow_sending_without_reply", true}};
  }
  if (target.contains("thread_id")) body["message_thread_id"] = target["thread_id"];
  return body;
}

Json TelegramEditBody(const Json& message, const std::string& text) {
  return {{"chat_id", message.value("chat_id", Json(0))},
          {"message_id", message.value("message_id", Json(0))},
          {"text", text},
          {"reply_markup", {{"inline_keyboard", Json::array()}}}};
}

Json SlackCardBody(const Json& target, const std::string& text, const std::string& approval_id) {
  const std::string shown = SlackEscape(text);
  auto button = [&](bool approve) {
    return Json{{"type", "button"},
                {"action_id", approve ? "keel_approve" : "keel_reject"},
                {"text", {{"type", "plain_text"}, {"text", approve ? "Approve" : "Reject"}}},
                {"style", approve ? "primary" : "danger"},
                {"value", ButtonData(approval_id, approve)}};
  };
  Json body = {{"channel", target.value("channel", std::string())},
               {"text", shown},
               {"blocks",
                Json::array({{{"type", "section"}, {"text", {{"type", "mrkdwn"}, {"text", shown}}}},
                             {{"type", "actions"},
                              {"block_id", "keel_approval"},
                              {"elements", Json::array({button(true), button(false)})}}})}};
  if (target.contains("thread_ts")) body["thread_ts"] = target["thread_ts"];
  return body;
}

Json SlackEditBody(const Json& message, const std::string& text) {
  const std::string shown = SlackEscape(text);
  return {{"channel", message.value("channel", std::string())},
          {"ts", message.value("ts", std::string())},
          {"text", shown},
          {"blocks",
           Json::array({{{"type", "section"}, {"text", {{"type", "mrkdwn"}, {"text", shown}}}}})}};
}

Json DiscordCardBody(const std::string& text, const std::string& approval_id) {
  auto button = [&](bool approve) {
    return Json{{"type", 2},
                {"style", approve ? 3 : 4},
                {"label", approve ? "Approve" : "Reject"},
                {"custom_id", ButtonData(approval_id, approve)}};
  };
  return {
      {"content", text},
      {"allowed_mentions", {{"parse", Json::array()}}},
      {"components",
       Json::array({{{"type", 1}, {"components", Json::array({button(true), button(false)})}}})}};
}

Json DiscordEditBody(const std::string& text) {
  return {{"content", text},
          {"allowed_mentions", {{"parse", Json::array()}}},
          {"components", Json::array()}};
}

Result<Json> CardMessage(const std::string& kind, const Json& answer) {
  if (kind == "telegram") {
    const Json& result =
        answer.is_object() && answer.contains("result") ? answer["result"] : Json();
    const Json chat = result.is_object() ? result.value("chat", Json::object()) : Json::object();
    if (result.is_object() && result.contains("message_id") &&
        result["message_id"].is_number_integer() && chat.is_object() && chat.contains("id") &&
        chat["id"].is_number_integer()) {
      return Json{{"chat_id", chat["id"]}, {"message_id", result["message_id"]}};
    }
  } else if (kind == "slack") {
    const std::string channel = Text(answer, "channel", 32), ts = Text(answer, "ts", 32);
    if (!channel.empty() && !ts.empty()) return Json{{"channel", channel}, {"ts", ts}};
  } else if (kind == "discord") {
    const std::string channel = Text(answer, "channel_id", 20), id = Text(answer, "id", 20);
    if (!channel.empty() && !id.empty()) return Json{{"channel_id", channel}, {"message_id", id}};
  }
  return InvalidArgument("the platform's answer does not say where the card is");
}

Status OpenCards(store::Tx& tx, const std::string& tenant_id, const std::string& approval_id,
                 Millis now) {
  KEEL_ASSIGN_OR_RETURN(store::Approval a, tx.approvals().GetApproval(tenant_id, approval_id));
  if (a.status != "pending") return Status::Ok();
  KEEL_ASSIGN_OR_RETURN(auto answer, tx.channels().RunReply(tenant_id, a.run_id));
  if (!answer) return Status::Ok();
  KEEL_ASSIGN_OR_RETURN(auto existing, tx.channels().ApprovalCards(tenant_id, a.id));
  if (!existing.empty()) return Status::Ok();
  KEEL_ASSIGN_OR_RETURN(store::Channel c, tx.channels().GetChannel(tenant_id, answer->channel_id));
  KEEL_ASSIGN_OR_RETURN(store::Agent agent, tx.agents().GetAgent(tenant_id, a.agent_id));

  store::ChannelReply card;
  card.tenant_id = tenant_id;
  card.channel_id = c.id;
  card.agent_id = a.agent_id;
  card.session_id = a.session_id;
  card.run_id = a.run_id;
  card.approval_id = a.id;
  card.status = "pending";
  card.text = CardText(a, agent.name);
  card.next_attempt_at = now;
  card.created_at = card.updated_at = now;
  auto insert = [&](const std::string& delivery, const Json& target, const std::string& user) {
    card.id = NewId();
    card.delivery_id = delivery;
    card.target = DumpJson(target);
    card.user_id = user;
    return tx.channels().InsertReply(card);
  };

  int shown = 0;
  std::vector<std::string> unreachable;
  if (c.enabled && (c.kind == "telegram" || c.kind == "slack" || c.kind == "discord")) {
    KEEL_ASSIGN_OR_RETURN(auto approvers, ApproversOf(tx, tenant_id, a.agent_id));
    for (const auto& user_id : approvers) {
      KEEL_ASSIGN_OR_RETURN(auto identities, tx.users().UserIdentities(tenant_id, user_id));
      std::optional<Json> target;
      for (const auto& identity : identities) {
        if (identity.platform != c.kind) continue;
        KEEL_ASSIGN_OR_RETURN(auto conversation, tx.channels().ContactConversation(
                                                     tenant_id, c.id, identity.platform_user_id));
        if (conversation) target = DirectTarget(c.kind, *conversation);
        if (target) break;
      }
      if (!target) {
        unreachable.push_back(user_id);
        continue;
      }
      KEEL_RETURN_IF_ERROR(insert("approval:" + a.id + ":" + user_id, *target, user_id));
      ++shown;
    }
    if (shown == 0) {
      KEEL_ASSIGN_OR_RETURN(auto frame, policy::LoadPolicy(tx, tenant_id, ""));
      KEEL_ASSIGN_OR_RETURN(auto narrowing, policy::LoadPolicy(tx, tenant_id, a.agent_id));
      if (policy::ApprovalInConversation(frame ? &*frame : nullptr,
                                         narrowing ? &*narrowing : nullptr)) {
        auto target = ParseJson(answer->target);
        KEEL_RETURN_IF_ERROR(insert(
            "approval:" + a.id, ConversationTarget(c.kind, target.ok() ? *target : Json()), ""));
        ++shown;
      }
    }
  }
  if (shown > 0) return Status::Ok();
  // Nobody to show it to: a card that says so (the approval waits in the dashboard and the
  // API), so that it is not looked at again.
  card.status = "skipped";
  card.error = !c.enabled ? "the channel is disabled"
               : unreachable.empty()
                   ? "the agent has no approvers (owners, or the policy's approvers)"
                   : "no approver has an identity on " + c.kind +
                         " with a direct conversation with this channel's bot (" +
                         TruncateUtf8(Joined(unreachable), 300) +
                         "), and the policy does not allow a card in the conversation";
  card.error += ": decide it in the dashboard or the API";
  return insert("approval:" + a.id, Json::object(), "");
}

Result<PressOutcome> DecidePress(store::Tx& tx, const store::Channel& c, const Press& p,
                                 Millis now) {
  // Who pressed, first: someone who may not decide learns nothing of the approval, not even
  // whether it exists.
  KEEL_ASSIGN_OR_RETURN(auto identity,
                        tx.users().FindIdentity(c.tenant_id, p.sender.platform, p.sender.id));
  const PressOutcome refused{false,
                             "You may not decide this approval: only the agent's "
                             "approvers may (you are " +
                                 p.sender.platform + ":" + p.sender.id + ")."};
  if (!identity) return refused;
  KEEL_ASSIGN_OR_RETURN(auto user, access::CurrentUser(tx, c.tenant_id, identity->user_id));
  KEEL_ASSIGN_OR_RETURN(auto approvers, ApproversOf(tx, c.tenant_id, c.agent_id));
  if (std::find(approvers.begin(), approvers.end(), user.id) == approvers.end()) return refused;

  // Only an approval carded on this channel is decided from it: a forged button of another
  // agent's (or tenant's) approval is not known here.
  const PressOutcome unknown{false, "This approval is not known here."};
  if (p.approval_id.empty()) return unknown;
  auto found = tx.approvals().GetApproval(c.tenant_id, p.approval_id);
  if (found.status().code() == Code::kNotFound) return unknown;
  KEEL_ASSIGN_OR_RETURN(store::Approval a, std::move(found));
  KEEL_ASSIGN_OR_RETURN(auto cards, tx.channels().ApprovalCards(c.tenant_id, a.id));
  const bool carded = std::any_of(cards.begin(), cards.end(), [&](const store::ChannelReply& r) {
    return r.channel_id == c.id && r.status != "skipped";
  });
  if (!carded || a.agent_id != c.agent_id) return unknown;
  if (a.status != "pending") return PressOutcome{false, "Already decided: " + a.status + "."};

  // Separation of duties is approvals::Decide's (it knows who asked for the run).
  approvals::DecisionRequest d;
  d.tenant_id = c.tenant_id;
  d.approval_id = a.id;
  d.verdict = p.approve ? approvals::Verdict::kApprove : approvals::Verdict::kReject;
  d.decided_by = "user:" + user.id;
  auto decided = approvals::Decide(tx, d, now);
  if (decided.status().code() == Code::kConflict ||
      decided.status().code() == Code::kPermissionDenied) {
    std::string why = decided.status().message();
    if (!why.empty()) why[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(why[0])));
    return PressOutcome{false, why + "."};
  }
  KEEL_RETURN_IF_ERROR(decided.status());
  return PressOutcome{true, p.approve ? "Approved." : "Rejected."};
}

}  // namespace keel::channels

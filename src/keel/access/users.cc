#include "keel/access/users.h"

#include <array>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/json_util.h"
#include "keel/secrets/vault.h"
#include "keel/store/channel_store.h"
#include "keel/store/row_images.h"

namespace keel::access {

namespace {

int Rank(const std::string& role) {
  if (role == "owner") return 2;
  if (role == "user") return 1;
  return 0;
}

std::string HigherRole(const std::string& a, const std::string& b) {
  return Rank(a) >= Rank(b) ? a : b;
}

std::string Trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

// The access code a message offers: its text, or what follows a Telegram deep link's /start.
std::string OfferedCode(const std::string& text) {
  std::string t = Trimmed(text);
  for (const char* start : {"/start ", "/start@"}) {
    if (t.rfind(start, 0) != 0) continue;
    const auto space = t.find(' ');
    return space == std::string::npos ? "" : Trimmed(t.substr(space + 1));
  }
  return t;
}

// The sender's user, made (with its identity) when the identity is new.
Result<std::string> EnsureUser(store::Tx& tx, const std::string& tenant_id, const Sender& sender,
                               Millis now) {
  KEEL_ASSIGN_OR_RETURN(auto identity,
                        tx.users().FindIdentity(tenant_id, sender.platform, sender.id));
  if (identity) {
    KEEL_ASSIGN_OR_RETURN(auto user, CurrentUser(tx, tenant_id, identity->user_id));
    return user.id;
  }
  store::User u;
  u.id = NewId();
  u.tenant_id = tenant_id;
  u.name = TruncateUtf8(sender.name.empty() ? sender.platform + ":" + sender.id : sender.name,
                        kMaxUserName);
  u.created_at = u.updated_at = now;
  KEEL_RETURN_IF_ERROR(tx.users().InsertUser(u));
  tx.Carry("users", store::RowImage(u));
  KEEL_RETURN_IF_ERROR(tx.events().Append(
      {tenant_id, "user.created@v1", "", "", "", {{"user_id", u.id}, {"name", u.name}}}));
  store::Identity i{
      tenant_id, sender.platform, sender.id, u.id, TruncateUtf8(sender.name, kMaxUserName), now};
  KEEL_RETURN_IF_ERROR(tx.users().InsertIdentity(i));
  tx.Carry("identities", store::RowImage(i));
  KEEL_RETURN_IF_ERROR(tx.events().Append(
      {tenant_id,
       "identity.linked@v1",
       "",
       "",
       "",
       {{"user_id", u.id}, {"platform", i.platform}, {"platform_user_id", i.platform_user_id}}}));
  return u.id;
}

}  // namespace

bool ValidRole(const std::string& role) {
  return role == "owner" || role == "user" || role == "guest";
}

std::string LowerRole(const std::string& a, const std::string& b) {
  return Rank(a) <= Rank(b) ? a : b;
}

bool ValidPlatform(const std::string& platform) {
  return platform == "telegram" || platform == "slack" || platform == "discord";
}

bool ValidAccessLevel(const std::string& level) {
  return level == "public" || level == "protected" || level == "private";
}

Status CheckAccessCode(const std::string& code) {
  if (code.size() < 8 || code.size() > 128) {
    return InvalidArgument("an access code has 8 to 128 characters");
  }
  for (unsigned char c : code) {
    if (c < 0x20 || c == 0x7f) return InvalidArgument("an access code has no control characters");
  }
  if (code != Trimmed(code)) {
    return InvalidArgument("an access code neither starts nor ends with a space");
  }
  return Status::Ok();
}

std::string AccessCodeSecret(const std::string& agent_id) { return "keel.access-code." + agent_id; }

std::string NewAccessCode() {
  static constexpr char kAlphabet[] = "abcdefghjkmnpqrstuvwxyz23456789";  // no 0/o, 1/l/i
  const std::string random = RandomHex(12);
  std::string code;
  for (size_t i = 0; i < 12; ++i) {
    const int byte = std::stoi(random.substr(2 * i, 2), nullptr, 16);
    code += kAlphabet[byte % (sizeof(kAlphabet) - 1)];
  }
  return code;
}

Result<store::User> CurrentUser(store::Tx& tx, const std::string& tenant_id,
                                const std::string& id) {
  KEEL_ASSIGN_OR_RETURN(auto user, tx.users().GetUser(tenant_id, id));
  // A merge never points at a merged user (MergeUsers refuses one), so one hop is the end; the
  // bound only guards against a store edited by hand.
  for (int hops = 0; !user.merged_into.empty() && hops < 8; ++hops) {
    KEEL_ASSIGN_OR_RETURN(user, tx.users().GetUser(tenant_id, user.merged_into));
  }
  if (!user.merged_into.empty()) return NotFound("user not found: " + id);
  return user;
}

Result<std::optional<std::string>> UserRoleOn(store::Tx& tx, const std::string& tenant_id,
                                              const std::string& user_id,
                                              const std::string& agent_id) {
  KEEL_ASSIGN_OR_RETURN(auto user, CurrentUser(tx, tenant_id, user_id));
  KEEL_ASSIGN_OR_RETURN(auto member, tx.users().GetMember(tenant_id, agent_id, user.id));
  if (member) return std::optional<std::string>(member->role);
  KEEL_ASSIGN_OR_RETURN(auto access, tx.users().GetAccess(tenant_id, agent_id));
  if (access && access->level == "public") return std::optional<std::string>("guest");
  return std::optional<std::string>();
}

Status Reachable(store::Tx& tx, const std::string& tenant_id, const std::string& user_id,
                 const std::string& agent_id) {
  if (user_id.empty()) return Status::Ok();
  KEEL_ASSIGN_OR_RETURN(auto on, UserRoleOn(tx, tenant_id, user_id, agent_id));
  if (!on) return NotFound("agent not found: " + agent_id);
  return Status::Ok();
}

Status SetMember(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id,
                 const std::string& user_id, const std::string& role, Millis now) {
  KEEL_ASSIGN_OR_RETURN(auto before, tx.users().GetMember(tenant_id, agent_id, user_id));
  store::AgentMember m{tenant_id, agent_id, user_id, role, before ? before->created_at : now, now};
  KEEL_RETURN_IF_ERROR(tx.users().PutMember(m));
  tx.Carry("agent_members", store::RowImage(m));
  return tx.events().Append(
      {tenant_id, "agent.member_set@v1", agent_id, "", "", {{"user_id", user_id}, {"role", role}}});
}

Status MergeUsers(store::Tx& tx, const std::string& tenant_id, const std::string& from,
                  const std::string& into, Millis now) {
  if (from == into) return InvalidArgument("a user cannot be merged into itself");
  KEEL_ASSIGN_OR_RETURN(auto source, tx.users().GetUser(tenant_id, from));
  KEEL_ASSIGN_OR_RETURN(auto target, tx.users().GetUser(tenant_id, into));
  for (const auto* u : {&source, &target}) {
    if (!u->merged_into.empty()) {
      return InvalidArgument("user " + u->id + " was merged into " + u->merged_into + " already");
    }
  }
  KEEL_ASSIGN_OR_RETURN(auto identities, tx.users().UserIdentities(tenant_id, from));
  for (auto& i : identities) {
    i.user_id = into;
    KEEL_RETURN_IF_ERROR(tx.users().UpdateIdentity(i));
    tx.Carry("identities", store::RowImage(i));
  }
  KEEL_ASSIGN_OR_RETURN(auto roles, tx.users().UserMemberships(tenant_id, from));
  for (const auto& m : roles) {
    KEEL_ASSIGN_OR_RETURN(auto theirs, tx.users().GetMember(tenant_id, m.agent_id, into));
    store::AgentMember kept{tenant_id,
                            m.agent_id,
                            into,
                            theirs ? HigherRole(theirs->role, m.role) : m.role,
                            theirs ? theirs->created_at : m.created_at,
                            now};
    KEEL_RETURN_IF_ERROR(tx.users().PutMember(kept));
    tx.Carry("agent_members", store::RowImage(kept));
    KEEL_RETURN_IF_ERROR(tx.users().DeleteMember(tenant_id, m.agent_id, from));
    tx.Carry("agent_members",
             store::DeletedImage(
                 {{"tenant_id", tenant_id}, {"agent_id", m.agent_id}, {"user_id", from}}));
  }
  source.merged_into = into;
  source.updated_at = now;
  KEEL_RETURN_IF_ERROR(tx.users().UpdateUser(source));
  tx.Carry("users", store::RowImage(source));
  // Those merged into it before now name the user they are: a merge never names a merged one.
  KEEL_ASSIGN_OR_RETURN(auto earlier, tx.users().MergedInto(tenant_id, from));
  for (auto& u : earlier) {
    u.merged_into = into;
    u.updated_at = now;
    KEEL_RETURN_IF_ERROR(tx.users().UpdateUser(u));
    tx.Carry("users", store::RowImage(u));
  }
  return tx.events().Append(
      {tenant_id, "user.merged@v1", "", "", "", {{"user_id", from}, {"into", into}}});
}

constexpr Millis kDayMs = 24 * 3600 * 1000;

Result<Admission> AdmitSender(store::Tx& tx, const secrets::Vault& vault,
                              const std::string& tenant_id, const std::string& agent_id,
                              const std::string& channel_role, const Sender& sender,
                              const std::string& text, bool direct, bool addressed, int recent,
                              bool may_write, Millis now) {
  Admission out;
  // A notice, unless the sender was sent enough of them this minute.
  auto notice = [&](std::string text, int most) {
    if (recent <= most) out.notice = std::move(text);
    if (!out.notice.empty() && !may_write) out.needs_write = true;
    return out;
  };
  const std::string rate_notice =
      "You are writing faster than this agent takes messages from guests: wait a minute.";
  const std::string offered = OfferedCode(text);
  const bool maybe_code = CheckAccessCode(offered).ok();
  // Whether the text is the agent's access code (read only for a text that could be one).
  auto is_code = [&]() -> Result<bool> {
    if (!maybe_code) return false;
    KEEL_ASSIGN_OR_RETURN(auto access, tx.users().GetAccess(tenant_id, agent_id));
    if (!access || !access->code_set) return false;
    // A code that cannot be opened (its secret deleted, or no key-encryption key) lets no one
    // in.
    auto code = vault.Get(tx, tenant_id, AccessCodeSecret(agent_id));
    return code.ok() && ConstantTimeEquals(Sha256Hex(offered), Sha256Hex(*code));
  };
  KEEL_ASSIGN_OR_RETURN(auto identity,
                        tx.users().FindIdentity(tenant_id, sender.platform, sender.id));
  if (identity) {
    KEEL_ASSIGN_OR_RETURN(auto user, CurrentUser(tx, tenant_id, identity->user_id));
    KEEL_ASSIGN_OR_RETURN(auto member, tx.users().GetMember(tenant_id, agent_id, user.id));
    if (member) {
      out.user_id = user.id;
      // In a group, only the agent's owners talk to it without calling it.
      if (!addressed && member->role != "owner") return out;
      // The access code again (its link opened twice): never shown to the agent.
      KEEL_ASSIGN_OR_RETURN(bool code, is_code());
      if (code) return notice("You can talk to this agent already.", kNoticesPerMinute);
      if (member->role == "guest" && recent > kGuestMessagesPerMinute) {
        return notice(rate_notice, kGuestMessagesPerMinute + 1);
      }
      if (member->role == "guest") {
        // A guest's allowance for the day (UTC), counted over what answering them cost.
        KEEL_ASSIGN_OR_RETURN(auto access, tx.users().GetAccess(tenant_id, agent_id));
        const int64_t allowance =
            access ? access->guest_daily_tokens : store::kDefaultGuestDailyTokens;
        if (allowance > 0) {
          // One person's: what answering the users merged into this one cost counts too.
          KEEL_ASSIGN_OR_RETURN(auto merged, tx.users().MergedInto(tenant_id, user.id));
          std::vector<std::string> ids = {user.id};
          for (const auto& m : merged) ids.push_back(m.id);
          int64_t spent = 0;
          for (const auto& id : ids) {
            KEEL_ASSIGN_OR_RETURN(int64_t one, tx.channels().UserTokensSince(
                                                   tenant_id, agent_id, id, now - now % kDayMs));
            spent += one;
          }
          if (spent >= allowance) {
            return notice("You have used today's allowance of this agent for guests (" +
                              std::to_string(allowance) + " tokens); it renews at 00:00 UTC.",
                          kNoticesPerMinute);
          }
        }
      }
      out.take = true;
      out.role = LowerRole(channel_role, member->role);
      return out;
    }
  }
  if (!addressed) return out;  // not a member, not calling the bot: not for the agent
  if (!may_write && recent <= kGuestMessagesPerMinute) {
    out.needs_write = true;
    return out;
  }
  KEEL_ASSIGN_OR_RETURN(auto access, tx.users().GetAccess(tenant_id, agent_id));
  const std::string level = access ? access->level : "private";
  const std::string who = sender.platform + ":" + sender.id;
  if (level == "private") {
    return notice(
        "This agent talks only with its members: ask its owner to add you (you are " + who + ").",
        kNoticesPerMinute);
  }
  if (level == "protected") {
    if (!direct) {
      return notice("This agent needs an access code: send it to the bot in a direct message.",
                    kNoticesPerMinute);
    }
    // Guesses at the code go no faster than a guest's messages.
    if (recent > kGuestMessagesPerMinute) return out;
    KEEL_ASSIGN_OR_RETURN(bool code, is_code());
    if (code) {
      KEEL_ASSIGN_OR_RETURN(out.user_id, EnsureUser(tx, tenant_id, sender, now));
      KEEL_RETURN_IF_ERROR(SetMember(tx, tenant_id, agent_id, out.user_id, "guest", now));
      out.notice = "Access granted: you can talk to this agent now.";
      return out;
    }
    return notice("This agent needs an access code: send it as your message.", kNoticesPerMinute);
  }
  if (recent > kGuestMessagesPerMinute) return notice(rate_notice, kGuestMessagesPerMinute + 1);
  KEEL_ASSIGN_OR_RETURN(out.user_id, EnsureUser(tx, tenant_id, sender, now));
  KEEL_RETURN_IF_ERROR(SetMember(tx, tenant_id, agent_id, out.user_id, "guest", now));
  out.take = true;
  out.role = LowerRole(channel_role, "guest");
  return out;
}

}  // namespace keel::access

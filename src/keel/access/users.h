#pragma once
// Users and who may talk to an agent from a chat platform (docs/USERS.md). The rules, in one
// place beside the role table (access.h):
//  - a person on a platform is an identity (platform, platform_user_id) of one user; a user
//    has a role on each agent it is a member of (owner | user | guest);
//  - a message from a platform acts with the lower of its channel's role and its sender's role
//    on the agent;
//  - a sender who is not a member is let in by the agent's access level: `public` makes them a
//    guest (a new user and identity when the identity is new), `protected` does once they send
//    the agent's access code in a direct conversation, `private` never does (members only);
//  - in a group, a message that does not address the bot is taken only from the agent's owners.
// Functions that take a Tx run inside the caller's unit of work and append their events there.

#include <optional>
#include <string>

#include "keel/common/status.h"
#include "keel/store/store.h"
#include "keel/store/user_store.h"

namespace keel::secrets {
class Vault;
}

namespace keel::access {

inline constexpr int kMaxUserName = 200;  // characters
// A guest's messages an agent runs per minute; and the notices a sender who is not a member is
// sent per minute (refusals beyond them are passed over in silence, so that no one makes the
// bot post without end).
inline constexpr int kGuestMessagesPerMinute = 20;
inline constexpr int kNoticesPerMinute = 3;

bool ValidRole(const std::string& role);
// The lower of two roles (guest < user < owner).
std::string LowerRole(const std::string& a, const std::string& b);
// telegram | slack | discord.
bool ValidPlatform(const std::string& platform);
// "public" | "protected" | "private".
bool ValidAccessLevel(const std::string& level);
// What an access code may be: 8 to 128 printable characters, no spaces at either end.
Status CheckAccessCode(const std::string& code);
// The tenant secret that holds an agent's access code (sealed like every secret).
std::string AccessCodeSecret(const std::string& agent_id);
// A new random access code: 12 characters of an unambiguous alphabet (about 60 bits).
std::string NewAccessCode();

// The user `id` names, following merges to the user it now is. kNotFound "user not found: ID".
Result<store::User> CurrentUser(store::Tx& tx, const std::string& tenant_id, const std::string& id);

// The role user `user_id` (as merges left it) has on the agent: its membership's, else "guest"
// when the agent is public, else nullopt (the agent is not the user's to reach).
Result<std::optional<std::string>> UserRoleOn(store::Tx& tx, const std::string& tenant_id,
                                              const std::string& user_id,
                                              const std::string& agent_id);

// Whether a token of user `user_id` ("" for a token of the tenant: always) reaches the agent at
// all: kNotFound "agent not found: ID" when the user has no role there and the agent is not
// public. For the routes that name an agent in their body or query, and lists of agents.
Status Reachable(store::Tx& tx, const std::string& tenant_id, const std::string& user_id,
                 const std::string& agent_id);

// Writes the user's role on the agent (agent.member_set@v1). REQUIRES: a valid role, a user
// not merged into another, an agent of the tenant (kNotFound otherwise).
Status SetMember(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id,
                 const std::string& user_id, const std::string& role, Millis now);

// Merges user `from` into `into`: `from`'s identities move to `into`, and its roles (the higher
// where both have one), and `from` records the merge (user.merged@v1). kInvalidArgument for
// the same user or one already merged.
Status MergeUsers(store::Tx& tx, const std::string& tenant_id, const std::string& from,
                  const std::string& into, Millis now);

// Someone on a platform, as a channel saw them.
struct Sender {
  std::string platform;  // telegram | slack | discord
  std::string id;        // the platform's id of the person
  std::string name;      // how the platform names them
};

// What becomes of a message from a platform.
struct Admission {
  bool take = false;  // posted to the agent, acting with `role`
  std::string role;
  std::string user_id;
  // Instead of a run: what the sender is told ("" to pass over the message in silence).
  std::string notice;
  // Only in a read-only unit: the decision needs a write (a new guest, an access code to check
  // against a grant); ask again in a unit that may write.
  bool needs_write = false;
  // The delivery was taken before (channels::AdmitDelivery): decided as it was then.
  bool replay = false;
};

// What a message of `sender` to the agent is owed: see the header's rules. `text` is what the
// sender wrote (an access code is looked for in it), `direct` whether the conversation is a
// direct one with the bot, `addressed` whether it calls the bot (a mention, a reply, a
// command; always true in a direct conversation). `recent`: the messages the sender sent the
// agent in the current minute, this one included (the caller counts): a guest is run at most
// kGuestMessagesPerMinute times (told once when it is over), the access code is tried as often,
// and a sender who is not a member is sent at most kNoticesPerMinute refusals. A guest whose
// answers today (UTC) cost the agent's guest_daily_tokens is told so instead of run. The access
// code is never run, a member's included. With `may_write` false (a read), a decision that would
// write returns needs_write.
// `vault` opens the access code.
Result<Admission> AdmitSender(store::Tx& tx, const secrets::Vault& vault,
                              const std::string& tenant_id, const std::string& agent_id,
                              const std::string& channel_role, const Sender& sender,
                              const std::string& text, bool direct, bool addressed, int recent,
                              bool may_write, Millis now);

}  // namespace keel::access

#pragma once
// Users (docs/USERS.md): the people of a tenant, the identities that say who they are on a chat
// platform ((platform, platform_user_id) is unique in a tenant), their roles on each agent, and
// each agent's access level (who may talk to it from a platform without being a member).

#include <optional>
#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {

struct User {
  std::string id;
  std::string tenant_id;
  std::string name;
  // The user this one was merged into ("" when it was not): its identities and roles moved
  // there, and the record stays so that what named it still resolves.
  std::string merged_into;
  Millis created_at = 0;
  Millis updated_at = 0;
};

// Who someone is on a platform: Telegram's, Slack's or Discord's id of a person.
struct Identity {
  std::string tenant_id;
  std::string platform;          // telegram | slack | discord
  std::string platform_user_id;  // the platform's id of the person
  std::string user_id;
  std::string name;  // what the platform called them when the identity was made
  Millis created_at = 0;
};

// A user's role on an agent.
struct AgentMember {
  std::string tenant_id;
  std::string agent_id;
  std::string user_id;
  std::string role;  // owner | user | guest
  Millis created_at = 0;
  Millis updated_at = 0;
};

// An agent's access level; an agent without one is private.
inline constexpr int64_t kDefaultGuestDailyTokens = 200000;

struct AgentAccess {
  std::string tenant_id;
  std::string agent_id;
  // public: anyone on a platform becomes its guest by writing to it; protected: by sending its
  // access code first; private: members only.
  std::string level = "private";
  // Whether its access code is set: the tenant secret access::AccessCodeSecret names.
  bool code_set = false;
  // The model tokens (input and output) a guest's messages may cost each day (UTC), counted
  // over the runs that answered them on chat platforms; 0: no allowance.
  int64_t guest_daily_tokens = kDefaultGuestDailyTokens;
  Millis updated_at = 0;
};

class UserStore {
 public:
  virtual ~UserStore() = default;
  // kConflict when the id exists.
  virtual Status InsertUser(const User& u) = 0;
  // Writes name, merged_into and updated_at. kNotFound "user not found: ID".
  virtual Status UpdateUser(const User& u) = 0;
  // kNotFound "user not found: ID".
  virtual Result<User> GetUser(const std::string& tenant_id, const std::string& id) = 0;
  // By id, merged ones included.
  virtual Result<Paged<User>> ListUsers(const std::string& tenant_id, const Page& page) = 0;
  // The users merged into `user_id`, by id.
  virtual Result<std::vector<User>> MergedInto(const std::string& tenant_id,
                                               const std::string& user_id) = 0;

  // kConflict when the tenant has that identity already.
  virtual Status InsertIdentity(const Identity& i) = 0;
  // Writes user_id. kNotFound "identity not found: PLATFORM:ID".
  virtual Status UpdateIdentity(const Identity& i) = 0;
  // kNotFound "identity not found: PLATFORM:ID".
  virtual Status DeleteIdentity(const std::string& tenant_id, const std::string& platform,
                                const std::string& platform_user_id) = 0;
  virtual Result<std::optional<Identity>> FindIdentity(const std::string& tenant_id,
                                                       const std::string& platform,
                                                       const std::string& platform_user_id) = 0;
  // The user's identities by platform and id.
  virtual Result<std::vector<Identity>> UserIdentities(const std::string& tenant_id,
                                                       const std::string& user_id) = 0;

  // Inserted or replaced (role and updated_at; created_at is kept).
  virtual Status PutMember(const AgentMember& m) = 0;
  // kNotFound "member not found: USER_ID".
  virtual Status DeleteMember(const std::string& tenant_id, const std::string& agent_id,
                              const std::string& user_id) = 0;
  virtual Result<std::optional<AgentMember>> GetMember(const std::string& tenant_id,
                                                       const std::string& agent_id,
                                                       const std::string& user_id) = 0;
  // The agent's members by user id.
  virtual Result<Paged<AgentMember>> ListMembers(const std::string& tenant_id,
                                                 const std::string& agent_id, const Page& page) = 0;
  // The user's roles, by agent id.
  virtual Result<std::vector<AgentMember>> UserMemberships(const std::string& tenant_id,
                                                           const std::string& user_id) = 0;

  // nullopt when the agent's level was never set (it is private).
  virtual Result<std::optional<AgentAccess>> GetAccess(const std::string& tenant_id,
                                                       const std::string& agent_id) = 0;
  virtual Status PutAccess(const AgentAccess& a) = 0;  // inserted or replaced
};

}  // namespace keel::store

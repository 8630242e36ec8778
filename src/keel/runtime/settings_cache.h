#pragma once
// The settings a turn reads of its agent and tenant (plugin stamps, working memory, skills,
// emergency stops), kept by this node between turns. Each entry holds the tenant's settings
// version it was read at (store::TenantStore::SettingsVersionLater, which the schema's
// triggers change in the very unit that changes any of those rows): a turn reads that one
// number in the snapshot of its other reads and takes the entry only when it is the same, so
// what it uses is exactly what the store holds in that snapshot, on any node, with no
// invalidation to miss. A miss reads the rows and puts them back.
//
// Safe from any thread (reads run on the store's threads on PostgreSQL). Entries are shared
// and never changed once put.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/store/memory_store.h"
#include "keel/store/skill_store.h"
#include "keel/store/types.h"

namespace keel::runtime {

struct AgentSettings {
  int64_t version = -1;  // the tenant's settings version they were read at
  std::vector<store::PluginStamp> stamps;
  store::WorkingMemory working;
  std::vector<store::Skill> skills;         // the agent's, without their files
  std::vector<store::EmergencyStop> stops;  // the tenant's
};

class SettingsCache {
 public:
  // At most `max_entries` agents; past that it starts again empty (a miss costs one read).
  explicit SettingsCache(size_t max_entries) : max_entries_(max_entries) {}

  // The agent's entry as last put (any version; the caller compares), or null.
  std::shared_ptr<const AgentSettings> Get(const std::string& tenant_id,
                                           const std::string& agent_id) const;
  void Put(const std::string& tenant_id, const std::string& agent_id,
           std::shared_ptr<const AgentSettings> settings);

 private:
  static std::string Key(const std::string& tenant_id, const std::string& agent_id) {
    return tenant_id + '\n' + agent_id;
  }
  const size_t max_entries_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const AgentSettings>> entries_;
};

}  // namespace keel::runtime

#include "keel/runtime/settings_cache.h"

namespace keel::runtime {

std::shared_ptr<const AgentSettings> SettingsCache::Get(const std::string& tenant_id,
                                                        const std::string& agent_id) const {
  std::string key = Key(tenant_id, agent_id);
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second;
}

void SettingsCache::Put(const std::string& tenant_id, const std::string& agent_id,
                        std::shared_ptr<const AgentSettings> settings) {
  std::string key = Key(tenant_id, agent_id);
  std::lock_guard lock(mu_);
  if (entries_.size() >= max_entries_ && !entries_.contains(key)) entries_.clear();
  entries_[std::move(key)] = std::move(settings);
}

}  // namespace keel::runtime

#pragma once
// The guardrails as the store keeps them, read back for a decision: a stored policy document
// parsed, and the emergency stop that holds for an agent. Shared by the gateway, the approval
// decision, the runtime and the policy routes, so each reads them the same way.

#include <optional>
#include <string>
#include <vector>

#include "keel/policy/policy.h"
#include "keel/store/store.h"

namespace keel::policy {

// The tenant frame (scope "") or an agent's narrowing (scope = agent id), or nullopt when none
// is set. A stored document that no longer parses is kInternal (it was validated when written).
inline Result<std::optional<Policy>> LoadPolicy(store::Tx& tx, const std::string& tenant_id,
                                                const std::string& scope) {
  KEEL_ASSIGN_OR_RETURN(auto doc, tx.policies().GetPolicy(tenant_id, scope));
  if (!doc) return std::optional<Policy>();
  auto parsed = ParsePolicy(doc->body);
  if (!parsed.ok()) {
    return Internal("the stored " + std::string(scope.empty() ? "tenant policy" : "agent policy") +
                    " does not parse: " + parsed.status().message());
  }
  return std::optional<Policy>(std::move(parsed).value());
}

// Why the agent may not act, when a stop (tenant-wide, or for this agent) is in force.
inline std::optional<std::string> StopReason(const std::vector<store::EmergencyStop>& stops,
                                             const std::string& agent_id) {
  for (const auto& s : stops) {
    if (s.agent_id.empty() || s.agent_id == agent_id) {
      return std::string("an emergency stop is in force for ") +
             (s.agent_id.empty() ? "the tenant" : "this agent") +
             (s.reason.empty() ? "" : ": " + s.reason);
    }
  }
  return std::nullopt;
}

}  // namespace keel::policy

#pragma once
// Fair shares between tenants (DESIGN.md invariant 13: one tenant cannot fill the queues, pools
// or connections of the others): how much of this node's run slots and blocking-tool threads
// one tenant may hold at once. Read from the same keel.toml and KEEL_* variables as Config,
// with the same precedence; a share left unset is a quarter of its whole (at least 1).

#include "keel/common/status.h"
#include "keel/config/config.h"

namespace keel::config {

struct ShareConfig {
  // Runs of one tenant executing at once on this node (of max_concurrent_runs); its further
  // runs stay queued while other tenants' are claimed.
  int tenant_max_running = 64;
  // Threads for blocking tools (exec, MCP, the store-reading tools) on this node.
  int tool_threads = 16;
  // Of those, the most one tenant's calls use at once; its further calls wait in its own queue.
  int tenant_tool_threads = 4;
};

// Fails as Load(overrides) does, and when a share exceeds its whole.
Result<ShareConfig> LoadShares(const Overrides& overrides);

}  // namespace keel::config

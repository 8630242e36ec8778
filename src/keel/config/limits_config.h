#pragma once
// What one tenant or one run may hold of a node (DESIGN.md invariant 13: one tenant cannot fill
// the queues, pools or connections of the others, and nothing may freeze the server). Read from
// the same keel.toml and KEEL_* variables as Config, with the same precedence.

#include <cstdint>

#include "keel/common/status.h"
#include "keel/config/config.h"

namespace keel::config {

struct LimitsConfig {
  // Fair shares; one left unset is a quarter of its whole (at least 1), and none may exceed it.
  // Runs of one tenant executing at once on this node (of max_concurrent_runs); its further
  // runs stay queued while other tenants' are claimed.
  int tenant_max_running = 64;
  // Threads for blocking tools (exec, MCP, the store-reading tools) on this node.
  int tool_threads = 16;
  // Of those, the most one tenant's calls use at once; its further calls wait in its own queue.
  int tenant_tool_threads = 4;
  // The io thread watchdog (runtime/watchdog.h): the io thread held this long without turning
  // over is logged with the run and work that hold it; held io_stall_limit_ms, that run is
  // recorded as poison and the process aborts. warn < limit.
  int64_t io_stall_warn_ms = 1000;
  int64_t io_stall_limit_ms = 30000;
};

// Fails as Load(overrides) does, and when a share exceeds its whole or the watchdog's warning
// is not below its limit.
Result<LimitsConfig> LoadLimits(const Overrides& overrides);

}  // namespace keel::config

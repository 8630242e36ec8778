#pragma once
// The agent's workspace as tools see it: path confinement and the exec sandbox's command line.

#include <string>
#include <vector>

#include "keel/common/status.h"

namespace keel::tools {

// The absolute path of `path` (relative to `workspace`) after following symlinks, or
// kPermissionDenied when it leads out of the workspace; kInvalidArgument for an absolute or
// empty path. Creates the workspace directory when missing.
Result<std::string> ResolveInWorkspace(const std::string& workspace, const std::string& path);

// The bubblewrap command line that runs `/bin/sh -c command` with no network, a read-only
// system, a private /tmp, and `workspace` as the writable /workspace; kUnavailable without
// bwrap (never falls back to running unsandboxed).
Result<std::vector<std::string>> SandboxArgv(const std::string& workspace,
                                             const std::string& command);

}  // namespace keel::tools

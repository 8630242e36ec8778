#pragma once
// The agent's workspace as tools see it: path confinement, the sandbox's command line, and who
// the commands that leave the sandbox run as.

#include <string>
#include <vector>

#include "keel/common/status.h"

namespace keel::tools {

class ToolRegistry;

// The absolute path of `path` (relative to `workspace`) after following symlinks, or
// kPermissionDenied when it leads out of the workspace; kInvalidArgument for an absolute or
// empty path. Creates the workspace directory when missing.
Result<std::string> ResolveInWorkspace(const std::string& workspace, const std::string& path);

// Where the commands Keel starts may reach. Host execution and unsandboxed stdio MCP servers
// are the platform admin's to grant (a tenant setting); even then they run as `uid`/`gid`,
// never as Keel's own user, so that they cannot read Keel's memory, environment or files.
struct ExecOptions {
  int uid = 65534;
  int gid = 65534;
  // Directories no sandbox may see even where a bound directory holds them (KEEL_HOME, the
  // workspaces root): each is covered by an empty tmpfs.
  std::vector<std::string> hidden;
};

// Ok when this process can start children as `uid`/`gid` (it is root, or has CAP_SETUID and
// CAP_SETGID) and they are not its own user; otherwise kFailedPrecondition saying why.
Status CanRunAs(int uid, int gid);

// The agent config key the gateway sets (and only it: it overwrites whatever the agent's
// config says) when the agent's tenant allows host execution.
inline constexpr const char* kHostExecGranted = "keel.host_exec_granted";

// One sandboxed command: no network, no other process, a read-only system (/usr, /bin, /lib...),
// a private /tmp, nothing of the host's /etc but the loader's cache, and exactly the
// environment given.
struct SandboxSpec {
  std::vector<std::string> argv;       // run inside; argv[0] a path or a name on env's PATH
  std::string workspace;               // bound writable at /workspace, the cwd; "" none (cwd /tmp)
  std::vector<std::string> read_only;  // host paths bound read-only at the same place
  std::vector<std::string> hidden;     // covered by an empty tmpfs where a bind exposes them
  std::vector<std::string> env;        // "NAME=value"
};

// The bubblewrap command line for `spec`; kUnavailable without bwrap (never falls back to
// running unsandboxed).
Result<std::vector<std::string>> SandboxArgv(const SandboxSpec& spec);

// The exec tool's: `/bin/sh -c command` with `workspace` as the writable /workspace.
Result<std::vector<std::string>> SandboxArgv(const std::string& workspace,
                                             const std::string& command,
                                             const std::vector<std::string>& hidden = {});

// files.read, files.write, files.list and exec, with `options` for exec.
Status RegisterWorkspaceTools(ToolRegistry& registry, const ExecOptions& options);

}  // namespace keel::tools

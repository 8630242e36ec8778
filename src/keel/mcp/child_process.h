#pragma once
// Starting a long-lived child process that talks over its standard streams, for the MCP stdio
// transport. Unlike tools::RunProcess, which runs a command to completion, this only starts the
// child and hands its pipes over; the caller owns the descriptors and must reap the child.
//
// The child leads a new session and process group (its pid is the group id, so the whole group
// can be signalled), gets exactly the environment it is given, starts with default signal
// dispositions and an empty signal mask, and inherits no descriptor but the three pipes.

#include <sys/types.h>

#include <string>
#include <vector>

#include "keel/common/status.h"

namespace keel::mcp {

// A started child. Every descriptor is close-on-exec; the parent's ends of the pipes are
// non-blocking.
struct ChildProcess {
  pid_t pid = -1;
  int stdin_fd = -1;   // write end of the child's stdin
  int stdout_fd = -1;  // read end of the child's stdout
  int stderr_fd = -1;  // read end of the child's stderr
  int pidfd = -1;      // readable once the child has exited; -1 where the kernel has no pidfd_open
};

// The path execvp would run for `name` when searching `path_var` (a PATH value): `name` itself
// when it contains a slash; "" when no directory holds an executable regular file of that name.
std::string FindExecutable(const std::string& name, const std::string& path_var);

// Starts `argv` (argv[0] a command name, searched in the PATH entry of `env`, or a path) with
// `env` ("NAME=value" entries, and nothing else) in `cwd` (inherited when empty), as `uid` and
// `gid` when they are not -1 (switched to after changing to `cwd`, with no supplementary groups).
// kNotFound when the command does not exist; kUnavailable when it exists but cannot be started
// (not executable, a bad cwd, out of processes), with the reason.
Result<ChildProcess> SpawnChild(const std::vector<std::string>& argv,
                                const std::vector<std::string>& env, const std::string& cwd,
                                int uid = -1, int gid = -1);

// "exited with status 3", "was killed by signal 9 (Killed)": for error messages.
std::string DescribeWaitStatus(int wstatus);

}  // namespace keel::mcp

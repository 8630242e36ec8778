#pragma once
// Runs a command as a child process with limits: wall-clock time, address space, file size, and
// captured output. Blocking; callers run it off the event loop. The child gets its own process
// group (killed whole on timeout or flood), a clean environment, and no inherited descriptors
// but the three pipes.

#include <cstdint>
#include <string>
#include <vector>

#include "keel/common/status.h"

namespace keel::tools {

struct ProcessLimits {
  int64_t timeout_ms = 30000;
  int64_t memory_bytes = int64_t(1) << 30;     // RLIMIT_AS of the child
  int64_t file_bytes = int64_t(64) << 20;      // RLIMIT_FSIZE: largest file it may write
  size_t capture_bytes = 64 * 1024;            // kept of stdout and of stderr, each
  size_t flood_bytes = size_t(16) << 20;       // more output than this kills the command
  // The user and group the child runs as (set after it changed to its cwd); -1: Keel's own.
  int run_as_uid = -1;
  int run_as_gid = -1;
};

struct ProcessResult {
  int exit_code = -1;   // -1 when killed by a signal
  int signal = 0;       // the signal that ended it, if any
  std::string stdout_text;
  std::string stderr_text;
  bool truncated = false;  // output beyond capture_bytes was dropped
  bool timed_out = false;
  bool flooded = false;
  int64_t elapsed_ms = 0;
};

// Starts argv[0] (a path) with `env` ("NAME=value") in `cwd`, feeds `stdin_text`, waits within
// the limits. kUnavailable when the process cannot be started.
Result<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env, const std::string& cwd,
                                 const std::string& stdin_text, const ProcessLimits& limits);

}  // namespace keel::tools

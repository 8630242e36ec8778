#include "keel/tools/process.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "keel/common/sigpipe.h"

namespace keel::tools {
namespace {

using Clock = std::chrono::steady_clock;

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] void ExecChild(char* const* argv, char* const* envp, const char* cwd, int in_fd,
                            int out_fd, int err_fd, int status_fd, const ProcessLimits& limits) {
  // The command gets SIGPIPE as from a shell (the writer blocks it; whoever started Keel may
  // have ignored it).
  ResetSignalsForExec();
  ::setsid();
  ::dup2(in_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  struct rlimit as{static_cast<rlim_t>(limits.memory_bytes), static_cast<rlim_t>(limits.memory_bytes)};
  ::setrlimit(RLIMIT_AS, &as);
  struct rlimit fsize{static_cast<rlim_t>(limits.file_bytes), static_cast<rlim_t>(limits.file_bytes)};
  ::setrlimit(RLIMIT_FSIZE, &fsize);
  struct rlimit core{0, 0};
  ::setrlimit(RLIMIT_CORE, &core);
  // Every descriptor but 0-2 and the status pipe (close-on-exec) goes.
  for (int fd = 3; fd < 1024; ++fd) {
    if (fd != status_fd) ::close(fd);
  }
  if (cwd[0] != '\0' && ::chdir(cwd) != 0) {
    int e = errno;
    (void)!::write(status_fd, &e, sizeof e);
    ::_exit(127);
  }
  // After chdir: the cwd may lie below directories only Keel's user can cross. Groups first,
  // then the gid, then the uid (after which neither could change); any failure refuses to run.
  if (limits.run_as_uid >= 0 &&
      (::setgroups(0, nullptr) != 0 || ::setgid(static_cast<gid_t>(limits.run_as_gid)) != 0 ||
       ::setuid(static_cast<uid_t>(limits.run_as_uid)) != 0)) {
    int e = errno;
    (void)!::write(status_fd, &e, sizeof e);
    ::_exit(127);
  }
  ::execve(argv[0], argv, envp);
  int e = errno;
  (void)!::write(status_fd, &e, sizeof e);
  ::_exit(127);
}

}  // namespace

Result<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env, const std::string& cwd,
                                 const std::string& stdin_text, const ProcessLimits& limits) {
  if (argv.empty()) return InvalidArgument("no command to run");
  std::vector<char*> c_argv, c_env;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const auto& e : env) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);

  int in[2], out[2], err[2], status[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Unavailable(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
      ::pipe2(status, O_CLOEXEC) != 0) {
    return Unavailable(std::string("pipe: ") + std::strerror(errno));
  }
  // A command that exits without reading its input must fail the write, not end the server.
  BlockSigpipeInThisThread();
  auto started = Clock::now();
  pid_t pid = ::fork();
  if (pid < 0) return Unavailable(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) ExecChild(c_argv.data(), c_env.data(), cwd.c_str(), in[0], out[1], err[1], status[1], limits);

  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  int exec_errno = 0;
  ssize_t got = ::read(status[0], &exec_errno, sizeof exec_errno);  // EOF on a successful exec
  ::close(status[0]);
  if (got == sizeof exec_errno) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    ::waitpid(pid, nullptr, 0);
    return Unavailable("cannot start " + argv[0] + ": " + std::strerror(exec_errno));
  }

  ProcessResult r;
  int in_fd = in[1], out_fd = out[0], err_fd = err[0];
  ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
  size_t written = 0, total_output = 0;
  if (stdin_text.empty()) CloseFd(in_fd);
  auto deadline = started + std::chrono::milliseconds(limits.timeout_ms);
  bool killed = false;
  auto kill_group = [&] {
    if (!killed) ::kill(-pid, SIGKILL);
    killed = true;
  };
  int wstatus = 0;
  bool reaped = false;
  while (out_fd >= 0 || err_fd >= 0) {
    if (!reaped && ::waitpid(pid, &wstatus, WNOHANG) == pid) {
      // The command ended; whatever it left running in its group goes too, so the pipes
      // reach end of file.
      reaped = true;
      kill_group();
    }
    pollfd fds[3];
    int n = 0;
    if (out_fd >= 0) fds[n++] = {out_fd, POLLIN, 0};
    if (err_fd >= 0) fds[n++] = {err_fd, POLLIN, 0};
    if (in_fd >= 0) fds[n++] = {in_fd, POLLOUT, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      r.timed_out = !reaped;
      kill_group();
      break;
    }
    int ready = ::poll(fds, n, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < n && ready > 0; ++i) {
      if (!fds[i].revents) continue;
      if (fds[i].fd == in_fd) {
        ssize_t w = ::write(in_fd, stdin_text.data() + written, stdin_text.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        if (w < 0 && errno != EAGAIN) {
          if (errno == EPIPE) ConsumePendingSigpipe();
          written = stdin_text.size();  // the command stopped reading: the rest is dropped
        }
        if (written >= stdin_text.size()) CloseFd(in_fd);
        continue;
      }
      char buf[65536];
      ssize_t m = ::read(fds[i].fd, buf, sizeof buf);
      if (m <= 0) {
        if (fds[i].fd == out_fd) {
          CloseFd(out_fd);
        } else {
          CloseFd(err_fd);
        }
        continue;
      }
      total_output += static_cast<size_t>(m);
      std::string& keep = fds[i].fd == out_fd ? r.stdout_text : r.stderr_text;
      size_t room = limits.capture_bytes > keep.size() ? limits.capture_bytes - keep.size() : 0;
      keep.append(buf, std::min(room, static_cast<size_t>(m)));
      if (static_cast<size_t>(m) > room) r.truncated = true;
      if (total_output > limits.flood_bytes) {
        r.flooded = true;
        kill_group();
      }
    }
    if (r.flooded) break;
  }
  CloseFd(in_fd);
  CloseFd(out_fd);
  CloseFd(err_fd);
  // Output closed (or the command flooded): wait for its end within the deadline. A pidfd
  // wakes us the moment it exits; without one (old kernels), poll the status every millisecond.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  while (!reaped) {
    if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
      reaped = true;
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      kill_group();
      ::waitpid(pid, &wstatus, 0);
      reaped = true;
      break;
    }
    if (pidfd >= 0) {
      pollfd pfd{pidfd, POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(left.count()));
    } else {
      ::usleep(1000);
    }
  }
  if (pidfd >= 0) ::close(pidfd);
  if (!killed) ::kill(-pid, SIGKILL);  // stragglers in the group
  r.elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
  if (WIFEXITED(wstatus)) r.exit_code = WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) r.signal = WTERMSIG(wstatus);
  return r;
}

}  // namespace keel::tools

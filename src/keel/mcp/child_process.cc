#include "keel/mcp/child_process.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "keel/common/sigpipe.h"

namespace keel::mcp {
namespace {

// What the child reports through the status pipe when it cannot exec.
struct ExecFailure {
  int stage;  // kStageChdir or kStageExec
  int error;  // errno
};
constexpr int kStageChdir = 1;
constexpr int kStageExec = 2;
constexpr int kStageUser = 3;

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Moves `fd` to a number above 2, so that dup2 onto 0-2 in the child cannot overwrite a pipe
// not yet copied (only possible when this process runs with its own standard streams closed).
bool LiftAboveStdio(int& fd) {
  if (fd > 2) return true;
  int lifted = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (lifted < 0) return false;
  ::close(fd);
  fd = lifted;
  return true;
}

// A pipe whose both ends are close-on-exec and above the standard streams.
bool MakePipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  if (LiftAboveStdio(fds[0]) && LiftAboveStdio(fds[1])) return true;
  CloseFd(fds[0]);
  CloseFd(fds[1]);
  return false;
}

std::string PathEntryOf(const std::vector<std::string>& env) {
  for (const auto& e : env) {
    if (e.rfind("PATH=", 0) == 0) return e.substr(5);
  }
  return "";
}

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] void ExecChild(const char* path, char* const* argv, char* const* envp, const char* cwd,
                            int in_fd, int out_fd, int err_fd, int status_fd, int uid, int gid) {
  // The server starts as if from a shell.
  ResetSignalsForExec();
  ::setsid();
  ::dup2(in_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  // Every other descriptor closes at exec, including any a concurrent thread opened without
  // O_CLOEXEC; the status pipe stays open until then to report a failure.
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */) != 0)
#endif
  {
    for (int fd = 3; fd < 1024; ++fd) {
      if (fd != status_fd) ::close(fd);
    }
  }
  if (cwd[0] != '\0' && ::chdir(cwd) != 0) {
    ExecFailure f{kStageChdir, errno};
    (void)!::write(status_fd, &f, sizeof f);
    ::_exit(127);
  }
  // Groups, then gid, then uid: after setuid neither could change. A failure refuses to run.
  if (uid >= 0 && (::setgroups(0, nullptr) != 0 || ::setgid(static_cast<gid_t>(gid)) != 0 ||
                   ::setuid(static_cast<uid_t>(uid)) != 0)) {
    ExecFailure f{kStageUser, errno};
    (void)!::write(status_fd, &f, sizeof f);
    ::_exit(127);
  }
  ::execve(path, argv, envp);
  ExecFailure f{kStageExec, errno};
  (void)!::write(status_fd, &f, sizeof f);
  ::_exit(127);
}

}  // namespace

std::string FindExecutable(const std::string& name, const std::string& path_var) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return name;
  std::string_view rest = path_var;
  while (true) {
    size_t colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = ".";  // an empty PATH entry means the current directory
    std::string candidate = std::move(dir);
    candidate += '/';
    candidate += name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (colon == std::string_view::npos) return "";
    rest.remove_prefix(colon + 1);
  }
}

Result<ChildProcess> SpawnChild(const std::vector<std::string>& argv,
                                const std::vector<std::string>& env, const std::string& cwd,
                                int uid, int gid) {
  if (argv.empty() || argv[0].empty()) return InvalidArgument("no command to run");
  if ((uid < 0) != (gid < 0)) return InvalidArgument("a child's uid and gid go together");
  std::string path_var = PathEntryOf(env);
  std::string path = FindExecutable(argv[0], path_var);
  if (path.empty()) {
    return NotFound("command '" + argv[0] + "' not found in PATH (" + path_var + ")");
  }
  // Everything the child touches is prepared before fork: a multi-threaded parent's child may
  // not allocate.
  std::vector<char*> c_argv, c_env;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const auto& e : env) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);

  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  auto close_all = [&] {
    for (int* p : {in, out, err, status}) {
      CloseFd(p[0]);
      CloseFd(p[1]);
    }
  };
  if (!MakePipe(in) || !MakePipe(out) || !MakePipe(err) || !MakePipe(status)) {
    Status s = Unavailable(std::string("cannot create pipes: ") + std::strerror(errno));
    close_all();
    return s;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    Status s = Unavailable(std::string("fork: ") + std::strerror(errno));
    close_all();
    return s;
  }
  if (pid == 0) {
    ExecChild(path.c_str(), c_argv.data(), c_env.data(), cwd.c_str(), in[0], out[1], err[1],
              status[1], uid, gid);
  }
  CloseFd(in[0]);
  CloseFd(out[1]);
  CloseFd(err[1]);
  CloseFd(status[1]);

  ExecFailure failure{};
  ssize_t got;
  do {
    got = ::read(status[0], &failure, sizeof failure);  // end of file on a successful exec
  } while (got < 0 && errno == EINTR);
  CloseFd(status[0]);
  if (got == static_cast<ssize_t>(sizeof failure)) {
    close_all();
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    if (failure.stage == kStageChdir) {
      return Unavailable("cannot start " + argv[0] + ": cannot change to directory '" + cwd +
                         "': " + std::strerror(failure.error));
    }
    if (failure.stage == kStageUser) {
      return Unavailable("cannot start " + argv[0] + " as uid " + std::to_string(uid) + ": " +
                         std::strerror(failure.error));
    }
    if (failure.error == ENOENT) return NotFound("command '" + path + "' not found");
    return Unavailable("cannot start " + path + ": " + std::strerror(failure.error));
  }

  ChildProcess child;
  child.pid = pid;
  child.stdin_fd = in[1];
  child.stdout_fd = out[0];
  child.stderr_fd = err[0];
  for (int fd : {child.stdin_fd, child.stdout_fd, child.stderr_fd}) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
#ifdef SYS_pidfd_open
  // Close-on-exec by definition. The child cannot have been reaped yet (only our owner reaps
  // it), so the pidfd refers to it even if it has already exited.
  child.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
  return child;
}

std::string DescribeWaitStatus(int wstatus) {
  if (WIFEXITED(wstatus)) return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    int sig = WTERMSIG(wstatus);
    const char* name = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) +
           (name ? std::string(" (") + name + ")" : "");
  }
  return "ended (wait status " + std::to_string(wstatus) + ")";
}

}  // namespace keel::mcp

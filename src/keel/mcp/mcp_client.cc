#include "keel/mcp/mcp_client.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "keel/common/log.h"
#include "keel/common/sigpipe.h"
#include "keel/mcp/child_process.h"
#include "keel/mcp/messages.h"

namespace keel::mcp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::string_view kSupportedVersions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};
constexpr const char* kClientVersion = "0.1.0";  // Keel's, as in project() of CMakeLists.txt

constexpr size_t kStderrTailBytes = 4096;
constexpr size_t kStderrInMessageBytes = 1024;
// Shutdown: the time a server gets to exit after its stdin closes, then after SIGTERM.
constexpr auto kStdinCloseGrace = std::chrono::seconds(2);
constexpr auto kTermGrace = std::chrono::seconds(1);
// A server that closed its stdout (or stopped reading stdin) is given this long to exit, so
// that the failure can name its exit status, before the connection is declared broken anyway.
constexpr auto kLostGrace = milliseconds(200);
// Where the kernel has no pidfd, the I/O thread checks for the child's exit this often.
constexpr auto kNoPidfdTick = milliseconds(50);
constexpr int kMaxToolPages = 1000;
constexpr int64_t kMaxTimeoutMs = int64_t(7) * 24 * 3600 * 1000;  // keeps deadlines in range
constexpr int kGarbageLinesLogged = 5;
constexpr size_t kReadChunk = size_t(64) * 1024;
constexpr int kJsonRpcMethodNotFound = -32601;

std::string Truncate(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  return std::string(s.substr(0, max)) + "...";
}

const Json* Field(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::string StringField(const Json& obj, const char* key) {
  const Json* v = Field(obj, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

// The child's environment: see StdioServerSpec::env.
Result<std::vector<std::string>> ServerEnvironment(const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  for (const auto& [name, value] : env) {
    if (name.empty() || name.find_first_of("=\0", 0, 2) != std::string::npos) {
      return InvalidArgument("invalid environment variable name '" + name + "'");
    }
    std::string entry = name;
    entry += '=';
    entry += value;
    out.push_back(std::move(entry));
  }
  for (const char* inherited : {"PATH", "HOME"}) {
    if (env.count(inherited)) continue;
    if (const char* value = std::getenv(inherited)) {
      out.push_back(std::string(inherited) + "=" + value);
    }
  }
  return out;
}

std::string LabelOf(const StdioServerSpec& spec) {
  if (!spec.name.empty()) return "MCP server '" + spec.name + "'";
  std::string line;
  for (const auto& arg : spec.command) line += (line.empty() ? "" : " ") + arg;
  return "MCP server '" + Truncate(line, 160) + "'";
}

}  // namespace

bool IsSupportedProtocolVersion(std::string_view version) {
  for (auto v : kSupportedVersions) {
    if (v == version) return true;
  }
  return false;
}

// The live connection: the child process, the three pipes, and the requests in flight.
//
// Threads: Request, Notify, Break and the accessors are called from any thread. One I/O thread
// (IoLoop) owns the descriptors: it alone reads stdout and stderr, writes stdin from the
// outgoing queue, and reaps the child. Callers only queue bytes and wait on their own condition
// variable, so no caller ever blocks on a pipe.
//
// Invariants:
//  1. Each PendingCall in pending_ is answered exactly once, under mu_: by the I/O thread with
//     the server's answer, by Break, or by its own caller at its deadline (which removes it).
//     A PendingCall lives on its caller's stack; it is out of pending_ before the caller returns.
//  2. broken_ never goes back to false; once set, pending_ is empty and stays empty.
//  3. The child's pid is signalled (as a process group) only before the I/O thread reaps it,
//     so the signal cannot reach a process that reused the number. (This needs SIGCHLD not to
//     be ignored in this process: the kernel would then reap children behind our back.)
class McpClient::Connection {
 public:
  Connection(const ChildProcess& child, std::string label, const ClientOptions& options)
      : label_(std::move(label)),
        options_(options),
        pid_(child.pid),
        stdout_fd_(child.stdout_fd),
        stderr_fd_(child.stderr_fd),
        pidfd_(child.pidfd),
        stdin_fd_(child.stdin_fd) {}

  ~Connection() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutting_down_ = true;
      FailAllLocked(Unavailable(label_ + " is shutting down"));
      Wake();
    }
    if (io_thread_.joinable()) io_thread_.join();
    if (!reaped_) {  // the I/O thread never ran
      ::kill(-pid_, SIGKILL);
      while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    for (int fd : {stdin_fd_, stdout_fd_, stderr_fd_, pidfd_, wake_r_, wake_w_}) {
      if (fd >= 0) ::close(fd);
    }
  }

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  Status Start() {
    int wake[2];
    if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
      return Unavailable(std::string("cannot create a pipe: ") + std::strerror(errno));
    }
    wake_r_ = wake[0];
    wake_w_ = wake[1];
    try {
      io_thread_ = std::thread([this] {
        NameThread("keel-mcp");
        IoLoop();
      });
    } catch (const std::system_error& e) {
      return Unavailable(std::string("cannot start the MCP client's thread: ") + e.what());
    }
    return Status::Ok();
  }

  // Sends a request and waits up to `timeout_ms` for its answer: the `result` member, or
  // kInvalidArgument for an `error` member. At the deadline the request is withdrawn (and, when
  // `cancel_on_timeout` and it was sent, cancelled with notifications/cancelled).
  Result<Json> Request(const std::string& method, Json params, int64_t timeout_ms,
                       bool cancel_on_timeout) {
    int64_t id = next_id_.fetch_add(1);
    Json message = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
    if (!params.is_null()) message["params"] = std::move(params);
    std::string line = DumpJson(message);
    if (line.size() > options_.max_message_bytes) {
      return Status(Code::kPayloadTooLarge, method + " request of " + std::to_string(line.size()) +
                                                " bytes exceeds the limit of " +
                                                std::to_string(options_.max_message_bytes));
    }
    line.push_back('\n');
    PendingCall call;
    call.method = method;
    timeout_ms = std::clamp<int64_t>(timeout_ms, 1, kMaxTimeoutMs);
    auto deadline = Clock::now() + milliseconds(timeout_ms);
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) return Unavailable(broken_reason_);
    if (shutting_down_) return Unavailable(label_ + " is shutting down");
    if (outgoing_bytes_ + line.size() > 4 * options_.max_message_bytes) {
      return Unavailable(label_ + " is not reading its stdin (" + std::to_string(outgoing_bytes_) +
                         " bytes waiting)");
    }
    pending_[id] = &call;
    EnqueueLocked(std::move(line), id);
    Wake();
    if (call.cv.wait_until(lock, deadline, [&] { return call.done; })) {
      return std::move(call.result);
    }
    pending_.erase(id);
    std::string message_text =
        label_ + " did not answer " + method + " within " + std::to_string(timeout_ms) + " ms";
    if (!WithdrawUnsentLocked(id) && cancel_on_timeout && !broken_) {
      Json cancel = {{"jsonrpc", "2.0"},
                     {"method", "notifications/cancelled"},
                     {"params", {{"requestId", id}, {"reason", "timed out"}}}};
      EnqueueLocked(DumpJson(cancel) + "\n", 0);
      Wake();
      message_text += " (request cancelled)";
    }
    return Unavailable(message_text);
  }

  // Queues a notification; dropped when the connection is broken.
  void Notify(const std::string& method, Json params) {
    Json message = {{"jsonrpc", "2.0"}, {"method", method}};
    if (!params.is_null()) message["params"] = std::move(params);
    std::string line = DumpJson(message) + "\n";
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_ || shutting_down_) return;
    EnqueueLocked(std::move(line), 0);
    Wake();
  }

  // Declares the connection broken because the server did `what` ("exited with status 1",
  // without the server's label; the first reason stays), fails every waiting call with it, and
  // has the I/O thread terminate the server.
  void Break(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    BreakLocked(what);
  }

  // What broke the connection (as given to Break); "" while it is not broken.
  std::string BrokenWhat() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_what_;
  }

  bool Alive() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !broken_ && !shutting_down_;
  }

  bool TakeToolsChanged() { return tools_changed_.exchange(false); }

  std::string StderrTail() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stderr_.size() > kStderrTailBytes ? stderr_.substr(stderr_.size() - kStderrTailBytes)
                                             : stderr_;
  }

  // "; stderr: <its last lines>", on one line, or "" when the server wrote nothing there.
  std::string StderrSuffix() const {
    std::string tail = StderrTail();
    if (tail.size() > kStderrInMessageBytes) {
      tail.erase(0, tail.size() - kStderrInMessageBytes);
      size_t nl = tail.find('\n');
      if (nl != std::string::npos && nl + 1 < tail.size()) tail.erase(0, nl + 1);
    }
    while (!tail.empty() && std::isspace(static_cast<unsigned char>(tail.back()))) tail.pop_back();
    if (tail.empty()) return "";
    std::string one_line;
    for (char c : tail) {
      if (c == '\n') {
        one_line += " | ";
      } else if (c != '\r') {
        one_line += c;
      }
    }
    return "; stderr: " + one_line;
  }

  const std::string& Label() const { return label_; }

 private:
  struct PendingCall {
    std::string method;
    std::condition_variable cv;
    bool done = false;
    Result<Json> result;
  };
  struct Outgoing {
    std::string bytes;       // one message and its newline
    int64_t request_id = 0;  // 0 for notifications and replies
  };
  enum class Phase { kRunning, kClosing, kTerminating, kKilled };

  void Wake() {
    char byte = 0;
    (void)!::write(wake_w_, &byte, 1);  // a full pipe is already a pending wake-up
  }

  // REQUIRES: mu_ held.
  void EnqueueLocked(std::string bytes, int64_t request_id) {
    outgoing_bytes_ += bytes.size();
    outgoing_.push_back({std::move(bytes), request_id});
  }

  // Removes request `id` from the outgoing queue if none of it was written; true if removed.
  // REQUIRES: mu_ held.
  bool WithdrawUnsentLocked(int64_t id) {
    for (auto it = outgoing_.begin(); it != outgoing_.end(); ++it) {
      if (it->request_id != id) continue;
      if (it == outgoing_.begin() && front_written_ > 0) return false;
      outgoing_bytes_ -= it->bytes.size();
      outgoing_.erase(it);
      return true;
    }
    return false;
  }

  // REQUIRES: mu_ held.
  void FailAllLocked(const Status& status) {
    for (auto& [id, call] : pending_) {
      call->result = status;
      call->done = true;
      call->cv.notify_all();
    }
    pending_.clear();
  }

  // REQUIRES: mu_ held.
  void BreakLocked(const std::string& what) {
    if (broken_) return;
    broken_ = true;
    broken_what_ = what;
    broken_reason_ = label_ + " " + what;
    FailAllLocked(Unavailable(broken_reason_));
    outgoing_.clear();
    outgoing_bytes_ = 0;
    front_written_ = 0;
    Wake();
  }

  void SignalGroup(int sig) { ::kill(-pid_, sig); }

  void CloseStdin() {
    std::lock_guard<std::mutex> lock(mu_);
    if (stdin_fd_ >= 0) ::close(stdin_fd_);
    stdin_fd_ = -1;
    outgoing_.clear();
    outgoing_bytes_ = 0;
    front_written_ = 0;
  }

  // The I/O thread: see the class comment.
  void IoLoop() {
    BlockSigpipeInThisThread();
    Phase phase = Phase::kRunning;
    Clock::time_point phase_deadline{};
    std::optional<Clock::time_point> lost_at;  // when stdout closed or stdin broke
    std::string lost_what;
    while (true) {
      bool broken, closing, want_write;
      {
        std::lock_guard<std::mutex> lock(mu_);
        broken = broken_;
        closing = shutting_down_;
        want_write = stdin_fd_ >= 0 && !outgoing_.empty();
      }
      auto now = Clock::now();
      if (phase == Phase::kRunning && (broken || closing)) {
        // Closing stdin is how MCP asks a stdio server to exit; a broken one is not waited for.
        CloseStdin();
        want_write = false;
        if (broken) {
          SignalGroup(SIGTERM);
          phase = Phase::kTerminating;
          phase_deadline = now + kTermGrace;
        } else {
          phase = Phase::kClosing;
          phase_deadline = now + kStdinCloseGrace;
        }
      } else if (phase == Phase::kClosing && now >= phase_deadline) {
        SignalGroup(SIGTERM);
        phase = Phase::kTerminating;
        phase_deadline = now + kTermGrace;
      } else if (phase == Phase::kTerminating && now >= phase_deadline) {
        SignalGroup(SIGKILL);
        phase = Phase::kKilled;
      }
      if (lost_at && !broken && !closing && now >= *lost_at + kLostGrace) {
        Break(lost_what + StderrSuffix());
        continue;
      }

      int timeout_ms = -1;
      auto wake_by = [&](Clock::time_point t) {
        auto left = std::chrono::ceil<milliseconds>(t - now).count();
        int ms = static_cast<int>(std::clamp<int64_t>(left, 0, 60000));
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      };
      if (phase == Phase::kClosing || phase == Phase::kTerminating) wake_by(phase_deadline);
      if (lost_at && !broken && !closing) wake_by(*lost_at + kLostGrace);
      if (pidfd_ < 0) wake_by(now + kNoPidfdTick);

      pollfd fds[5];
      int n = 0;
      int wake_i = n;
      fds[n++] = {wake_r_, POLLIN, 0};
      int out_i = -1, err_i = -1, in_i = -1, pid_i = -1;
      if (stdout_fd_ >= 0) {
        out_i = n;
        fds[n++] = {stdout_fd_, POLLIN, 0};
      }
      if (stderr_fd_ >= 0) {
        err_i = n;
        fds[n++] = {stderr_fd_, POLLIN, 0};
      }
      if (want_write) {
        in_i = n;
        fds[n++] = {CurrentStdin(), POLLOUT, 0};
      }
      if (pidfd_ >= 0) {
        pid_i = n;
        fds[n++] = {pidfd_, POLLIN, 0};
      }
      if (::poll(fds, static_cast<nfds_t>(n), timeout_ms) < 0) {
        if (errno == EINTR) continue;
        LogError(label_ + ": poll failed: " + std::strerror(errno));
        for (auto& f : fds) f.revents = 0;
        std::this_thread::sleep_for(kNoPidfdTick);  // never spin, whatever poll does
      }
      if (fds[wake_i].revents) DrainWakePipe();
      if (out_i >= 0 && fds[out_i].revents && !ReadStdout(kReadChunk * 16)) {
        if (!lost_at) {
          lost_at = Clock::now();
          lost_what = "closed its stdout";
        }
      }
      if (err_i >= 0 && fds[err_i].revents) ReadStderr(kReadChunk * 16);
      if (in_i >= 0 && fds[in_i].revents && !WriteOutgoing()) {
        if (!lost_at) {
          lost_at = Clock::now();
          lost_what = "stopped reading its stdin";
        }
      }
      bool exited = pid_i >= 0 ? fds[pid_i].revents != 0 : ExitedButNotReaped();
      if (exited) {
        OnExit();
        return;
      }
    }
  }

  int CurrentStdin() {
    std::lock_guard<std::mutex> lock(mu_);
    return stdin_fd_;
  }

  void DrainWakePipe() {
    char buf[256];
    while (::read(wake_r_, buf, sizeof buf) > 0) {
    }
  }

  // Without a pidfd: whether the child has exited, leaving it unreaped (see invariant 3).
  bool ExitedButNotReaped() {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      return errno == ECHILD;  // someone else reaped it (SIGCHLD ignored): it is gone
    }
    return info.si_pid == pid_;
  }

  // The child has exited (and is not reaped yet): read what it wrote before it did, clear out
  // the rest of its process group, reap it, and fail everything with its exit status.
  void OnExit() {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0) {
      SignalGroup(SIGKILL);  // still a zombie of ours, so its pid still names its group
    }
    ReadStdout(4 * options_.max_message_bytes);
    ReadStderr(4 * options_.max_message_bytes);
    int wstatus = 0;
    pid_t got;
    do {
      got = ::waitpid(pid_, &wstatus, 0);
    } while (got < 0 && errno == EINTR);
    reaped_ = true;
    std::string how = got == pid_ ? DescribeWaitStatus(wstatus) : "exited";
    Break(how + StderrSuffix());
  }

  // Reads stdout until it would block, at most `budget` bytes; false at end of file.
  bool ReadStdout(size_t budget) {
    char buf[kReadChunk];
    size_t total = 0;
    while (stdout_fd_ >= 0 && total < budget) {
      ssize_t got = ::read(stdout_fd_, buf, sizeof buf);
      if (got > 0) {
        total += static_cast<size_t>(got);
        OnStdoutData(std::string_view(buf, static_cast<size_t>(got)));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && errno == EAGAIN) return true;
      ::close(stdout_fd_);
      stdout_fd_ = -1;
      return false;
    }
    return stdout_fd_ >= 0;
  }

  void ReadStderr(size_t budget) {
    char buf[kReadChunk];
    size_t total = 0;
    while (stderr_fd_ >= 0 && total < budget) {
      ssize_t got = ::read(stderr_fd_, buf, sizeof buf);
      if (got > 0) {
        total += static_cast<size_t>(got);
        std::lock_guard<std::mutex> lock(mu_);
        stderr_.append(buf, static_cast<size_t>(got));
        // Keep twice the tail, to trim rarely.
        if (stderr_.size() > 2 * kStderrTailBytes) {
          stderr_.erase(0, stderr_.size() - kStderrTailBytes);
        }
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && errno == EAGAIN) return;
      ::close(stderr_fd_);
      stderr_fd_ = -1;
    }
  }

  // Writes queued messages until the pipe is full; false when stdin can take no more (the
  // server closed it, or exited).
  bool WriteOutgoing() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!outgoing_.empty() && stdin_fd_ >= 0) {
      Outgoing& front = outgoing_.front();
      ssize_t w = ::write(stdin_fd_, front.bytes.data() + front_written_,
                          front.bytes.size() - front_written_);
      if (w > 0) {
        front_written_ += static_cast<size_t>(w);
        if (front_written_ == front.bytes.size()) {
          outgoing_bytes_ -= front.bytes.size();
          outgoing_.pop_front();
          front_written_ = 0;
        }
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EAGAIN) return true;
      if (w < 0 && errno == EPIPE) ConsumePendingSigpipe();
      ::close(stdin_fd_);
      stdin_fd_ = -1;
      outgoing_.clear();
      outgoing_bytes_ = 0;
      front_written_ = 0;
      return false;
    }
    return true;
  }

  // Splits stdout into lines (messages) and handles each.
  void OnStdoutData(std::string_view data) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) return;  // nobody is listening any more
    }
    size_t scanned = out_buf_.size();
    out_buf_.append(data);
    size_t start = 0;
    while (true) {
      size_t nl = out_buf_.find('\n', scanned);
      if (nl == std::string::npos) break;
      std::string_view line(out_buf_.data() + start, nl - start);
      if (line.size() > options_.max_message_bytes) {
        out_buf_.clear();
        Break("sent a message of " + std::to_string(line.size()) +
              " bytes, more than the limit of " + std::to_string(options_.max_message_bytes));
        return;
      }
      HandleLine(line);
      start = nl + 1;
      scanned = start;
    }
    out_buf_.erase(0, start);
    if (out_buf_.size() > options_.max_message_bytes) {
      size_t size = out_buf_.size();
      out_buf_.clear();
      Break("sent more than " + std::to_string(options_.max_message_bytes) +
            " bytes without a newline (" + std::to_string(size) + " so far)");
    }
  }

  void HandleLine(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;
    auto parsed = ParseJson(line);
    if (!parsed.ok()) {
      // A line that is not JSON is noise a server may print; JSON that breaks the parser's
      // limits (nesting, duplicate keys) is a server answering what no client may read.
      if (parsed.status().message().rfind("not valid JSON", 0) == 0) return Garbage(line);
      Break("sent a message that is refused: " + parsed.status().message());
      return;
    }
    Json message = std::move(*parsed);
    if (message.is_array() && !message.empty()) {  // a batch (allowed by 2025-03-26)
      for (const Json& m : message) HandleMessage(m, line);
      return;
    }
    HandleMessage(message, line);
  }

  void HandleMessage(const Json& m, std::string_view line) {
    if (!m.is_object()) return Garbage(line);
    const Json* method = Field(m, "method");
    const Json* id = Field(m, "id");
    if (method && method->is_string()) {
      if (id && (id->is_string() || id->is_number())) return AnswerServerRequest(*id, *method);
      if (*method == "notifications/tools/list_changed") tools_changed_ = true;
      return;  // other notifications (logging, progress, ...) are of no use here
    }
    const Json* result = Field(m, "result");
    const Json* error = Field(m, "error");
    if (id && (result || error)) {
      if (id->is_null()) {  // the server could not read one of our messages
        LogError(label_ + " reported an error: " + Truncate(DumpJson(*error), 500));
        return;
      }
      return HandleResponse(*id, result, error);
    }
    Garbage(line);
  }

  // The server asked something of the client. The client offers no capabilities, so the only
  // request it serves is ping (basic/utilities/ping).
  void AnswerServerRequest(const Json& id, const Json& method) {
    Json reply = {{"jsonrpc", "2.0"}, {"id", id}};
    if (method == "ping") {
      reply["result"] = Json::object();
    } else {
      reply["error"] = {{"code", kJsonRpcMethodNotFound},
                        {"message", "Method not found: " + method.get<std::string>()}};
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) EnqueueLocked(DumpJson(reply) + "\n", 0);
  }

  void HandleResponse(const Json& id_value, const Json* result, const Json* error) {
    int64_t id = 0;
    if (id_value.is_number_integer()) {
      id = id_value.get<int64_t>();
    } else if (id_value.is_string()) {  // some servers echo numbers as strings
      const std::string& s = id_value.get_ref<const std::string&>();
      char* end = nullptr;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (s.empty() || *end != '\0') return;
      id = v;
    } else {
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;  // the answer to a request that timed out: ignored
    PendingCall* call = it->second;
    pending_.erase(it);
    if (error) {
      std::string text = label_ + " answered " + call->method + " with error";
      const Json* code = Field(*error, "code");
      if (code && code->is_number()) text += " " + DumpJson(*code);
      std::string msg = StringField(*error, "message");
      text += ": " + (msg.empty() ? Truncate(DumpJson(*error), 500) : Truncate(msg, 2000));
      if (const Json* data = Field(*error, "data"); data && !data->is_null()) {
        text += " (" + Truncate(DumpJson(*data), 500) + ")";
      }
      call->result = InvalidArgument(text);
    } else {
      call->result = *result;
    }
    call->done = true;
    call->cv.notify_all();
  }

  void Garbage(std::string_view line) {
    ++garbage_lines_;
    if (garbage_lines_ <= kGarbageLinesLogged) {
      LogError(label_ + " wrote a line that is not a JSON-RPC message to stdout (ignored): " +
               Truncate(line, 200));
    }
    if (garbage_lines_ > options_.max_garbage_lines) {
      Break("wrote " + std::to_string(garbage_lines_) +
            " lines to stdout that are not JSON-RPC messages; the last: " + Truncate(line, 200));
    }
  }

  const std::string label_;
  const ClientOptions options_;
  const pid_t pid_;
  std::atomic<int64_t> next_id_{1};
  std::atomic<bool> tools_changed_{false};

  // Owned by the I/O thread (by the destructor once it is joined).
  int stdout_fd_;
  int stderr_fd_;
  int pidfd_;
  int wake_r_ = -1;      // a byte here wakes the I/O thread: something to write, or a state change
  std::string out_buf_;  // stdout not yet split into lines
  int garbage_lines_ = 0;
  bool reaped_ = false;
  std::thread io_thread_;
  int wake_w_ = -1;

  mutable std::mutex mu_;
  int stdin_fd_;  // GUARDED_BY(mu_); written and closed by the I/O thread
  std::map<int64_t, PendingCall*> pending_;  // GUARDED_BY(mu_)
  std::deque<Outgoing> outgoing_;            // GUARDED_BY(mu_)
  size_t outgoing_bytes_ = 0;                // GUARDED_BY(mu_)
  size_t front_written_ = 0;                 // GUARDED_BY(mu_); of outgoing_.front()
  bool broken_ = false;                      // GUARDED_BY(mu_)
  std::string broken_what_;                  // GUARDED_BY(mu_); see Break
  std::string broken_reason_;                // GUARDED_BY(mu_); label_ + " " + broken_what_
  bool shutting_down_ = false;               // GUARDED_BY(mu_)
  std::string stderr_;                       // GUARDED_BY(mu_); the last bytes of stderr
};

McpClient::McpClient() = default;
McpClient::~McpClient() = default;

Result<std::unique_ptr<McpClient>> McpClient::StartStdio(const StdioServerSpec& spec,
                                                         const ClientOptions& options) {
  if (spec.command.empty() || spec.command[0].empty()) {
    return InvalidArgument("MCP server spec has no command");
  }
  if (options.request_timeout_ms <= 0 || options.init_timeout_ms <= 0 ||
      options.max_message_bytes == 0 || options.max_garbage_lines < 0) {
    return InvalidArgument("MCP client options: timeouts and max_message_bytes must be positive");
  }
  std::string label = LabelOf(spec);
  KEEL_ASSIGN_OR_RETURN(std::vector<std::string> env, ServerEnvironment(spec.env));
  Result<ChildProcess> child =
      SpawnChild(spec.command, env, spec.cwd, spec.run_as_uid, spec.run_as_gid);
  if (!child.ok()) return Status(child.status().code(), label + ": " + child.status().message());
  auto client = std::unique_ptr<McpClient>(new McpClient());
  client->options_ = options;
  client->conn_ = std::make_unique<Connection>(*child, std::move(label), options);
  KEEL_RETURN_IF_ERROR(client->conn_->Start());
  KEEL_RETURN_IF_ERROR(client->Initialize(options.init_timeout_ms));
  return client;
}

Status McpClient::Initialize(int64_t timeout_ms) {
  Connection& conn = *conn_;
  Json params = {
      {"protocolVersion", std::string(kProtocolVersion)},
      {"capabilities", Json::object()},
      {"clientInfo", {{"name", "keel"}, {"title", "Keel"}, {"version", kClientVersion}}}};
  // The spec forbids cancelling initialize; a server that does not answer is terminated.
  Result<Json> answer = conn.Request("initialize", std::move(params), timeout_ms, false);
  auto fail = [&](const std::string& why) {
    conn.Break(why);
    return Unavailable(conn.Label() + " failed to initialize: " + why);
  };
  if (!answer.ok()) {
    const Status& s = answer.status();
    if (s.code() == Code::kInvalidArgument) return Unavailable(s.message());  // a JSON-RPC error
    std::string broke = conn.BrokenWhat();
    if (!broke.empty()) return Unavailable(conn.Label() + " failed to initialize: " + broke);
    return fail("no answer within " + std::to_string(timeout_ms) + " ms" + conn.StderrSuffix());
  }
  const Json& result = *answer;
  if (!result.is_object()) return fail("the initialize result is not an object");
  const Json* version = Field(result, "protocolVersion");
  if (!version || !version->is_string()) {
    return fail("the initialize result has no protocolVersion");
  }
  protocol_version_ = version->get<std::string>();
  if (!IsSupportedProtocolVersion(protocol_version_)) {
    return fail("it speaks protocol version '" + Truncate(protocol_version_, 40) +
                "'; Keel speaks 2025-06-18, 2025-03-26 and 2024-11-05");
  }
  if (const Json* info = Field(result, "serverInfo")) server_name_ = StringField(*info, "name");
  const Json* capabilities = Field(result, "capabilities");
  server_capabilities_ = capabilities && capabilities->is_object() ? *capabilities : Json::object();
  conn.Notify("notifications/initialized", nullptr);
  return Status::Ok();
}

Result<std::vector<McpTool>> McpClient::ListTools() {
  std::vector<McpTool> tools;
  if (!server_capabilities_.contains("tools")) {
    if (std::string what = conn_->BrokenWhat(); !what.empty()) {
      return Unavailable(conn_->Label() + " " + what);
    }
    return tools;
  }
  return ListAllTools(conn_->Label(), kMaxToolPages, [this](Json params) {
    return conn_->Request("tools/list", std::move(params), options_.request_timeout_ms, true);
  });
}

Result<Json> McpClient::CallTool(const std::string& name, const Json& arguments,
                                 int64_t timeout_ms) {
  if (name.empty()) return InvalidArgument("MCP tool name is empty");
  if (!arguments.is_null() && !arguments.is_object()) {
    return InvalidArgument("arguments of MCP tool '" + name + "' must be a JSON object");
  }
  Json params = {{"name", name}, {"arguments", arguments.is_null() ? Json::object() : arguments}};
  int64_t timeout = timeout_ms > 0 ? timeout_ms : options_.request_timeout_ms;
  Result<Json> result = conn_->Request("tools/call", std::move(params), timeout, true);
  if (!result.ok()) {
    return Status(result.status().code(), "tool '" + name + "': " + result.status().message());
  }
  if (Status st = CheckCallResult(*result); !st.ok()) {
    return Unavailable(conn_->Label() + " sent a malformed tools/call result for '" + name +
                       "': " + st.message() + ": " + Truncate(DumpJson(*result), 300));
  }
  return result;
}

bool McpClient::alive() const { return conn_->Alive(); }
bool McpClient::tools_changed() { return conn_->TakeToolsChanged(); }
std::string McpClient::server_name() const { return server_name_; }
std::string McpClient::protocol_version() const { return protocol_version_; }
std::string McpClient::stderr_tail() const { return conn_->StderrTail(); }

}  // namespace keel::mcp

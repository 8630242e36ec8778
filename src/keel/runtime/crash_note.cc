#include "keel/runtime/crash_note.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace keel::runtime::crash_note {

namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr size_t kIdBytes = 64;  // ids are UUIDs (36 bytes); longer ones are not noted
constexpr char kHeader[] = "keel crash note v1 signal ";

// A run's line, "tenant run attempt\n", written whole before `used` is set (release) and read
// only after `used` was seen set (acquire).
struct Slot {
  std::atomic<bool> used{false};
  char line[2 * kIdBytes + 32];
  size_t length = 0;
};

Slot g_slots[kSlots];
char g_path[4096];
char g_tmp_path[4096 + 8];
struct sigaction g_previous[NSIG];
char g_alt_stack[64 * 1024];

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w <= 0) return;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// Async-signal-safe: open, write, fsync, close, rename, sigaction and raise only.
void OnFatal(int sig, siginfo_t* info, void*) {
  int fd = ::open(g_tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    char number[16];
    int len = 0;
    for (int v = sig; v > 0 && len < 15; v /= 10) number[len++] = static_cast<char>('0' + v % 10);
    char header[sizeof(kHeader) + 16];
    size_t h = sizeof(kHeader) - 1;
    std::memcpy(header, kHeader, h);
    while (len > 0) header[h++] = number[--len];
    header[h++] = '\n';
    WriteAll(fd, header, h);
    for (Slot& slot : g_slots) {
      if (slot.used.load(std::memory_order_acquire)) WriteAll(fd, slot.line, slot.length);
    }
    ::fsync(fd);
    ::close(fd);
    ::rename(g_tmp_path, g_path);
  }
  // The signal goes on as it would have without us: a fault returns to the faulting instruction,
  // which faults again into the previous handler; a sent signal (abort's raise, kill) is raised
  // again, pending until this handler returns.
  ::sigaction(sig, &g_previous[sig], nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(sig);
}

}  // namespace

void Install(const std::string& path) {
  if (path.size() >= sizeof(g_path)) return;
  std::snprintf(g_path, sizeof(g_path), "%s", path.c_str());
  std::snprintf(g_tmp_path, sizeof(g_tmp_path), "%s.tmp", path.c_str());
  // A handler for a stack overflow needs a stack of its own (this thread's: the io thread).
  stack_t current{};
  if (::sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE)) {
    stack_t alt{};
    alt.ss_sp = g_alt_stack;
    alt.ss_size = sizeof(g_alt_stack);
    ::sigaltstack(&alt, nullptr);
  }
  struct sigaction action {};
  action.sa_sigaction = OnFatal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int sig : kSignals) ::sigaction(sig, &action, &g_previous[sig]);
}

int Executing(const std::string& tenant_id, const std::string& run_id, int64_t attempt) {
  if (tenant_id.size() >= kIdBytes || run_id.size() >= kIdBytes) return -1;
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = g_slots[i];
    if (slot.used.load(std::memory_order_relaxed)) continue;
    int n = std::snprintf(slot.line, sizeof(slot.line), "%s %s %lld\n", tenant_id.c_str(),
                          run_id.c_str(), static_cast<long long>(attempt));
    slot.length = static_cast<size_t>(n);
    slot.used.store(true, std::memory_order_release);
    return i;
  }
  return -1;
}

void Ended(int slot) {
  if (slot >= 0 && slot < kSlots) g_slots[slot].used.store(false, std::memory_order_release);
}

std::optional<Note> Read(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  std::string header;
  std::getline(text, header);
  const std::string prefix = kHeader;
  if (header.rfind(prefix, 0) != 0) return std::nullopt;
  Note note;
  try {
    note.signal = std::stoi(header.substr(prefix.size()));
  } catch (...) {
    return std::nullopt;
  }
  NotedRun run;
  while (text >> run.tenant_id >> run.run_id >> run.attempt) note.runs.push_back(run);
  return note;
}

void Discard(const std::string& path) { ::unlink(path.c_str()); }

}  // namespace keel::runtime::crash_note

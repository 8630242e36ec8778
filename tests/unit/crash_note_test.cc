// The crash note (runtime/crash_note.h): a fatal signal in a child process leaves the runs it
// was executing in the note, whole, and the process still ends by its signal.

#include "keel/runtime/crash_note.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

namespace keel::runtime::crash_note {
namespace {

class CrashNoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/keel-crash-note-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/crash.note";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `crash` in a child that noted three runs and ended one; returns its wait status.
  int CrashChild(const std::function<void()>& crash) {
    pid_t pid = ::fork();
    if (pid == 0) {
      Install(path_);
      Executing("tenant-1", "run-a", 2);
      int b = Executing("tenant-1", "run-b", 1);
      Executing("tenant-2", "run-c", 5);
      Ended(b);
      crash();
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }

  void ExpectNote(int signal) {
    auto note = Read(path_);
    ASSERT_TRUE(note.has_value());
    EXPECT_EQ(note->signal, signal);
    ASSERT_EQ(note->runs.size(), 2u);
    EXPECT_EQ(note->runs[0].tenant_id, "tenant-1");
    EXPECT_EQ(note->runs[0].run_id, "run-a");
    EXPECT_EQ(note->runs[0].attempt, 2);
    EXPECT_EQ(note->runs[1].tenant_id, "tenant-2");
    EXPECT_EQ(note->runs[1].run_id, "run-c");
    EXPECT_EQ(note->runs[1].attempt, 5);
    EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
    Discard(path_);
    EXPECT_FALSE(Read(path_).has_value());
  }

  std::string dir_;
  std::string path_;
};

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer keeps SIGSEGV for itself: its report of the fault ends in an abort, which the
// note records.
constexpr int kFaultSignal = SIGABRT;
#else
constexpr int kFaultSignal = SIGSEGV;
#endif

TEST_F(CrashNoteTest, AFaultLeavesTheRunsItStopped) {
  int status = CrashChild([] {
    // A real fault (not a sent signal): a read of a page that may not be read.
    void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::printf("%d\n", *static_cast<volatile int*>(page));
  });
  // Ended by the fault, as without the note (or by a sanitizer's report of it).
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ExpectNote(kFaultSignal);
}

TEST_F(CrashNoteTest, AnAbortLeavesTheRunsItStoppedAndStillAborts) {
  int status = CrashChild([] { std::abort(); });
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGABRT);
  ExpectNote(SIGABRT);
}

TEST_F(CrashNoteTest, NoNoteOrAStrangeOneIsNone) {
  EXPECT_FALSE(Read(path_).has_value());
  std::ofstream(path_) << "something else\nt r 1\n";
  EXPECT_FALSE(Read(path_).has_value());
  std::ofstream(path_) << "keel crash note v1 signal x\n";
  EXPECT_FALSE(Read(path_).has_value());
}

}  // namespace
}  // namespace keel::runtime::crash_note

#pragma once
// runtime::crash_note — which runs this process was executing when a fatal signal stopped it.
//
// A run that crashes the server (a fault, an abort, the io watchdog's abort) is resumed after
// the restart and would crash it again, forever. The poison check (runs::ClaimRun) stops such a
// run, and it tells a crash from an outside kill by this note: Install sets handlers for
// SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT that write the executing runs (kept in a fixed
// table by Executing and Ended, which the handler reads without locks or allocation) to a file
// in KEEL_HOME, then let the signal end the process as it would have (the previous handler, a
// sanitizer's included, runs next). At the next start, the runtime Reads the note, appends
// run.crashed@v1 to each run in it and Discards it. A kill -9, a power cut or the OOM killer
// leaves no note: the poison check then needs more tries in a row (runs/run_state.cc).
//
// Executing and Ended run on the io thread only. At most kSlots runs are noted at once.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace keel::runtime::crash_note {

inline constexpr int kSlots = 1024;

// One run in a note.
struct NotedRun {
  std::string tenant_id;
  std::string run_id;
  int64_t attempt = 0;
};

struct Note {
  int signal = 0;
  std::vector<NotedRun> runs;
};

// Sets the handlers, writing to `path` when a fatal signal comes. REQUIRES: once per process.
void Install(const std::string& path);

// A run attempt starts executing here: its slot in the table, -1 when none is free (or an id
// is too long) and the run is not noted.
int Executing(const std::string& tenant_id, const std::string& run_id, int64_t attempt);
// The run in `slot` (from Executing; -1 is ignored) stopped executing here.
void Ended(int slot);

// The note a crashed process left at `path`; nullopt when there is none (an unreadable one
// counts as none: the handler writes it whole, then renames it into place).
std::optional<Note> Read(const std::string& path);
// Removes the note once what it says is recorded.
void Discard(const std::string& path);

}  // namespace keel::runtime::crash_note

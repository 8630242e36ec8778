#pragma once
// A write to a pipe whose reader is gone raises SIGPIPE, whose default action ends the whole
// process: a command that exits without reading its input (the exec tool) or an MCP server
// that dies would take the server with it. Threads that write to children's pipes block
// SIGPIPE (so the write fails with EPIPE instead) and take the pending signal off after an
// EPIPE. A child must clear its signal mask before exec (the mask survives exec).

namespace keel {

// Blocks SIGPIPE in the calling thread (idempotent).
void BlockSigpipeInThisThread();
// Takes a SIGPIPE pending on the calling thread (after a write failed with EPIPE) off.
void ConsumePendingSigpipe();
// In a child between fork and exec (async-signal-safe): clears the signal mask and sets every
// signal to its default action. The mask and ignored signals survive exec, so the program
// starts as from a shell (SIGPIPE included); and until the exec, a fault in the child does not
// run the server's handlers (runtime/crash_note.h would note the server's runs).
void ResetSignalsForExec();

}  // namespace keel

#pragma once

// A SQLite VFS that gathers a commit's write-ahead-log frames into one write.
//
// SQLite writes each WAL frame as two write(2) calls, its 24-byte header and its page, so a
// commit of 200 pages costs 400 system calls; profiled, they were a sixth of the store writer's
// CPU. This VFS wraps the platform's default one and, for WAL files only, keeps consecutive
// writes in memory until something needs them on disk: the commit's sync, a read of the file,
// its size, a truncation, a non-consecutive write, 4 MiB held, or the file's close.
//
// Safe only where every commit is synced before the WAL index publishes it, which
// synchronous=FULL guarantees: SQLite syncs a commit's frames before it appends them to the
// shared WAL index, and readers (other connections, other processes) read only frames the index
// names. Db::Open uses it for a read-write connection with synchronous=FULL and never otherwise.
// A kill -9 loses only frames of a commit whose sync had not returned, which SQLite already
// treats as never written.

namespace keel::store::sqlite {

// The VFS's name, registered (not as the default) on the first call.
const char* CoalescingWalVfs();

}  // namespace keel::store::sqlite

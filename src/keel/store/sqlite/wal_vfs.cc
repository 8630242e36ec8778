#include "keel/store/sqlite/wal_vfs.h"

#include <sqlite3.h>

#include <algorithm>
#include <new>
#include <string>

namespace keel::store::sqlite {
namespace {

constexpr size_t kMaxHeld = size_t{4} << 20;
// The unix VFS masks a write's length with 0x1ffff (os_unix.c, seekAndWriteFd), so a longer
// write loses its high bits: held bytes go out in pieces below that.
constexpr size_t kMaxWrite = 0x1f000;

// What SQLite allocates for a file of this VFS: this struct, then the wrapped file.
struct File {
  sqlite3_file base;      // first: SQLite calls through base.pMethods
  sqlite3_file* real;     // the default VFS's file, right after this struct
  std::string* held;      // consecutive bytes not yet written; null for files other than a WAL
  sqlite3_int64 held_at;  // the offset of held's first byte
};

sqlite3_vfs* g_real = nullptr;

File* Of(sqlite3_file* f) { return reinterpret_cast<File*>(f); }
sqlite3_file* Real(sqlite3_file* f) { return Of(f)->real; }

int Flush(File* f) {
  if (!f->held || f->held->empty()) return SQLITE_OK;
  int rc = SQLITE_OK;
  for (size_t done = 0; done < f->held->size() && rc == SQLITE_OK; done += kMaxWrite) {
    size_t n = std::min(kMaxWrite, f->held->size() - done);
    rc = f->real->pMethods->xWrite(f->real, f->held->data() + done, static_cast<int>(n),
                                   f->held_at + static_cast<sqlite3_int64>(done));
  }
  f->held->clear();
  return rc;
}

int Close(sqlite3_file* file) {
  File* f = Of(file);
  int flushed = Flush(f);
  int closed = f->real->pMethods->xClose(f->real);
  delete f->held;
  f->held = nullptr;
  return flushed != SQLITE_OK ? flushed : closed;
}

int Write(sqlite3_file* file, const void* data, int n, sqlite3_int64 offset) {
  File* f = Of(file);
  if (!f->held) return f->real->pMethods->xWrite(f->real, data, n, offset);
  if (!f->held->empty() && offset != f->held_at + static_cast<sqlite3_int64>(f->held->size())) {
    if (int rc = Flush(f); rc != SQLITE_OK) return rc;
  }
  if (f->held->empty()) f->held_at = offset;
  try {
    f->held->append(static_cast<const char*>(data), static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {  // no exception may cross SQLite: write it through instead
    if (int rc = Flush(f); rc != SQLITE_OK) return rc;
    return f->real->pMethods->xWrite(f->real, data, n, offset);
  }
  return f->held->size() >= kMaxHeld ? Flush(f) : SQLITE_OK;
}

// Everything else reaches the wrapped file, after the held bytes when it could observe them.
int Read(sqlite3_file* file, void* out, int n, sqlite3_int64 offset) {
  if (int rc = Flush(Of(file)); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xRead(Real(file), out, n, offset);
}
int Truncate(sqlite3_file* file, sqlite3_int64 size) {
  if (int rc = Flush(Of(file)); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xTruncate(Real(file), size);
}
int Sync(sqlite3_file* file, int flags) {
  if (int rc = Flush(Of(file)); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xSync(Real(file), flags);
}
int FileSize(sqlite3_file* file, sqlite3_int64* size) {
  if (int rc = Flush(Of(file)); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xFileSize(Real(file), size);
}
int FileControl(sqlite3_file* file, int op, void* arg) {
  if (int rc = Flush(Of(file)); rc != SQLITE_OK) return rc;
  return Real(file)->pMethods->xFileControl(Real(file), op, arg);
}
int Lock(sqlite3_file* file, int level) { return Real(file)->pMethods->xLock(Real(file), level); }
int Unlock(sqlite3_file* file, int level) {
  return Real(file)->pMethods->xUnlock(Real(file), level);
}
int CheckReservedLock(sqlite3_file* file, int* out) {
  return Real(file)->pMethods->xCheckReservedLock(Real(file), out);
}
int SectorSize(sqlite3_file* file) { return Real(file)->pMethods->xSectorSize(Real(file)); }
int DeviceCharacteristics(sqlite3_file* file) {
  return Real(file)->pMethods->xDeviceCharacteristics(Real(file));
}
int ShmMap(sqlite3_file* file, int region, int size, int extend, void volatile** out) {
  return Real(file)->pMethods->xShmMap(Real(file), region, size, extend, out);
}
int ShmLock(sqlite3_file* file, int offset, int n, int flags) {
  return Real(file)->pMethods->xShmLock(Real(file), offset, n, flags);
}
void ShmBarrier(sqlite3_file* file) { Real(file)->pMethods->xShmBarrier(Real(file)); }
int ShmUnmap(sqlite3_file* file, int delete_flag) {
  return Real(file)->pMethods->xShmUnmap(Real(file), delete_flag);
}
int Fetch(sqlite3_file* file, sqlite3_int64 offset, int n, void** out) {
  return Real(file)->pMethods->xFetch(Real(file), offset, n, out);
}
int Unfetch(sqlite3_file* file, sqlite3_int64 offset, void* p) {
  return Real(file)->pMethods->xUnfetch(Real(file), offset, p);
}

// One table per method-table version, so that SQLite calls no method the wrapped file lacks.
constexpr sqlite3_io_methods Methods(int version) {
  return {.iVersion = version,
          .xClose = Close,
          .xRead = Read,
          .xWrite = Write,
          .xTruncate = Truncate,
          .xSync = Sync,
          .xFileSize = FileSize,
          .xLock = Lock,
          .xUnlock = Unlock,
          .xCheckReservedLock = CheckReservedLock,
          .xFileControl = FileControl,
          .xSectorSize = SectorSize,
          .xDeviceCharacteristics = DeviceCharacteristics,
          .xShmMap = ShmMap,
          .xShmLock = ShmLock,
          .xShmBarrier = ShmBarrier,
          .xShmUnmap = ShmUnmap,
          .xFetch = Fetch,
          .xUnfetch = Unfetch};
}
constexpr sqlite3_io_methods kMethods[] = {Methods(1), Methods(2), Methods(3)};

int Open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* file, int flags, int* out_flags) {
  File* f = Of(file);
  f->real = reinterpret_cast<sqlite3_file*>(f + 1);
  f->real->pMethods = nullptr;
  f->held = nullptr;
  f->held_at = 0;
  f->base.pMethods = nullptr;
  int rc = g_real->xOpen(g_real, name, f->real, flags, out_flags);
  // SQLite closes a file whose open failed when its methods are set; mirror the wrapped file.
  if (!f->real->pMethods) return rc;
  // Without the memory for it, the WAL is written through like any file.
  if (rc == SQLITE_OK && (flags & SQLITE_OPEN_WAL)) f->held = new (std::nothrow) std::string();
  f->base.pMethods = &kMethods[std::clamp(f->real->pMethods->iVersion, 1, 3) - 1];
  return rc;
}

}  // namespace

const char* CoalescingWalVfs() {
  static const char* const name = [] {
    static sqlite3_vfs vfs;
    g_real = sqlite3_vfs_find(nullptr);
    vfs = *g_real;
    vfs.pNext = nullptr;
    vfs.zName = "keel-wal";
    vfs.szOsFile = static_cast<int>(sizeof(File)) + g_real->szOsFile;
    vfs.xOpen = Open;
    sqlite3_vfs_register(&vfs, /*makeDflt=*/0);
    return vfs.zName;
  }();
  return name;
}

}  // namespace keel::store::sqlite

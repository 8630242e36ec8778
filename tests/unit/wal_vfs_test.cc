// The coalescing WAL VFS (store/sqlite/wal_vfs.h) under a synced writer: a commit's frames go
// out in a few writes instead of two per page, every commit is whole to another connection,
// large and spilling transactions included, and a writer killed with SIGKILL loses no
// commit that returned.

#include "keel/store/sqlite/wal_vfs.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "keel/store/sqlite/sqlite_db.h"

namespace keel::store::sqlite {
namespace {

std::atomic<int> g_writes{0};
sqlite3_syscall_ptr g_pwrite = nullptr;
sqlite3_syscall_ptr g_pwrite64 = nullptr;

ssize_t CountingPwrite(int fd, const void* buf, size_t n, off_t off) {
  ++g_writes;
  return reinterpret_cast<ssize_t (*)(int, const void*, size_t, off_t)>(g_pwrite)(fd, buf, n, off);
}
ssize_t CountingPwrite64(int fd, const void* buf, size_t n, off_t off) {
  ++g_writes;
  return reinterpret_cast<ssize_t (*)(int, const void*, size_t, off_t)>(g_pwrite64)(fd, buf, n,
                                                                                    off);
}

class WalVfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("keel-wal-vfs-" + std::to_string(::getpid()) + ".db");
    Remove();
  }
  void TearDown() override {
    StopCounting();
    Remove();
  }
  void Remove() {
    for (const char* suffix : {"", "-wal", "-shm"})
      std::filesystem::remove(path_.string() + suffix);
  }

  std::unique_ptr<Db> Open(bool sync_full) {
    auto db = Db::Open(path_.string(), /*read_only=*/false, sync_full);
    EXPECT_TRUE(db.ok()) << db.status().ToString();
    if (!db.ok()) return nullptr;
    // Checkpoints would add the database file's own writes to the count.
    EXPECT_TRUE((*db)->Exec("PRAGMA wal_autocheckpoint=0").ok());
    return std::move(*db);
  }

  // Counts the unix VFS's pwrite calls (both names: which one it uses depends on the build).
  void StartCounting() {
    sqlite3_vfs* unix_vfs = sqlite3_vfs_find("unix");
    ASSERT_NE(unix_vfs, nullptr);
    g_pwrite = unix_vfs->xGetSystemCall(unix_vfs, "pwrite");
    g_pwrite64 = unix_vfs->xGetSystemCall(unix_vfs, "pwrite64");
    if (g_pwrite) unix_vfs->xSetSystemCall(unix_vfs, "pwrite", (sqlite3_syscall_ptr)CountingPwrite);
    if (g_pwrite64) {
      unix_vfs->xSetSystemCall(unix_vfs, "pwrite64", (sqlite3_syscall_ptr)CountingPwrite64);
    }
    ASSERT_TRUE(g_pwrite || g_pwrite64);
    g_writes = 0;
  }
  void StopCounting() {
    sqlite3_vfs* unix_vfs = sqlite3_vfs_find("unix");
    if (g_pwrite) unix_vfs->xSetSystemCall(unix_vfs, "pwrite", nullptr);
    if (g_pwrite64) unix_vfs->xSetSystemCall(unix_vfs, "pwrite64", nullptr);
    g_pwrite = g_pwrite64 = nullptr;
  }

  // Writes rows carrying `bytes` each in one transaction; returns the pwrite calls it took.
  int CommitRows(Db& db, int first, int rows, int bytes) {
    EXPECT_TRUE(db.Run("BEGIN IMMEDIATE").ok());
    SqliteSql sql(db);
    for (int i = first; i < first + rows; ++i) {
      EXPECT_TRUE(sql.Exec("INSERT INTO t(id, body) VALUES($1, $2)", int64_t{i},
                           std::string(static_cast<size_t>(bytes), static_cast<char>('a' + i % 26)))
                      .ok());
    }
    int before = g_writes;
    EXPECT_TRUE(db.Run("COMMIT").ok());
    return g_writes - before;
  }

  // What a second, ordinary connection sees: the row count and the sum of the body lengths,
  // after an integrity check of every page.
  std::pair<int64_t, int64_t> Observe() {
    auto reader = Db::Open(path_.string(), /*read_only=*/false, /*sync_full=*/false);
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) return {-1, -1};
    SqliteSql sql(**reader);
    auto check = sql.Query("PRAGMA integrity_check");
    EXPECT_TRUE(check.ok());
    EXPECT_TRUE(*check->Step());
    EXPECT_EQ(check->Text(0), "ok");
    auto r = sql.Query("SELECT count(*), coalesce(sum(length(body)), 0) FROM t");
    EXPECT_TRUE(r.ok() && *r->Step());
    return {r->Int(0), r->Int(1)};
  }

  std::filesystem::path path_;
};

TEST_F(WalVfsTest, ASyncedCommitGoesOutInAFewWritesAnUnsyncedOneFramePerFrame) {
  for (bool synced : {true, false}) {
    SCOPED_TRACE(synced ? "synchronous=FULL" : "synchronous=NORMAL");
    Remove();
    auto db = Open(synced);
    ASSERT_TRUE(db);
    ASSERT_TRUE(db->Exec("CREATE TABLE t(id INTEGER PRIMARY KEY, body TEXT)").ok());
    StartCounting();
    // 100 rows of 2,000 bytes: about 50 pages, so about 100 writes at two per frame.
    int writes = CommitRows(*db, 0, 100, 2000);
    StopCounting();
    if (synced) {
      EXPECT_LE(writes, 3);
    } else {
      EXPECT_GE(writes, 90);  // the default VFS: this connection does not coalesce
    }
  }
}

TEST_F(WalVfsTest, EveryCommitIsWholeToAnotherConnectionLargeAndSpillingOnesIncluded) {
  auto db = Open(/*sync_full=*/true);
  ASSERT_TRUE(db);
  ASSERT_TRUE(db->Exec("CREATE TABLE t(id INTEGER PRIMARY KEY, body TEXT)").ok());
  int64_t rows = 0, bytes = 0;
  auto commit = [&](int n, int size) {
    CommitRows(*db, static_cast<int>(rows), n, size);
    rows += n;
    bytes += int64_t{n} * size;
    EXPECT_EQ(Observe(), std::make_pair(rows, bytes));
  };
  commit(1, 10);
  commit(40, 3000);
  // 10 MiB in one commit: held bytes pass the 4 MiB bound and the unix VFS's 128 KiB write.
  commit(80, 128 * 1024);
  // A transaction larger than the page cache spills frames, which the writer reads back.
  ASSERT_TRUE(db->Exec("PRAGMA cache_size=20").ok());
  commit(400, 1500);
  // A spilled transaction rolled back leaves nothing.
  ASSERT_TRUE(db->Run("BEGIN IMMEDIATE").ok());
  SqliteSql sql(*db);
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(
        sql.Exec("INSERT INTO t(id, body) VALUES($1, $2)", rows + 1000 + i, std::string(1500, 'z'))
            .ok());
  }
  ASSERT_TRUE(db->Run("ROLLBACK").ok());
  EXPECT_EQ(Observe(), std::make_pair(rows, bytes));
  commit(5, 100);
  // A checkpoint reads the log back through the same file.
  ASSERT_TRUE(db->Exec("PRAGMA wal_checkpoint(TRUNCATE)").ok());
  commit(5, 100);
}

TEST_F(WalVfsTest, AWriterKilledBetweenCommitsLosesNoneThatReturned) {
  {
    auto db = Open(/*sync_full=*/true);
    ASSERT_TRUE(db);
    ASSERT_TRUE(db->Exec("CREATE TABLE t(id INTEGER PRIMARY KEY, body TEXT)").ok());
  }
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    auto db = Db::Open(path_.string(), /*read_only=*/false, /*sync_full=*/true);
    if (!db.ok()) ::_exit(2);
    SqliteSql sql(**db);
    for (int64_t i = 0;; ++i) {
      if (!(*db)->Run("BEGIN IMMEDIATE").ok()) ::_exit(3);
      for (int j = 0; j < 20; ++j) {
        if (!sql.Exec("INSERT INTO t(id, body) VALUES($1, $2)", i * 20 + j, std::string(900, 'k'))
                 .ok()) {
          ::_exit(4);
        }
      }
      if (!(*db)->Run("COMMIT").ok()) ::_exit(5);
      // Said only after COMMIT returned: the parent counts on every one it reads.
      if (::write(pipe_fds[1], &i, sizeof i) != sizeof i) ::_exit(6);
    }
  }
  ::close(pipe_fds[1]);
  int64_t last = -1, got = 0;
  while (last < 300 && ::read(pipe_fds[0], &got, sizeof got) == sizeof got) last = got;
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(pipe_fds[0]);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself: " << WEXITSTATUS(status);
  ASSERT_GE(last, 300);
  auto [rows, bytes] = Observe();
  EXPECT_GE(rows, (last + 1) * 20);
  EXPECT_EQ(rows % 20, 0) << "a transaction is partly visible";
  EXPECT_EQ(bytes, rows * 900);
}

}  // namespace
}  // namespace keel::store::sqlite

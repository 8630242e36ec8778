#include "keel/store/sqlite/sqlite_db.h"

#include <sqlite3.h>

#include "keel/store/sqlite/sqlite_memory.h"
#include "keel/store/sqlite/wal_vfs.h"

namespace keel::store::sqlite {

Status StatusFromSqlite(sqlite3* db, int rc, std::string_view what) {
  std::string msg = std::string(what) + ": " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
      return Conflict(msg);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
      return Unavailable(msg);
    default:
      return Internal(msg);
  }
}

Stmt::~Stmt() {
  if (s_) {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
}

Stmt& Stmt::Bind(int i, std::string_view v) {
  sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()),
                    borrow_ ? SQLITE_STATIC : SQLITE_TRANSIENT);
  return *this;
}
Stmt& Stmt::Bind(int i, int64_t v) {
  sqlite3_bind_int64(s_, i, v);
  return *this;
}
Stmt& Stmt::Bind(int i, std::optional<int64_t> v) {
  if (v) return Bind(i, *v);
  return BindNull(i);
}
Stmt& Stmt::BindNull(int i) {
  sqlite3_bind_null(s_, i);
  return *this;
}

Result<bool> Stmt::Step() {
  int rc = sqlite3_step(s_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return StatusFromSqlite(db_, rc, "sqlite step");
}

Status Stmt::Run() {
  KEEL_ASSIGN_OR_RETURN(bool row, Step());
  (void)row;
  return Status::Ok();
}

Result<bool> Stmt::RunChanged() {
  KEEL_RETURN_IF_ERROR(Run());
  return sqlite3_changes(db_) > 0;
}

Result<int64_t> Stmt::RunCount() {
  KEEL_RETURN_IF_ERROR(Run());
  return sqlite3_changes64(db_);
}

std::string Stmt::Text(int col) const {
  auto p = sqlite3_column_text(s_, col);
  if (!p) return {};
  return std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(s_, col));
}
int64_t Stmt::Int(int col) const { return sqlite3_column_int64(s_, col); }
double Stmt::Double(int col) const { return sqlite3_column_double(s_, col); }
bool Stmt::IsNull(int col) const { return sqlite3_column_type(s_, col) == SQLITE_NULL; }
std::optional<int64_t> Stmt::OptInt(int col) const {
  if (IsNull(col)) return std::nullopt;
  return Int(col);
}

Result<std::unique_ptr<Db>> Db::Open(const std::string& path, bool read_only, bool sync_full) {
  // Memory statistics take a global mutex on every allocation; Keel does not read them.
  static const int kConfigured = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
  (void)kConfigured;
  sqlite3* raw = nullptr;
  int flags = SQLITE_OPEN_NOMUTEX |
              (read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  // A synced writer's commits go out in one write each (wal_vfs.h says why that is safe).
  const char* vfs = !read_only && sync_full ? CoalescingWalVfs() : nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, vfs);
  if (rc != SQLITE_OK) {
    Status s = Unavailable("cannot open SQLite database " + path + ": " +
                           (raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
    sqlite3_close(raw);
    return s;
  }
  std::unique_ptr<Db> db(new Db(raw));
  sqlite3_busy_timeout(raw, 5000);
  if (!read_only) {
    KEEL_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
  }
  KEEL_RETURN_IF_ERROR(db->Exec(sync_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
  KEEL_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  KEEL_RETURN_IF_ERROR(db->Exec("PRAGMA cache_size=-16000"));
  KEEL_RETURN_IF_ERROR(RegisterMemoryFunctions(raw));
  return db;
}

Db::~Db() {
  for (auto& [sql, s] : cache_) sqlite3_finalize(s);
  sqlite3_close_v2(db_);
}

Status Db::Exec(const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    Status base = StatusFromSqlite(nullptr, rc, "");
    return Status(base.code(), std::string("sqlite: ") + msg);
  }
  return Status::Ok();
}

Status Db::Run(std::string_view sql) {
  KEEL_ASSIGN_OR_RETURN(Stmt s, Prepare(sql));
  Result<bool> row = s.Step();
  if (row.ok()) return Status::Ok();
  return Status(row.status().code(), std::string("sqlite: ") + sqlite3_errmsg(db_));
}

namespace {

// `sql` with PostgreSQL's $N parameters written as SQLite's ?N (SQLite would read $1 as a
// parameter named "$1", numbered by first use rather than by its digits). Quoted text ('...',
// "...") is left as it is.
std::string SqliteParameters(std::string_view sql) {
  std::string out(sql);
  char quote = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (quote) {
      if (c == quote) quote = 0;  // a doubled quote closes and opens again: the same
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '$' && i + 1 < out.size() && out[i + 1] >= '0' && out[i + 1] <= '9') {
      out[i] = '?';
    }
  }
  return out;
}

}  // namespace

Result<Stmt> Db::Prepare(std::string_view sql) {
  auto it = cache_.find(sql);
  if (it != cache_.end()) {
    // A Stmt of the same SQL still stepping: handing the statement out again would reset it
    // under that Stmt's reader.
    if (sqlite3_stmt_busy(it->second)) {
      return Internal("sqlite: statement in use: " + std::string(sql));
    }
    return Stmt(db_, it->second);
  }
  sqlite3_stmt* s = nullptr;
  const std::string text = SqliteParameters(sql);
  int rc = sqlite3_prepare_v3(db_, text.c_str(), static_cast<int>(text.size()),
                              SQLITE_PREPARE_PERSISTENT, &s, nullptr);
  if (rc != SQLITE_OK) return StatusFromSqlite(db_, rc, "sqlite prepare");
  cache_.emplace(sql, s);
  return Stmt(db_, s);
}

}  // namespace keel::store::sqlite

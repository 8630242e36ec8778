#pragma once
// A thin RAII layer over the SQLite C API: one connection (Db) with a cache of prepared
// statements, and a statement handle (Stmt) that resets itself when it goes out of scope.
// A Db is used by one thread at a time; its owner says which.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "keel/common/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace keel::store::sqlite {

class Stmt {
 public:
  Stmt(sqlite3* db, sqlite3_stmt* s) : db_(db), s_(s) {}
  Stmt(Stmt&& o) noexcept : db_(o.db_), s_(o.s_), borrow_(o.borrow_) { o.s_ = nullptr; }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  ~Stmt();

  Stmt& Bind(int i, std::string_view v);
  Stmt& Bind(int i, const std::string& v) { return Bind(i, std::string_view(v)); }
  Stmt& Bind(int i, const char* v) { return Bind(i, std::string_view(v)); }
  Stmt& Bind(int i, int64_t v);
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Stmt& Bind(int i, bool v) { return Bind(i, static_cast<int64_t>(v ? 1 : 0)); }
  Stmt& Bind(int i, std::optional<int64_t> v);
  Stmt& BindNull(int i);

  template <typename... Args>
  Stmt& BindAll(const Args&... args) {
    int i = 0;
    (Bind(++i, args), ...);
    return *this;
  }
  // The text bound from here on is used where it lies rather than copied (SQLITE_STATIC): for a
  // statement run before the values it was bound from go away, such as one bound and run in
  // one expression. The Stmt's destructor drops the bindings.
  Stmt& Borrowing() {
    borrow_ = true;
    return *this;
  }

  // true: a row is available; false: done.
  Result<bool> Step();
  // Steps to completion, expecting no rows.
  Status Run();
  // Runs an INSERT, UPDATE or DELETE; true when it changed a row. Cheaper than RETURNING,
  // which gathers its rows in a temporary table first.
  Result<bool> RunChanged();
  // The same, counting the rows it changed.
  Result<int64_t> RunCount();

  std::string Text(int col) const;
  int64_t Int(int col) const;
  double Double(int col) const;
  bool IsNull(int col) const;
  std::optional<int64_t> OptInt(int col) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* s_;
  bool borrow_ = false;  // Borrowing()
};

class Db {
 public:
  // Opens (creating when `create`) the database file with the pragmas Keel relies on.
  static Result<std::unique_ptr<Db>> Open(const std::string& path, bool read_only, bool sync_full);
  ~Db();

  // Runs `sql`, which may hold several statements (a migration), parsing it each time.
  Status Exec(const char* sql);
  // Runs one statement without rows (BEGIN, COMMIT, SAVEPOINT...) through the statement cache:
  // what every unit of work and read snapshot runs, parsed once per connection.
  Status Run(std::string_view sql);
  // A cached prepared statement for `sql`, whose parameters may be written ?N or, as
  // PostgreSQL writes them, $N (the same parameter: the SQL of store/sql_tx.h is shared).
  // REQUIRES: the previous Stmt for the same SQL is gone.
  Result<Stmt> Prepare(std::string_view sql);
  sqlite3* raw() { return db_; }

 private:
  explicit Db(sqlite3* db) : db_(db) {}
  sqlite3* db_;
  // Looked up by the caller's text as it is (mostly a literal): no string is built per statement.
  struct SqlHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, sqlite3_stmt*, SqlHash, std::equal_to<>> cache_;
};

// Maps a SQLite result code to a Status (constraint violations are kConflict).
Status StatusFromSqlite(sqlite3* db, int rc, std::string_view what);

// The rows of a statement, each read by `read(stmt)`.
template <typename T, typename ReadFn>
Result<std::vector<T>> Collect(Stmt& s, ReadFn read) {
  std::vector<T> out;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(read(s));
  }
  return out;
}

// The statement's one row, or kNotFound `what`.
template <typename T, typename ReadFn>
Result<T> One(Stmt& s, ReadFn read, const std::string& what) {
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFound(what);
  return read(s);
}

// The dialect store/sql_tx.h writes the shared ports in, on one Db (see SqlTx for the contract).
class SqliteSql {
 public:
  using Row = Stmt;
  // One writer: a row read in the write transaction cannot be taken by another.
  static constexpr const char* kLockSkipLocked = "";
  static constexpr const char* kLockKeyShare = "";
  // Whether the memories row's tags (a JSON array) hold the tag $5.
  static constexpr const char* kMemoryHasTag =
      "EXISTS (SELECT 1 FROM json_each(memories.tags) WHERE value = $5)";

  explicit SqliteSql(Db& db) : db_(db) {}

  template <typename... Args>
  Result<Stmt> Query(std::string_view sql, const Args&... args) {
    KEEL_ASSIGN_OR_RETURN(Stmt s, db_.Prepare(sql));
    s.BindAll(args...);
    return s;
  }
  template <typename... Args>
  Result<int64_t> Exec(std::string_view sql, const Args&... args) {
    KEEL_ASSIGN_OR_RETURN(Stmt s, db_.Prepare(sql));
    return s.Borrowing().BindAll(args...).RunCount();
  }
  // A write that must change a row, else it fails with `unchanged` (kConflict for an insert
  // that met an existing row, kNotFound for an update of none): run at once here.
  template <typename... Args>
  Status ExecChanging(Status unchanged, std::string_view sql, const Args&... args) {
    KEEL_ASSIGN_OR_RETURN(int64_t changed, Exec(sql, args...));
    return changed == 0 ? unchanged : Status::Ok();
  }
  // A write whose result is not read: run at once here.
  template <typename... Args>
  Status Send(std::string_view sql, const Args&... args) {
    return Exec(sql, args...).status();
  }
  // A read whose rows `take` gets: at once here (PgSql pipelines it).
  template <typename... Args>
  Status Later(std::string_view sql, const std::function<Status(Stmt&)>& take,
               const Args&... args) {
    KEEL_ASSIGN_OR_RETURN(Stmt s, Query(sql, args...));
    return take(s);
  }
  Status Flush() { return Status::Ok(); }
  Status BindTenant(const std::string&) { return Status::Ok(); }
  // A LIMIT parameter; a negative one is no limit.
  static int64_t Limit(int limit) { return limit; }

 private:
  Db& db_;
};

}  // namespace keel::store::sqlite

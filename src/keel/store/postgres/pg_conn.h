#pragma once
// A thin RAII layer over libpq: one connection (Conn) with a cache of prepared statements, a
// result (Rows) that frees itself, and text parameters (Params). Internal to the PostgreSQL
// store; libpq's own header stays in pg_conn.cc.
//
// Thread safety: a Conn is used by one thread at a time; its owner says which (the writer
// thread, or a reader that took it from the pool).
//
// Errors are converted here, at the adapter edge (see StatusFromResult): connection loss
// (SQLSTATE class 08, a broken connection) is kUnavailable, integrity violations (class 23,
// unique 23505 among them) are kConflict, bad data (class 22) is kInvalidArgument, the rest
// kInternal.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "keel/common/status.h"

struct pg_conn;
struct pg_result;

namespace keel::store::postgres {

using PGconn = ::pg_conn;
using PGresult = ::pg_result;

// Positional text parameters ($1, $2, ...); nullopt is SQL NULL.
class Params {
 public:
  Params& Add(std::string_view v) {
    values_.emplace_back(std::string(v));
    return *this;
  }
  Params& Add(const std::string& v) { return Add(std::string_view(v)); }
  Params& Add(const char* v) { return Add(std::string_view(v)); }
  Params& Add(int64_t v) {
    values_.emplace_back(std::to_string(v));
    return *this;
  }
  Params& Add(int v) { return Add(static_cast<int64_t>(v)); }
  Params& Add(bool v) { return Add(static_cast<int64_t>(v ? 1 : 0)); }
  Params& Add(std::optional<int64_t> v) {
    if (v) return Add(*v);
    values_.emplace_back(std::nullopt);
    return *this;
  }

  const std::vector<std::optional<std::string>>& values() const { return values_; }

 private:
  std::vector<std::optional<std::string>> values_;
};

template <typename... Args>
Params P(const Args&... args) {
  Params p;
  (p.Add(args), ...);
  return p;
}

// The rows of one statement's result, read as text.
class Rows {
 public:
  explicit Rows(PGresult* r) : r_(r) {}
  Rows(Rows&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }
  Rows& operator=(Rows&& o) noexcept;
  Rows(const Rows&) = delete;
  Rows& operator=(const Rows&) = delete;
  ~Rows();

  int size() const;
  bool empty() const { return size() == 0; }
  std::string Text(int row, int col) const;
  int64_t Int(int row, int col) const;
  bool IsNull(int row, int col) const;
  std::optional<int64_t> OptInt(int row, int col) const;
  // The rows an INSERT, UPDATE or DELETE changed.
  int64_t affected() const;

 private:
  PGresult* r_;
};

// One row of a Rows, so row readers look like SqliteTx's.
class Row {
 public:
  Row(const Rows& rows, int row) : rows_(rows), row_(row) {}
  std::string Text(int col) const { return rows_.Text(row_, col); }
  int64_t Int(int col) const { return rows_.Int(row_, col); }
  std::optional<int64_t> OptInt(int col) const { return rows_.OptInt(row_, col); }

 private:
  const Rows& rows_;
  int row_;
};

class Conn {
 public:
  // Connects to `url` (a postgres:// or postgresql:// URI, or a libpq keyword string) with
  // connect_timeout=5, TCP keepalives (10 s idle, 3 probes 5 s apart) and tcp_user_timeout=30 s
  // unless the URL sets them. kUnavailable naming host and port when the
  // server cannot be reached.
  static Result<std::unique_ptr<Conn>> Open(const std::string& url);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Runs one or more statements without parameters (simple query protocol).
  Status Exec(const char* sql);
  // Runs `sql` with `params` as a statement prepared once per connection.
  Result<Rows> Query(const std::string& sql, const Params& params);
  // Runs `sql` unprepared (for statements run once, such as migrations with parameters).
  Result<Rows> QueryOnce(const std::string& sql, const Params& params);

  // Pipelining (libpq pipeline mode): queues the prepared statement `sql` without waiting for
  // its result; `on_result`, when given, receives the rows once they arrive. Queued statements
  // go out together with the next Query (one round trip for all), or with Flush; Exec and
  // QueryOnce flush first. The first failure among them is the error of the call that
  // collected it; the statements after a failure are skipped, and in a transaction the server
  // has aborted it. A failure known at once (a parameter with a NUL byte) is returned here.
  using ResultFn = std::function<void(Rows&)>;
  Status Send(const std::string& sql, const Params& params, ResultFn on_result = nullptr);
  // Collects the results of every queued statement (nothing to do when none is queued).
  Status Flush();
  // Called before the connection waits for the server (Query and Flush, so Exec, QueryOnce
  // and CommitUnanswered too): statements a caller holds back to send as one (PostgresTx's
  // events) go out first, so that nothing read or committed misses them. nullptr: none.
  void SetBeforeWait(std::function<Status()> fn) { before_wait_ = std::move(fn); }
  // Sends COMMIT (after flushing) without waiting for its answer, which the connection's next
  // call reads first: a read-only transaction's end costs no round trip. The server runs it at
  // once, so the transaction and its snapshot end there and then.
  Status CommitUnanswered();

  // How many statements this connection has run or queued so far: PgSql compares two counts
  // to know whether a transaction has run anything since a point.
  uint64_t statements() const { return statements_; }
  // Statements carry the mark set last (PostgresStore marks them with their unit's index), so
  // that a failure collected later, with other statements, names where it came from.
  void SetMark(int mark) { mark_ = mark; }
  int mark() const { return mark_; }
  // The first statement that failed (its mark and error) since ClearFailure; mark -1 when none
  // did. A lost connection is no statement's failure.
  struct Failure {
    int mark = -1;
    Status status;
  };
  const Failure& failure() const { return failure_; }
  void ClearFailure() { failure_ = Failure{}; }
  // Whether the connection is gone (the server closed it, the network failed).
  bool broken() const;
  // Like !broken(), but first reads whatever the server sent meanwhile without blocking, so a
  // connection the server has closed since its last use (a restart) is seen as gone.
  bool Alive();
  // Whether a statement failed in the open transaction, so that only a rollback is accepted.
  bool in_failed_transaction() const;
  // Connected and outside any transaction: fit to go back to a pool or to BEGIN.
  bool idle() const;
  // "host:port/dbname" for messages; never the password.
  std::string Describe() const;

  // For a LISTENing connection (see PostgresStore's listener thread): the socket to poll, the
  // server process id, reading what arrived without blocking (false when the connection
  // failed), and the notifications received so far.
  struct Notification {
    std::string channel;
    std::string payload;
    int be_pid = 0;
  };
  int Socket() const;
  // `text` as an SQL string literal, quotes included ('' on failure, which cannot happen for
  // valid UTF-8).
  std::string QuoteLiteral(const std::string& text) const;
  int BackendPid() const;
  bool ConsumeInput();
  std::vector<Notification> TakeNotifications();

 private:
  explicit Conn(PGconn* c) : c_(c) {}
  Result<Rows> Finish(PGresult* r, std::string_view what);
  // Reads the answer of CommitUnanswered's COMMIT, if one is due.
  void ReadUnanswered();
  // The name of `sql` prepared on this connection, preparing it now if needed (outside a
  // pipeline: the caller flushes first).
  Result<std::string> Prepared(const std::string& sql);
  // Runs before_wait_ (not from within itself).
  Status BeforeWait();
  // `st`, kept as the first failure when it is a statement's (marked `mark`).
  Status Failed(Status st, int mark);

  PGconn* c_;
  std::unordered_map<std::string, std::string> prepared_;  // SQL text -> statement name
  // Queued statements awaiting their results, in order, with their marks.
  std::vector<std::pair<int, ResultFn>> pending_;
  uint64_t statements_ = 0;
  int mark_ = -1;
  Failure failure_;
  bool unanswered_ = false;  // a COMMIT sent by CommitUnanswered, its answer not read yet
  std::function<Status()> before_wait_;
  bool in_before_wait_ = false;
};

// Every row of a result, each read by `read(Row)`.
template <typename T, typename ReadFn>
std::vector<T> Collect(const Rows& rows, ReadFn read) {
  std::vector<T> out;
  out.reserve(rows.size());
  for (int i = 0; i < rows.size(); ++i) out.push_back(read(Row(rows, i)));
  return out;
}

// The result's first row, or kNotFound `what`.
template <typename T, typename ReadFn>
Result<T> One(const Rows& rows, ReadFn read, const std::string& what) {
  if (rows.empty()) return NotFound(what);
  return read(Row(rows, 0));
}

// A result read row by row as a SQLite statement steps (the Row of PgSql).
class Cursor {
 public:
  explicit Cursor(Rows rows) : rows_(std::move(rows)) {}
  Result<bool> Step() { return ++row_ < rows_.size(); }
  std::string Text(int col) const { return rows_.Text(row_, col); }
  int64_t Int(int col) const { return rows_.Int(row_, col); }
  bool IsNull(int col) const { return rows_.IsNull(row_, col); }
  std::optional<int64_t> OptInt(int col) const { return rows_.OptInt(row_, col); }

 private:
  Rows rows_;
  int row_ = -1;
};

// The dialect store/sql_tx.h writes the shared ports in, on one Conn (see SqlTx for the
// contract). It also binds the transaction to a tenant for row-level security.
class PgSql {
 public:
  using Row = Cursor;
  static constexpr const char* kLockSkipLocked = " FOR UPDATE SKIP LOCKED";
  static constexpr const char* kLockKeyShare = " FOR KEY SHARE";
  static constexpr const char* kMemoryHasTag = "tags::jsonb ? $5";

  explicit PgSql(Conn& conn) : conn_(conn) {}

  template <typename... Args>
  Result<Cursor> Query(const std::string& sql, const Args&... args) {
    KEEL_ASSIGN_OR_RETURN(Rows rows, conn_.Query(sql, P(args...)));
    return Cursor(std::move(rows));
  }
  template <typename... Args>
  Result<int64_t> Exec(const std::string& sql, const Args&... args) {
    KEEL_ASSIGN_OR_RETURN(Rows rows, conn_.Query(sql, P(args...)));
    return rows.affected();
  }
  // A write whose result is not read: pipelined, it goes out with the next statement that needs
  // an answer (or the commit), and a failure fails the unit when it is collected.
  template <typename... Args>
  Status Send(const std::string& sql, const Args&... args) {
    return conn_.Send(sql, P(args...));
  }
  // A read whose rows `take` gets when they arrive: pipelined like Send, it goes out with the
  // next statement that needs an answer (or Flush). A failure of the statement is that
  // statement's; `take` itself must not fail (a Cursor's Step does not).
  template <typename... Args>
  Status Later(const std::string& sql, std::function<Status(Cursor&)> take, const Args&... args) {
    return conn_.Send(sql, P(args...), [take = std::move(take)](Rows& rows) {
      Cursor cursor(std::move(rows));
      (void)take(cursor);
    });
  }
  // Waits for every Later read's rows (and every Send's result).
  Status Flush() { return conn_.Flush(); }
  // A write that must change a row, else the unit fails with `unchanged`. In a write
  // transaction it is pipelined like Send, and its count is checked when it arrives, perhaps
  // after the unit's end: then the unit fails (PostgresStore reads unchanged()), so its caller
  // must only propagate a failure, never act on one. Elsewhere it runs at once.
  template <typename... Args>
  Status ExecChanging(Status unchanged, const std::string& sql, const Args&... args) {
    if (!write_) {
      KEEL_ASSIGN_OR_RETURN(int64_t changed, Exec(sql, args...));
      return changed == 0 ? unchanged : Status::Ok();
    }
    return conn_.Send(sql, P(args...),
                      [this, mark = conn_.mark(), unchanged = std::move(unchanged)](Rows& rows) {
                        if (rows.affected() == 0 && unchanged_.mark < 0) {
                          unchanged_ = Conn::Failure{mark, unchanged};
                        }
                      });
  }
  // The first of the transaction's pipelined ExecChanging whose count has arrived as 0 (with
  // the mark of its statement; -1 when none has), until ClearUnchanged.
  const Conn::Failure& unchanged() const { return unchanged_; }
  void ClearUnchanged() { unchanged_ = Conn::Failure{}; }
  // Sets app.tenant_id for the rest of the transaction unless it already holds `tenant_id`
  // (pipelined: it goes out with the statement that needs it). In a write transaction, first
  // takes the tenant's write lock unless the transaction holds it (see the locks below).
  Status BindTenant(const std::string& tenant_id);
  // What app.tenant_id holds is no longer known: a transaction began, or a savepoint was
  // rolled back.
  void ForgetTenant() { bound_tenant_.reset(); }
  // The tenant the transaction is bound to now, if any.
  const std::optional<std::string>& bound_tenant() const { return bound_tenant_; }

  // Tenant write locks (docs/decisions/0014-postgres-tenant-write-locks.md). A write
  // transaction holds the lock of every tenant it binds, from then to its end, so that writes
  // of one tenant are serial across the nodes and those of different tenants are not. The
  // transaction waits for a lock only while it holds nothing else: before its first statement
  // (WaitsAllowed), or in LockFirst, which takes a known set in one order. Any other lock is
  // tried without waiting; when another node holds it, BindTenant fails and busy() names the
  // tenant: the writer rolls the unit back and runs it again first in a new transaction,
  // whose LockFirst takes unit_tenants() (the deadlock between two nodes each holding one
  // tenant and waiting for the other's cannot form).
  //
  // A write transaction began (locks: none held); `write` false for a read, which locks nothing.
  void BeginTransaction(bool write);
  // Takes the locks of `tenants`, waiting for each, in one order (pipelined). REQUIRES: right
  // after BeginTransaction(true), before any other statement.
  Status LockFirst(const std::set<std::string>& tenants);
  // The next lock may be waited for if the transaction runs no statement before asking for it.
  void WaitsAllowed() { waits_allowed_at_ = conn_.statements(); }
  // A unit begins: what it binds is counted from here.
  void BeginUnit();
  // The unit was rolled back to its savepoint: so were the locks it took.
  void UnitRolledBack();
  // The tenant whose lock another node held when this unit asked for it, or "".
  const std::string& busy() const { return busy_; }
  // Every tenant this unit bound (or tried to).
  const std::set<std::string>& unit_tenants() const { return unit_tenants_; }
  // A LIMIT parameter; a negative one is no limit (LIMIT NULL).
  static std::optional<int64_t> Limit(int limit) {
    if (limit < 0) return std::nullopt;
    return limit;
  }

 private:
  Status LockTenant(const std::string& tenant_id);

  Conn& conn_;
  std::optional<std::string> bound_tenant_;
  bool write_ = false;
  std::set<std::string> locked_;       // the tenants whose locks the transaction holds
  std::set<std::string> unit_locked_;  // those this unit took
  std::set<std::string> unit_tenants_;
  std::string busy_;
  uint64_t waits_allowed_at_ = UINT64_MAX;
  Conn::Failure unchanged_;  // ExecChanging's first failure
};

}  // namespace keel::store::postgres

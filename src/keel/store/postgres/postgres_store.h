#pragma once
// PostgresStore: the shared store for several nodes (PostgreSQL 15, libpq), behind the same
// Store interface as SqliteStore and with identical answers (DESIGN.md invariant 9).
//
// Owner: whoever opened it (the server). Threads: Read and Write may be called from any thread.
// One writer thread owns one connection and commits queued units of work (urgent ones first:
// WriteUrgent) in batches exactly as SqliteStore does: BEGIN; a SAVEPOINT per unit when the batch
// holds more than one, so a unit's failure rolls back only itself; COMMIT; then the commit listener
// with the batch's events in order, then each unit's done callback. A batch holds at most 64 units
// (PostgreSQL's cache of subtransactions per transaction). Reads run on the calling thread in a
// REPEATABLE READ READ ONLY transaction on a connection from a small pool (created on demand).
//
// Invariants:
//   1. Writes of one tenant are serial across all nodes, and writes of different tenants are
//      not: a write transaction holds the write lock of each tenant it binds from then to its
//      COMMIT (PgSql, docs/decisions/0014). So a unit's read-check-write (claiming a run,
//      intake's busy check) is atomic as with SQLite, and a tenant's event positions, assigned
//      under its lock, become visible in position order: no lower position of a tenant can
//      commit after a higher one was read (DESIGN.md section 7). A transaction waits for a
//      lock only before its first statement (for one lock, or a set taken in one order), so
//      two nodes cannot deadlock on them. Reads take no lock.
//   2. Tenant isolation is enforced twice (DESIGN.md invariant 6): every query filters by
//      tenant_id, and every tenant-scoped table has row-level security on `app.tenant_id` (set
//      transaction-locally per call; see PostgresTx). A connection that set nothing sees no
//      rows. Two roles (docs/decisions/0008-postgres-owner-and-runtime-roles.md): the store's
//      URL names the runtime role, which owns nothing and so cannot switch the policies off;
//      the owner role (MigrateStore's URL) owns the schema. Open refuses a runtime role that
//      owns (or may act as the owner of) the schema or a table, a superuser, a BYPASSRLS role,
//      and a schema that is missing or not at this binary's version.
//   3. Migrations are versioned in schema_migrations and applied by MigrateStore, as the owner,
//      under a session advisory lock, so nodes starting together do not race; a schema newer
//      than the binary is refused.
//   4. A lost connection fails the current units with kUnavailable; the writer reconnects for
//      the next batch and a reader drops the connection instead of pooling it.
//
// Cross-node wake-ups: a batch that appended events sends, inside its transaction,
// pg_notify('keel_events', '<max position> <origin> <tenant>,<tenant>...') (PostgreSQL delivers it
// only if the transaction commits). SetRemoteCommitListener starts a listener thread with its own
// connection (LISTEN keel_events) that calls the listener for notifications from other origins,
// and once after every (re)connect; it reconnects with backoff. Close() stops it.
//
// Durability: sync_full = false sets synchronous_commit = off on the writer connection (a
// server crash may lose the last commits; the database stays consistent).

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "keel/store/store.h"
#include "keel/store/write_queue.h"

namespace keel::store::postgres {

class Conn;
class PostgresTx;

class PostgresStore final : public QueuedStore {
 public:
  // `url`: postgres://user[:password]@host[:port]/db[?param=value...] (libpq syntax).
  // `audit_key` signs the audit chain heads (store/audit.h); "" leaves them unsigned.
  static Result<std::unique_ptr<Store>> Open(const std::string& url, const StoreOptions& options,
                                             const std::string& audit_key = "");
  // As the owner role of `owner_url`: applies the pending migrations, then grants the runtime
  // role of `url` what it needs (SELECT, INSERT, UPDATE, DELETE on the tables; SELECT only on
  // schema_migrations; the sequences; EXECUTE on the runtime-wide functions). Refuses when the
  // two URLs name one role, or when the tables belong to another role (an existing deployment
  // whose runtime role owns them: docs/decisions/0008 says how to move them once).
  static Status MigrateStore(const std::string& url, const std::string& owner_url);
  // The migrations the database at `url` has applied (0 before the first), read as its role.
  static Result<int64_t> SchemaVersion(const std::string& url);
  ~PostgresStore() override;

  Status Read(const std::function<Status(Tx&)>& fn) override;
  // On one of kReadThreads threads, so that no caller's event loop waits on the network.
  void ReadAsync(std::function<Status(Tx&)> fn, std::function<void(Status)> done) override;
  void SetRemoteCommitListener(std::function<void()> listener) override;
  std::string origin() const override { return options_.origin; }
  // While this node's leadership lease (migration 0021) has time left by its own clock.
  bool leader() const override;
  // Takes effect within kListenerPollMs: the listener gives the lease up (keel_resign).
  void Resign() override;
  void Close() override;

 private:
  using Unit = PendingUnit;
  // A connection with its Tx; the writer's and each pooled reader's.
  struct Session {
    std::unique_ptr<Conn> conn;
    std::unique_ptr<PostgresTx> tx;
  };

  PostgresStore(std::string url, StoreOptions options, std::string audit_key);
  Result<std::unique_ptr<Session>> Connect(bool writer);
  static Status MigrateLocked(Conn& owner, const std::string& runtime_role);
  // The checks of invariant 2 on the runtime connection; then a hint when row-level security
  // keeps memory search off its text index.
  static Status CheckRuntimeRole(Conn& conn);
  // Opens BEGIN on the writer session, reconnecting once when the connection was lost, and
  // takes the write locks of `tenants` first (PgSql::LockFirst).
  Status BeginWrite(const std::set<std::string>& tenants);
  void WriterLoop();
  // Commits `batch` in as few transactions as the tenant write locks allow (docs/decisions/
  // 0014): a unit that finds a tenant's lock taken by another node ends its transaction before
  // it (the units ahead of it commit) and runs again first in the next one, which takes that
  // tenant's lock, and those of the other tenants the unit bound, before anything else.
  void CommitBatch(std::vector<Unit>& batch);
  // One transaction of CommitBatch: the units of `batch` from `from`, with `tenants` locked
  // first. Returns where the next transaction starts (batch.size(): done); `tenants` becomes
  // what that transaction locks first. Each unit has a savepoint, released without waiting
  // for the unit's pipelined statements: the transaction waits where a unit reads, and once
  // before COMMIT. A unit found to have failed after its release (a statement that failed, a
  // write that changed no row) is answered alone and taken out of `batch`, and the
  // transaction is rolled back, so that the next one starts at `from` again.
  size_t CommitFrom(std::vector<Unit>& batch, size_t from, std::set<std::string>& tenants);
  // Commits the writer's transaction, pipelined with what is queued on `conn` (the chain
  // heads) and, for a batch with `events`, the notification other nodes' streams wait for.
  Status Commit(Conn& conn, const std::vector<std::vector<Event>>& events) const;
  // The node's own connection: LISTENs for other nodes' commits, and takes or renews the
  // cluster's leadership lease every second. Reconnects with backoff.
  void ReadLoop();
  void ListenerLoop();
  // One attempt to take or renew the leadership lease on `conn`; logs when this node starts or
  // stops leading.
  void RenewLeadership(Conn& conn);
  // Publishes this node's report (keel_node_report) on the listener's connection.
  void ReportNode(Conn& conn);
  // Stops leading now, logging `why` if it led; gives the lease up through `conn` (a node that
  // stops: logged as information) or, without one (the connection was lost), logs an error.
  void EndLeadership(Conn* conn, const std::string& why);
  void CallRemoteListener();
  // Waits up to `ms` unless the listener is stopping; returns whether it is stopping.
  bool ListenerSleep(int ms);

  const std::string url_;
  const StoreOptions options_;
  const std::string audit_key_;  // signs the audit chain heads; "" unsigned

  std::unique_ptr<Session> writer_;  // owned by the writer thread once started
  // How many more transactions give each unit a savepoint (CommitFrom); writer thread only.
  int savepoint_transactions_ = 0;

  std::mutex readers_mu_;
  std::vector<std::unique_ptr<Session>> idle_readers_;  // GUARDED_BY(readers_mu_)

  struct ReadTask {
    std::function<Status(Tx&)> fn;
    std::function<void(Status)> done;
  };
  std::mutex reads_mu_;
  std::condition_variable reads_cv_;
  std::deque<ReadTask> reads_;   // GUARDED_BY(reads_mu_)
  bool reads_closed_ = false;    // GUARDED_BY(reads_mu_)
  std::vector<std::thread> read_threads_;

  std::thread writer_thread_;

  std::mutex listener_mu_;
  std::function<void()> remote_listener_;  // GUARDED_BY(listener_mu_)
  std::condition_variable listener_cv_;
  bool listener_stop_ = false;  // GUARDED_BY(listener_mu_)
  std::atomic<bool> listener_stopping_{false};
  std::atomic<bool> resigned_{false};  // Resign was called: no leadership sought any more
  std::thread listener_thread_;
  // Until when (steady clock, its count) this node believes it leads; 0: it does not.
  std::atomic<int64_t> lease_until_{0};
};

}  // namespace keel::store::postgres

#include "keel/store/postgres/postgres_store.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <set>

#include "keel/common/log.h"
#include "keel/store/postgres/pg_conn.h"
#include "keel/store/postgres/postgres_tx.h"

namespace keel::store::postgres {
namespace {

// Held (session-level) while migrating, so nodes starting at once apply each version once.
constexpr const char* kLockMigrations = "SELECT pg_advisory_lock(7021802329620482)";
constexpr const char* kUnlockMigrations = "SELECT pg_advisory_unlock(7021802329620482)";
constexpr const char* kBeginRead = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";
// PostgreSQL tracks the first 64 subtransactions (here: savepoints of units that wrote) of a
// transaction in shared memory; beyond that every other session's snapshot must consult
// pg_subtrans while the transaction runs. 64 units per commit still amortize the fsync well.
constexpr int kMaxUnitsPerTransaction = 64;
// After a unit failed in a transaction without savepoints (and so made the others run again),
// how many transactions give each unit a savepoint, so that units failing often cost the
// others one run more at most per this many transactions (CommitFrom).
constexpr int kSavepointTransactionsAfterFailure = 16;
// How many transactions a batch may take (CommitBatch): a unit runs again in a new one each
// time it finds one more of its tenants' locks taken by another node, or when a unit after it
// failed once it was released (a write that changed no row).
constexpr int kMaxTransactionsPerBatch = 200;
// Threads that run ReadAsync's reads; each holds at most one reader connection at a time.
constexpr int kReadThreads = 8;
// Idle reader connections kept for reuse (Read on callers' threads may use more).
constexpr size_t kMaxIdleReaders = kReadThreads;
// The leadership lease (migration 0021, docs/decisions/0013): how long one lasts, and how often
// every node renews it or tries to take it. A leader that stops (SIGSTOP, a paused VM, a
// partition) leads no more than kLeaseMs after its last renewal; another node takes over
// within kLeaseMs + kLeaseRenewMs.
constexpr int64_t kLeaseMs = 5000;
constexpr int kLeaseRenewMs = 1000;
// This node counts its lease from before it asked, and as a little shorter than the server
// does, so that it stops leading before the server lets another node lead, whatever the
// latency of the request and small differences between the clocks' rates.
constexpr int64_t kLeaseBelievedMs = kLeaseMs * 4 / 5;
// A renewal waits no longer than this on the lease row's lock.
constexpr const char* kLeaseLockTimeout = "SET lock_timeout = '1s'";
// The channel for "events committed" notifications between nodes.
constexpr const char* kNotifyChannel = "keel_events";
// PostgreSQL refuses payloads of 8000 bytes or more.
constexpr size_t kMaxNotifyPayload = 7900;
// How long the listener blocks in poll() before checking whether it should stop.
constexpr int kListenerPollMs = 200;

}  // namespace

PostgresStore::PostgresStore(std::string url, StoreOptions options, std::string audit_key)
    : url_(std::move(url)), options_(std::move(options)), audit_key_(std::move(audit_key)) {}

Result<std::unique_ptr<Store>> PostgresStore::Open(const std::string& url,
                                                   const StoreOptions& options,
                                                   const std::string& audit_key) {
  if (options.origin.empty()) return InvalidArgument("store origin must not be empty");
  std::unique_ptr<PostgresStore> store(new PostgresStore(url, options, audit_key));
  KEEL_ASSIGN_OR_RETURN(store->writer_, store->Connect(/*writer=*/true));
  KEEL_RETURN_IF_ERROR(CheckRuntimeRole(*store->writer_->conn));
  // Events from before the audit chain (or from a node still running an older Keel) get their
  // hashes through the writer, below; a store without such events is not written to here.
  KEEL_ASSIGN_OR_RETURN(auto unhashed,
                        store->writer_->conn->Query(
                            "SELECT EXISTS (SELECT 1 FROM keel_unhashed_tenants())", Params()));
  store->writer_thread_ = std::thread([s = store.get()] {
    NameThread("keel-pg-write");
    s->WriterLoop();
  });
  store->listener_thread_ = std::thread([s = store.get()] {
    NameThread("keel-pg-listen");
    s->ListenerLoop();
  });
  for (int i = 0; i < kReadThreads; ++i) {
    store->read_threads_.emplace_back([s = store.get()] {
      NameThread("keel-pg-read");
      s->ReadLoop();
    });
  }
  // Under the write locks of the events' tenants, so that nodes starting at once hash each
  // event once.
  if (!unhashed.empty() && unhashed.Text(0, 0) == "t") {
    KEEL_RETURN_IF_ERROR(store->WriteSync([s = store.get()](Tx&) {
      return s->writer_->tx->BackfillChains();
    }));
  }
  return std::unique_ptr<Store>(std::move(store));
}

PostgresStore::~PostgresStore() { Close(); }

Result<std::unique_ptr<PostgresStore::Session>> PostgresStore::Connect(bool writer) {
  auto session = std::make_unique<Session>();
  KEEL_ASSIGN_OR_RETURN(session->conn, Conn::Open(url_));
  if (!writer) {
    // A read stuck behind a lock (a migration, an operator's LOCK TABLE) fails rather than
    // holding one of the reader threads for good.
    KEEL_RETURN_IF_ERROR(session->conn->Exec("SET statement_timeout = '30s'"));
  } else {
    // A node that stalls (SIGSTOP, a paused VM) or loses its network inside a transaction
    // would hold its tenants' write locks (docs/decisions/0014) until the server ends its
    // session: 1 s bounds how long the other nodes wait for those tenants. A write transaction
    // lasts milliseconds, and its client never waits on anything but PostgreSQL between its
    // statements (units are plain code on the writer thread), so only a stalled node gets
    // here; its batch fails and its runs resume after their leases.
    KEEL_RETURN_IF_ERROR(session->conn->Exec("SET idle_in_transaction_session_timeout = '1s'"));
    if (!options_.sync_full) {
      KEEL_RETURN_IF_ERROR(session->conn->Exec("SET synchronous_commit = off"));
    }
  }
  session->tx = std::make_unique<PostgresTx>(*session->conn, options_.origin, audit_key_);
  return session;
}

namespace {

constexpr const char* kRolesDoc = "docs/decisions/0008-postgres-owner-and-runtime-roles.md";

// The first row's first column, or "" for none.
std::string First(const Rows& rows) { return rows.empty() ? std::string() : rows.Text(0, 0); }

}  // namespace

Status PostgresStore::MigrateStore(const std::string& url, const std::string& owner_url) {
  static const std::string kWho = "SELECT current_user, current_database()";
  KEEL_ASSIGN_OR_RETURN(auto runtime, Conn::Open(url));
  KEEL_ASSIGN_OR_RETURN(auto runtime_who, runtime->QueryOnce(kWho, Params()));
  runtime.reset();
  KEEL_ASSIGN_OR_RETURN(auto owner, Conn::Open(owner_url));
  KEEL_ASSIGN_OR_RETURN(auto owner_who, owner->QueryOnce(kWho, Params()));
  const std::string runtime_role = runtime_who.Text(0, 0);
  if (owner_who.Text(0, 0) == runtime_role) {
    return InvalidArgument("the store URL and store_owner name the same PostgreSQL role '" +
                           runtime_role + "': keel runs as a role that owns nothing, so give "
                           "the store URL a second role (see " + kRolesDoc + ")");
  }
  if (owner_who.Text(0, 1) != runtime_who.Text(0, 1)) {
    return InvalidArgument("the store URL and store_owner name different databases ('" +
                           runtime_who.Text(0, 1) + "', '" + owner_who.Text(0, 1) + "')");
  }
  KEEL_RETURN_IF_ERROR(owner->Exec(kLockMigrations));
  Status st = MigrateLocked(*owner, runtime_role);
  Status unlock = owner->Exec(kUnlockMigrations);
  return st.ok() ? unlock : st;
}

Result<int64_t> PostgresStore::SchemaVersion(const std::string& url) {
  KEEL_ASSIGN_OR_RETURN(auto conn, Conn::Open(url));
  KEEL_ASSIGN_OR_RETURN(
      auto table, conn->QueryOnce("SELECT to_regclass('schema_migrations') IS NOT NULL", Params()));
  if (table.empty() || table.Text(0, 0) != "t") return 0;
  KEEL_ASSIGN_OR_RETURN(
      auto rows,
      conn->QueryOnce("SELECT coalesce(max(version), 0) FROM schema_migrations", Params()));
  return rows.empty() ? 0 : rows.Int(0, 0);
}

Status PostgresStore::MigrateLocked(Conn& conn, const std::string& runtime_role) {
  // Tables of another role (a deployment from before the two roles, whose runtime role owns
  // them) are not taken silently: moving them is an administrator's one-time step.
  KEEL_ASSIGN_OR_RETURN(
      auto others,
      conn.QueryOnce("SELECT string_agg(DISTINCT pg_get_userbyid(c.relowner)::text, ', '), "
                     "current_user FROM pg_class c WHERE c.relnamespace = "
                     "current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'S') AND "
                     "c.relowner <> (SELECT oid FROM pg_roles WHERE rolname = current_user)",
                     Params()));
  if (!First(others).empty()) {
    const std::string owner = others.Text(0, 1);
    return Unavailable("the tables of this database belong to role(s) " + First(others) +
                       ", not to the owner role '" + owner + "': move them once, as a role "
                       "with CREATEROLE or a superuser: REASSIGN OWNED BY " + First(others) +
                       " TO " + owner + "; then start again (see " + kRolesDoc + ")");
  }
  Status created =
      conn.Exec("CREATE TABLE IF NOT EXISTS schema_migrations(version BIGINT PRIMARY KEY, "
                "applied_at BIGINT NOT NULL)");
  if (!created.ok()) {
    return Status(created.code(), created.message() + " (the owner role '" + others.Text(0, 1) +
                                      "' must own the database or its schema: ALTER DATABASE "
                                      "... OWNER TO " + others.Text(0, 1) + "; see " + kRolesDoc +
                                      ")");
  }
  KEEL_ASSIGN_OR_RETURN(
      auto rows,
      conn.QueryOnce("SELECT coalesce(max(version), 0) FROM schema_migrations", Params()));
  int64_t current = rows.empty() ? 0 : rows.Int(0, 0);
  const auto& migrations = Migrations();
  if (current > static_cast<int64_t>(migrations.size())) {
    return Unavailable("database schema version " + std::to_string(current) +
                       " is newer than this keel (" + std::to_string(migrations.size()) +
                       "); upgrade keel");
  }
  for (size_t v = current + 1; v <= migrations.size(); ++v) {
    KEEL_RETURN_IF_ERROR(conn.Exec("BEGIN"));
    Status st = conn.Exec(migrations[v - 1]);
    if (st.ok()) {
      st = conn.QueryOnce("INSERT INTO schema_migrations(version, applied_at) VALUES($1, $2)",
                          P(static_cast<int64_t>(v), NowMillis()))
               .status();
    }
    if (st.ok()) st = conn.Exec("COMMIT");
    if (!st.ok()) {
      (void)conn.Exec("ROLLBACK");
      return Status(st.code(), "migration " + std::to_string(v) + " failed: " + st.message());
    }
  }
  // The runtime role's rights, granted on every start with the owner so that new tables get
  // them: rows, never TRUNCATE, REFERENCES or TRIGGER; schema_migrations read-only.
  KEEL_ASSIGN_OR_RETURN(
      auto grants,
      conn.QueryOnce(
          "SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %1$I TO "
          "%2$I; REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON schema_migrations FROM %2$I; "
          "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %1$I TO %2$I; "
          "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %1$I TO %2$I', current_schema(), $1::text)",
          P(runtime_role)));
  Status granted = conn.Exec(First(grants).c_str());
  if (!granted.ok()) {
    return Status(granted.code(), "granting the runtime role '" + runtime_role +
                                      "' its rights failed: " + granted.message());
  }
  return Status::Ok();
}

Status PostgresStore::CheckRuntimeRole(Conn& conn) {
  KEEL_ASSIGN_OR_RETURN(
      auto rows,
      conn.QueryOnce(
          "SELECT current_user, current_database(), r.rolsuper OR r.rolbypassrls, "
          "(SELECT array_to_string((array_agg(c.relname::text ORDER BY c.relname))[1:3], ', ') "
          " || CASE WHEN count(*) > 3 THEN ' and ' || (count(*) - 3) || ' more' ELSE '' END "
          " FROM pg_class c "
          " WHERE c.relnamespace = current_schema()::regnamespace AND "
          " c.relkind IN ('r', 'p', 'S', 'v', 'm') AND "
          " pg_has_role(current_user, c.relowner, 'MEMBER')), "
          "(SELECT pg_has_role(current_user, n.nspowner, 'MEMBER') FROM pg_namespace n "
          " WHERE n.nspname = current_schema()), "
          "has_schema_privilege(current_schema(), 'CREATE'), "
          "to_regclass('schema_migrations') IS NOT NULL, "
          "(SELECT string_agg(tablename::text, ', ') FROM pg_policies "
          " WHERE schemaname = current_schema() AND (qual LIKE '%app.system%' OR "
          " coalesce(with_check, '') LIKE '%app.system%')), "
          "current_schema() "
          "FROM pg_roles r WHERE r.rolname = current_user",
          Params()));
  if (rows.empty()) return Internal("cannot read the store role's attributes");
  const std::string role = rows.Text(0, 0);
  const std::string db = rows.Text(0, 1);
  const std::string schema = rows.Text(0, 8);
  const std::string why = " (see " + std::string(kRolesDoc) + ")";
  if (rows.Text(0, 2) == "t") {
    return PermissionDenied("PostgreSQL role '" + role + "' is a superuser or has BYPASSRLS: "
                            "row-level security would not apply to it; run keel as a role "
                            "that owns nothing" + why);
  }
  if (!rows.Text(0, 3).empty() || rows.Text(0, 4) == "t") {
    return PermissionDenied(
        "PostgreSQL role '" + role + "' owns (or may act as the owner of) " +
        (rows.Text(0, 3).empty() ? "schema " + schema : rows.Text(0, 3)) + " in database " + db +
        ": an owner can switch row-level security off, so keel refuses to run as it. Create an "
        "owner role (e.g. keel_owner), move the objects to it once, as a role with CREATEROLE "
        "or a superuser (REASSIGN OWNED BY " + role + " TO keel_owner; or ALTER SCHEMA/DATABASE "
        "... OWNER TO keel_owner), and give its URL as store_owner (KEEL_STORE_OWNER)" + why);
  }
  if (rows.Text(0, 5) == "t") {
    return PermissionDenied("PostgreSQL role '" + role + "' may create objects in schema " +
                            schema + ": revoke it (REVOKE CREATE ON SCHEMA " + schema +
                            " FROM PUBLIC, " + role + ")" + why);
  }
  if (rows.Text(0, 6) != "t") {
    return Unavailable("database " + db + " has no keel schema yet: give the owner role's URL "
                       "as store_owner (KEEL_STORE_OWNER), or run `keel store migrate "
                       "--owner-url URL`" + why);
  }
  if (!rows.Text(0, 7).empty()) {
    return PermissionDenied("row-level security policies of " + rows.Text(0, 7) +
                            " accept app.system, which any role can set: they must check "
                            "app.tenant_id only" + why);
  }
  KEEL_ASSIGN_OR_RETURN(
      auto version,
      conn.QueryOnce("SELECT coalesce(max(version), 0) FROM schema_migrations", Params()));
  const int64_t current = version.empty() ? 0 : version.Int(0, 0);
  const int64_t wanted = static_cast<int64_t>(Migrations().size());
  if (current > wanted) {
    return Unavailable("database schema version " + std::to_string(current) +
                       " is newer than this keel (" + std::to_string(wanted) + "); upgrade keel");
  }
  if (current < wanted) {
    return Unavailable("database schema version " + std::to_string(current) +
                       " is older than this keel (" + std::to_string(wanted) +
                       "): give the owner role's URL as store_owner (KEEL_STORE_OWNER), or run "
                       "`keel store migrate --owner-url URL`" + why);
  }
  return Status::Ok();
}

Status PostgresStore::Read(const std::function<Status(Tx&)>& fn) {
  std::unique_ptr<Session> reader;
  {
    std::lock_guard<std::mutex> lock(readers_mu_);
    if (!idle_readers_.empty()) {
      reader = std::move(idle_readers_.back());
      idle_readers_.pop_back();
    }
  }
  // A pooled connection may have been closed by the server since its last use.
  if (!reader || !reader->conn->Alive()) {
    KEEL_ASSIGN_OR_RETURN(reader, Connect(/*writer=*/false));
  }
  // Pipelined: the BEGIN goes out with the read's first statement.
  Status st = reader->conn->Send(kBeginRead, Params());
  if (st.ok()) {
    reader->tx->BeginTransaction(/*write=*/false);
    try {
      st = fn(*reader->tx);
    } catch (const std::exception& e) {
      st = Internal(std::string("read failed: ") + e.what());
    }
    Status flushed = reader->conn->Flush();  // statements still queued (see Conn::Send)
    if (st.ok()) st = flushed;
    (void)reader->conn->CommitUnanswered();
  }
  if (reader->conn->idle()) {
    std::lock_guard<std::mutex> lock(readers_mu_);
    if (idle_readers_.size() < kMaxIdleReaders) idle_readers_.push_back(std::move(reader));
  }
  return st;
}

void PostgresStore::ReadAsync(std::function<Status(Tx&)> fn, std::function<void(Status)> done) {
  {
    std::lock_guard<std::mutex> lock(reads_mu_);
    if (!reads_closed_) {
      reads_.push_back(ReadTask{std::move(fn), std::move(done)});
      reads_cv_.notify_one();
      return;
    }
  }
  done(Unavailable("store is closed"));
}

void PostgresStore::ReadLoop() {
  while (true) {
    ReadTask task;
    {
      std::unique_lock<std::mutex> lock(reads_mu_);
      reads_cv_.wait(lock, [&] { return reads_closed_ || !reads_.empty(); });
      if (reads_.empty()) return;  // closed and drained
      task = std::move(reads_.front());
      reads_.pop_front();
    }
    task.done(Read(task.fn));
  }
}

void PostgresStore::Close() {
  {
    std::lock_guard<std::mutex> lock(reads_mu_);
    reads_closed_ = true;
    reads_cv_.notify_all();
  }
  for (auto& t : read_threads_) {
    if (t.joinable() && std::this_thread::get_id() != t.get_id()) t.join();
  }
  {
    std::lock_guard<std::mutex> lock(listener_mu_);
    listener_stop_ = true;
    listener_stopping_ = true;
    listener_cv_.notify_all();
  }
  if (listener_thread_.joinable() && std::this_thread::get_id() != listener_thread_.get_id()) {
    listener_thread_.join();
  }
  queue_.Close();
  if (writer_thread_.joinable() && std::this_thread::get_id() != writer_thread_.get_id()) {
    writer_thread_.join();
  }
}

void PostgresStore::WriterLoop() {
  const int max_batch = std::clamp(options_.max_batch, 1, kMaxUnitsPerTransaction);
  std::vector<Unit> batch;
  while (queue_.Take(static_cast<size_t>(max_batch), batch)) {
    CommitBatch(batch);
    batch.clear();
  }
  writer_.reset();
}

Status PostgresStore::BeginWrite(const std::set<std::string>& tenants) {
  if (writer_ && writer_->conn->Alive() && !writer_->conn->idle()) {
    // Left inside a transaction by a failure; BEGIN there would only warn and carry on in it.
    (void)writer_->conn->Exec("ROLLBACK");
  }
  // A connection the server closed since the last batch (a restart, a failover) is replaced
  // here, before any unit runs on it.
  if (!writer_ || !writer_->conn->Alive()) {
    writer_.reset();
    KEEL_ASSIGN_OR_RETURN(writer_, Connect(/*writer=*/true));
  }
  // Pipelined: BEGIN and the locks go out with the first unit's first statement.
  KEEL_RETURN_IF_ERROR(writer_->conn->Send("BEGIN", Params()));
  writer_->tx->BeginTransaction(/*write=*/true);
  return writer_->tx->LockFirst(tenants);
}

void PostgresStore::CommitBatch(std::vector<Unit>& batch) {
  std::set<std::string> tenants;
  size_t from = 0;
  // Each transaction but the last ends at a unit that must run again with more locks taken
  // first; the set grows each time, so a unit of N tenants runs at most N + 1 times.
  for (int transactions = 0; from < batch.size(); ++transactions) {
    if (transactions == kMaxTransactionsPerBatch) {
      // Never seen; a bound rather than a loop that might not end.
      std::vector<Unit> rest(std::make_move_iterator(batch.begin() + static_cast<long>(from)),
                             std::make_move_iterator(batch.end()));
      std::vector<Status> results(rest.size(),
                                  Unavailable("could not take the write locks of its tenants"));
      std::vector<std::vector<Event>> events(rest.size());
      queue_.Finish(rest, results, events, Status::Ok(), 0, listener_);
      return;
    }
    from = CommitFrom(batch, from, tenants);
  }
}

size_t PostgresStore::CommitFrom(std::vector<Unit>& batch, size_t from,
                                 std::set<std::string>& tenants) {
  const size_t count = batch.size() - from;
  std::vector<Status> results(count);
  std::vector<std::vector<Event>> events(count);
  Status begin = BeginWrite(tenants);
  Status commit;
  int committed_units = 0;
  size_t end = batch.size();  // where this transaction stops
  if (begin.ok()) {
    Conn& conn = *writer_->conn;
    PostgresTx& tx = *writer_->tx;
    // The unit among those ran so far (from 0) whose pipelined statement failed or changed no
    // row first, with that failure; nullopt when none has (so far as the answers have come).
    auto culprit = [&]() -> std::optional<std::pair<size_t, Status>> {
      const Conn::Failure& failed = conn.failure();
      const Conn::Failure& unchanged = tx.unchanged();
      const Conn::Failure* first = failed.mark >= 0 ? &failed : nullptr;
      if (unchanged.mark >= 0 && (!first || unchanged.mark < first->mark)) first = &unchanged;
      if (!first) return std::nullopt;
      return std::make_pair(static_cast<size_t>(first->mark), first->status);
    };
    // A released unit failed: the transaction is rolled back, that unit fails alone, and the
    // others run again in the next one (docs/decisions/0014: a unit may run twice).
    auto fail_alone = [&](size_t unit, Status why) {
      tx.ResetUnit();
      (void)conn.Exec("ROLLBACK");
      tx.TransactionDone(false);
      std::vector<Unit> failed;
      failed.push_back(std::move(batch[from + unit]));
      batch.erase(batch.begin() + static_cast<long>(from + unit));
      std::vector<Status> failed_results{std::move(why)};
      std::vector<std::vector<Event>> no_events(1);
      queue_.Finish(failed, failed_results, no_events, Status::Ok(), 0, listener_);
      return from;
    };
    // Savepoints let a unit that fails be undone alone, at the price of two statements and a
    // subtransaction for every unit (4 to 15 % of the turns one node takes). Units rarely fail,
    // so a transaction takes none: when one fails, the transaction is rolled back, that unit
    // fails alone and the others run again (docs/decisions/0014: a unit may run twice), and the
    // next transactions take savepoints. A unit alone in its transaction needs none either: its
    // failure rolls the transaction back.
    const bool savepoints = count > 1 && savepoint_transactions_ > 0;
    if (savepoint_transactions_ > 0) --savepoint_transactions_;
    bool savepoint_open = false;  // the previous boundary already opened this unit's savepoint
    for (size_t i = 0; i < count; ++i) {
      tx.ResetUnit();
      tx.ClearCarried();
      tx.BeginUnit();
      conn.SetMark(static_cast<int>(i));
      // Pipelined with the unit's first statements.
      Status st =
          savepoints && !savepoint_open ? conn.Send("SAVEPOINT unit", Params()) : Status::Ok();
      savepoint_open = false;
      if (st.ok()) {
        if (i == 0) tx.WaitsAllowed();
        try {
          st = batch[from + i].fn(tx);
          if (st.ok()) st = tx.CarriedAll();
          if (st.ok()) {
            st = tx.SendEvents();
          } else {
            tx.DropEvents();
          }
        } catch (const std::exception& e) {
          tx.DropEvents();
          st = Internal(std::string("write failed: ") + e.what());
        }
        if (!tx.busy_tenant().empty() && st.ok()) {
          // The unit went on without a tenant's lock (it ignored the refusal): not this time.
          st = Unavailable("tenant " + tx.busy_tenant() + " is being written by another node");
        }
      }
      const bool more = i + 1 < count;
      if (st.ok() && !conn.in_failed_transaction() && !culprit()) {
        // The unit is part of the transaction: released, and the next one's savepoint opened,
        // without waiting. Its statements are answered with the next read, a full pipeline, or
        // the flush before COMMIT; a failure found there fails it alone (fail_alone).
        if (savepoints) {
          st = conn.Send("RELEASE unit", Params());
          if (st.ok() && more) st = conn.Send("SAVEPOINT unit", Params());
          savepoint_open = more && st.ok();
        }
        results[i] = st;
        if (st.ok()) {
          events[i] = tx.TakeAppended();
          ++committed_units;
        }
        continue;
      }
      // Something failed: every statement sent so far is answered before deciding whose
      // failure it is.
      Status flushed = conn.Flush();
      auto c = culprit();
      if (c && c->first < i) return fail_alone(c->first, c->second);
      if (st.ok() && c) st = c->second;
      if (st.ok()) st = flushed;
      if (st.ok()) {
        // The unit went on after a failed statement; PostgreSQL has aborted its work.
        st = Internal("write failed: a statement of the unit failed and its error was ignored");
      }
      if (!savepoints && count > 1) {
        // Its statements cannot be undone alone: the transaction is rolled back, and the next
        // ones take savepoints. The unit fails alone or, when another node holds one of its
        // tenants, runs again first with its tenants locked; the others run again.
        savepoint_transactions_ = kSavepointTransactionsAfterFailure;
        if (tx.busy_tenant().empty()) return fail_alone(i, st);
        std::set<std::string> next = tx.unit_tenants();
        if (i == 0) next.insert(tenants.begin(), tenants.end());
        tenants = std::move(next);
        tx.ResetUnit();
        (void)conn.Exec("ROLLBACK");
        tx.TransactionDone(false);
        std::rotate(batch.begin() + static_cast<long>(from),
                    batch.begin() + static_cast<long>(from + i),
                    batch.begin() + static_cast<long>(from + i + 1));
        return from;
      }
      if (savepoints) {
        (void)conn.Exec("ROLLBACK TO unit; RELEASE unit");
        tx.AfterRollbackToSavepoint();
      }
      // Its failures are answered: the transaction goes on without it.
      conn.ClearFailure();
      tx.ClearUnchanged();
      if (!tx.busy_tenant().empty()) {
        // Another node holds a tenant this unit needs: it runs again, first in the next
        // transaction, with its tenants locked before anything else.
        std::set<std::string> next = tx.unit_tenants();
        if (i == 0) next.insert(tenants.begin(), tenants.end());
        tenants = std::move(next);
        end = from + i;
        break;
      }
      results[i] = st;
    }
    if (committed_units == 0) {
      commit = conn.Exec("ROLLBACK");
    } else {
      // Every statement answered before COMMIT: a released unit that failed fails alone.
      Status flushed = conn.Flush();
      if (auto c = culprit()) return fail_alone(c->first, c->second);
      if (!flushed.ok()) {
        commit = flushed;
      } else if (conn.in_failed_transaction()) {
        // COMMIT would quietly roll back; say so instead.
        commit = Internal("write failed: the transaction was aborted");
      } else {
        for (auto& unit : events) tx.FillPositions(unit);
        // The usage totals and the chain heads the units moved, once per transaction
        // (store/audit.h), pipelined with the COMMIT, whose flush reports their failure.
        commit = tx.WriteTotals();
        if (commit.ok()) commit = tx.WriteChainHeads();
        if (commit.ok()) commit = Commit(conn, events);
      }
    }
    if (!commit.ok()) (void)conn.Exec("ROLLBACK");
    tx.TransactionDone(commit.ok() && committed_units > 0);
  } else {
    for (auto& r : results) r = begin;
  }
  if (end == batch.size() && from == 0) {
    queue_.Finish(batch, results, events, commit, committed_units, listener_);
    return end;
  }
  // Only the units this transaction ran are told.
  std::vector<Unit> ran(std::make_move_iterator(batch.begin() + static_cast<long>(from)),
                        std::make_move_iterator(batch.begin() + static_cast<long>(end)));
  results.resize(ran.size());
  events.resize(ran.size());
  queue_.Finish(ran, results, events, commit, committed_units, listener_);
  return end;
}

Status PostgresStore::Commit(Conn& conn, const std::vector<std::vector<Event>>& events) const {
  int64_t max_position = 0;
  std::set<std::string> tenants;
  for (const auto& unit : events) {
    for (const auto& e : unit) {
      max_position = std::max(max_position, e.position);
      tenants.insert(e.tenant_id);
    }
  }
  if (max_position > 0) {
    std::string payload = std::to_string(max_position) + " " + options_.origin + " ";
    bool first = true;
    for (const auto& t : tenants) {
      if (!first) payload += ',';
      payload += t;
      first = false;
    }
    if (payload.size() > kMaxNotifyPayload) {
      payload = std::to_string(max_position) + " " + options_.origin;
      if (payload.size() > kMaxNotifyPayload) payload = std::to_string(max_position);
    }
    static const std::string kNotify = "SELECT pg_notify($1, $2)";
    KEEL_RETURN_IF_ERROR(conn.Send(kNotify, P(kNotifyChannel, payload)));
  }
  KEEL_RETURN_IF_ERROR(conn.Send("COMMIT", Params()));
  return conn.Flush();
}

void PostgresStore::SetRemoteCommitListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  remote_listener_ = std::move(listener);
}

void PostgresStore::CallRemoteListener() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(listener_mu_);
    fn = remote_listener_;
  }
  if (fn) fn();
}

bool PostgresStore::leader() const {
  if (resigned_) return false;
  return std::chrono::steady_clock::now().time_since_epoch().count() < lease_until_.load();
}

void PostgresStore::Resign() { resigned_ = true; }

void PostgresStore::RenewLeadership(Conn& conn) {
  const auto asked = std::chrono::steady_clock::now();
  auto rows = conn.QueryOnce("SELECT keel_lead($1, $2)", P(options_.origin, kLeaseMs));
  // Whether it held a lease (perhaps one that has run out meanwhile: a process stopped).
  const bool held = lease_until_.load() != 0;
  if (rows.ok() && !rows->empty() && !rows->IsNull(0, 0)) {
    lease_until_ = (asked + std::chrono::milliseconds(kLeaseBelievedMs)).time_since_epoch().count();
    if (!held) LogInfo("this node (origin " + options_.origin + ") now leads the cluster");
    return;
  }
  lease_until_ = 0;
  if (held) {
    LogError("this node (origin " + options_.origin + ") no longer leads the cluster: " +
             (rows.ok() ? "another node holds the lease" : rows.status().message()));
  }
}

void PostgresStore::ReportNode(Conn& conn) {
  const NodeInfo self = NodeReport();
  // A node joins the fleet's list once it serves HTTP (serve.cc sets the report then): a
  // report without an address showed a node no one could reach.
  if (self.address.empty()) return;
  auto done = conn.QueryOnce(
      "SELECT keel_node_report($1, $2, $3, $4, $5)",
      P(self.origin, self.address, self.started_at, self.runs_executing, self.runs_finished));
  if (!done.ok() && !conn.broken()) LogError("the fleet report failed: " + done.status().message());
}

void PostgresStore::EndLeadership(Conn* conn, const std::string& why) {
  const bool held = lease_until_.exchange(0) != 0;
  if (!held) return;
  const std::string line =
      "this node (origin " + options_.origin + ") no longer leads the cluster: " + why;
  if (!conn) {
    LogError(line);
    return;
  }
  LogInfo(line);
  // Given up at once, so that another node need not wait for the lease to run out.
  if (!conn->broken()) (void)conn->QueryOnce("SELECT keel_resign($1)", P(options_.origin));
}

bool PostgresStore::ListenerSleep(int ms) {
  std::unique_lock<std::mutex> lock(listener_mu_);
  return listener_cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return listener_stop_; });
}

void PostgresStore::ListenerLoop() {
  int backoff_ms = 100;
  bool logged_failure = false;
  while (!listener_stopping_) {
    auto opened = Conn::Open(url_);
    Status st = opened.ok() ? Status::Ok() : opened.status();
    std::unique_ptr<Conn> conn;
    if (st.ok()) {
      conn = std::move(opened).value();
      st = conn->Exec(kLeaseLockTimeout);
      if (st.ok()) st = conn->Exec((std::string("LISTEN ") + kNotifyChannel).c_str());
    }
    if (!st.ok()) {
      if (!logged_failure) {
        LogError("event notifications: cannot listen (retrying): " + st.message());
        logged_failure = true;
      }
      if (ListenerSleep(backoff_ms)) break;
      backoff_ms = std::min(backoff_ms * 2, 5000);
      continue;
    }
    if (logged_failure) LogInfo("event notifications: listening again");
    logged_failure = false;
    backoff_ms = 100;
    // Commits may have happened while not listening: let every reader look again.
    CallRemoteListener();
    auto next_try = std::chrono::steady_clock::now();
    while (!listener_stopping_) {
      if (resigned_) {
        EndLeadership(conn.get(), "it is draining");
        if (conn->broken()) break;
      } else if (std::chrono::steady_clock::now() >= next_try) {
        RenewLeadership(*conn);
        if (!conn->broken()) ReportNode(*conn);
        next_try = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLeaseRenewMs);
        if (conn->broken()) break;
      }
      pollfd pfd{conn->Socket(), POLLIN, 0};
      int n = ::poll(&pfd, 1, kListenerPollMs);
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      // Notifications may also have arrived during the leadership query.
      if (n > 0 && !conn->ConsumeInput()) break;  // connection lost: reconnect
      bool remote = false;
      for (const auto& note : conn->TakeNotifications()) {
        // "<position> <origin> <tenants>": this node's own commits already reached the commit
        // listener. A payload without an origin counts as remote (a spurious wake is harmless).
        const std::string& p = note.payload;
        size_t a = p.find(' ');
        std::string origin;
        if (a != std::string::npos) origin = p.substr(a + 1, p.find(' ', a + 1) - a - 1);
        if (origin != options_.origin) remote = true;
      }
      if (remote) CallRemoteListener();
    }
    if (listener_stopping_) {
      EndLeadership(conn.get(), "it is stopping");
    } else {
      // No renewal without the connection: stop leading now rather than when the lease ends.
      EndLeadership(nullptr, "its connection to PostgreSQL was lost");
    }
    if (!listener_stopping_) {
      LogError("event notifications: connection lost; reconnecting");
      logged_failure = true;
      if (ListenerSleep(backoff_ms)) break;
    }
  }
}

}  // namespace keel::store::postgres

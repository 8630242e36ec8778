#include "keel/store/sqlite/sqlite_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <utility>

#include "keel/common/log.h"
#include "keel/store/sqlite/sqlite_db.h"
#include "keel/store/sqlite/sqlite_tx.h"

namespace keel::store::sqlite {
namespace {

// After a unit failed in a transaction without savepoints (and so made the others run again),
// how many transactions give each unit a savepoint, so that units failing often cost the
// others one run more at most per this many transactions (CommitBatch).
constexpr int kSavepointTransactionsAfterFailure = 16;

// How long the writer holds a transaction of deferred units open for the units that follow
// them: a turn on a model that answers at once ends well within it.
constexpr auto kDeferredHold = std::chrono::milliseconds(2);

}  // namespace

SqliteStore::SqliteStore(std::string path, StoreOptions options, std::string audit_key)
    : path_(std::move(path)), options_(std::move(options)), audit_key_(std::move(audit_key)) {}

Result<std::unique_ptr<Store>> SqliteStore::Open(const std::string& path,
                                                 const StoreOptions& options,
                                                 const std::string& audit_key) {
  if (options.origin.empty()) return InvalidArgument("store origin must not be empty");
  // Checked before the file is opened to write (which would set its journal mode): not a file,
  // another program's database, or a newer keel's store is refused as it is.
  KEEL_ASSIGN_OR_RETURN(int64_t version, SchemaVersion(path));
  if (version > static_cast<int64_t>(Migrations().size())) {
    return Unavailable("database schema version " + std::to_string(version) +
                       " is newer than this keel (" + std::to_string(Migrations().size()) +
                       "); upgrade keel");
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(path, options, audit_key));
  KEEL_ASSIGN_OR_RETURN(store->writer_db_, Db::Open(path, /*read_only=*/false, options.sync_full));
  KEEL_RETURN_IF_ERROR(store->Migrate(*store->writer_db_));
  // Savepoint journals stay in memory rather than spilling to temporary files.
  KEEL_RETURN_IF_ERROR(store->writer_db_->Exec("PRAGMA temp_store=MEMORY"));
  // The WAL is copied back into the database every 8,000 pages (32 MiB at 4 KiB) rather than
  // SQLite's 1,000: the pages every turn rewrites (index roots and leaves of the runs, events and
  // messages tables) are copied once per checkpoint however often they changed, which took a
  // tenth of the writer's time per turn at 64 clients (measured: 10 % less writer CPU).
  KEEL_RETURN_IF_ERROR(store->writer_db_->Exec("PRAGMA wal_autocheckpoint=8000"));
  store->writer_tx_ =
      std::make_unique<SqliteTx>(*store->writer_db_, options.origin, audit_key);
  // Events from before the audit chain get their hashes once, through the writer. A store
  // without such events (the usual case) is not written to here, so that `keel export` beside
  // a running server stays a reader.
  bool unhashed = false;
  {
    KEEL_ASSIGN_OR_RETURN(auto s, store->writer_db_->Prepare(
                                      "SELECT 1 FROM events WHERE hash='' LIMIT 1"));
    KEEL_ASSIGN_OR_RETURN(unhashed, s.Step());
  }
  store->writer_ = std::thread([s = store.get()] {
    NameThread("keel-writer");
    s->WriterLoop();
  });
  if (unhashed) {
    KEEL_RETURN_IF_ERROR(
        store->WriteSync([tx = store->writer_tx_.get()](Tx&) { return tx->BackfillChains(); }));
  }
  return std::unique_ptr<Store>(std::move(store));
}

SqliteStore::~SqliteStore() { Close(); }

Result<int64_t> SqliteStore::SchemaVersion(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) return 0;
  // A FIFO would block the open, a directory or a device is no store.
  if (status.type() != std::filesystem::file_type::regular) {
    return InvalidArgument(path + " is not a regular file" +
                           (ec ? " (" + ec.message() + ")" : std::string()));
  }
  if (std::filesystem::file_size(path, ec) == 0 && !ec) return 0;  // created, never written
  KEEL_ASSIGN_OR_RETURN(auto db, Db::Open(path, /*read_only=*/true, /*sync_full=*/true));
  auto table = db->Prepare("SELECT count(*), coalesce(sum(name='schema_migrations'),0) FROM "
                           "sqlite_master WHERE type='table'");
  Result<bool> read = table.ok() ? table->Step() : Result<bool>(table.status());
  if (!read.ok()) return Status(read.status().code(), path + ": " + read.status().message());
  if (table->Int(1) == 0) {
    if (table->Int(0) == 0) return 0;
    return InvalidArgument(path + " is a SQLite database of another program (it has tables "
                           "and no schema_migrations): not a keel store");
  }
  KEEL_ASSIGN_OR_RETURN(auto s, db->Prepare("SELECT coalesce(max(version),0) FROM "
                                            "schema_migrations"));
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
}

Status SqliteStore::Migrate(Db& db) {
  KEEL_RETURN_IF_ERROR(db.Exec(
      "CREATE TABLE IF NOT EXISTS schema_migrations(version INTEGER PRIMARY KEY, "
      "applied_at INTEGER NOT NULL)"));
  int64_t current = 0;
  {
    // Reset (at the end of its scope) before the migrations run: SQLite refuses DROP TABLE
    // while a statement of the connection is still stepping.
    KEEL_ASSIGN_OR_RETURN(auto s,
                          db.Prepare("SELECT coalesce(max(version),0) FROM schema_migrations"));
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    current = row ? s.Int(0) : 0;
  }
  const auto& migrations = Migrations();
  if (current > static_cast<int64_t>(migrations.size())) {
    return Unavailable("database schema version " + std::to_string(current) +
                       " is newer than this keel (" + std::to_string(migrations.size()) +
                       "); upgrade keel");
  }
  for (size_t v = current + 1; v <= migrations.size(); ++v) {
    KEEL_RETURN_IF_ERROR(db.Run("BEGIN IMMEDIATE"));
    Status st = db.Exec(migrations[v - 1]);
    if (st.ok()) {
      KEEL_ASSIGN_OR_RETURN(auto ins, db.Prepare("INSERT INTO schema_migrations VALUES(?,?)"));
      st = ins.BindAll(static_cast<int64_t>(v), NowMillis()).Run();
    }
    if (!st.ok()) {
      (void)db.Run("ROLLBACK");
      return Status(st.code(), "migration " + std::to_string(v) + " failed: " + st.message());
    }
    KEEL_RETURN_IF_ERROR(db.Run("COMMIT"));
  }
  return Status::Ok();
}

Status SqliteStore::Read(const std::function<Status(Tx&)>& fn) { return ReadOn(true, fn); }

void SqliteStore::ReadAsync(std::function<Status(Tx&)> fn, std::function<void(Status)> done) {
  done(ReadOn(false, fn));
}

Status SqliteStore::ReadOn(bool mapped, const std::function<Status(Tx&)>& fn) {
  std::unique_ptr<Reader> reader;
  auto& idle = idle_readers_[mapped ? 1 : 0];
  {
    std::lock_guard<std::mutex> lock(readers_mu_);
    if (!idle.empty()) {
      reader = std::move(idle.back());
      idle.pop_back();
    }
  }
  if (!reader) {
    reader = std::make_unique<Reader>();
    KEEL_ASSIGN_OR_RETURN(reader->db, Db::Open(path_, /*read_only=*/true, options_.sync_full));
    KEEL_RETURN_IF_ERROR(reader->db->Exec("PRAGMA query_only=ON"));
    // Up to 2 GiB (SQLite's default ceiling): a memory search at a million memories walks far
    // more of the file than the page cache holds.
    if (mapped) KEEL_RETURN_IF_ERROR(reader->db->Exec("PRAGMA mmap_size=2147418112"));
    reader->tx = std::make_unique<SqliteTx>(*reader->db, options_.origin, audit_key_);
  }
  Status st = reader->db->Run("BEGIN");
  if (st.ok()) {
    try {
      st = fn(*reader->tx);
    } catch (const std::exception& e) {
      st = Internal(std::string("read failed: ") + e.what());
    }
    (void)reader->db->Run("COMMIT");
  }
  std::lock_guard<std::mutex> lock(readers_mu_);
  idle.push_back(std::move(reader));
  return st;
}

void SqliteStore::SetRemoteCommitListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(lost_mu_);
  lost_listener_ = std::move(listener);
}

void SqliteStore::Close() {
  queue_.Close();
  if (writer_.joinable() && std::this_thread::get_id() != writer_.get_id()) writer_.join();
}

void SqliteStore::WriterLoop() {
  std::vector<Unit> batch;
  while (queue_.Take(static_cast<size_t>(std::max(options_.max_batch, 1)), batch)) {
    CommitBatch(batch);
    batch.clear();
  }
  writer_tx_.reset();
  writer_db_.reset();
}

void SqliteStore::CommitBatch(std::vector<Unit>& batch) {
  // Each transaction but the last ends at a unit that failed without a savepoint: it fails
  // alone and the others run again, so the loop ends after at most batch.size() of them.
  while (!batch.empty()) {
    std::optional<size_t> failed = CommitOnce(batch);
    if (!failed) return;
    std::vector<Unit> alone;
    alone.push_back(std::move(batch[*failed]));
    batch.erase(batch.begin() + static_cast<long>(*failed));
    std::vector<Status> results{std::move(failed_status_)};
    std::vector<std::vector<Event>> no_events(1);
    queue_.Finish(alone, results, no_events, Status::Ok(), 0, listener_);
  }
}

std::optional<size_t> SqliteStore::CommitOnce(std::vector<Unit>& batch) {
  Db& db = *writer_db_;
  std::vector<Status> results(batch.size());
  std::vector<std::vector<Event>> events(batch.size());
  Status begin = db.Run("BEGIN IMMEDIATE");
  if (!begin.ok()) {
    for (auto& r : results) r = begin;
    queue_.Finish(batch, results, events, Status::Ok(), 0, listener_);
    return std::nullopt;
  }
  int committed_units = 0;
  Status aborted;  // SQLite rolled the transaction back under a savepoint: nothing commits
  // Runs batch[from...] in the transaction. A savepoint lets a failing unit be undone alone,
  // but SQLite copies every page a unit changes into the savepoint's journal first (a tenth of
  // the writer's time a turn). Units rarely fail, so a transaction takes none: when one fails,
  // the transaction is rolled back, that unit fails alone and the others run again
  // (docs/decisions/0014: a unit may run twice), and the next transactions take savepoints. A
  // unit alone in its batch needs none either: its failure rolls the transaction back.
  auto apply = [&](size_t from, bool savepoints) -> std::optional<size_t> {
    for (size_t i = from; i < batch.size(); ++i) {
      writer_tx_->ResetUnit();
      writer_tx_->ClearCarried();
      Status st = savepoints ? db.Run("SAVEPOINT unit") : Status::Ok();
      if (st.ok()) {
        try {
          st = batch[i].fn(*writer_tx_);
          if (st.ok()) st = writer_tx_->CarriedAll();
        } catch (const std::exception& e) {
          st = Internal(std::string("write failed: ") + e.what());
        }
        if (!st.ok() && !savepoints && batch.size() > 1) {
          writer_tx_->ResetUnit();
          (void)db.Run("ROLLBACK");
          writer_tx_->TransactionDone(false);
          savepoint_transactions_ = kSavepointTransactionsAfterFailure;
          failed_status_ = std::move(st);
          return i;
        }
        if (!savepoints || sqlite3_get_autocommit(db.raw())) {
          // Nothing to release (a failure is rolled back below instead of committed), or
          // nothing left to: see below.
        } else if (st.ok()) {
          if (Status released = db.Run("RELEASE unit"); !released.ok()) {
            // The unit's writes would stay in a transaction that reports it failed.
            aborted =
                Unavailable("a unit's savepoint could not be released: " + released.message());
          }
        } else {
          (void)db.Run("ROLLBACK TO unit");
          (void)db.Run("RELEASE unit");
        }
      }
      results[i] = st;
      if (aborted.ok() && sqlite3_get_autocommit(db.raw())) {
        // SQLite rolled the whole transaction back itself (a full disk, an I/O error): the
        // units before this one are gone too, and none after it may start a transaction of
        // its own through its savepoint.
        aborted = Unavailable("the store's transaction was rolled back" +
                              (st.ok() ? std::string() : ": " + st.message()));
      }
      if (!aborted.ok()) {
        if (results[i].ok()) results[i] = aborted;
        for (size_t j = i + 1; j < batch.size(); ++j) results[j] = aborted;
        return std::nullopt;
      }
      if (st.ok()) {
        events[i] = writer_tx_->TakeAppended();
        ++committed_units;
      }
    }
    return std::nullopt;
  };
  const bool savepoints = batch.size() > 1 && savepoint_transactions_ > 0;
  if (savepoint_transactions_ > 0) --savepoint_transactions_;
  if (auto failed = apply(0, savepoints)) return failed;

  // Deferred units alone (Store::WriteDeferred): told now, and the transaction is held open a
  // moment for the units that follow them (a turn's ending after its intake), so that both
  // commit with one sync. Once a unit was told, the transaction is never rolled back whole: the
  // units after it take savepoints.
  const size_t max = static_cast<size_t>(std::max(options_.max_batch, 1));
  const auto deadline = std::chrono::steady_clock::now() + kDeferredHold;
  size_t told = 0;
  while (aborted.ok() && committed_units > 0 && batch.size() < max &&
         std::all_of(batch.begin(), batch.end(), [](const Unit& u) { return u.deferred; })) {
    for (; told < batch.size(); ++told) {
      if (WriteDone done = std::exchange(batch[told].done, nullptr)) done(results[told], {});
    }
    if (!queue_.TakeUntil(max, batch, deadline)) break;
    results.resize(batch.size());
    events.resize(batch.size());
    (void)apply(told, /*savepoints=*/true);  // undoes a failing unit alone
  }

  // The usage totals and the chain heads the units moved, once per transaction.
  Status commit = aborted;
  if (commit.ok() && committed_units > 0) commit = writer_tx_->WriteTotals();
  if (committed_units > 0 && commit.ok()) commit = writer_tx_->WriteChainHeads();
  if (commit.ok()) commit = committed_units > 0 ? db.Run("COMMIT") : db.Run("ROLLBACK");
  if (!commit.ok()) (void)db.Run("ROLLBACK");
  writer_tx_->TransactionDone(commit.ok() && committed_units > 0);
  queue_.Finish(batch, results, events, commit, committed_units, listener_);
  if (!commit.ok() && told > 0) {
    LogError("store: a commit failed after " + std::to_string(told) +
             " deferred units were told they were written; they are lost: " + commit.message());
    std::function<void()> lost;
    {
      std::lock_guard<std::mutex> lock(lost_mu_);
      lost = lost_listener_;
    }
    if (lost) lost();
  }
  return std::nullopt;
}

}  // namespace keel::store::sqlite

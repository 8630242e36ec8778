#pragma once
// SqliteStore: the embedded store. One database file in WAL mode; one writer thread owns the
// only write connection and commits queued units of work (urgent ones first: WriteUrgent) in
// batches (group commit: one fsync for many units; a unit that fails is undone alone, the others
// commit); readers
// use their own connections from a small pool and never block the writer.
//
// Thread safety: Read and Write may be called from any thread.

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "keel/store/store.h"
#include "keel/store/write_queue.h"

namespace keel::store::sqlite {

class Db;
class SqliteTx;

class SqliteStore final : public QueuedStore {
 public:
  // `audit_key` signs the audit chain heads (store/audit.h); "" leaves them unsigned.
  static Result<std::unique_ptr<Store>> Open(const std::string& path, const StoreOptions& options,
                                             const std::string& audit_key = "");
  ~SqliteStore() override;
  // The migrations the database at `path` has applied; 0 when it does not exist yet.
  static Result<int64_t> SchemaVersion(const std::string& path);

  Status Read(const std::function<Status(Tx&)>& fn) override;
  // The same snapshot, on a connection that does not map the file (see Reader::mapped).
  void ReadAsync(std::function<Status(Tx&)> fn, std::function<void(Status)> done) override;
  std::string origin() const override { return options_.origin; }
  void Close() override;
  // Called when a commit failed after deferred units of it were told (Store::WriteDeferred):
  // whoever waits on them re-reads and finds them gone.
  void SetRemoteCommitListener(std::function<void()> listener) override;

 private:
  using Unit = PendingUnit;
  struct Reader {
    std::unique_ptr<Db> db;
    std::unique_ptr<SqliteTx> tx;
  };
  // Each snapshot that follows a commit drops the connection's pages, and a mapped file is
  // unmapped whole and faulted back: cheap for a blocking read that walks much of the file (a
  // memory search on the tool pool, 20-25 % faster mapped at a million memories), dearer than
  // copying the few pages an event loop's point reads touch (a turn's reads, through
  // ReadAsync). So the two kinds of read keep separate connections.
  Status ReadOn(bool mapped, const std::function<Status(Tx&)>& fn);

  SqliteStore(std::string path, StoreOptions options, std::string audit_key);
  Status Migrate(Db& db);
  void WriterLoop();
  void CommitBatch(std::vector<Unit>& batch);
  // One transaction over `batch`; every unit is told, or none when a unit failed where it could
  // not be undone alone: the transaction is rolled back, and that unit's index is returned
  // (its failure in failed_status_).
  std::optional<size_t> CommitOnce(std::vector<Unit>& batch);

  const std::string path_;
  const StoreOptions options_;
  const std::string audit_key_;  // signs the audit chain heads; "" unsigned

  std::unique_ptr<Db> writer_db_;       // owned by the writer thread once started
  std::unique_ptr<SqliteTx> writer_tx_;
  // Transactions left that give each unit a savepoint, after a unit failed without one.
  int savepoint_transactions_ = 0;
  Status failed_status_;  // CommitOnce's failed unit's

  std::mutex lost_mu_;
  std::function<void()> lost_listener_;  // GUARDED_BY(lost_mu_): SetRemoteCommitListener's

  std::mutex readers_mu_;
  std::vector<std::unique_ptr<Reader>> idle_readers_[2];  // GUARDED_BY(readers_mu_), [mapped]

  std::thread writer_;
};

}  // namespace keel::store::sqlite

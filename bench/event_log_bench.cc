// Event append rate: Keel's store (single writer, group commit) against raw SQLite doing the
// same inserts, in the same durability mode (WAL, synchronous=FULL), on a fresh database file
// in a temp dir, with the same number of producer threads.
//
//   BM_KeelAppend/events_per_unit/threads:N
//     N producer threads; each calls store->Write(unit appending `events_per_unit` events via
//     tx.events().Append) and waits until its unit is durable, then submits the next.
//   BM_RawSqliteAppend/rows_per_txn/threads:N
//     N threads, each with its own connection; each runs BEGIN IMMEDIATE; `rows_per_txn`
//     INSERTs (the very statement Keel's EventLog::Append runs, so the tenant's position and
//     origin_seq are computed the same way); COMMIT. A process-wide mutex serializes the write transactions, which is the
//     best an application can do with SQLite's single writer (SQLite's own busy handler would
//     sleep for milliseconds). Each producer's rows are durable when its COMMIT returns: the
//     same guarantee as Keel's done callback.
//
// Counter `events_per_s` is the rate over wall-clock time, summed over threads; Keel runs also
// report `units_per_commit` (group commit at work). Keel and raw runs of one configuration are
// registered next to each other; `scripts/bench.sh` runs several rounds and prints the median
// of the per-round keel/raw ratios.

#include <benchmark/benchmark.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "keel/common/ids.h"
#include "keel/common/json_util.h"
#include "keel/common/time.h"
#include "keel/store/sqlite/sqlite_tx.h"
#include "keel/store/store.h"

namespace {

namespace fs = std::filesystem;

// Keel's `events` table and its indexes, verbatim from the migration that numbers events per
// tenant (src/keel/store/sqlite/sqlite_tx.cc, which then renames it `events`).
// SchemaMatchesKeel() fails the raw benchmark when the two drift apart.
constexpr const char* kEventsTable = R"sql(CREATE TABLE events_by_tenant(
  position INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, tenant_id TEXT NOT NULL,
  tenant_position INTEGER NOT NULL, type TEXT NOT NULL, origin TEXT NOT NULL,
  origin_seq INTEGER NOT NULL, agent_id TEXT NOT NULL, session_id TEXT NOT NULL,
  run_id TEXT NOT NULL, payload TEXT NOT NULL, occurred_at INTEGER NOT NULL,
  UNIQUE(tenant_id, tenant_position), UNIQUE(tenant_id, origin, origin_seq));)sql";
constexpr const char* kRenameEvents = "ALTER TABLE events_by_tenant RENAME TO events";

// The statement of SqliteTx::Append.
constexpr const char* kInsertEvent =
    "INSERT INTO events(id, tenant_id, tenant_position, type, origin, origin_seq, agent_id, "
    "session_id, run_id, payload, occurred_at) VALUES(?1,?2,"
    "(SELECT coalesce(max(tenant_position),0)+1 FROM events WHERE tenant_id=?2),?3,?4,"
    "(SELECT coalesce(max(origin_seq),0)+1 FROM events WHERE tenant_id=?2 AND origin=?4),"
    "?5,?6,?7,?8,?9) RETURNING tenant_position, origin_seq";

bool SchemaMatchesKeel() {
  for (const char* m : keel::store::sqlite::Migrations()) {
    if (std::string(m).find(kEventsTable) != std::string::npos) return true;
  }
  return false;
}

// The row every producer appends (same values for Keel and raw; ids are fresh UUIDv7s).
const std::string kTenant = "0190a000-0000-7000-8000-000000000001";
const std::string kAgent = "0190a000-0000-7000-8000-000000000002";
const std::string kSession = "0190a000-0000-7000-8000-000000000003";
const std::string kRun = "0190a000-0000-7000-8000-000000000004";
const std::string kType = "message.created@v1";
keel::Json Payload() {
  return {{"message_id", "0190a000-0000-7000-8000-000000000005"}, {"role", "user"}};
}

// A fresh directory under $TMPDIR (default /tmp), removed by the destructor.
struct TempDir {
  fs::path path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/keel-bench-XXXXXX";
    if (!::mkdtemp(tmpl.data())) std::abort();
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void SetCounters(benchmark::State& state, int64_t events_per_iteration) {
  state.counters["events_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * events_per_iteration), benchmark::Counter::kIsRate);
  state.counters["events_per_iter"] =
      benchmark::Counter(static_cast<double>(events_per_iteration), benchmark::Counter::kAvgThreads);
}

// ---- Keel

struct KeelShared {
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<keel::store::Store> store;
};
KeelShared* g_keel = nullptr;  // set up by thread 0 before the loop's start barrier

void BM_KeelAppend(benchmark::State& state) {
  const int per_unit = static_cast<int>(state.range(0));
  if (state.thread_index() == 0) {
    g_keel = new KeelShared;
    g_keel->dir = std::make_unique<TempDir>();
    keel::store::StoreOptions options;
    options.origin = keel::NewId();
    options.sync_full = true;
    auto opened = keel::store::OpenStore("sqlite://" + (g_keel->dir->path / "keel.db").string(),
                                         options);
    if (!opened.ok()) {
      state.SkipWithError(opened.status().message().c_str());
    } else {
      g_keel->store = std::move(opened).value();
    }
  }
  const keel::Json payload = Payload();
  for (auto _ : state) {
    if (!g_keel->store) break;
    keel::Status st = g_keel->store->WriteSync([&](keel::store::Tx& tx) -> keel::Status {
      for (int i = 0; i < per_unit; ++i) {
        KEEL_RETURN_IF_ERROR(
            tx.events().Append({kTenant, kType, kAgent, kSession, kRun, payload}));
      }
      return keel::Status::Ok();
    });
    if (!st.ok()) {
      state.SkipWithError(st.message().c_str());
      break;
    }
  }
  SetCounters(state, per_unit);
  if (state.thread_index() == 0) {
    if (g_keel->store) {
      auto stats = g_keel->store->stats();
      g_keel->store->Close();
      if (stats.commits > 0) {
        state.counters["units_per_commit"] =
            static_cast<double>(stats.units) / static_cast<double>(stats.commits);
      }
    }
    delete g_keel;
    g_keel = nullptr;
  }
}

// ---- raw SQLite

struct RawShared {
  std::unique_ptr<TempDir> dir;
  std::string path;
  std::mutex write_mu;  // serializes write transactions across the threads' connections
  std::string origin;
  bool ok = true;
};
RawShared* g_raw = nullptr;

bool Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::fprintf(stderr, "sqlite: %s: %s\n", sql, err ? err : "?");
    sqlite3_free(err);
    return false;
  }
  return true;
}

// Opens a connection with Keel's pragmas (src/keel/store/sqlite/sqlite_db.cc, sync_full).
sqlite3* OpenRaw(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                      nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return nullptr;
  }
  sqlite3_busy_timeout(db, 5000);
  if (!Exec(db, "PRAGMA journal_mode=WAL") || !Exec(db, "PRAGMA synchronous=FULL") ||
      !Exec(db, "PRAGMA foreign_keys=ON") || !Exec(db, "PRAGMA cache_size=-16000")) {
    sqlite3_close(db);
    return nullptr;
  }
  return db;
}

void BM_RawSqliteAppend(benchmark::State& state) {
  const int per_txn = static_cast<int>(state.range(0));
  if (state.thread_index() == 0) {
    g_raw = new RawShared;
    g_raw->dir = std::make_unique<TempDir>();
    g_raw->path = (g_raw->dir->path / "raw.db").string();
    g_raw->origin = keel::NewId();
    sqlite3* db = OpenRaw(g_raw->path);
    if (!SchemaMatchesKeel()) {
      g_raw->ok = false;
      state.SkipWithError("bench/event_log_bench.cc: events DDL differs from Keel's migrations");
    } else if (!db || !Exec(db, kEventsTable) || !Exec(db, kRenameEvents)) {
      g_raw->ok = false;
      state.SkipWithError("cannot create the raw events table");
    }
    sqlite3_close(db);
  }
  // Each thread opens its connection on its first iteration (after the start barrier, so the
  // table exists); the one-time cost is negligible against the iterations that follow.
  sqlite3* db = nullptr;
  sqlite3_stmt* insert = nullptr;
  const std::string payload = keel::DumpJson(Payload());
  for (auto _ : state) {
    if (!g_raw->ok) break;
    if (!db) {
      db = OpenRaw(g_raw->path);
      if (!db || sqlite3_prepare_v3(db, kInsertEvent, -1, SQLITE_PREPARE_PERSISTENT, &insert,
                                    nullptr) != SQLITE_OK) {
        state.SkipWithError("cannot open the raw database");
        break;
      }
    }
    std::lock_guard<std::mutex> lock(g_raw->write_mu);
    bool ok = Exec(db, "BEGIN IMMEDIATE");
    for (int i = 0; ok && i < per_txn; ++i) {
      const std::string id = keel::NewId();
      sqlite3_bind_text(insert, 1, id.data(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(insert, 2, kTenant.data(), static_cast<int>(kTenant.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(insert, 3, kType.data(), static_cast<int>(kType.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(insert, 4, g_raw->origin.data(), static_cast<int>(g_raw->origin.size()),
                        SQLITE_TRANSIENT);
      sqlite3_bind_text(insert, 5, kAgent.data(), static_cast<int>(kAgent.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(insert, 6, kSession.data(), static_cast<int>(kSession.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(insert, 7, kRun.data(), static_cast<int>(kRun.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(insert, 8, payload.data(), static_cast<int>(payload.size()), SQLITE_TRANSIENT);
      sqlite3_bind_int64(insert, 9, keel::NowMillis());
      int rc = sqlite3_step(insert);
      if (rc == SQLITE_ROW) {
        benchmark::DoNotOptimize(sqlite3_column_int64(insert, 0));
        benchmark::DoNotOptimize(sqlite3_column_int64(insert, 1));
        rc = sqlite3_step(insert);
      }
      sqlite3_reset(insert);
      ok = rc == SQLITE_DONE;
    }
    ok = ok && Exec(db, "COMMIT");
    if (!ok) {
      (void)Exec(db, "ROLLBACK");
      state.SkipWithError("raw insert failed");
      break;
    }
  }
  if (insert) sqlite3_finalize(insert);
  if (db) sqlite3_close(db);
  SetCounters(state, per_txn);
  if (state.thread_index() == 0) {
    delete g_raw;
    g_raw = nullptr;
  }
}

// Arg: events per unit (Keel) / rows per transaction (raw). Threads: concurrent producers.
void Producers(benchmark::internal::Benchmark* b) {
  b->UseRealTime()->MeasureProcessCPUTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

// Keel and raw alternate, configuration by configuration, so that both sides of each ratio run
// back to back (the disk's fsync latency drifts on shared machines).
[[maybe_unused]] static const bool kRegistered = [] {
  const std::pair<int, int> configs[] = {{1, 1}, {1, 8}, {1, 64}, {100, 1}, {100, 8}};
  for (auto [per, threads] : configs) {
    benchmark::RegisterBenchmark("BM_KeelAppend", BM_KeelAppend)
        ->Arg(per)->Threads(threads)->Apply(Producers);
    benchmark::RegisterBenchmark("BM_RawSqliteAppend", BM_RawSqliteAppend)
        ->Arg(per)->Threads(threads)->Apply(Producers);
  }
  return true;
}();

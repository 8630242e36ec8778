// Event append rate on PostgreSQL: Keel's PostgresStore (one writer connection, units batched
// into transactions under the tenant write locks) against raw libpq doing the same inserts of
// the same rows with the same batching, on databases with Keel's schema. Both run with the
// server's default durability (synchronous_commit=on).
//
//   BM_KeelPgAppend/events_per_unit/threads:N
//     N producer threads; each calls store->Write(unit appending `events_per_unit` events via
//     tx.events().Append) and waits until its unit is durable, then submits the next.
//   BM_RawPgAppend/rows_per_txn/threads:N
//     N threads, each with its own connection; each runs "BEGIN; set the tenant", `rows_per_txn`
//     times the very INSERT that PostgresTx::Append runs (prepared), then COMMIT. The
//     transactions of the threads run concurrently (PostgreSQL's own group commit applies); they
//     serialize only on the tenant's write lock, which Keel's take too (its numbers need it).
//
// KEEL_BENCH_PG_URL names the database for the Keel runs and KEEL_BENCH_PG_RAW_URL the one for
// the raw runs (both as the store's role; scripts/bench-pg.sh creates them). Without them the
// benchmarks skip. The raw database gets Keel's schema by opening a store on it once.

#include <benchmark/benchmark.h>
#include <libpq-fe.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "keel/common/ids.h"
#include "keel/common/json_util.h"
#include "keel/common/time.h"
#include "keel/store/store.h"

namespace {

// The statement of PostgresTx::Append (src/keel/store/postgres/postgres_tx.cc).
constexpr const char* kInsertEvent =
    "INSERT INTO events(id, tenant_id, tenant_position, type, origin, origin_seq, agent_id, "
    "session_id, run_id, payload, occurred_at) VALUES($1,$2,"
    "(SELECT coalesce(max(tenant_position),0)+1 FROM events WHERE tenant_id=$2),$3,$4,"
    "(SELECT coalesce(max(origin_seq),0)+1 FROM events WHERE tenant_id=$2 AND origin=$4),"
    "$5,$6,$7,$8,$9) RETURNING tenant_position, origin_seq";

const std::string kTenant = "0190a000-0000-7000-8000-000000000001";
const std::string kAgent = "0190a000-0000-7000-8000-000000000002";
const std::string kSession = "0190a000-0000-7000-8000-000000000003";
const std::string kRun = "0190a000-0000-7000-8000-000000000004";
const std::string kType = "message.created@v1";
keel::Json Payload() {
  return {{"message_id", "0190a000-0000-7000-8000-000000000005"}, {"role", "user"}};
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

void SetCounters(benchmark::State& state, int64_t events_per_iteration) {
  state.counters["events_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * events_per_iteration), benchmark::Counter::kIsRate);
}

// ---- Keel

std::unique_ptr<keel::store::Store> g_store;  // opened by thread 0 before the start barrier
std::string g_skip;

void BM_KeelPgAppend(benchmark::State& state) {
  const int per_unit = static_cast<int>(state.range(0));
  if (state.thread_index() == 0) {
    g_skip.clear();
    const char* url = Env("KEEL_BENCH_PG_URL");
    if (!url) {
      g_skip = "set KEEL_BENCH_PG_URL (scripts/bench-pg.sh does)";
    } else {
      keel::store::StoreOptions options;
      options.origin = keel::NewId();
      options.sync_full = true;
      auto opened = keel::store::OpenStore(url, options);
      if (opened.ok()) {
        g_store = std::move(opened).value();
      } else {
        g_skip = opened.status().message();
      }
    }
  }
  const keel::Json payload = Payload();
  for (auto _ : state) {
    if (!g_store) {
      state.SkipWithError(g_skip.c_str());
      break;
    }
    keel::Status st = g_store->WriteSync([&](keel::store::Tx& tx) -> keel::Status {
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
  if (state.thread_index() == 0 && g_store) {
    auto stats = g_store->stats();
    g_store->Close();
    g_store.reset();
    if (stats.commits > 0) {
      state.counters["units_per_commit"] =
          static_cast<double>(stats.units) / static_cast<double>(stats.commits);
    }
  }
}

// ---- raw libpq

std::string g_raw_origin;
bool g_raw_ok = false;

bool Ok(PGresult* r) {
  ExecStatusType s = PQresultStatus(r);
  bool ok = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
  if (!ok) std::fprintf(stderr, "raw libpq: %s", PQresultErrorMessage(r));
  PQclear(r);
  return ok;
}

void BM_RawPgAppend(benchmark::State& state) {
  const int per_txn = static_cast<int>(state.range(0));
  const char* url = Env("KEEL_BENCH_PG_RAW_URL");
  if (state.thread_index() == 0) {
    g_raw_ok = false;
    g_raw_origin = keel::NewId();
    if (url) {
      // Keel's schema, by opening (and closing) a store on the raw database.
      keel::store::StoreOptions options;
      options.origin = g_raw_origin;
      auto opened = keel::store::OpenStore(url, options);
      g_raw_ok = opened.ok();
      if (!g_raw_ok) std::fprintf(stderr, "raw: %s\n", opened.status().message().c_str());
    }
  }
  PGconn* c = nullptr;
  const std::string payload = keel::DumpJson(Payload());
  const std::string begin = "BEGIN; SELECT pg_advisory_xact_lock(7021802, hashtext('" + kTenant +
                            "')); "
                            "SELECT set_config('app.tenant_id', '" +
                            kTenant + "', true)";
  for (auto _ : state) {
    if (!g_raw_ok) {
      state.SkipWithError("set KEEL_BENCH_PG_RAW_URL (scripts/bench-pg.sh does)");
      break;
    }
    if (!c) {  // after the start barrier: the schema exists
      c = PQconnectdb(url);
      if (PQstatus(c) != CONNECTION_OK || !Ok(PQprepare(c, "ins", kInsertEvent, 0, nullptr))) {
        state.SkipWithError("cannot connect to the raw database");
        break;
      }
    }
    bool ok = Ok(PQexec(c, begin.c_str()));
    for (int i = 0; ok && i < per_txn; ++i) {
      const std::string id = keel::NewId();
      const std::string at = std::to_string(keel::NowMillis());
      const char* values[] = {id.c_str(),      kTenant.c_str(),  kType.c_str(),
                              g_raw_origin.c_str(), kAgent.c_str(), kSession.c_str(),
                              kRun.c_str(),    payload.c_str(),  at.c_str()};
      PGresult* r = PQexecPrepared(c, "ins", 9, values, nullptr, nullptr, 0);
      if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        benchmark::DoNotOptimize(std::strtoll(PQgetvalue(r, 0, 0), nullptr, 10));
      }
      ok = Ok(r);
    }
    ok = ok && Ok(PQexec(c, "COMMIT"));
    if (!ok) {
      PQclear(PQexec(c, "ROLLBACK"));
      state.SkipWithError("raw insert failed");
      break;
    }
  }
  if (c) PQfinish(c);
  SetCounters(state, per_txn);
}

void Producers(benchmark::internal::Benchmark* b) {
  b->UseRealTime()->MeasureProcessCPUTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

// Keel and raw alternate, configuration by configuration, so both sides of a ratio run back to
// back.
[[maybe_unused]] static const bool kRegisteredPg = [] {
  const std::pair<int, int> configs[] = {{1, 1}, {1, 8}, {1, 32}, {100, 1}, {100, 8}};
  for (auto [per, threads] : configs) {
    benchmark::RegisterBenchmark("BM_KeelPgAppend", BM_KeelPgAppend)
        ->Arg(per)->Threads(threads)->Apply(Producers);
    benchmark::RegisterBenchmark("BM_RawPgAppend", BM_RawPgAppend)
        ->Arg(per)->Threads(threads)->Apply(Producers);
  }
  return true;
}();

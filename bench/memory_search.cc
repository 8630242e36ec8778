// memory.search at scale: loads one agent with many memories (synthetic text from a fixed
// vocabulary with a Zipf-like word distribution) into a store, then times top-10 searches of 1 to
// 3 words mixing common and rare words, as the memory.search tool runs them (parse, one read
// snapshot, SearchMemories).
//
//   keel_memory_search --store sqlite:///tmp/m/keel.db [--memories 1000000] [--queries 2000]
//   keel_memory_search --store postgres://keel@127.0.0.1:5432/bench ...
//
// Loading uses the store's own upserts in units of --batch memories (one transaction each).
// On PostgreSQL the table is then vacuumed and analyzed (what autovacuum would do by itself after
// such a load), so that the planner knows the words' frequencies: as --owner-url, the role that
// owns it (the runtime role may not; default --store). --skip-load searches a
// store loaded before with the same --memories and --seed; --optimize (SQLite) first merges the
// full-text index into one segment, to compare with the index as the writes left it.
//
// The last line is machine-readable (wall-clock latencies, and the searching thread's CPU time,
// which on SQLite is all of a search's work and does not count waiting for a busy CPU):
//   RESULT backend=B memories=N load_s=S p50_ms=X p90_ms=X p99_ms=X max_ms=X mean_ms=X
//          cpu_p50_ms=X cpu_p99_ms=X

#include <libpq-fe.h>
#include <sqlite3.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "keel/memory/memory.h"
#include "keel/store/sqlite/sqlite_memory.h"
#include "keel/store/store.h"

namespace {

using Clock = std::chrono::steady_clock;

const std::string kTenant = "0190c000-0000-7000-8000-000000000001";
const std::string kAgent = "0190c000-0000-7000-8000-000000000002";

struct Options {
  std::string store;
  std::string owner_url;  // PostgreSQL: who may VACUUM ANALYZE memories (default: store)
  int64_t memories = 1'000'000;
  int queries = 2000;
  int vocabulary = 20000;
  int batch = 5000;
  uint32_t seed = 7;
  bool skip_load = false;
  bool optimize = false;
};

// Pronounceable words from syllables, all distinct; word i has Zipf weight 1/(i+1).
class Vocabulary {
 public:
  Vocabulary(int size, uint32_t seed) {
    static const char* kSyllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze",
                                       "pa", "do", "gu", "fe", "hi", "ja", "qu", "wy", "xe",
                                       "bo", "cy", "an", "el", "is", "or", "um"};
    std::mt19937 rng(seed);
    std::unordered_set<std::string> seen;
    for (int attempt = 0; static_cast<int>(words_.size()) < size; ++attempt) {
      std::string w;
      const int n = 2 + attempt % 4;  // 2 to 5 syllables
      for (int k = 0; k < n; ++k) w += kSyllables[rng() % 25];
      if (!seen.insert(w).second) continue;
      words_.push_back(std::move(w));
    }
    double total = 0;
    for (int i = 0; i < size; ++i) {
      total += 1.0 / (i + 1);
      cumulative_.push_back(total);
    }
  }
  // A word drawn by its weight among the `top` most frequent (all by default).
  const std::string& Draw(std::mt19937& rng, int top = 0) const {
    const double limit = top > 0 ? cumulative_[top - 1] : cumulative_.back();
    const double x = std::uniform_real_distribution<double>(0, limit)(rng);
    auto at = std::lower_bound(cumulative_.begin(), cumulative_.end(), x) - cumulative_.begin();
    return words_[std::min<size_t>(at, words_.size() - 1)];
  }
  const std::string& At(int rank) const { return words_[rank]; }
  int size() const { return static_cast<int>(words_.size()); }

 private:
  std::vector<std::string> words_;
  std::vector<double> cumulative_;
};

std::string MemoryText(const Vocabulary& v, std::mt19937& rng) {
  const int words = std::uniform_int_distribution<int>(8, 40)(rng);
  std::string text;
  for (int i = 0; i < words; ++i) text += (i ? " " : "") + v.Draw(rng);
  return text + ".";
}

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--store") {
      o->store = value("--store");
    } else if (a == "--owner-url") {
      o->owner_url = value("--owner-url");
    } else if (a == "--memories") {
      o->memories = std::atoll(value("--memories"));
    } else if (a == "--queries") {
      o->queries = std::atoi(value("--queries"));
    } else if (a == "--vocabulary") {
      o->vocabulary = std::atoi(value("--vocabulary"));
    } else if (a == "--batch") {
      o->batch = std::atoi(value("--batch"));
    } else if (a == "--seed") {
      o->seed = static_cast<uint32_t>(std::atoi(value("--seed")));
    } else if (a == "--skip-load") {
      o->skip_load = true;
    } else if (a == "--optimize") {
      o->optimize = true;
    } else {
      return false;
    }
  }
  return !o->store.empty() && o->memories > 0 && o->queries > 0 && o->vocabulary >= 1000 &&
         o->batch > 0;
}

keel::Status Load(keel::store::Store& store, const Options& o, const Vocabulary& v) {
  KEEL_RETURN_IF_ERROR(store.WriteSync([&](keel::store::Tx& tx) -> keel::Status {
    KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant({kTenant, "bench", 1}));
    keel::store::Agent a;
    a.id = kAgent;
    a.tenant_id = kTenant;
    a.name = "memory-bench";
    a.model = "local";
    a.tools = keel::Json::array();
    a.config = keel::Json::object();
    a.status = "idle";
    a.created_at = a.updated_at = 1;
    return tx.agents().InsertAgent(a);
  }));
  std::mt19937 rng(o.seed);
  const std::vector<std::string> tags = {"ops", "people", "project", "todo", "home"};
  for (int64_t start = 0; start < o.memories; start += o.batch) {
    const int64_t end = std::min<int64_t>(o.memories, start + o.batch);
    std::vector<keel::store::Memory> unit;
    unit.reserve(end - start);
    for (int64_t i = start; i < end; ++i) {
      keel::store::Memory m;
      m.id = "m" + std::to_string(i);
      m.tenant_id = kTenant;
      m.agent_id = kAgent;
      m.text = MemoryText(v, rng);
      if (i % 7 == 0) m.tags = keel::Json::array({tags[i % tags.size()]});
      m.source = "bench";
      m.created_at = m.updated_at = 1'700'000'000'000 + i;
      unit.push_back(std::move(m));
    }
    KEEL_RETURN_IF_ERROR(store.WriteSync([&](keel::store::Tx& tx) -> keel::Status {
      for (const auto& m : unit) KEEL_RETURN_IF_ERROR(tx.memory().UpsertMemory(m));
      return keel::Status::Ok();
    }));
    if ((end / o.batch) % 20 == 0 || end == o.memories) {
      std::fprintf(stderr, "loaded %lld\n", static_cast<long long>(end));
    }
  }
  return keel::Status::Ok();
}

// SQLite: merges the full-text index's segments into one (FTS5 'optimize'), for comparison with
// the index as the writes left it.
keel::Status Optimize(const std::string& url) {
  const std::string path = url.substr(std::string("sqlite://").size());
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    sqlite3_close(db);
    return keel::Unavailable("cannot open " + path);
  }
  keel::Status st = keel::store::sqlite::RegisterMemoryFunctions(db);
  char* err = nullptr;
  if (st.ok() && sqlite3_exec(db, "INSERT INTO memories_fts(memories_fts) VALUES('optimize')",
                              nullptr, nullptr, &err) != SQLITE_OK) {
    st = keel::Internal(std::string("optimize: ") + (err ? err : "?"));
  }
  sqlite3_free(err);
  sqlite3_close(db);
  return st;
}

// What autovacuum would do after a bulk load: the GIN index's pending entries merged and the
// words' statistics gathered for the planner.
keel::Status VacuumAnalyze(const std::string& url) {
  PGconn* c = PQconnectdb(url.c_str());
  if (PQstatus(c) != CONNECTION_OK) {
    keel::Status st = keel::Unavailable(std::string("cannot connect: ") + PQerrorMessage(c));
    PQfinish(c);
    return st;
  }
  PGresult* r = PQexec(c, "VACUUM ANALYZE memories");
  keel::Status st = PQresultStatus(r) == PGRES_COMMAND_OK
                        ? keel::Status::Ok()
                        : keel::Internal(std::string("VACUUM ANALYZE: ") + PQerrorMessage(c));
  PQclear(r);
  PQfinish(c);
  return st;
}

// 1 to 3 words; each is common (among the 100 most frequent, by weight) or rare (any word
// beyond the first 1000, uniformly), as likely as not.
std::vector<std::string> Queries(const Options& o, const Vocabulary& v) {
  std::mt19937 rng(o.seed + 1);
  std::vector<std::string> out;
  for (int q = 0; q < o.queries; ++q) {
    const int words = 1 + static_cast<int>(rng() % 3);
    std::string text;
    for (int k = 0; k < words; ++k) {
      const std::string& w =
          rng() % 2 ? v.Draw(rng, 100) : v.At(1000 + static_cast<int>(rng() % (v.size() - 1000)));
      text += (k ? " " : "") + w;
    }
    out.push_back(std::move(text));
  }
  return out;
}

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double Percentile(std::vector<double> sorted, double p) {
  const size_t at = static_cast<size_t>(std::ceil(p * sorted.size())) - 1;
  return sorted[std::min(at, sorted.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: keel_memory_search --store URL [--memories N] [--queries N] "
                 "[--vocabulary N] [--batch N] [--seed N] [--skip-load] [--optimize]\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines show as they come, also into a file
  const bool postgres = o.store.rfind("postgres", 0) == 0;
  keel::store::StoreOptions options;
  options.origin = "memory-bench";
  auto opened = keel::store::OpenStore(o.store, options);
  if (!opened.ok()) {
    std::fprintf(stderr, "cannot open the store: %s\n", opened.status().message().c_str());
    return 1;
  }
  keel::store::Store& store = **opened;
  const Vocabulary vocabulary(o.vocabulary, o.seed);

  double load_s = 0;
  if (!o.skip_load) {
    const auto start = Clock::now();
    keel::Status st = Load(store, o, vocabulary);
    if (st.ok() && postgres) st = VacuumAnalyze(o.owner_url.empty() ? o.store : o.owner_url);
    load_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (!st.ok()) {
      std::fprintf(stderr, "load failed: %s\n", st.message().c_str());
      return 1;
    }
    std::printf("loaded %lld memories in %.1f s (%.0f per second)\n",
                static_cast<long long>(o.memories), load_s, o.memories / load_s);
  }

  if (o.optimize && !postgres) {
    const auto start = Clock::now();
    if (keel::Status st = Optimize(o.store); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      return 1;
    }
    std::printf("optimized the index in %.1f s\n",
                std::chrono::duration<double>(Clock::now() - start).count());
  }
  const std::vector<std::string> queries = Queries(o, vocabulary);
  auto search = [&](const std::string& q, size_t* hits) {
    return store.Read([&](keel::store::Tx& tx) -> keel::Status {
      KEEL_ASSIGN_OR_RETURN(auto found, keel::memory::Search(tx, kTenant, kAgent, q, "", 10));
      *hits = found.size();
      return keel::Status::Ok();
    });
  };
  size_t hits = 0;
  for (int i = 0; i < std::min(200, o.queries); ++i) (void)search(queries[i], &hits);  // warm up
  std::vector<double> ms;
  std::vector<double> cpu_ms;  // this thread's CPU time: all of a search's work on SQLite
  int full = 0;
  int none = 0;
  for (const auto& q : queries) {
    const auto start = Clock::now();
    const double cpu_start = ThreadCpuMs();
    keel::Status st = search(q, &hits);
    cpu_ms.push_back(ThreadCpuMs() - cpu_start);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (!st.ok()) {
      std::fprintf(stderr, "search '%s' failed: %s\n", q.c_str(), st.message().c_str());
      return 1;
    }
    full += hits == 10;
    none += hits == 0;
  }
  std::vector<size_t> order(ms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a] > ms[b]; });
  std::printf("slowest:");
  for (size_t i = 0; i < 5 && i < order.size(); ++i) {
    std::printf(" [%s] %.2f ms;", queries[order[i]].c_str(), ms[order[i]]);
  }
  std::printf("\n");
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double x : ms) mean += x / ms.size();
  std::printf("%d searches (top 10): %d with 10 results, %d with none\n", o.queries, full, none);
  std::sort(cpu_ms.begin(), cpu_ms.end());
  std::printf(
      "RESULT backend=%s memories=%lld load_s=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f "
      "max_ms=%.3f mean_ms=%.3f cpu_p50_ms=%.3f cpu_p99_ms=%.3f\n",
      postgres ? "postgres" : "sqlite", static_cast<long long>(o.memories), load_s,
      Percentile(sorted, 0.50), Percentile(sorted, 0.90), Percentile(sorted, 0.99), sorted.back(),
      mean, Percentile(cpu_ms, 0.50), Percentile(cpu_ms, 0.99));
  store.Close();
  return 0;
}

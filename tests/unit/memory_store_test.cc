// MemoryStore conformance: every case runs against SQLite and PostgreSQL
// (`Conformance/MemoryStoreTest.<Case>/sqlite` and `.../postgres`; the PostgreSQL cases skip
// without KEEL_TEST_PG_ADMIN_URL, see pg_test_database.h), and MemoryCrossBackendTest checks that
// both backends give the same top results for every query of the corpus.
//
// The corpus is built so that relevance is unambiguous whichever ranking function scores it
// (SQLite's keel_rank, BM25-style; PostgreSQL's ts_rank): within each query's best matches,
// either the memories have the same length and the better one holds the terms more often, or
// they hold them as often and the better one is shorter. Every other memory shares no word with
// any query.

#include "keel/store/memory_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "keel/common/ids.h"
#include "keel/memory/query.h"
#include "keel/store/archive.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

enum class Backend { kSqlite, kPostgres };

std::string BackendName(Backend b) { return b == Backend::kSqlite ? "sqlite" : "postgres"; }
void PrintTo(Backend b, std::ostream* os) { *os << BackendName(b); }

// The storage behind one store: a temporary SQLite file or a fresh PostgreSQL database.
class BackendDb {
 public:
  explicit BackendDb(Backend b) : backend_(b) {}
  ~BackendDb() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  Status Prepare() {
    if (backend_ == Backend::kPostgres) {
      KEEL_RETURN_IF_ERROR(pg_.Create());
      url_ = pg_.url();
    } else {
      dir_ = std::filesystem::temp_directory_path() / ("keel-memory-" + NewId());
      std::filesystem::create_directories(dir_);
      url_ = "sqlite://" + (dir_ / "keel.db").string();
    }
    return Status::Ok();
  }
  Result<std::unique_ptr<Store>> Open() const {
    StoreOptions o;
    o.origin = "node-a";
    return OpenStore(url_, o);
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  Backend backend_;
  std::filesystem::path dir_;
  PgTestDatabase pg_;
  std::string url_;
};

struct Backing {
  std::unique_ptr<BackendDb> db;
  std::unique_ptr<Store> store;
};

// Opens a store on a fresh database of `b`; `skip` is set (and nothing opened) when the
// backend is not available.
Status OpenFresh(Backend b, Backing* out, bool* skip) {
  *skip = b == Backend::kPostgres && !PgAdminUrl();
  if (*skip) return Status::Ok();
  out->db = std::make_unique<BackendDb>(b);
  KEEL_RETURN_IF_ERROR(out->db->Prepare());
  KEEL_ASSIGN_OR_RETURN(out->store, out->db->Open());
  return Status::Ok();
}

Status AddTenantAndAgents(Store& store, const std::string& tenant,
                          const std::vector<std::string>& agents) {
  return store.WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant({tenant, "t", 1}));
    for (const auto& id : agents) {
      Agent a;
      a.id = id;
      a.tenant_id = tenant;
      a.name = "agent " + id;
      a.model = "local";
      a.tools = Json::array();
      a.config = Json::object();
      a.status = "idle";
      a.created_at = a.updated_at = 1;
      KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
    }
    return Status::Ok();
  });
}

Memory MakeMemory(const std::string& tenant, const std::string& agent, const std::string& id,
                  const std::string& text, Millis at, Json tags = Json::array()) {
  Memory m;
  m.id = id;
  m.tenant_id = tenant;
  m.agent_id = agent;
  m.text = text;
  m.tags = std::move(tags);
  m.source = "api";
  m.created_at = m.updated_at = at;
  return m;
}

// ---------------------------------------------------------------- the corpus

const std::string kTenant = "0190b000-0000-7000-8000-000000000001";
const std::string kAgent = "0190b000-0000-7000-8000-00000000000a";
const std::string kOther = "0190b000-0000-7000-8000-00000000000b";

struct CorpusEntry {
  const char* id;
  const char* text;
  std::vector<std::string> tags;
};

const std::vector<CorpusEntry>& Corpus() {
  static const std::vector<CorpusEntry> kCorpus = {
      // kafka: the same length and more occurrences first, then longer.
      {"k1", "kafka kafka kafka broker", {}},
      {"k2", "kafka kafka consumer lag", {"ops"}},
      {"k3", "kafka topic retention was raised to seven days", {}},
      {"k4",
       "the kafka cluster upgrade is planned for the spring release of the platform team",
       {"ops"}},
      {"k5", "kafka kafka kafka outage", {}},
      // disk full: both words, near each other, more often first.
      {"d1", "disk full disk full", {}},
      {"d2", "disk full alert", {"ops"}},
      {"d3", "the disk was almost full yesterday night", {}},
      {"d4", "disk full again today", {}},
      {"d5", "a new disk arrived", {}},
      // either database, one term each, at equal length.
      {"s1", "sqlite sqlite sqlite wal", {}},
      {"s2", "postgres postgres vacuum settings", {}},
      {"s3", "postgres replica delay alert", {}},
      {"s4", "mysql is not used here", {}},
      // prefixes of migrat-.
      {"p1", "migration migration migration rollback", {}},
      {"p2", "migration migration schema plan", {}},
      {"p3", "migrate the users table", {}},
      {"p4", "emigrate is another word", {}},
      // words beyond ASCII, and punctuation that separates words.
      {"u1", "caf\xC3\xA9 cr\xC3\xA8me br\xC3\xBBl\xC3\xA9\x65", {}},
      {"u2", "the e-mail gateway rejects attachments", {}},
      {"u3", "email gateway config", {}},
      // ties: the same text; the later update first, then the smaller id.
      {"t1", "tiebreak marker", {}},
      {"t2", "tiebreak marker", {}},
      {"t3", "tiebreak marker", {}},
  };
  return kCorpus;
}

// Memories that share no word with any query.
std::vector<std::string> Filler() {
  static const char* kWords[] = {"orange", "violet",  "lemon",   "cherry", "walnut", "pebble",
                                 "harbor", "meadow",  "lantern", "quartz", "ember",  "willow",
                                 "copper", "saffron", "thistle", "marble"};
  std::vector<std::string> out;
  for (int i = 0; i < 24; ++i) {
    std::string text;
    for (int k = 0; k < 4 + i % 5; ++k)
      text += std::string(k ? " " : "") + kWords[(i * 7 + k * 3) % 16];
    out.push_back(text);
  }
  return out;
}

Status LoadCorpus(Store& store) {
  KEEL_RETURN_IF_ERROR(AddTenantAndAgents(store, kTenant, {kAgent, kOther}));
  return store.WriteSync([&](Tx& tx) -> Status {
    Millis at = 1000;
    for (const auto& e : Corpus()) {
      Json tags = Json::array();
      for (const auto& t : e.tags) tags.push_back(t);
      Millis when = ++at;
      if (std::string(e.id) == "t2" || std::string(e.id) == "t3") when = 5000;  // t2, t3 tie
      KEEL_RETURN_IF_ERROR(
          tx.memory().UpsertMemory(MakeMemory(kTenant, kAgent, e.id, e.text, when, tags)));
    }
    int i = 0;
    for (const auto& text : Filler()) {
      KEEL_RETURN_IF_ERROR(tx.memory().UpsertMemory(
          MakeMemory(kTenant, kAgent, "f" + std::to_string(i++), text, ++at)));
    }
    // Another agent of the tenant with the best kafka memory of all: never in kAgent's results.
    return tx.memory().UpsertMemory(
        MakeMemory(kTenant, kOther, "other-k1", "kafka kafka kafka kafka kafka", ++at));
  });
}

struct CorpusQuery {
  const char* query;
  const char* tag;
  std::vector<std::string> top;  // the expected best ids (up to 3), best first
};

const std::vector<CorpusQuery>& Queries() {
  static const std::vector<CorpusQuery> kQueries = {
      {"kafka -outage", "", {"k1", "k2", "k3"}},
      {"KAFKA -outage", "", {"k1", "k2", "k3"}},
      {"kafka", "ops", {"k2", "k4"}},
      {"disk full", "", {"d1", "d2", "d4"}},
      {"\"disk full\"", "", {"d1", "d2", "d4"}},
      {"full disk", "ops", {"d2"}},
      {"sqlite OR postgres", "", {"s1", "s2", "s3"}},
      {"migrat*", "", {"p1", "p2", "p3"}},
      {"caf\xC3\xA9 br\xC3\xBBl\xC3\xA9\x65", "", {"u1"}},
      {"cafe", "", {}},
      {"e-mail gateway", "", {"u2"}},
      {"mail", "", {"u2"}},
      {"email", "", {"u3"}},
      {"tiebreak", "", {"t2", "t3", "t1"}},
      {"nothing matches this", "", {}},
      {"kafka", "no-such-tag", {}},
  };
  return kQueries;
}

Result<std::vector<MemoryHit>> Search(Store& store, const std::string& agent,
                                      const std::string& text, const std::string& tag,
                                      int limit = 10) {
  KEEL_ASSIGN_OR_RETURN(MemoryQuery query, memory::ParseQuery(text));
  std::vector<MemoryHit> hits;
  Status st = store.Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(hits, tx.memory().SearchMemories(kTenant, agent, {query, tag, limit}));
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return hits;
}

std::vector<std::string> TopIds(const std::vector<MemoryHit>& hits, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < hits.size() && i < n; ++i) out.push_back(hits[i].memory.id);
  return out;
}

// ---------------------------------------------------------------- the suite

class MemoryStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    bool skip = false;
    Status st = OpenFresh(GetParam(), &s_, &skip);
    if (skip) GTEST_SKIP() << kPgSkip;
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  Store& store() { return *s_.store; }

  template <typename T, typename Fn>
  T ReadValue(Fn fn) {
    T out{};
    Status st = store().Read([&](Tx& tx) -> Status {
      auto r = fn(tx);
      if (!r.ok()) return r.status();
      out = std::move(r).value();
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  Backing s_;
};

INSTANTIATE_TEST_SUITE_P(Conformance, MemoryStoreTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

TEST_P(MemoryStoreTest, UpsertReplacesInPlaceKeepingTheCreationTime) {
  ASSERT_TRUE(AddTenantAndAgents(store(), kTenant, {kAgent}).ok());
  ASSERT_TRUE(store()
                  .WriteSync([&](Tx& tx) {
                    return tx.memory().UpsertMemory(
                        MakeMemory(kTenant, kAgent, "m1", "first text", 100, {"a"}));
                  })
                  .ok());
  Memory replaced = MakeMemory(kTenant, kAgent, "m1", "second text", 200, {"b", "c"});
  replaced.source = "tool";
  ASSERT_TRUE(store().WriteSync([&](Tx& tx) { return tx.memory().UpsertMemory(replaced); }).ok());
  Memory got =
      ReadValue<Memory>([&](Tx& tx) { return tx.memory().GetMemory(kTenant, kAgent, "m1"); });
  EXPECT_EQ(got.text, "second text");
  EXPECT_EQ(got.tags, Json({"b", "c"}));
  EXPECT_EQ(got.source, "tool");
  EXPECT_EQ(got.created_at, 100);
  EXPECT_EQ(got.updated_at, 200);
  // The index follows the text: the old words are gone, the new ones found.
  EXPECT_TRUE(Search(store(), kAgent, "first", "")->empty());
  EXPECT_EQ(TopIds(*Search(store(), kAgent, "second", ""), 3), std::vector<std::string>{"m1"});
  EXPECT_TRUE(Search(store(), kAgent, "second", "a")->empty());
  EXPECT_EQ(TopIds(*Search(store(), kAgent, "second", "c"), 3), std::vector<std::string>{"m1"});
}

TEST_P(MemoryStoreTest, DeleteRemovesTheMemoryAndItsIndexEntries) {
  ASSERT_TRUE(AddTenantAndAgents(store(), kTenant, {kAgent}).ok());
  ASSERT_TRUE(store()
                  .WriteSync([&](Tx& tx) {
                    return tx.memory().UpsertMemory(
                        MakeMemory(kTenant, kAgent, "m1", "gone soon", 100));
                  })
                  .ok());
  ASSERT_TRUE(
      store()
          .WriteSync([&](Tx& tx) { return tx.memory().DeleteMemory(kTenant, kAgent, "m1"); })
          .ok());
  Status again =
      store().WriteSync([&](Tx& tx) { return tx.memory().DeleteMemory(kTenant, kAgent, "m1"); });
  EXPECT_EQ(again.code(), Code::kNotFound);
  EXPECT_EQ(again.message(), "memory not found: m1");
  Status read =
      store().Read([&](Tx& tx) { return tx.memory().GetMemory(kTenant, kAgent, "m1").status(); });
  EXPECT_EQ(read.code(), Code::kNotFound);
  EXPECT_TRUE(Search(store(), kAgent, "gone", "")->empty());
}

TEST_P(MemoryStoreTest, ListIsNewestFirstPagedAndFilteredByTag) {
  ASSERT_TRUE(AddTenantAndAgents(store(), kTenant, {kAgent, kOther}).ok());
  ASSERT_TRUE(
      store()
          .WriteSync([&](Tx& tx) -> Status {
            for (int i = 0; i < 7; ++i) {
              Json tags = i % 2 ? Json{"odd"} : Json{"even", "x y"};
              // Two share an updated_at: the larger id comes first.
              KEEL_RETURN_IF_ERROR(tx.memory().UpsertMemory(MakeMemory(
                  kTenant, kAgent, "m" + std::to_string(i), "text", i == 6 ? 500 : 100 * i, tags)));
            }
            return tx.memory().UpsertMemory(MakeMemory(kTenant, kOther, "other", "text", 900));
          })
          .ok());
  std::vector<std::string> seen;
  std::string cursor;
  do {
    auto page = ReadValue<Paged<Memory>>([&](Tx& tx) {
      return tx.memory().ListMemories(kTenant, kAgent, "", {cursor, 3});
    });
    for (const auto& m : page.items) seen.push_back(m.id);
    cursor = page.next_cursor;
  } while (!cursor.empty());
  EXPECT_EQ(seen, (std::vector<std::string>{"m6", "m5", "m4", "m3", "m2", "m1", "m0"}));
  auto odd = ReadValue<Paged<Memory>>([&](Tx& tx) {
    return tx.memory().ListMemories(kTenant, kAgent, "odd", {"", 50});
  });
  std::vector<std::string> odd_ids;
  for (const auto& m : odd.items) odd_ids.push_back(m.id);
  EXPECT_EQ(odd_ids, (std::vector<std::string>{"m5", "m3", "m1"}));
  auto spaced = ReadValue<Paged<Memory>>([&](Tx& tx) {
    return tx.memory().ListMemories(kTenant, kAgent, "x y", {"", 50});
  });
  EXPECT_EQ(spaced.items.size(), 4u);
  Status bad = store().Read([&](Tx& tx) {
    return tx.memory().ListMemories(kTenant, kAgent, "", {EncodeCursor("nonsense"), 5}).status();
  });
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
}

TEST_P(MemoryStoreTest, AgentsAndTenantsDoNotSeeEachOthersMemories) {
  const std::string other_tenant = "0190b000-0000-7000-8000-0000000000ff";
  const std::string foreign_agent = "0190b000-0000-7000-8000-0000000000fa";
  ASSERT_TRUE(AddTenantAndAgents(store(), kTenant, {kAgent, kOther}).ok());
  ASSERT_TRUE(AddTenantAndAgents(store(), other_tenant, {foreign_agent}).ok());
  ASSERT_TRUE(
      store()
          .WriteSync([&](Tx& tx) -> Status {
            // Ids are unique per tenant: another tenant may use the same one.
            KEEL_RETURN_IF_ERROR(
                tx.memory().UpsertMemory(MakeMemory(kTenant, kAgent, "m", "secret plan alpha", 1)));
            KEEL_RETURN_IF_ERROR(
                tx.memory().UpsertMemory(MakeMemory(kTenant, kOther, "m2", "secret plan beta", 2)));
            Memory foreign = MakeMemory(other_tenant, foreign_agent, "m", "secret plan gamma", 3);
            return tx.memory().UpsertMemory(foreign);
          })
          .ok());
  auto hits = Search(store(), kAgent, "secret plan", "");
  ASSERT_TRUE(hits.ok());
  ASSERT_EQ(hits->size(), 1u);
  EXPECT_EQ((*hits)[0].memory.text, "secret plan alpha");
  EXPECT_TRUE(Search(store(), kAgent, "beta OR gamma", "")->empty());
  Memory got =
      ReadValue<Memory>([&](Tx& tx) { return tx.memory().GetMemory(kTenant, kOther, "m2"); });
  EXPECT_EQ(got.text, "secret plan beta");
  // By id alone, within the tenant: whichever agent's it is.
  Memory found = ReadValue<Memory>([&](Tx& tx) { return tx.memory().FindMemory(kTenant, "m2"); });
  EXPECT_EQ(found.agent_id, kOther);
  found = ReadValue<Memory>([&](Tx& tx) { return tx.memory().FindMemory(other_tenant, "m"); });
  EXPECT_EQ(found.text, "secret plan gamma");
  Status other_agents =
      store().Read([&](Tx& tx) { return tx.memory().GetMemory(kTenant, kAgent, "m2").status(); });
  EXPECT_EQ(other_agents.code(), Code::kNotFound);
  // A write under another agent's id changes nothing (the caller is to refuse it first).
  ASSERT_TRUE(store()
                  .WriteSync([&](Tx& tx) {
                    return tx.memory().UpsertMemory(
                        MakeMemory(kTenant, kAgent, "m2", "hijacked", 9));
                  })
                  .ok());
  got = ReadValue<Memory>([&](Tx& tx) { return tx.memory().FindMemory(kTenant, "m2"); });
  EXPECT_EQ(got.text, "secret plan beta");
  EXPECT_EQ(got.agent_id, kOther);
  EXPECT_TRUE(Search(store(), kAgent, "hijacked", "")->empty());
  // Another tenant's agent is not found through this tenant, even by its own id.
  Status read = store().Read(
      [&](Tx& tx) { return tx.memory().GetMemory(kTenant, foreign_agent, "m").status(); });
  EXPECT_EQ(read.code(), Code::kNotFound);
  Status gone = store().WriteSync(
      [&](Tx& tx) { return tx.memory().DeleteMemory(kTenant, foreign_agent, "m"); });
  EXPECT_EQ(gone.code(), Code::kNotFound);
}

TEST_P(MemoryStoreTest, WorkingMemoryIsEmptyUntilPutAndReplacedWhole) {
  ASSERT_TRUE(AddTenantAndAgents(store(), kTenant, {kAgent}).ok());
  WorkingMemory none = ReadValue<WorkingMemory>(
      [&](Tx& tx) { return tx.memory().GetWorkingMemory(kTenant, kAgent); });
  EXPECT_EQ(none.text, "");
  EXPECT_EQ(none.updated_at, 0);
  EXPECT_EQ(none.agent_id, kAgent);
  for (const auto& [text, at] :
       std::vector<std::pair<std::string, Millis>>{{"one", 10}, {"two", 20}}) {
    ASSERT_TRUE(store()
                    .WriteSync([&](Tx& tx) {
                      return tx.memory().PutWorkingMemory({kTenant, kAgent, text, at});
                    })
                    .ok());
  }
  WorkingMemory got = ReadValue<WorkingMemory>(
      [&](Tx& tx) { return tx.memory().GetWorkingMemory(kTenant, kAgent); });
  EXPECT_EQ(got.text, "two");
  EXPECT_EQ(got.updated_at, 20);
}

TEST_P(MemoryStoreTest, CorpusQueriesGiveTheExpectedTopResults) {
  ASSERT_TRUE(LoadCorpus(store()).ok());
  for (const auto& q : Queries()) {
    auto hits = Search(store(), kAgent, q.query, q.tag);
    ASSERT_TRUE(hits.ok()) << q.query << ": " << hits.status().ToString();
    EXPECT_EQ(TopIds(*hits, 3), q.top) << "query: " << q.query << " tag: " << q.tag;
    for (size_t i = 1; i < hits->size(); ++i) {
      EXPECT_GE((*hits)[i - 1].score, (*hits)[i].score) << q.query;
    }
  }
  // The limit, and every match when it is large enough.
  EXPECT_EQ(Search(store(), kAgent, "kafka", "", 2)->size(), 2u);
  EXPECT_EQ(Search(store(), kAgent, "kafka", "", 100)->size(), 5u);
}

// More matches than kMemorySearchCandidates: only the newest ones are ranked, so the best of
// the old ones (more occurrences at the same length, but written first) is not among the results.
TEST_P(MemoryStoreTest, SearchRanksTheNewestMatchesWhenThereAreTooManyToRank) {
  ASSERT_TRUE(AddTenantAndAgents(store(), kTenant, {kAgent}).ok());
  const int old_ones = 50;
  ASSERT_TRUE(store()
                  .WriteSync([&](Tx& tx) -> Status {
                    for (int i = 0; i < old_ones + kMemorySearchCandidates; ++i) {
                      std::string text =
                          i < old_ones ? "common common common thing" : "common thing two more";
                      KEEL_RETURN_IF_ERROR(tx.memory().UpsertMemory(MakeMemory(
                          kTenant, kAgent, "m" + std::to_string(100000 + i), text, 1000 + i)));
                    }
                    return Status::Ok();
                  })
                  .ok());
  auto hits = Search(store(), kAgent, "common", "", 3);
  ASSERT_TRUE(hits.ok());
  ASSERT_EQ(hits->size(), 3u);
  EXPECT_EQ((*hits)[0].memory.text, "common thing two more");
  EXPECT_EQ((*hits)[0].memory.id,
            "m" + std::to_string(100000 + old_ones + kMemorySearchCandidates - 1));
  // Writing an old one again makes it new: now it is ranked, and first.
  ASSERT_TRUE(store()
                  .WriteSync([&](Tx& tx) {
                    return tx.memory().UpsertMemory(
                        MakeMemory(kTenant, kAgent, "m100000", "common common common thing", 1));
                  })
                  .ok());
  hits = Search(store(), kAgent, "common", "", 3);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ((*hits)[0].memory.id, "m100000");
  // A more specific query ranks all its matches.
  EXPECT_EQ(Search(store(), kAgent, "common", "", 100)->size(), 100u);
}

TEST_P(MemoryStoreTest, AnExportedMemoryIsSearchableAfterImport) {
  ASSERT_TRUE(LoadCorpus(store()).ok());
  ASSERT_TRUE(store()
                  .WriteSync([&](Tx& tx) {
                    return tx.memory().PutWorkingMemory({kTenant, kAgent, "remember the milk", 42});
                  })
                  .ok());
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("keel-memarc-" + NewId());
  std::filesystem::create_directories(dir);
  const std::string archive = (dir / "a.tar.zst").string();
  ASSERT_TRUE(ExportArchive(store(), "", archive).ok());
  // Into a fresh database of the same backend (the archive tests cross backends).
  Backing target;
  bool skip = false;
  ASSERT_TRUE(OpenFresh(GetParam(), &target, &skip).ok());
  Status imported = ImportArchive(*target.store, archive);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(imported.ok()) << imported.ToString();
  for (const auto& q : Queries()) {
    auto hits = Search(*target.store, kAgent, q.query, q.tag);
    ASSERT_TRUE(hits.ok()) << q.query;
    std::vector<std::string> top = TopIds(*hits, 3);
    if (std::string(q.query) == "tiebreak") continue;  // ties are broken the same; checked above
    EXPECT_EQ(top, q.top) << "after import, query: " << q.query;
  }
  WorkingMemory w;
  ASSERT_TRUE(target.store
                  ->Read([&](Tx& tx) -> Status {
                    KEEL_ASSIGN_OR_RETURN(w, tx.memory().GetWorkingMemory(kTenant, kAgent));
                    return Status::Ok();
                  })
                  .ok());
  EXPECT_EQ(w.text, "remember the milk");
}

// Both backends, the same corpus: the same top three for every query (also for the queries
// whose expected results are written above, and for a few more without them).
TEST(MemoryCrossBackendTest, BothBackendsGiveTheSameTopResults) {
  if (!PgAdminUrl()) GTEST_SKIP() << kPgSkip;
  std::map<std::string, Backing> backends;
  for (Backend b : {Backend::kSqlite, Backend::kPostgres}) {
    bool skip = false;
    Backing& s = backends[BackendName(b)];
    ASSERT_TRUE(OpenFresh(b, &s, &skip).ok());
    ASSERT_TRUE(LoadCorpus(*s.store).ok());
  }
  std::vector<std::pair<std::string, std::string>> queries;
  for (const auto& q : Queries()) queries.emplace_back(q.query, q.tag);
  for (const char* extra : {"kafka", "disk", "full", "postgres", "migration", "gateway",
                            "kafka OR disk", "\"disk full\" -alert", "marker -tiebreak"}) {
    queries.emplace_back(extra, "");
  }
  for (const auto& [query, tag] : queries) {
    std::map<std::string, std::vector<std::string>> top;
    for (auto& [name, s] : backends) {
      auto hits = Search(*s.store, kAgent, query, tag);
      ASSERT_TRUE(hits.ok()) << name << " " << query << ": " << hits.status().ToString();
      top[name] = TopIds(*hits, 3);
    }
    EXPECT_EQ(top["sqlite"], top["postgres"]) << "query: " << query << " tag: " << tag;
  }
}

}  // namespace
}  // namespace keel::store

// The store conformance suite: every case runs against each backend behind store::Store
// (`Conformance/StoreTest.<Case>/sqlite` and `.../postgres`), and
// StoreCrossBackendTest compares the two backends on the same data.
//
// PostgreSQL cases need a server: KEEL_TEST_PG_ADMIN_URL names a role that may create databases
// (`make test` starts a throwaway cluster and sets it; see scripts/with-pg.sh). Each case gets a
// fresh database `keel_t_<random>` owned and migrated by the owner role `keel_owner` (or the user
// of KEEL_TEST_PG_OWNER_URL), opens the store as the runtime role `keel` (or the user of
// KEEL_TEST_PG_URL), and drops the database afterwards (pg_test_database.h). Without the variable
// the PostgreSQL cases are skipped.

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "hold_writer.h"
#include "keel/access/users.h"
#include "keel/common/ids.h"
#include "keel/secrets/vault.h"
#include "keel/store/channel_store.h"
#include "keel/store/postgres/postgres_tx.h"
#include "keel/store/sqlite/sqlite_db.h"
#include "keel/store/sqlite/sqlite_tx.h"
#include "keel/store/store.h"
#include "keel/store/user_store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

// ---------------------------------------------------------------- backends

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
      dir_ = std::filesystem::temp_directory_path() / ("keel-store-" + NewId());
      std::filesystem::create_directories(dir_);
      url_ = "sqlite://" + (dir_ / "keel.db").string();
    }
    return Status::Ok();
  }
  Result<std::unique_ptr<Store>> Open(const std::string& origin = "node-a") const {
    StoreOptions o;
    o.origin = origin;
    return OpenStore(url_, o);
  }
  const std::string& url() const { return url_; }

 private:
  Backend backend_;
  std::filesystem::path dir_;
  PgTestDatabase pg_;
  std::string url_;
};

// ---------------------------------------------------------------- helpers

Tenant MakeTenant(Store& store, std::string id = NewId()) {
  Tenant t{std::move(id), "t", NowMillis()};
  Status st = store.WriteSync([&](Tx& tx) { return tx.tenants().InsertTenant(t); });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return t;
}

Agent NewAgent(const Tenant& t, const std::string& name, std::string id = NewId()) {
  Agent a;
  a.id = std::move(id);
  a.tenant_id = t.id;
  a.name = name;
  a.model = "local";
  a.created_at = a.updated_at = NowMillis();
  return a;
}

Agent MakeAgent(Store& store, const Tenant& t, const std::string& name) {
  Agent a = NewAgent(t, name);
  Status st = store.WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(a); });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return a;
}

Session NewSession(const Tenant& t, const Agent& a, std::string id = NewId()) {
  return Session{std::move(id), t.id, a.id, "idle", "s", NowMillis(), NowMillis(), ""};
}

store::Run NewRun(const Tenant& t, const Session& s, std::string id = NewId()) {
  store::Run r;
  r.id = std::move(id);
  r.tenant_id = t.id;
  r.session_id = s.id;
  r.agent_id = s.agent_id;
  r.created_at = NowMillis();
  return r;
}

Message NewMessage(const Tenant& t, const Session& s, const std::string& key = "",
                   std::string id = NewId()) {
  Message m;
  m.id = std::move(id);
  m.tenant_id = t.id;
  m.session_id = s.id;
  m.role = "user";
  m.content = "hello " + m.id;
  m.idempotency_key = key;
  m.created_at = NowMillis();
  return m;
}

Plugin NewPlugin(const Tenant& t, const std::string& id, Millis at = 100) {
  Plugin p;
  p.tenant_id = t.id;
  p.id = id;
  p.name = "Plugin " + id;
  p.version = "1.0.0";
  p.kind = "lua";
  p.manifest = Json{{"id", id}, {"version", "1.0.0"}, {"hooks", {"tool.after"}}};
  p.source = "return {}";
  p.config = Json{{"level", 1}};
  p.created_at = p.updated_at = at;
  return p;
}

PluginDelivery NewDelivery(const Tenant& t, const std::string& plugin_id, Millis created_at,
                           const std::string& status = "pending", Millis next_attempt_at = 0,
                           std::string id = NewId()) {
  PluginDelivery d;
  d.id = std::move(id);
  d.tenant_id = t.id;
  d.plugin_id = plugin_id;
  d.agent_id = "agent-1";
  d.event_type = "tool.after@v1";
  d.payload = Json{{"tool", "time.now"}, {"n", created_at}};
  d.status = status;
  d.next_attempt_at = next_attempt_at;
  d.created_at = created_at;
  return d;
}

template <typename T>
std::vector<std::string> Ids(const std::vector<T>& items) {
  std::vector<std::string> ids;
  for (const auto& x : items) ids.push_back(x.id);
  return ids;
}

// Reads `fn`'s result in a read snapshot; fails the test when the read fails.
template <typename T, typename Fn>
T ReadValue(Store& store, Fn fn) {
  T out{};
  Status st = store.Read([&](Tx& tx) -> Status {
    auto r = fn(tx);
    if (!r.ok()) return r.status();
    out = std::move(r).value();
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

// One page of a list as (item ids, next_cursor), and every page of a list.
using IdPage = std::pair<std::vector<std::string>, std::string>;
using Pages = std::vector<IdPage>;
using PageFn = std::function<Result<IdPage>(Tx&, const Page&)>;

template <typename T>
Result<IdPage> ToIdPage(Result<Paged<T>> page) {
  if (!page.ok()) return page.status();
  return IdPage{Ids(page->items), page->next_cursor};
}

IdPage ReadPage(Store& store, const PageFn& list, const Page& page) {
  return ReadValue<IdPage>(store, [&](Tx& tx) { return list(tx, page); });
}

Pages AllPages(Store& store, int limit, const PageFn& list) {
  Pages pages;
  std::string cursor;
  do {
    pages.push_back(ReadPage(store, list, {cursor, limit}));
    cursor = pages.back().second;
    if (pages.size() > 1000) {
      ADD_FAILURE() << "pagination does not end";
      break;
    }
  } while (!cursor.empty());
  return pages;
}

// ---------------------------------------------------------------- the suite

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kPostgres && !PgAdminUrl()) GTEST_SKIP() << kPgSkip;
    db_ = std::make_unique<BackendDb>(GetParam());
    Status st = db_->Prepare();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_NO_FATAL_FAILURE(Open());
  }
  void TearDown() override {
    store_.reset();
    db_.reset();
    if (!old_dir_.empty()) std::filesystem::remove_all(old_dir_);
  }
  void Open() {
    store_.reset();
    auto s = db_->Open("node-a");
    ASSERT_TRUE(s.ok()) << BackendName(GetParam()) << ": " << s.status().ToString();
    store_ = std::move(s).value();
  }
  Tenant MakeTenant() { return store::MakeTenant(*store_); }
  Agent MakeAgent(const Tenant& t, const std::string& name) {
    return store::MakeAgent(*store_, t, name);
  }

  // A store opened (and so migrated) from a database at the schema just before the first
  // migration whose text holds `marker`, holding `rows` as that schema had them (SQL run by the
  // owner in the same transaction; `pg_rows` instead on PostgreSQL when it differs). The
  // suite's own store is closed first; the database is removed in TearDown. Null on failure.
  std::unique_ptr<Store> OpenFromSchemaBefore(std::string_view marker, const std::string& rows,
                                              const std::string& pg_rows = "") {
    store_.reset();
    db_.reset();
    const std::vector<const char*>& migrations =
        GetParam() == Backend::kSqlite ? sqlite::Migrations() : postgres::Migrations();
    size_t before = 0;
    while (before < migrations.size() &&
           std::string_view(migrations[before]).find(marker) == std::string_view::npos) {
      ++before;
    }
    EXPECT_LT(before, migrations.size()) << "no migration holds " << marker;
    std::string old_schema;
    std::string versions = "INSERT INTO schema_migrations VALUES";
    for (size_t v = 1; v <= before; ++v) {
      old_schema += migrations[v - 1];
      old_schema += ";\n";
      versions += (v > 1 ? ",(" : "(") + std::to_string(v) + ", 0)";
    }
    std::string url;
    if (GetParam() == Backend::kSqlite) {
      old_dir_ = std::filesystem::temp_directory_path() / ("keel-store-" + NewId());
      std::filesystem::create_directories(old_dir_);
      std::string path = (old_dir_ / "keel.db").string();
      auto db = sqlite::Db::Open(path, /*read_only=*/false, /*sync_full=*/false);
      if (!db.ok()) {
        ADD_FAILURE() << db.status().ToString();
        return nullptr;
      }
      const std::string sql =
          "CREATE TABLE schema_migrations(version INTEGER PRIMARY KEY, applied_at INTEGER NOT "
          "NULL);\n" + old_schema + rows + ";\n" + versions + ";";
      Status st = (*db)->Exec(sql.c_str());
      if (!st.ok()) {
        ADD_FAILURE() << st.ToString();
        return nullptr;
      }
      db->reset();
      url = "sqlite://" + path;
    } else {
      Status st = old_pg_.Create(/*migrate=*/false);
      if (st.ok()) {
        st = PgExec(old_pg_.owner_url(),
                    "BEGIN; CREATE TABLE schema_migrations(version BIGINT PRIMARY KEY, "
                    "applied_at BIGINT NOT NULL);\n" + old_schema +
                        (pg_rows.empty() ? rows : pg_rows) + ";\n" + versions + "; COMMIT;");
      }
      if (st.ok()) st = old_pg_.Migrate();
      if (!st.ok()) {
        ADD_FAILURE() << st.ToString();
        return nullptr;
      }
      url = old_pg_.url();
    }
    StoreOptions o;
    o.origin = "o1";
    auto opened = OpenStore(url, o);
    if (!opened.ok()) {
      ADD_FAILURE() << opened.status().ToString();
      return nullptr;
    }
    return std::move(opened).value();
  }

  std::unique_ptr<BackendDb> db_;
  std::unique_ptr<Store> store_;
  std::filesystem::path old_dir_;  // OpenFromSchemaBefore's SQLite database
  PgTestDatabase old_pg_;          // and PostgreSQL's
};

INSTANTIATE_TEST_SUITE_P(Conformance, StoreTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

TEST_P(StoreTest, AppendAssignsGaplessOriginSeqAndIncreasingPositions) {
  Tenant t = MakeTenant();
  for (int i = 0; i < 10; ++i) {
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "x.happened@v1", "", "", "", {{"i", i}}}));
      // A failing unit in between must not leave a gap.
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok());
    Status bad = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "x.rolled_back@v1", "", "", "", {}}));
      return Conflict("roll me back");
    });
    ASSERT_EQ(bad.code(), Code::kConflict);
  }
  std::vector<Event> events;
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(events, tx.events().ReadEvents(t.id, 0, {}, 100));
    return Status::Ok();
  }).ok());
  ASSERT_EQ(events.size(), 10u);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].origin, "node-a");
    EXPECT_EQ(events[i].origin_seq, static_cast<int64_t>(i + 1));
    EXPECT_EQ(events[i].type, "x.happened@v1");
    EXPECT_EQ(events[i].payload, Json({{"i", i}}));
    EXPECT_EQ(events[i].position, static_cast<int64_t>(i + 1));  // the tenant's, gapless
  }
}

// A tenant's positions and origin_seqs count its own events only: another tenant's activity in
// between (in other units or in the same one) shows as no gap, and a cursor another tenant's
// events would have had shows nothing of them. Another origin starts its own origin_seq.
TEST_P(StoreTest, PositionsAndOriginSeqsShowNothingOfOtherTenants) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  auto append = [&](std::vector<std::pair<const Tenant*, int>> events) {
    std::vector<Event> out;
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      for (const auto& [t, n] : events) {
        for (int i = 0; i < n; ++i) {
          KEEL_RETURN_IF_ERROR(tx.events().Append({t->id, "x.happened@v1", "", "", "", {}}));
        }
      }
      return Status::Ok();
    }, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  };
  std::vector<Event> committed_a;
  for (int round = 0; round < 3; ++round) {
    for (auto& e : append({{&a, 1}})) committed_a.push_back(e);
    append({{&b, 7}});
    for (auto& e : append({{&b, 2}, {&a, 1}, {&b, 3}, {&a, 1}})) {
      if (e.tenant_id == a.id) committed_a.push_back(e);
    }
  }
  ASSERT_EQ(committed_a.size(), 9u);
  auto read = [&](const Tenant& t, int64_t after) {
    return ReadValue<std::vector<Event>>(
        *store_, [&](Tx& tx) { return tx.events().ReadEvents(t.id, after, {}, 1000); });
  };
  auto events_a = read(a, 0);
  ASSERT_EQ(events_a.size(), 9u);
  for (size_t i = 0; i < events_a.size(); ++i) {
    EXPECT_EQ(events_a[i].tenant_id, a.id);
    EXPECT_EQ(events_a[i].position, static_cast<int64_t>(i + 1));
    EXPECT_EQ(events_a[i].origin_seq, static_cast<int64_t>(i + 1));
    // What the commit reported is what reads show.
    EXPECT_EQ(committed_a[i].id, events_a[i].id);
    EXPECT_EQ(committed_a[i].position, events_a[i].position);
    EXPECT_EQ(committed_a[i].origin_seq, events_a[i].origin_seq);
  }
  auto events_b = read(b, 0);
  ASSERT_EQ(events_b.size(), 36u);
  for (size_t i = 0; i < events_b.size(); ++i) {
    EXPECT_EQ(events_b[i].position, static_cast<int64_t>(i + 1));
    EXPECT_EQ(events_b[i].origin_seq, static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(ReadValue<int64_t>(*store_, [&](Tx& tx) { return tx.events().LastPosition(a.id); }),
            9);
  EXPECT_EQ(ReadValue<int64_t>(*store_, [&](Tx& tx) { return tx.events().LastPosition(b.id); }),
            36);
  EXPECT_EQ(read(a, 9).size(), 0u);   // past A's last: B's 27 later positions show nothing
  EXPECT_EQ(read(a, 30).size(), 0u);
  auto rest = read(a, 4);
  ASSERT_EQ(rest.size(), 5u);
  EXPECT_EQ(rest.front().id, events_a[4].id);

  // Another origin (a second node) numbers the tenant's events from 1; positions go on.
  store_.reset();
  auto other = db_->Open("node-b");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  std::vector<Event> appended;
  ASSERT_TRUE((*other)->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.events().Append({b.id, "x.happened@v1", "", "", "", {}}));
    return tx.events().Append({a.id, "x.happened@v1", "", "", "", {}});
  }, &appended).ok());
  ASSERT_EQ(appended.size(), 2u);
  EXPECT_EQ(appended[1].origin, "node-b");
  EXPECT_EQ(appended[1].origin_seq, 1);
  EXPECT_EQ(appended[1].position, 10);
  EXPECT_EQ(appended[0].position, 37);
}

// The migration to per-tenant numbering renumbers the events already stored: each tenant's
// positions 1, 2, 3, ... in the order they were written, origin_seq per (tenant, origin); new
// events go on from there.
TEST_P(StoreTest, MigrationNumbersExistingEventsPerTenant) {
  // A database at the schema before the migration that brought tenant_position (later ones
  // follow it), with events as that schema numbered them: store-wide positions, origin_seq per
  // origin.
  const std::string insert_events =
      "INSERT INTO events(position, id, tenant_id, type, origin, origin_seq, agent_id, "
      "session_id, run_id, payload, occurred_at)";
  const std::string old_events =
      " VALUES"
      "(1, 'e1', 'ta', 'x@v1', 'o1', 1, '', '', '', '{}', 1),"
      "(2, 'e2', 'tb', 'x@v1', 'o1', 2, '', '', '', '{}', 2),"
      "(3, 'e3', 'tb', 'x@v1', 'o1', 3, '', '', '', '{}', 3),"
      "(4, 'e4', 'ta', 'x@v1', 'o2', 1, '', '', '', '{}', 4),"
      "(5, 'e5', 'ta', 'x@v1', 'o1', 4, '', '', '', '{}', 5),"
      "(6, 'e6', 'tb', 'x@v1', 'o2', 2, '', '', '', '{}', 6),"
      "(7, 'e7', 'ta', 'x@v1', 'o1', 5, '', '', '', '{}', 7)";
  std::unique_ptr<Store> store = OpenFromSchemaBefore(
      "tenant_position", insert_events + old_events,
      insert_events + " OVERRIDING SYSTEM VALUE" + old_events +
          "; SELECT setval(pg_get_serial_sequence('events', 'position'), 7)");
  ASSERT_TRUE(store);
  auto read = [&](const std::string& tenant) {
    std::vector<std::string> out;
    EXPECT_TRUE(store->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto events, tx.events().ReadEvents(tenant, 0, {}, 100));
      for (const auto& e : events) {
        out.push_back(std::to_string(e.position) + " " + e.id + " " + e.origin + "/" +
                      std::to_string(e.origin_seq));
      }
      return Status::Ok();
    }).ok());
    return out;
  };
  EXPECT_EQ(read("ta"), (std::vector<std::string>{"1 e1 o1/1", "2 e4 o2/1", "3 e5 o1/2",
                                                  "4 e7 o1/3"}));
  EXPECT_EQ(read("tb"), (std::vector<std::string>{"1 e2 o1/1", "2 e3 o1/2", "3 e6 o2/1"}));
  std::vector<Event> appended;
  Status st = store->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.events().Append({"tb", "y@v1", "", "", "", {}}));
    return tx.events().Append({"ta", "y@v1", "", "", "", {}});
  }, &appended);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(appended.size(), 2u);
  EXPECT_EQ(appended[0].position, 4);
  EXPECT_EQ(appended[0].origin_seq, 3);
  EXPECT_EQ(appended[1].position, 5);
  EXPECT_EQ(appended[1].origin_seq, 4);
}

// Messages written before seq existed are numbered per session in id order by the migration,
// and the next message of a session takes the next number.
TEST_P(StoreTest, MigrationNumbersExistingMessagesPerSession) {
  // Two sessions; each one's messages inserted out of id order.
  const std::string rows =
      "INSERT INTO tenants(id, name, created_at) VALUES('ta', 'a', 1);\n"
      "INSERT INTO agents(id, tenant_id, name, model, instructions, tools, config, status, "
      "created_at, updated_at) VALUES('ag', 'ta', 'n', 'local', '', '[]', '{}', 'active', 1, 1);\n"
      "INSERT INTO sessions(id, tenant_id, agent_id, status, title, created_at, updated_at) "
      "VALUES('s1', 'ta', 'ag', 'idle', '', 1, 1), ('s2', 'ta', 'ag', 'idle', '', 1, 1);\n"
      "INSERT INTO messages(id, tenant_id, session_id, run_id, role, content, idempotency_key, "
      "created_at) VALUES('m3', 'ta', 's1', 'r', 'user', 'c', '', 1), "
      "('m1', 'ta', 's1', 'r', 'user', 'a', '', 1), ('m2', 'ta', 's2', 'r', 'user', 'x', '', 1), "
      "('m4', 'ta', 's2', 'r', 'assistant', 'y', '', 1), "
      "('m2a', 'ta', 's1', 'r', 'assistant', 'b', '', 1);\n";
  // On PostgreSQL the owner writes them as the old store's runtime role would have: under row
  // security, bound to the tenant.
  std::unique_ptr<Store> store = OpenFromSchemaBefore(
      "messages ADD COLUMN seq", rows, "SELECT set_config('app.tenant_id', 'ta', true);\n" + rows);
  ASSERT_TRUE(store);
  auto read = [&](const std::string& session) {
    std::vector<std::string> out;
    EXPECT_TRUE(store->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto c, tx.compactions().ConversationSince("ta", session, "", 0, 10));
      for (const auto& m : c.messages) out.push_back(m.id + "/" + std::to_string(m.seq));
      out.push_back("last " + std::to_string(c.last_seq));
      return Status::Ok();
    }).ok());
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(read("s1"), (V{"m1/1", "m2a/2", "m3/3", "last 3"}));
  EXPECT_EQ(read("s2"), (V{"m2/1", "m4/2", "last 2"}));
  // The next message of a session takes the next number, and comes after the others.
  Message next;
  next.id = "m0";  // an earlier id than any: still the session's next seq
  next.tenant_id = "ta";
  next.session_id = "s2";
  next.run_id = "r";
  next.role = "user";
  next.content = "z";
  ASSERT_TRUE(store->WriteSync([&](Tx& tx) { return tx.messages().InsertMessage(next); }).ok());
  EXPECT_EQ(read("s2"), (V{"m2/1", "m4/2", "m0/3", "last 3"}));
}

TEST_P(StoreTest, FailedUnitRollsBackOnlyItselfWithinABatch) {
  Tenant t = MakeTenant();
  constexpr int kUnits = 200;
  std::vector<std::promise<Status>> done(kUnits);
  for (int i = 0; i < kUnits; ++i) {
    store_->Write(
        [&, i](Tx& tx) -> Status {
          Agent a;
          a.id = NewId();
          a.tenant_id = t.id;
          a.name = "agent-" + std::to_string(i % 2 == 0 ? i : 0);  // odd units collide on a name
          a.model = "local";
          KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
          return tx.events().Append({t.id, "agent.created@v1", a.id, "", "", {}});
        },
        [&done, i](Status s, std::vector<Event>) { done[i].set_value(s); });
  }
  int ok = 0, conflicts = 0;
  for (auto& d : done) {
    Status s = d.get_future().get();
    if (s.ok()) {
      ++ok;
    } else if (s.code() == Code::kConflict) {
      ++conflicts;
      EXPECT_EQ(s.message(), "an agent named 'agent-0' already exists");
    }
  }
  EXPECT_EQ(ok, kUnits / 2);  // the even ones, agent-0 included
  EXPECT_EQ(conflicts, kUnits / 2);
  Paged<Agent> page;
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(page, tx.agents().ListAgents(t.id, {"", 500}));
    return Status::Ok();
  }).ok());
  EXPECT_EQ(page.items.size(), static_cast<size_t>(kUnits / 2));
  // Group commit: far fewer fsyncs than units.
  auto stats = store_->stats();
  EXPECT_EQ(stats.failed_units, kUnits / 2);
  EXPECT_LT(stats.commits, stats.units);
  // Only the committed units' events exist, gapless.
  auto events = ReadValue<std::vector<Event>>(
      *store_, [&](Tx& tx) { return tx.events().ReadEvents(t.id, 0, {}, 1000); });
  ASSERT_EQ(events.size(), static_cast<size_t>(kUnits / 2));
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].origin_seq, static_cast<int64_t>(i + 1));
  }
}

TEST_P(StoreTest, AUnitThatThrowsAfterWritingFailsAloneAndTheOthersCommitOnce) {
  Tenant t = MakeTenant();
  // Queued behind a held writer, so that they share one transaction: every third unit throws
  // after writing its agent and its event. Without savepoints the transaction is rolled back
  // and the others run again; either way each must end exactly as if it had run alone.
  constexpr int kUnits = 30;
  std::vector<std::promise<Status>> done(kUnits);
  auto gate = HoldWriter(*store_);
  for (int i = 0; i < kUnits; ++i) {
    store_->Write(
        [&, i](Tx& tx) -> Status {
          Agent a = NewAgent(t, "agent-" + std::to_string(i));
          KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
          KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "agent.created@v1", a.id, "", "", {}}));
          if (i % 3 == 1) throw std::runtime_error("unit " + std::to_string(i) + " broke");
          return Status::Ok();
        },
        [&done, i](Status s, std::vector<Event>) { done[i].set_value(s); });
  }
  gate->set_value();
  std::set<std::string> expected;
  for (int i = 0; i < kUnits; ++i) {
    Status s = done[i].get_future().get();
    if (i % 3 == 1) {
      EXPECT_EQ(s.code(), Code::kInternal) << i;
      EXPECT_NE(s.message().find("unit " + std::to_string(i) + " broke"), std::string::npos);
    } else {
      EXPECT_TRUE(s.ok()) << i << ": " << s.ToString();
      expected.insert("agent-" + std::to_string(i));
    }
  }
  Paged<Agent> page;
  ASSERT_TRUE(store_
                  ->Read([&](Tx& tx) -> Status {
                    KEEL_ASSIGN_OR_RETURN(page, tx.agents().ListAgents(t.id, {"", 500}));
                    return Status::Ok();
                  })
                  .ok());
  std::set<std::string> names;
  for (const auto& a : page.items) EXPECT_TRUE(names.insert(a.name).second) << a.name;
  EXPECT_EQ(names, expected);
  auto events = ReadValue<std::vector<Event>>(
      *store_, [&](Tx& tx) { return tx.events().ReadEvents(t.id, 0, {}, 1000); });
  ASSERT_EQ(events.size(), expected.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].origin_seq, static_cast<int64_t>(i + 1));
  }
}

TEST_P(StoreTest, ADeferredUnitIsKeptWhateverTheUnitsAfterItDoAndCommitsWithThem) {
  Tenant t = MakeTenant();
  auto insert = [&t](const std::string& name) {
    return [&t, name](Tx& tx) -> Status {
      Agent a = NewAgent(t, name);
      KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
      return tx.events().Append({t.id, "agent.created@v1", a.id, "", "", {}});
    };
  };
  auto names = [&] {
    Paged<Agent> page = ReadValue<Paged<Agent>>(*store_, [&](Tx& tx) {
      return tx.agents().ListAgents(t.id, {"", 500});
    });
    std::set<std::string> out;
    for (const auto& a : page.items) out.insert(a.name);
    return out;
  };
  // Told the deferred unit's outcome, the caller goes on at once with its next units (as a
  // turn does): one that fails, whose rollback must not take the told unit with it, and one
  // that commits. SQLite tells the deferred unit before its transaction commits and holds the
  // transaction for what follows; PostgreSQL commits it as any unit.
  std::promise<Status> deferred, failing, last;
  store_->WriteDeferred(insert("first"), [&](Status s, std::vector<Event>) {
    store_->Write(
        [&](Tx& tx) -> Status {
          KEEL_RETURN_IF_ERROR(insert("second")(tx));
          return Conflict("the second unit fails after writing");
        },
        [&](Status s2, std::vector<Event>) { failing.set_value(s2); });
    store_->Write(insert("third"), [&](Status s3, std::vector<Event>) { last.set_value(s3); });
    deferred.set_value(s);
  });
  ASSERT_TRUE(deferred.get_future().get().ok());
  EXPECT_EQ(failing.get_future().get().code(), Code::kConflict);
  ASSERT_TRUE(last.get_future().get().ok());
  // Once a unit queued after it is durable, so is the deferred one: first and third, in order.
  EXPECT_EQ(names(), (std::set<std::string>{"first", "third"}));
  auto events = ReadValue<std::vector<Event>>(
      *store_, [&](Tx& tx) { return tx.events().ReadEvents(t.id, 0, {}, 100); });
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].origin_seq, 1);
  EXPECT_EQ(events[1].origin_seq, 2);

  // A deferred unit with nothing after it commits on its own, soon.
  std::promise<Status> alone;
  store_->WriteDeferred(insert("fourth"),
                        [&](Status s, std::vector<Event>) { alone.set_value(s); });
  ASSERT_TRUE(alone.get_future().get().ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (names().count("fourth") == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(names(), (std::set<std::string>{"first", "third", "fourth"}));
}

TEST_P(StoreTest, PaginationReturnsEveryItemOnce) {
  Tenant t = MakeTenant();
  for (int i = 0; i < 23; ++i) MakeAgent(t, "a" + std::to_string(i));
  std::set<std::string> seen;
  std::string cursor;
  int pages = 0;
  do {
    Paged<Agent> page;
    ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(page, tx.agents().ListAgents(t.id, {cursor, 5}));
      return Status::Ok();
    }).ok());
    for (const auto& a : page.items) EXPECT_TRUE(seen.insert(a.id).second);
    cursor = page.next_cursor;
    ++pages;
  } while (!cursor.empty());
  EXPECT_EQ(seen.size(), 23u);
  EXPECT_EQ(pages, 5);
}

TEST_P(StoreTest, ListsAreOrderedByIdWhateverTheInsertOrder) {
  Tenant t = MakeTenant();
  // Ids made first, inserted shuffled: the order must come from the ids, not from the insert.
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(NewId());
  std::vector<std::string> shuffled = ids;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  for (size_t i = 0; i < shuffled.size(); ++i) {
    Agent a = NewAgent(t, "agent-" + std::to_string(i), shuffled[i]);
    ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(a); }).ok());
  }
  PageFn list = [&](Tx& tx, const Page& p) { return ToIdPage(tx.agents().ListAgents(t.id, p)); };
  // A page exactly full at the end has no cursor; a cursor is never given for an empty rest.
  for (int limit : {1, 4, 5, 20, 21, 500}) {
    SCOPED_TRACE("limit " + std::to_string(limit));
    Pages pages = AllPages(*store_, limit, list);
    std::vector<std::string> all;
    for (const auto& [page_ids, next] : pages) {
      EXPECT_FALSE(page_ids.empty());
      EXPECT_LE(static_cast<int>(page_ids.size()), limit);
      all.insert(all.end(), page_ids.begin(), page_ids.end());
    }
    EXPECT_EQ(all, ids);
    EXPECT_EQ(pages.size(), static_cast<size_t>((20 + limit - 1) / limit));
    EXPECT_TRUE(pages.back().second.empty());
  }
  // A deleted agent leaves the list (cursors skip it), and its name is free again.
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.agents().DeleteAgent(t.id, ids[3]); }).ok());
  std::vector<std::string> expected = ids;
  expected.erase(expected.begin() + 3);
  std::vector<std::string> all;
  for (const auto& [page_ids, next] : AllPages(*store_, 3, list)) {
    all.insert(all.end(), page_ids.begin(), page_ids.end());
  }
  EXPECT_EQ(all, expected);
  size_t j = std::find(shuffled.begin(), shuffled.end(), ids[3]) - shuffled.begin();
  Agent reused = NewAgent(t, "agent-" + std::to_string(j));
  EXPECT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(reused); }).ok());
}

TEST_P(StoreTest, ASessionListOfOneTokenHoldsItsSessionsAloneInFullPages) {
  Tenant t = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  std::vector<std::string> mine;
  for (int i = 0; i < 12; ++i) {  // two of another token's sessions after each of "guest"'s
    Session s = NewSession(t, agent);
    s.created_by = i % 3 == 0 ? "guest" : "owner";
    if (s.created_by == "guest") mine.push_back(s.id);
    ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.sessions().InsertSession(s); }).ok());
  }
  for (bool newest_first : {false, true}) {
    PageFn list = [&](Tx& tx, const Page& p) {
      Page q = p;
      q.newest_first = newest_first;
      return ToIdPage(tx.sessions().ListSessions(t.id, agent.id, q, "guest"));
    };
    std::vector<std::string> all;
    for (const auto& [page_ids, next] : AllPages(*store_, 1, list)) {
      EXPECT_EQ(page_ids.size(), 1u);
      if (!next.empty()) EXPECT_EQ(next, EncodeCursor(page_ids.back()));  // one of its own
      all.insert(all.end(), page_ids.begin(), page_ids.end());
    }
    std::vector<std::string> expected = mine;
    if (newest_first) std::reverse(expected.begin(), expected.end());
    EXPECT_EQ(all, expected);
  }
  PageFn everyone = [&](Tx& tx, const Page& p) {
    return ToIdPage(tx.sessions().ListSessions(t.id, agent.id, p, ""));
  };
  size_t n = 0;
  for (const auto& [page_ids, next] : AllPages(*store_, 5, everyone)) n += page_ids.size();
  EXPECT_EQ(n, 12u);
}

TEST_P(StoreTest, ChannelsTheirConversationsAndDeliveriesAreEachRecordedOnce) {
  Tenant t = MakeTenant();
  Tenant u = MakeTenant();
  Agent a = MakeAgent(t, "a");
  Agent b = MakeAgent(t, "b");
  auto channel = [&](const Agent& agent, const std::string& name) {
    Channel c;
    c.id = NewId();
    c.tenant_id = agent.tenant_id;
    c.agent_id = agent.id;
    c.name = name;
    c.settings = "{\"signing_secret\":\"S\"}";
    c.created_by = "token";
    c.created_at = c.updated_at = NowMillis();
    return c;
  };
  Channel hook = channel(a, "hook");
  Channel other = channel(a, "other");
  Channel same_name = channel(b, "hook");  // names are the agent's own
  Channel clash = channel(a, "hook");
  Status st = store_->WriteSync([&](Tx& tx) -> Status {
    for (const Channel* c : {&hook, &other, &same_name}) {
      KEEL_RETURN_IF_ERROR(tx.channels().InsertChannel(*c));
    }
    // A clash is a conflict, and the unit goes on (on PostgreSQL too).
    EXPECT_EQ(tx.channels().InsertChannel(clash).code(), Code::kConflict);
    Channel renamed = other;
    renamed.name = "hook";
    EXPECT_EQ(tx.channels().UpdateChannel(renamed).code(), Code::kConflict);
    renamed.name = "renamed";
    renamed.enabled = false;
    KEEL_RETURN_IF_ERROR(tx.channels().UpdateChannel(renamed));
    ChannelConversation conv{t.id, hook.id, "acme/app", "s1", NowMillis()};
    KEEL_RETURN_IF_ERROR(tx.channels().InsertConversation(conv));
    conv.session_id = "s2";
    EXPECT_EQ(tx.channels().InsertConversation(conv).code(), Code::kConflict);
    ChannelDelivery d{t.id, hook.id, "msg_1", "s1", NowMillis()};
    KEEL_RETURN_IF_ERROR(tx.channels().InsertDelivery(d));
    d.session_id = "s2";
    EXPECT_EQ(tx.channels().InsertDelivery(d).code(), Code::kConflict);
    d.channel_id = other.id;  // delivery ids are the channel's own
    return tx.channels().InsertDelivery(d);
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto got, tx.channels().GetChannel(t.id, other.id));
    EXPECT_EQ(got.name, "renamed");
    EXPECT_FALSE(got.enabled);
    EXPECT_EQ(got.settings, other.settings);
    EXPECT_EQ(*tx.channels().ChannelTenant(hook.id), t.id);
    EXPECT_EQ(tx.channels().ChannelTenant("nope").status().code(), Code::kNotFound);
    EXPECT_EQ(tx.channels().GetConversation(t.id, hook.id, "acme/app")->value().session_id, "s1");
    EXPECT_FALSE(tx.channels().GetConversation(t.id, hook.id, "acme/web")->has_value());
    EXPECT_EQ(*tx.channels().DeliverySession(t.id, hook.id, "msg_1"), "s1");
    EXPECT_EQ(*tx.channels().DeliverySession(t.id, other.id, "msg_1"), "s2");
    KEEL_ASSIGN_OR_RETURN(auto page, tx.channels().ListChannels(t.id, a.id, {"", 1}));
    EXPECT_EQ(page.items.size(), 1u);
    EXPECT_FALSE(page.next_cursor.empty());
    // Another tenant sees none of it.
    EXPECT_EQ(tx.channels().GetChannel(u.id, hook.id).status().code(), Code::kNotFound);
    EXPECT_TRUE(tx.channels().ListChannels(u.id, a.id, {"", 50})->items.empty());
    EXPECT_FALSE(tx.channels().GetConversation(u.id, hook.id, "acme/app")->has_value());
    EXPECT_FALSE(tx.channels().DeliverySession(u.id, hook.id, "msg_1")->has_value());
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  // Another tenant cannot delete it; deleting takes the conversations and deliveries along.
  EXPECT_EQ(
      store_->WriteSync([&](Tx& tx) { return tx.channels().DeleteChannel(u.id, hook.id); }).code(),
      Code::kNotFound);
  ASSERT_TRUE(
      store_->WriteSync([&](Tx& tx) { return tx.channels().DeleteChannel(t.id, hook.id); }).ok());
  st = store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.channels().GetChannel(t.id, hook.id).status().code(), Code::kNotFound);
    EXPECT_FALSE(tx.channels().GetConversation(t.id, hook.id, "acme/app")->has_value());
    EXPECT_FALSE(tx.channels().DeliverySession(t.id, hook.id, "msg_1")->has_value());
    EXPECT_TRUE(tx.channels().DeliverySession(t.id, other.id, "msg_1")->has_value());
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
}

// A polled channel's lease (channels/relay.h): one node holds it at a time; its holder renews
// it, another node takes it only once it ran out, a holder gives it up with until 0; the poll
// state's cursor is kept through it; the runtime-wide list shows who holds what, and a
// channel's deletion takes its lease along (a channel gone cannot be leased).
TEST_P(StoreTest, AChannelsLeaseIsHeldByOneNodeAtATime) {
  Tenant t = MakeTenant();
  Agent a = MakeAgent(t, "a");
  Channel c;
  c.id = NewId();
  c.tenant_id = t.id;
  c.agent_id = a.id;
  c.name = "tg";
  c.kind = "telegram";
  c.settings = "{}";
  c.created_by = "token";
  c.created_at = c.updated_at = 1000;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.channels().InsertChannel(c); }).ok());
  auto lease = [&](const std::string& node, Millis now, Millis until) {
    bool held = false;
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(held, tx.channels().LeaseChannel(t.id, c.id, node, now, until));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return held;
  };
  auto leases = [&] {
    std::vector<ChannelLease> out;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(out, tx.channels().ChannelLeases());
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::erase_if(out, [&](const ChannelLease& l) { return l.channel_id != c.id; });
    return out;
  };
  EXPECT_TRUE(leases().empty());
  EXPECT_TRUE(lease("A", 2000, 17000));    // nobody held it
  EXPECT_FALSE(lease("B", 16999, 31999));  // A's runs until 17000
  EXPECT_TRUE(lease("A", 16000, 31000));   // renewed by its holder
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) {
                    return tx.channels().PutPoll({t.id, c.id, "7/42", "", 16500});
                  })
                  .ok());
  auto held = leases();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].tenant_id, t.id);
  EXPECT_EQ(held[0].holder, "A");
  EXPECT_EQ(held[0].held_until, 31000);
  EXPECT_EQ(held[0].bot, "7");  // the bot its polls asked (the cursor's "BOT_ID/")
  auto bot_of = [&](const std::string& cursor) {
    EXPECT_TRUE(store_
                    ->WriteSync([&](Tx& tx) {
                      return tx.channels().PutPoll({t.id, c.id, cursor, "", 16600});
                    })
                    .ok());
    auto now = leases();
    return now.size() == 1 ? now[0].bot : std::string("(no lease)");
  };
  EXPECT_EQ(bot_of("webhook:0123abcd"), "");  // a webhook's: no bot polled
  EXPECT_EQ(bot_of(""), "");
  EXPECT_EQ(bot_of("x7/42"), "");
  EXPECT_EQ(bot_of("123456789/0"), "123456789");
  EXPECT_EQ(bot_of("7/42"), "7");
  EXPECT_FALSE(lease("B", 30999, 45999));
  EXPECT_TRUE(lease("B", 31001, 46001));   // A's ran out: A was stopped past it
  EXPECT_FALSE(lease("A", 32000, 47000));  // and, resumed, A does not take it back
  EXPECT_TRUE(lease("B", 33000, 0));       // given up: anyone takes it at once
  EXPECT_TRUE(lease("A", 33001, 48001));
  Status st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto poll, tx.channels().GetPoll(t.id, c.id));
    EXPECT_TRUE(poll.has_value());
    if (poll) EXPECT_EQ(poll->cursor, "7/42");  // the cursor is kept through the leases
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(
      store_->WriteSync([&](Tx& tx) { return tx.channels().DeleteChannel(t.id, c.id); }).ok());
  EXPECT_TRUE(leases().empty());
  EXPECT_FALSE(lease("A", 50000, 65000));  // a channel gone is leased to nobody, and no error
  EXPECT_TRUE(leases().empty());
}

// Approval cards (channels/cards.h): a direct conversation's contact, the approvals of
// channel runs still without cards (runtime-wide), an approval's cards, a run's answer, and
// shown cards due once their approval is decided.
TEST_P(StoreTest, ApprovalCardsAreFoundByTheirApprovalAndRun) {
  Tenant t = MakeTenant();
  Tenant u = MakeTenant();
  Agent agent = MakeAgent(t, "agent");
  Session session = NewSession(t, agent);
  store::Run run = NewRun(t, session);
  Message msg = NewMessage(t, session);
  run.message_id = msg.id;
  msg.run_id = run.id;
  Channel bot;
  bot.id = NewId();
  bot.tenant_id = t.id;
  bot.agent_id = agent.id;
  bot.kind = "telegram";
  bot.name = "bot";
  bot.settings = "{}";
  bot.created_by = "token";
  bot.created_at = bot.updated_at = NowMillis();
  Approval ap;
  ap.id = NewId();
  ap.tenant_id = t.id;
  ap.run_id = run.id;
  ap.session_id = session.id;
  ap.agent_id = agent.id;
  ap.call_id = "call_1";
  ap.tool = "notes.append";
  ap.created_at = 100;
  ap.expires_at = NowMillis() + 60000;
  ChannelReply answer;
  answer.id = NewId();
  answer.tenant_id = t.id;
  answer.channel_id = bot.id;
  answer.agent_id = agent.id;
  answer.session_id = session.id;
  answer.run_id = run.id;
  answer.delivery_id = "1000";
  answer.target = "{\"chat_id\":42}";
  answer.user_id = "asker";
  answer.created_at = answer.updated_at = 1;
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(session));
                    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(msg));
                    KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(run));
                    KEEL_RETURN_IF_ERROR(tx.channels().InsertChannel(bot));
                    KEEL_RETURN_IF_ERROR(tx.channels().InsertConversation(
                        {t.id, bot.id, "chat:42", session.id, NowMillis(), "42"}));
                    KEEL_RETURN_IF_ERROR(tx.channels().InsertConversation(
                        {t.id, bot.id, "chat:-5", session.id, NowMillis(), ""}));
                    KEEL_RETURN_IF_ERROR(tx.approvals().InsertApproval(ap));
                    return tx.channels().InsertReply(answer);
                  })
                  .ok());
  using Keys = std::vector<std::pair<std::string, std::string>>;
  auto to_card = [&] {
    return ReadValue<Keys>(*store_, [&](Tx& tx) { return tx.channels().ApprovalsToCard(10); });
  };
  EXPECT_EQ(to_card(), Keys({{t.id, ap.id}}));

  ChannelReply card = answer;
  card.id = NewId();
  card.delivery_id = "approval:" + ap.id + ":owner";
  card.approval_id = ap.id;
  card.user_id = "owner";
  card.status = "shown";
  card.message = "{\"chat_id\":42,\"message_id\":7}";
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.channels().InsertReply(card); }).ok());
  EXPECT_TRUE(to_card().empty()) << "an approval with a card is carded";
  // A direct conversation opened without its contact gets one, once; another tenant's is not
  // touched.
  ASSERT_TRUE(
      store_
          ->WriteSync([&](Tx& tx) -> Status {
            KEEL_RETURN_IF_ERROR(tx.channels().InsertConversation(
                {t.id, bot.id, "chat:77", session.id, NowMillis(), ""}));
            EXPECT_FALSE(*tx.channels().SetConversationContact(u.id, bot.id, "chat:77", "77"));
            EXPECT_TRUE(*tx.channels().SetConversationContact(t.id, bot.id, "chat:77", "77"));
            EXPECT_FALSE(*tx.channels().SetConversationContact(t.id, bot.id, "chat:77", "78"));
            EXPECT_FALSE(*tx.channels().SetConversationContact(t.id, bot.id, "chat:78", "78"));
            return Status::Ok();
          })
          .ok());
  EXPECT_EQ(
      ReadValue<std::optional<std::string>>(
          *store_, [&](Tx& tx) { return tx.channels().ContactConversation(t.id, bot.id, "77"); }),
      std::optional<std::string>("chat:77"));
  Status st = store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(*tx.channels().ContactConversation(t.id, bot.id, "42"), "chat:42");
    EXPECT_FALSE(tx.channels().ContactConversation(t.id, bot.id, "")->has_value());
    EXPECT_FALSE(tx.channels().ContactConversation(t.id, bot.id, "43")->has_value());
    EXPECT_FALSE(tx.channels().ContactConversation(u.id, bot.id, "42")->has_value());
    EXPECT_EQ(tx.channels().GetConversation(t.id, bot.id, "chat:42")->value().contact, "42");
    KEEL_ASSIGN_OR_RETURN(auto cards, tx.channels().ApprovalCards(t.id, ap.id));
    EXPECT_EQ(cards.size(), 1u);
    if (!cards.empty()) {
      EXPECT_EQ(cards[0].id, card.id);
      EXPECT_EQ(cards[0].user_id, "owner");
      EXPECT_EQ(cards[0].message, card.message);
    }
    EXPECT_TRUE(tx.channels().ApprovalCards(u.id, ap.id)->empty());
    EXPECT_TRUE(tx.channels().ApprovalCards(t.id, "")->empty()) << "answers are no one's cards";
    KEEL_ASSIGN_OR_RETURN(auto asked, tx.channels().RunReply(t.id, run.id));
    EXPECT_TRUE(asked.has_value() && asked->id == answer.id && asked->user_id == "asker");
    EXPECT_FALSE(tx.channels().RunReply(u.id, run.id)->has_value());
    KEEL_ASSIGN_OR_RETURN(auto due, tx.channels().DueReplies(NowMillis(), "node", 10));
    EXPECT_TRUE(due.empty()) << "a shown card waits while its approval does";
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();

  ap.status = "approved";
  ap.decided_by = "user:owner";
  ap.decided_at = NowMillis();
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.approvals().UpdateApproval(ap); }).ok());
  auto due = ReadValue<std::vector<ChannelReply>>(
      *store_, [&](Tx& tx) { return tx.channels().DueReplies(NowMillis(), "node", 10); });
  ASSERT_EQ(due.size(), 1u) << "a shown card of a decided approval is due (to be edited)";
  EXPECT_EQ(due[0].id, card.id);
  EXPECT_TRUE(to_card().empty());
}

TEST_P(StoreTest, UsersIdentitiesMembersAndAccessAreEachTheirTenants) {
  Tenant t = MakeTenant();
  Tenant u = MakeTenant();
  Agent a = MakeAgent(t, "a");
  const Millis now = NowMillis();
  User ann{NewId(), t.id, "Ann", "", now, now};
  User bob{NewId(), t.id, "Bob", "", now, now};
  Status st = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.users().InsertUser(ann));
    KEEL_RETURN_IF_ERROR(tx.users().InsertUser(bob));
    EXPECT_EQ(tx.users().InsertUser(ann).code(), Code::kConflict);
    Identity i{t.id, "telegram", "42", ann.id, "Ann L", now};
    KEEL_RETURN_IF_ERROR(tx.users().InsertIdentity(i));
    // One identity, one user: the unit goes on after the clash (on PostgreSQL too).
    Identity clash = i;
    clash.user_id = bob.id;
    EXPECT_EQ(tx.users().InsertIdentity(clash).code(), Code::kConflict);
    KEEL_RETURN_IF_ERROR(tx.users().InsertIdentity({t.id, "slack", "42", bob.id, "", now}));
    KEEL_RETURN_IF_ERROR(tx.users().PutMember({t.id, a.id, ann.id, "guest", now, now}));
    // Replaced: the role and updated_at change, created_at stays.
    KEEL_RETURN_IF_ERROR(tx.users().PutMember({t.id, a.id, ann.id, "owner", now + 5, now + 5}));
    KEEL_RETURN_IF_ERROR(tx.users().PutMember({t.id, a.id, bob.id, "user", now, now}));
    return tx.users().PutAccess({t.id, a.id, "protected", true, now});
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto found, tx.users().FindIdentity(t.id, "telegram", "42"));
    EXPECT_TRUE(found && found->user_id == ann.id && found->name == "Ann L");
    EXPECT_EQ(tx.users().FindIdentity(t.id, "slack", "42")->value().user_id, bob.id);
    EXPECT_FALSE(tx.users().FindIdentity(t.id, "discord", "42")->has_value());
    KEEL_ASSIGN_OR_RETURN(auto member, tx.users().GetMember(t.id, a.id, ann.id));
    EXPECT_TRUE(member && member->role == "owner" && member->created_at == now &&
                member->updated_at == now + 5);
    KEEL_ASSIGN_OR_RETURN(auto page, tx.users().ListMembers(t.id, a.id, {"", 1}));
    EXPECT_EQ(page.items.size(), 1u);
    EXPECT_FALSE(page.next_cursor.empty());
    KEEL_ASSIGN_OR_RETURN(auto rest, tx.users().ListMembers(t.id, a.id, {page.next_cursor, 5}));
    EXPECT_EQ(rest.items.size(), 1u);
    EXPECT_TRUE(rest.next_cursor.empty());
    EXPECT_EQ(tx.users().UserMemberships(t.id, bob.id)->size(), 1u);
    EXPECT_EQ(tx.users().ListUsers(t.id, {"", 50})->items.size(), 2u);
    EXPECT_EQ(tx.users().GetAccess(t.id, a.id)->value().level, "protected");
    // Another tenant sees none of it, and has its own identities.
    EXPECT_EQ(tx.users().GetUser(u.id, ann.id).status().code(), Code::kNotFound);
    EXPECT_FALSE(tx.users().FindIdentity(u.id, "telegram", "42")->has_value());
    EXPECT_FALSE(tx.users().GetMember(u.id, a.id, ann.id)->has_value());
    EXPECT_TRUE(tx.users().ListMembers(u.id, a.id, {"", 50})->items.empty());
    EXPECT_TRUE(tx.users().ListUsers(u.id, {"", 50})->items.empty());
    EXPECT_FALSE(tx.users().GetAccess(u.id, a.id)->has_value());
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  // An identity or a role of another tenant cannot name this tenant's user.
  EXPECT_FALSE(store_
                   ->WriteSync([&](Tx& tx) {
                     return tx.users().InsertIdentity({u.id, "telegram", "42", ann.id, "", now});
                   })
                   .ok());
  EXPECT_FALSE(store_
                   ->WriteSync([&](Tx& tx) {
                     return tx.users().PutMember({u.id, a.id, ann.id, "owner", now, now});
                   })
                   .ok());
  st = store_->WriteSync([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.users().DeleteMember(u.id, a.id, ann.id).code(), Code::kNotFound);
    EXPECT_EQ(tx.users().DeleteIdentity(u.id, "telegram", "42").code(), Code::kNotFound);
    KEEL_RETURN_IF_ERROR(tx.users().DeleteMember(t.id, a.id, bob.id));
    return tx.users().DeleteIdentity(t.id, "slack", "42");
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// access::AdmitSender over a real store: who a platform's message is run for, and as what.
TEST_P(StoreTest, AChatSenderIsAdmittedByTheAgentsAccessLevel) {
  Tenant t = MakeTenant();
  Agent a = MakeAgent(t, "a");
  const access::Sender stranger{"telegram", "777", "Zed"};
  const secrets::Vault vault =
      secrets::Vault::FromKekText("qrgtqbq0i7Hk1I0qk1IeX2Q4bHh2yv6rk0Dq0Ys0RkA=");
  // `recent`: the sender's messages this minute, this one included.
  auto admit = [&](const access::Sender& who, const std::string& text, bool direct = true,
                   bool addressed = true, int recent = 1,
                   const std::string& channel_role = "user") {
    access::Admission out;
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(out, access::AdmitSender(tx, vault, t.id, a.id, channel_role, who, text,
                                                     direct, addressed, recent, true, NowMillis()));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  };
  auto set_access = [&](const std::string& level, const std::string& code) {
    Status st = store_->WriteSync([&](Tx& tx) -> Status {
      if (!code.empty()) {
        KEEL_RETURN_IF_ERROR(
            vault.Put(tx, t.id, access::AccessCodeSecret(a.id), code, NowMillis()).status());
      }
      KEEL_RETURN_IF_ERROR(tx.users().PutAccess({t.id, a.id, level, !code.empty(), 0}));
      // The secret's image rides on an event, as every write's does.
      return tx.events().Append({t.id, "agent.access_changed@v1", a.id, "", "", {}});
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  };
  // Private (no level set): a notice naming the identity, nothing made; a few a minute, then
  // silence.
  auto refused = admit(stranger, "hi");
  EXPECT_FALSE(refused.take);
  EXPECT_NE(refused.notice.find("telegram:777"), std::string::npos) << refused.notice;
  EXPECT_NE(admit(stranger, "hi", true, true, access::kNoticesPerMinute).notice, "");
  auto quiet = admit(stranger, "hi", true, true, access::kNoticesPerMinute + 1);
  EXPECT_FALSE(quiet.take);
  EXPECT_EQ(quiet.notice, "");
  // Unaddressed in a group: passed over in silence.
  auto silent = admit(stranger, "chatter", false, false);
  EXPECT_FALSE(silent.take);
  EXPECT_EQ(silent.notice, "");
  // Protected: not in a group, not a wrong code, not past a guest's rate; the code (or /start
  // CODE) makes a guest and is not run.
  set_access("protected", "open sesame 1");
  EXPECT_NE(admit(stranger, "open sesame 1", false).notice.find("direct message"),
            std::string::npos);
  EXPECT_FALSE(admit(stranger, "open sesame 2").take);
  const int over = access::kGuestMessagesPerMinute + 1;
  auto guessing = admit(stranger, "open sesame 1", true, true, over);
  EXPECT_FALSE(guessing.take);
  EXPECT_EQ(guessing.notice, "");
  auto granted = admit(stranger, "/start  open sesame 1 ");
  EXPECT_FALSE(granted.take);
  EXPECT_NE(granted.notice.find("granted"), std::string::npos) << granted.notice;
  ASSERT_FALSE(granted.user_id.empty());
  // A member now: runs with the lower of the channel's role and its own.
  auto in = admit(stranger, "what can you do");
  EXPECT_TRUE(in.take);
  EXPECT_EQ(in.role, "guest");
  EXPECT_EQ(in.user_id, granted.user_id);
  // The code again is never run, a member's included.
  auto again = admit(stranger, "open sesame 1");
  EXPECT_FALSE(again.take);
  EXPECT_NE(again.notice.find("already"), std::string::npos) << again.notice;
  // A guest past its rate is told once, then passed over.
  EXPECT_NE(admit(stranger, "x", true, true, over).notice.find("faster"), std::string::npos);
  auto past = admit(stranger, "x", true, true, over + 1);
  EXPECT_FALSE(past.take);
  EXPECT_EQ(past.notice, "");
  // Public: a new sender is a guest at once.
  set_access("public", "");
  const access::Sender newcomer{"discord", "555", ""};
  auto guest = admit(newcomer, "hello");
  EXPECT_TRUE(guest.take);
  EXPECT_EQ(guest.role, "guest");
  Status st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto user, tx.users().GetUser(t.id, guest.user_id));
    EXPECT_EQ(user.name, "discord:555");
    KEEL_ASSIGN_OR_RETURN(auto member, tx.users().GetMember(t.id, a.id, guest.user_id));
    EXPECT_TRUE(member && member->role == "guest");
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  // An owner is heard in a group unaddressed, with the channel's role at most; after a merge,
  // the merged user's identity speaks for the user it went to.
  st = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(access::SetMember(tx, t.id, a.id, granted.user_id, "owner", NowMillis()));
    return access::MergeUsers(tx, t.id, guest.user_id, granted.user_id, NowMillis());
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto owner = admit(newcomer, "chatter", false, false, 1, "guest");
  EXPECT_TRUE(owner.take);
  EXPECT_EQ(owner.role, "guest");
  EXPECT_EQ(owner.user_id, granted.user_id);
  EXPECT_EQ(admit(stranger, "x", false, false, over + 5, "owner").role, "owner");  // no rate
  // In a read-only unit a decision that writes says so instead.
  access::Admission read;
  st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(
        read, access::AdmitSender(tx, vault, t.id, a.id, "user", {"slack", "U9", ""}, "hi", true,
                                  true, 1, false, NowMillis()));
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(read.needs_write);
  EXPECT_FALSE(read.take);
}

TEST(AccessRulesTest, RolesCodesAndLevels) {
  EXPECT_EQ(access::LowerRole("owner", "guest"), "guest");
  EXPECT_EQ(access::LowerRole("user", "owner"), "user");
  EXPECT_EQ(access::LowerRole("guest", "guest"), "guest");
  for (const char* role : {"owner", "user", "guest"}) EXPECT_TRUE(access::ValidRole(role));
  for (const char* role : {"", "admin", "Owner"}) EXPECT_FALSE(access::ValidRole(role));
  EXPECT_TRUE(access::CheckAccessCode("12345678").ok());
  for (std::string bad : {std::string("1234567"), std::string(129, 'x'), std::string(" 12345678"),
                          std::string("12345678 "), std::string("1234\n5678")}) {
    EXPECT_FALSE(access::CheckAccessCode(bad).ok()) << bad;
  }
  const std::string code = access::NewAccessCode();
  EXPECT_EQ(code.size(), 12u);
  EXPECT_TRUE(access::CheckAccessCode(code).ok());
  EXPECT_NE(access::NewAccessCode(), code);
  // Each agent's code is a secret of its own.
  EXPECT_NE(access::AccessCodeSecret("a"), access::AccessCodeSecret("b"));
  EXPECT_TRUE(
      secrets::Vault::CheckName(access::AccessCodeSecret("01a24e46-1da9-71b1-917b-da7049e04af5"))
          .ok());
}

TEST_P(StoreTest, TenantsDoNotSeeEachOther) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  Agent agent = MakeAgent(a, "mine");
  Status st = store_->Read([&](Tx& tx) -> Status {
    EXPECT_TRUE(tx.agents().GetAgent(a.id, agent.id).ok());
    EXPECT_EQ(tx.agents().GetAgent(b.id, agent.id).status().code(), Code::kNotFound);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok());
  // The same name is free in another tenant, taken in the same one.
  MakeAgent(b, "mine");
  Agent dup;
  dup.id = NewId();
  dup.tenant_id = a.id;
  dup.name = "mine";
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(dup); }).code(),
            Code::kConflict);
}

// What only the platform admin grants: off in a new tenant, set for one tenant only.
TEST_P(StoreTest, TenantSettingsStartOffAndChangeForOneTenant) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  EXPECT_FALSE(a.allow_host_exec);
  a.allow_host_exec = true;
  ASSERT_TRUE(
      store_->WriteSync([&](Tx& tx) { return tx.tenants().UpdateTenantSettings(a); }).ok());
  Tenant gone{NewId(), "gone", 0};
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.tenants().UpdateTenantSettings(gone); })
                .code(),
            Code::kNotFound);
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(Tenant got_a, tx.tenants().GetTenant(a.id));
    KEEL_ASSIGN_OR_RETURN(Tenant got_b, tx.tenants().GetTenant(b.id));
    EXPECT_TRUE(got_a.allow_host_exec);
    EXPECT_FALSE(got_a.allow_stdio_mcp);
    EXPECT_FALSE(got_b.allow_host_exec);
    EXPECT_FALSE(got_b.allow_stdio_mcp);
    KEEL_ASSIGN_OR_RETURN(auto all, tx.tenants().ListTenants());
    for (const auto& t : all) EXPECT_EQ(t.allow_host_exec, t.id == a.id) << t.id;
    return Status::Ok();
  }).ok());
}

// The runtime keeps a turn's settings rows between turns while this number stays the same
// (runtime/settings_cache.h): every write of one of them must move it, in its own unit, for its
// tenant only. A write that left it alone would leave every node using the old rows.
TEST_P(StoreTest, SettingsVersionMovesWithEveryWriteOfATurnsSettingsRowsAndForItsTenantOnly) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  Agent agent = MakeAgent(a, "helper");
  Agent theirs = MakeAgent(b, "helper");
  Session session = NewSession(a, agent);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.sessions().InsertSession(session); }).ok());
  auto version = [&](const Tenant& t) {
    int64_t v = -1;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().SettingsVersionLater(t.id, v));
      return tx.Flush();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return v;
  };
  auto intake_version = [&] {
    int64_t v = -1;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto read, tx.runs().ReadForIntake(a.id, session.id));
      v = read.settings_version;
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return v;
  };
  EXPECT_EQ(version(a), 0);
  EXPECT_EQ(intake_version(), 0);

  Skill skill;
  skill.tenant_id = a.id;
  skill.name = "deploy";
  skill.description = "Deploys";
  skill.hash = std::string(64, 'a');
  skill.files = Json{{"SKILL.md", "---\nname: deploy\n---\n"}};
  skill.created_at = skill.updated_at = 1;
  Plugin plugin = NewPlugin(a, "audit");
  const std::vector<std::pair<std::string, WriteFn>> writes = {
      {"stop",
       [&](Tx& tx) {
         return tx.policies().PutStop({a.id, agent.id, "why", "t", 1});
       }},
      {"stop again",
       [&](Tx& tx) {
         return tx.policies().PutStop({a.id, agent.id, "why not", "t", 2});
       }},
      {"stop lifted", [&](Tx& tx) { return tx.policies().DeleteStop(a.id, agent.id); }},
      {"working memory",
       [&](Tx& tx) {
         return tx.memory().PutWorkingMemory({a.id, agent.id, "x", 1});
       }},
      {"working memory changed",
       [&](Tx& tx) {
         return tx.memory().PutWorkingMemory({a.id, agent.id, "y", 2});
       }},
      {"skill", [&](Tx& tx) { return tx.skills().UpsertSkill(skill); }},
      {"skill replaced",
       [&](Tx& tx) {
         skill.description = "Ships";
         return tx.skills().UpsertSkill(skill);
       }},
      {"skill assigned",
       [&](Tx& tx) {
         return tx.skills().AssignSkill({a.id, agent.id, "deploy", 1});
       }},
      {"skill unassigned",
       [&](Tx& tx) { return tx.skills().UnassignSkill(a.id, agent.id, "deploy"); }},
      {"skill deleted", [&](Tx& tx) { return tx.skills().DeleteSkill(a.id, "deploy"); }},
      {"plugin", [&](Tx& tx) { return tx.plugins().UpsertPlugin(plugin); }},
      {"plugin enabled",
       [&](Tx& tx) {
         return tx.plugins().EnablePlugin({a.id, "audit", agent.id, 1});
       }},
      {"plugin disabled",
       [&](Tx& tx) { return tx.plugins().DisablePlugin(a.id, "audit", agent.id); }},
      {"plugin deleted", [&](Tx& tx) { return tx.plugins().DeletePlugin(a.id, "audit"); }},
  };
  int64_t last = 0;
  for (const auto& [what, write] : writes) {
    Status st = store_->WriteSync(write);
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    int64_t now = version(a);
    EXPECT_GT(now, last) << what << " did not move the version";
    EXPECT_EQ(intake_version(), now) << what;
    EXPECT_EQ(version(b), 0) << what << " moved another tenant's version";
    last = now;
  }
  // What a turn writes is not a setting: the version stays.
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(NewMessage(a, session)));
                    return tx.sessions().InsertSession(NewSession(a, agent));
                  })
                  .ok());
  EXPECT_EQ(version(a), last);
  // A unit that fails after writing a setting leaves no trace of it.
  Status failed = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.policies().PutStop({a.id, agent.id, "why", "t", 3}));
    return Internal("changed its mind");
  });
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(version(a), last);
  // And B's own writes move B's alone.
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) {
                    return tx.memory().PutWorkingMemory({b.id, theirs.id, "z", 1});
                  })
                  .ok());
  EXPECT_GT(version(b), 0);
  EXPECT_EQ(version(a), last);
}

TEST_P(StoreTest, SecretsAreKeptPerTenantReplacedInPlaceAndDeleted) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  Status put = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.secrets().InsertTenantKey({a.id, "wrapped-a", "fp", 1}));
    KEEL_RETURN_IF_ERROR(tx.secrets().PutSecret({a.id, "zeta", "sealed-1", 10, 10}));
    KEEL_RETURN_IF_ERROR(tx.secrets().PutSecret({a.id, "alpha", "sealed-2", 11, 11}));
    return tx.secrets().PutSecret({b.id, "alpha", "sealed-b", 12, 12});
  });
  ASSERT_TRUE(put.ok()) << put.ToString();
  // A second data key for a tenant is a conflict; replacing a value keeps created_at.
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) {
              return tx.secrets().InsertTenantKey({a.id, "other", "fp", 2});
            }).code(),
            Code::kConflict);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.secrets().PutSecret({a.id, "zeta", "sealed-3", 99, 20});
  }).ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto key = tx.secrets().GetTenantKey(a.id);
    EXPECT_TRUE(key.ok() && key->has_value() && (*key)->wrapped == "wrapped-a");
    auto none = tx.secrets().GetTenantKey(b.id);
    EXPECT_TRUE(none.ok() && !none->has_value());
    auto list = tx.secrets().ListSecrets(a.id);
    EXPECT_TRUE(list.ok());
    if (list.ok()) {
      EXPECT_EQ(list->size(), 2u);
      if (list->size() != 2u) return Status::Ok();
      EXPECT_EQ((*list)[0].name, "alpha");
      EXPECT_EQ((*list)[1].name, "zeta");
      EXPECT_EQ((*list)[1].sealed, "sealed-3");
      EXPECT_EQ((*list)[1].created_at, 10);
      EXPECT_EQ((*list)[1].updated_at, 20);
    }
    auto other = tx.secrets().GetSecret(b.id, "zeta");
    EXPECT_EQ(other.status().code(), Code::kNotFound);
    EXPECT_EQ(other.status().message(), "secret not found: zeta");
    EXPECT_EQ(tx.secrets().GetSecret(b.id, "alpha")->sealed, "sealed-b");
    return Status::Ok();
  }).ok());
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.secrets().DeleteSecret(b.id, "zeta"); })
                .code(),
            Code::kNotFound);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.secrets().DeleteSecret(a.id, "zeta"); })
                  .ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.secrets().ListSecrets(a.id)->size(), 1u);
    EXPECT_EQ(tx.secrets().ListSecrets(b.id)->size(), 1u);
    return Status::Ok();
  }).ok());
}

TEST_P(StoreTest, PoliciesAndEmergencyStops) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  EXPECT_FALSE(ReadValue<bool>(*store_, [&](Tx& tx) -> Result<bool> {
    KEEL_ASSIGN_OR_RETURN(auto p, tx.policies().GetPolicy(a.id, ""));
    return p.has_value();
  }));
  Json frame = {{"rules", Json::array({{{"tool", "*"}, {"rights", {"read"}}}})}};
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.policies().PutPolicy({a.id, "", frame, 1}));
    KEEL_RETURN_IF_ERROR(tx.policies().PutPolicy({a.id, "agent-1", Json::object(), 2}));
    return tx.policies().PutPolicy({a.id, "", {{"deny", {"x"}}}, 3});  // replaces the frame
  }).ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto got = tx.policies().GetPolicy(a.id, "");
    EXPECT_TRUE(got.ok() && got->has_value());
    if (got.ok() && got->has_value()) {
      EXPECT_EQ((*got)->body, Json({{"deny", {"x"}}}));
      EXPECT_EQ((*got)->updated_at, 3);
    }
    EXPECT_TRUE(tx.policies().GetPolicy(a.id, "agent-1")->has_value());
    EXPECT_FALSE(tx.policies().GetPolicy(b.id, "")->has_value());
    return Status::Ok();
  }).ok());

  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.policies().PutStop({a.id, "agent-9", "runaway", "tok", 5}));
    KEEL_RETURN_IF_ERROR(tx.policies().PutStop({a.id, "", "incident", "tok", 6}));
    return tx.policies().PutStop({a.id, "", "incident 2", "tok2", 7});
  }).ok());
  auto stops = ReadValue<std::vector<EmergencyStop>>(
      *store_, [&](Tx& tx) { return tx.policies().ListStops(a.id); });
  ASSERT_EQ(stops.size(), 2u);
  EXPECT_EQ(stops[0].agent_id, "");
  EXPECT_EQ(stops[0].reason, "incident 2");
  EXPECT_EQ(stops[1].agent_id, "agent-9");
  EXPECT_TRUE(ReadValue<std::vector<EmergencyStop>>(
                  *store_, [&](Tx& tx) { return tx.policies().ListStops(b.id); })
                  .empty());
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.policies().DeleteStop(b.id, ""); }).code(),
            Code::kNotFound);
  EXPECT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.policies().DeleteStop(a.id, ""); }).ok());
  EXPECT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.policies().DeletePolicy(a.id, ""); })
                  .ok());
  Status again = store_->WriteSync([&](Tx& tx) { return tx.policies().DeletePolicy(a.id, ""); });
  EXPECT_EQ(again.code(), Code::kNotFound);
  EXPECT_EQ(again.message(), "no tenant policy is set");
  EXPECT_EQ(ReadValue<std::vector<EmergencyStop>>(
                *store_, [&](Tx& tx) { return tx.policies().ListStops(a.id); })
                .size(),
            1u);
}

// Reads issued ...Later are filled by the end of the read, each with its own tenant's rows,
// also when several are outstanding at once and other reads come between them (on
// PostgreSQL they go out together with the next statement that waits).
TEST_P(StoreTest, LaterReadsAreFilledByTheEndOfTheReadEachWithItsTenantsRows) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  Agent agent = MakeAgent(a, "agent");
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    KEEL_RETURN_IF_ERROR(tx.policies().PutStop({a.id, "", "incident", "tok", 6}));
                    KEEL_RETURN_IF_ERROR(tx.policies().PutStop({b.id, "", "other", "tok", 7}));
                    KEEL_RETURN_IF_ERROR(
                        tx.memory().PutWorkingMemory({a.id, agent.id, "remember the milk", 42}));
                    return tx.memory().PutWorkingMemory({b.id, agent.id, "not yours", 43});
                  })
                  .ok());
  std::vector<EmergencyStop> stops_a, stops_b;
  WorkingMemory memory_a, memory_b;
  std::vector<PluginStamp> stamps;
  std::vector<Skill> skills;
  Agent read_agent;
  ASSERT_TRUE(
      store_
          ->Read([&](Tx& tx) -> Status {
            KEEL_RETURN_IF_ERROR(tx.policies().ListStopsLater(a.id, stops_a));
            KEEL_RETURN_IF_ERROR(tx.memory().GetWorkingMemoryLater(b.id, agent.id, memory_b));
            KEEL_RETURN_IF_ERROR(tx.plugins().PluginStampsForAgentLater(a.id, agent.id, stamps));
            // A read that waits, between them.
            KEEL_ASSIGN_OR_RETURN(read_agent, tx.agents().GetAgent(a.id, agent.id));
            KEEL_RETURN_IF_ERROR(tx.memory().GetWorkingMemoryLater(a.id, agent.id, memory_a));
            KEEL_RETURN_IF_ERROR(tx.skills().SkillsForAgentLater(a.id, agent.id, false, skills));
            return tx.policies().ListStopsLater(b.id, stops_b);  // the last, collected at the end
          })
          .ok());
  EXPECT_EQ(read_agent.id, agent.id);
  ASSERT_EQ(stops_a.size(), 1u);
  EXPECT_EQ(stops_a[0].tenant_id, a.id);
  EXPECT_EQ(stops_a[0].reason, "incident");
  ASSERT_EQ(stops_b.size(), 1u);
  EXPECT_EQ(stops_b[0].reason, "other");
  EXPECT_EQ(memory_a.text, "remember the milk");
  EXPECT_EQ(memory_a.updated_at, 42);
  EXPECT_EQ(memory_b.text, "not yours");
  EXPECT_EQ(memory_b.tenant_id, b.id);
  EXPECT_TRUE(stamps.empty());
  EXPECT_TRUE(skills.empty());
  // An agent without working memory reads as empty, not as the last one read.
  WorkingMemory none;
  none.text = "stale";
  ASSERT_TRUE(store_
                  ->Read([&](Tx& tx) {
                    return tx.memory().GetWorkingMemoryLater(a.id, "no-such-agent", none);
                  })
                  .ok());
  EXPECT_EQ(none.text, "");
  EXPECT_EQ(none.updated_at, 0);
}

// A run's recent events: among the tenant's newest `window`, newest first, another tenant's
// events not counted in the window.
TEST_P(StoreTest, RecentRunEventsAreTheRunsAmongTheTenantsNewest) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  const std::string run = NewId();
  ASSERT_TRUE(
      store_
          ->WriteSync([&](Tx& tx) -> Status {
            KEEL_RETURN_IF_ERROR(tx.events().Append({a.id, "first@v1", "", "", run, {}}));
            for (int i = 0; i < 5; ++i) {
              KEEL_RETURN_IF_ERROR(tx.events().Append({a.id, "other@v1", "", "", NewId(), {}}));
              KEEL_RETURN_IF_ERROR(tx.events().Append({b.id, "theirs@v1", "", "", run, {}}));
            }
            return tx.events().Append({a.id, "second@v1", "", "", run, {}});
          })
          .ok());
  auto types = [&](const Tenant& t, int window) {
    auto events = ReadValue<std::vector<Event>>(
        *store_, [&](Tx& tx) { return tx.events().RecentRunEvents(t.id, run, window); });
    std::vector<std::string> out;
    for (const auto& e : events) out.push_back(e.type);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(types(a, 7), V({"second@v1", "first@v1"}));
  EXPECT_EQ(types(a, 100), V({"second@v1", "first@v1"}));
  EXPECT_EQ(types(a, 6), V({"second@v1"})) << "the first is the seventh newest";
  EXPECT_EQ(types(a, 1), V({"second@v1"}));
  EXPECT_EQ(types(b, 3).size(), 3u);
}

TEST_P(StoreTest, ApprovalsAndStandingApprovals) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  Agent agent = MakeAgent(a, "agent");
  Session session = NewSession(a, agent);
  store::Run run = NewRun(a, session);
  Message msg = NewMessage(a, session);
  run.message_id = msg.id;
  msg.run_id = run.id;
  run.requested_by = "token-1";
  run.caller_role = "guest";
  run.user_id = "user-1";
  run.channel_id = "channel-1";
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(session));
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(msg));
    return tx.runs().InsertRun(run);
  }).ok());
  auto stored_run =
      ReadValue<store::Run>(*store_, [&](Tx& tx) { return tx.runs().GetRun(a.id, run.id); });
  EXPECT_EQ(stored_run.requested_by, "token-1");
  EXPECT_EQ(stored_run.caller_role, "guest");
  EXPECT_EQ(stored_run.user_id, "user-1");
  EXPECT_EQ(stored_run.channel_id, "channel-1");

  auto approval = [&](const std::string& call_id, Millis expires_at) {
    Approval ap;
    ap.id = NewId();
    ap.tenant_id = a.id;
    ap.run_id = run.id;
    ap.session_id = session.id;
    ap.agent_id = agent.id;
    ap.call_id = call_id;
    ap.tool = "notes.append";
    ap.arguments = {{"line", call_id}};
    ap.reason = "always";
    ap.requested_by = "token-1";
    ap.created_at = 100;
    ap.expires_at = expires_at;
    return ap;
  };
  Approval first = approval("call_1", 1000), second = approval("call_2", 500),
           third = approval("call_3", 5000);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.approvals().InsertApproval(first));
    KEEL_RETURN_IF_ERROR(tx.approvals().InsertApproval(second));
    return tx.approvals().InsertApproval(third);
  }).ok());
  Approval dup = approval("call_1", 1000);
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.approvals().InsertApproval(dup); }).code(),
            Code::kConflict);
  first.status = "approved";
  first.amended_arguments = {{"line", "amended"}};
  first.decided_by = "token-2";
  first.decision_reason = "fine";
  first.decided_at = 200;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.approvals().UpdateApproval(first); })
                  .ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto got, tx.approvals().GetApproval(a.id, first.id));
    EXPECT_EQ(got.status, "approved");
    EXPECT_EQ(got.amended_arguments, Json({{"line", "amended"}}));
    EXPECT_EQ(got.arguments, Json({{"line", "call_1"}}));
    EXPECT_EQ(got.decided_at, std::optional<Millis>(200));
    EXPECT_TRUE(tx.approvals().GetApproval(a.id, second.id)->amended_arguments.is_null());
    EXPECT_EQ(tx.approvals().GetApproval(b.id, first.id).status().code(), Code::kNotFound);
    auto pending = tx.approvals().ListApprovals(a.id, "pending", {"", 1});
    EXPECT_TRUE(pending.ok());
    if (!pending.ok()) return Status::Ok();
    EXPECT_EQ(Ids(pending->items), std::vector<std::string>({second.id}));
    auto rest = tx.approvals().ListApprovals(a.id, "pending", {pending->next_cursor, 10});
    EXPECT_EQ(Ids(rest->items), std::vector<std::string>({third.id}));
    EXPECT_EQ(tx.approvals().ListApprovals(a.id, "", {"", 10})->items.size(), 3u);
    EXPECT_TRUE(tx.approvals().ListApprovals(b.id, "", {"", 10})->items.empty());
    auto found = tx.approvals().FindApprovalForCall(a.id, run.id, "call_2");
    EXPECT_TRUE(found.ok() && found->has_value() && (*found)->id == second.id);
    EXPECT_FALSE(tx.approvals().FindApprovalForCall(a.id, run.id, "call_9")->has_value());
    // Runtime-wide: pending ones past their expiry, oldest expiry first.
    auto expired = tx.approvals().ExpiredApprovals(6000, 10);
    EXPECT_EQ(Ids(*expired), std::vector<std::string>({second.id, third.id}));
    EXPECT_EQ(Ids(*tx.approvals().ExpiredApprovals(600, 10)),
              std::vector<std::string>({second.id}));
    return Status::Ok();
  }).ok());

  StandingApproval any{NewId(), a.id, agent.id, "notes.append", Json(), "token-2", first.id,
                       100, 1000, std::nullopt};
  StandingApproval matching{NewId(), a.id, agent.id, "notes.append", {{"line", "x"}},
                            "token-2", first.id, 100, 5000, std::nullopt};
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.approvals().InsertStanding(any));
    return tx.approvals().InsertStanding(matching);
  }).ok());
  auto active = [&](Millis now) {
    return Ids(ReadValue<std::vector<StandingApproval>>(*store_, [&](Tx& tx) {
      return tx.approvals().ActiveStanding(a.id, agent.id, "notes.append", now);
    }));
  };
  EXPECT_EQ(active(500), std::vector<std::string>({any.id, matching.id}));
  EXPECT_EQ(active(2000), std::vector<std::string>({matching.id}));
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.approvals().RevokeStanding(a.id, matching.id, 600);
  }).ok());
  EXPECT_EQ(active(500), std::vector<std::string>({any.id}));
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) {
              return tx.approvals().RevokeStanding(a.id, matching.id, 700);
            }).code(),
            Code::kNotFound);
  auto all = ReadValue<std::vector<StandingApproval>>(
      *store_, [&](Tx& tx) { return tx.approvals().ListStanding(a.id); });
  ASSERT_EQ(all.size(), 2u);
  EXPECT_TRUE(all[0].arguments_match.is_null());
  EXPECT_EQ(all[1].arguments_match, Json({{"line", "x"}}));
  EXPECT_EQ(all[1].revoked_at, std::optional<Millis>(600));
}

TEST_P(StoreTest, McpServersAreNamedUniquelyPerTenant) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  McpServer fs{NewId(), a.id, "fs", "stdio", {{"command", {"npx", "server"}}}, 1};
  McpServer web{NewId(), a.id, "web", "http", {{"url", "http://127.0.0.1:1/mcp"}}, 2};
  McpServer other{NewId(), b.id, "fs", "stdio", Json::object(), 3};
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.mcp_servers().InsertMcpServer(web));
    KEEL_RETURN_IF_ERROR(tx.mcp_servers().InsertMcpServer(fs));
    return tx.mcp_servers().InsertMcpServer(other);
  }).ok());
  McpServer dup{NewId(), a.id, "fs", "stdio", Json::object(), 4};
  Status st = store_->WriteSync([&](Tx& tx) { return tx.mcp_servers().InsertMcpServer(dup); });
  EXPECT_EQ(st.code(), Code::kConflict);
  EXPECT_EQ(st.message(), "an MCP server named 'fs' exists");
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto list = tx.mcp_servers().ListMcpServers(a.id);
    EXPECT_EQ(Ids(*list), std::vector<std::string>({fs.id, web.id}));
    EXPECT_EQ(list->at(0).config, Json({{"command", {"npx", "server"}}}));
    EXPECT_EQ(tx.mcp_servers().GetMcpServerByName(a.id, "web")->id, web.id);
    EXPECT_EQ(tx.mcp_servers().GetMcpServer(b.id, fs.id).status().code(), Code::kNotFound);
    return Status::Ok();
  }).ok());
  EXPECT_TRUE(
      store_->WriteSync([&](Tx& tx) { return tx.mcp_servers().DeleteMcpServer(a.id, fs.id); })
          .ok());
  EXPECT_EQ(
      store_->WriteSync([&](Tx& tx) { return tx.mcp_servers().DeleteMcpServer(a.id, fs.id); })
          .code(),
      Code::kNotFound);
}

TEST_P(StoreTest, PluginsAreReplacedInPlaceKeepingTheirCreationTime) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  Plugin audit = NewPlugin(a, "audit", 100);
  Plugin zeta = NewPlugin(a, "zeta", 101);
  zeta.kind = "webhook";
  zeta.source = "";
  zeta.config = Json{{"url", "https://example.com/hook"}, {"secret", {{"secret", "HOOK"}}}};
  Plugin other = NewPlugin(b, "audit", 102);  // the same id in another tenant
  other.name = "B's audit";
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(zeta));
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(audit));
    return tx.plugins().UpsertPlugin(other);
  }).ok());

  // A new version replaces every field but created_at.
  Plugin v2 = audit;
  v2.name = "Audit trail";
  v2.version = "2.0.0";
  v2.kind = "builtin";
  v2.manifest = Json{{"id", "audit"}, {"version", "2.0.0"}};
  v2.source = "";
  v2.config = Json{{"level", 2}, {"tags", {"a", "b"}}};
  v2.created_at = 999;  // ignored on replace
  v2.updated_at = 200;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.plugins().UpsertPlugin(v2); }).ok());

  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(Plugin got, tx.plugins().GetPlugin(a.id, "audit"));
    EXPECT_EQ(got.tenant_id, a.id);
    EXPECT_EQ(got.id, "audit");
    EXPECT_EQ(got.name, "Audit trail");
    EXPECT_EQ(got.version, "2.0.0");
    EXPECT_EQ(got.kind, "builtin");
    EXPECT_EQ(got.manifest, v2.manifest);
    EXPECT_EQ(got.source, "");
    EXPECT_EQ(got.config, v2.config);
    EXPECT_EQ(got.created_at, 100);
    EXPECT_EQ(got.updated_at, 200);
    KEEL_ASSIGN_OR_RETURN(Plugin z, tx.plugins().GetPlugin(a.id, "zeta"));
    EXPECT_EQ(z.kind, "webhook");
    EXPECT_EQ(z.config, zeta.config);
    EXPECT_EQ(z.manifest, zeta.manifest);
    KEEL_ASSIGN_OR_RETURN(auto list, tx.plugins().ListPlugins(a.id));
    std::vector<std::string> ids;
    for (const auto& p : list) ids.push_back(p.id);
    EXPECT_EQ(ids, std::vector<std::string>({"audit", "zeta"}));
    // B's plugin of the same id is untouched.
    KEEL_ASSIGN_OR_RETURN(Plugin theirs, tx.plugins().GetPlugin(b.id, "audit"));
    EXPECT_EQ(theirs.name, "B's audit");
    EXPECT_EQ(theirs.version, "1.0.0");
    EXPECT_EQ(tx.plugins().ListPlugins(b.id)->size(), 1u);
    auto missing = tx.plugins().GetPlugin(b.id, "zeta");
    EXPECT_EQ(missing.status().code(), Code::kNotFound);
    EXPECT_EQ(missing.status().message(), "plugin not found: zeta");
    EXPECT_TRUE(tx.plugins().ListPlugins(NewId())->empty());
    return Status::Ok();
  }).ok());
}

TEST_P(StoreTest, DeletingAPluginTakesItsEnablementsAndDeliveries) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  PluginDelivery mine = NewDelivery(a, "audit", 10);
  PluginDelivery mine_done = NewDelivery(a, "audit", 11, "delivered");
  PluginDelivery kept = NewDelivery(a, "keeper", 12);
  PluginDelivery theirs = NewDelivery(b, "audit", 13);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    for (const Plugin& p : {NewPlugin(a, "audit"), NewPlugin(a, "keeper"), NewPlugin(b, "audit")}) {
      KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(p));
    }
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "audit", "*", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "audit", "agent-1", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "keeper", "*", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({b.id, "audit", "*", 1}));
    for (const auto& d : {mine, mine_done, kept, theirs}) {
      KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
    }
    return Status::Ok();
  }).ok());
  // Replacing the plugin keeps them (an upsert, not a delete and insert).
  Plugin v2 = NewPlugin(a, "audit", 500);
  v2.version = "2.0.0";
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.plugins().UpsertPlugin(v2); }).ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.plugins().ListEnablements(a.id, "audit")->size(), 2u);
    EXPECT_TRUE(tx.plugins().GetDelivery(a.id, mine.id).ok());
    return Status::Ok();
  }).ok());

  ASSERT_TRUE(
      store_->WriteSync([&](Tx& tx) { return tx.plugins().DeletePlugin(a.id, "audit"); }).ok());
  Status again =
      store_->WriteSync([&](Tx& tx) { return tx.plugins().DeletePlugin(a.id, "audit"); });
  EXPECT_EQ(again.code(), Code::kNotFound);
  EXPECT_EQ(again.message(), "plugin not found: audit");
  EXPECT_EQ(
      store_->WriteSync([&](Tx& tx) { return tx.plugins().DeletePlugin(a.id, "never"); }).code(),
      Code::kNotFound);

  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.plugins().GetPlugin(a.id, "audit").status().code(), Code::kNotFound);
    EXPECT_TRUE(tx.plugins().ListEnablements(a.id, "audit")->empty());
    EXPECT_TRUE(tx.plugins().PluginsForAgent(a.id, "agent-1").ok());
    std::vector<std::string> left;
    auto remaining = tx.plugins().PluginsForAgent(a.id, "agent-1");
    for (const auto& p : *remaining) left.push_back(p.id);
    EXPECT_EQ(left, std::vector<std::string>({"keeper"}));
    EXPECT_EQ(tx.plugins().GetDelivery(a.id, mine.id).status().code(), Code::kNotFound);
    EXPECT_EQ(tx.plugins().GetDelivery(a.id, mine_done.id).status().code(), Code::kNotFound);
    EXPECT_TRUE(tx.plugins().ListDeliveries(a.id, "audit", "", {"", 50})->items.empty());
    // The tenant's other plugin and the other tenant's plugin of the same id keep theirs.
    EXPECT_TRUE(tx.plugins().GetDelivery(a.id, kept.id).ok());
    EXPECT_EQ(tx.plugins().ListEnablements(a.id, "keeper")->size(), 1u);
    EXPECT_TRUE(tx.plugins().GetPlugin(b.id, "audit").ok());
    EXPECT_EQ(tx.plugins().ListEnablements(b.id, "audit")->size(), 1u);
    EXPECT_TRUE(tx.plugins().GetDelivery(b.id, theirs.id).ok());
    return Status::Ok();
  }).ok());
}

TEST_P(StoreTest, EnablingIsIdempotentAndNeedsThePlugin) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(a, "audit")));
    return tx.plugins().UpsertPlugin(NewPlugin(b, "only-b"));
  }).ok());
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "audit", "agent-2", 10}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "audit", "*", 11}));
    return tx.plugins().EnablePlugin({a.id, "audit", "agent-1", 12});
  }).ok());
  // Again, in a later unit and within one: no error, no second row, the first created_at.
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "audit", "agent-1", 99}));
    return tx.plugins().EnablePlugin({a.id, "audit", "agent-1", 100});
  }).ok());
  auto enablements = ReadValue<std::vector<PluginEnablement>>(
      *store_, [&](Tx& tx) { return tx.plugins().ListEnablements(a.id, "audit"); });
  ASSERT_EQ(enablements.size(), 3u);
  EXPECT_EQ(enablements[0].agent_id, "*");  // by agent_id
  EXPECT_EQ(enablements[1].agent_id, "agent-1");
  EXPECT_EQ(enablements[2].agent_id, "agent-2");
  EXPECT_EQ(enablements[1].created_at, 12);
  EXPECT_EQ(enablements[1].tenant_id, a.id);
  EXPECT_EQ(enablements[1].plugin_id, "audit");

  auto expect = [&](const WriteFn& fn, const std::string& message) {
    Status st = store_->WriteSync(fn);
    EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
    EXPECT_EQ(st.message(), message);
  };
  expect([&](Tx& tx) { return tx.plugins().EnablePlugin({a.id, "nope", "*", 1}); },
         "plugin not found: nope");
  // Another tenant's plugin is unknown here.
  expect([&](Tx& tx) { return tx.plugins().EnablePlugin({a.id, "only-b", "*", 1}); },
         "plugin not found: only-b");
  expect([&](Tx& tx) { return tx.plugins().DisablePlugin(a.id, "audit", "agent-9"); },
         "plugin audit is not enabled for agent agent-9");
  expect([&](Tx& tx) { return tx.plugins().DisablePlugin(b.id, "audit", "agent-1"); },
         "plugin audit is not enabled for agent agent-1");
  expect([&](Tx& tx) { return tx.plugins().DisablePlugin(a.id, "nope", "*"); },
         "plugin nope is not enabled for agent *");

  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.plugins().DisablePlugin(a.id, "audit", "agent-1");
  }).ok());
  expect([&](Tx& tx) { return tx.plugins().DisablePlugin(a.id, "audit", "agent-1"); },
         "plugin audit is not enabled for agent agent-1");
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto left, tx.plugins().ListEnablements(a.id, "audit"));
    EXPECT_EQ(left.size(), 2u);
    EXPECT_TRUE(tx.plugins().ListEnablements(b.id, "audit")->empty());
    EXPECT_TRUE(tx.plugins().ListEnablements(a.id, "nope")->empty());
    EXPECT_TRUE(tx.plugins().ListEnablements(b.id, "only-b")->empty());
    return Status::Ok();
  }).ok());
}

TEST_P(StoreTest, PluginsForAnAgentAreItsOwnAndTheTenantWideOnesOnce) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    for (const char* id : {"e-none", "d-other", "c-both", "b-star", "a-one"}) {
      KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(a, id)));
    }
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "a-one", "agent-1", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "b-star", "*", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "c-both", "agent-1", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "c-both", "*", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "c-both", "agent-2", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a.id, "d-other", "agent-2", 1}));
    // Tenant b: a plugin of the same id as a's, and one of its own, both for everyone.
    Plugin b_one = NewPlugin(b, "a-one");
    b_one.name = "b's";
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(b_one));
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(b, "z-foreign")));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({b.id, "a-one", "*", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({b.id, "a-one", "agent-1", 1}));
    return tx.plugins().EnablePlugin({b.id, "z-foreign", "*", 1});
  }).ok());
  auto for_agent = [&](const Tenant& t, const std::string& agent) {
    auto plugins = ReadValue<std::vector<Plugin>>(
        *store_, [&](Tx& tx) { return tx.plugins().PluginsForAgent(t.id, agent); });
    std::vector<std::string> ids;
    for (const auto& p : plugins) {
      EXPECT_EQ(p.tenant_id, t.id) << p.id;
      ids.push_back(p.id);
    }
    // Their stamps are the same plugins, with their update times.
    std::vector<PluginStamp> stamps;
    EXPECT_TRUE(store_->Read([&](Tx& tx) {
      return tx.plugins().PluginStampsForAgentLater(t.id, agent, stamps);
    }).ok());
    EXPECT_EQ(stamps.size(), plugins.size());
    for (size_t i = 0; i < stamps.size() && i < plugins.size(); ++i) {
      EXPECT_EQ(stamps[i].id, plugins[i].id);
      EXPECT_EQ(stamps[i].updated_at, plugins[i].updated_at);
    }
    return ids;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(for_agent(a, "agent-1"), V({"a-one", "b-star", "c-both"}));
  EXPECT_EQ(for_agent(a, "agent-2"), V({"b-star", "c-both", "d-other"}));
  EXPECT_EQ(for_agent(a, "agent-3"), V({"b-star", "c-both"}));
  EXPECT_EQ(for_agent(a, "*"), V({"b-star", "c-both"}));
  EXPECT_EQ(for_agent(b, "agent-1"), V({"a-one", "z-foreign"}));
  EXPECT_EQ(for_agent(b, "agent-2"), V({"a-one", "z-foreign"}));
  EXPECT_TRUE(for_agent(MakeTenant(), "agent-1").empty());
  // The whole plugin comes back, b's own.
  auto b_plugins = ReadValue<std::vector<Plugin>>(
      *store_, [&](Tx& tx) { return tx.plugins().PluginsForAgent(b.id, "agent-1"); });
  ASSERT_FALSE(b_plugins.empty());
  EXPECT_EQ(b_plugins[0].name, "b's");
  EXPECT_EQ(b_plugins[0].manifest, NewPlugin(b, "a-one").manifest);
}

// Intake reads the stamps before it has read the session: they are its agent's, and none for a
// session this tenant does not have (not even the tenant-wide ones).
TEST_P(StoreTest, DeliveriesRoundTripAndListNewestFirst) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  // Ten deliveries of `hook`, created_at 100..109 with two ties (ordered by id then), inserted
  // shuffled; others of another plugin and of another tenant around them.
  std::vector<PluginDelivery> hook;
  for (int i = 0; i < 10; ++i) {
    Millis at = 100 + (i == 5 ? 4 : i);  // 104 twice
    hook.push_back(NewDelivery(a, "hook", at, i % 3 == 0 ? "delivered" : "pending", 1000 + i));
  }
  std::vector<PluginDelivery> shuffled = hook;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(11));
  PluginDelivery other_plugin = NewDelivery(a, "other", 105);
  PluginDelivery other_tenant = NewDelivery(b, "hook", 105);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(a, "hook")));
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(a, "other")));
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(b, "hook")));
    for (const auto& d : shuffled) KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
    KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(other_plugin));
    return tx.plugins().InsertDelivery(other_tenant);
  }).ok());

  // Every field round-trips; an update writes the delivery's progress.
  PluginDelivery d = hook[1];
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(PluginDelivery got, tx.plugins().GetDelivery(a.id, d.id));
    EXPECT_EQ(got.id, d.id);
    EXPECT_EQ(got.tenant_id, a.id);
    EXPECT_EQ(got.plugin_id, "hook");
    EXPECT_EQ(got.agent_id, "agent-1");
    EXPECT_EQ(got.event_type, "tool.after@v1");
    EXPECT_EQ(got.payload, d.payload);
    EXPECT_EQ(got.status, "pending");
    EXPECT_EQ(got.attempts, 0);
    EXPECT_EQ(got.next_attempt_at, 1001);
    EXPECT_EQ(got.last_status, 0);
    EXPECT_EQ(got.last_error, "");
    EXPECT_EQ(got.created_at, 101);
    EXPECT_FALSE(got.delivered_at.has_value());
    return Status::Ok();
  }).ok());
  d.status = "delivered";
  d.attempts = 3;
  d.next_attempt_at = 5000;
  d.last_status = 204;
  d.last_error = "earlier: 503 Service Unavailable";
  d.delivered_at = 4999;
  d.payload = Json{{"changed", true}};  // not written by an update
  d.event_type = "changed@v1";
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.plugins().UpdateDelivery(d); }).ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(PluginDelivery got, tx.plugins().GetDelivery(a.id, d.id));
    EXPECT_EQ(got.status, "delivered");
    EXPECT_EQ(got.attempts, 3);
    EXPECT_EQ(got.next_attempt_at, 5000);
    EXPECT_EQ(got.last_status, 204);
    EXPECT_EQ(got.last_error, "earlier: 503 Service Unavailable");
    EXPECT_EQ(got.delivered_at, std::optional<Millis>(4999));
    EXPECT_EQ(got.payload, hook[1].payload);
    EXPECT_EQ(got.event_type, "tool.after@v1");
    auto theirs = tx.plugins().GetDelivery(b.id, d.id);
    EXPECT_EQ(theirs.status().code(), Code::kNotFound);
    EXPECT_EQ(theirs.status().message(), "plugin delivery not found: " + d.id);
    return Status::Ok();
  }).ok());
  hook[1] = d;

  // Not found: an unknown id, or another tenant's. A duplicate id is a conflict.
  PluginDelivery unknown = NewDelivery(a, "hook", 1);
  PluginDelivery stolen = d;
  stolen.tenant_id = b.id;
  for (const auto& x : {unknown, stolen}) {
    Status st = store_->WriteSync([&](Tx& tx) { return tx.plugins().UpdateDelivery(x); });
    EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
    EXPECT_EQ(st.message(), "plugin delivery not found: " + x.id);
  }
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.plugins().InsertDelivery(hook[0]); }).code(),
            Code::kConflict);
  // A delivery needs its plugin.
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) {
              return tx.plugins().InsertDelivery(NewDelivery(a, "no-such-plugin", 1));
            }).code(),
            Code::kConflict);
  EXPECT_EQ(ReadValue<PluginDelivery>(
                *store_, [&](Tx& tx) { return tx.plugins().GetDelivery(b.id, other_tenant.id); })
                .status,
            "pending");

  // Newest first: created_at descending, then id descending.
  auto newest_first = [](std::vector<PluginDelivery> v, const std::string& status) {
    std::vector<std::string> ids;
    std::sort(v.begin(), v.end(), [](const PluginDelivery& x, const PluginDelivery& y) {
      return std::tie(x.created_at, x.id) > std::tie(y.created_at, y.id);
    });
    for (const auto& x : v) {
      if (status.empty() || x.status == status) ids.push_back(x.id);
    }
    return ids;
  };
  for (const std::string status : {"", "pending", "delivered", "dead"}) {
    PageFn list = [&](Tx& tx, const Page& p) {
      return ToIdPage(tx.plugins().ListDeliveries(a.id, "hook", status, p));
    };
    const std::vector<std::string> expected = newest_first(hook, status);
    for (int limit : {1, 3, 4, 10, 50}) {
      SCOPED_TRACE("status '" + status + "', limit " + std::to_string(limit));
      Pages pages = AllPages(*store_, limit, list);
      std::vector<std::string> all;
      for (size_t i = 0; i < pages.size(); ++i) {
        const auto& [ids, next] = pages[i];
        EXPECT_LE(ids.size(), static_cast<size_t>(limit));
        if (i + 1 < pages.size()) EXPECT_EQ(ids.size(), static_cast<size_t>(limit));
        all.insert(all.end(), ids.begin(), ids.end());
      }
      EXPECT_EQ(all, expected);
    }
  }
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto page = tx.plugins().ListDeliveries(a.id, "hook", "", {"", 50});
    EXPECT_EQ(page->items.size(), 10u);
    EXPECT_TRUE(page->next_cursor.empty());
    EXPECT_EQ(page->items.front().created_at, 109);
    EXPECT_EQ(tx.plugins().ListDeliveries(a.id, "other", "", {"", 50})->items.size(), 1u);
    EXPECT_EQ(Ids(tx.plugins().ListDeliveries(b.id, "hook", "", {"", 50})->items),
              std::vector<std::string>({other_tenant.id}));
    EXPECT_TRUE(tx.plugins().ListDeliveries(b.id, "other", "", {"", 50})->items.empty());
    EXPECT_EQ(tx.plugins().ListDeliveries(a.id, "hook", "", {"not a cursor!", 5}).status().code(),
              Code::kInvalidArgument);
    EXPECT_EQ(tx.plugins()
                  .ListDeliveries(a.id, "hook", "", {EncodeCursor("no-colon"), 5})
                  .status()
                  .code(),
              Code::kInvalidArgument);
    return Status::Ok();
  }).ok());
}

TEST_P(StoreTest, DueDeliveriesArePendingAndDueAcrossTenantsLongestDueFirst) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  const Millis now = 10'000;
  PluginDelivery a_due = NewDelivery(a, "hook", 1, "pending", 9'000);
  PluginDelivery b_due_first = NewDelivery(b, "hook", 2, "pending", 5'000);
  PluginDelivery a_due_now = NewDelivery(a, "hook", 3, "pending", now);  // at `now` is due
  PluginDelivery b_due_last = NewDelivery(b, "hook", 4, "pending", 9'500);
  PluginDelivery a_later = NewDelivery(a, "hook", 5, "pending", now + 1);
  PluginDelivery a_delivered = NewDelivery(a, "hook", 6, "delivered", 1);
  PluginDelivery b_dead = NewDelivery(b, "hook", 7, "dead", 1);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(a, "hook")));
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(b, "hook")));
    for (const auto& d : {a_due, b_due_first, a_due_now, b_due_last, a_later, a_delivered, b_dead}) {
      KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
    }
    return Status::Ok();
  }).ok());
  auto due = [&](Millis at, int limit) {
    return Ids(ReadValue<std::vector<PluginDelivery>>(
        *store_, [&](Tx& tx) { return tx.plugins().DueDeliveries(at, limit); }));
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(due(now, 100), V({b_due_first.id, a_due.id, b_due_last.id, a_due_now.id}));
  EXPECT_EQ(due(now, 2), V({b_due_first.id, a_due.id}));
  EXPECT_EQ(due(now + 1, 100),
            V({b_due_first.id, a_due.id, b_due_last.id, a_due_now.id, a_later.id}));
  EXPECT_TRUE(due(4'999, 100).empty());
  // The whole record comes back, with its tenant.
  auto first = ReadValue<std::vector<PluginDelivery>>(
      *store_, [&](Tx& tx) { return tx.plugins().DueDeliveries(now, 1); });
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].tenant_id, b.id);
  EXPECT_EQ(first[0].payload, b_due_first.payload);
  // Delivered, it is no longer due.
  PluginDelivery done = b_due_first;
  done.status = "delivered";
  done.attempts = 1;
  done.delivered_at = now;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.plugins().UpdateDelivery(done); }).ok());
  EXPECT_EQ(due(now, 100), V({a_due.id, b_due_last.id, a_due_now.id}));
}

TEST_P(StoreTest, AnotherTenantsObjectsAreNotFound) {
  Tenant a = MakeTenant();
  Tenant b = MakeTenant();
  Agent agent = MakeAgent(a, "agent");
  Session session = NewSession(a, agent);
  store::Run run = NewRun(a, session);
  Message msg = NewMessage(a, session, "key-1");
  run.message_id = msg.id;
  msg.run_id = run.id;
  Step step{NewId(), a.id, run.id, 1, "model", "succeeded", Json::object(), Json::object(),
            NowMillis(), std::nullopt};
  ToolCall call;
  call.id = NewId();
  call.tenant_id = a.id;
  call.run_id = run.id;
  call.step_id = step.id;
  call.call_id = "call-1";
  call.tool = "notes.append";
  call.effect_class = "once";
  call.status = "proposed";
  Token token{NewId(), a.id, "t", "owner", "hash-" + NewId(), NowMillis(), std::nullopt};
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(session));
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(msg));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(run));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(step));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertToolCall(call));
    KEEL_RETURN_IF_ERROR(tx.tokens().InsertToken(token));
    return tx.events().Append({a.id, "x@v1", agent.id, session.id, run.id, {}});
  }).ok());

  // Reads with tenant b: not found, empty lists.
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto ag = tx.agents().GetAgent(b.id, agent.id);
    EXPECT_EQ(ag.status().code(), Code::kNotFound);
    EXPECT_EQ(ag.status().message(), "agent not found: " + agent.id);
    EXPECT_EQ(tx.agents().GetAgentByName(b.id, "agent").status().code(), Code::kNotFound);
    auto se = tx.sessions().GetSession(b.id, session.id);
    EXPECT_EQ(se.status().code(), Code::kNotFound);
    EXPECT_EQ(se.status().message(), "session not found: " + session.id);
    auto me = tx.messages().GetMessage(b.id, msg.id);
    EXPECT_EQ(me.status().code(), Code::kNotFound);
    EXPECT_EQ(me.status().message(), "message not found: " + msg.id);
    auto ru = tx.runs().GetRun(b.id, run.id);
    EXPECT_EQ(ru.status().code(), Code::kNotFound);
    EXPECT_EQ(ru.status().message(), "run not found: " + run.id);
    auto key = tx.messages().FindByIdempotencyKey(b.id, session.id, "key-1");
    EXPECT_TRUE(key.ok() && !key->has_value());
    EXPECT_TRUE(tx.agents().ListAgents(b.id, {"", 50})->items.empty());
    EXPECT_TRUE(tx.sessions().ListSessions(b.id, agent.id, {"", 50}, "")->items.empty());
    EXPECT_TRUE(tx.messages().ListMessages(b.id, session.id, {"", 50})->items.empty());
    EXPECT_TRUE(tx.messages().RecentMessages(b.id, session.id, "", NewId(), 10)->empty());
    EXPECT_TRUE(tx.runs().ListRuns(b.id, {.session_id = session.id}, {"", 50})->items.empty());
    EXPECT_TRUE(tx.runs().ListRuns(b.id, {}, {"", 50})->items.empty());
    EXPECT_EQ(*tx.runs().CountActiveRuns(b.id), 0);
    EXPECT_FALSE(*tx.runs().SessionBusy(b.id, session.id));
    auto intake = tx.runs().ForIntake(b.id, session.id);
    EXPECT_EQ(intake.status().code(), Code::kNotFound);
    EXPECT_EQ(intake.status().message(), "session not found: " + session.id);
    auto read = tx.runs().ReadForIntake(b.id, session.id);
    EXPECT_EQ(read.status().code(), Code::kNotFound);
    EXPECT_EQ(read.status().message(), "session not found: " + session.id);
    EXPECT_TRUE(tx.runs().ListSteps(b.id, run.id)->empty());
    EXPECT_TRUE(tx.runs().ListToolCalls(b.id, run.id)->empty());
    EXPECT_TRUE(tx.tokens().ListTokens(b.id)->empty());
    EXPECT_TRUE(tx.events().ReadEvents(b.id, 0, {}, 100)->empty());
    EXPECT_TRUE(tx.events().RecentRunEvents(b.id, run.id, 10)->empty());
    // ... and tenant a sees its own.
    EXPECT_TRUE(tx.agents().GetAgent(a.id, agent.id).ok());
    EXPECT_EQ(tx.runs().ListSteps(a.id, run.id)->size(), 1u);
    EXPECT_EQ(tx.runs().ListToolCalls(a.id, run.id)->size(), 1u);
    EXPECT_EQ(tx.events().ReadEvents(a.id, 0, {}, 100)->size(), 1u);
    auto recent = tx.events().RecentRunEvents(a.id, run.id, 10);
    EXPECT_TRUE(recent.ok() && recent->size() == 1u && (*recent)[0].run_id == run.id);
    EXPECT_EQ(*tx.runs().CountActiveRuns(a.id), 1);
    EXPECT_TRUE(*tx.runs().SessionBusy(a.id, session.id));
    auto view = tx.runs().ForIntake(a.id, session.id);
    EXPECT_TRUE(view.ok()) << view.status().message();
    if (view.ok()) {
      EXPECT_EQ(view->session.id, session.id);
      EXPECT_EQ(view->session.agent_id, agent.id);
      EXPECT_TRUE(view->busy);
      EXPECT_EQ(view->active_runs, 1);
    }
    auto own = tx.runs().ReadForIntake(a.id, session.id);
    EXPECT_TRUE(own.ok()) << own.status().message();
    if (own.ok()) {
      EXPECT_EQ(own->session.id, session.id);
      EXPECT_EQ(own->session.tenant_id, a.id);
      EXPECT_EQ(own->session.agent_id, agent.id);
      EXPECT_TRUE(own->busy);
      EXPECT_TRUE(own->agent.has_value());
    }
    if (own.ok() && own->agent) {
      EXPECT_EQ(own->agent->id, agent.id);
      EXPECT_EQ(own->agent->tenant_id, a.id);
      EXPECT_EQ(own->agent->name, agent.name);
      EXPECT_EQ(own->agent->model, agent.model);
      EXPECT_EQ(own->agent->config, agent.config);
      EXPECT_EQ(own->agent->created_at, agent.created_at);
      EXPECT_EQ(own->agent->updated_at, agent.updated_at);
    }
    return Status::Ok();
  }).ok());

  // Writes with tenant b: not found, and nothing changes.
  Agent renamed = agent;
  renamed.tenant_id = b.id;
  renamed.name = "stolen";
  store::Run run_b = run;
  run_b.tenant_id = b.id;
  run_b.status = "cancelled";
  Step step_b = step;
  step_b.tenant_id = b.id;
  step_b.status = "failed";
  ToolCall call_b = call;
  call_b.tenant_id = b.id;
  call_b.status = "succeeded";
  auto expect_not_found = [&](const WriteFn& fn, const std::string& message) {
    Status st = store_->WriteSync(fn);
    EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
    EXPECT_EQ(st.message(), message);
  };
  expect_not_found([&](Tx& tx) { return tx.agents().UpdateAgent(renamed); },
                   "agent not found: " + agent.id);
  expect_not_found([&](Tx& tx) { return tx.agents().DeleteAgent(b.id, agent.id); },
                   "agent not found: " + agent.id);
  expect_not_found(
      [&](Tx& tx) { return tx.sessions().UpdateSessionStatus(b.id, session.id, "running", 1); },
      "session not found: " + session.id);
  expect_not_found([&](Tx& tx) { return tx.runs().UpdateRun(run_b); }, "run not found: " + run.id);
  expect_not_found([&](Tx& tx) { return tx.runs().UpdateStep(step_b); },
                   "step not found: " + step.id);
  expect_not_found([&](Tx& tx) { return tx.runs().UpdateToolCall(call_b); },
                   "tool call not found: " + call.id);
  expect_not_found([&](Tx& tx) { return tx.tokens().RevokeToken(b.id, token.id, 1); },
                   "token not found: " + token.id);
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.agents().GetAgent(a.id, agent.id)->name, "agent");
    EXPECT_EQ(tx.sessions().GetSession(a.id, session.id)->status, "idle");
    EXPECT_EQ(tx.runs().GetRun(a.id, run.id)->status, "queued");
    EXPECT_EQ(tx.runs().ListSteps(a.id, run.id)->at(0).status, "succeeded");
    EXPECT_EQ(tx.runs().ListToolCalls(a.id, run.id)->at(0).status, "proposed");
    EXPECT_TRUE(tx.tokens().FindActiveTokenByHash(token.hash).ok());
    return Status::Ok();
  }).ok());
}

TEST_P(StoreTest, NotFoundAndConflictCodesAndMessages) {
  Tenant t = MakeTenant();
  const std::string missing = NewId();
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto expect = [](const Status& st, Code code, const std::string& message) {
      EXPECT_EQ(st.code(), code) << st.ToString();
      EXPECT_EQ(st.message(), message);
    };
    expect(tx.tenants().GetTenant(missing).status(), Code::kNotFound,
           "tenant not found: " + missing);
    expect(tx.agents().GetAgent(t.id, missing).status(), Code::kNotFound,
           "agent not found: " + missing);
    expect(tx.agents().GetAgentByName(t.id, "nobody").status(), Code::kNotFound,
           "agent not found: nobody");
    expect(tx.sessions().GetSession(t.id, missing).status(), Code::kNotFound,
           "session not found: " + missing);
    expect(tx.messages().GetMessage(t.id, missing).status(), Code::kNotFound,
           "message not found: " + missing);
    expect(tx.runs().GetRun(t.id, missing).status(), Code::kNotFound,
           "run not found: " + missing);
    expect(tx.tokens().FindActiveTokenByHash("no-such-hash").status(), Code::kNotFound,
           "token not found");
    return Status::Ok();
  }).ok());

  Agent a = MakeAgent(t, "taken");
  Agent b = MakeAgent(t, "other");
  Agent dup = NewAgent(t, "taken");
  Status st = store_->WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(dup); });
  EXPECT_EQ(st.code(), Code::kConflict);
  EXPECT_EQ(st.message(), "an agent named 'taken' already exists");
  // Renaming onto a taken name.
  b.name = "taken";
  st = store_->WriteSync([&](Tx& tx) { return tx.agents().UpdateAgent(b); });
  EXPECT_EQ(st.code(), Code::kConflict);
  EXPECT_EQ(st.message(), "an agent named 'taken' already exists");
  // A deleted agent frees its name, and is not found any more.
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.agents().DeleteAgent(t.id, a.id); }).ok());
  st = store_->WriteSync([&](Tx& tx) { return tx.agents().DeleteAgent(t.id, a.id); });
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.message(), "agent not found: " + a.id);
  EXPECT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(dup); }).ok());
  // A duplicate primary key or unique (run, seq) is a conflict too.
  Tenant again{t.id, "again", NowMillis()};
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.tenants().InsertTenant(again); }).code(),
            Code::kConflict);
  Session s = NewSession(t, dup);
  store::Run r = NewRun(t, s);
  Step step{NewId(), t.id, r.id, 1, "model", "succeeded", Json::object(), Json::object(),
            NowMillis(), std::nullopt};
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(r));
    return tx.runs().InsertStep(step);
  }).ok());
  Step same_seq = step;
  same_seq.id = NewId();
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.runs().InsertStep(same_seq); }).code(),
            Code::kConflict);
  EXPECT_EQ(store_->WriteSync([&](Tx& tx) { return tx.sessions().InsertSession(s); }).code(),
            Code::kConflict);
  // A conflict inside a unit rolls back the whole unit, and the store goes on.
  Agent fresh = NewAgent(t, "fresh");
  st = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(fresh));
    return tx.runs().InsertStep(same_seq);
  });
  EXPECT_EQ(st.code(), Code::kConflict);
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.agents().GetAgentByName(t.id, "fresh").status().code(), Code::kNotFound);
    return Status::Ok();
  }).ok());
  EXPECT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.agents().InsertAgent(fresh); }).ok());
}

TEST_P(StoreTest, IdempotencyKeysAreUniquePerSession) {
  Tenant t = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  Session s1 = NewSession(t, agent);
  Session s2 = NewSession(t, agent);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s1));
    return tx.sessions().InsertSession(s2);
  }).ok());
  auto insert = [&](const Message& m) {
    return store_->WriteSync([&](Tx& tx) { return tx.messages().InsertMessage(m); });
  };
  Message first = NewMessage(t, s1, "k");
  ASSERT_TRUE(insert(first).ok());
  EXPECT_EQ(insert(NewMessage(t, s1, "k")).code(), Code::kConflict);
  EXPECT_TRUE(insert(NewMessage(t, s2, "k")).ok());  // another session: free
  EXPECT_TRUE(insert(NewMessage(t, s1, "K")).ok());  // keys are case-sensitive
  EXPECT_TRUE(insert(NewMessage(t, s1, "")).ok());   // no key: never a conflict
  EXPECT_TRUE(insert(NewMessage(t, s1, "")).ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto found = tx.messages().FindByIdempotencyKey(t.id, s1.id, "k");
    EXPECT_TRUE(found.ok() && found->has_value());
    if (found.ok() && found->has_value()) {
      EXPECT_EQ((*found)->id, first.id);
      EXPECT_EQ((*found)->content, first.content);
    }
    auto none = tx.messages().FindByIdempotencyKey(t.id, s1.id, "other");
    EXPECT_TRUE(none.ok() && !none->has_value());
    EXPECT_EQ(tx.messages().ListMessages(t.id, s1.id, {"", 50})->items.size(), 4u);
    EXPECT_EQ(tx.messages().ListMessages(t.id, s2.id, {"", 50})->items.size(), 1u);
    return Status::Ok();
  }).ok());
  // A unit that fails after inserting a keyed message leaves the key free.
  Message rolled = NewMessage(t, s2, "later");
  Status st = store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(rolled));
    return Conflict("changed my mind");
  });
  EXPECT_EQ(st.code(), Code::kConflict);
  EXPECT_EQ(st.message(), "changed my mind");
  EXPECT_TRUE(insert(NewMessage(t, s2, "later")).ok());
}

TEST_P(StoreTest, ReopenKeepsDataAndContinuesTheSequence) {
  Tenant t = MakeTenant();
  std::vector<Event> first;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.events().Append({t.id, "a@v1", "", "", "", {}});
  }, &first).ok());
  ASSERT_NO_FATAL_FAILURE(Open());
  std::vector<Event> appended;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.events().Append({t.id, "b@v1", "", "", "", {}});
  }, &appended).ok());
  ASSERT_EQ(appended.size(), 1u);
  EXPECT_EQ(appended[0].origin_seq, 2);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_GT(appended[0].position, first[0].position);
  EXPECT_EQ(ReadValue<int64_t>(*store_, [&](Tx& tx) { return tx.events().LastPosition(t.id); }),
            appended[0].position);
}

TEST_P(StoreTest, RecordsRoundTripThroughAReopen) {
  Tenant t = MakeTenant();
  Agent agent = NewAgent(t, "Agent Ünïcode ✓");
  agent.instructions = "Line one.\nLine \"two\" with 'quotes' and \\ backslash.";
  agent.tools = Json::array({"notes.append", "http.get"});
  agent.config = {{"temperature", 0.5}, {"nested", {{"a", 1}, {"b", Json::array({true, nullptr})}}}};
  Session session = NewSession(t, agent);
  session.title = "Ti\ttle";
  Message msg = NewMessage(t, session, "key-✓");
  msg.content = std::string(70000, 'x') + " ünïcode ✓";
  store::Run run = NewRun(t, session);
  run.message_id = msg.id;
  msg.run_id = run.id;
  run.status = "running";
  run.attempt = 3;
  run.output = "out";
  run.error = {{"code", "unavailable"}, {"message", "model down"}};
  run.input_tokens = 1234567890123;
  run.output_tokens = 42;
  run.lease_owner = "node-a";
  run.lease_expires_at = NowMillis() + 60000;
  run.cancel_requested = true;
  run.started_at = NowMillis();
  Step step{NewId(), t.id, run.id, 1, "tool", "succeeded", {{"args", {{"x", 1}}}},
            {{"ok", true}}, NowMillis(), NowMillis() + 5};
  ToolCall call;
  call.id = NewId();
  call.tenant_id = t.id;
  call.run_id = run.id;
  call.step_id = step.id;
  call.call_id = "call_abc";
  call.tool = "notes.append";
  call.arguments = {{"text", "hi ✓"}};
  call.effect_class = "once";
  call.effect_key = "ek";
  call.status = "succeeded";
  call.result = {{"lines", 3}};
  call.created_at = NowMillis();
  call.updated_at = call.created_at + 1;
  Token token{NewId(), t.id, "ci", "user", "h-" + NewId(), NowMillis(), std::nullopt};
  Json payload = {{"n", 1}, {"s", "✓"}, {"list", Json::array({1, 2, 3})}};
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(agent));
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(session));
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(msg));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(run));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(step));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertToolCall(call));
    KEEL_RETURN_IF_ERROR(tx.tokens().InsertToken(token));
    return tx.events().Append({t.id, "all.written@v1", agent.id, session.id, run.id, payload});
  }).ok());
  ASSERT_NO_FATAL_FAILURE(Open());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto tn = tx.tenants().GetTenant(t.id);
    EXPECT_TRUE(tn.ok());
    if (tn.ok()) {
      EXPECT_EQ(tn->name, t.name);
      EXPECT_EQ(tn->created_at, t.created_at);
    }
    KEEL_ASSIGN_OR_RETURN(Agent a, tx.agents().GetAgent(t.id, agent.id));
    EXPECT_EQ(a.tenant_id, t.id);
    EXPECT_EQ(a.name, agent.name);
    EXPECT_EQ(a.model, agent.model);
    EXPECT_EQ(a.instructions, agent.instructions);
    EXPECT_EQ(a.tools, agent.tools);
    EXPECT_EQ(a.config, agent.config);
    EXPECT_EQ(a.status, "active");
    EXPECT_EQ(a.created_at, agent.created_at);
    EXPECT_EQ(a.updated_at, agent.updated_at);
    EXPECT_EQ(tx.agents().GetAgentByName(t.id, agent.name)->id, agent.id);
    KEEL_ASSIGN_OR_RETURN(Session s, tx.sessions().GetSession(t.id, session.id));
    EXPECT_EQ(s.agent_id, agent.id);
    EXPECT_EQ(s.status, "idle");
    EXPECT_EQ(s.title, session.title);
    EXPECT_EQ(s.created_at, session.created_at);
    KEEL_ASSIGN_OR_RETURN(Message m, tx.messages().GetMessage(t.id, msg.id));
    EXPECT_EQ(m.session_id, session.id);
    EXPECT_EQ(m.run_id, run.id);
    EXPECT_EQ(m.role, "user");
    EXPECT_EQ(m.content, msg.content);
    EXPECT_EQ(m.idempotency_key, "key-✓");
    EXPECT_EQ(m.created_at, msg.created_at);
    KEEL_ASSIGN_OR_RETURN(store::Run r, tx.runs().GetRun(t.id, run.id));
    EXPECT_EQ(r.session_id, run.session_id);
    EXPECT_EQ(r.agent_id, run.agent_id);
    EXPECT_EQ(r.message_id, msg.id);
    EXPECT_EQ(r.status, "running");
    EXPECT_EQ(r.attempt, 3);
    EXPECT_EQ(r.output, "out");
    EXPECT_EQ(r.error, run.error);
    EXPECT_EQ(r.input_tokens, run.input_tokens);
    EXPECT_EQ(r.output_tokens, 42);
    EXPECT_EQ(r.lease_owner, "node-a");
    EXPECT_EQ(r.lease_expires_at, run.lease_expires_at);
    EXPECT_TRUE(r.cancel_requested);
    EXPECT_EQ(r.created_at, run.created_at);
    EXPECT_EQ(r.started_at, run.started_at);
    EXPECT_FALSE(r.finished_at.has_value());
    KEEL_ASSIGN_OR_RETURN(auto steps, tx.runs().ListSteps(t.id, run.id));
    EXPECT_EQ(steps.size(), 1u);
    if (!steps.empty()) {
      EXPECT_EQ(steps[0].id, step.id);
      EXPECT_EQ(steps[0].kind, "tool");
      EXPECT_EQ(steps[0].input, step.input);
      EXPECT_EQ(steps[0].output, step.output);
      EXPECT_EQ(steps[0].started_at, step.started_at);
      EXPECT_EQ(steps[0].finished_at, step.finished_at);
    }
    KEEL_ASSIGN_OR_RETURN(auto calls, tx.runs().ListToolCalls(t.id, run.id));
    EXPECT_EQ(calls.size(), 1u);
    if (!calls.empty()) {
      EXPECT_EQ(calls[0].step_id, step.id);
      EXPECT_EQ(calls[0].call_id, "call_abc");
      EXPECT_EQ(calls[0].tool, "notes.append");
      EXPECT_EQ(calls[0].arguments, call.arguments);
      EXPECT_EQ(calls[0].effect_class, "once");
      EXPECT_EQ(calls[0].effect_key, "ek");
      EXPECT_EQ(calls[0].status, "succeeded");
      EXPECT_EQ(calls[0].result, call.result);
      EXPECT_EQ(calls[0].updated_at, call.updated_at);
    }
    KEEL_ASSIGN_OR_RETURN(Token tk, tx.tokens().FindActiveTokenByHash(token.hash));
    EXPECT_EQ(tk.id, token.id);
    EXPECT_EQ(tk.tenant_id, t.id);
    EXPECT_EQ(tk.role, "user");
    EXPECT_FALSE(tk.revoked_at.has_value());
    KEEL_ASSIGN_OR_RETURN(auto events, tx.events().ReadEvents(t.id, 0, {}, 10));
    EXPECT_EQ(events.size(), 1u);
    if (!events.empty()) {
      EXPECT_EQ(events[0].type, "all.written@v1");
      EXPECT_EQ(events[0].agent_id, agent.id);
      EXPECT_EQ(events[0].session_id, session.id);
      EXPECT_EQ(events[0].run_id, run.id);
      EXPECT_EQ(events[0].payload, payload);
      EXPECT_FALSE(events[0].id.empty());
      EXPECT_GT(events[0].occurred_at, 0);
    }
    return Status::Ok();
  }).ok());
  // Revoked tokens are no longer found by hash.
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.tokens().RevokeToken(t.id, token.id, NowMillis());
  }).ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.tokens().FindActiveTokenByHash(token.hash).status().code(), Code::kNotFound);
    auto tokens = tx.tokens().ListTokens(t.id);
    EXPECT_TRUE(tokens.ok() && tokens->size() == 1 && (*tokens)[0].revoked_at.has_value());
    // One token by id: revoked ones too, and only the tenant's own.
    auto one = tx.tokens().GetToken(t.id, token.id);
    EXPECT_TRUE(one.ok() && one->hash == token.hash && one->revoked_at.has_value());
    EXPECT_EQ(tx.tokens().GetToken(NewId(), token.id).status().code(), Code::kNotFound);
    EXPECT_EQ(tx.tokens().GetToken(t.id, NewId()).status().code(), Code::kNotFound);
    return Status::Ok();
  }).ok());
}

TEST_P(StoreTest, EventPositionsFollowCommitOrderAndOriginSeqHasNoGaps) {
  std::mutex mu;
  std::vector<Event> committed;  // in commit order, as the listener sees them
  store_->SetCommitListener([&](const std::vector<Event>& events) {
    std::lock_guard<std::mutex> lock(mu);
    committed.insert(committed.end(), events.begin(), events.end());
  });
  Tenant t = MakeTenant();
  constexpr int kUnits = 150;
  std::vector<std::promise<std::pair<Status, std::vector<Event>>>> done(kUnits);
  // Two submitting threads; every third unit appends two events and then fails.
  auto submit = [&](int first) {
    for (int i = first; i < kUnits; i += 2) {
      store_->Write(
          [&t, i](Tx& tx) -> Status {
            KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "u.first@v1", "", "", "", {{"i", i}}}));
            KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "u.second@v1", "", "", "", {{"i", i}}}));
            if (i % 3 == 0) return Conflict("unit " + std::to_string(i) + " rolls back");
            return Status::Ok();
          },
          [&done, i](Status s, std::vector<Event> ev) { done[i].set_value({s, std::move(ev)}); });
    }
  };
  std::thread a(submit, 0), b(submit, 1);
  a.join();
  b.join();
  std::set<int> ok_units;
  for (int i = 0; i < kUnits; ++i) {
    auto [st, ev] = done[i].get_future().get();
    if (i % 3 == 0) {
      EXPECT_EQ(st.code(), Code::kConflict);
      EXPECT_EQ(st.message(), "unit " + std::to_string(i) + " rolls back");
    } else {
      EXPECT_TRUE(st.ok()) << st.ToString();
      ok_units.insert(i);
      ASSERT_EQ(ev.size(), 2u);
      EXPECT_EQ(ev[1].origin_seq, ev[0].origin_seq + 1);
      EXPECT_GT(ev[1].position, ev[0].position);
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(committed.size(), ok_units.size() * 2);
  for (size_t k = 0; k < committed.size(); ++k) {
    EXPECT_EQ(committed[k].origin, "node-a");
    EXPECT_EQ(committed[k].origin_seq, static_cast<int64_t>(k + 1)) << "at " << k;
    if (k > 0) {
      EXPECT_GT(committed[k].position, committed[k - 1].position) << "at " << k;
    }
    EXPECT_NE(committed[k].payload.value("i", 0) % 3, 0) << "a rolled-back event was published";
  }
  // The log reads back exactly as it was committed.
  auto events = ReadValue<std::vector<Event>>(
      *store_, [&](Tx& tx) { return tx.events().ReadEvents(t.id, 0, {}, 1000); });
  ASSERT_EQ(events.size(), committed.size());
  for (size_t k = 0; k < events.size(); ++k) {
    EXPECT_EQ(events[k].id, committed[k].id);
    EXPECT_EQ(events[k].position, committed[k].position);
    EXPECT_EQ(events[k].origin_seq, committed[k].origin_seq);
  }
  EXPECT_EQ(ReadValue<int64_t>(*store_, [&](Tx& tx) { return tx.events().LastPosition(t.id); }),
            committed.back().position);
  // Reading after a position resumes exactly there.
  int64_t middle = committed[committed.size() / 2].position;
  auto rest = ReadValue<std::vector<Event>>(
      *store_, [&](Tx& tx) { return tx.events().ReadEvents(t.id, middle, {}, 1000); });
  ASSERT_EQ(rest.size(), committed.size() - committed.size() / 2 - 1);
  EXPECT_EQ(rest.front().id, committed[committed.size() / 2 + 1].id);
}

TEST_P(StoreTest, ClaimableRunsAreSerialPerSession) {
  Tenant t = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  Session s1{NewId(), t.id, agent.id, "idle", "", 0, 0, ""};
  Session s2{NewId(), t.id, agent.id, "idle", "", 0, 0, ""};
  std::vector<store::Run> runs;
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s1));
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s2));
    for (const auto* s : {&s1, &s1, &s2}) {
      store::Run r;
      r.id = NewId();
      r.tenant_id = t.id;
      r.session_id = s->id;
      r.agent_id = agent.id;
      KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(r));
      runs.push_back(r);
    }
    return Status::Ok();
  }).ok());
  std::vector<store::Run> claimable;
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(claimable, tx.runs().ClaimableRuns(NowMillis(), 10));
    return Status::Ok();
  }).ok());
  ASSERT_EQ(claimable.size(), 2u);  // the first of s1 and the one of s2
  EXPECT_EQ(claimable[0].id, runs[0].id);
  EXPECT_EQ(claimable[1].id, runs[2].id);
}

// Two messages posted at once: the one with the later id may be claimed at intake, the other
// queued behind its run. That queued run waits for the running one (and for one waiting for an
// approval), whatever their ids: running both would break the session's serial order.
TEST_P(StoreTest, AQueuedRunWaitsForItsSessionsRunningRunWhateverItsId) {
  Tenant t = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  Session s{NewId(), t.id, agent.id, "idle", "", 0, 0, ""};
  store::Run queued, running;
  queued.id = NewId();
  running.id = NewId();  // later than the queued run's
  for (auto* r : {&queued, &running}) {
    r->tenant_id = t.id;
    r->session_id = s.id;
    r->agent_id = agent.id;
  }
  running.status = "running";
  running.attempt = 1;
  running.lease_owner = "node-a";
  running.lease_expires_at = NowMillis() + 60000;
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s));
                    KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(queued));
                    return tx.runs().InsertRun(running);
                  })
                  .ok());
  auto claimable = [&] {
    return ReadValue<std::vector<store::Run>>(
        *store_, [&](Tx& tx) { return tx.runs().ClaimableRuns(NowMillis(), 10); });
  };
  EXPECT_TRUE(claimable().empty());
  running.status = "waiting_for_approval";
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.runs().UpdateRun(running); }).ok());
  EXPECT_TRUE(claimable().empty());
  running.status = "done";
  running.finished_at = NowMillis();
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.runs().UpdateRun(running); }).ok());
  auto now_claimable = claimable();
  ASSERT_EQ(now_claimable.size(), 1u);
  EXPECT_EQ(now_claimable[0].id, queued.id);
}

TEST_P(StoreTest, ClaimableRunsFollowSessionOrderLeasesAndTenantsInTurn) {
  Tenant t = MakeTenant();
  Tenant u = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  Agent other = MakeAgent(u, "a");
  Session s1 = NewSession(t, agent);
  Session s2 = NewSession(t, agent);
  Session s3 = NewSession(u, other);  // runtime-wide: another tenant's runs are claimable too
  Session s4 = NewSession(t, agent);  // no run
  // Ids in creation order: r[0], r[1], r[2] in s1; r[3] in s2; r[4] in s3.
  std::vector<store::Run> r = {NewRun(t, s1), NewRun(t, s1), NewRun(t, s1), NewRun(t, s2),
                               NewRun(u, s3)};
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    for (const auto* s : {&s1, &s2, &s3, &s4}) {
                      KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(*s));
                    }
                    // Inserted newest first: the order must come from the ids.
                    for (auto it = r.rbegin(); it != r.rend(); ++it)
                      KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(*it));
                    return Status::Ok();
                  })
                  .ok());
  auto claimable = [&](Millis now, int limit = 10) {
    return Ids(ReadValue<std::vector<store::Run>>(
        *store_, [&](Tx& tx) { return tx.runs().ClaimableRuns(now, limit); }));
  };
  auto update = [&](store::Run& run) {
    Status st = store_->WriteSync([&](Tx& tx) { return tx.runs().UpdateRun(run); });
    ASSERT_TRUE(st.ok()) << st.ToString();
  };
  const Millis now = NowMillis();
  // Each tenant's oldest first, then t's second.
  EXPECT_EQ(claimable(now), (std::vector<std::string>{r[0].id, r[4].id, r[3].id}));
  EXPECT_EQ(claimable(now, 2), (std::vector<std::string>{r[0].id, r[4].id}));
  // r[0] runs under a live lease: nothing else of s1 is claimable.
  r[0].status = "running";
  r[0].lease_owner = "node-a";
  r[0].lease_expires_at = now + 60000;
  update(r[0]);
  EXPECT_EQ(claimable(now), (std::vector<std::string>{r[3].id, r[4].id}));
  // Its lease expires: r[0] itself is claimable again (and still blocks r[1]).
  EXPECT_EQ(claimable(now + 120000), (std::vector<std::string>{r[0].id, r[4].id, r[3].id}));
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.runs().ExpireLeasesOf("node-a"); }).ok());
  EXPECT_EQ(claimable(now), (std::vector<std::string>{r[0].id, r[4].id, r[3].id}));
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) {
    return tx.runs().RenewLeases("node-a", {r[0].id}, now + 60000);
  }).ok());
  EXPECT_EQ(claimable(now), (std::vector<std::string>{r[3].id, r[4].id}));
  // Waiting for approval still blocks the session.
  r[0].status = "waiting_for_approval";
  update(r[0]);
  EXPECT_EQ(claimable(now), (std::vector<std::string>{r[3].id, r[4].id}));
  // Done: the next of s1 becomes claimable, t's oldest again.
  r[0].status = "done";
  r[0].finished_at = now;
  update(r[0]);
  EXPECT_EQ(claimable(now), (std::vector<std::string>{r[1].id, r[4].id, r[3].id}));
  ASSERT_TRUE(
      store_
          ->Read([&](Tx& tx) -> Status {
            EXPECT_EQ(*tx.runs().CountActiveRuns(t.id), 3);
            EXPECT_EQ(*tx.runs().CountActiveRuns(u.id), 1);
            EXPECT_TRUE(*tx.runs().SessionBusy(t.id, s1.id));
            // Intake's one read says the same.
            auto view = tx.runs().ForIntake(t.id, s1.id);
            EXPECT_TRUE(view.ok() && view->busy && view->active_runs == 3 &&
                        view->session.id == s1.id);
            auto idle = tx.runs().ForIntake(t.id, s4.id);
            EXPECT_TRUE(idle.ok() && !idle->busy && idle->active_runs == 3);
            // And the read before intake's unit.
            auto read = tx.runs().ReadForIntake(t.id, s1.id);
            EXPECT_TRUE(read.ok() && read->busy && read->session.id == s1.id && read->agent);
            auto idle_read = tx.runs().ReadForIntake(t.id, s4.id);
            EXPECT_TRUE(idle_read.ok() && !idle_read->busy && idle_read->session.id == s4.id);
            return Status::Ok();
          })
          .ok());
}

// Intake's read names no agent for a session whose agent was deleted, and the session still.
TEST_P(StoreTest, IntakesReadOfASessionWhoseAgentWasDeletedHasNoAgent) {
  Tenant t = MakeTenant();
  Agent a = MakeAgent(t, "gone");
  Session s = NewSession(t, a);
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.sessions().InsertSession(s); }).ok());
  ASSERT_TRUE(store_
                  ->Read([&](Tx& tx) -> Status {
                    auto read = tx.runs().ReadForIntake(t.id, s.id);
                    EXPECT_TRUE(read.ok() && read->agent && read->agent->id == a.id && !read->busy);
                    return Status::Ok();
                  })
                  .ok());
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) { return tx.agents().DeleteAgent(t.id, a.id); }).ok());
  ASSERT_TRUE(store_
                  ->Read([&](Tx& tx) -> Status {
                    auto read = tx.runs().ReadForIntake(t.id, s.id);
                    EXPECT_TRUE(read.ok()) << read.status().message();
                    if (read.ok()) {
                      EXPECT_EQ(read->session.id, s.id);
                      EXPECT_FALSE(read->agent.has_value());
                    }
                    return Status::Ok();
                  })
                  .ok());
}

// A tenant with a long queue does not fill the dispatcher's page: every other tenant's oldest
// claimable run comes before its second.
TEST_P(StoreTest, ATenantsLongQueueDoesNotHideAnotherTenantsRun) {
  Tenant noisy = MakeTenant();
  Tenant quiet = MakeTenant();
  Agent a = MakeAgent(noisy, "a");
  Agent b = MakeAgent(quiet, "b");
  std::vector<Session> sessions;
  std::vector<store::Run> queue;
  for (int i = 0; i < 6; ++i) {
    sessions.push_back(NewSession(noisy, a));
    queue.push_back(NewRun(noisy, sessions.back()));
  }
  Session late = NewSession(quiet, b);
  store::Run newest = NewRun(quiet, late);  // after every run of the noisy tenant
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    for (const auto& s : sessions) KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s));
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(late));
    for (const auto& r : queue) KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(r));
    return tx.runs().InsertRun(newest);
  }).ok());
  auto page = Ids(ReadValue<std::vector<store::Run>>(
      *store_, [&](Tx& tx) { return tx.runs().ClaimableRuns(NowMillis(), 2); }));
  EXPECT_EQ(page, (std::vector<std::string>{queue[0].id, newest.id}));
  auto all = Ids(ReadValue<std::vector<store::Run>>(
      *store_, [&](Tx& tx) { return tx.runs().ClaimableRuns(NowMillis(), 100); }));
  ASSERT_EQ(all.size(), 7u);
  EXPECT_EQ(all[1], newest.id);
  for (int i = 1; i < 6; ++i) EXPECT_EQ(all[i + 1], queue[i].id);
}

TEST_P(StoreTest, EventFiltersAndRecentMessages) {
  Tenant t = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  Session s1 = NewSession(t, agent);
  Session s2 = NewSession(t, agent);
  std::vector<Message> msgs;
  for (int i = 0; i < 6; ++i) msgs.push_back(NewMessage(t, s1));
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s1));
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s2));
    for (auto it = msgs.rbegin(); it != msgs.rend(); ++it) {
      KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(*it));
    }
    for (int i = 0; i < 6; ++i) {
      const Session& s = i % 2 == 0 ? s1 : s2;
      KEEL_RETURN_IF_ERROR(tx.events().Append(
          {t.id, "e" + std::to_string(i) + "@v1", agent.id, s.id, i == 4 ? "run-x" : "", {}}));
    }
    return Status::Ok();
  }).ok());
  ASSERT_TRUE(store_->Read([&](Tx& tx) -> Status {
    auto types = [](const std::vector<Event>& ev) {
      std::vector<std::string> out;
      for (const auto& e : ev) out.push_back(e.type);
      return out;
    };
    EventFilter by_session;
    by_session.session_id = s1.id;
    EXPECT_EQ(types(*tx.events().ReadEvents(t.id, 0, by_session, 100)),
              (std::vector<std::string>{"e0@v1", "e2@v1", "e4@v1"}));
    EventFilter by_run;
    by_run.run_id = "run-x";
    EXPECT_EQ(types(*tx.events().ReadEvents(t.id, 0, by_run, 100)),
              (std::vector<std::string>{"e4@v1"}));
    EventFilter by_agent;
    by_agent.agent_id = agent.id;
    EXPECT_EQ(tx.events().ReadEvents(t.id, 0, by_agent, 100)->size(), 6u);
    EXPECT_EQ(types(*tx.events().ReadEvents(t.id, 0, {}, 2)),
              (std::vector<std::string>{"e0@v1", "e1@v1"}));
    // The messages were committed in the reverse of their ids' order, msgs[5] first: a
    // session's messages come in commit order. The last 3 committed before msgs[0], oldest
    // first; those before msgs[4]; those between msgs[4] and msgs[0].
    using V = std::vector<std::string>;
    EXPECT_EQ(Ids(*tx.messages().RecentMessages(t.id, s1.id, "", msgs[0].id, 3)),
              (V{msgs[3].id, msgs[2].id, msgs[1].id}));
    EXPECT_EQ(Ids(*tx.messages().RecentMessages(t.id, s1.id, "", msgs[4].id, 3)), (V{msgs[5].id}));
    EXPECT_EQ(Ids(*tx.messages().RecentMessages(t.id, s1.id, msgs[4].id, msgs[0].id, 10)),
              (V{msgs[3].id, msgs[2].id, msgs[1].id}));
    EXPECT_TRUE(tx.messages().RecentMessages(t.id, s1.id, msgs[0].id, msgs[4].id, 10)->empty());
    // A bound that is not the session's message: nothing before it, everything after it.
    EXPECT_TRUE(tx.messages().RecentMessages(t.id, s2.id, "", msgs[0].id, 10)->empty());
    EXPECT_EQ(tx.messages().RecentMessages(t.id, s1.id, NewId(), msgs[0].id, 10)->size(), 5u);
    V committed = Ids(msgs);
    std::reverse(committed.begin(), committed.end());
    auto listed = tx.messages().ListMessages(t.id, s1.id, {"", 50});
    EXPECT_EQ(Ids(listed->items), committed);
    for (size_t i = 0; i < listed->items.size(); ++i) {
      EXPECT_EQ(listed->items[i].seq, static_cast<int64_t>(i + 1));
    }
    // Paged, by seq; a cursor this list did not give is refused.
    auto first = tx.messages().ListMessages(t.id, s1.id, {"", 2});
    EXPECT_EQ(Ids(first->items), (V{msgs[5].id, msgs[4].id}));
    auto second = tx.messages().ListMessages(t.id, s1.id, {first->next_cursor, 2});
    EXPECT_EQ(Ids(second->items), (V{msgs[3].id, msgs[2].id}));
    EXPECT_EQ(
        tx.messages().ListMessages(t.id, s1.id, {EncodeCursor(msgs[2].id), 2}).status().code(),
        Code::kInvalidArgument);
    return Status::Ok();
  }).ok());
}

// A page of large messages ends at kMaxPageBytes, with a cursor for the rest: 12 messages of
// 1 MiB come in pages of 4, 4 and 4 (the last without a cursor), in order, whatever the limit.
TEST_P(StoreTest, APageOfLargeMessagesEndsAtItsByteBudget) {
  Tenant t = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  Session s = NewSession(t, agent);
  std::vector<Message> msgs;
  for (int i = 0; i < 12; ++i) {
    msgs.push_back(NewMessage(t, s));
    msgs.back().content = std::string(1u << 20, static_cast<char>('a' + i));
  }
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s));
                    for (const auto& m : msgs) KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(m));
                    return Status::Ok();
                  })
                  .ok());
  std::vector<std::string> seen;
  std::vector<size_t> sizes;
  std::string cursor;
  do {
    auto page = ReadValue<Paged<Message>>(*store_, [&](Tx& tx) {
      return tx.messages().ListMessages(t.id, s.id, {cursor, 500});
    });
    sizes.push_back(page.items.size());
    for (const auto& m : page.items) seen.push_back(m.id);
    cursor = page.next_cursor;
  } while (!cursor.empty() && sizes.size() < 10);
  EXPECT_EQ(seen, Ids(msgs));
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 4, 4}));
}

TEST_P(StoreTest, ListRunsWithAndWithoutASessionFilter) {
  Tenant t = MakeTenant();
  Agent agent = MakeAgent(t, "a");
  Session s1 = NewSession(t, agent);
  Session s2 = NewSession(t, agent);
  std::vector<store::Run> runs = {NewRun(t, s1), NewRun(t, s2), NewRun(t, s1)};
  ASSERT_TRUE(store_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s1));
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s2));
    for (const auto& r : runs) KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(r));
    return Status::Ok();
  }).ok());
  // Both forms, one after the other and back, in one process: neither may fix the other's query.
  auto of = [&](const std::string& session_id) {
    return Ids(ReadValue<Paged<store::Run>>(*store_, [&](Tx& tx) {
                 return tx.runs().ListRuns(t.id, {.session_id = session_id}, {"", 50});
               }).items);
  };
  const std::vector<std::string> all = Ids(runs);
  const std::vector<std::string> of_s1 = {runs[0].id, runs[2].id};
  EXPECT_EQ(of(s1.id), of_s1);
  EXPECT_EQ(of(""), all);
  EXPECT_EQ(of(s2.id), std::vector<std::string>{runs[1].id});
  EXPECT_EQ(of(""), all);
}

TEST(StoreUrlTest, RejectsUnknownSchemes) {
  StoreOptions o;
  o.origin = "x";
  EXPECT_EQ(OpenStore("mysql://x", o).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(OpenStore("sqlite://", o).status().code(), Code::kInvalidArgument);
}

// ---------------------------------------------------------------- both backends at once

// The same records written to both backends list in the same order with the same cursors,
// page by page, for every limit.
TEST(StoreCrossBackendTest, SameDataSameOrderAndCursors) {
  if (!PgAdminUrl()) GTEST_SKIP() << kPgSkip;
  BackendDb sqlite_db(Backend::kSqlite), pg_db(Backend::kPostgres);
  ASSERT_TRUE(sqlite_db.Prepare().ok());
  Status prepared = pg_db.Prepare();
  ASSERT_TRUE(prepared.ok()) << prepared.ToString();
  auto sq = sqlite_db.Open();
  ASSERT_TRUE(sq.ok()) << sq.status().ToString();
  auto pg = pg_db.Open();
  ASSERT_TRUE(pg.ok()) << pg.status().ToString();
  std::map<std::string, Store*> stores = {{"sqlite", sq->get()}, {"postgres", pg->get()}};

  // One data set: ids made up front, inserted in a shuffled order, the same into both.
  std::mt19937 rng(20261130);
  Tenant t{NewId(), "t", NowMillis()};
  Tenant u{NewId(), "u", NowMillis()};
  std::vector<Agent> agents;
  for (int i = 0; i < 17; ++i) agents.push_back(NewAgent(i % 4 == 3 ? u : t, "agent-" + std::to_string(i)));
  std::vector<Session> sessions;
  for (int i = 0; i < 11; ++i) sessions.push_back(NewSession(t, agents[0]));
  std::vector<Message> messages;
  for (int i = 0; i < 13; ++i) {
    messages.push_back(NewMessage(t, sessions[0], i % 3 == 0 ? "key-" + std::to_string(i) : ""));
  }
  std::vector<store::Run> runs;
  for (int i = 0; i < 12; ++i) runs.push_back(NewRun(t, sessions[i % 4]));
  runs[1].status = "done";
  runs[2].status = "running";
  runs[2].lease_expires_at = 1;  // expired
  runs[6].status = "running";
  runs[6].lease_expires_at = NowMillis() + 3600000;
  std::vector<Step> steps;
  for (int seq : {3, 1, 4, 2}) {
    steps.push_back(Step{NewId(), t.id, runs[0].id, seq, "model", "succeeded", Json::object(),
                         Json::object(), NowMillis(), std::nullopt});
  }
  auto shuffled = [&](auto v) {
    std::shuffle(v.begin(), v.end(), rng);
    return v;
  };
  // Deliveries three to a created_at (ties are ordered by id), some pending and due.
  std::vector<PluginDelivery> deliveries;
  for (int i = 0; i < 14; ++i) {
    deliveries.push_back(NewDelivery(t, "hook", 1000 + i / 3, i % 4 == 1 ? "delivered" : "pending",
                                     5000 - 10 * (i % 5)));
  }
  auto agents_in = shuffled(agents);
  auto sessions_in = shuffled(sessions);
  auto messages_in = shuffled(messages);
  auto runs_in = shuffled(runs);
  auto deliveries_in = shuffled(deliveries);
  for (auto& [name, store] : stores) {
    SCOPED_TRACE(name);
    MakeTenant(*store, u.id);
    Status st = store->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(t));
      for (const auto& a : agents_in) KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
      for (const auto& s : sessions_in) KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s));
      for (const auto& m : messages_in) KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(m));
      for (const auto& r : runs_in) KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(r));
      for (const auto& s : steps) KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(s));
      KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(NewPlugin(t, "hook")));
      for (const auto& d : deliveries_in) KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
      for (int i = 0; i < 9; ++i) {
        KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "e" + std::to_string(i) + "@v1",
                                                 agents[0].id, sessions[i % 2].id, "", {}}));
      }
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  std::map<std::string, PageFn> lists = {
      {"agents of t",
       [&](Tx& tx, const Page& p) { return ToIdPage(tx.agents().ListAgents(t.id, p)); }},
      {"agents of u",
       [&](Tx& tx, const Page& p) { return ToIdPage(tx.agents().ListAgents(u.id, p)); }},
      {"sessions",
       [&](Tx& tx, const Page& p) {
         return ToIdPage(tx.sessions().ListSessions(t.id, agents[0].id, p, ""));
       }},
      {"messages",
       [&](Tx& tx, const Page& p) {
         return ToIdPage(tx.messages().ListMessages(t.id, sessions[0].id, p));
       }},
      {"runs of a session",
       [&](Tx& tx, const Page& p) {
         return ToIdPage(tx.runs().ListRuns(t.id, {.session_id = sessions[1].id}, p));
       }},
      {"runs of the tenant",
       [&](Tx& tx, const Page& p) { return ToIdPage(tx.runs().ListRuns(t.id, {}, p)); }},
      {"deliveries",
       [&](Tx& tx, const Page& p) {
         return ToIdPage(tx.plugins().ListDeliveries(t.id, "hook", "", p));
       }},
      {"pending deliveries",
       [&](Tx& tx, const Page& p) {
         return ToIdPage(tx.plugins().ListDeliveries(t.id, "hook", "pending", p));
       }},
  };
  for (const auto& [what, list] : lists) {
    for (int limit : {1, 2, 3, 5, 7, 12, 13, 50}) {
      SCOPED_TRACE(what + ", limit " + std::to_string(limit));
      Pages a = AllPages(*stores["sqlite"], limit, list);
      Pages b = AllPages(*stores["postgres"], limit, list);
      ASSERT_EQ(a.size(), b.size());
      for (size_t p = 0; p < a.size(); ++p) {
        EXPECT_EQ(a[p].first, b[p].first) << "items of page " << p;
        EXPECT_EQ(a[p].second, b[p].second) << "cursor of page " << p;
      }
      // A cursor from one backend continues the same list on the other.
      if (a.size() > 1) {
        EXPECT_EQ(ReadPage(*stores["postgres"], list, {a[0].second, limit}), a[1]);
        EXPECT_EQ(ReadPage(*stores["sqlite"], list, {b[0].second, limit}), b[1]);
      }
    }
  }
  // Ids sorted, and every list is complete.
  std::vector<std::string> expect_agents_t;
  for (const auto& a : agents) {
    if (a.tenant_id == t.id) expect_agents_t.push_back(a.id);
  }
  EXPECT_EQ(ReadPage(*stores["postgres"], lists["agents of t"], {"", 500}),
            IdPage(expect_agents_t, ""));
  // A session's messages in the order they were committed.
  EXPECT_EQ(ReadPage(*stores["postgres"], lists["messages"], {"", 500}),
            IdPage(Ids(messages_in), ""));

  // Runtime-wide and unpaged reads agree too.
  std::map<std::string, std::vector<std::string>> claimable, tenants, steps_read, recent, events,
      due;
  std::map<std::string, std::vector<int64_t>> seqs;
  for (auto& [name, store] : stores) {
    ASSERT_TRUE(store->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto c, tx.runs().ClaimableRuns(NowMillis(), 100));
      claimable[name] = Ids(c);
      KEEL_ASSIGN_OR_RETURN(auto d, tx.plugins().DueDeliveries(4995, 7));
      due[name] = Ids(d);
      KEEL_ASSIGN_OR_RETURN(auto ts, tx.tenants().ListTenants());
      tenants[name] = Ids(ts);
      KEEL_ASSIGN_OR_RETURN(auto st, tx.runs().ListSteps(t.id, runs[0].id));
      steps_read[name] = Ids(st);
      for (const auto& s : st) seqs[name].push_back(s.seq);
      KEEL_ASSIGN_OR_RETURN(
          auto rm, tx.messages().RecentMessages(t.id, sessions[0].id, "", messages_in[10].id, 4));
      recent[name] = Ids(rm);
      EventFilter f;
      f.session_id = sessions[1].id;
      KEEL_ASSIGN_OR_RETURN(auto ev, tx.events().ReadEvents(t.id, 0, f, 100));
      for (const auto& e : ev) events[name].push_back(e.type + "/" + std::to_string(e.origin_seq));
      return Status::Ok();
    }).ok());
  }
  EXPECT_EQ(claimable["sqlite"], claimable["postgres"]);
  EXPECT_EQ(claimable["sqlite"].size(), 4u);  // the first queued run of each session, or expired
  EXPECT_EQ(due["sqlite"], due["postgres"]);
  EXPECT_EQ(due["sqlite"].size(), 7u);
  EXPECT_EQ(tenants["sqlite"], tenants["postgres"]);
  EXPECT_EQ(steps_read["sqlite"], steps_read["postgres"]);
  EXPECT_EQ(seqs["postgres"], (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(recent["sqlite"], recent["postgres"]);
  EXPECT_EQ(recent["postgres"], (std::vector<std::string>{messages_in[6].id, messages_in[7].id,
                                                          messages_in[8].id, messages_in[9].id}));
  EXPECT_EQ(events["sqlite"], events["postgres"]);
  EXPECT_EQ(events["postgres"].size(), 4u);
}

}  // namespace
}  // namespace keel::store

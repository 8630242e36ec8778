// Row-level security of the PostgreSQL store, seen from a raw libpq connection as the store's
// role (`keel`): the store writes rows of two tenants into a fresh, migrated database, and plain
// SQL then sees only the rows of the tenant named by the transaction-local `app.tenant_id`.
//
// Needs KEEL_TEST_PG_ADMIN_URL (a role that may create databases; `make test` sets it), like the
// PostgreSQL cases of store_conformance_test.cc; skipped without it.

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <cstdlib>
#include <string>
#include <vector>


#include "keel/common/ids.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {


// A libpq connection; Exec returns the result (checked by the caller).
class PgConn {
 public:
  explicit PgConn(const std::string& url) : c_(PQconnectdb(url.c_str())) {
    PQsetNoticeProcessor(c_, IgnoreNotice, nullptr);
  }
  ~PgConn() { PQfinish(c_); }
  PgConn(const PgConn&) = delete;
  PgConn& operator=(const PgConn&) = delete;
  bool ok() const { return PQstatus(c_) == CONNECTION_OK; }
  std::string error() const { return PQerrorMessage(c_); }

  struct Res {
    ExecStatusType status = PGRES_FATAL_ERROR;
    std::string error;     // empty when the statement succeeded
    std::string sqlstate;  // of the error
    std::vector<std::vector<std::string>> rows;
    std::string affected;  // PQcmdTuples
  };
  Res Exec(const std::string& sql, const std::vector<std::string>& params = {}) {
    std::vector<const char*> values;
    for (const auto& p : params) values.push_back(p.c_str());
    PGresult* r = PQexecParams(c_, sql.c_str(), static_cast<int>(values.size()), nullptr,
                               values.data(), nullptr, nullptr, 0);
    Res out;
    out.status = PQresultStatus(r);
    if (out.status != PGRES_COMMAND_OK && out.status != PGRES_TUPLES_OK) {
      out.error = PQresultErrorMessage(r);
      const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
      out.sqlstate = state ? state : "";
      if (out.error.empty()) out.error = "failed: " + std::string(PQresStatus(out.status));
    }
    for (int i = 0; i < PQntuples(r); ++i) {
      auto& row = out.rows.emplace_back();
      for (int j = 0; j < PQnfields(r); ++j) row.emplace_back(PQgetvalue(r, i, j));
    }
    out.affected = PQcmdTuples(r);
    PQclear(r);
    return out;
  }
  // The single value of a one-row, one-column query ("<error: ...>" when it failed).
  std::string Value(const std::string& sql, const std::vector<std::string>& params = {}) {
    Res r = Exec(sql, params);
    if (!r.error.empty()) return "<error: " + r.error + ">";
    if (r.rows.size() != 1 || r.rows[0].size() != 1) return "<not one value>";
    return r.rows[0][0];
  }

 private:
  PGconn* c_;
};


class PostgresRlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PgAdminUrl()) GTEST_SKIP() << kPgSkip;
    Status created = db_.Create();
    ASSERT_TRUE(created.ok()) << created.ToString();
    url_ = db_.url();
    role_ = PgUrl::Parse(url_).user();

    // Migrate and fill it through the store: tenant A has 3 agents and 3 sessions, B has 2.
    StoreOptions o;
    o.origin = "node-rls";
    auto opened = OpenStore(url_, o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    std::unique_ptr<Store> s = std::move(opened).value();
    a_ = Tenant{NewId(), "a", NowMillis()};
    b_ = Tenant{NewId(), "b", NowMillis()};
    Status st = s->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(a_));
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(b_));
      for (const auto& [t, n] : {std::pair{a_, 3}, std::pair{b_, 2}}) {
        for (int i = 0; i < n; ++i) {
          Agent ag;
          ag.id = NewId();
          ag.tenant_id = t.id;
          ag.name = "agent-" + std::to_string(i);
          ag.model = "local";
          ag.created_at = ag.updated_at = NowMillis();
          KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(ag));
          KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(
              Session{NewId(), t.id, ag.id, "idle", "s", NowMillis(), NowMillis(), ""}));
          KEEL_RETURN_IF_ERROR(tx.events().Append({t.id, "agent.created@v1", ag.id, "", "", {}}));
        }
      }
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    s.reset();

    conn_ = std::make_unique<PgConn>(url_);
    ASSERT_TRUE(conn_->ok()) << "cannot connect as " << role_ << ": " << conn_->error();
  }

  void TearDown() override { conn_.reset(); }  // before db_ drops the database

  std::string Count(const std::string& table, const std::string& where = "") {
    return conn_->Value("SELECT count(*) FROM " + table + (where.empty() ? "" : " WHERE " + where));
  }
  void Begin(const std::string& tenant_id) {
    ASSERT_EQ(conn_->Exec("BEGIN").error, "");
    ASSERT_EQ(conn_->Value("SELECT set_config('app.tenant_id', $1, true)", {tenant_id}), tenant_id);
  }

  PgTestDatabase db_;
  std::string url_, role_;
  Tenant a_, b_;
  std::unique_ptr<PgConn> conn_;
};

TEST_F(PostgresRlsTest, TheStoreRoleIsNotSuperuserAndCannotBypassRls) {
  EXPECT_EQ(conn_->Value("SELECT current_user"), role_);
  auto r = conn_->Exec("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user");
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0][0], "f") << "role " << role_ << " is a superuser: RLS would not apply";
  EXPECT_EQ(r.rows[0][1], "f") << "role " << role_ << " has BYPASSRLS";
  // Row-level security is on for the tenant tables.
  for (const char* table : {"agents", "sessions"}) {
    EXPECT_EQ(conn_->Value("SELECT relrowsecurity FROM pg_class WHERE oid = $1::regclass",
                           {table}),
              "t")
        << table;
  }
  // ... and forced, with a policy, on every table of the schema but the two that hold no
  // tenant's data.
  auto tables = conn_->Exec(
      "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, "
      "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) "
      "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
      "WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY c.relname");
  ASSERT_EQ(tables.error, "");
  int tenant_tables = 0;
  for (const auto& row : tables.rows) {
    if (row[0] == "event_origins" || row[0] == "schema_migrations") continue;
    ++tenant_tables;
    EXPECT_EQ(row[1], "t") << row[0] << " has no row-level security";
    EXPECT_EQ(row[2], "t") << row[0] << " does not force row-level security";
    EXPECT_EQ(row[3], "1") << row[0] << " has no policy";
  }
  EXPECT_GE(tenant_tables, 19);  // 16 in migrations 1-4, the plugins' 3 in migration 5
}

TEST_F(PostgresRlsTest, WithoutATenantNoRowIsVisible) {
  EXPECT_EQ(conn_->Value("SELECT current_setting('app.tenant_id', true) IS NULL "
                         "OR current_setting('app.tenant_id', true) = ''"),
            "t");
  EXPECT_EQ(Count("agents"), "0");
  EXPECT_EQ(Count("sessions"), "0");
  EXPECT_EQ(Count("agents", "tenant_id = '" + a_.id + "'"), "0");
  auto upd = conn_->Exec("UPDATE agents SET name = name || '-x'");
  EXPECT_EQ(upd.error, "");
  EXPECT_EQ(upd.affected, "0");
}

TEST_F(PostgresRlsTest, ATransactionLocalTenantSeesOnlyItsRows) {
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  EXPECT_EQ(Count("agents"), "3");
  EXPECT_EQ(Count("sessions"), "3");
  EXPECT_EQ(Count("agents", "tenant_id <> '" + a_.id + "'"), "0");
  EXPECT_EQ(Count("agents", "tenant_id = '" + b_.id + "'"), "0");
  // B's rows cannot be changed or deleted from A either.
  auto upd = conn_->Exec("UPDATE agents SET name = name || '-x' WHERE tenant_id = $1", {b_.id});
  EXPECT_EQ(upd.error, "");
  EXPECT_EQ(upd.affected, "0");
  auto del = conn_->Exec("DELETE FROM sessions WHERE tenant_id = $1", {b_.id});
  EXPECT_EQ(del.error, "");
  EXPECT_EQ(del.affected, "0");
  ASSERT_EQ(conn_->Exec("COMMIT").error, "");

  // The setting was local to that transaction: nothing is visible after it.
  EXPECT_EQ(Count("agents"), "0");

  ASSERT_NO_FATAL_FAILURE(Begin(b_.id));
  EXPECT_EQ(Count("agents"), "2");
  EXPECT_EQ(Count("sessions"), "2");
  EXPECT_EQ(Count("agents", "name LIKE '%-x'"), "0");  // the UPDATE from A changed nothing
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");

  ASSERT_NO_FATAL_FAILURE(Begin(NewId()));  // a tenant without rows
  EXPECT_EQ(Count("agents"), "0");
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
}

TEST_F(PostgresRlsTest, RowsForAnotherTenantCannotBeWritten) {
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  // A copy of one of A's agents, re-labelled as B's, is refused by the policy's check.
  ASSERT_EQ(conn_->Exec("CREATE TEMP TABLE copy ON COMMIT DROP AS SELECT * FROM agents LIMIT 1")
                .error,
            "");
  ASSERT_EQ(conn_->Exec("UPDATE copy SET id = $1, tenant_id = $2, name = 'intruder'",
                        {NewId(), b_.id})
                .error,
            "");
  auto ins = conn_->Exec("INSERT INTO agents SELECT * FROM copy");
  EXPECT_NE(ins.error, "") << "an agent of tenant B was inserted while app.tenant_id was A";
  EXPECT_EQ(ins.sqlstate, "42501") << ins.error;  // insufficient_privilege: RLS violation
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
  // Moving one of A's rows to B is refused the same way.
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  auto move = conn_->Exec("UPDATE agents SET tenant_id = $1", {b_.id});
  EXPECT_NE(move.error, "") << "A's agents were moved to tenant B";
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
  ASSERT_NO_FATAL_FAILURE(Begin(b_.id));
  EXPECT_EQ(Count("agents"), "2");
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
}

// The plugin tables (migration 5): another tenant's plugins, enablements and deliveries are
// invisible and cannot be written, while the runtime-wide DueDeliveries still sees every tenant.
TEST_F(PostgresRlsTest, PluginTablesAreSeparatedByTenant) {
  StoreOptions o;
  o.origin = "node-plugins";
  auto opened = OpenStore(url_, o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Store> s = std::move(opened).value();
  auto plugin = [](const Tenant& t, const std::string& id) {
    Plugin p;
    p.tenant_id = t.id;
    p.id = id;
    p.name = id;
    p.version = "1";
    p.kind = "webhook";
    p.created_at = p.updated_at = 1;
    return p;
  };
  auto delivery = [](const Tenant& t, const std::string& plugin_id, Millis next) {
    PluginDelivery d;
    d.id = NewId();
    d.tenant_id = t.id;
    d.plugin_id = plugin_id;
    d.agent_id = "*";
    d.event_type = "run.completed@v1";
    d.next_attempt_at = next;
    d.created_at = next;
    return d;
  };
  // A: 2 plugins, 3 enablements, 4 deliveries; B: 1 of each, its plugin named like one of A's.
  Status st = s->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(plugin(a_, "audit")));
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(plugin(a_, "notify")));
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(plugin(b_, "audit")));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a_.id, "audit", "*", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a_.id, "audit", "agent-1", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({a_.id, "notify", "*", 1}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({b_.id, "audit", "*", 1}));
    for (int i = 0; i < 4; ++i) {
      KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(delivery(a_, "audit", 10 + i)));
    }
    return tx.plugins().InsertDelivery(delivery(b_, "audit", 5));
  });
  ASSERT_TRUE(st.ok()) << st.ToString();

  const std::vector<std::string> tables = {"plugins", "agent_plugins", "plugin_deliveries"};
  for (const auto& table : tables) EXPECT_EQ(Count(table), "0") << table << " without a tenant";

  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  EXPECT_EQ(Count("plugins"), "2");
  EXPECT_EQ(Count("agent_plugins"), "3");
  EXPECT_EQ(Count("plugin_deliveries"), "4");
  for (const auto& table : tables) {
    EXPECT_EQ(Count(table, "tenant_id <> '" + a_.id + "'"), "0") << table;
  }
  // B's rows cannot be changed or deleted from A (its plugin's delete would cascade).
  auto upd = conn_->Exec("UPDATE plugin_deliveries SET status = 'dead' WHERE tenant_id = $1",
                         {b_.id});
  EXPECT_EQ(upd.error, "");
  EXPECT_EQ(upd.affected, "0");
  auto del = conn_->Exec("DELETE FROM plugins WHERE tenant_id = $1", {b_.id});
  EXPECT_EQ(del.error, "");
  EXPECT_EQ(del.affected, "0");
  auto dis = conn_->Exec("DELETE FROM agent_plugins WHERE tenant_id = $1", {b_.id});
  EXPECT_EQ(dis.error, "");
  EXPECT_EQ(dis.affected, "0");
  ASSERT_EQ(conn_->Exec("COMMIT").error, "");

  // Rows labelled B are refused while bound to A, in each table.
  const std::vector<std::pair<std::string, std::vector<std::string>>> inserts = {
      {"INSERT INTO plugins(tenant_id, id, name, version, kind, manifest, source, config, "
       "created_at, updated_at) VALUES($1, 'intruder', 'x', '1', 'lua', '{}', '', '{}', 1, 1)",
       {b_.id}},
      {"INSERT INTO agent_plugins(tenant_id, plugin_id, agent_id, created_at) "
       "VALUES($1, 'audit', 'agent-9', 1)",
       {b_.id}},
      {"INSERT INTO plugin_deliveries(id, tenant_id, plugin_id, agent_id, event_type, payload, "
       "status, attempts, next_attempt_at, last_status, last_error, created_at, delivered_at) "
       "VALUES($1, $2, 'audit', '*', 'x@v1', '{}', 'pending', 0, 0, 0, '', 1, NULL)",
       {NewId(), b_.id}},
  };
  for (const auto& [sql, params] : inserts) {
    ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
    auto ins = conn_->Exec(sql, params);
    EXPECT_NE(ins.error, "") << "a row of tenant B was inserted while app.tenant_id was A: " << sql;
    EXPECT_EQ(ins.sqlstate, "42501") << ins.error;
    ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
  }

  ASSERT_NO_FATAL_FAILURE(Begin(b_.id));
  for (const auto& table : tables) EXPECT_EQ(Count(table), "1") << table;
  EXPECT_EQ(Count("plugin_deliveries", "status = 'dead'"), "0");  // A's UPDATE changed nothing
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");

  // Through the store: tenant-scoped reads see their own; DueDeliveries sees both tenants.
  ASSERT_TRUE(s->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.plugins().ListPlugins(a_.id)->size(), 2u);
    EXPECT_EQ(tx.plugins().ListPlugins(b_.id)->size(), 1u);
    EXPECT_EQ(tx.plugins().GetPlugin(b_.id, "notify").status().code(), Code::kNotFound);
    KEEL_ASSIGN_OR_RETURN(auto due, tx.plugins().DueDeliveries(100, 10));
    EXPECT_EQ(due.size(), 5u);
    if (!due.empty()) EXPECT_EQ(due[0].tenant_id, b_.id);
    EXPECT_EQ(tx.plugins().ListDeliveries(a_.id, "audit", "", {"", 50})->items.size(), 4u);
    return Status::Ok();
  }).ok());
}

// A claim locks the run's row with FOR UPDATE SKIP LOCKED: while another transaction holds the
// row, LockRun answers kConflict at once instead of waiting, and claims it once the row is free.
TEST_F(PostgresRlsTest, LockRunSkipsARunLockedByAnotherTransaction) {
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  auto sess = conn_->Exec("SELECT id, agent_id FROM sessions ORDER BY id LIMIT 1");
  ASSERT_EQ(sess.error, "");
  ASSERT_EQ(sess.rows.size(), 1u);
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");

  StoreOptions o;
  o.origin = "node-claim";
  auto opened = OpenStore(url_, o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Store> s = std::move(opened).value();
  Message m;
  m.id = NewId();
  m.tenant_id = a_.id;
  m.session_id = sess.rows[0][0];
  m.role = "user";
  m.content = "hi";
  m.created_at = NowMillis();
  store::Run run;
  run.id = NewId();
  run.tenant_id = a_.id;
  run.session_id = sess.rows[0][0];
  run.agent_id = sess.rows[0][1];
  run.message_id = m.id;
  run.created_at = NowMillis();
  ASSERT_TRUE(s->WriteSync([&](Tx& tx) -> Status {
                 KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(m));
                 return tx.runs().InsertRun(run);
               }).ok());

  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  auto held = conn_->Exec("SELECT id FROM runs WHERE id = $1 FOR UPDATE", {run.id});
  ASSERT_EQ(held.error, "");
  ASSERT_EQ(held.rows.size(), 1u);
  Status locked = s->WriteSync(
      [&](Tx& tx) -> Status { return tx.runs().LockRun(a_.id, run.id).status(); });
  EXPECT_EQ(locked.code(), Code::kConflict) << locked.ToString();
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");

  Status free = s->WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto r, tx.runs().LockRun(a_.id, run.id));
    EXPECT_EQ(r.id, run.id);
    EXPECT_EQ(r.status, "queued");
    return tx.runs().LockRun(a_.id, NewId()).status();
  });
  EXPECT_EQ(free.code(), Code::kNotFound) << free.ToString();
}

}  // namespace
}  // namespace keel::store

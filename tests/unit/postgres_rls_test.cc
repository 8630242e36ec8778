// Row-level security of the PostgreSQL store, seen from a raw libpq connection as the store's
// runtime role (`keel`), which owns nothing (the schema belongs to `keel_owner`, see
// docs/decisions/0008-postgres-owner-and-runtime-roles.md): the store writes rows of two tenants
// into a fresh, migrated database, and plain SQL then sees only the rows of the tenant named by
// the transaction-local `app.tenant_id`, whatever else it sets or tries.
//
// Needs KEEL_TEST_PG_ADMIN_URL (a role that may create databases; `make test` sets it), like the
// PostgreSQL cases of store_conformance_test.cc; skipped without it.

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

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
  // ... with a policy, on every table of the schema but the one that holds no tenant's data;
  // none of them is the runtime role's (an owner could switch the policies off).
  auto tables = conn_->Exec(
      "SELECT c.relname, c.relrowsecurity, pg_has_role(current_user, c.relowner, 'MEMBER'), "
      "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) "
      "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
      "WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY c.relname");
  ASSERT_EQ(tables.error, "");
  int tenant_tables = 0;
  for (const auto& row : tables.rows) {
    EXPECT_EQ(row[2], "f") << row[0] << " belongs to the runtime role " << role_;
    if (row[0] == "schema_migrations") continue;
    if (row[0] == "leadership" || row[0] == "nodes") {
      // The cluster's lease and the nodes' reports: no tenant's data, row-level security and
      // no policy, so the runtime role reaches them only through keel_lead, keel_resign,
      // keel_node_report and keel_nodes.
      EXPECT_EQ(row[1], "t") << row[0] << " has no row-level security";
      EXPECT_EQ(row[3], "0") << row[0] << " has a policy";
      continue;
    }
    ++tenant_tables;
    EXPECT_EQ(row[1], "t") << row[0] << " has no row-level security";
    EXPECT_EQ(row[3], "1") << row[0] << " has no policy";
  }
  EXPECT_GE(tenant_tables, 19);  // 16 in migrations 1-4, the plugins' 3 in migration 5
}

// The tables with a tenant policy, each with the column that names the tenant.
std::vector<std::pair<std::string, std::string>> TenantTables(PgConn& c) {
  auto r = c.Exec("SELECT tablename FROM pg_policies WHERE schemaname = 'public' "
                  "ORDER BY tablename");
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& row : r.rows) out.emplace_back(row[0], row[0] == "tenants" ? "id" : "tenant_id");
  return out;
}

// Any role may set any custom setting: a setting that opened every tenant's rows (as app.system
// once did) would be a bypass for whoever can run SQL as the runtime role. None does.
TEST_F(PostgresRlsTest, NoSettingShowsAnotherTenantsRows) {
  const auto tables = TenantTables(*conn_);
  ASSERT_GE(tables.size(), 19u);
  for (const char* setting : {"app.system", "app.tenant_id_all", "row_security"}) {
    (void)conn_->Exec("SELECT set_config($1, 'on', false)", {setting});
  }
  for (const auto& [table, col] : tables) {
    EXPECT_EQ(Count(table), "0") << table << " shows rows without app.tenant_id";
  }
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  EXPECT_EQ(Count("tenants"), "1");
  EXPECT_EQ(Count("agents"), "3");
  for (const auto& [table, col] : tables) {
    EXPECT_EQ(Count(table, col + " <> '" + a_.id + "'"), "0") << table << " shows another tenant";
  }
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
  // The policies check app.tenant_id and nothing else.
  auto policies = conn_->Exec(
      "SELECT tablename, qual, coalesce(with_check, '') FROM pg_policies "
      "WHERE schemaname = 'public'");
  ASSERT_EQ(policies.error, "");
  for (const auto& row : policies.rows) {
    EXPECT_EQ(row[1].find("app.system"), std::string::npos) << row[0] << ": " << row[1];
    EXPECT_EQ(row[1].find(" OR "), std::string::npos) << row[0] << ": " << row[1];
    EXPECT_EQ(row[2].find(" OR "), std::string::npos) << row[0] << ": " << row[2];
  }
}

// The runtime role cannot switch row-level security off, replace the policies or the functions,
// take the tables, become the owner, or drop or empty a table.
TEST_F(PostgresRlsTest, TheRuntimeRoleCannotSwitchRowSecurityOff) {
  const std::string owner = PgUrl::Parse(db_.owner_url()).user();
  ASSERT_NE(owner, role_);
  const std::vector<std::string> attacks = {
      "ALTER TABLE agents NO FORCE ROW LEVEL SECURITY",
      "ALTER TABLE agents DISABLE ROW LEVEL SECURITY",
      "DROP POLICY tenant_isolation ON agents",
      "ALTER POLICY tenant_isolation ON agents USING (true)",
      "CREATE POLICY open ON agents USING (true)",
      "ALTER TABLE agents OWNER TO \"" + role_ + "\"",
      "DROP TABLE messages",
      "TRUNCATE messages",
      "SET ROLE \"" + owner + "\"",
      "ALTER FUNCTION keel_tenants() SECURITY INVOKER",
      "CREATE OR REPLACE FUNCTION keel_next_fire_at() RETURNS bigint LANGUAGE sql AS 'SELECT 1'",
      "CREATE TABLE mine(x int)",
      "GRANT \"" + owner + "\" TO \"" + role_ + "\"",
      "UPDATE schema_migrations SET version = version",
  };
  for (const auto& sql : attacks) {
    auto r = conn_->Exec(sql);
    EXPECT_NE(r.error, "") << "the runtime role ran: " << sql;
    EXPECT_EQ(r.sqlstate, "42501") << sql << ": " << r.error;  // insufficient_privilege
  }
  // Everything is as it was: B's rows are still hidden from A.
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  EXPECT_EQ(Count("agents"), "3");
  EXPECT_EQ(Count("messages", "tenant_id = '" + b_.id + "'"), "0");
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
}

// The runtime-wide functions run as the owner and see every tenant, so each returns only what
// its caller needs: keys (tenant_id, id), counts or times, and a token only for its hash. None
// is callable by PUBLIC, and they are all there is.
TEST_F(PostgresRlsTest, RuntimeWideFunctionsReturnOnlyKeys) {
  auto defs = conn_->Exec(
      "SELECT p.proname, pg_get_function_result(p.oid) FROM pg_proc p "
      "WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef ORDER BY p.proname");
  ASSERT_EQ(defs.error, "");
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"keel_active_token", "SETOF api_tokens"},
      // The approvals of channel runs without cards: keys only.
      {"keel_approvals_to_card", "TABLE(tenant_id text, id text)"},
      // Which node polls which channel until when: keys, node origins and times, and the
      // Telegram bot id the channel polled (a public number, what any chat with it shows).
      {"keel_channel_leases",
       "TABLE(tenant_id text, channel_id text, holder text, held_until bigint, bot text)"},
      // A delivery names only its channel: whose tenant it is, nothing of its contents.
      {"keel_channel_tenant", "text"},
      {"keel_claimable_runs", "TABLE(tenant_id text, id text)"},
      {"keel_due_deliveries", "TABLE(tenant_id text, id text)"},
      {"keel_due_introspections",
       "TABLE(tenant_id text, session_id text, agent_id text, due_at bigint)"},
      // The outbox's replies due, and the polled channels: keys only.
      {"keel_due_replies", "TABLE(tenant_id text, id text)"},
      {"keel_due_schedules", "TABLE(tenant_id text, id text)"},
      {"keel_expire_leases", "void"},
      {"keel_expired_approvals", "TABLE(tenant_id text, id text)"},
      {"keel_finish_import", "void"},
      {"keel_lead", "bigint"},
      {"keel_next_fire_at", "bigint"},
      // The fleet's: the nodes' own reports (no tenant's data) and a count of queued runs.
      {"keel_node_report", "void"},
      {"keel_nodes",
       "TABLE(origin text, address text, started_at bigint, seen_at bigint, runs_executing "
       "bigint, runs_finished bigint, leader boolean)"},
      {"keel_polled_channels", "TABLE(tenant_id text, id text)"},
      {"keel_prune_cache", "bigint"},
      {"keel_queued_runs", "bigint"},
      {"keel_renew_leases", "void"},
      {"keel_resign", "void"},
      {"keel_search_memories",
       "TABLE(id text, tenant_id text, agent_id text, text text, tags text, source text, "
       "created_at bigint, updated_at bigint, score real)"},
      {"keel_table_is_empty", "boolean"},
      {"keel_tenants", "SETOF tenants"},
      {"keel_unhashed_tenants", "TABLE(tenant_id text)"},
  };
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& row : defs.rows) got.emplace_back(row[0], row[1]);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(conn_->Value("SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a "
                         "WHERE p.pronamespace = 'public'::regnamespace AND a.grantee = 0"),
            "0")
      << "a function is executable by PUBLIC";
  // Their search_path is fixed.
  EXPECT_EQ(conn_->Value("SELECT count(*) FROM pg_proc p WHERE p.pronamespace = "
                         "'public'::regnamespace AND p.prosecdef AND NOT coalesce("
                         "'search_path=public, pg_temp' = ANY(p.proconfig), false)"),
            "0");

  // A queued run of each tenant: the claim function names them, nothing of their contents.
  ASSERT_NO_FATAL_FAILURE(Begin(b_.id));
  auto sess = conn_->Exec("SELECT id, agent_id FROM sessions ORDER BY id LIMIT 1");
  ASSERT_EQ(sess.error, "");
  ASSERT_EQ(sess.rows.size(), 1u);
  const std::string msg = NewId(), run = NewId();
  ASSERT_EQ(conn_->Exec("INSERT INTO messages(id, tenant_id, session_id, run_id, role, content, "
                        "idempotency_key, created_at) VALUES($1, $2, $3, $4, 'user', "
                        "'secret of B', '', 1)",
                        {msg, b_.id, sess.rows[0][0], run})
                .error,
            "");
  ASSERT_EQ(conn_->Exec("INSERT INTO runs(id, tenant_id, session_id, agent_id, message_id, status, "
                        "attempt, output, error, input_tokens, output_tokens, lease_owner, "
                        "lease_expires_at, cancel_requested, created_at) VALUES($1, $2, $3, $4, "
                        "$5, 'queued', 0, 'output of B', '', 0, 0, '', 0, 0, 1)",
                        {run, b_.id, sess.rows[0][0], sess.rows[0][1], msg})
                .error,
            "");
  ASSERT_EQ(conn_->Exec("COMMIT").error, "");
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  auto claim = conn_->Exec("SELECT * FROM keel_claimable_runs(0, NULL)");
  ASSERT_EQ(claim.error, "");
  ASSERT_EQ(claim.rows.size(), 1u);
  EXPECT_EQ(claim.rows[0], (std::vector<std::string>{b_.id, run}));
  // ... and the run's row itself stays out of A's reach.
  EXPECT_EQ(Count("runs", "id = '" + run + "'"), "0");
  EXPECT_EQ(Count("messages", "content LIKE '%secret%'"), "0");
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
  // A token only for its hash; tenants' names, not their data.
  EXPECT_EQ(conn_->Value("SELECT count(*) FROM keel_active_token('')"), "0");
  EXPECT_EQ(conn_->Value("SELECT count(*) FROM keel_active_token('%')"), "0");
  EXPECT_EQ(conn_->Value("SELECT count(*) FROM keel_tenants()"), "2");
  // The emptiness check answers for this schema's tables only.
  EXPECT_NE(conn_->Exec("SELECT keel_table_is_empty('pg_authid')").error, "");
  EXPECT_NE(conn_->Exec("SELECT keel_table_is_empty('agents; DROP TABLE runs')").error, "");
  EXPECT_EQ(conn_->Value("SELECT keel_table_is_empty('agents')"), "f");
}

// Memory search runs as the owner (so that the text index serves it under row-level security)
// and keeps tenants apart itself: it finds only memories of the tenant the transaction is
// bound to, whatever agent it is asked about, and none without a tenant.
TEST_F(PostgresRlsTest, MemorySearchSeesOnlyTheBoundTenant) {
  std::string agent_of[2];
  const Tenant* tenants[2] = {&a_, &b_};
  for (int i = 0; i < 2; ++i) {
    ASSERT_NO_FATAL_FAILURE(Begin(tenants[i]->id));
    agent_of[i] = conn_->Value("SELECT id FROM agents ORDER BY id LIMIT 1");
    ASSERT_EQ(
        conn_
            ->Exec("INSERT INTO memories(id, tenant_id, agent_id, text, tags, source, "
                   "created_at, updated_at) VALUES($1, $2, $3, $4, '[\"ops\"]', 'tool', 1, 1)",
                   {NewId(), tenants[i]->id, agent_of[i],
                    "the secret launch plan of tenant " + tenants[i]->name})
            .error,
        "");
    ASSERT_EQ(conn_->Exec("COMMIT").error, "");
  }
  const std::string search =
      "SELECT text FROM keel_search_memories($1, 'launch & plan', 'launch | plan', $2, 2000, 10)";
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  EXPECT_EQ(conn_->Value(search, {agent_of[0], ""}), "the secret launch plan of tenant a");
  EXPECT_EQ(conn_->Value(search, {agent_of[0], "ops"}), "the secret launch plan of tenant a");
  auto other = conn_->Exec(search, {agent_of[1], ""});  // B's agent, bound to A
  EXPECT_EQ(other.error, "");
  EXPECT_TRUE(other.rows.empty()) << "tenant A found a memory of tenant B";
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
  // Unbound: nothing, for either agent.
  for (const auto& agent : agent_of) {
    auto none = conn_->Exec(search, {agent, ""});
    EXPECT_EQ(none.error, "");
    EXPECT_TRUE(none.rows.empty()) << "a search without a tenant found a memory";
  }
  // A query made to look like SQL is only a query: it finds nothing of B's.
  ASSERT_NO_FATAL_FAILURE(Begin(a_.id));
  auto injected = conn_->Exec("SELECT * FROM keel_search_memories($1, $2, 'x', '', 2000, 10)",
                              {agent_of[1], "x') OR true OR ('"});
  EXPECT_TRUE(injected.rows.empty()) << "an injected query found a memory of tenant B";
  ASSERT_EQ(conn_->Exec("ROLLBACK").error, "");
}

// The leadership lease (migration 0021): one holder until it expires or resigns; the runtime
// role cannot read or write the row but through the two functions.
TEST_F(PostgresRlsTest, TheLeadershipLeaseHasOneHolderUntilItExpires) {
  // The store of SetUp led while it was open, and resigned when it closed.
  EXPECT_NE(conn_->Value("SELECT keel_lead('node-x', 60000)"), "");
  EXPECT_EQ(conn_->Value("SELECT keel_lead('node-y', 60000)"), "") << "two nodes lead at once";
  EXPECT_NE(conn_->Value("SELECT keel_lead('node-x', 60000)"), "") << "the holder cannot renew";
  // Not by hand: no row is visible, none can be changed or added.
  EXPECT_EQ(Count("leadership"), "0");
  auto stolen = conn_->Exec("UPDATE leadership SET origin = 'node-y'");
  EXPECT_TRUE(stolen.error.empty() ? stolen.affected == "0" : true)
      << "the lease was taken by hand";
  EXPECT_NE(conn_->Exec("INSERT INTO leadership VALUES (1, 'node-y', 0)").error, "");
  EXPECT_EQ(conn_->Value("SELECT keel_lead('node-y', 60000)"), "");
  // Resigned, or run out: the next node takes it.
  ASSERT_EQ(conn_->Exec("SELECT keel_resign('node-y')").error, "");  // not the holder: no effect
  EXPECT_EQ(conn_->Value("SELECT keel_lead('node-y', 60000)"), "");
  ASSERT_EQ(conn_->Exec("SELECT keel_resign('node-x')").error, "");
  EXPECT_NE(conn_->Value("SELECT keel_lead('node-y', 1)"), "");
  ::usleep(20 * 1000);
  EXPECT_NE(conn_->Value("SELECT keel_lead('node-x', 60000)"), "") << "an expired lease was kept";
  EXPECT_EQ(conn_->Value("SELECT keel_lead('node-y', 60000)"), "");
}

// The store refuses to run as a role that could switch the policies off, and on a schema that
// its owner has not migrated.
TEST_F(PostgresRlsTest, TheStoreRefusesTheOwnerRoleAndAnUnmigratedSchema) {
  StoreOptions o;
  o.origin = "node-owner";
  auto as_owner = OpenStore(db_.owner_url(), o);
  ASSERT_FALSE(as_owner.ok()) << "the store ran as the owner role";
  EXPECT_EQ(as_owner.status().code(), Code::kPermissionDenied) << as_owner.status().ToString();
  EXPECT_NE(as_owner.status().message().find("owns"), std::string::npos)
      << as_owner.status().ToString();
  Status same = MigrateStore(db_.owner_url(), db_.owner_url());
  EXPECT_EQ(same.code(), Code::kInvalidArgument) << same.ToString();
  EXPECT_TRUE(db_.Migrate().ok());  // again: nothing to apply, the grants once more

  PgUrl fresh = PgUrl::Parse(db_.url());
  fresh.db = db_.name() + "_e";
  ASSERT_TRUE(PgExec(db_.admin_url(), "CREATE DATABASE " + fresh.db + " OWNER \"" +
                                          PgUrl::Parse(db_.owner_url()).user() + "\"")
                  .ok());
  auto unmigrated = OpenStore(fresh.str(), o);
  EXPECT_FALSE(unmigrated.ok());
  EXPECT_EQ(unmigrated.status().code(), Code::kUnavailable) << unmigrated.status().ToString();
  EXPECT_NE(unmigrated.status().message().find("store_owner"), std::string::npos)
      << unmigrated.status().ToString();
  EXPECT_TRUE(PgExec(db_.admin_url(), "DROP DATABASE " + fresh.db + " WITH (FORCE)").ok());
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

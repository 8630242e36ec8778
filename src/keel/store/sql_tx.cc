#include "keel/store/sql_tx.h"

#include <algorithm>
#include <charconv>

#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/model/metering.h"
#include "keel/store/compaction_rows.h"
#include "keel/store/postgres/pg_conn.h"
#include "keel/store/row_images.h"
#include "keel/store/rows.h"
#include "keel/store/schedule_rows.h"
#include "keel/store/skill_rows.h"
#include "keel/store/sqlite/sqlite_db.h"
#include "keel/store/usage_rows.h"

namespace keel::store {
namespace {

using namespace rows;  // NOLINT: the shared record readers

// Every row of a query, each read by `read(row)`.
template <typename T, typename Row, typename ReadFn>
Result<std::vector<T>> Collect(Row& r, ReadFn read) {
  std::vector<T> out;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool more, r.Step());
    if (!more) break;
    out.push_back(read(r));
  }
  return out;
}

// A plugin's stamp: its id and update time.
template <typename Row>
PluginStamp ReadStamp(const Row& s) {
  return PluginStamp{s.Text(0), s.Int(1)};
}

// A Later read's taker of plugin stamps into `out` in id order, each id once: the stamp
// queries below give an agent's own plugins, then the tenant-wide ones ('*'), as two index
// lookups rather than one `IN` list, which SQLite would build as a temporary b-tree.
auto StampsInto(std::vector<PluginStamp>& out) {
  return [&out](auto& r) -> Status {
    out.clear();
    while (true) {
      KEEL_ASSIGN_OR_RETURN(bool row, r.Step());
      if (!row) return Status::Ok();
      PluginStamp stamp = ReadStamp(r);
      auto at =
          std::lower_bound(out.begin(), out.end(), stamp.id,
                           [](const PluginStamp& a, const std::string& id) { return a.id < id; });
      if (at == out.end() || at->id != stamp.id) out.insert(at, std::move(stamp));
    }
  };
}

// The stamps of the plugins enabled for the agent the query binds after this.
constexpr char kStampsFor[] =
    "SELECT p.id, p.updated_at FROM agent_plugins ap JOIN plugins p ON p.tenant_id=ap.tenant_id "
    "AND p.id=ap.plugin_id WHERE ap.tenant_id=$1 AND ap.agent_id=";

// A Later read's taker of every row into `out` (Collect).
template <typename T, typename ReadFn>
auto CollectInto(std::vector<T>& out, ReadFn read) {
  return [&out, read](auto& r) -> Status {
    KEEL_ASSIGN_OR_RETURN(out, Collect<T>(r, read));
    return Status::Ok();
  };
}

// The query's first row, or kNotFound `what`.
template <typename T, typename Row, typename ReadFn>
Result<T> One(Row& r, ReadFn read, const std::string& what) {
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return NotFound(what);
  return read(r);
}

// The query's first row, if any.
template <typename T, typename Row, typename ReadFn>
Result<std::optional<T>> Maybe(Row& r, ReadFn read) {
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return std::optional<T>();
  return std::optional<T>(read(r));
}

// A page of at most `limit` items from a query that asked for `limit + 1` rows: the extra row
// only says there is more. With `bytes`, the page also ends after the item its items' bytes
// reach kMaxPageBytes with, and the rows after it are not read.
template <typename T, typename Row, typename ReadFn, typename KeyFn>
Result<Paged<T>> PageOf(Row& r, ReadFn read, int limit, KeyFn key,
                        size_t (*bytes)(const T&) = nullptr) {
  Paged<T> page;
  size_t total = 0;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool more, r.Step());
    if (!more) break;
    if (static_cast<int>(page.items.size()) >= limit || total >= kMaxPageBytes) {
      page.next_cursor = EncodeCursor(key(page.items.back()));
      break;
    }
    page.items.push_back(read(r));
    if (bytes) total += bytes(page.items.back());
  }
  return page;
}

// An insert that said ON CONFLICT DO NOTHING: no row inserted is the duplicate `message`.
// Other integrity errors (a missing referenced row) are kConflict with the database's message.
Status Inserted(const Result<int64_t>& changed, const std::string& message) {
  if (!changed.ok()) return changed.status();
  if (*changed == 0) return Conflict(message);
  return Status::Ok();
}

// An update or delete: no row changed is kNotFound `message`.
Status Updated(const Result<int64_t>& changed, const std::string& message) {
  if (!changed.ok()) return changed.status();
  if (*changed == 0) return NotFound(message);
  return Status::Ok();
}

// "INSERT INTO table(cols) VALUES($1..$n) ON CONFLICT DO NOTHING".
std::string InsertSql(const char* table, const char* cols, int n) {
  return std::string("INSERT INTO ") + table + "(" + cols + ") VALUES(" + Placeholders(n) +
         ") ON CONFLICT DO NOTHING";
}

}  // namespace

template <typename Sql>
SqlTx<Sql>::SqlTx(Sql sql, std::string origin, std::string audit_key)
    : sql_(std::move(sql)), origin_(std::move(origin)), sealer_(std::move(audit_key)) {}

template <typename Sql>
Event& SqlTx<Sql>::NewAppended(NewEvent n) {
  Event& e = appended_.emplace_back();
  e.id = NewId();
  e.tenant_id = std::move(n.tenant_id);
  e.type = std::move(n.type);
  e.origin = origin_;
  e.agent_id = std::move(n.agent_id);
  e.session_id = std::move(n.session_id);
  e.run_id = std::move(n.run_id);
  e.payload = n.payload.is_object() ? std::move(n.payload) : Json::object();
  e.occurred_at = NowMillis();
  return e;
}

// ---- TenantStore

template <typename Sql>
Status SqlTx<Sql>::InsertTenant(const Tenant& t) {
  static const std::string kSql = InsertSql("tenants", "id, name, created_at", 3);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(t.id));  // a tenant's row is its own (the policy's check)
  return Inserted(sql_.Exec(kSql, t.id, t.name, t.created_at), "tenant already exists: " + t.id);
}

template <typename Sql>
Result<Tenant> SqlTx<Sql>::GetTenant(const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kTenantCols) + " FROM tenants WHERE id=$1";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, id));
  return One<Tenant>(r, ReadTenant<typename Sql::Row>, "tenant not found: " + id);
}

template <typename Sql>
Status SqlTx<Sql>::UpdateTenantSettings(const Tenant& t) {
  static const std::string kSql =
      "UPDATE tenants SET allow_host_exec=$1, allow_stdio_mcp=$2 WHERE id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(t.id));
  return Updated(sql_.Exec(kSql, t.allow_host_exec, t.allow_stdio_mcp, t.id),
                 "tenant not found: " + t.id);
}

template <typename Sql>
Status SqlTx<Sql>::SettingsVersionLater(const std::string& tenant_id, int64_t& out) {
  static const std::string kSql = "SELECT version FROM settings_versions WHERE tenant_id=$1";
  out = 0;
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.Later(
      kSql,
      [&out](typename Sql::Row& r) -> Status {
        KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
        if (found) out = r.Int(0);
        return Status::Ok();
      },
      tenant_id);
}

// ---- TokenStore

template <typename Sql>
Status SqlTx<Sql>::InsertToken(const Token& t) {
  static const std::string kSql = InsertSql("api_tokens", kTokenCols, 10);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(t.tenant_id));
  return Inserted(sql_.Exec(kSql, t.id, t.tenant_id, t.name, t.role, t.hash, t.created_at,
                            t.revoked_at, t.parent_id, t.expires_at, t.user_id),
                  "token already exists: " + t.id);
}

template <typename Sql>
Result<std::vector<Token>> SqlTx<Sql>::ListTokens(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kTokenCols) + " FROM api_tokens WHERE tenant_id=$1 ORDER BY id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  return Collect<Token>(r, ReadToken<typename Sql::Row>);
}

template <typename Sql>
Result<Token> SqlTx<Sql>::GetToken(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kTokenCols) + " FROM api_tokens WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Token>(r, ReadToken<typename Sql::Row>, "token not found: " + id);
}

template <typename Sql>
Status SqlTx<Sql>::RevokeToken(const std::string& tenant_id, const std::string& id, Millis at) {
  static const std::string kSql =
      "UPDATE api_tokens SET revoked_at=$1 WHERE tenant_id=$2 AND id=$3 AND revoked_at IS NULL";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, at, tenant_id, id), "token not found: " + id);
}

// ---- SecretStore

template <typename Sql>
Result<std::optional<TenantKey>> SqlTx<Sql>::GetTenantKey(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kTenantKeyCols) + " FROM tenant_keys WHERE tenant_id=$1";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  return Maybe<TenantKey>(r, ReadTenantKey<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::InsertTenantKey(const TenantKey& k) {
  static const std::string kSql = InsertSql("tenant_keys", kTenantKeyCols, 4);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(k.tenant_id));
  return Inserted(sql_.Exec(kSql, k.tenant_id, k.wrapped, k.kek_fingerprint, k.created_at),
                  "tenant " + k.tenant_id + " already has a data key");
}

template <typename Sql>
Status SqlTx<Sql>::PutSecret(const Secret& x) {
  static const std::string kSql =
      "INSERT INTO secrets(" + std::string(kSecretCols) +
      ") VALUES($1,$2,$3,$4,$5) ON CONFLICT(tenant_id, name) DO UPDATE SET "
      "sealed=excluded.sealed, updated_at=excluded.updated_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return sql_.Exec(kSql, x.tenant_id, x.name, x.sealed, x.created_at, x.updated_at).status();
}

template <typename Sql>
Result<Secret> SqlTx<Sql>::GetSecret(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql =
      "SELECT " + std::string(kSecretCols) + " FROM secrets WHERE tenant_id=$1 AND name=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, name));
  return One<Secret>(r, ReadSecret<typename Sql::Row>, "secret not found: " + name);
}

template <typename Sql>
Result<std::vector<Secret>> SqlTx<Sql>::ListSecrets(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kSecretCols) + " FROM secrets WHERE tenant_id=$1 ORDER BY name";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  return Collect<Secret>(r, ReadSecret<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::DeleteSecret(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql = "DELETE FROM secrets WHERE tenant_id=$1 AND name=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, name), "secret not found: " + name);
}

// ---- PolicyStore

template <typename Sql>
Result<std::optional<PolicyDoc>> SqlTx<Sql>::GetPolicy(const std::string& tenant_id,
                                                       const std::string& scope) {
  static const std::string kSql =
      "SELECT " + std::string(kPolicyCols) + " FROM policies WHERE tenant_id=$1 AND scope=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, scope));
  return Maybe<PolicyDoc>(r, ReadPolicy<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::PutPolicy(const PolicyDoc& p) {
  static const std::string kSql =
      "INSERT INTO policies(" + std::string(kPolicyCols) +
      ") VALUES($1,$2,$3,$4) ON CONFLICT(tenant_id, scope) DO UPDATE SET body=excluded.body, "
      "updated_at=excluded.updated_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(p.tenant_id));
  return sql_.Exec(kSql, p.tenant_id, p.scope, DumpJson(p.body), p.updated_at).status();
}

template <typename Sql>
Status SqlTx<Sql>::DeletePolicy(const std::string& tenant_id, const std::string& scope) {
  static const std::string kSql = "DELETE FROM policies WHERE tenant_id=$1 AND scope=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, scope),
                 scope.empty() ? "no tenant policy is set" : "no agent policy is set");
}

template <typename Sql>
Result<std::vector<EmergencyStop>> SqlTx<Sql>::ListStops(const std::string& tenant_id) {
  std::vector<EmergencyStop> out;
  KEEL_RETURN_IF_ERROR(ListStopsLater(tenant_id, out));
  KEEL_RETURN_IF_ERROR(sql_.Flush());
  return out;
}

template <typename Sql>
Status SqlTx<Sql>::ListStopsLater(const std::string& tenant_id, std::vector<EmergencyStop>& out) {
  static const std::string kSql = "SELECT " + std::string(kStopCols) +
                                  " FROM emergency_stops WHERE tenant_id=$1 ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.Later(kSql, CollectInto<EmergencyStop>(out, ReadStop<typename Sql::Row>), tenant_id);
}

template <typename Sql>
Status SqlTx<Sql>::PutStop(const EmergencyStop& x) {
  static const std::string kSql =
      "INSERT INTO emergency_stops(" + std::string(kStopCols) +
      ") VALUES($1,$2,$3,$4,$5) ON CONFLICT(tenant_id, agent_id) DO UPDATE SET "
      "reason=excluded.reason, created_by=excluded.created_by, created_at=excluded.created_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return sql_.Exec(kSql, x.tenant_id, x.agent_id, x.reason, x.created_by, x.created_at).status();
}

template <typename Sql>
Status SqlTx<Sql>::DeleteStop(const std::string& tenant_id, const std::string& agent_id) {
  static const std::string kSql = "DELETE FROM emergency_stops WHERE tenant_id=$1 AND agent_id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, agent_id), "no emergency stop is in force");
}

// ---- ApprovalStore

template <typename Sql>
Status SqlTx<Sql>::InsertApproval(const Approval& a) {
  static const std::string kSql = InsertSql("approvals", kApprovalCols, 17);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(a.tenant_id));
  return Inserted(sql_.Exec(kSql, a.id, a.tenant_id, a.run_id, a.session_id, a.agent_id, a.call_id,
                            a.tool, DumpJson(a.arguments), StoredJson(a.amended_arguments),
                            a.reason, a.status, a.requested_by, a.decided_by, a.decision_reason,
                            a.created_at, a.expires_at, a.decided_at),
                  "approval already exists: " + a.id);
}

template <typename Sql>
Status SqlTx<Sql>::UpdateApproval(const Approval& a) {
  static const std::string kSql =
      "UPDATE approvals SET status=$1, amended_arguments=$2, decided_by=$3, decision_reason=$4, "
      "decided_at=$5 WHERE tenant_id=$6 AND id=$7";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(a.tenant_id));
  return Updated(sql_.Exec(kSql, a.status, StoredJson(a.amended_arguments), a.decided_by,
                           a.decision_reason, a.decided_at, a.tenant_id, a.id),
                 "approval not found: " + a.id);
}

template <typename Sql>
Result<Approval> SqlTx<Sql>::GetApproval(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kApprovalCols) + " FROM approvals WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Approval>(r, ReadApproval<typename Sql::Row>, "approval not found: " + id);
}

template <typename Sql>
Result<Paged<Approval>> SqlTx<Sql>::ListApprovals(const std::string& tenant_id,
                                                  const std::string& status, const Page& page) {
  const int limit = ClampLimit(page.limit);
  // One statement per form, so that each keeps its index.
  static const std::string kAll = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE tenant_id=$1 AND id>$2 ORDER BY id "
                                  "LIMIT $3";
  static const std::string kOfStatus =
      "SELECT " + std::string(kApprovalCols) +
      " FROM approvals WHERE tenant_id=$1 AND status=$2 AND id>$3 ORDER BY id LIMIT $4";
  static const std::string kAllNewest = "SELECT " + std::string(kApprovalCols) +
                                        " FROM approvals WHERE tenant_id=$1 AND id<$2 ORDER BY "
                                        "id DESC LIMIT $3";
  static const std::string kOfStatusNewest =
      "SELECT " + std::string(kApprovalCols) +
      " FROM approvals WHERE tenant_id=$1 AND status=$2 AND id<$3 ORDER BY id DESC LIMIT $4";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  const std::string cursor = CursorFor(page);
  auto r =
      page.newest_first
          ? (status.empty() ? sql_.Query(kAllNewest, tenant_id, cursor, limit + 1)
                            : sql_.Query(kOfStatusNewest, tenant_id, status, cursor, limit + 1))
          : (status.empty() ? sql_.Query(kAll, tenant_id, cursor, limit + 1)
                            : sql_.Query(kOfStatus, tenant_id, status, cursor, limit + 1));
  if (!r.ok()) return r.status();
  return PageOf<Approval>(*r, ReadApproval<typename Sql::Row>, limit,
                          [](const Approval& a) { return a.id; });
}

template <typename Sql>
Result<std::optional<Approval>> SqlTx<Sql>::FindApprovalForCall(const std::string& tenant_id,
                                                                const std::string& run_id,
                                                                const std::string& call_id) {
  static const std::string kSql = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE tenant_id=$1 AND run_id=$2 AND call_id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, run_id, call_id));
  return Maybe<Approval>(r, ReadApproval<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::InsertStanding(const StandingApproval& x) {
  static const std::string kSql = InsertSql("standing_approvals", kStandingCols, 10);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return Inserted(
      sql_.Exec(kSql, x.id, x.tenant_id, x.agent_id, x.tool, StoredJson(x.arguments_match),
                x.created_by, x.approval_id, x.created_at, x.expires_at, x.revoked_at),
      "standing approval already exists: " + x.id);
}

template <typename Sql>
Result<std::vector<StandingApproval>> SqlTx<Sql>::ActiveStanding(const std::string& tenant_id,
                                                                 const std::string& agent_id,
                                                                 const std::string& tool,
                                                                 Millis now) {
  static const std::string kSql =
      "SELECT " + std::string(kStandingCols) +
      " FROM standing_approvals WHERE tenant_id=$1 AND agent_id=$2 AND tool=$3 AND "
      "revoked_at IS NULL AND expires_at>$4 ORDER BY id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, agent_id, tool, now));
  return Collect<StandingApproval>(r, ReadStanding<typename Sql::Row>);
}

template <typename Sql>
Result<std::vector<StandingApproval>> SqlTx<Sql>::ListStanding(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kStandingCols) +
                                  " FROM standing_approvals WHERE tenant_id=$1 ORDER BY id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  return Collect<StandingApproval>(r, ReadStanding<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::RevokeStanding(const std::string& tenant_id, const std::string& id, Millis at) {
  static const std::string kSql =
      "UPDATE standing_approvals SET revoked_at=$1 WHERE tenant_id=$2 AND id=$3 AND "
      "revoked_at IS NULL";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, at, tenant_id, id), "standing approval not found: " + id);
}

// ---- McpServerStore

template <typename Sql>
Status SqlTx<Sql>::InsertMcpServer(const McpServer& x) {
  static const std::string kSql = InsertSql("mcp_servers", kMcpServerCols, 6);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return Inserted(
      sql_.Exec(kSql, x.id, x.tenant_id, x.name, x.transport, DumpJson(x.config), x.created_at),
      "an MCP server named '" + x.name + "' exists");
}

template <typename Sql>
Result<McpServer> SqlTx<Sql>::GetMcpServer(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kMcpServerCols) + " FROM mcp_servers WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<McpServer>(r, ReadMcpServer<typename Sql::Row>, "MCP server not found: " + id);
}

template <typename Sql>
Result<McpServer> SqlTx<Sql>::GetMcpServerByName(const std::string& tenant_id,
                                                 const std::string& name) {
  static const std::string kSql =
      "SELECT " + std::string(kMcpServerCols) + " FROM mcp_servers WHERE tenant_id=$1 AND name=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, name));
  return One<McpServer>(r, ReadMcpServer<typename Sql::Row>, "MCP server not found: " + name);
}

template <typename Sql>
Result<std::vector<McpServer>> SqlTx<Sql>::ListMcpServers(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kMcpServerCols) +
                                  " FROM mcp_servers WHERE tenant_id=$1 ORDER BY name";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  return Collect<McpServer>(r, ReadMcpServer<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::DeleteMcpServer(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "DELETE FROM mcp_servers WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, id), "MCP server not found: " + id);
}

// ---- PluginStore

template <typename Sql>
Status SqlTx<Sql>::UpsertPlugin(const Plugin& p) {
  static const std::string kSql =
      "INSERT INTO plugins(" + std::string(kPluginCols) + ") VALUES(" + Placeholders(10) +
      ") ON CONFLICT(tenant_id, id) DO UPDATE SET name=excluded.name, "
      "version=excluded.version, kind=excluded.kind, manifest=excluded.manifest, "
      "source=excluded.source, config=excluded.config, updated_at=excluded.updated_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(p.tenant_id));
  return sql_
      .Exec(kSql, p.tenant_id, p.id, p.name, p.version, p.kind, DumpJson(p.manifest), p.source,
            DumpJson(p.config), p.created_at, p.updated_at)
      .status();
}

template <typename Sql>
Result<Plugin> SqlTx<Sql>::GetPlugin(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) + " FROM plugins WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Plugin>(r, ReadPlugin<typename Sql::Row>, "plugin not found: " + id);
}

template <typename Sql>
Result<std::vector<Plugin>> SqlTx<Sql>::ListPlugins(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) + " FROM plugins WHERE tenant_id=$1 ORDER BY id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  return Collect<Plugin>(r, ReadPlugin<typename Sql::Row>);
}

// The plugin's enablements and deliveries go with it (ON DELETE CASCADE).
template <typename Sql>
Status SqlTx<Sql>::DeletePlugin(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "DELETE FROM plugins WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, id), "plugin not found: " + id);
}

// The plugin's row stays locked until the transaction ends, so that it cannot be deleted between
// the check and the insert.
template <typename Sql>
Status SqlTx<Sql>::EnablePlugin(const PluginEnablement& e) {
  static const std::string kExists =
      "SELECT id FROM plugins WHERE tenant_id=$1 AND id=$2" + std::string(Sql::kLockKeyShare);
  static const std::string kSql = "INSERT INTO agent_plugins(" + std::string(kEnablementCols) +
                                  ") VALUES($1,$2,$3,$4) ON CONFLICT DO NOTHING";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(e.tenant_id));
  {
    KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kExists, e.tenant_id, e.plugin_id));
    KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
    if (!found) return NotFound("plugin not found: " + e.plugin_id);
  }
  return sql_.Exec(kSql, e.tenant_id, e.plugin_id, e.agent_id, e.created_at).status();
}

template <typename Sql>
Status SqlTx<Sql>::DisablePlugin(const std::string& tenant_id, const std::string& plugin_id,
                                 const std::string& agent_id) {
  static const std::string kSql =
      "DELETE FROM agent_plugins WHERE tenant_id=$1 AND plugin_id=$2 AND agent_id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, plugin_id, agent_id),
                 "plugin " + plugin_id + " is not enabled for agent " + agent_id);
}

template <typename Sql>
Result<std::vector<PluginEnablement>> SqlTx<Sql>::ListEnablements(const std::string& tenant_id,
                                                                  const std::string& plugin_id) {
  static const std::string kSql = "SELECT " + std::string(kEnablementCols) +
                                  " FROM agent_plugins WHERE tenant_id=$1 AND plugin_id=$2 "
                                  "ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, plugin_id));
  return Collect<PluginEnablement>(r, ReadEnablement<typename Sql::Row>);
}

template <typename Sql>
Result<std::vector<Plugin>> SqlTx<Sql>::PluginsForAgent(const std::string& tenant_id,
                                                        const std::string& agent_id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) +
      " FROM plugins WHERE tenant_id=$1 AND id IN (SELECT plugin_id FROM agent_plugins "
      "WHERE tenant_id=$1 AND agent_id IN ($2, '*')) ORDER BY id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, agent_id));
  return Collect<Plugin>(r, ReadPlugin<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::PluginStampsForAgentLater(const std::string& tenant_id,
                                             const std::string& agent_id,
                                             std::vector<PluginStamp>& out) {
  static const std::string kSql = std::string(kStampsFor) + "$2 UNION ALL " + kStampsFor + "'*'";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.Later(kSql, StampsInto(out), tenant_id, agent_id);
}

template <typename Sql>
Status SqlTx<Sql>::InsertDelivery(const PluginDelivery& d) {
  static const std::string kSql = InsertSql("plugin_deliveries", kDeliveryCols, 13);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(d.tenant_id));
  return Inserted(sql_.Exec(kSql, d.id, d.tenant_id, d.plugin_id, d.agent_id, d.event_type,
                            DumpJson(d.payload), d.status, d.attempts, d.next_attempt_at,
                            d.last_status, d.last_error, d.created_at, d.delivered_at),
                  "plugin delivery already exists: " + d.id);
}

template <typename Sql>
Status SqlTx<Sql>::UpdateDelivery(const PluginDelivery& d) {
  static const std::string kSql =
      "UPDATE plugin_deliveries SET status=$1, attempts=$2, next_attempt_at=$3, last_status=$4, "
      "last_error=$5, delivered_at=$6 WHERE tenant_id=$7 AND id=$8";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(d.tenant_id));
  return Updated(sql_.Exec(kSql, d.status, d.attempts, d.next_attempt_at, d.last_status,
                           d.last_error, d.delivered_at, d.tenant_id, d.id),
                 "plugin delivery not found: " + d.id);
}

template <typename Sql>
Result<PluginDelivery> SqlTx<Sql>::GetDelivery(const std::string& tenant_id,
                                               const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kDeliveryCols) +
                                  " FROM plugin_deliveries WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<PluginDelivery>(r, ReadDelivery<typename Sql::Row>,
                             "plugin delivery not found: " + id);
}

template <typename Sql>
Result<Paged<PluginDelivery>> SqlTx<Sql>::ListDeliveries(const std::string& tenant_id,
                                                         const std::string& plugin_id,
                                                         const std::string& status,
                                                         const Page& page) {
  const int limit = ClampLimit(page.limit);
  KEEL_ASSIGN_OR_RETURN(auto start, DeliveryCursorStart(page.cursor));
  static const std::string kAll =
      "SELECT " + std::string(kDeliveryCols) +
      " FROM plugin_deliveries WHERE tenant_id=$1 AND plugin_id=$2 AND (created_at, id) < "
      "($3, $4) ORDER BY created_at DESC, id DESC LIMIT $5";
  static const std::string kOfStatus =
      "SELECT " + std::string(kDeliveryCols) +
      " FROM plugin_deliveries WHERE tenant_id=$1 AND plugin_id=$2 AND status=$3 AND "
      "(created_at, id) < ($4, $5) ORDER BY created_at DESC, id DESC LIMIT $6";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  auto r = status.empty()
               ? sql_.Query(kAll, tenant_id, plugin_id, start.first, start.second, limit + 1)
               : sql_.Query(kOfStatus, tenant_id, plugin_id, status, start.first, start.second,
                            limit + 1);
  if (!r.ok()) return r.status();
  return PageOf<PluginDelivery>(*r, ReadDelivery<typename Sql::Row>, limit, DeliveryCursorKey);
}

// ---- AgentStore

template <typename Sql>
Status SqlTx<Sql>::InsertAgent(const Agent& a) {
  static const std::string kSql = InsertSql("agents", kAgentCols, 10);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(a.tenant_id));
  Status st = Inserted(
      sql_.Exec(kSql, a.id, a.tenant_id, a.name, a.model, a.instructions, DumpJson(a.tools),
                DumpJson(a.config), a.status, a.created_at, a.updated_at),
      "");
  // Any integrity failure of the insert is reported as the name being taken.
  if (st.code() == Code::kConflict) {
    return Conflict("an agent named '" + a.name + "' already exists");
  }
  return st;
}

template <typename Sql>
Status SqlTx<Sql>::UpdateAgent(const Agent& a) {
  // A rename onto a live agent's name updates nothing rather than failing the statement, so
  // the transaction stays usable; the unique index still catches a concurrent rename.
  static const std::string kSql =
      "UPDATE agents SET name=$1, model=$2, instructions=$3, tools=$4, config=$5, status=$6, "
      "updated_at=$7 WHERE tenant_id=$8 AND id=$9 AND ($6='deleted' OR NOT EXISTS ("
      "SELECT 1 FROM agents o WHERE o.tenant_id=$8 AND o.name=$1 AND o.status != 'deleted' "
      "AND o.id != $9))";
  static const std::string kExists = "SELECT 1 FROM agents WHERE tenant_id=$1 AND id=$2";
  const std::string taken = "an agent named '" + a.name + "' already exists";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(a.tenant_id));
  auto changed = sql_.Exec(kSql, a.name, a.model, a.instructions, DumpJson(a.tools),
                           DumpJson(a.config), a.status, a.updated_at, a.tenant_id, a.id);
  if (!changed.ok()) {
    if (changed.status().code() == Code::kConflict) return Conflict(taken);
    return changed.status();
  }
  if (*changed > 0) return Status::Ok();
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kExists, a.tenant_id, a.id));
  KEEL_ASSIGN_OR_RETURN(bool exists, r.Step());
  if (!exists) return NotFound("agent not found: " + a.id);
  return Conflict(taken);
}

template <typename Sql>
Result<Agent> SqlTx<Sql>::GetAgent(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                  " FROM agents WHERE tenant_id=$1 AND id=$2 AND "
                                  "status != 'deleted'";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Agent>(r, ReadAgent<typename Sql::Row>, "agent not found: " + id);
}

template <typename Sql>
Result<Agent> SqlTx<Sql>::GetAgentByName(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                  " FROM agents WHERE tenant_id=$1 AND name=$2 AND "
                                  "status != 'deleted'";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, name));
  return One<Agent>(r, ReadAgent<typename Sql::Row>, "agent not found: " + name);
}

template <typename Sql>
Result<Paged<Agent>> SqlTx<Sql>::ListAgents(const std::string& tenant_id, const Page& page) {
  const int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                  " FROM agents WHERE tenant_id=$1 AND id>$2 AND "
                                  "status != 'deleted' ORDER BY id LIMIT $3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, DecodeCursor(page.cursor), limit + 1));
  return PageOf<Agent>(r, ReadAgent<typename Sql::Row>, limit, [](const Agent& a) { return a.id; });
}

template <typename Sql>
Status SqlTx<Sql>::DeleteAgent(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "UPDATE agents SET status='deleted' WHERE tenant_id=$1 AND id=$2 AND status != 'deleted'";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, id), "agent not found: " + id);
}

// ---- SessionStore

template <typename Sql>
Status SqlTx<Sql>::InsertSession(const Session& x) {
  static const std::string kSql = InsertSql("sessions", kSessionCols, 10);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return Inserted(sql_.Exec(kSql, x.id, x.tenant_id, x.agent_id, x.status, x.title, x.created_at,
                            x.updated_at, x.description, x.created_by, x.instructions),
                  "session already exists: " + x.id);
}

template <typename Sql>
Status SqlTx<Sql>::UpdateSessionStatus(const std::string& tenant_id, const std::string& id,
                                       const std::string& status, Millis at) {
  static const std::string kSql =
      "UPDATE sessions SET status=$1, updated_at=$2 WHERE tenant_id=$3 AND id=$4";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.ExecChanging(NotFound("session not found: " + id), kSql, status, at, tenant_id, id);
}

template <typename Sql>
Result<Session> SqlTx<Sql>::GetSession(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kSessionCols) + " FROM sessions WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Session>(r, ReadSession<typename Sql::Row>, "session not found: " + id);
}

template <typename Sql>
Result<Paged<Session>> SqlTx<Sql>::ListSessions(const std::string& tenant_id,
                                                const std::string& agent_id, const Page& page,
                                                const std::string& opened_by) {
  const int limit = ClampLimit(page.limit);
  // A guest's filter is in the statement, so its pages are full and its cursors its own.
  static const std::string kMine = " AND ($5='' OR created_by=$5)";
  static const std::string kSql = "SELECT " + std::string(kSessionCols) +
                                  " FROM sessions WHERE tenant_id=$1 AND agent_id=$2 AND id>$3" +
                                  kMine + " ORDER BY id LIMIT $4";
  static const std::string kNewest = "SELECT " + std::string(kSessionCols) +
                                     " FROM sessions WHERE tenant_id=$1 AND agent_id=$2 AND "
                                     "id<$3" +
                                     kMine + " ORDER BY id DESC LIMIT $4";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(page.newest_first ? kNewest : kSql, tenant_id, agent_id,
                                           CursorFor(page), limit + 1, opened_by));
  return PageOf<Session>(r, ReadSession<typename Sql::Row>, limit,
                         [](const Session& x) { return x.id; });
}

// ---- MessageStore

template <typename Sql>
Status SqlTx<Sql>::InsertMessage(const Message& m) {
  // seq: the session's next, one probe of its unique index; the writer's serialization makes
  // it follow commit order.
  static const std::string kSql =
      "INSERT INTO messages(" + std::string(kMessageCols) +
      ", seq) VALUES($1,$2,$3,$4,$5,$6,$7,$8,"
      "(SELECT coalesce(max(seq),0)+1 FROM messages WHERE session_id=$3)) ON CONFLICT DO NOTHING";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(m.tenant_id));
  return sql_.ExecChanging(
      Conflict(m.idempotency_key.empty() ? "message already exists: " + m.id
                                         : "a message with idempotency key '" + m.idempotency_key +
                                               "' already exists in session " + m.session_id),
      kSql, m.id, m.tenant_id, m.session_id, m.run_id, m.role, m.content, m.idempotency_key,
      m.created_at);
}

template <typename Sql>
Result<Message> SqlTx<Sql>::GetMessage(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kMessageReadCols) + " FROM messages WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Message>(r, ReadMessage<typename Sql::Row>, "message not found: " + id);
}

template <typename Sql>
Result<std::optional<Message>> SqlTx<Sql>::FindByIdempotencyKey(const std::string& tenant_id,
                                                                const std::string& session_id,
                                                                const std::string& key) {
  static const std::string kSql = "SELECT " + std::string(kMessageReadCols) +
                                  " FROM messages WHERE tenant_id=$1 AND session_id=$2 "
                                  "AND idempotency_key=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, session_id, key));
  return Maybe<Message>(r, ReadMessage<typename Sql::Row>);
}

template <typename Sql>
Result<Paged<Message>> SqlTx<Sql>::ListMessages(const std::string& tenant_id,
                                                const std::string& session_id, const Page& page) {
  const int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kMessageReadCols) +
                                  " FROM messages WHERE session_id=$2 AND seq>$3 "
                                  "AND tenant_id=$1 ORDER BY seq LIMIT $4";
  int64_t after = 0;
  if (const std::string cursor = DecodeCursor(page.cursor); !cursor.empty()) {
    auto [end, ec] = std::from_chars(cursor.data(), cursor.data() + cursor.size(), after);
    if (ec != std::errc() || end != cursor.data() + cursor.size() || after < 0) {
      return InvalidArgument("cursor is not one this list gave");
    }
  }
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, session_id, after, limit + 1));
  return PageOf<Message>(
      r, ReadMessage<typename Sql::Row>, limit,
      [](const Message& m) { return std::to_string(m.seq); },
      +[](const Message& m) { return m.content.size(); });
}

template <typename Sql>
Result<std::vector<Message>> SqlTx<Sql>::RecentMessages(const std::string& tenant_id,
                                                        const std::string& session_id,
                                                        const std::string& after_id,
                                                        const std::string& before_id, int limit) {
  // The bounds' seqs, each one probe of the primary key; a before_id that is not the session's
  // message leaves nothing.
  static const std::string kSql =
      "SELECT " + std::string(kMessageReadCols) +
      " FROM messages WHERE session_id=$2 AND tenant_id=$1 "
      "AND seq>coalesce((SELECT seq FROM messages WHERE tenant_id=$1 AND session_id=$2 AND "
      "id=$3), 0) "
      "AND seq<(SELECT seq FROM messages WHERE tenant_id=$1 AND session_id=$2 AND id=$4) "
      "ORDER BY seq DESC LIMIT $5";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto r, sql_.Query(kSql, tenant_id, session_id, after_id, before_id, Sql::Limit(limit)));
  KEEL_ASSIGN_OR_RETURN(auto out, Collect<Message>(r, ReadMessage<typename Sql::Row>));
  std::reverse(out.begin(), out.end());
  return out;
}

// ---- RunStore

template <typename Sql>
Status SqlTx<Sql>::InsertRun(const Run& r) {
  static const std::string kSql = InsertSql("runs", kRunCols, 21);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(r.tenant_id));
  return sql_.ExecChanging(Conflict("run already exists: " + r.id), kSql, r.id, r.tenant_id,
                           r.session_id, r.agent_id, r.message_id, r.status, r.attempt, r.output,
                           StoredJson(r.error), r.input_tokens, r.output_tokens, r.lease_owner,
                           r.lease_expires_at, r.cancel_requested, r.created_at, r.started_at,
                           r.finished_at, r.requested_by, r.caller_role, r.user_id, r.channel_id);
}

template <typename Sql>
Status SqlTx<Sql>::EndHeldRun(const Run& r) {
  static const std::string kSql =
      "UPDATE runs SET status=$1, output=$2, error=$3, input_tokens=$4, output_tokens=$5, "
      "finished_at=$6, lease_expires_at=0 WHERE tenant_id=$7 AND id=$8 AND status='running' "
      "AND lease_owner=$9 AND attempt=$10";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(r.tenant_id));
  return sql_.ExecChanging(Conflict("run " + r.id + " is no longer held by this execution"), kSql,
                           r.status, r.output, StoredJson(r.error), r.input_tokens, r.output_tokens,
                           r.finished_at, r.tenant_id, r.id, r.lease_owner, r.attempt);
}

template <typename Sql>
Status SqlTx<Sql>::UpdateRun(const Run& r) {
  static const std::string kSql =
      "UPDATE runs SET status=$1, attempt=$2, output=$3, error=$4, input_tokens=$5, "
      "output_tokens=$6, lease_owner=$7, lease_expires_at=$8, cancel_requested=$9, "
      "started_at=$10, finished_at=$11 WHERE tenant_id=$12 AND id=$13";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(r.tenant_id));
  return sql_.ExecChanging(NotFound("run not found: " + r.id), kSql, r.status, r.attempt, r.output,
                           StoredJson(r.error), r.input_tokens, r.output_tokens, r.lease_owner,
                           r.lease_expires_at, r.cancel_requested, r.started_at, r.finished_at,
                           r.tenant_id, r.id);
}

template <typename Sql>
Result<Run> SqlTx<Sql>::GetRun(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kRunCols) + " FROM runs WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Run>(r, ReadRun<typename Sql::Row>, "run not found: " + id);
}

template <typename Sql>
Result<Run> SqlTx<Sql>::LockRun(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kRunCols) +
                                  " FROM runs WHERE tenant_id=$1 AND id=$2" +
                                  std::string(Sql::kLockSkipLocked);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  {
    KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
    KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
    if (found) return ReadRun(r);
  }
  // No row: absent, or locked by another transaction (which SKIP LOCKED passes over).
  KEEL_RETURN_IF_ERROR(GetRun(tenant_id, id).status());
  return Conflict("run " + id + " is locked by another transaction");
}

template <typename Sql>
Result<Paged<Run>> SqlTx<Sql>::ListRuns(const std::string& tenant_id, const RunFilter& filter,
                                        const Page& page) {
  const int limit = ClampLimit(page.limit);
  // One statement per form, so that each keeps its index (runs_session or runs_tenant); the
  // agent and the status filter the rows that index walks.
  static const std::string kRest =
      " AND ($3='' OR agent_id=$3) AND ($4='' OR status=$4) AND ($6='' OR EXISTS(SELECT 1 FROM "
      "sessions s WHERE s.tenant_id=$1 AND s.id=runs.session_id AND s.created_by=$6))";
  static const std::string kAll = "SELECT " + std::string(kRunCols) +
                                  " FROM runs WHERE tenant_id=$1 AND id>$2" + kRest +
                                  " ORDER BY id LIMIT $5";
  static const std::string kOfSession = "SELECT " + std::string(kRunCols) +
                                        " FROM runs WHERE tenant_id=$1 AND id>$2" + kRest +
                                        " AND session_id=$7 ORDER BY id LIMIT $5";
  static const std::string kAllNewest = "SELECT " + std::string(kRunCols) +
                                        " FROM runs WHERE tenant_id=$1 AND id<$2" + kRest +
                                        " ORDER BY id DESC LIMIT $5";
  static const std::string kOfSessionNewest = "SELECT " + std::string(kRunCols) +
                                              " FROM runs WHERE tenant_id=$1 AND id<$2" + kRest +
                                              " AND session_id=$7 ORDER BY id DESC LIMIT $5";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  const std::string cursor = CursorFor(page);
  const bool all = filter.session_id.empty();
  const auto& a = filter.agent_id;
  const auto& s = filter.status;
  const auto& o = filter.opened_by;
  auto r = page.newest_first ? (all ? sql_.Query(kAllNewest, tenant_id, cursor, a, s, limit + 1, o)
                                    : sql_.Query(kOfSessionNewest, tenant_id, cursor, a, s,
                                                 limit + 1, o, filter.session_id))
                             : (all ? sql_.Query(kAll, tenant_id, cursor, a, s, limit + 1, o)
                                    : sql_.Query(kOfSession, tenant_id, cursor, a, s, limit + 1, o,
                                                 filter.session_id));
  if (!r.ok()) return r.status();
  return PageOf<Run>(*r, ReadRun<typename Sql::Row>, limit, [](const Run& x) { return x.id; });
}

template <typename Sql>
Result<int64_t> SqlTx<Sql>::CountActiveRuns(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT count(*) FROM runs WHERE tenant_id=$1 AND status IN ('queued','running')";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  return found ? r.Int(0) : 0;
}

template <typename Sql>
Status SqlTx<Sql>::InsertStep(const Step& x) {
  static const std::string kSql = InsertSql("run_steps", kStepCols, 10);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return sql_.ExecChanging(
      Conflict("step " + std::to_string(x.seq) + " of run " + x.run_id + " already exists"), kSql,
      x.id, x.tenant_id, x.run_id, x.seq, x.kind, x.status, DumpJson(x.input), DumpJson(x.output),
      x.started_at, x.finished_at);
}

template <typename Sql>
Status SqlTx<Sql>::UpdateStep(const Step& x) {
  static const std::string kSql =
      "UPDATE run_steps SET status=$1, input=$2, output=$3, finished_at=$4 WHERE tenant_id=$5 "
      "AND id=$6";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return sql_.ExecChanging(NotFound("step not found: " + x.id), kSql, x.status, DumpJson(x.input),
                           DumpJson(x.output), x.finished_at, x.tenant_id, x.id);
}

template <typename Sql>
Result<std::vector<Step>> SqlTx<Sql>::ListSteps(const std::string& tenant_id,
                                                const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kStepCols) +
                                  " FROM run_steps WHERE tenant_id=$1 AND run_id=$2 ORDER BY seq";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, run_id));
  return Collect<Step>(r, ReadStep<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::InsertToolCall(const ToolCall& c) {
  static const std::string kSql = InsertSql("tool_calls", kToolCallCols, 13);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(c.tenant_id));
  return Inserted(sql_.Exec(kSql, c.id, c.tenant_id, c.run_id, c.step_id, c.call_id, c.tool,
                            DumpJson(c.arguments), c.effect_class, c.effect_key, c.status,
                            DumpJson(c.result), c.created_at, c.updated_at),
                  "tool call " + c.call_id + " of run " + c.run_id + " already exists");
}

template <typename Sql>
Status SqlTx<Sql>::UpdateToolCall(const ToolCall& c) {
  static const std::string kSql =
      "UPDATE tool_calls SET status=$1, arguments=$2, result=$3, updated_at=$4 WHERE "
      "tenant_id=$5 AND id=$6";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(c.tenant_id));
  return Updated(sql_.Exec(kSql, c.status, DumpJson(c.arguments), DumpJson(c.result), c.updated_at,
                           c.tenant_id, c.id),
                 "tool call not found: " + c.id);
}

template <typename Sql>
Result<std::vector<ToolCall>> SqlTx<Sql>::ListToolCalls(const std::string& tenant_id,
                                                        const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kToolCallCols) +
                                  " FROM tool_calls WHERE tenant_id=$1 AND run_id=$2 ORDER BY id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, run_id));
  return Collect<ToolCall>(r, ReadToolCall<typename Sql::Row>);
}

// ---- UserStore

template <typename Sql>
Status SqlTx<Sql>::InsertUser(const User& u) {
  static const std::string kSql = InsertSql("users", kUserCols, 6);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(u.tenant_id));
  return Inserted(
      sql_.Exec(kSql, u.id, u.tenant_id, u.name, u.merged_into, u.created_at, u.updated_at),
      "user already exists: " + u.id);
}

template <typename Sql>
Status SqlTx<Sql>::UpdateUser(const User& u) {
  static const std::string kSql =
      "UPDATE users SET name=$1, merged_into=$2, updated_at=$3 WHERE tenant_id=$4 AND id=$5";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(u.tenant_id));
  return Updated(sql_.Exec(kSql, u.name, u.merged_into, u.updated_at, u.tenant_id, u.id),
                 "user not found: " + u.id);
}

template <typename Sql>
Result<User> SqlTx<Sql>::GetUser(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kUserCols) + " FROM users WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<User>(r, ReadUser<typename Sql::Row>, "user not found: " + id);
}

template <typename Sql>
Result<Paged<User>> SqlTx<Sql>::ListUsers(const std::string& tenant_id, const Page& page) {
  static const std::string kSql = "SELECT " + std::string(kUserCols) +
                                  " FROM users WHERE tenant_id=$1 AND id>$2 ORDER BY id LIMIT $3";
  const int limit = ClampLimit(page.limit);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, DecodeCursor(page.cursor), limit + 1));
  return PageOf<User>(r, ReadUser<typename Sql::Row>, limit, [](const User& x) { return x.id; });
}

template <typename Sql>
Result<std::vector<User>> SqlTx<Sql>::MergedInto(const std::string& tenant_id,
                                                 const std::string& user_id) {
  static const std::string kSql = "SELECT " + std::string(kUserCols) +
                                  " FROM users WHERE tenant_id=$1 AND merged_into=$2 ORDER BY id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, user_id));
  return Collect<User>(r, ReadUser<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::InsertIdentity(const Identity& i) {
  static const std::string kSql = InsertSql("identities", kIdentityCols, 6);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(i.tenant_id));
  return Inserted(
      sql_.Exec(kSql, i.tenant_id, i.platform, i.platform_user_id, i.user_id, i.name, i.created_at),
      "identity " + i.platform + ":" + i.platform_user_id + " belongs to a user already");
}

template <typename Sql>
Status SqlTx<Sql>::UpdateIdentity(const Identity& i) {
  static const std::string kSql =
      "UPDATE identities SET user_id=$1 WHERE tenant_id=$2 AND platform=$3 AND "
      "platform_user_id=$4";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(i.tenant_id));
  return Updated(sql_.Exec(kSql, i.user_id, i.tenant_id, i.platform, i.platform_user_id),
                 "identity not found: " + i.platform + ":" + i.platform_user_id);
}

template <typename Sql>
Status SqlTx<Sql>::DeleteIdentity(const std::string& tenant_id, const std::string& platform,
                                  const std::string& platform_user_id) {
  static const std::string kSql =
      "DELETE FROM identities WHERE tenant_id=$1 AND platform=$2 AND platform_user_id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, platform, platform_user_id),
                 "identity not found: " + platform + ":" + platform_user_id);
}

template <typename Sql>
Result<std::optional<Identity>> SqlTx<Sql>::FindIdentity(const std::string& tenant_id,
                                                         const std::string& platform,
                                                         const std::string& platform_user_id) {
  static const std::string kSql = "SELECT " + std::string(kIdentityCols) +
                                  " FROM identities WHERE tenant_id=$1 AND platform=$2 AND "
                                  "platform_user_id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, platform, platform_user_id));
  return Maybe<Identity>(r, ReadIdentity<typename Sql::Row>);
}

template <typename Sql>
Result<std::vector<Identity>> SqlTx<Sql>::UserIdentities(const std::string& tenant_id,
                                                         const std::string& user_id) {
  static const std::string kSql = "SELECT " + std::string(kIdentityCols) +
                                  " FROM identities WHERE tenant_id=$1 AND user_id=$2 ORDER BY "
                                  "platform, platform_user_id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, user_id));
  return Collect<Identity>(r, ReadIdentity<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::PutMember(const AgentMember& m) {
  static const std::string kSql =
      "INSERT INTO agent_members(" + std::string(kMemberCols) +
      ") VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT(tenant_id, agent_id, user_id) DO UPDATE SET "
      "role=excluded.role, updated_at=excluded.updated_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(m.tenant_id));
  return sql_.Exec(kSql, m.tenant_id, m.agent_id, m.user_id, m.role, m.created_at, m.updated_at)
      .status();
}

template <typename Sql>
Status SqlTx<Sql>::DeleteMember(const std::string& tenant_id, const std::string& agent_id,
                                const std::string& user_id) {
  static const std::string kSql =
      "DELETE FROM agent_members WHERE tenant_id=$1 AND agent_id=$2 AND user_id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, agent_id, user_id), "member not found: " + user_id);
}

template <typename Sql>
Result<std::optional<AgentMember>> SqlTx<Sql>::GetMember(const std::string& tenant_id,
                                                         const std::string& agent_id,
                                                         const std::string& user_id) {
  static const std::string kSql = "SELECT " + std::string(kMemberCols) +
                                  " FROM agent_members WHERE tenant_id=$1 AND agent_id=$2 AND "
                                  "user_id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, agent_id, user_id));
  return Maybe<AgentMember>(r, ReadMember<typename Sql::Row>);
}

template <typename Sql>
Result<Paged<AgentMember>> SqlTx<Sql>::ListMembers(const std::string& tenant_id,
                                                   const std::string& agent_id, const Page& page) {
  static const std::string kSql = "SELECT " + std::string(kMemberCols) +
                                  " FROM agent_members WHERE tenant_id=$1 AND agent_id=$2 AND "
                                  "user_id>$3 ORDER BY user_id LIMIT $4";
  const int limit = ClampLimit(page.limit);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto r, sql_.Query(kSql, tenant_id, agent_id, DecodeCursor(page.cursor), limit + 1));
  return PageOf<AgentMember>(r, ReadMember<typename Sql::Row>, limit,
                             [](const AgentMember& x) { return x.user_id; });
}

template <typename Sql>
Result<std::vector<AgentMember>> SqlTx<Sql>::UserMemberships(const std::string& tenant_id,
                                                             const std::string& user_id) {
  static const std::string kSql =
      "SELECT " + std::string(kMemberCols) +
      " FROM agent_members WHERE tenant_id=$1 AND user_id=$2 ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, user_id));
  return Collect<AgentMember>(r, ReadMember<typename Sql::Row>);
}

template <typename Sql>
Result<std::optional<AgentAccess>> SqlTx<Sql>::GetAccess(const std::string& tenant_id,
                                                         const std::string& agent_id) {
  static const std::string kSql =
      "SELECT level, code_set, updated_at, guest_daily_tokens FROM agent_access WHERE "
      "tenant_id=$1 AND agent_id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, agent_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return std::optional<AgentAccess>();
  return std::optional<AgentAccess>(
      AgentAccess{tenant_id, agent_id, r.Text(0), r.Int(1) != 0, r.Int(3), r.Int(2)});
}

template <typename Sql>
Status SqlTx<Sql>::PutAccess(const AgentAccess& a) {
  static const std::string kSql =
      "INSERT INTO agent_access(tenant_id, agent_id, level, code_set, updated_at, "
      "guest_daily_tokens) VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT(tenant_id, agent_id) DO UPDATE "
      "SET level=excluded.level, code_set=excluded.code_set, updated_at=excluded.updated_at, "
      "guest_daily_tokens=excluded.guest_daily_tokens";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(a.tenant_id));
  return sql_
      .Exec(kSql, a.tenant_id, a.agent_id, a.level, int64_t{a.code_set ? 1 : 0}, a.updated_at,
            a.guest_daily_tokens)
      .status();
}

// ---- ChannelStore

template <typename Sql>
Status SqlTx<Sql>::InsertChannel(const Channel& c) {
  static const std::string kSql = InsertSql("channels", kChannelCols, 10);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(c.tenant_id));
  return Inserted(sql_.Exec(kSql, c.id, c.tenant_id, c.agent_id, c.kind, c.name, c.settings,
                            int64_t{c.enabled ? 1 : 0}, c.created_by, c.created_at, c.updated_at),
                  "the agent has a channel named '" + c.name + "' already");
}

template <typename Sql>
Status SqlTx<Sql>::UpdateChannel(const Channel& c) {
  // The name's uniqueness is checked first, so that a clash is a kConflict on both backends and
  // leaves the transaction usable.
  static const std::string kClash =
      "SELECT 1 FROM channels WHERE tenant_id=$1 AND agent_id=$2 AND name=$3 AND id<>$4";
  static const std::string kSql =
      "UPDATE channels SET name=$1, settings=$2, enabled=$3, updated_at=$4 "
      "WHERE tenant_id=$5 AND id=$6";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(c.tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto clash, sql_.Query(kClash, c.tenant_id, c.agent_id, c.name, c.id));
  KEEL_ASSIGN_OR_RETURN(bool taken, clash.Step());
  if (taken) return Conflict("the agent has a channel named '" + c.name + "' already");
  return Updated(sql_.Exec(kSql, c.name, c.settings, int64_t{c.enabled ? 1 : 0}, c.updated_at,
                           c.tenant_id, c.id),
                 "channel not found: " + c.id);
}

template <typename Sql>
Result<Channel> SqlTx<Sql>::GetChannel(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kChannelCols) + " FROM channels WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Channel>(r, ReadChannel<typename Sql::Row>, "channel not found: " + id);
}

template <typename Sql>
Result<Paged<Channel>> SqlTx<Sql>::ListChannels(const std::string& tenant_id,
                                                const std::string& agent_id, const Page& page) {
  static const std::string kSql =
      "SELECT " + std::string(kChannelCols) +
      " FROM channels WHERE tenant_id=$1 AND ($2='' OR agent_id=$2) AND id>$3 ORDER BY id "
      "LIMIT $4";
  const int limit = ClampLimit(page.limit);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto r, sql_.Query(kSql, tenant_id, agent_id, DecodeCursor(page.cursor), limit + 1));
  return PageOf<Channel>(r, ReadChannel<typename Sql::Row>, limit,
                         [](const Channel& x) { return x.id; });
}

template <typename Sql>
Status SqlTx<Sql>::DeleteChannel(const std::string& tenant_id, const std::string& id) {
  static const std::string kConversations =
      "DELETE FROM channel_conversations WHERE tenant_id=$1 AND channel_id=$2";
  static const std::string kDeliveries =
      "DELETE FROM channel_deliveries WHERE tenant_id=$1 AND channel_id=$2";
  static const std::string kPolls =
      "DELETE FROM channel_polls WHERE tenant_id=$1 AND channel_id=$2";
  static const std::string kReplies =
      "DELETE FROM channel_replies WHERE tenant_id=$1 AND channel_id=$2";
  static const std::string kSql = "DELETE FROM channels WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_RETURN_IF_ERROR(sql_.Exec(kConversations, tenant_id, id).status());
  KEEL_RETURN_IF_ERROR(sql_.Exec(kDeliveries, tenant_id, id).status());
  KEEL_RETURN_IF_ERROR(sql_.Exec(kPolls, tenant_id, id).status());
  KEEL_RETURN_IF_ERROR(sql_.Exec(kReplies, tenant_id, id).status());
  return Updated(sql_.Exec(kSql, tenant_id, id), "channel not found: " + id);
}

template <typename Sql>
Result<std::optional<ChannelConversation>> SqlTx<Sql>::GetConversation(
    const std::string& tenant_id, const std::string& channel_id, const std::string& conversation) {
  static const std::string kSql =
      "SELECT session_id, created_at, contact FROM channel_conversations WHERE tenant_id=$1 AND "
      "channel_id=$2 AND conversation=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, channel_id, conversation));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return std::optional<ChannelConversation>();
  return std::optional<ChannelConversation>(
      ChannelConversation{tenant_id, channel_id, conversation, r.Text(0), r.Int(1), r.Text(2)});
}

template <typename Sql>
Status SqlTx<Sql>::InsertConversation(const ChannelConversation& c) {
  static const std::string kSql =
      "INSERT INTO channel_conversations(tenant_id, channel_id, conversation, session_id, "
      "created_at, contact) VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT DO NOTHING";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(c.tenant_id));
  return Inserted(sql_.Exec(kSql, c.tenant_id, c.channel_id, c.conversation, c.session_id,
                            c.created_at, c.contact),
                  "the channel has that conversation already");
}

template <typename Sql>
Result<bool> SqlTx<Sql>::SetConversationContact(const std::string& tenant_id,
                                                const std::string& channel_id,
                                                const std::string& conversation,
                                                const std::string& contact) {
  static const std::string kSql =
      "UPDATE channel_conversations SET contact=$4 WHERE tenant_id=$1 AND channel_id=$2 AND "
      "conversation=$3 AND contact=''";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(int64_t changed,
                        sql_.Exec(kSql, tenant_id, channel_id, conversation, contact));
  return changed > 0;
}

template <typename Sql>
Result<std::optional<std::string>> SqlTx<Sql>::DeliverySession(const std::string& tenant_id,
                                                               const std::string& channel_id,
                                                               const std::string& delivery_id) {
  static const std::string kSql =
      "SELECT session_id FROM channel_deliveries WHERE tenant_id=$1 AND channel_id=$2 AND "
      "delivery_id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, channel_id, delivery_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return std::optional<std::string>();
  return std::optional<std::string>(r.Text(0));
}

template <typename Sql>
Status SqlTx<Sql>::InsertDelivery(const ChannelDelivery& d) {
  static const std::string kSql =
      "INSERT INTO channel_deliveries(tenant_id, channel_id, delivery_id, session_id, "
      "created_at) VALUES($1,$2,$3,$4,$5) ON CONFLICT DO NOTHING";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(d.tenant_id));
  return Inserted(
      sql_.Exec(kSql, d.tenant_id, d.channel_id, d.delivery_id, d.session_id, d.created_at),
      "the channel has taken delivery " + d.delivery_id + " already");
}

template <typename Sql>
Result<std::optional<ChannelPoll>> SqlTx<Sql>::GetPoll(const std::string& tenant_id,
                                                       const std::string& channel_id) {
  static const std::string kSql =
      "SELECT cursor, error, updated_at FROM channel_polls WHERE tenant_id=$1 AND channel_id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, channel_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return std::optional<ChannelPoll>();
  return std::optional<ChannelPoll>(
      ChannelPoll{tenant_id, channel_id, r.Text(0), r.Text(1), r.Int(2)});
}

template <typename Sql>
Status SqlTx<Sql>::PutPoll(const ChannelPoll& p) {
  static const std::string kSql =
      "INSERT INTO channel_polls(tenant_id, channel_id, cursor, error, updated_at) "
      "VALUES($1,$2,$3,$4,$5) ON CONFLICT(channel_id) DO UPDATE SET cursor=excluded.cursor, "
      "error=excluded.error, updated_at=excluded.updated_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(p.tenant_id));
  return sql_.Exec(kSql, p.tenant_id, p.channel_id, p.cursor, p.error, p.updated_at).status();
}

template <typename Sql>
Result<bool> SqlTx<Sql>::LeaseChannel(const std::string& tenant_id, const std::string& channel_id,
                                      const std::string& origin, Millis now, Millis until) {
  static const std::string kSql =
      "INSERT INTO channel_polls(tenant_id, channel_id, cursor, error, updated_at, holder, "
      "held_until) SELECT tenant_id, id, '', '', CAST($4 AS BIGINT), $3, CAST($5 AS BIGINT) "
      "FROM channels WHERE tenant_id=$1 AND id=$2 ON CONFLICT(channel_id) DO UPDATE SET "
      "holder=excluded.holder, held_until=excluded.held_until WHERE "
      "channel_polls.holder=excluded.holder OR channel_polls.held_until<CAST($4 AS BIGINT)";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(int64_t changed,
                        sql_.Exec(kSql, tenant_id, channel_id, origin, now, until));
  return changed > 0;
}

template <typename Sql>
Status SqlTx<Sql>::InsertReply(const ChannelReply& x) {
  static const std::string kSql = InsertSql("channel_replies", rows::kReplyCols, 20);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return Inserted(
      sql_.Exec(kSql, x.id, x.tenant_id, x.channel_id, x.agent_id, x.session_id, x.run_id,
                x.delivery_id, x.target, x.status, x.text, int64_t{x.parts_sent},
                int64_t{x.attempts}, x.next_attempt_at, x.origin, x.error, x.created_at,
                x.updated_at, x.approval_id, x.user_id, x.message),
      "the channel has a reply to delivery " + x.delivery_id + " already");
}

template <typename Sql>
Status SqlTx<Sql>::UpdateReply(const ChannelReply& x) {
  static const std::string kSql =
      "UPDATE channel_replies SET status=$1, text=$2, parts_sent=$3, attempts=$4, "
      "next_attempt_at=$5, origin=$6, error=$7, updated_at=$8, message=$9 WHERE tenant_id=$10 "
      "AND id=$11";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return Updated(
      sql_.Exec(kSql, x.status, x.text, int64_t{x.parts_sent}, int64_t{x.attempts},
                x.next_attempt_at, x.origin, x.error, x.updated_at, x.message, x.tenant_id, x.id),
      "channel reply not found: " + x.id);
}

template <typename Sql>
Result<Paged<ChannelReply>> SqlTx<Sql>::ListReplies(const std::string& tenant_id,
                                                    const std::string& channel_id,
                                                    const std::string& status, const Page& page) {
  // One statement per form, so that each keeps the channel's index.
  static const std::string kFrom =
      "SELECT " + std::string(rows::kReplyCols) +
      " FROM channel_replies WHERE tenant_id=$1 AND channel_id=$2 AND ";
  static const std::string kAll = kFrom + "id>$3 ORDER BY id LIMIT $4";
  static const std::string kOfStatus = kFrom + "status=$3 AND id>$4 ORDER BY id LIMIT $5";
  static const std::string kAllNewest = kFrom + "id<$3 ORDER BY id DESC LIMIT $4";
  static const std::string kOfStatusNewest =
      kFrom + "status=$3 AND id<$4 ORDER BY id DESC LIMIT $5";
  const int limit = ClampLimit(page.limit);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  const std::string cursor = CursorFor(page);
  auto r = page.newest_first
               ? (status.empty() ? sql_.Query(kAllNewest, tenant_id, channel_id, cursor, limit + 1)
                                 : sql_.Query(kOfStatusNewest, tenant_id, channel_id, status,
                                              cursor, limit + 1))
               : (status.empty()
                      ? sql_.Query(kAll, tenant_id, channel_id, cursor, limit + 1)
                      : sql_.Query(kOfStatus, tenant_id, channel_id, status, cursor, limit + 1));
  if (!r.ok()) return r.status();
  return PageOf<ChannelReply>(*r, rows::ReadReply<typename Sql::Row>, limit,
                              [](const ChannelReply& x) { return x.id; });
}

template <typename Sql>
Result<std::optional<std::string>> SqlTx<Sql>::ContactConversation(const std::string& tenant_id,
                                                                   const std::string& channel_id,
                                                                   const std::string& contact) {
  static const std::string kSql =
      "SELECT conversation FROM channel_conversations WHERE tenant_id=$1 AND channel_id=$2 AND "
      "contact=$3 AND contact<>'' ORDER BY created_at DESC LIMIT 1";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, channel_id, contact));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return std::optional<std::string>();
  return std::optional<std::string>(r.Text(0));
}

template <typename Sql>
Result<std::vector<ChannelReply>> SqlTx<Sql>::ApprovalCards(const std::string& tenant_id,
                                                            const std::string& approval_id) {
  static const std::string kSql =
      "SELECT " + std::string(rows::kReplyCols) +
      " FROM channel_replies WHERE tenant_id=$1 AND approval_id=$2 AND approval_id<>'' "
      "ORDER BY id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, approval_id));
  return Collect<ChannelReply>(r, rows::ReadReply<typename Sql::Row>);
}

template <typename Sql>
Result<int64_t> SqlTx<Sql>::UserTokensSince(const std::string& tenant_id,
                                            const std::string& agent_id, const std::string& user_id,
                                            Millis since) {
  static const std::string kSql =
      "SELECT COALESCE(SUM(u.input_tokens + u.output_tokens), 0) FROM channel_replies r JOIN "
      "model_usage u ON u.tenant_id=r.tenant_id AND u.run_id=r.run_id WHERE r.tenant_id=$1 AND "
      "r.user_id=$2 AND r.created_at>=$3 AND r.agent_id=$4 AND r.approval_id=''";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, user_id, since, agent_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  return found ? r.Int(0) : 0;
}

template <typename Sql>
Result<std::optional<ChannelReply>> SqlTx<Sql>::RunReply(const std::string& tenant_id,
                                                         const std::string& run_id) {
  static const std::string kSql =
      "SELECT " + std::string(rows::kReplyCols) +
      " FROM channel_replies WHERE tenant_id=$1 AND run_id=$2 AND approval_id='' ORDER BY id "
      "LIMIT 1";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, run_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return std::optional<ChannelReply>();
  return std::optional<ChannelReply>(rows::ReadReply<typename Sql::Row>(r));
}

// ---- ScheduleStore

template <typename Sql>
Status SqlTx<Sql>::InsertSchedule(const Schedule& x) {
  static const std::string kSql = InsertSql("schedules", kScheduleCols, 20);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return Inserted(
      sql_.Exec(kSql, x.id, x.tenant_id, x.agent_id, x.name, x.kind, x.cron, x.at, x.timezone,
                x.prompt, x.session_id, x.missed, x.status, x.next_fire_at, x.last_fired_at,
                x.created_by, x.caller_role, x.created_at, x.updated_at, x.user_id, x.channel_id),
      "schedule already exists: " + x.id);
}

template <typename Sql>
Status SqlTx<Sql>::UpdateSchedule(const Schedule& x) {
  static const std::string kSql =
      "UPDATE schedules SET name=$1, status=$2, next_fire_at=$3, last_fired_at=$4, "
      "updated_at=$5, created_by=$6, caller_role=$7, user_id=$8, channel_id=$9 WHERE tenant_id=$10 "
      "AND id=$11";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(x.tenant_id));
  return Updated(sql_.Exec(kSql, x.name, x.status, x.next_fire_at, x.last_fired_at, x.updated_at,
                           x.created_by, x.caller_role, x.user_id, x.channel_id, x.tenant_id, x.id),
                 "schedule not found: " + x.id);
}

template <typename Sql>
Result<Schedule> SqlTx<Sql>::GetSchedule(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kScheduleCols) + " FROM schedules WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Schedule>(r, ReadSchedule<typename Sql::Row>, "schedule not found: " + id);
}

template <typename Sql>
Result<Paged<Schedule>> SqlTx<Sql>::ListSchedules(const std::string& tenant_id,
                                                  const std::string& agent_id, const Page& page) {
  static const std::string kSql =
      "SELECT " + std::string(kScheduleCols) +
      " FROM schedules WHERE tenant_id=$1 AND ($2='' OR agent_id=$2) AND id>$3 ORDER BY id "
      "LIMIT $4";
  const int limit = ClampLimit(page.limit);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto r, sql_.Query(kSql, tenant_id, agent_id, DecodeCursor(page.cursor), limit + 1));
  return PageOf<Schedule>(r, ReadSchedule<typename Sql::Row>, limit,
                          [](const Schedule& x) { return x.id; });
}

template <typename Sql>
Status SqlTx<Sql>::DeleteSchedule(const std::string& tenant_id, const std::string& id) {
  static const std::string kFires =
      "DELETE FROM schedule_fires WHERE tenant_id=$1 AND schedule_id=$2";
  static const std::string kSql = "DELETE FROM schedules WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_RETURN_IF_ERROR(sql_.Exec(kFires, tenant_id, id).status());
  return Updated(sql_.Exec(kSql, tenant_id, id), "schedule not found: " + id);
}

template <typename Sql>
Status SqlTx<Sql>::InsertFire(const ScheduleFire& f) {
  static const std::string kSql = "INSERT INTO schedule_fires(" + std::string(kFireCols) +
                                  ") VALUES(" + Placeholders(9) + ") ON CONFLICT DO NOTHING";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(f.tenant_id));
  return Inserted(
      sql_.Exec(kSql, f.tenant_id, f.schedule_id, f.slot, f.fired_at, f.outcome, f.session_id,
                f.run_id, f.message_id, f.error),
      "slot " + FormatRfc3339(f.slot) + " of schedule " + f.schedule_id + " was fired already");
}

template <typename Sql>
Result<std::vector<ScheduleFire>> SqlTx<Sql>::RecentFires(const std::string& tenant_id,
                                                          const std::string& schedule_id,
                                                          int limit) {
  static const std::string kSql = "SELECT " + std::string(kFireCols) +
                                  " FROM schedule_fires WHERE tenant_id=$1 AND schedule_id=$2 "
                                  "ORDER BY slot DESC LIMIT $3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, schedule_id, ClampLimit(limit)));
  return Collect<ScheduleFire>(r, ReadFire<typename Sql::Row>);
}

template <typename Sql>
Result<std::optional<ScheduleFire>> SqlTx<Sql>::FireOfRun(const std::string& tenant_id,
                                                          const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kFireCols) +
                                  " FROM schedule_fires WHERE tenant_id=$1 AND run_id=$2 LIMIT 1";
  if (run_id.empty()) return std::optional<ScheduleFire>();  // refused fires have no run
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, run_id));
  return Maybe<ScheduleFire>(r, ReadFire<typename Sql::Row>);
}

// ---- SkillStore

template <typename Sql>
Status SqlTx<Sql>::UpsertSkill(const Skill& k) {
  static const std::string kSql =
      "INSERT INTO skills(" + std::string(kSkillFileCols) +
      ") VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT(tenant_id, name) DO UPDATE SET "
      "description=excluded.description, hash=excluded.hash, bytes=excluded.bytes, "
      "manifest=excluded.manifest, updated_at=excluded.updated_at, files=excluded.files";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(k.tenant_id));
  return sql_
      .Exec(kSql, k.tenant_id, k.name, k.description, k.hash, k.bytes, DumpJson(k.manifest),
            k.created_at, k.updated_at, DumpJson(k.files))
      .status();
}

template <typename Sql>
Result<Skill> SqlTx<Sql>::GetSkill(const std::string& tenant_id, const std::string& name,
                                   bool with_files) {
  static const std::string kMeta =
      "SELECT " + std::string(kSkillCols) + " FROM skills WHERE tenant_id=$1 AND name=$2";
  static const std::string kWhole =
      "SELECT " + std::string(kSkillFileCols) + " FROM skills WHERE tenant_id=$1 AND name=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(with_files ? kWhole : kMeta, tenant_id, name));
  return One<Skill>(
      r, with_files ? ReadSkillWithFiles<typename Sql::Row> : ReadSkill<typename Sql::Row>,
      "skill not found: " + name);
}

template <typename Sql>
Result<std::vector<Skill>> SqlTx<Sql>::ListSkills(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kSkillCols) + " FROM skills WHERE tenant_id=$1 ORDER BY name";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  return Collect<Skill>(r, ReadSkill<typename Sql::Row>);
}

// The skill's assignments go with it (ON DELETE CASCADE).
template <typename Sql>
Status SqlTx<Sql>::DeleteSkill(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql = "DELETE FROM skills WHERE tenant_id=$1 AND name=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, name), "skill not found: " + name);
}

// The skill's row stays locked until the transaction ends, so that it cannot be deleted between
// the check and the insert.
template <typename Sql>
Status SqlTx<Sql>::AssignSkill(const SkillAssignment& a) {
  static const std::string kExists =
      "SELECT name FROM skills WHERE tenant_id=$1 AND name=$2" + std::string(Sql::kLockKeyShare);
  static const std::string kSql = "INSERT INTO agent_skills(" + std::string(kSkillAssignmentCols) +
                                  ") VALUES($1,$2,$3,$4) ON CONFLICT DO NOTHING";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(a.tenant_id));
  {
    KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kExists, a.tenant_id, a.skill));
    KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
    if (!found) return NotFound("skill not found: " + a.skill);
  }
  return sql_.Exec(kSql, a.tenant_id, a.agent_id, a.skill, a.created_at).status();
}

template <typename Sql>
Status SqlTx<Sql>::UnassignSkill(const std::string& tenant_id, const std::string& agent_id,
                                 const std::string& name) {
  static const std::string kSql =
      "DELETE FROM agent_skills WHERE tenant_id=$1 AND agent_id=$2 AND skill=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, agent_id, name),
                 "skill " + name + " is not assigned to agent " + agent_id);
}

template <typename Sql>
Result<std::vector<SkillAssignment>> SqlTx<Sql>::ListSkillAssignments(const std::string& tenant_id,
                                                                      const std::string& name) {
  static const std::string kSql = "SELECT " + std::string(kSkillAssignmentCols) +
                                  " FROM agent_skills WHERE tenant_id=$1 AND skill=$2 "
                                  "ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, name));
  return Collect<SkillAssignment>(r, ReadSkillAssignment<typename Sql::Row>);
}

template <typename Sql>
Result<std::vector<Skill>> SqlTx<Sql>::SkillsForAgent(const std::string& tenant_id,
                                                      const std::string& agent_id,
                                                      bool with_files) {
  std::vector<Skill> out;
  KEEL_RETURN_IF_ERROR(SkillsForAgentLater(tenant_id, agent_id, with_files, out));
  KEEL_RETURN_IF_ERROR(sql_.Flush());
  return out;
}

template <typename Sql>
Status SqlTx<Sql>::SkillsForAgentLater(const std::string& tenant_id, const std::string& agent_id,
                                       bool with_files, std::vector<Skill>& out) {
  // A join rather than `name IN (SELECT ...)`, whose list SQLite builds as a temporary b-tree
  // each time: the agent's skills in name order from agent_skills' key.
  static const std::string kWhere =
      " FROM agent_skills k JOIN skills s ON s.tenant_id=k.tenant_id AND s.name=k.skill "
      "WHERE k.tenant_id=$1 AND k.agent_id=$2 ORDER BY k.skill";
  static const std::string kMeta = "SELECT " + Qualified(kSkillCols, "s") + kWhere;
  static const std::string kWhole = "SELECT " + Qualified(kSkillFileCols, "s") + kWhere;
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.Later(with_files ? kWhole : kMeta,
                    CollectInto<Skill>(out, with_files ? ReadSkillWithFiles<typename Sql::Row>
                                                       : ReadSkill<typename Sql::Row>),
                    tenant_id, agent_id);
}

// ---- CompactionStore

template <typename Sql>
Status SqlTx<Sql>::InsertCompaction(const Compaction& c) {
  static const std::string kSql = InsertSql("compactions", kCompactionCols, 10);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(c.tenant_id));
  return Inserted(sql_.Exec(kSql, c.id, c.tenant_id, c.session_id, c.run_id, c.last_message_id,
                            c.summary, c.messages, c.tokens_before, c.tokens_after, c.created_at),
                  "compaction already exists: " + c.id);
}

template <typename Sql>
Status SqlTx<Sql>::LatestCompactionLater(const std::string& tenant_id,
                                         const std::string& session_id,
                                         std::optional<Compaction>& out) {
  static const std::string kSql = "SELECT " + std::string(kCompactionCols) +
                                  " FROM compactions WHERE tenant_id=$1 AND session_id=$2 "
                                  "ORDER BY id DESC LIMIT 1";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.Later(
      kSql,
      [&out](auto& r) -> Status {
        KEEL_ASSIGN_OR_RETURN(out, Maybe<Compaction>(r, ReadCompaction<typename Sql::Row>));
        return Status::Ok();
      },
      tenant_id, session_id);
}

template <typename Sql>
Result<Paged<Compaction>> SqlTx<Sql>::ListCompactions(const std::string& tenant_id,
                                                      const std::string& session_id,
                                                      const Page& page) {
  const int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kCompactionCols) +
                                  " FROM compactions WHERE tenant_id=$1 AND session_id=$2 AND "
                                  "id>$3 ORDER BY id LIMIT $4";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto r, sql_.Query(kSql, tenant_id, session_id, DecodeCursor(page.cursor), limit + 1));
  return PageOf<Compaction>(r, ReadCompaction<typename Sql::Row>, limit,
                            [](const Compaction& c) { return c.id; });
}

// ---- IntrospectionStore

template <typename Sql>
Status SqlTx<Sql>::SetSessionDescription(const std::string& tenant_id,
                                         const std::string& session_id,
                                         const std::string& description, Millis at) {
  static const std::string kSql =
      "UPDATE sessions SET description=$1, updated_at=$2 WHERE tenant_id=$3 AND id=$4";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, description, at, tenant_id, session_id),
                 "session not found: " + session_id);
}

template <typename Sql>
Result<int64_t> SqlTx<Sql>::TurnsSinceIntrospection(const std::string& tenant_id,
                                                    const std::string& session_id) {
  static const std::string kSql =
      "SELECT count(*) FROM messages WHERE session_id=$2 AND tenant_id=$1 AND role='user' AND "
      "seq > coalesce((SELECT seq FROM messages WHERE session_id=$2 AND tenant_id=$1 AND "
      "role='introspection' ORDER BY seq DESC LIMIT 1), 0)";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, session_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  return found ? r.Int(0) : 0;
}

template <typename Sql>
Status SqlTx<Sql>::PutIntrospectionDue(const IntrospectionDue& d) {
  static const std::string kSql =
      "INSERT INTO introspection_due(tenant_id, session_id, agent_id, due_at) "
      "VALUES($1,$2,$3,$4) ON CONFLICT(tenant_id, session_id) DO UPDATE SET "
      "agent_id=excluded.agent_id, due_at=excluded.due_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(d.tenant_id));
  return sql_.Exec(kSql, d.tenant_id, d.session_id, d.agent_id, d.due_at).status();
}

template <typename Sql>
Status SqlTx<Sql>::ClearIntrospectionDue(const std::string& tenant_id,
                                         const std::string& session_id, Millis due_at) {
  static const std::string kSql =
      "DELETE FROM introspection_due WHERE tenant_id=$1 AND session_id=$2 AND due_at=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.Exec(kSql, tenant_id, session_id, due_at).status();
}

// ---- EventLog

template <typename Sql>
Result<std::vector<Event>> SqlTx<Sql>::ReadEvents(const std::string& tenant_id, int64_t after,
                                                  const EventFilter& f, int limit) {
  static const std::string kSql =
      "SELECT " + std::string(kEventCols) +
      " FROM events WHERE tenant_id=$1 AND tenant_position>$2 AND "
      "($3='' OR agent_id=$3) AND ($4='' OR session_id=$4) AND ($5='' OR run_id=$5) "
      "ORDER BY tenant_position LIMIT $6";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, after, f.agent_id, f.session_id,
                                           f.run_id, std::clamp(limit, 1, 1000)));
  return Collect<Event>(r, ReadEvent<typename Sql::Row>);
}

template <typename Sql>
Result<std::vector<Event>> SqlTx<Sql>::ReadEventsBefore(const std::string& tenant_id,
                                                        int64_t before, const EventFilter& f,
                                                        int limit) {
  static const std::string kSql =
      "SELECT " + std::string(kEventCols) +
      " FROM events WHERE tenant_id=$1 AND tenant_position<$2 AND "
      "($3='' OR agent_id=$3) AND ($4='' OR session_id=$4) AND ($5='' OR run_id=$5) "
      "ORDER BY tenant_position DESC LIMIT $6";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, before, f.agent_id, f.session_id,
                                           f.run_id, std::clamp(limit, 1, 1000)));
  return Collect<Event>(r, ReadEvent<typename Sql::Row>);
}

template <typename Sql>
Result<std::vector<Event>> SqlTx<Sql>::RecentRunEvents(const std::string& tenant_id,
                                                       const std::string& run_id, int window) {
  static const std::string kSql =
      "SELECT " + std::string(kEventCols) + " FROM (SELECT " + std::string(kEventCols) +
      " FROM events WHERE tenant_id=$1 ORDER BY tenant_position DESC LIMIT $3) AS recent "
      "WHERE run_id=$2 ORDER BY tenant_position DESC";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, run_id, std::max(window, 1)));
  return Collect<Event>(r, ReadEvent<typename Sql::Row>);
}

template <typename Sql>
Result<int64_t> SqlTx<Sql>::LastPosition(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT coalesce(max(tenant_position), 0) FROM events WHERE tenant_id=$1";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  return found ? r.Int(0) : 0;
}

// ---- UsageStore

template <typename Sql>
Status SqlTx<Sql>::InsertUsage(const UsageRecord& u) {
  static const std::string kSql = InsertSql("model_usage", kUsageCols, 13);
  if (u.agent_id.empty()) return InvalidArgument("a usage record needs its agent: " + u.id);
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(u.tenant_id));
  KEEL_RETURN_IF_ERROR(sql_.ExecChanging(Conflict("usage record already exists: " + u.id), kSql,
                                         u.id, u.tenant_id, u.agent_id, u.run_id, u.step_id,
                                         u.model, u.input_tokens, u.output_tokens, u.cost_micros,
                                         u.saved_micros, u.cached, u.fallback, u.created_at));
  const UsageTotals add{
      1, u.cached ? 1 : 0, u.input_tokens, u.output_tokens, u.cost_micros, u.saved_micros};
  for (const char* period : {model::kPeriodDay, model::kPeriodMonth}) {
    const Millis start = model::PeriodStart(period, u.created_at);
    AddTo(unit_totals_[{u.tenant_id, u.agent_id, period, start}], add);
    AddTo(unit_totals_[{u.tenant_id, "", period, start}], add);
  }
  return Status::Ok();
}

template <typename Sql>
Status SqlTx<Sql>::WriteTotals() {
  // Creates the row at zero first, then adds: one statement a row. A sum stops at 2^63 - 1
  // rather than fail: a provider may report any token count, and a failure here would fail
  // every unit of the transaction, other tenants' too.
  auto add = [](const char* c) {
    return std::string(c) + "=CASE WHEN usage_totals." + c + " > 9223372036854775807 - excluded." +
           c + " THEN 9223372036854775807 ELSE usage_totals." + c + " + excluded." + c + " END";
  };
  static const std::string kAdd =
      "INSERT INTO usage_totals(tenant_id, agent_id, period, period_start, " +
      std::string(kTotalsCols) +
      ") VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) "
      "ON CONFLICT(tenant_id, period, period_start, agent_id) DO UPDATE SET " +
      add("calls") + ", " + add("cached_calls") + ", " + add("input_tokens") + ", " +
      add("output_tokens") + ", " + add("cost_micros") + ", " + add("saved_micros");
  for (const auto& [row, add] : txn_totals_) {
    KEEL_RETURN_IF_ERROR(sql_.BindTenant(row.tenant_id));
    KEEL_RETURN_IF_ERROR(sql_.Send(kAdd, row.tenant_id, row.agent_id, row.period, row.period_start,
                                   add.calls, add.cached_calls, add.input_tokens, add.output_tokens,
                                   add.cost_micros, add.saved_micros));
  }
  txn_totals_.clear();
  return Status::Ok();
}

template <typename Sql>
Result<UsageTotals> SqlTx<Sql>::RunUsage(const std::string& tenant_id, const std::string& run_id) {
  static const std::string kSql =
      "SELECT count(*), coalesce(sum(cached),0), coalesce(sum(input_tokens),0), "
      "coalesce(sum(output_tokens),0), coalesce(sum(cost_micros),0), "
      "coalesce(sum(saved_micros),0) FROM model_usage WHERE tenant_id=$1 AND run_id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, run_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return UsageTotals{};
  return ReadTotals(r, 0);
}

template <typename Sql>
Result<UsageTotals> SqlTx<Sql>::PeriodUsage(const std::string& tenant_id,
                                            const std::string& agent_id, const std::string& period,
                                            Millis start) {
  static const std::string kSql = "SELECT " + std::string(kTotalsCols) +
                                  " FROM usage_totals WHERE tenant_id=$1 AND period=$2 AND "
                                  "period_start=$3 AND agent_id=$4";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, period, start, agent_id));
  KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
  if (!found) return UsageTotals{};
  return ReadTotals(r, 0);
}

template <typename Sql>
Result<std::vector<AgentUsage>> SqlTx<Sql>::PeriodUsageByAgent(const std::string& tenant_id,
                                                               const std::string& period,
                                                               Millis start) {
  static const std::string kSql = "SELECT agent_id, " + std::string(kTotalsCols) +
                                  " FROM usage_totals WHERE tenant_id=$1 AND period=$2 AND "
                                  "period_start=$3 AND agent_id<>'' ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, period, start));
  return Collect<AgentUsage>(r, [](const typename Sql::Row& row) {
    return AgentUsage{row.Text(0), ReadTotals(row, 1)};
  });
}

template <typename Sql>
Result<std::vector<PeriodTotals>> SqlTx<Sql>::UsageHistory(const std::string& tenant_id,
                                                           const std::string& period,
                                                           Millis since) {
  static const std::string kSql = "SELECT period_start, agent_id, " + std::string(kTotalsCols) +
                                  " FROM usage_totals WHERE tenant_id=$1 AND period=$2 AND "
                                  "period_start>=$3 ORDER BY period_start, agent_id";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, period, since));
  return Collect<PeriodTotals>(r, [](const typename Sql::Row& row) {
    return PeriodTotals{row.Int(0), row.Text(1), ReadTotals(row, 2)};
  });
}

template <typename Sql>
Status SqlTx<Sql>::PutBudget(const Budget& b) {
  static const std::string kSql =
      "INSERT INTO budgets(" + std::string(kBudgetCols) +
      ") VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT(tenant_id, scope, period) DO UPDATE SET "
      "limit_micros=excluded.limit_micros, updated_at=excluded.updated_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(b.tenant_id));
  return sql_.Exec(kSql, b.tenant_id, b.scope, b.period, b.limit_micros, b.created_at, b.updated_at)
      .status();
}

template <typename Sql>
Result<std::vector<Budget>> SqlTx<Sql>::ListBudgets(const std::string& tenant_id) {
  std::vector<Budget> out;
  KEEL_RETURN_IF_ERROR(ListBudgetsLater(tenant_id, out));
  KEEL_RETURN_IF_ERROR(sql_.Flush());
  return out;
}

template <typename Sql>
Status SqlTx<Sql>::ListBudgetsLater(const std::string& tenant_id, std::vector<Budget>& out) {
  static const std::string kSql = "SELECT " + std::string(kBudgetCols) +
                                  " FROM budgets WHERE tenant_id=$1 ORDER BY scope, period";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.Later(kSql, CollectInto<Budget>(out, ReadBudget<typename Sql::Row>), tenant_id);
}

template <typename Sql>
Status SqlTx<Sql>::DeleteBudget(const std::string& tenant_id, const std::string& scope,
                                const std::string& period) {
  static const std::string kSql =
      "DELETE FROM budgets WHERE tenant_id=$1 AND scope=$2 AND period=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, scope, period),
                 "no " + period + " budget is set for " + scope);
}

template <typename Sql>
Result<std::optional<CacheEntry>> SqlTx<Sql>::GetCacheEntry(const std::string& tenant_id,
                                                            const std::string& cache_group,
                                                            const std::string& key,
                                                            Millis not_before) {
  static const std::string kSql = "SELECT " + std::string(kCacheCols) +
                                  " FROM model_cache WHERE tenant_id=$1 AND cache_group=$2 AND "
                                  "key=$3 AND created_at>=$4";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, cache_group, key, not_before));
  return Maybe<CacheEntry>(r, ReadCacheEntry<typename Sql::Row>);
}

template <typename Sql>
Status SqlTx<Sql>::PutCacheEntry(const CacheEntry& e) {
  static const std::string kSql =
      "INSERT INTO model_cache(" + std::string(kCacheCols) +
      ") VALUES($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT(tenant_id, cache_group, key) DO UPDATE SET "
      "model=excluded.model, response=excluded.response, input_tokens=excluded.input_tokens, "
      "output_tokens=excluded.output_tokens, created_at=excluded.created_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(e.tenant_id));
  return sql_.Send(kSql, e.tenant_id, e.cache_group, e.key, e.model, DumpJson(e.response),
                   e.input_tokens, e.output_tokens, e.created_at);
}

// ---- MemoryStore

template <typename Sql>
Result<Memory> SqlTx<Sql>::GetMemory(const std::string& tenant_id, const std::string& agent_id,
                                     const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kMemoryCols) +
                                  " FROM memories WHERE tenant_id=$1 AND agent_id=$2 AND id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, agent_id, id));
  return One<Memory>(r, ReadMemory<typename Sql::Row>, "memory not found: " + id);
}

template <typename Sql>
Result<Memory> SqlTx<Sql>::FindMemory(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kMemoryCols) + " FROM memories WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto r, sql_.Query(kSql, tenant_id, id));
  return One<Memory>(r, ReadMemory<typename Sql::Row>, "memory not found: " + id);
}

template <typename Sql>
Status SqlTx<Sql>::DeleteMemory(const std::string& tenant_id, const std::string& agent_id,
                                const std::string& id) {
  static const std::string kSql =
      "DELETE FROM memories WHERE tenant_id=$1 AND agent_id=$2 AND id=$3";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return Updated(sql_.Exec(kSql, tenant_id, agent_id, id), "memory not found: " + id);
}

// Newest first: the cursor is the last item's (updated_at, id).
template <typename Sql>
Result<Paged<Memory>> SqlTx<Sql>::ListMemories(const std::string& tenant_id,
                                               const std::string& agent_id, const std::string& tag,
                                               const Page& page) {
  const int limit = ClampLimit(page.limit);
  KEEL_ASSIGN_OR_RETURN(auto start, DeliveryCursorStart(page.cursor));
  static const std::string kSql =
      "SELECT " + std::string(kMemoryCols) +
      " FROM memories WHERE tenant_id=$1 AND agent_id=$2 AND (updated_at, id) < ($3, $4) AND "
      "($5 = '' OR " +
      std::string(Sql::kMemoryHasTag) + ") ORDER BY updated_at DESC, id DESC LIMIT $6";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto r, sql_.Query(kSql, tenant_id, agent_id, start.first, start.second, tag, limit + 1));
  return PageOf<Memory>(r, ReadMemory<typename Sql::Row>, limit, MemoryCursorKey);
}

template <typename Sql>
Result<WorkingMemory> SqlTx<Sql>::GetWorkingMemory(const std::string& tenant_id,
                                                   const std::string& agent_id) {
  WorkingMemory w;
  KEEL_RETURN_IF_ERROR(GetWorkingMemoryLater(tenant_id, agent_id, w));
  KEEL_RETURN_IF_ERROR(sql_.Flush());
  return w;
}

template <typename Sql>
Status SqlTx<Sql>::GetWorkingMemoryLater(const std::string& tenant_id, const std::string& agent_id,
                                         WorkingMemory& out) {
  static const std::string kSql =
      "SELECT text, updated_at FROM working_memories WHERE tenant_id=$1 AND agent_id=$2";
  out = WorkingMemory{tenant_id, agent_id, "", 0};
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(tenant_id));
  return sql_.Later(
      kSql,
      [&out](typename Sql::Row& r) -> Status {
        KEEL_ASSIGN_OR_RETURN(bool found, r.Step());
        if (found) {
          out.text = r.Text(0);
          out.updated_at = r.Int(1);
        }
        return Status::Ok();
      },
      tenant_id, agent_id);
}

template <typename Sql>
Status SqlTx<Sql>::PutWorkingMemory(const WorkingMemory& w) {
  static const std::string kSql =
      "INSERT INTO working_memories(tenant_id, agent_id, text, updated_at) VALUES($1,$2,$3,$4) "
      "ON CONFLICT(tenant_id, agent_id) DO UPDATE SET text=excluded.text, "
      "updated_at=excluded.updated_at";
  KEEL_RETURN_IF_ERROR(sql_.BindTenant(w.tenant_id));
  return sql_.Exec(kSql, w.tenant_id, w.agent_id, w.text, w.updated_at).status();
}

template class SqlTx<sqlite::SqliteSql>;
template class SqlTx<postgres::PgSql>;

}  // namespace keel::store

#include "keel/store/postgres/postgres_tx.h"

#include <algorithm>

#include "keel/common/ids.h"
#include "keel/store/row_images.h"
#include "keel/store/rows.h"

namespace keel::store::postgres {
namespace {

using namespace rows;  // NOLINT: the shared record readers

// SQLite reads a negative LIMIT as "no limit"; PostgreSQL's spelling of that is LIMIT NULL.
std::optional<int64_t> LimitParam(int limit) {
  if (limit < 0) return std::nullopt;
  return limit;
}

std::string Placeholders(int n) {
  std::string out;
  for (int i = 1; i <= n; ++i) out += (i > 1 ? ",$" : "$") + std::to_string(i);
  return out;
}

// A text[] literal for a parameter: {"a","b"} with quotes and backslashes escaped.
std::string TextArray(const std::vector<std::string>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char c : items[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

constexpr const char* kTenantCols = "id, name, created_at, allow_host_exec, allow_stdio_mcp";
Tenant ReadTenant(const Row& r) {
  Tenant t{r.Text(0), r.Text(1), r.Int(2)};
  t.allow_host_exec = r.Int(3) != 0;
  t.allow_stdio_mcp = r.Int(4) != 0;
  return t;
}









// "INSERT INTO table(cols) VALUES($1..$n) ON CONFLICT DO NOTHING RETURNING id": a duplicate
// returns no row instead of aborting the transaction.
std::string InsertSql(const char* table, const char* cols, int n) {
  return std::string("INSERT INTO ") + table + "(" + cols + ") VALUES(" + Placeholders(n) +
         ") ON CONFLICT DO NOTHING RETURNING id";
}

// Maps "no row inserted" (a duplicate) to kConflict with `message`. Other integrity errors
// (a missing referenced row) are kConflict with PostgreSQL's message, as SQLite's are.
Status Inserted(const Result<Rows>& rows, const std::string& message) {
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return Conflict(message);
  return Status::Ok();
}

// Maps "no row updated" to kNotFound with `message`.
Status Updated(const Result<Rows>& rows, const std::string& message) {
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return NotFound(message);
  return Status::Ok();
}

}  // namespace

void PostgresTx::BeginTransaction() {
  appended_.clear();
  bound_tenant_.reset();
}

void PostgresTx::AfterRollbackToSavepoint() { bound_tenant_.reset(); }

Status PostgresTx::BindTenant(const std::string& tenant_id) {
  if (bound_tenant_ && *bound_tenant_ == tenant_id) return Status::Ok();
  static const std::string kSql = "SELECT set_config('app.tenant_id', $1, true)";
  // Pipelined: it goes out with the statement that needs it.
  KEEL_RETURN_IF_ERROR(conn_.Send(kSql, P(tenant_id)));
  bound_tenant_ = tenant_id;
  return Status::Ok();
}

Result<std::vector<std::pair<std::string, Rows>>> PostgresTx::RowsOfKeys(const Rows& keys,
                                                                          const std::string& sql) {
  std::vector<std::pair<std::string, std::vector<std::string>>> by_tenant;
  for (int i = 0; i < keys.size(); ++i) {
    const std::string tenant = keys.Text(i, 0);
    auto it = std::find_if(by_tenant.begin(), by_tenant.end(),
                           [&](const auto& t) { return t.first == tenant; });
    if (it == by_tenant.end()) it = by_tenant.insert(by_tenant.end(), {tenant, {}});
    it->second.push_back(keys.Text(i, 1));
  }
  std::vector<std::pair<std::string, Rows>> out;
  for (const auto& [tenant, ids] : by_tenant) {
    KEEL_RETURN_IF_ERROR(BindTenant(tenant));
    KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(sql, P(tenant, TextArray(ids))));
    out.emplace_back(tenant, std::move(rows));
  }
  return out;
}

// ---- TenantStore

Status PostgresTx::InsertTenant(const Tenant& t) {
  static const std::string kSql = InsertSql("tenants", "id, name, created_at", 3);
  KEEL_RETURN_IF_ERROR(BindTenant(t.id));  // a tenant's row is its own (the policy's check)
  return Inserted(conn_.Query(kSql, P(t.id, t.name, t.created_at)),
                  "tenant already exists: " + t.id);
}

Result<Tenant> PostgresTx::GetTenant(const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kTenantCols) + " FROM tenants WHERE id=$1";
  KEEL_RETURN_IF_ERROR(BindTenant(id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(id)));
  return One<Tenant>(rows, ReadTenant, "tenant not found: " + id);
}

Result<std::vector<Tenant>> PostgresTx::ListTenants() {
  static const std::string kSql =
      "SELECT " + std::string(kTenantCols) + " FROM keel_tenants() ORDER BY id COLLATE \"C\"";
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, Params()));
  return Collect<Tenant>(rows, ReadTenant);
}

Status PostgresTx::UpdateTenantSettings(const Tenant& t) {
  static const std::string kSql =
      "UPDATE tenants SET allow_host_exec=$1, allow_stdio_mcp=$2 WHERE id=$3 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(t.id));  // a tenant's row is its own (the policy's check)
  return Updated(conn_.Query(kSql, P(t.allow_host_exec, t.allow_stdio_mcp, t.id)),
                 "tenant not found: " + t.id);
}

// ---- TokenStore

Status PostgresTx::InsertToken(const Token& t) {
  static const std::string kSql = InsertSql("api_tokens", kTokenCols, 7);
  KEEL_RETURN_IF_ERROR(BindTenant(t.tenant_id));
  return Inserted(
      conn_.Query(kSql, P(t.id, t.tenant_id, t.name, t.role, t.hash, t.created_at, t.revoked_at)),
      "token already exists: " + t.id);
}

Result<Token> PostgresTx::FindActiveTokenByHash(const std::string& hash) {
  static const std::string kSql =
      "SELECT " + std::string(kTokenCols) + " FROM keel_active_token($1)";
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(hash)));
  return One<Token>(rows, ReadToken<Row>, "token not found");
}

Result<std::vector<Token>> PostgresTx::ListTokens(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kTokenCols) + " FROM api_tokens WHERE tenant_id=$1 ORDER BY id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return Collect<Token>(rows, ReadToken<Row>);
}

Result<Token> PostgresTx::GetToken(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kTokenCols) + " FROM api_tokens WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<Token>(rows, ReadToken<Row>, "token not found: " + id);
}

Status PostgresTx::RevokeToken(const std::string& tenant_id, const std::string& id, Millis at) {
  static const std::string kSql =
      "UPDATE api_tokens SET revoked_at=$1 WHERE tenant_id=$2 AND id=$3 AND revoked_at IS NULL "
      "RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(at, tenant_id, id)), "token not found: " + id);
}

// ---- SecretStore

Result<std::optional<TenantKey>> PostgresTx::GetTenantKey(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kTenantKeyCols) + " FROM tenant_keys WHERE tenant_id=$1";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  if (rows.empty()) return std::optional<TenantKey>();
  return std::optional<TenantKey>(ReadTenantKey(Row(rows, 0)));
}

Status PostgresTx::InsertTenantKey(const TenantKey& k) {
  static const std::string kSql = "INSERT INTO tenant_keys(" + std::string(kTenantKeyCols) +
                                  ") VALUES($1,$2,$3,$4) ON CONFLICT DO NOTHING RETURNING tenant_id";
  KEEL_RETURN_IF_ERROR(BindTenant(k.tenant_id));
  return Inserted(conn_.Query(kSql, P(k.tenant_id, k.wrapped, k.kek_fingerprint, k.created_at)),
                  "tenant " + k.tenant_id + " already has a data key");
}

Status PostgresTx::PutSecret(const Secret& x) {
  static const std::string kSql =
      "INSERT INTO secrets(" + std::string(kSecretCols) +
      ") VALUES($1,$2,$3,$4,$5) ON CONFLICT(tenant_id, name) DO UPDATE SET "
      "sealed=EXCLUDED.sealed, updated_at=EXCLUDED.updated_at";
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  return conn_.Query(kSql, P(x.tenant_id, x.name, x.sealed, x.created_at, x.updated_at)).status();
}

Result<Secret> PostgresTx::GetSecret(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql =
      "SELECT " + std::string(kSecretCols) + " FROM secrets WHERE tenant_id=$1 AND name=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, name)));
  return One<Secret>(rows, ReadSecret<Row>, "secret not found: " + name);
}

Result<std::vector<Secret>> PostgresTx::ListSecrets(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kSecretCols) + " FROM secrets WHERE tenant_id=$1 ORDER BY name";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return Collect<Secret>(rows, ReadSecret<Row>);
}

Status PostgresTx::DeleteSecret(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql =
      "DELETE FROM secrets WHERE tenant_id=$1 AND name=$2 RETURNING name";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(tenant_id, name)), "secret not found: " + name);
}

// ---- PolicyStore

Result<std::optional<PolicyDoc>> PostgresTx::GetPolicy(const std::string& tenant_id,
                                                       const std::string& scope) {
  static const std::string kSql =
      "SELECT " + std::string(kPolicyCols) + " FROM policies WHERE tenant_id=$1 AND scope=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, scope)));
  if (rows.empty()) return std::optional<PolicyDoc>();
  return std::optional<PolicyDoc>(ReadPolicy(Row(rows, 0)));
}

Status PostgresTx::PutPolicy(const PolicyDoc& p) {
  static const std::string kSql =
      "INSERT INTO policies(" + std::string(kPolicyCols) +
      ") VALUES($1,$2,$3,$4) ON CONFLICT(tenant_id, scope) DO UPDATE SET body=EXCLUDED.body, "
      "updated_at=EXCLUDED.updated_at";
  KEEL_RETURN_IF_ERROR(BindTenant(p.tenant_id));
  return conn_.Query(kSql, P(p.tenant_id, p.scope, DumpJson(p.body), p.updated_at)).status();
}

Status PostgresTx::DeletePolicy(const std::string& tenant_id, const std::string& scope) {
  static const std::string kSql =
      "DELETE FROM policies WHERE tenant_id=$1 AND scope=$2 RETURNING scope";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(tenant_id, scope)),
                 scope.empty() ? "no tenant policy is set" : "no agent policy is set");
}

Result<std::vector<EmergencyStop>> PostgresTx::ListStops(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kStopCols) +
                                  " FROM emergency_stops WHERE tenant_id=$1 ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return Collect<EmergencyStop>(rows, ReadStop<Row>);
}

Status PostgresTx::PutStop(const EmergencyStop& x) {
  static const std::string kSql =
      "INSERT INTO emergency_stops(" + std::string(kStopCols) +
      ") VALUES($1,$2,$3,$4,$5) ON CONFLICT(tenant_id, agent_id) DO UPDATE SET "
      "reason=EXCLUDED.reason, created_by=EXCLUDED.created_by, created_at=EXCLUDED.created_at";
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  return conn_.Query(kSql, P(x.tenant_id, x.agent_id, x.reason, x.created_by, x.created_at))
      .status();
}

Status PostgresTx::DeleteStop(const std::string& tenant_id, const std::string& agent_id) {
  static const std::string kSql =
      "DELETE FROM emergency_stops WHERE tenant_id=$1 AND agent_id=$2 RETURNING agent_id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(tenant_id, agent_id)), "no emergency stop is in force");
}

// ---- ApprovalStore

Status PostgresTx::InsertApproval(const Approval& a) {
  static const std::string kSql = InsertSql("approvals", kApprovalCols, 17);
  KEEL_RETURN_IF_ERROR(BindTenant(a.tenant_id));
  return Inserted(
      conn_.Query(kSql, P(a.id, a.tenant_id, a.run_id, a.session_id, a.agent_id, a.call_id,
                          a.tool, DumpJson(a.arguments), StoredJson(a.amended_arguments),
                          a.reason, a.status, a.requested_by, a.decided_by, a.decision_reason,
                          a.created_at, a.expires_at, a.decided_at)),
      "approval already exists: " + a.id);
}

Status PostgresTx::UpdateApproval(const Approval& a) {
  static const std::string kSql =
      "UPDATE approvals SET status=$1, amended_arguments=$2, decided_by=$3, decision_reason=$4, "
      "decided_at=$5 WHERE tenant_id=$6 AND id=$7 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(a.tenant_id));
  return Updated(conn_.Query(kSql, P(a.status, StoredJson(a.amended_arguments), a.decided_by,
                                     a.decision_reason, a.decided_at, a.tenant_id, a.id)),
                 "approval not found: " + a.id);
}

Result<Approval> PostgresTx::GetApproval(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kApprovalCols) + " FROM approvals WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<Approval>(rows, ReadApproval<Row>, "approval not found: " + id);
}

Result<Paged<Approval>> PostgresTx::ListApprovals(const std::string& tenant_id,
                                                  const std::string& status, const Page& page) {
  int limit = ClampLimit(page.limit);
  static const std::string kAll = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE tenant_id=$1 AND id>$2 ORDER BY id "
                                  "LIMIT $3";
  static const std::string kOfStatus =
      "SELECT " + std::string(kApprovalCols) +
      " FROM approvals WHERE tenant_id=$1 AND status=$2 AND id>$3 ORDER BY id LIMIT $4";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  std::string cursor = DecodeCursor(page.cursor);
  auto rows = status.empty() ? conn_.Query(kAll, P(tenant_id, cursor, limit + 1))
                             : conn_.Query(kOfStatus, P(tenant_id, status, cursor, limit + 1));
  if (!rows.ok()) return rows.status();
  return MakePage(Collect<Approval>(*rows, ReadApproval<Row>), limit,
                  [](const Approval& a) { return a.id; });
}

Result<std::optional<Approval>> PostgresTx::FindApprovalForCall(const std::string& tenant_id,
                                                                const std::string& run_id,
                                                                const std::string& call_id) {
  static const std::string kSql =
      "SELECT " + std::string(kApprovalCols) +
      " FROM approvals WHERE tenant_id=$1 AND run_id=$2 AND call_id=$3";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, run_id, call_id)));
  if (rows.empty()) return std::optional<Approval>();
  return std::optional<Approval>(ReadApproval(Row(rows, 0)));
}

Result<std::vector<Approval>> PostgresTx::ExpiredApprovals(Millis now, int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_expired_approvals($1, $2)";
  static const std::string kSql = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, P(now, LimitParam(limit))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<Approval>(keys, found, ReadApproval<Row>);
}

Status PostgresTx::InsertStanding(const StandingApproval& x) {
  static const std::string kSql = InsertSql("standing_approvals", kStandingCols, 10);
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  return Inserted(conn_.Query(kSql, P(x.id, x.tenant_id, x.agent_id, x.tool,
                                      StoredJson(x.arguments_match), x.created_by, x.approval_id,
                                      x.created_at, x.expires_at, x.revoked_at)),
                  "standing approval already exists: " + x.id);
}

Result<std::vector<StandingApproval>> PostgresTx::ActiveStanding(const std::string& tenant_id,
                                                                 const std::string& agent_id,
                                                                 const std::string& tool,
                                                                 Millis now) {
  static const std::string kSql =
      "SELECT " + std::string(kStandingCols) +
      " FROM standing_approvals WHERE tenant_id=$1 AND agent_id=$2 AND tool=$3 AND "
      "revoked_at IS NULL AND expires_at>$4 ORDER BY id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, agent_id, tool, now)));
  return Collect<StandingApproval>(rows, ReadStanding<Row>);
}

Result<std::vector<StandingApproval>> PostgresTx::ListStanding(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kStandingCols) +
                                  " FROM standing_approvals WHERE tenant_id=$1 ORDER BY id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return Collect<StandingApproval>(rows, ReadStanding<Row>);
}

Status PostgresTx::RevokeStanding(const std::string& tenant_id, const std::string& id,
                                  Millis at) {
  static const std::string kSql =
      "UPDATE standing_approvals SET revoked_at=$1 WHERE tenant_id=$2 AND id=$3 AND "
      "revoked_at IS NULL RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(at, tenant_id, id)), "standing approval not found: " + id);
}

// ---- McpServerStore

Status PostgresTx::InsertMcpServer(const McpServer& x) {
  static const std::string kSql = InsertSql("mcp_servers", kMcpServerCols, 6);
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  return Inserted(conn_.Query(kSql, P(x.id, x.tenant_id, x.name, x.transport,
                                      DumpJson(x.config), x.created_at)),
                  "an MCP server named '" + x.name + "' exists");
}

Result<McpServer> PostgresTx::GetMcpServer(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kMcpServerCols) + " FROM mcp_servers WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<McpServer>(rows, ReadMcpServer<Row>, "MCP server not found: " + id);
}

Result<McpServer> PostgresTx::GetMcpServerByName(const std::string& tenant_id,
                                                 const std::string& name) {
  static const std::string kSql = "SELECT " + std::string(kMcpServerCols) +
                                  " FROM mcp_servers WHERE tenant_id=$1 AND name=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, name)));
  return One<McpServer>(rows, ReadMcpServer<Row>, "MCP server not found: " + name);
}

Result<std::vector<McpServer>> PostgresTx::ListMcpServers(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kMcpServerCols) +
                                  " FROM mcp_servers WHERE tenant_id=$1 ORDER BY name";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return Collect<McpServer>(rows, ReadMcpServer<Row>);
}

Status PostgresTx::DeleteMcpServer(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "DELETE FROM mcp_servers WHERE tenant_id=$1 AND id=$2 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(tenant_id, id)), "MCP server not found: " + id);
}

// ---- PluginStore

Status PostgresTx::UpsertPlugin(const Plugin& p) {
  static const std::string kSql =
      "INSERT INTO plugins(" + std::string(kPluginCols) + ") VALUES(" + Placeholders(10) +
      ") ON CONFLICT(tenant_id, id) DO UPDATE SET name=EXCLUDED.name, "
      "version=EXCLUDED.version, kind=EXCLUDED.kind, manifest=EXCLUDED.manifest, "
      "source=EXCLUDED.source, config=EXCLUDED.config, updated_at=EXCLUDED.updated_at";
  KEEL_RETURN_IF_ERROR(BindTenant(p.tenant_id));
  return conn_
      .Query(kSql, P(p.tenant_id, p.id, p.name, p.version, p.kind, DumpJson(p.manifest), p.source,
                     DumpJson(p.config), p.created_at, p.updated_at))
      .status();
}

Result<Plugin> PostgresTx::GetPlugin(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) + " FROM plugins WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<Plugin>(rows, ReadPlugin<Row>, "plugin not found: " + id);
}

Result<std::vector<Plugin>> PostgresTx::ListPlugins(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) + " FROM plugins WHERE tenant_id=$1 ORDER BY id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return Collect<Plugin>(rows, ReadPlugin<Row>);
}

// The plugin's enablements and deliveries go with it (ON DELETE CASCADE).
Status PostgresTx::DeletePlugin(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "DELETE FROM plugins WHERE tenant_id=$1 AND id=$2 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(tenant_id, id)), "plugin not found: " + id);
}

// The plugin's row is share-locked until the transaction ends, so that it cannot be deleted
// between the check and the insert.
Status PostgresTx::EnablePlugin(const PluginEnablement& e) {
  static const std::string kExists =
      "SELECT id FROM plugins WHERE tenant_id=$1 AND id=$2 FOR KEY SHARE";
  static const std::string kSql = "INSERT INTO agent_plugins(" + std::string(kEnablementCols) +
                                  ") VALUES($1,$2,$3,$4) ON CONFLICT DO NOTHING";
  KEEL_RETURN_IF_ERROR(BindTenant(e.tenant_id));
  KEEL_RETURN_IF_ERROR(Updated(conn_.Query(kExists, P(e.tenant_id, e.plugin_id)),
                               "plugin not found: " + e.plugin_id));
  return conn_.Query(kSql, P(e.tenant_id, e.plugin_id, e.agent_id, e.created_at)).status();
}

Status PostgresTx::DisablePlugin(const std::string& tenant_id, const std::string& plugin_id,
                                 const std::string& agent_id) {
  static const std::string kSql =
      "DELETE FROM agent_plugins WHERE tenant_id=$1 AND plugin_id=$2 AND agent_id=$3 "
      "RETURNING agent_id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(tenant_id, plugin_id, agent_id)),
                 "plugin " + plugin_id + " is not enabled for agent " + agent_id);
}

Result<std::vector<PluginEnablement>> PostgresTx::ListEnablements(const std::string& tenant_id,
                                                                  const std::string& plugin_id) {
  static const std::string kSql = "SELECT " + std::string(kEnablementCols) +
                                  " FROM agent_plugins WHERE tenant_id=$1 AND plugin_id=$2 "
                                  "ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, plugin_id)));
  return Collect<PluginEnablement>(rows, ReadEnablement<Row>);
}

Result<std::vector<Plugin>> PostgresTx::PluginsForAgent(const std::string& tenant_id,
                                                        const std::string& agent_id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) +
      " FROM plugins WHERE tenant_id=$1 AND id IN (SELECT plugin_id FROM agent_plugins "
      "WHERE tenant_id=$1 AND agent_id IN ($2, '*')) ORDER BY id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, agent_id)));
  return Collect<Plugin>(rows, ReadPlugin<Row>);
}

Status PostgresTx::InsertDelivery(const PluginDelivery& d) {
  static const std::string kSql = InsertSql("plugin_deliveries", kDeliveryCols, 13);
  KEEL_RETURN_IF_ERROR(BindTenant(d.tenant_id));
  return Inserted(
      conn_.Query(kSql, P(d.id, d.tenant_id, d.plugin_id, d.agent_id, d.event_type,
                          DumpJson(d.payload), d.status, d.attempts, d.next_attempt_at,
                          d.last_status, d.last_error, d.created_at, d.delivered_at)),
      "plugin delivery already exists: " + d.id);
}

Status PostgresTx::UpdateDelivery(const PluginDelivery& d) {
  static const std::string kSql =
      "UPDATE plugin_deliveries SET status=$1, attempts=$2, next_attempt_at=$3, last_status=$4, "
      "last_error=$5, delivered_at=$6 WHERE tenant_id=$7 AND id=$8 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(d.tenant_id));
  return Updated(conn_.Query(kSql, P(d.status, d.attempts, d.next_attempt_at, d.last_status,
                                     d.last_error, d.delivered_at, d.tenant_id, d.id)),
                 "plugin delivery not found: " + d.id);
}

Result<PluginDelivery> PostgresTx::GetDelivery(const std::string& tenant_id,
                                               const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kDeliveryCols) +
                                  " FROM plugin_deliveries WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<PluginDelivery>(rows, ReadDelivery<Row>, "plugin delivery not found: " + id);
}

Result<Paged<PluginDelivery>> PostgresTx::ListDeliveries(const std::string& tenant_id,
                                                          const std::string& plugin_id,
                                                          const std::string& status,
                                                          const Page& page) {
  int limit = ClampLimit(page.limit);
  KEEL_ASSIGN_OR_RETURN(auto start, DeliveryCursorStart(page.cursor));
  static const std::string kAll =
      "SELECT " + std::string(kDeliveryCols) +
      " FROM plugin_deliveries WHERE tenant_id=$1 AND plugin_id=$2 AND (created_at, id) < "
      "($3, $4) ORDER BY created_at DESC, id DESC LIMIT $5";
  static const std::string kOfStatus =
      "SELECT " + std::string(kDeliveryCols) +
      " FROM plugin_deliveries WHERE tenant_id=$1 AND plugin_id=$2 AND status=$3 AND "
      "(created_at, id) < ($4, $5) ORDER BY created_at DESC, id DESC LIMIT $6";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  auto rows =
      status.empty()
          ? conn_.Query(kAll, P(tenant_id, plugin_id, start.first, start.second, limit + 1))
          : conn_.Query(kOfStatus,
                        P(tenant_id, plugin_id, status, start.first, start.second, limit + 1));
  if (!rows.ok()) return rows.status();
  return MakePage(Collect<PluginDelivery>(*rows, ReadDelivery<Row>), limit, DeliveryCursorKey);
}

Result<std::vector<PluginDelivery>> PostgresTx::DueDeliveries(Millis now, int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_due_deliveries($1, $2)";
  static const std::string kSql =
      "SELECT " + std::string(kDeliveryCols) +
      " FROM plugin_deliveries WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, P(now, LimitParam(limit))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<PluginDelivery>(keys, found, ReadDelivery<Row>);
}

// ---- AgentStore

Status PostgresTx::InsertAgent(const Agent& a) {
  static const std::string kSql = InsertSql("agents", kAgentCols, 10);
  KEEL_RETURN_IF_ERROR(BindTenant(a.tenant_id));
  Status st = Inserted(
      conn_.Query(kSql, P(a.id, a.tenant_id, a.name, a.model, a.instructions, DumpJson(a.tools),
                          DumpJson(a.config), a.status, a.created_at, a.updated_at)),
      "");
  // As SqliteTx: any integrity failure of the insert is reported as the name being taken.
  if (st.code() == Code::kConflict)
    return Conflict("an agent named '" + a.name + "' already exists");
  return st;
}

Status PostgresTx::UpdateAgent(const Agent& a) {
  // A rename onto a live agent's name updates nothing rather than failing the statement, so
  // the transaction stays usable; the unique index still catches a concurrent rename.
  static const std::string kSql =
      "UPDATE agents SET name=$1, model=$2, instructions=$3, tools=$4, config=$5, status=$6, "
      "updated_at=$7 WHERE tenant_id=$8 AND id=$9 AND ($6='deleted' OR NOT EXISTS ("
      "SELECT 1 FROM agents o WHERE o.tenant_id=$8 AND o.name=$1 AND o.status != 'deleted' "
      "AND o.id != $9)) RETURNING id";
  static const std::string kExists = "SELECT 1 FROM agents WHERE tenant_id=$1 AND id=$2";
  const std::string taken = "an agent named '" + a.name + "' already exists";
  KEEL_RETURN_IF_ERROR(BindTenant(a.tenant_id));
  auto rows = conn_.Query(kSql, P(a.name, a.model, a.instructions, DumpJson(a.tools),
                                  DumpJson(a.config), a.status, a.updated_at, a.tenant_id, a.id));
  if (!rows.ok()) {
    if (rows.status().code() == Code::kConflict) return Conflict(taken);
    return rows.status();
  }
  if (!rows->empty()) return Status::Ok();
  KEEL_ASSIGN_OR_RETURN(auto exists, conn_.Query(kExists, P(a.tenant_id, a.id)));
  if (exists.empty()) return NotFound("agent not found: " + a.id);
  return Conflict(taken);
}

Result<Agent> PostgresTx::GetAgent(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                  " FROM agents WHERE tenant_id=$1 AND id=$2 AND "
                                  "status != 'deleted'";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<Agent>(rows, ReadAgent<Row>, "agent not found: " + id);
}

Result<Agent> PostgresTx::GetAgentByName(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                  " FROM agents WHERE tenant_id=$1 AND name=$2 AND "
                                  "status != 'deleted'";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, name)));
  return One<Agent>(rows, ReadAgent<Row>, "agent not found: " + name);
}

Result<Paged<Agent>> PostgresTx::ListAgents(const std::string& tenant_id, const Page& page) {
  int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                  " FROM agents WHERE tenant_id=$1 AND id>$2 AND "
                                  "status != 'deleted' ORDER BY id LIMIT $3";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows,
                        conn_.Query(kSql, P(tenant_id, DecodeCursor(page.cursor), limit + 1)));
  return MakePage(Collect<Agent>(rows, ReadAgent<Row>), limit, [](const Agent& a) { return a.id; });
}

Status PostgresTx::DeleteAgent(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "UPDATE agents SET status='deleted' WHERE tenant_id=$1 AND id=$2 AND status != 'deleted' "
      "RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(tenant_id, id)), "agent not found: " + id);
}

// ---- SessionStore

Status PostgresTx::InsertSession(const Session& x) {
  static const std::string kSql = InsertSql("sessions", kSessionCols, 9);
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  return Inserted(conn_.Query(kSql, P(x.id, x.tenant_id, x.agent_id, x.status, x.title,
                                      x.created_at, x.updated_at, x.description, x.created_by)),
                  "session already exists: " + x.id);
}

Status PostgresTx::UpdateSessionStatus(const std::string& tenant_id, const std::string& id,
                                       const std::string& status, Millis at) {
  static const std::string kSql =
      "UPDATE sessions SET status=$1, updated_at=$2 WHERE tenant_id=$3 AND id=$4 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Updated(conn_.Query(kSql, P(status, at, tenant_id, id)), "session not found: " + id);
}

Result<Session> PostgresTx::GetSession(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kSessionCols) + " FROM sessions WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<Session>(rows, ReadSession<Row>, "session not found: " + id);
}

Result<Paged<Session>> PostgresTx::ListSessions(const std::string& tenant_id,
                                                const std::string& agent_id, const Page& page) {
  int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kSessionCols) +
                                  " FROM sessions WHERE tenant_id=$1 AND agent_id=$2 AND id>$3 "
                                  "ORDER BY id LIMIT $4";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto rows, conn_.Query(kSql, P(tenant_id, agent_id, DecodeCursor(page.cursor), limit + 1)));
  return MakePage(Collect<Session>(rows, ReadSession<Row>), limit,
                  [](const Session& x) { return x.id; });
}

// ---- MessageStore

Status PostgresTx::InsertMessage(const Message& m) {
  // seq: the session's next, one probe of its unique index; the write lock makes it follow
  // commit order.
  static const std::string kSql =
      "INSERT INTO messages(" + std::string(kMessageCols) + ", seq) VALUES($1,$2,$3,$4,$5,$6,$7,$8,"
      "(SELECT coalesce(max(seq),0)+1 FROM messages WHERE session_id=$3)) ON CONFLICT DO NOTHING "
      "RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(m.tenant_id));
  return Inserted(conn_.Query(kSql, P(m.id, m.tenant_id, m.session_id, m.run_id, m.role, m.content,
                                      m.idempotency_key, m.created_at)),
                  m.idempotency_key.empty()
                      ? "message already exists: " + m.id
                      : "a message with idempotency key '" + m.idempotency_key +
                            "' already exists in session " + m.session_id);
}

Result<Message> PostgresTx::GetMessage(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kMessageCols) + " FROM messages WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<Message>(rows, ReadMessage<Row>, "message not found: " + id);
}

Result<std::optional<Message>> PostgresTx::FindByIdempotencyKey(const std::string& tenant_id,
                                                                const std::string& session_id,
                                                                const std::string& key) {
  static const std::string kSql = "SELECT " + std::string(kMessageCols) +
                                  " FROM messages WHERE tenant_id=$1 AND session_id=$2 "
                                  "AND idempotency_key=$3";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id, key)));
  if (rows.empty()) return std::optional<Message>();
  return std::optional<Message>(ReadMessage(Row(rows, 0)));
}

Result<Paged<Message>> PostgresTx::ListMessages(const std::string& tenant_id,
                                                const std::string& session_id, const Page& page) {
  int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kMessageCols) +
                                  " FROM messages WHERE tenant_id=$1 AND session_id=$2 "
                                  "AND id>$3 ORDER BY id LIMIT $4";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto rows, conn_.Query(kSql, P(tenant_id, session_id, DecodeCursor(page.cursor), limit + 1)));
  return MakePage(
      Collect<Message>(rows, ReadMessage<Row>), limit, [](const Message& m) { return m.id; },
      +[](const Message& m) { return m.content.size(); });
}

Result<std::vector<Message>> PostgresTx::RecentMessages(const std::string& tenant_id,
                                                        const std::string& session_id,
                                                        const std::string& before_id, int limit) {
  static const std::string kSql = "SELECT " + std::string(kMessageCols) +
                                  " FROM messages WHERE tenant_id=$1 AND session_id=$2 "
                                  "AND id<$3 ORDER BY id DESC LIMIT $4";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows,
                        conn_.Query(kSql, P(tenant_id, session_id, before_id, LimitParam(limit))));
  auto out = Collect<Message>(rows, ReadMessage<Row>);
  std::reverse(out.begin(), out.end());
  return out;
}

// ---- RunStore

Status PostgresTx::InsertRun(const Run& r) {
  static const std::string kSql = InsertSql("runs", kRunCols, 19);
  KEEL_RETURN_IF_ERROR(BindTenant(r.tenant_id));
  return Inserted(
      conn_.Query(kSql, P(r.id, r.tenant_id, r.session_id, r.agent_id, r.message_id, r.status,
                          r.attempt, r.output, StoredJson(r.error), r.input_tokens,
                          r.output_tokens, r.lease_owner, r.lease_expires_at, r.cancel_requested,
                          r.created_at, r.started_at, r.finished_at, r.requested_by,
                          r.caller_role)),
      "run already exists: " + r.id);
}

Status PostgresTx::UpdateRun(const Run& r) {
  static const std::string kSql =
      "UPDATE runs SET status=$1, attempt=$2, output=$3, error=$4, input_tokens=$5, "
      "output_tokens=$6, lease_owner=$7, lease_expires_at=$8, cancel_requested=$9, "
      "started_at=$10, finished_at=$11 WHERE tenant_id=$12 AND id=$13 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(r.tenant_id));
  return Updated(
      conn_.Query(kSql, P(r.status, r.attempt, r.output,
                          StoredJson(r.error), r.input_tokens,
                          r.output_tokens, r.lease_owner, r.lease_expires_at, r.cancel_requested,
                          r.started_at, r.finished_at, r.tenant_id, r.id)),
      "run not found: " + r.id);
}

Result<Run> PostgresTx::GetRun(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kRunCols) + " FROM runs WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  return One<Run>(rows, ReadRun<Row>, "run not found: " + id);
}

Result<Run> PostgresTx::LockRun(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kRunCols) +
                                  " FROM runs WHERE tenant_id=$1 AND id=$2 FOR UPDATE SKIP LOCKED";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, id)));
  if (!rows.empty()) return ReadRun<Row>(Row(rows, 0));
  // No row: absent, or locked by another transaction (which SKIP LOCKED passes over).
  KEEL_RETURN_IF_ERROR(GetRun(tenant_id, id).status());
  return Conflict("run " + id + " is locked by another transaction");
}

Result<Paged<Run>> PostgresTx::ListRuns(const std::string& tenant_id, const std::string& session_id,
                                        const Page& page) {
  int limit = ClampLimit(page.limit);
  // Two statements rather than "($2='' OR session_id=$2)", so each keeps its index.
  static const std::string kAll = "SELECT " + std::string(kRunCols) +
                                  " FROM runs WHERE tenant_id=$1 AND id>$2 ORDER BY id LIMIT $3";
  static const std::string kOfSession =
      "SELECT " + std::string(kRunCols) +
      " FROM runs WHERE tenant_id=$1 AND session_id=$2 AND id>$3 ORDER BY id LIMIT $4";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  std::string cursor = DecodeCursor(page.cursor);
  auto rows = session_id.empty()
                  ? conn_.Query(kAll, P(tenant_id, cursor, limit + 1))
                  : conn_.Query(kOfSession, P(tenant_id, session_id, cursor, limit + 1));
  if (!rows.ok()) return rows.status();
  return MakePage(Collect<Run>(*rows, ReadRun<Row>), limit, [](const Run& r) { return r.id; });
}

Result<int64_t> PostgresTx::CountActiveRuns(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT count(*) FROM runs WHERE tenant_id=$1 AND status IN ('queued','running')";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return rows.empty() ? 0 : rows.Int(0, 0);
}

Result<bool> PostgresTx::SessionBusy(const std::string& tenant_id, const std::string& session_id) {
  static const std::string kSql =
      "SELECT 1 FROM runs WHERE tenant_id=$1 AND session_id=$2 AND status IN "
      "('queued','running','waiting_for_approval') LIMIT 1";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id)));
  return !rows.empty();
}

Result<std::vector<Run>> PostgresTx::ClaimableRuns(Millis now, int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_claimable_runs($1, $2)";
  static const std::string kSql =
      "SELECT " + std::string(kRunCols) + " FROM runs WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, P(now, LimitParam(limit))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<Run>(keys, found, ReadRun<Row>);
}

Status PostgresTx::ExpireLeasesOf(const std::string& owner) {
  static const std::string kSql = "SELECT keel_expire_leases($1)";
  return conn_.Query(kSql, P(owner)).status();
}

Status PostgresTx::RenewLeases(const std::string& owner, const std::vector<std::string>& run_ids,
                               Millis expires_at) {
  static const std::string kSql = "SELECT keel_renew_leases($1, $2::text[], $3)";
  if (run_ids.empty()) return Status::Ok();
  return conn_.Query(kSql, P(owner, TextArray(run_ids), expires_at)).status();
}

Status PostgresTx::InsertStep(const Step& x) {
  static const std::string kSql = InsertSql("run_steps", kStepCols, 10);
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  return Inserted(
      conn_.Query(kSql, P(x.id, x.tenant_id, x.run_id, x.seq, x.kind, x.status, DumpJson(x.input),
                          DumpJson(x.output), x.started_at, x.finished_at)),
      "step " + std::to_string(x.seq) + " of run " + x.run_id + " already exists");
}

Status PostgresTx::UpdateStep(const Step& x) {
  static const std::string kSql =
      "UPDATE run_steps SET status=$1, input=$2, output=$3, finished_at=$4 WHERE tenant_id=$5 "
      "AND id=$6 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(x.tenant_id));
  return Updated(conn_.Query(kSql, P(x.status, DumpJson(x.input), DumpJson(x.output),
                                     x.finished_at, x.tenant_id, x.id)),
                 "step not found: " + x.id);
}

Result<std::vector<Step>> PostgresTx::ListSteps(const std::string& tenant_id,
                                                const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kStepCols) +
                                  " FROM run_steps WHERE tenant_id=$1 AND run_id=$2 ORDER BY seq";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, run_id)));
  return Collect<Step>(rows, ReadStep<Row>);
}

Status PostgresTx::InsertToolCall(const ToolCall& c) {
  static const std::string kSql = InsertSql("tool_calls", kToolCallCols, 13);
  KEEL_RETURN_IF_ERROR(BindTenant(c.tenant_id));
  return Inserted(conn_.Query(kSql, P(c.id, c.tenant_id, c.run_id, c.step_id, c.call_id, c.tool,
                                      DumpJson(c.arguments), c.effect_class, c.effect_key, c.status,
                                      DumpJson(c.result), c.created_at, c.updated_at)),
                  "tool call " + c.call_id + " of run " + c.run_id + " already exists");
}

Status PostgresTx::UpdateToolCall(const ToolCall& c) {
  static const std::string kSql =
      "UPDATE tool_calls SET status=$1, arguments=$2, result=$3, updated_at=$4 WHERE "
      "tenant_id=$5 AND id=$6 RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(c.tenant_id));
  return Updated(conn_.Query(kSql, P(c.status, DumpJson(c.arguments), DumpJson(c.result),
                                     c.updated_at, c.tenant_id, c.id)),
                 "tool call not found: " + c.id);
}

Result<std::vector<ToolCall>> PostgresTx::ListToolCalls(const std::string& tenant_id,
                                                        const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kToolCallCols) +
                                  " FROM tool_calls WHERE tenant_id=$1 AND run_id=$2 ORDER BY id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, run_id)));
  return Collect<ToolCall>(rows, ReadToolCall<Row>);
}

// ---- EventLog

Status PostgresTx::Append(NewEvent n) {
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
  // The tenant's position and its origin_seq are computed inside the insert (SqliteTx reads them
  // first and binds them; the rule is the same), each one probe of its unique index: a rolled back unit takes its numbers with it, so there
  // is never a gap, and since every write transaction of the cluster holds the write lock
  // (PostgresStore), they follow commit order. `position` stays the store-wide key.
  static const std::string kSql =
      "INSERT INTO events(id, tenant_id, tenant_position, type, origin, origin_seq, agent_id, "
      "session_id, run_id, payload, occurred_at, hash) VALUES($1,$2,"
      "(SELECT coalesce(max(tenant_position),0)+1 FROM events WHERE tenant_id=$2),$3,$4,"
      "(SELECT coalesce(max(origin_seq),0)+1 FROM events WHERE tenant_id=$2 AND origin=$4),"
      "$5,$6,$7,$8,$9,$10) RETURNING tenant_position, origin_seq";
  // Pipelined: the position and origin_seq arrive with the next round trip, at the latest when
  // the unit ends (PostgresStore flushes then); a failure there fails the unit.
  // As stored: with the row images the unit carried (the Json payload handed to live streams
  // leaves them out).
  std::string payload = DumpJson(e.payload);
  if (Status carried = AppendCarried(payload); !carried.ok()) {
    appended_.pop_back();
    return carried;
  }
  const ChainedFields chained = ChainedOf(e, payload);
  Status st = BindTenant(e.tenant_id);
  Result<std::string> hash = st.ok() ? sealer_.Next(chained, head_loader_) : Result<std::string>(st);
  st = hash.status();
  if (st.ok()) {
    const size_t index = appended_.size() - 1;
    st = conn_.Send(kSql,
                    P(e.id, e.tenant_id, e.type, e.origin, e.agent_id, e.session_id, e.run_id,
                      payload, e.occurred_at, *hash),
                    [this, index](Rows& rows) {
                      if (rows.empty() || index >= appended_.size()) return;
                      appended_[index].position = rows.Int(0, 0);
                      appended_[index].origin_seq = rows.Int(0, 1);
                    });
  }
  if (st.ok()) sealer_.Appended(chained, *hash);
  if (!st.ok()) appended_.pop_back();
  return st;
}

// ---- The audit chain (store/audit.h)

Result<std::optional<ChainHead>> PostgresTx::LoadChainHead(const std::string& tenant_id,
                                                           const std::string& origin) {
  static const std::string kHead =
      "SELECT last_id, last_seq, hash, anchor, mac FROM audit_heads "
      "WHERE tenant_id=$1 AND origin=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto head, conn_.Query(kHead, P(tenant_id, origin)));
  if (!head.empty()) {
    return std::optional<ChainHead>(ChainHead{tenant_id, origin, head.Text(0, 0), head.Int(0, 1),
                                              head.Text(0, 2), head.Text(0, 3), head.Text(0, 4)});
  }
  // No head: a chain without events, or one whose head was removed (its last hashed event
  // carries it on, unsigned, so the sealer marks it).
  static const std::string kLast =
      "SELECT id, origin_seq, hash FROM events WHERE tenant_id=$1 AND origin=$2 AND hash<>'' "
      "ORDER BY origin_seq DESC LIMIT 1";
  KEEL_ASSIGN_OR_RETURN(auto last, conn_.Query(kLast, P(tenant_id, origin)));
  if (last.empty()) return std::optional<ChainHead>();
  return std::optional<ChainHead>(
      ChainHead{tenant_id, origin, last.Text(0, 0), last.Int(0, 1), last.Text(0, 2), "", ""});
}

Status PostgresTx::WriteChainHeads() {
  static const std::string kSql =
      "INSERT INTO audit_heads(tenant_id, origin, last_id, last_seq, hash, anchor, mac) "
      "VALUES($1,$2,$3,$4,$5,$6,$7) ON CONFLICT (tenant_id, origin) DO UPDATE SET "
      "last_id=EXCLUDED.last_id, last_seq=EXCLUDED.last_seq, hash=EXCLUDED.hash, "
      "anchor=EXCLUDED.anchor, mac=EXCLUDED.mac";
  for (const ChainHead& h : sealer_.Heads()) {
    KEEL_RETURN_IF_ERROR(BindTenant(h.tenant_id));
    KEEL_RETURN_IF_ERROR(
        conn_.Send(kSql, P(h.tenant_id, h.origin, h.last_id, h.last_seq, h.hash, h.anchor, h.mac)));
  }
  return Status::Ok();
}

Status PostgresTx::BackfillChains() {
  static const std::string kTenants = "SELECT tenant_id FROM keel_unhashed_tenants()";
  static const std::string kEvents =
      "SELECT position, id, tenant_id, type, origin, origin_seq, agent_id, session_id, run_id, "
      "payload, occurred_at FROM events WHERE tenant_id=$1 AND hash='' ORDER BY position";
  static const std::string kSet =
      "UPDATE events SET hash = v.hash FROM unnest($2::bigint[], $3::text[]) AS v(position, hash) "
      "WHERE events.tenant_id = $1 AND events.position = v.position";
  KEEL_ASSIGN_OR_RETURN(auto tenants, conn_.Query(kTenants, Params()));
  for (int t = 0; t < tenants.size(); ++t) {
    const std::string tenant = tenants.Text(t, 0);
    KEEL_RETURN_IF_ERROR(BindTenant(tenant));
    KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kEvents, P(tenant)));
    std::string positions = "{";
    std::string hashes = "{";
    for (int r = 0; r < rows.size(); ++r) {
      Event e;
      e.position = rows.Int(r, 0);
      e.id = rows.Text(r, 1);
      e.tenant_id = rows.Text(r, 2);
      e.type = rows.Text(r, 3);
      e.origin = rows.Text(r, 4);
      e.origin_seq = rows.Int(r, 5);
      e.agent_id = rows.Text(r, 6);
      e.session_id = rows.Text(r, 7);
      e.run_id = rows.Text(r, 8);
      e.occurred_at = rows.Int(r, 10);
      const std::string payload = rows.Text(r, 9);
      const ChainedFields chained = ChainedOf(e, payload);
      KEEL_ASSIGN_OR_RETURN(std::string hash, sealer_.Next(chained, head_loader_));
      sealer_.Appended(chained, hash, e.origin_seq);
      positions += (r ? "," : "") + std::to_string(e.position);
      hashes += (r ? "," : "") + hash;  // hex: no quoting needed in an array literal
    }
    KEEL_RETURN_IF_ERROR(BindTenant(tenant));
    KEEL_RETURN_IF_ERROR(conn_.Query(kSet, P(tenant, positions + "}", hashes + "}")).status());
  }
  return Status::Ok();
}

Result<std::vector<Event>> PostgresTx::ReadEvents(const std::string& tenant_id, int64_t after,
                                                  const EventFilter& f, int limit) {
  static const std::string kSql =
      "SELECT " + std::string(kEventCols) +
      " FROM events WHERE tenant_id=$1 AND tenant_position>$2 AND "
      "($3='' OR agent_id=$3) AND ($4='' OR session_id=$4) AND ($5='' OR run_id=$5) "
      "ORDER BY tenant_position LIMIT $6";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, after, f.agent_id, f.session_id,
                                                       f.run_id, std::clamp(limit, 1, 1000))));
  return Collect<Event>(rows, ReadEvent<Row>);
}

Result<int64_t> PostgresTx::LastPosition(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT coalesce(max(tenant_position), 0) FROM events WHERE tenant_id=$1";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return rows.empty() ? 0 : rows.Int(0, 0);
}

// ---- ExportStore

namespace {

std::string ColumnList(const ExportTableSpec& t) {
  std::string out;
  for (const auto& c : t.columns) out += (out.empty() ? "" : ", ") + std::string(c.name);
  return out;
}

Result<const ExportTableSpec*> ExportTableOf(const std::string& table) {
  const ExportTableSpec* spec = FindExportTable(table);
  if (!spec) return InvalidArgument("not an exported table: " + table);
  return spec;
}

}  // namespace

// Each tenant's rows are read bound to it. All tenants' rows (`tenant_id` empty) are every
// tenant's in turn, merged into the table's order: the runtime role has no wider view.
Status PostgresTx::ExportTable(const std::string& tenant_id, const std::string& table,
                               const std::function<Status(const Json& row)>& emit) {
  KEEL_ASSIGN_OR_RETURN(const ExportTableSpec* spec, ExportTableOf(table));
  const std::string tenant_col = table == "tenants" ? "id" : "tenant_id";
  const std::string sql = "SELECT " + ColumnList(*spec) + " FROM " + spec->name + " WHERE " +
                          tenant_col + "=$1 ORDER BY " + spec->order_by;
  std::vector<std::string> tenants;
  if (tenant_id.empty()) {
    KEEL_ASSIGN_OR_RETURN(auto all, ListTenants());
    for (auto& t : all) tenants.push_back(std::move(t.id));
  } else {
    tenants.push_back(tenant_id);
  }
  std::vector<Json> out;
  for (const auto& tenant : tenants) {
    KEEL_RETURN_IF_ERROR(BindTenant(tenant));
    KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(sql, P(tenant)));
    for (int r = 0; r < rows.size(); ++r) {
      Json row = Json::object();
      for (int i = 0; i < static_cast<int>(spec->columns.size()); ++i) {
        const ExportColumn& c = spec->columns[i];
        if (c.type == ColumnType::kText) {
          row[c.name] = rows.Text(r, i);
        } else if (rows.IsNull(r, i)) {
          row[c.name] = nullptr;
        } else {
          row[c.name] = rows.Int(r, i);
        }
      }
      out.push_back(std::move(row));
    }
  }
  if (tenants.size() > 1) {
    // order_by names key columns ("tenant_id, id", "position"): never null; text in byte order
    // as COLLATE "C" sorts it.
    std::vector<std::string> keys;
    std::string rest = spec->order_by;
    for (size_t at = 0; at != std::string::npos;) {
      size_t comma = rest.find(',', at);
      std::string key = rest.substr(at, comma == std::string::npos ? comma : comma - at);
      key.erase(0, key.find_first_not_of(' '));
      key.erase(key.find_last_not_of(' ') + 1);
      keys.push_back(key);
      at = comma == std::string::npos ? comma : comma + 1;
    }
    std::stable_sort(out.begin(), out.end(), [&](const Json& a, const Json& b) {
      for (const auto& k : keys) {
        const Json& x = a.at(k);
        const Json& y = b.at(k);
        if (x == y) continue;
        return x < y;
      }
      return false;
    });
  }
  for (const auto& row : out) KEEL_RETURN_IF_ERROR(emit(row));
  return Status::Ok();
}

// Every row, tenants' too, is inserted bound to its tenant; events keep their store-wide
// position (OVERRIDING SYSTEM VALUE; FinishImport moves the identity).
Status PostgresTx::ImportRow(const std::string& table, const Json& row) {
  KEEL_ASSIGN_OR_RETURN(const ExportTableSpec* spec, ExportTableOf(table));
  KEEL_RETURN_IF_ERROR(CheckExportRow(*spec, row));
  const std::string sql = "INSERT INTO " + std::string(spec->name) + "(" + ColumnList(*spec) + ")" +
                          (table == "events" ? " OVERRIDING SYSTEM VALUE" : "") + " VALUES(" +
                          Placeholders(static_cast<int>(spec->columns.size())) + ")";
  Params params;
  for (const auto& c : spec->columns) {
    const Json& v = row.at(c.name);
    if (v.is_null()) {
      params.Add(std::optional<int64_t>());
    } else if (v.is_string()) {
      params.Add(v.get_ref<const std::string&>());
    } else {
      params.Add(v.get<int64_t>());
    }
  }
  KEEL_RETURN_IF_ERROR(
      BindTenant(row.at(table == "tenants" ? "id" : "tenant_id").get<std::string>()));
  return conn_.Query(sql, params).status();
}

// Events of an archive from before the audit chain are hashed here, and the chains' heads
// written at the unit's commit.
Status PostgresTx::FinishImport() {
  KEEL_RETURN_IF_ERROR(conn_.Query("SELECT keel_finish_import()", Params()).status());
  sealer_.Forget();
  return BackfillChains();
}

Result<bool> PostgresTx::IsEmpty() {
  static const std::string kSql = "SELECT keel_table_is_empty($1)";
  for (const auto& t : ExportTables()) {
    KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(std::string(t.name))));
    if (rows.empty() || rows.Text(0, 0) != "t") return false;
  }
  return true;
}

}  // namespace keel::store::postgres

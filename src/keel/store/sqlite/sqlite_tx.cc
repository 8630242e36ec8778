#include "keel/store/sqlite/sqlite_tx.h"

#include <algorithm>

#include "keel/common/ids.h"
#include "keel/store/row_images.h"
#include "keel/store/rows.h"

namespace keel::store::sqlite {
namespace {

using namespace rows;  // NOLINT: the shared record readers

}  // namespace

// ---- TenantStore

namespace {
constexpr const char* kTenantCols = "id, name, created_at, allow_host_exec, allow_stdio_mcp";
Tenant ReadTenant(const Stmt& r) {
  Tenant t{r.Text(0), r.Text(1), r.Int(2)};
  t.allow_host_exec = r.Int(3) != 0;
  t.allow_stdio_mcp = r.Int(4) != 0;
  return t;
}
}  // namespace

Status SqliteTx::InsertTenant(const Tenant& t) {
  static const std::string kSql = "INSERT INTO tenants(id, name, created_at) VALUES(?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(t.id, t.name, t.created_at).Run();
}

Result<Tenant> SqliteTx::GetTenant(const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kTenantCols) + " FROM tenants WHERE id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(id);
  return One<Tenant>(s, ReadTenant, "tenant not found: " + id);
}

Result<std::vector<Tenant>> SqliteTx::ListTenants() {
  static const std::string kSql =
      "SELECT " + std::string(kTenantCols) + " FROM tenants ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return Collect<Tenant>(s, ReadTenant);
}

Status SqliteTx::UpdateTenantSettings(const Tenant& t) {
  static const std::string kSql =
      "UPDATE tenants SET allow_host_exec=?, allow_stdio_mcp=? WHERE id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(int64_t(t.allow_host_exec), int64_t(t.allow_stdio_mcp), t.id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("tenant not found: " + t.id);
  return Status::Ok();
}

// ---- TokenStore

Status SqliteTx::InsertToken(const Token& t) {
  static const std::string kSql = "INSERT INTO api_tokens(" + std::string(kTokenCols) +
                                            ") VALUES(?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(t.id, t.tenant_id, t.name, t.role, t.hash, t.created_at, t.revoked_at).Run();
}

Result<Token> SqliteTx::FindActiveTokenByHash(const std::string& hash) {
  static const std::string kSql = "SELECT " + std::string(kTokenCols) +
                                            " FROM api_tokens WHERE hash=? AND revoked_at IS NULL";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(hash);
  return One<Token>(s, ReadToken<Stmt>, "token not found");
}

Result<std::vector<Token>> SqliteTx::ListTokens(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kTokenCols) +
                                            " FROM api_tokens WHERE tenant_id=? ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  return Collect<Token>(s, ReadToken<Stmt>);
}

Result<Token> SqliteTx::GetToken(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kTokenCols) + " FROM api_tokens WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<Token>(s, ReadToken<Stmt>, "token not found: " + id);
}

Status SqliteTx::RevokeToken(const std::string& tenant_id, const std::string& id, Millis at) {
  static const std::string kSql = "UPDATE api_tokens SET revoked_at=? WHERE tenant_id=? "
                                            "AND id=? AND revoked_at IS NULL";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(at, tenant_id, id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("token not found: " + id);
  return Status::Ok();
}

// ---- SecretStore

Result<std::optional<TenantKey>> SqliteTx::GetTenantKey(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kTenantKeyCols) + " FROM tenant_keys WHERE tenant_id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<TenantKey>();
  return std::optional<TenantKey>(ReadTenantKey(s));
}

Status SqliteTx::InsertTenantKey(const TenantKey& k) {
  static const std::string kSql =
      "INSERT INTO tenant_keys(" + std::string(kTenantKeyCols) + ") VALUES(?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(k.tenant_id, k.wrapped, k.kek_fingerprint, k.created_at).Run();
}

Status SqliteTx::PutSecret(const Secret& x) {
  static const std::string kSql =
      "INSERT INTO secrets(" + std::string(kSecretCols) +
      ") VALUES(?,?,?,?,?) ON CONFLICT(tenant_id, name) DO UPDATE SET sealed=excluded.sealed, "
      "updated_at=excluded.updated_at";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(x.tenant_id, x.name, x.sealed, x.created_at, x.updated_at).Run();
}

Result<Secret> SqliteTx::GetSecret(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql =
      "SELECT " + std::string(kSecretCols) + " FROM secrets WHERE tenant_id=? AND name=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, name);
  return One<Secret>(s, ReadSecret<Stmt>, "secret not found: " + name);
}

Result<std::vector<Secret>> SqliteTx::ListSecrets(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kSecretCols) + " FROM secrets WHERE tenant_id=? ORDER BY name";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  return Collect<Secret>(s, ReadSecret<Stmt>);
}

Status SqliteTx::DeleteSecret(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql =
      "DELETE FROM secrets WHERE tenant_id=? AND name=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, name);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("secret not found: " + name);
  return Status::Ok();
}

// ---- PolicyStore

Result<std::optional<PolicyDoc>> SqliteTx::GetPolicy(const std::string& tenant_id,
                                                     const std::string& scope) {
  static const std::string kSql =
      "SELECT " + std::string(kPolicyCols) + " FROM policies WHERE tenant_id=? AND scope=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, scope);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<PolicyDoc>();
  return std::optional<PolicyDoc>(ReadPolicy(s));
}

Status SqliteTx::PutPolicy(const PolicyDoc& p) {
  static const std::string kSql =
      "INSERT INTO policies(" + std::string(kPolicyCols) +
      ") VALUES(?,?,?,?) ON CONFLICT(tenant_id, scope) DO UPDATE SET body=excluded.body, "
      "updated_at=excluded.updated_at";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(p.tenant_id, p.scope, DumpJson(p.body), p.updated_at).Run();
}

Status SqliteTx::DeletePolicy(const std::string& tenant_id, const std::string& scope) {
  static const std::string kSql =
      "DELETE FROM policies WHERE tenant_id=? AND scope=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, scope);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound(scope.empty() ? "no tenant policy is set" : "no agent policy is set");
  return Status::Ok();
}

Result<std::vector<EmergencyStop>> SqliteTx::ListStops(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kStopCols) +
                                  " FROM emergency_stops WHERE tenant_id=? ORDER BY agent_id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  return Collect<EmergencyStop>(s, ReadStop<Stmt>);
}

Status SqliteTx::PutStop(const EmergencyStop& x) {
  static const std::string kSql =
      "INSERT INTO emergency_stops(" + std::string(kStopCols) +
      ") VALUES(?,?,?,?,?) ON CONFLICT(tenant_id, agent_id) DO UPDATE SET "
      "reason=excluded.reason, created_by=excluded.created_by, created_at=excluded.created_at";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(x.tenant_id, x.agent_id, x.reason, x.created_by, x.created_at).Run();
}

Status SqliteTx::DeleteStop(const std::string& tenant_id, const std::string& agent_id) {
  static const std::string kSql =
      "DELETE FROM emergency_stops WHERE tenant_id=? AND agent_id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, agent_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("no emergency stop is in force");
  return Status::Ok();
}

// ---- ApprovalStore

Status SqliteTx::InsertApproval(const Approval& a) {
  static const std::string kSql = "INSERT INTO approvals(" + std::string(kApprovalCols) +
                                  ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(a.id, a.tenant_id, a.run_id, a.session_id, a.agent_id, a.call_id, a.tool,
                   DumpJson(a.arguments), StoredJson(a.amended_arguments), a.reason, a.status,
                   a.requested_by, a.decided_by, a.decision_reason, a.created_at, a.expires_at,
                   a.decided_at)
      .Run();
}

Status SqliteTx::UpdateApproval(const Approval& a) {
  static const std::string kSql =
      "UPDATE approvals SET status=?, amended_arguments=?, decided_by=?, decision_reason=?, "
      "decided_at=? WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(a.status, StoredJson(a.amended_arguments), a.decided_by, a.decision_reason,
            a.decided_at, a.tenant_id, a.id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("approval not found: " + a.id);
  return Status::Ok();
}

Result<Approval> SqliteTx::GetApproval(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kApprovalCols) + " FROM approvals WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<Approval>(s, ReadApproval<Stmt>, "approval not found: " + id);
}

Result<Paged<Approval>> SqliteTx::ListApprovals(const std::string& tenant_id,
                                                const std::string& status, const Page& page) {
  int limit = ClampLimit(page.limit);
  static const std::string kAll = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE tenant_id=? AND ?='' AND id>? "
                                  "ORDER BY id LIMIT ?";
  static const std::string kOfStatus = "SELECT " + std::string(kApprovalCols) +
                                       " FROM approvals WHERE tenant_id=? AND status=? AND id>? "
                                       "ORDER BY id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(status.empty() ? kAll : kOfStatus));
  s.BindAll(tenant_id, status, DecodeCursor(page.cursor), limit + 1);
  KEEL_ASSIGN_OR_RETURN(auto rows, Collect<Approval>(s, ReadApproval<Stmt>));
  return MakePage(std::move(rows), limit, [](const Approval& a) { return a.id; });
}

Result<std::optional<Approval>> SqliteTx::FindApprovalForCall(const std::string& tenant_id,
                                                              const std::string& run_id,
                                                              const std::string& call_id) {
  static const std::string kSql = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE tenant_id=? AND run_id=? AND call_id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, run_id, call_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<Approval>();
  return std::optional<Approval>(ReadApproval(s));
}

Result<std::vector<Approval>> SqliteTx::ExpiredApprovals(Millis now, int limit) {
  static const std::string kSql = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE status='pending' AND expires_at<? "
                                  "ORDER BY expires_at, id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  return Collect<Approval>(s, ReadApproval<Stmt>);
}

Status SqliteTx::InsertStanding(const StandingApproval& x) {
  static const std::string kSql = "INSERT INTO standing_approvals(" + std::string(kStandingCols) +
                                  ") VALUES(?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(x.id, x.tenant_id, x.agent_id, x.tool, StoredJson(x.arguments_match),
                   x.created_by, x.approval_id, x.created_at, x.expires_at, x.revoked_at)
      .Run();
}

Result<std::vector<StandingApproval>> SqliteTx::ActiveStanding(const std::string& tenant_id,
                                                               const std::string& agent_id,
                                                               const std::string& tool,
                                                               Millis now) {
  static const std::string kSql =
      "SELECT " + std::string(kStandingCols) +
      " FROM standing_approvals WHERE tenant_id=? AND agent_id=? AND tool=? AND "
      "revoked_at IS NULL AND expires_at>? ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, agent_id, tool, now);
  return Collect<StandingApproval>(s, ReadStanding<Stmt>);
}

Result<std::vector<StandingApproval>> SqliteTx::ListStanding(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kStandingCols) +
                                  " FROM standing_approvals WHERE tenant_id=? ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  return Collect<StandingApproval>(s, ReadStanding<Stmt>);
}

Status SqliteTx::RevokeStanding(const std::string& tenant_id, const std::string& id, Millis at) {
  static const std::string kSql =
      "UPDATE standing_approvals SET revoked_at=? WHERE tenant_id=? AND id=? AND "
      "revoked_at IS NULL";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(at, tenant_id, id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("standing approval not found: " + id);
  return Status::Ok();
}

// ---- McpServerStore

Status SqliteTx::InsertMcpServer(const McpServer& x) {
  static const std::string kSql =
      "INSERT INTO mcp_servers(" + std::string(kMcpServerCols) + ") VALUES(?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  Status st = s.BindAll(x.id, x.tenant_id, x.name, x.transport, DumpJson(x.config), x.created_at)
                  .Run();
  if (st.code() == Code::kConflict) return Conflict("an MCP server named '" + x.name + "' exists");
  return st;
}

Result<McpServer> SqliteTx::GetMcpServer(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kMcpServerCols) + " FROM mcp_servers WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<McpServer>(s, ReadMcpServer<Stmt>, "MCP server not found: " + id);
}

Result<McpServer> SqliteTx::GetMcpServerByName(const std::string& tenant_id,
                                               const std::string& name) {
  static const std::string kSql =
      "SELECT " + std::string(kMcpServerCols) + " FROM mcp_servers WHERE tenant_id=? AND name=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, name);
  return One<McpServer>(s, ReadMcpServer<Stmt>, "MCP server not found: " + name);
}

Result<std::vector<McpServer>> SqliteTx::ListMcpServers(const std::string& tenant_id) {
  static const std::string kSql = "SELECT " + std::string(kMcpServerCols) +
                                  " FROM mcp_servers WHERE tenant_id=? ORDER BY name";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  return Collect<McpServer>(s, ReadMcpServer<Stmt>);
}

Status SqliteTx::DeleteMcpServer(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "DELETE FROM mcp_servers WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("MCP server not found: " + id);
  return Status::Ok();
}

// ---- PluginStore

Status SqliteTx::UpsertPlugin(const Plugin& p) {
  // ON CONFLICT DO UPDATE, not INSERT OR REPLACE: a replace would delete the row first and so
  // cascade to the plugin's enablements and deliveries.
  static const std::string kSql =
      "INSERT INTO plugins(" + std::string(kPluginCols) +
      ") VALUES(?,?,?,?,?,?,?,?,?,?) ON CONFLICT(tenant_id, id) DO UPDATE SET "
      "name=excluded.name, version=excluded.version, kind=excluded.kind, "
      "manifest=excluded.manifest, source=excluded.source, config=excluded.config, "
      "updated_at=excluded.updated_at";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(p.tenant_id, p.id, p.name, p.version, p.kind, DumpJson(p.manifest), p.source,
                   DumpJson(p.config), p.created_at, p.updated_at)
      .Run();
}

Result<Plugin> SqliteTx::GetPlugin(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) + " FROM plugins WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<Plugin>(s, ReadPlugin<Stmt>, "plugin not found: " + id);
}

Result<std::vector<Plugin>> SqliteTx::ListPlugins(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) + " FROM plugins WHERE tenant_id=? ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  return Collect<Plugin>(s, ReadPlugin<Stmt>);
}

// The plugin's enablements and deliveries go with it (ON DELETE CASCADE).
Status SqliteTx::DeletePlugin(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "DELETE FROM plugins WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("plugin not found: " + id);
  return Status::Ok();
}

Status SqliteTx::EnablePlugin(const PluginEnablement& e) {
  static const std::string kExists = "SELECT 1 FROM plugins WHERE tenant_id=? AND id=?";
  static const std::string kSql = "INSERT INTO agent_plugins(" + std::string(kEnablementCols) +
                                  ") VALUES(?,?,?,?) ON CONFLICT DO NOTHING";
  {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kExists));
    s.BindAll(e.tenant_id, e.plugin_id);
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return NotFound("plugin not found: " + e.plugin_id);
  }
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(e.tenant_id, e.plugin_id, e.agent_id, e.created_at).Run();
}

Status SqliteTx::DisablePlugin(const std::string& tenant_id, const std::string& plugin_id,
                               const std::string& agent_id) {
  static const std::string kSql =
      "DELETE FROM agent_plugins WHERE tenant_id=? AND plugin_id=? AND agent_id=? "
      "RETURNING agent_id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, plugin_id, agent_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFound("plugin " + plugin_id + " is not enabled for agent " + agent_id);
  return Status::Ok();
}

Result<std::vector<PluginEnablement>> SqliteTx::ListEnablements(const std::string& tenant_id,
                                                                const std::string& plugin_id) {
  static const std::string kSql = "SELECT " + std::string(kEnablementCols) +
                                  " FROM agent_plugins WHERE tenant_id=? AND plugin_id=? "
                                  "ORDER BY agent_id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, plugin_id);
  return Collect<PluginEnablement>(s, ReadEnablement<Stmt>);
}

Result<std::vector<Plugin>> SqliteTx::PluginsForAgent(const std::string& tenant_id,
                                                      const std::string& agent_id) {
  static const std::string kSql =
      "SELECT " + std::string(kPluginCols) +
      " FROM plugins WHERE tenant_id=? AND id IN (SELECT plugin_id FROM agent_plugins "
      "WHERE tenant_id=? AND agent_id IN (?, '*')) ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, tenant_id, agent_id);
  return Collect<Plugin>(s, ReadPlugin<Stmt>);
}

Status SqliteTx::InsertDelivery(const PluginDelivery& d) {
  static const std::string kSql = "INSERT INTO plugin_deliveries(" + std::string(kDeliveryCols) +
                                  ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(d.id, d.tenant_id, d.plugin_id, d.agent_id, d.event_type, DumpJson(d.payload),
                   d.status, d.attempts, d.next_attempt_at, d.last_status, d.last_error,
                   d.created_at, d.delivered_at)
      .Run();
}

Status SqliteTx::UpdateDelivery(const PluginDelivery& d) {
  static const std::string kSql =
      "UPDATE plugin_deliveries SET status=?, attempts=?, next_attempt_at=?, last_status=?, "
      "last_error=?, delivered_at=? WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(d.status, d.attempts, d.next_attempt_at, d.last_status, d.last_error, d.delivered_at,
            d.tenant_id, d.id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("plugin delivery not found: " + d.id);
  return Status::Ok();
}

Result<PluginDelivery> SqliteTx::GetDelivery(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kDeliveryCols) +
                                  " FROM plugin_deliveries WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<PluginDelivery>(s, ReadDelivery<Stmt>, "plugin delivery not found: " + id);
}

Result<Paged<PluginDelivery>> SqliteTx::ListDeliveries(const std::string& tenant_id,
                                                        const std::string& plugin_id,
                                                        const std::string& status,
                                                        const Page& page) {
  int limit = ClampLimit(page.limit);
  KEEL_ASSIGN_OR_RETURN(auto start, DeliveryCursorStart(page.cursor));
  static const std::string kAll =
      "SELECT " + std::string(kDeliveryCols) +
      " FROM plugin_deliveries WHERE tenant_id=? AND plugin_id=? AND ?='' AND "
      "(created_at, id) < (?, ?) ORDER BY created_at DESC, id DESC LIMIT ?";
  static const std::string kOfStatus =
      "SELECT " + std::string(kDeliveryCols) +
      " FROM plugin_deliveries WHERE tenant_id=? AND plugin_id=? AND status=? AND "
      "(created_at, id) < (?, ?) ORDER BY created_at DESC, id DESC LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(status.empty() ? kAll : kOfStatus));
  s.BindAll(tenant_id, plugin_id, status, start.first, start.second, limit + 1);
  KEEL_ASSIGN_OR_RETURN(auto rows, Collect<PluginDelivery>(s, ReadDelivery<Stmt>));
  return MakePage(std::move(rows), limit, DeliveryCursorKey);
}

Result<std::vector<PluginDelivery>> SqliteTx::DueDeliveries(Millis now, int limit) {
  static const std::string kSql = "SELECT " + std::string(kDeliveryCols) +
                                  " FROM plugin_deliveries WHERE status='pending' AND "
                                  "next_attempt_at<=? ORDER BY next_attempt_at, id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  return Collect<PluginDelivery>(s, ReadDelivery<Stmt>);
}

// ---- AgentStore

Status SqliteTx::InsertAgent(const Agent& a) {
  static const std::string kSql = "INSERT INTO agents(" + std::string(kAgentCols) +
                                            ") VALUES(?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  Status st = s.BindAll(a.id, a.tenant_id, a.name, a.model, a.instructions, DumpJson(a.tools),
                        DumpJson(a.config), a.status, a.created_at, a.updated_at)
                  .Run();
  if (st.code() == Code::kConflict) return Conflict("an agent named '" + a.name + "' already exists");
  return st;
}

Status SqliteTx::UpdateAgent(const Agent& a) {
  static const std::string kSql =
                                    "UPDATE agents SET name=?, model=?, instructions=?, tools=?, "
                                    "config=?, status=?, updated_at=? WHERE tenant_id=? AND id=? "
                                    "RETURNING id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(a.name, a.model, a.instructions, DumpJson(a.tools), DumpJson(a.config), a.status,
            a.updated_at, a.tenant_id, a.id);
  auto row = s.Step();
  if (!row.ok()) {
    if (row.status().code() == Code::kConflict) {
      return Conflict("an agent named '" + a.name + "' already exists");
    }
    return row.status();
  }
  if (!*row) return NotFound("agent not found: " + a.id);
  return Status::Ok();
}

Result<Agent> SqliteTx::GetAgent(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                            " FROM agents WHERE tenant_id=? AND id=? AND "
                                            "status != 'deleted'";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<Agent>(s, ReadAgent<Stmt>, "agent not found: " + id);
}

Result<Agent> SqliteTx::GetAgentByName(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                            " FROM agents WHERE tenant_id=? AND name=? AND "
                                            "status != 'deleted'";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, name);
  return One<Agent>(s, ReadAgent<Stmt>, "agent not found: " + name);
}

Result<Paged<Agent>> SqliteTx::ListAgents(const std::string& tenant_id, const Page& page) {
  int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kAgentCols) +
                                            " FROM agents WHERE tenant_id=? AND id>? AND "
                                            "status != 'deleted' ORDER BY id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, DecodeCursor(page.cursor), limit + 1);
  KEEL_ASSIGN_OR_RETURN(auto rows, Collect<Agent>(s, ReadAgent<Stmt>));
  return MakePage(std::move(rows), limit, [](const Agent& a) { return a.id; });
}

Status SqliteTx::DeleteAgent(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "UPDATE agents SET status='deleted' WHERE tenant_id=? "
                                            "AND id=? AND status != 'deleted'";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("agent not found: " + id);
  return Status::Ok();
}

// ---- SessionStore

Status SqliteTx::InsertSession(const Session& x) {
  static const std::string kSql = "INSERT INTO sessions(" + std::string(kSessionCols) +
                                            ") VALUES(?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(x.id, x.tenant_id, x.agent_id, x.status, x.title, x.created_at, x.updated_at,
                   x.description, x.created_by)
      .Run();
}

Status SqliteTx::UpdateSessionStatus(const std::string& tenant_id, const std::string& id,
                                     const std::string& status, Millis at) {
  static const std::string kSql = "UPDATE sessions SET status=?, updated_at=? WHERE "
                                            "tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(status, at, tenant_id, id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("session not found: " + id);
  return Status::Ok();
}

Result<Session> SqliteTx::GetSession(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kSessionCols) +
                                            " FROM sessions WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<Session>(s, ReadSession<Stmt>, "session not found: " + id);
}

Result<Paged<Session>> SqliteTx::ListSessions(const std::string& tenant_id,
                                              const std::string& agent_id, const Page& page) {
  int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kSessionCols) +
                                            " FROM sessions WHERE tenant_id=? AND agent_id=? AND "
                                            "id>? ORDER BY id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, agent_id, DecodeCursor(page.cursor), limit + 1);
  KEEL_ASSIGN_OR_RETURN(auto rows, Collect<Session>(s, ReadSession<Stmt>));
  return MakePage(std::move(rows), limit, [](const Session& x) { return x.id; });
}

// ---- MessageStore

Status SqliteTx::InsertMessage(const Message& m) {
  // seq: the session's next, one probe of its unique index; the one writer makes it follow
  // commit order.
  static const std::string kSql =
      "INSERT INTO messages(" + std::string(kMessageCols) + ", seq) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,"
      "(SELECT coalesce(max(seq),0)+1 FROM messages WHERE session_id=?3))";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(m.id, m.tenant_id, m.session_id, m.run_id, m.role, m.content,
                   m.idempotency_key, m.created_at)
      .Run();
}

Result<Message> SqliteTx::GetMessage(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kMessageCols) +
                                            " FROM messages WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<Message>(s, ReadMessage<Stmt>, "message not found: " + id);
}

Result<std::optional<Message>> SqliteTx::FindByIdempotencyKey(const std::string& tenant_id,
                                                             const std::string& session_id,
                                                             const std::string& key) {
  static const std::string kSql = "SELECT " + std::string(kMessageCols) +
                                            " FROM messages WHERE tenant_id=? AND session_id=? "
                                            "AND idempotency_key=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id, key);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<Message>();
  return std::optional<Message>(ReadMessage(s));
}

Result<Paged<Message>> SqliteTx::ListMessages(const std::string& tenant_id,
                                              const std::string& session_id, const Page& page) {
  int limit = ClampLimit(page.limit);
  static const std::string kSql = "SELECT " + std::string(kMessageCols) +
                                            " FROM messages WHERE tenant_id=? AND session_id=? "
                                            "AND id>? ORDER BY id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id, DecodeCursor(page.cursor), limit + 1);
  KEEL_ASSIGN_OR_RETURN(auto rows, Collect<Message>(s, ReadMessage<Stmt>));
  return MakePage(
      std::move(rows), limit, [](const Message& m) { return m.id; },
      +[](const Message& m) { return m.content.size(); });
}

Result<std::vector<Message>> SqliteTx::RecentMessages(const std::string& tenant_id,
                                                      const std::string& session_id,
                                                      const std::string& before_id, int limit) {
  static const std::string kSql = "SELECT " + std::string(kMessageCols) +
                                            " FROM messages WHERE tenant_id=? AND session_id=? "
                                            "AND id<? ORDER BY id DESC LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id, before_id, limit);
  KEEL_ASSIGN_OR_RETURN(auto rows, Collect<Message>(s, ReadMessage<Stmt>));
  std::reverse(rows.begin(), rows.end());
  return rows;
}

// ---- RunStore

Status SqliteTx::InsertRun(const Run& r) {
  static const std::string kSql = "INSERT INTO runs(" + std::string(kRunCols) +
                                            ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(r.id, r.tenant_id, r.session_id, r.agent_id, r.message_id, r.status,
                   r.attempt, r.output, StoredJson(r.error), r.input_tokens, r.output_tokens,
                   r.lease_owner, r.lease_expires_at, r.cancel_requested, r.created_at,
                   r.started_at, r.finished_at, r.requested_by, r.caller_role)
      .Run();
}

Status SqliteTx::UpdateRun(const Run& r) {
  static const std::string kSql =
                                    "UPDATE runs SET status=?, attempt=?, output=?, error=?, "
                                    "input_tokens=?, output_tokens=?, lease_owner=?, "
                                    "lease_expires_at=?, cancel_requested=?, started_at=?, "
                                    "finished_at=? WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(r.status, r.attempt, r.output, StoredJson(r.error),
            r.input_tokens, r.output_tokens, r.lease_owner, r.lease_expires_at, r.cancel_requested,
            r.started_at, r.finished_at, r.tenant_id, r.id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("run not found: " + r.id);
  return Status::Ok();
}

Result<Run> SqliteTx::GetRun(const std::string& tenant_id, const std::string& id) {
  static const std::string kSql = "SELECT " + std::string(kRunCols) +
                                            " FROM runs WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, id);
  return One<Run>(s, ReadRun<Stmt>, "run not found: " + id);
}

Result<Run> SqliteTx::LockRun(const std::string& tenant_id, const std::string& id) {
  return GetRun(tenant_id, id);
}

Result<Paged<Run>> SqliteTx::ListRuns(const std::string& tenant_id, const std::string& session_id,
                                      const Page& page) {
  int limit = ClampLimit(page.limit);
  // One statement per form: the tenant's runs, or one session's.
  static const std::string kAll = "SELECT " + std::string(kRunCols) +
                                  " FROM runs WHERE tenant_id=? AND ?='' AND id>? ORDER BY id LIMIT ?";
  static const std::string kSession = "SELECT " + std::string(kRunCols) +
                                      " FROM runs WHERE tenant_id=? AND session_id=? AND id>? "
                                      "ORDER BY id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(session_id.empty() ? kAll : kSession));
  s.BindAll(tenant_id, session_id, DecodeCursor(page.cursor), limit + 1);
  KEEL_ASSIGN_OR_RETURN(auto rows, Collect<Run>(s, ReadRun<Stmt>));
  return MakePage(std::move(rows), limit, [](const Run& r) { return r.id; });
}

Result<int64_t> SqliteTx::CountActiveRuns(const std::string& tenant_id) {
  static const std::string kSql = "SELECT count(*) FROM runs WHERE tenant_id=? AND "
                                            "status IN ('queued','running')";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
}

Result<bool> SqliteTx::SessionBusy(const std::string& tenant_id, const std::string& session_id) {
  static const std::string kSql =
      "SELECT 1 FROM runs INDEXED BY runs_session_active WHERE tenant_id=? AND session_id=? "
      "AND status IN ('queued','running','waiting_for_approval') LIMIT 1";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id);
  return s.Step();
}

Result<std::vector<Run>> SqliteTx::ClaimableRuns(Millis now, int limit) {
  // Two index range scans on (status, lease_expires_at); an OR would scan the whole table. A
  // queued run's earlier active runs are looked up by (session, status), so that a long
  // session's finished runs are not walked. The tenants take turns (every tenant's oldest, then
  // every tenant's second, ...), so that one tenant's long queue cannot fill the page and hide
  // the others' runs from the dispatcher.
  static const std::string kSql =
      "SELECT " + std::string(kRunCols) + " FROM (SELECT *, row_number() OVER "
      "(PARTITION BY tenant_id ORDER BY id) AS turn FROM (SELECT " + std::string(kRunCols) +
      " FROM runs r WHERE r.status='queued' "
      "AND NOT EXISTS (SELECT 1 FROM runs p INDEXED BY runs_session_active "
      "  WHERE p.session_id=r.session_id "
      "  AND p.status IN ('queued','running','waiting_for_approval') AND p.id<r.id) "
      "UNION ALL SELECT " + std::string(kRunCols) + " FROM runs WHERE status='running' AND "
      "lease_expires_at<?)) ORDER BY turn, id LIMIT ?";
  // Most looks find nothing: two index probes say so without the query's temporary tables.
  static const std::string kAnySql =
      "SELECT EXISTS(SELECT 1 FROM runs WHERE status='queued') OR "
      "EXISTS(SELECT 1 FROM runs WHERE status='running' AND lease_expires_at<?)";
  KEEL_ASSIGN_OR_RETURN(auto any, db_.Prepare(kAnySql));
  any.BindAll(now);
  KEEL_ASSIGN_OR_RETURN(bool found, any.Step());
  if (!found || any.Int(0) == 0) return std::vector<Run>{};
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  return Collect<Run>(s, ReadRun<Stmt>);
}

Status SqliteTx::ExpireLeasesOf(const std::string& owner) {
  static const std::string kSql = "UPDATE runs SET lease_expires_at=0 WHERE "
                                            "status='running' AND lease_owner=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(owner).Run();
}

Status SqliteTx::RenewLeases(const std::string& owner, const std::vector<std::string>& run_ids,
                             Millis expires_at) {
  static const std::string kSql = "UPDATE runs SET lease_expires_at=? WHERE id=? AND "
                                            "lease_owner=? AND status='running'";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  for (const auto& id : run_ids) {
    KEEL_RETURN_IF_ERROR(s.BindAll(expires_at, id, owner).Run());
  }
  return Status::Ok();
}

Status SqliteTx::InsertStep(const Step& x) {
  static const std::string kSql = "INSERT INTO run_steps(" + std::string(kStepCols) +
                                            ") VALUES(?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(x.id, x.tenant_id, x.run_id, x.seq, x.kind, x.status, DumpJson(x.input),
                   DumpJson(x.output), x.started_at, x.finished_at)
      .Run();
}

Status SqliteTx::UpdateStep(const Step& x) {
  static const std::string kSql = "UPDATE run_steps SET status=?, input=?, output=?, "
                                  "finished_at=? WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(x.status, DumpJson(x.input), DumpJson(x.output), x.finished_at, x.tenant_id, x.id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("step not found: " + x.id);
  return Status::Ok();
}

Result<std::vector<Step>> SqliteTx::ListSteps(const std::string& tenant_id,
                                              const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kStepCols) +
                                            " FROM run_steps WHERE tenant_id=? AND run_id=? "
                                            "ORDER BY seq";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, run_id);
  return Collect<Step>(s, ReadStep<Stmt>);
}

Status SqliteTx::InsertToolCall(const ToolCall& c) {
  static const std::string kSql = "INSERT INTO tool_calls(" + std::string(kToolCallCols) +
                                            ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(c.id, c.tenant_id, c.run_id, c.step_id, c.call_id, c.tool,
                   DumpJson(c.arguments), c.effect_class, c.effect_key, c.status,
                   DumpJson(c.result), c.created_at, c.updated_at)
      .Run();
}

Status SqliteTx::UpdateToolCall(const ToolCall& c) {
  static const std::string kSql = "UPDATE tool_calls SET status=?, arguments=?, result=?, "
                                  "updated_at=? WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(c.status, DumpJson(c.arguments), DumpJson(c.result), c.updated_at, c.tenant_id, c.id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("tool call not found: " + c.id);
  return Status::Ok();
}

Result<std::vector<ToolCall>> SqliteTx::ListToolCalls(const std::string& tenant_id,
                                                      const std::string& run_id) {
  static const std::string kSql = "SELECT " + std::string(kToolCallCols) +
                                            " FROM tool_calls WHERE tenant_id=? AND run_id=? "
                                            "ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, run_id);
  return Collect<ToolCall>(s, ReadToolCall<Stmt>);
}

// ---- EventLog

Status SqliteTx::Append(NewEvent n) {
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
  // As stored: with the row images the unit carried (the Json payload handed to live streams
  // leaves them out).
  std::string payload = DumpJson(e.payload);
  if (Status carried = AppendCarried(payload); !carried.ok()) {
    appended_.pop_back();
    return carried;
  }
  const ChainedFields chained = ChainedOf(e, payload);
  auto hash = sealer_.Next(chained, head_loader_);
  // The tenant's next position and origin_seq, each one probe of its unique index, read in
  // the unit that inserts the event, so a rolled back unit never leaves a gap; the one writer
  // makes them follow commit order. `position` stays the store-wide key, which no client sees.
  // (Read first and bound, rather than computed in the insert with RETURNING: RETURNING
  // gathers its row in a temporary table, which cost more than the two probes.)
  static const std::string kNext =
      "SELECT (SELECT coalesce(max(tenant_position),0)+1 FROM events WHERE tenant_id=?1), "
      "(SELECT coalesce(max(origin_seq),0)+1 FROM events WHERE tenant_id=?1 AND origin=?2)";
  static const std::string kSql =
      "INSERT INTO events(id, tenant_id, tenant_position, type, origin, origin_seq, agent_id, "
      "session_id, run_id, payload, occurred_at, hash) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)";
  Status st = hash.status();
  int64_t tenant_position = 0;
  if (st.ok()) {  // the statement is reset at the end of the block, before the insert
    auto next = db_.Prepare(kNext);
    auto row = next.ok() ? next->BindAll(e.tenant_id, e.origin).Step() : Result<bool>(next.status());
    if (!row.ok()) {
      st = row.status();
    } else if (!*row) {
      st = Internal("the event's positions were not read");
    } else {
      tenant_position = next->Int(0);
      e.origin_seq = next->Int(1);
    }
  }
  if (st.ok()) {
    auto s = db_.Prepare(kSql);
    st = s.ok() ? s->BindAll(e.id, e.tenant_id, tenant_position, e.type, e.origin, e.origin_seq,
                             e.agent_id, e.session_id, e.run_id, payload, e.occurred_at, *hash)
                      .Run()
                : s.status();
  }
  if (st.ok()) {
    e.position = tenant_position;
    sealer_.Appended(chained, *hash, e.origin_seq);
  }
  if (!st.ok()) appended_.pop_back();
  return st;
}

// ---- The audit chain (store/audit.h)

Result<std::optional<ChainHead>> SqliteTx::LoadChainHead(const std::string& tenant_id,
                                                         const std::string& origin) {
  static const std::string kHead =
      "SELECT last_id, last_seq, hash, anchor, mac FROM audit_heads WHERE tenant_id=? AND origin=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kHead));
  s.BindAll(tenant_id, origin);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (row) {
    return std::optional<ChainHead>(
        ChainHead{tenant_id, origin, s.Text(0), s.Int(1), s.Text(2), s.Text(3), s.Text(4)});
  }
  // No head: a chain without events, or one whose head was removed (its last hashed event
  // carries it on, unsigned, so the sealer marks it).
  static const std::string kLast =
      "SELECT id, origin_seq, hash FROM events WHERE tenant_id=? AND origin=? AND hash<>'' "
      "ORDER BY origin_seq DESC LIMIT 1";
  KEEL_ASSIGN_OR_RETURN(auto last, db_.Prepare(kLast));
  last.BindAll(tenant_id, origin);
  KEEL_ASSIGN_OR_RETURN(bool found, last.Step());
  if (!found) return std::optional<ChainHead>();
  return std::optional<ChainHead>(
      ChainHead{tenant_id, origin, last.Text(0), last.Int(1), last.Text(2), "", ""});
}

Status SqliteTx::WriteChainHeads() {
  static const std::string kSql =
      "INSERT INTO audit_heads(tenant_id, origin, last_id, last_seq, hash, anchor, mac) "
      "VALUES(?,?,?,?,?,?,?) ON CONFLICT(tenant_id, origin) DO UPDATE SET last_id=excluded.last_id, "
      "last_seq=excluded.last_seq, hash=excluded.hash, anchor=excluded.anchor, mac=excluded.mac";
  for (const ChainHead& h : sealer_.Heads()) {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
    KEEL_RETURN_IF_ERROR(
        s.BindAll(h.tenant_id, h.origin, h.last_id, h.last_seq, h.hash, h.anchor, h.mac).Run());
  }
  return Status::Ok();
}

Status SqliteTx::BackfillChains() {
  static const std::string kSql =
      "SELECT position, id, tenant_id, type, origin, origin_seq, agent_id, session_id, run_id, "
      "payload, occurred_at FROM events WHERE hash='' ORDER BY position";
  static const std::string kSet = "UPDATE events SET hash=? WHERE position=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  std::vector<std::pair<Event, std::string>> unhashed;  // with the payload's stored text
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    Event e;
    e.position = s.Int(0);
    e.id = s.Text(1);
    e.tenant_id = s.Text(2);
    e.type = s.Text(3);
    e.origin = s.Text(4);
    e.origin_seq = s.Int(5);
    e.agent_id = s.Text(6);
    e.session_id = s.Text(7);
    e.run_id = s.Text(8);
    e.occurred_at = s.Int(10);
    unhashed.emplace_back(std::move(e), s.Text(9));
  }
  for (const auto& [e, payload] : unhashed) {
    const ChainedFields chained = ChainedOf(e, payload);
    KEEL_ASSIGN_OR_RETURN(std::string hash, sealer_.Next(chained, head_loader_));
    KEEL_ASSIGN_OR_RETURN(auto set, db_.Prepare(kSet));
    KEEL_RETURN_IF_ERROR(set.BindAll(hash, e.position).Run());
    sealer_.Appended(chained, hash, e.origin_seq);
  }
  return Status::Ok();
}

Result<std::vector<Event>> SqliteTx::ReadEvents(const std::string& tenant_id, int64_t after,
                                                const EventFilter& f, int limit) {
  static const std::string kSql =
      "SELECT " + std::string(kEventCols) + " FROM events WHERE tenant_id=? AND "
      "tenant_position>? AND (?='' OR agent_id=?) AND (?='' OR session_id=?) AND "
      "(?='' OR run_id=?) ORDER BY tenant_position LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, after, f.agent_id, f.agent_id, f.session_id, f.session_id, f.run_id,
            f.run_id, std::clamp(limit, 1, 1000));
  return Collect<Event>(s, ReadEvent<Stmt>);
}

Result<int64_t> SqliteTx::LastPosition(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT coalesce(max(tenant_position),0) FROM events WHERE tenant_id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
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

Status SqliteTx::ExportTable(const std::string& tenant_id, const std::string& table,
                             const std::function<Status(const Json& row)>& emit) {
  KEEL_ASSIGN_OR_RETURN(const ExportTableSpec* spec, ExportTableOf(table));
  const std::string tenant_col = table == "tenants" ? "id" : "tenant_id";
  std::string sql = "SELECT " + ColumnList(*spec) + " FROM " + spec->name + " WHERE (?1='' OR " +
                    tenant_col + "=?1) ORDER BY " + spec->order_by;
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(sql));
  s.BindAll(tenant_id);
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    Json out = Json::object();
    for (int i = 0; i < static_cast<int>(spec->columns.size()); ++i) {
      const ExportColumn& c = spec->columns[i];
      if (c.type == ColumnType::kText) {
        out[c.name] = s.Text(i);
      } else if (s.IsNull(i)) {
        out[c.name] = nullptr;
      } else {
        out[c.name] = s.Int(i);
      }
    }
    KEEL_RETURN_IF_ERROR(emit(out));
  }
  return Status::Ok();
}

Status SqliteTx::ImportRow(const std::string& table, const Json& row) {
  KEEL_ASSIGN_OR_RETURN(const ExportTableSpec* spec, ExportTableOf(table));
  KEEL_RETURN_IF_ERROR(CheckExportRow(*spec, row));
  std::string marks;
  for (size_t i = 0; i < spec->columns.size(); ++i) marks += i ? ",?" : "?";
  // An explicit events.position also moves AUTOINCREMENT's counter (sqlite_sequence).
  std::string sql = "INSERT INTO " + std::string(spec->name) + "(" + ColumnList(*spec) +
                    ") VALUES(" + marks + ")";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(sql));
  for (int i = 0; i < static_cast<int>(spec->columns.size()); ++i) {
    const Json& v = row.at(spec->columns[i].name);
    if (v.is_null()) {
      s.BindNull(i + 1);
    } else if (v.is_string()) {
      s.Bind(i + 1, v.get_ref<const std::string&>());
    } else {
      s.Bind(i + 1, v.get<int64_t>());
    }
  }
  return s.Run();
}

// Store-wide positions come from AUTOINCREMENT, tenants' positions and origin_seqs from max():
// nothing to move.
// Imported memories get their search scope (not part of the archive).
// Events of an archive from before the audit chain are hashed here, and the chains' heads
// written at the unit's commit.
Status SqliteTx::FinishImport() {
  sealer_.Forget();
  KEEL_RETURN_IF_ERROR(BackfillChains());
  return ScopeImportedMemories();
}

Result<bool> SqliteTx::IsEmpty() {
  for (const auto& t : ExportTables()) {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare("SELECT 1 FROM " + std::string(t.name) + " LIMIT 1"));
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (row) return false;
  }
  return true;
}

}  // namespace keel::store::sqlite

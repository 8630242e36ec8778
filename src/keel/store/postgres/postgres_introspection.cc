// PostgresTx's IntrospectionStore: session descriptions and introspection triggers
// (introspection_store.h), with the same answers as SqliteTx's.

#include "keel/store/postgres/postgres_tx.h"

namespace keel::store::postgres {

Status PostgresTx::SetSessionDescription(const std::string& tenant_id,
                                         const std::string& session_id,
                                         const std::string& description, Millis at) {
  static const std::string kSql =
      "UPDATE sessions SET description=$1, updated_at=$2 WHERE tenant_id=$3 AND id=$4 "
      "RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(description, at, tenant_id, session_id)));
  if (rows.empty()) return NotFound("session not found: " + session_id);
  return Status::Ok();
}

Result<int64_t> PostgresTx::TurnsSinceIntrospection(const std::string& tenant_id,
                                                    const std::string& session_id) {
  static const std::string kSql =
      "SELECT count(*) FROM messages WHERE tenant_id=$1 AND session_id=$2 AND role='user' AND "
      "id > coalesce((SELECT max(id) FROM messages WHERE tenant_id=$1 AND session_id=$2 AND "
      "role='introspection'), '')";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id)));
  return rows.empty() ? 0 : rows.Int(0, 0);
}

Status PostgresTx::PutIntrospectionDue(const IntrospectionDue& d) {
  static const std::string kSql =
      "INSERT INTO introspection_due(tenant_id, session_id, agent_id, due_at) "
      "VALUES($1,$2,$3,$4) ON CONFLICT(tenant_id, session_id) DO UPDATE SET "
      "agent_id=EXCLUDED.agent_id, due_at=EXCLUDED.due_at";
  KEEL_RETURN_IF_ERROR(BindTenant(d.tenant_id));
  return conn_.Query(kSql, P(d.tenant_id, d.session_id, d.agent_id, d.due_at)).status();
}

Status PostgresTx::ClearIntrospectionDue(const std::string& tenant_id,
                                         const std::string& session_id, Millis due_at) {
  static const std::string kSql =
      "DELETE FROM introspection_due WHERE tenant_id=$1 AND session_id=$2 AND due_at=$3";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return conn_.Query(kSql, P(tenant_id, session_id, due_at)).status();
}

// Runtime-wide: the owner's function returns exactly these four columns.
Result<std::vector<IntrospectionDue>> PostgresTx::DueIntrospections(Millis now, int limit) {
  static const std::string kSql =
      "SELECT tenant_id, session_id, agent_id, due_at FROM keel_due_introspections($1, $2)";
  auto rows = conn_.Query(kSql, P(now, static_cast<int64_t>(limit)));
  if (!rows.ok()) return rows.status();
  std::vector<IntrospectionDue> out;
  for (int i = 0; i < rows->size(); ++i) {
    out.push_back({rows->Text(i, 0), rows->Text(i, 1), rows->Text(i, 2), rows->Int(i, 3)});
  }
  return out;
}

}  // namespace keel::store::postgres

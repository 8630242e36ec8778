// SqliteTx's IntrospectionStore: session descriptions and introspection triggers
// (introspection_store.h).

#include "keel/store/sqlite/sqlite_tx.h"

namespace keel::store::sqlite {

Status SqliteTx::SetSessionDescription(const std::string& tenant_id, const std::string& session_id,
                                       const std::string& description, Millis at) {
  static const std::string kSql =
      "UPDATE sessions SET description=?, updated_at=? WHERE tenant_id=? AND id=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(description, at, tenant_id, session_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("session not found: " + session_id);
  return Status::Ok();
}

Result<int64_t> SqliteTx::TurnsSinceIntrospection(const std::string& tenant_id,
                                                  const std::string& session_id) {
  static const std::string kSql =
      "SELECT count(*) FROM messages WHERE tenant_id=?1 AND session_id=?2 AND role='user' AND "
      "id > coalesce((SELECT max(id) FROM messages WHERE tenant_id=?1 AND session_id=?2 AND "
      "role='introspection'), '')";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
}

Status SqliteTx::PutIntrospectionDue(const IntrospectionDue& d) {
  static const std::string kSql =
      "INSERT INTO introspection_due(tenant_id, session_id, agent_id, due_at) VALUES(?,?,?,?) "
      "ON CONFLICT(tenant_id, session_id) DO UPDATE SET agent_id=excluded.agent_id, "
      "due_at=excluded.due_at";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(d.tenant_id, d.session_id, d.agent_id, d.due_at).Run();
}

Status SqliteTx::ClearIntrospectionDue(const std::string& tenant_id, const std::string& session_id,
                                       Millis due_at) {
  static const std::string kSql =
      "DELETE FROM introspection_due WHERE tenant_id=? AND session_id=? AND due_at=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(tenant_id, session_id, due_at).Run();
}

Result<std::vector<IntrospectionDue>> SqliteTx::DueIntrospections(Millis now, int limit) {
  static const std::string kSql =
      "SELECT tenant_id, session_id, agent_id, due_at FROM introspection_due WHERE due_at<=? "
      "ORDER BY due_at, session_id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  std::vector<IntrospectionDue> out;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Int(3)});
  }
  return out;
}

}  // namespace keel::store::sqlite

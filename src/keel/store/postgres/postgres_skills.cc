// PostgresTx's SkillStore: skills and their assignments to agents (skill_store.h), with the
// same answers as SqliteTx's.

#include "keel/store/postgres/postgres_tx.h"
#include "keel/store/skill_rows.h"

namespace keel::store::postgres {
namespace {

using namespace rows;  // NOLINT: the shared record readers

// Maps "no row changed" to kNotFound with `message`.
Status Changed(const Result<Rows>& rows, const std::string& message) {
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return NotFound(message);
  return Status::Ok();
}

}  // namespace

Status PostgresTx::UpsertSkill(const Skill& k) {
  static const std::string kSql =
      "INSERT INTO skills(" + std::string(kSkillFileCols) +
      ") VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT(tenant_id, name) DO UPDATE SET "
      "description=EXCLUDED.description, hash=EXCLUDED.hash, bytes=EXCLUDED.bytes, "
      "manifest=EXCLUDED.manifest, updated_at=EXCLUDED.updated_at, files=EXCLUDED.files";
  KEEL_RETURN_IF_ERROR(BindTenant(k.tenant_id));
  return conn_
      .Query(kSql, P(k.tenant_id, k.name, k.description, k.hash, k.bytes, DumpJson(k.manifest),
                     k.created_at, k.updated_at, DumpJson(k.files)))
      .status();
}

Result<Skill> PostgresTx::GetSkill(const std::string& tenant_id, const std::string& name,
                                   bool with_files) {
  static const std::string kMeta =
      "SELECT " + std::string(kSkillCols) + " FROM skills WHERE tenant_id=$1 AND name=$2";
  static const std::string kWhole =
      "SELECT " + std::string(kSkillFileCols) + " FROM skills WHERE tenant_id=$1 AND name=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(with_files ? kWhole : kMeta, P(tenant_id, name)));
  if (rows.empty()) return NotFound("skill not found: " + name);
  return with_files ? ReadSkillWithFiles(Row(rows, 0)) : ReadSkill(Row(rows, 0));
}

Result<std::vector<Skill>> PostgresTx::ListSkills(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kSkillCols) + " FROM skills WHERE tenant_id=$1 ORDER BY name";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id)));
  return Collect<Skill>(rows, ReadSkill<Row>);
}

// The skill's assignments go with it (ON DELETE CASCADE).
Status PostgresTx::DeleteSkill(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql =
      "DELETE FROM skills WHERE tenant_id=$1 AND name=$2 RETURNING name";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Changed(conn_.Query(kSql, P(tenant_id, name)), "skill not found: " + name);
}

// The skill's row is share-locked until the transaction ends, so that it cannot be deleted
// between the check and the insert.
Status PostgresTx::AssignSkill(const SkillAssignment& a) {
  static const std::string kExists =
      "SELECT name FROM skills WHERE tenant_id=$1 AND name=$2 FOR KEY SHARE";
  static const std::string kSql = "INSERT INTO agent_skills(" + std::string(kSkillAssignmentCols) +
                                  ") VALUES($1,$2,$3,$4) ON CONFLICT DO NOTHING";
  KEEL_RETURN_IF_ERROR(BindTenant(a.tenant_id));
  KEEL_RETURN_IF_ERROR(
      Changed(conn_.Query(kExists, P(a.tenant_id, a.skill)), "skill not found: " + a.skill));
  return conn_.Query(kSql, P(a.tenant_id, a.agent_id, a.skill, a.created_at)).status();
}

Status PostgresTx::UnassignSkill(const std::string& tenant_id, const std::string& agent_id,
                                 const std::string& name) {
  static const std::string kSql =
      "DELETE FROM agent_skills WHERE tenant_id=$1 AND agent_id=$2 AND skill=$3 RETURNING skill";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return Changed(conn_.Query(kSql, P(tenant_id, agent_id, name)),
                 "skill " + name + " is not assigned to agent " + agent_id);
}

Result<std::vector<SkillAssignment>> PostgresTx::ListSkillAssignments(const std::string& tenant_id,
                                                                      const std::string& name) {
  static const std::string kSql = "SELECT " + std::string(kSkillAssignmentCols) +
                                  " FROM agent_skills WHERE tenant_id=$1 AND skill=$2 "
                                  "ORDER BY agent_id";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, name)));
  return Collect<SkillAssignment>(rows, ReadSkillAssignment<Row>);
}

Result<std::vector<Skill>> PostgresTx::SkillsForAgent(const std::string& tenant_id,
                                                      const std::string& agent_id,
                                                      bool with_files) {
  static const std::string kWhere =
      " FROM skills WHERE tenant_id=$1 AND name IN (SELECT skill FROM agent_skills "
      "WHERE tenant_id=$1 AND agent_id=$2) ORDER BY name";
  static const std::string kMeta = "SELECT " + std::string(kSkillCols) + kWhere;
  static const std::string kWhole = "SELECT " + std::string(kSkillFileCols) + kWhere;
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows,
                        conn_.Query(with_files ? kWhole : kMeta, P(tenant_id, agent_id)));
  return with_files ? Collect<Skill>(rows, ReadSkillWithFiles<Row>)
                    : Collect<Skill>(rows, ReadSkill<Row>);
}

}  // namespace keel::store::postgres

// SqliteTx's SkillStore: skills and their assignments to agents (skill_store.h).

#include "keel/store/skill_rows.h"
#include "keel/store/sqlite/sqlite_tx.h"

namespace keel::store::sqlite {
namespace {

using namespace rows;  // NOLINT: the shared record readers

}  // namespace

Status SqliteTx::UpsertSkill(const Skill& k) {
  // ON CONFLICT DO UPDATE, not INSERT OR REPLACE: a replace would delete the row first and so
  // cascade to the skill's assignments.
  static const std::string kSql =
      "INSERT INTO skills(" + std::string(kSkillFileCols) +
      ") VALUES(?,?,?,?,?,?,?,?,?) ON CONFLICT(tenant_id, name) DO UPDATE SET "
      "description=excluded.description, hash=excluded.hash, bytes=excluded.bytes, "
      "manifest=excluded.manifest, updated_at=excluded.updated_at, files=excluded.files";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s
      .BindAll(k.tenant_id, k.name, k.description, k.hash, k.bytes, DumpJson(k.manifest),
               k.created_at, k.updated_at, DumpJson(k.files))
      .Run();
}

Result<Skill> SqliteTx::GetSkill(const std::string& tenant_id, const std::string& name,
                                 bool with_files) {
  static const std::string kMeta =
      "SELECT " + std::string(kSkillCols) + " FROM skills WHERE tenant_id=? AND name=?";
  static const std::string kWhole =
      "SELECT " + std::string(kSkillFileCols) + " FROM skills WHERE tenant_id=? AND name=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(with_files ? kWhole : kMeta));
  s.BindAll(tenant_id, name);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFound("skill not found: " + name);
  return with_files ? ReadSkillWithFiles(s) : ReadSkill(s);
}

Result<std::vector<Skill>> SqliteTx::ListSkills(const std::string& tenant_id) {
  static const std::string kSql =
      "SELECT " + std::string(kSkillCols) + " FROM skills WHERE tenant_id=? ORDER BY name";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id);
  return Collect<Skill>(s, ReadSkill<Stmt>);
}

// The skill's assignments go with it (ON DELETE CASCADE).
Status SqliteTx::DeleteSkill(const std::string& tenant_id, const std::string& name) {
  static const std::string kSql = "DELETE FROM skills WHERE tenant_id=? AND name=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, name);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("skill not found: " + name);
  return Status::Ok();
}

Status SqliteTx::AssignSkill(const SkillAssignment& a) {
  static const std::string kExists = "SELECT 1 FROM skills WHERE tenant_id=? AND name=?";
  static const std::string kSql = "INSERT INTO agent_skills(" + std::string(kSkillAssignmentCols) +
                                  ") VALUES(?,?,?,?) ON CONFLICT DO NOTHING";
  {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kExists));
    s.BindAll(a.tenant_id, a.skill);
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return NotFound("skill not found: " + a.skill);
  }
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(a.tenant_id, a.agent_id, a.skill, a.created_at).Run();
}

Status SqliteTx::UnassignSkill(const std::string& tenant_id, const std::string& agent_id,
                               const std::string& name) {
  static const std::string kSql =
      "DELETE FROM agent_skills WHERE tenant_id=? AND agent_id=? AND skill=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, agent_id, name);
  KEEL_ASSIGN_OR_RETURN(bool row, s.RunChanged());
  if (!row) return NotFound("skill " + name + " is not assigned to agent " + agent_id);
  return Status::Ok();
}

Result<std::vector<SkillAssignment>> SqliteTx::ListSkillAssignments(const std::string& tenant_id,
                                                                    const std::string& name) {
  static const std::string kSql = "SELECT " + std::string(kSkillAssignmentCols) +
                                  " FROM agent_skills WHERE tenant_id=? AND skill=? "
                                  "ORDER BY agent_id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, name);
  return Collect<SkillAssignment>(s, ReadSkillAssignment<Stmt>);
}

Result<std::vector<Skill>> SqliteTx::SkillsForAgent(const std::string& tenant_id,
                                                    const std::string& agent_id, bool with_files) {
  static const std::string kWhere =
      " FROM skills WHERE tenant_id=? AND name IN (SELECT skill FROM agent_skills "
      "WHERE tenant_id=? AND agent_id=?) ORDER BY name";
  static const std::string kMeta = "SELECT " + std::string(kSkillCols) + kWhere;
  static const std::string kWhole = "SELECT " + std::string(kSkillFileCols) + kWhere;
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(with_files ? kWhole : kMeta));
  s.BindAll(tenant_id, tenant_id, agent_id);
  return with_files ? Collect<Skill>(s, ReadSkillWithFiles<Stmt>)
                    : Collect<Skill>(s, ReadSkill<Stmt>);
}

}  // namespace keel::store::sqlite

#pragma once
// Skills: prompt assets registered per tenant (docs/SKILLS.md). A skill is a directory's worth of
// files (SKILL.md and optional others) stored whole with its name and description from SKILL.md's
// front matter; agents are assigned skills by name. The records and their storage port; the
// checks of a registration are in keel/skills/skills.h.

#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {

// A registered skill. (tenant_id, name) is unique; registering the same name again replaces it.
struct Skill {
  std::string tenant_id;
  std::string name;  // [a-z0-9-]{1,64}, from the front matter
  std::string description;
  std::string hash;   // lowercase hex SHA-256 over its files (paths and bytes), see skills.h
  int64_t bytes = 0;  // the files' total size, decoded
  // [{"path", "bytes", "binary"}], by path: what the skill holds, without the contents.
  Json manifest = Json::array();
  // {"PATH": TEXT | {"base64": B64}}: the contents; null when read without them.
  Json files;
  Millis created_at = 0;
  Millis updated_at = 0;
};

// A skill assigned to an agent.
struct SkillAssignment {
  std::string tenant_id;
  std::string agent_id;
  std::string skill;  // the skill's name
  Millis created_at = 0;
};

class SkillStore {
 public:
  virtual ~SkillStore() = default;
  // Inserts or replaces (same tenant and name) a skill with its files; created_at is kept on
  // replace, and so are its assignments.
  virtual Status UpsertSkill(const Skill& skill) = 0;
  // kNotFound "skill not found: NAME". `with_files` false leaves `files` null.
  virtual Result<Skill> GetSkill(const std::string& tenant_id, const std::string& name,
                                 bool with_files) = 0;
  // By name, without files.
  virtual Result<std::vector<Skill>> ListSkills(const std::string& tenant_id) = 0;
  // Deletes the skill and its assignments. kNotFound when absent.
  virtual Status DeleteSkill(const std::string& tenant_id, const std::string& name) = 0;
  // Idempotent (assigning again keeps the first created_at). REQUIRES: the skill exists
  // (kNotFound "skill not found: NAME" otherwise).
  virtual Status AssignSkill(const SkillAssignment& a) = 0;
  // kNotFound when that assignment does not exist.
  virtual Status UnassignSkill(const std::string& tenant_id, const std::string& agent_id,
                               const std::string& name) = 0;
  // The skill's assignments, by agent_id.
  virtual Result<std::vector<SkillAssignment>> ListSkillAssignments(const std::string& tenant_id,
                                                                    const std::string& name) = 0;
  // The skills assigned to the agent, by name; with their files when `with_files`.
  virtual Result<std::vector<Skill>> SkillsForAgent(const std::string& tenant_id,
                                                    const std::string& agent_id,
                                                    bool with_files) = 0;
  // The same, filled later (store.h, Tx).
  virtual Status SkillsForAgentLater(const std::string& tenant_id, const std::string& agent_id,
                                     bool with_files, std::vector<Skill>& out) = 0;
};

}  // namespace keel::store

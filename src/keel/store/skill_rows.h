#pragma once
// Internal to the store backends: the columns of the skills tables and how a row maps to the
// records of skill_store.h (as rows.h does for the kernel's records).

#include "keel/store/rows.h"
#include "keel/store/skill_store.h"

namespace keel::store::rows {

// A skill without its files; kSkillFileCols adds them as the last column.
inline constexpr const char* kSkillCols =
    "tenant_id, name, description, hash, bytes, manifest, created_at, updated_at";
inline constexpr const char* kSkillFileCols =
    "tenant_id, name, description, hash, bytes, manifest, created_at, updated_at, files";

template <typename Row>
Skill ReadSkill(const Row& s) {
  Skill k;
  k.tenant_id = s.Text(0);
  k.name = s.Text(1);
  k.description = s.Text(2);
  k.hash = s.Text(3);
  k.bytes = s.Int(4);
  k.manifest = ParseStored(s.Text(5));
  k.created_at = s.Int(6);
  k.updated_at = s.Int(7);
  return k;
}

template <typename Row>
Skill ReadSkillWithFiles(const Row& s) {
  Skill k = ReadSkill(s);
  k.files = ParseStored(s.Text(8));
  return k;
}

inline constexpr const char* kSkillAssignmentCols = "tenant_id, agent_id, skill, created_at";
template <typename Row>
SkillAssignment ReadSkillAssignment(const Row& s) {
  return SkillAssignment{s.Text(0), s.Text(1), s.Text(2), s.Int(3)};
}

}  // namespace keel::store::rows

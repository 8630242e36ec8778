#pragma once
// Skills as prompt assets (docs/SKILLS.md): a skill is a directory's worth of files, SKILL.md
// (front matter with `name` and `description`, then instructions) and optional others. This
// module checks a registration, renders the index the prompt carries, copies an agent's skills
// into its workspace, and provides the `skills.read` tool. Pure functions apart from
// SyncWorkspace (the file system) and the tool (the store); no state of its own.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/store/skill_store.h"

namespace keel::store {
class Store;
}
namespace keel::tools {
class ToolRegistry;
}

namespace keel::skills {

inline constexpr size_t kMaxFileBytes = 1 << 20;   // one file, decoded
inline constexpr size_t kMaxSkillBytes = 8 << 20;  // all of a skill's files, decoded
inline constexpr size_t kMaxFiles = 200;
inline constexpr size_t kMaxPathBytes = 255;
inline constexpr size_t kMaxDescriptionBytes = 1024;

// SKILL.md's front matter: the YAML-ish block between a first line `---` and the next `---`.
// Each entry is `key: value`; a value may be quoted ("..." with \-escapes, or '...'), continued
// on indented lines (folded with spaces), or a block scalar (`>` folds, `|` keeps newlines).
// Comments (#) and blank lines are skipped. Nested YAML is not understood; keys other than
// name and description are kept as text.
struct FrontMatter {
  std::string name;
  std::string description;
  std::map<std::string, std::string> fields;  // every key, as read
  std::string body;                           // what follows the closing line
};
// kInvalidArgument naming the problem: no front matter, no closing line, a line that is not
// `key: value`, a repeated key, a missing or empty name or description, a bad name, a
// description over kMaxDescriptionBytes.
Result<FrontMatter> ParseFrontMatter(std::string_view text);

// [a-z0-9-]{1,64}.
Status CheckSkillName(const std::string& name);
// A relative path of non-empty components separated by '/', none of them `.` or `..`, without
// control characters or backslashes, at most kMaxPathBytes.
Status CheckSkillPath(const std::string& path);

// Checks a registration's files, {"PATH": TEXT | {"base64": B64}}, as a whole (SKILL.md present
// and its front matter valid, paths, counts and sizes) and returns the skill to store: name,
// description, hash, bytes, manifest and files (base64 in its canonical padded form). tenant_id
// and times are left for the caller. kInvalidArgument naming the problem.
Result<store::Skill> SkillOf(const Json& files);

// The bytes of one file of a skill read with its files. kNotFound when it has none by that path.
Result<std::string> FileBytes(const store::Skill& skill, const std::string& path);

// The part of the system prompt that lists the agent's skills (name and description, and how
// to read one); "" for none.
std::string SkillIndex(const std::vector<store::Skill>& skills);

// Copies skills into an agent's workspace: each under skills/NAME/, with the content hash kept
// in .keel/skills/NAME.sha256.
// The skills whose copy in `workspace` is missing or not of their current hash.
std::vector<std::string> StaleSkills(const std::string& workspace,
                                     const std::vector<store::Skill>& skills);
// Makes skills/ hold exactly `skills` (the agent's assigned ones): those read with their files
// are written whole (a fresh directory renamed over the old copy), the others are left as they
// are, and every other entry of skills/ is removed. Fails (kPermissionDenied) when skills/ leads
// out of the workspace.
Status SyncWorkspace(const std::string& workspace, const std::vector<store::Skill>& skills);

// skills.read (pure, read): SKILL.md of one of the calling agent's skills, or one of its files.
// It reads the store from the gateway's tool pool.
Status RegisterSkillTools(tools::ToolRegistry& registry, store::Store& store);

}  // namespace keel::skills

// skills.read: what a skill says, read from the store (the truth), not from the workspace copy
// (which the agent's own commands may have changed).

#include "keel/skills/skills.h"
#include "keel/store/store.h"
#include "keel/tools/tool.h"

namespace keel::skills {
namespace {

class SkillsRead final : public tools::Tool {
 public:
  explicit SkillsRead(store::Store& store) : store_(store) {}

  std::string name() const override { return "skills.read"; }
  std::string description() const override {
    return "Reads one of your skills: its instructions (SKILL.md) and the list of its files, or "
           "one of its files when `file` is given.";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties",
             {{"name", {{"type", "string"}, {"description", "the skill's name"}}},
              {"file",
               {{"type", "string"},
                {"description", "a file of the skill, by its path (default: SKILL.md)"}}}}},
            {"required", {"name"}},
            {"additionalProperties", false}};
  }
  tools::EffectClass effect_class() const override { return tools::EffectClass::kPure; }
  std::vector<std::string> rights() const override { return {"read"}; }
  // It waits on the store, which may be across a network.
  bool blocking() const override { return true; }

  Result<Json> Execute(const tools::ToolContext& ctx, const Json& args) override {
    const std::string skill_name = args.value("name", "");
    const std::string path = args.value("file", "SKILL.md");
    store::Skill skill;
    KEEL_RETURN_IF_ERROR(store_.Read([&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto assigned,
                            tx.skills().SkillsForAgent(ctx.tenant_id, ctx.agent_id, false));
      bool found = false;
      for (const auto& s : assigned) found = found || s.name == skill_name;
      if (!found) return NotFound("no skill '" + skill_name + "' is assigned to this agent");
      KEEL_ASSIGN_OR_RETURN(skill, tx.skills().GetSkill(ctx.tenant_id, skill_name, true));
      return Status::Ok();
    }));
    KEEL_ASSIGN_OR_RETURN(std::string bytes, FileBytes(skill, path));
    Json out = {{"name", skill.name}, {"file", path}};
    const Json& stored = skill.files[path];
    if (stored.is_string()) {
      out["content"] = bytes;
    } else {
      out["base64"] = stored["base64"];
    }
    if (!args.contains("file")) {
      out["description"] = skill.description;
      Json others = Json::array();
      for (const auto& f : skill.manifest) {
        if (f.value("path", "") != "SKILL.md") others.push_back(f.value("path", ""));
      }
      out["files"] = others;
    }
    return out;
  }

 private:
  store::Store& store_;
};

}  // namespace

Status RegisterSkillTools(tools::ToolRegistry& registry, store::Store& store) {
  return registry.Register(std::make_unique<SkillsRead>(store));
}

}  // namespace keel::skills

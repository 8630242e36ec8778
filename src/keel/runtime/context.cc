// Context assembly: what a model turn starts from. The system prompt (the agent's instructions
// and the index of its skills), the session's earlier messages and the run's prompt. The agent's
// skills are brought up to date in its workspace on the way (docs/SKILLS.md).

#include <algorithm>
#include <filesystem>

#include "keel/common/log.h"
#include "keel/model/provider.h"
#include "keel/runtime/runtime.h"
#include "keel/skills/skills.h"
#include "keel/store/async.h"
#include "keel/tools/gateway.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

// The agent's instructions, then each non-empty part, separated by blank lines.
std::string SystemPrompt(const std::string& instructions, const std::vector<std::string>& parts) {
  std::string out = instructions;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += "\n\n";
    out += p;
  }
  return out;
}

}  // namespace

asio::awaitable<Status> Runtime::SyncSkills(const store::Run& run,
                                            std::vector<store::Skill> skills) {
  const std::string workspace = gateway_.WorkspaceOf(run.agent_id);
  std::error_code ec;
  if (skills.empty() && !std::filesystem::exists(workspace + "/skills", ec)) co_return Status::Ok();
  // Only the skills whose copy is not current are read with their files and written.
  std::vector<std::string> stale = skills::StaleSkills(workspace, skills);
  if (!stale.empty()) {
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      for (auto& s : skills) {
        if (std::find(stale.begin(), stale.end(), s.name) == stale.end()) continue;
        KEEL_ASSIGN_OR_RETURN(s, tx.skills().GetSkill(run.tenant_id, s.name, true));
      }
      return Status::Ok();
    });
    if (!read.ok()) co_return read;
  }
  co_return skills::SyncWorkspace(workspace, skills);
}

asio::awaitable<Status> Runtime::AssembleContext(const store::Run& run, const store::Agent& agent,
                                                 const store::Message& prompt,
                                                 model::ModelRequest& request) {
  std::vector<store::Message> history;
  std::vector<store::Skill> skills;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(
        history, tx.messages().RecentMessages(run.tenant_id, run.session_id, run.message_id,
                                              options_.history_limit));
    KEEL_ASSIGN_OR_RETURN(skills, tx.skills().SkillsForAgent(run.tenant_id, run.agent_id, false));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  // Before the turn's tools run. A copy that fails does not stop the turn: skills.read still
  // reads the skills from the store.
  if (Status synced = co_await SyncSkills(run, skills); !synced.ok()) {
    LogError("agent " + run.agent_id +
             ": cannot copy its skills into its workspace: " + synced.message());
  }

  std::string system = SystemPrompt(agent.instructions, {skills::SkillIndex(skills)});
  if (!system.empty()) request.messages.push_back({"system", system, {}, "", ""});
  for (const auto& m : history) {
    if (m.role == "user" || m.role == "assistant") {
      request.messages.push_back({m.role, m.content, {}, "", ""});
    }
  }
  request.messages.push_back({"user", prompt.content, {}, "", ""});
  co_return Status::Ok();
}

}  // namespace keel::runtime

#pragma once
// tools::Gateway — the one door every tool call passes (DESIGN.md invariant 4):
//   policy -> effect journal (started, durable) -> execution -> result (durable).
// Veto hooks and approvals slot in before the journal; nothing else executes a tool.
//
// Runs on the server's io executor. A call's journal entry and its step are committed before
// the tool runs, so after a crash the runtime knows which calls may have started
// (invariant 5): `pure`/`idempotent` ones are re-run with the same effect key, `once` ones
// resolve to `unknown` and are never repeated.

#include <boost/asio/awaitable.hpp>

#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/store/store.h"
#include "keel/tools/tool.h"

namespace keel::tools {

struct CallRequest {
  std::string tenant_id;
  std::string agent_id;
  std::string session_id;
  std::string run_id;
  int step_seq = 0;           // the step number this call records
  std::string call_id;        // the model's id for the call
  std::string tool;
  Json arguments = Json::object();
  Json allowed_tools = Json::array();  // the agent's `tools`; empty = every registered tool
};

struct CallOutcome {
  std::string status;  // succeeded | failed | denied | unknown
  Json result;         // the tool's value, or {"error": "..."}
  // The text the model sees as the tool's answer.
  std::string ForModel() const;
};

class Gateway {
 public:
  Gateway(store::Store& store, ToolRegistry& registry, std::string workspaces_root)
      : store_(store), registry_(registry), workspaces_root_(std::move(workspaces_root)) {}

  // Takes a proposed call through the whole pipeline. Fails only when the store fails; a
  // denied or failing tool is a successful CallOutcome with that status.
  boost::asio::awaitable<Result<CallOutcome>> Call(const CallRequest& request);

  // Finishes a call whose journal entry says `started` but that has no result (a crash
  // happened while it ran). `step` is that call's recorded step.
  boost::asio::awaitable<Result<CallOutcome>> Resume(const store::ToolCall& call,
                                                     const store::Step& step,
                                                     const std::string& agent_id,
                                                     const std::string& session_id);

  // The registered tools the agent's `tools` list lets it call (what the model is offered).
  std::vector<const Tool*> ToolsFor(const Json& allowed_tools) const;

  std::string WorkspaceOf(const std::string& agent_id) const {
    return workspaces_root_ + "/" + agent_id;
  }
  // Whether the agent's `tools` list lets it call `tool`.
  static bool Allowed(const Json& allowed_tools, const std::string& tool);

 private:
  boost::asio::awaitable<Result<CallOutcome>> ExecuteAndRecord(store::ToolCall call,
                                                               store::Step step,
                                                               const std::string& agent_id,
                                                               const std::string& session_id);

  store::Store& store_;
  ToolRegistry& registry_;
  const std::string workspaces_root_;
};

}  // namespace keel::tools

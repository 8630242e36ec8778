#pragma once
// tools::Gateway — the one door every tool call passes (DESIGN.md invariant 4):
//   checks (known tool, on the agent's list, arguments match its schema, no emergency stop)
//   -> policy (tenant frame, agent narrowing, caller's role) -> approval when needed
//   -> effect journal (started, durable) -> execution -> result (durable).
// Veto hooks slot in before the policy; nothing else executes a tool. Every decision is
// recorded with its reason in the call's step and its events.
//
// A call that needs a human parks its run in the same unit of work that records the call:
// run `waiting_for_approval` with its lease released, session `awaiting_approval`, and a pending
// approval. approvals::Decide queues the run again; on its next attempt the runtime passes the
// decided call to ExecuteApproved (approved) or hands the model the refusal (rejected).
//
// Runs on the server's io executor. A call's journal entry and its step are committed before
// the tool runs, so after a crash the runtime knows which calls may have started
// (invariant 5): `pure`/`idempotent` ones are re-run with the same effect key, `once` ones
// resolve to `unknown` and are never repeated.

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/store/store.h"
#include "keel/tools/tool.h"
#include "keel/tools/workspace.h"

namespace keel::mcp {
class McpManager;
}
namespace keel::secrets {
class Vault;
}

namespace keel::tools {

class ToolPool;

struct CallRequest {
  std::string tenant_id;
  std::string agent_id;
  std::string session_id;
  std::string run_id;
  int step_seq = 0;           // the step number this call records
  std::string call_id;        // the model's id for the call
  std::string tool;
  Json arguments = Json::object();
  Json allowed_tools = Json::array();  // the agent's `tools`; empty = no tool
  Json agent_config = Json::object();   // handed to the tool (ToolContext)
  std::string caller_role = "owner";    // of whoever posted the run's message
  std::string requested_by;             // that caller's token id
  int attempt = 0;                      // the run's attempt making the call (ownership check)
};

struct GatewayOptions {
  int64_t approval_ttl_ms = 24LL * 3600 * 1000;  // a pending approval expires after this
  // A result larger than this (as JSON text) is kept whole in the agent's workspace, under
  // .keel/results/, and the model gets its head and tail with the file's name.
  size_t large_result_bytes = 16 * 1024;
  // Who unsandboxed stdio MCP servers run as, and what every sandbox hides.
  ExecOptions exec;
  // The tool pool (tool_pool.h): threads for blocking tools, and the most of them one tenant's
  // calls use at once.
  int tool_threads = 16;
  int tenant_tool_threads = 4;
};

// A veto hook's refusal. With abort_turn the run must stop (a plugin whose failure mode is
// "fail" failed deciding).
struct Veto {
  std::string reason;
  bool abort_turn = false;
};

// A veto hook sees every call after the tool is known and its arguments checked, before the
// policy, and may refuse it: it returns the refusal, or nullopt to let it pass. Hooks are
// awaited on the event loop, in the order they were added, and may suspend without holding it
// (a Lua handler waiting on a memory read); the first refusal wins and is recorded like any
// denial; a hook that throws refuses. `call` stays valid until the hook completes. (The plugin
// host registers the agents' `tool.before` vetoes here.)
using VetoHook =
    std::function<boost::asio::awaitable<std::optional<Veto>>(const CallRequest& call)>;

// Tools of one agent beyond the registered and MCP ones (the ones its plugins added), named
// plugin__{plugin}__{tool}.
using AgentTools = std::function<std::vector<std::shared_ptr<Tool>>(const std::string& agent_id)>;

struct CallOutcome {
  // succeeded | failed | denied | unknown | rejected, or awaiting_approval: the run is parked
  // and must stop executing (result {"approval_id": ...}).
  std::string status;
  Json result;         // the tool's value, or {"error": "..."}
  bool abort_turn = false;  // denied by a veto that stops the run
  // The text the model sees as the tool's answer.
  std::string ForModel() const;
};

// What a call came to, for whoever watches calls end (tool.after).
struct CallRecord {
  std::string tenant_id;
  std::string agent_id;
  std::string session_id;
  std::string run_id;
  const store::ToolCall* call;  // as recorded (status, result, effect class)
  Json decision;                // the gateway's decision {"outcome", "reason"}
  int64_t duration_ms = 0;      // of the execution
};
// Awaited on the event loop (it may suspend, as veto hooks may); `record` stays valid until it
// completes.
using AfterHook = std::function<boost::asio::awaitable<void>(const CallRecord& record)>;
// Webhook deliveries to write in the same unit of work as an executed call's result, so that
// neither is committed without the other (called on the event loop, before that unit).
using OutboxHook = std::function<std::vector<store::PluginDelivery>(const CallRecord& record)>;

class Gateway {
 public:
  // `mcp` and `vault` (both optional) make the tenants' MCP servers' tools callable as
  // mcp__{server}__{tool}, with their secrets resolved from the vault.
  Gateway(store::Store& store, ToolRegistry& registry, std::string workspaces_root,
          GatewayOptions options = {}, mcp::McpManager* mcp = nullptr,
          const secrets::Vault* vault = nullptr);
  ~Gateway();

  // A tool by name: a registered one, one of the agent's own (plugin__...), or
  // mcp__{server}__{tool} of the tenant's MCP servers (connecting to the server when needed).
  // kNotFound, or the server's failure to start.
  boost::asio::awaitable<Result<std::shared_ptr<Tool>>> Resolve(std::string tenant_id,
                                                                std::string agent_id,
                                                                std::string name);
  // What the model is offered: the registered tools, the agent's own and every tool of the
  // tenant's MCP servers that the agent's list allows. A server that cannot be reached offers
  // nothing (and says so in the log); the run goes on with the rest.
  boost::asio::awaitable<std::vector<std::shared_ptr<Tool>>> Offered(std::string tenant_id,
                                                                     std::string agent_id,
                                                                     Json allowed_tools);
  // Adds a veto hook (see VetoHook). REQUIRES: before the first call.
  void AddVetoHook(VetoHook hook) { veto_hooks_.push_back(std::move(hook)); }
  // Awaited (on the event loop) after every executed call is recorded. REQUIRES: before the
  // first call.
  void SetAfterHook(AfterHook hook) { after_hook_ = std::move(hook); }
  // See OutboxHook. REQUIRES: before the first call.
  void SetOutboxHook(OutboxHook hook) { outbox_hook_ = std::move(hook); }
  // Where the agents' own tools come from. REQUIRES: before the first call.
  void SetAgentTools(AgentTools source) { agent_tools_ = std::move(source); }

  // Stops a deleted MCP server's connection (off the event loop: a stubborn server takes
  // seconds to stop).
  boost::asio::awaitable<void> ForgetMcpServer(std::string server_id);
  // The tools of one registered MCP server, as the model would see them (for the API).
  boost::asio::awaitable<Result<std::vector<std::shared_ptr<Tool>>>> McpServerTools(
      store::McpServer server);

  // Takes a proposed call through the whole pipeline. Fails only when the store fails; a
  // denied or failing tool is a successful CallOutcome with that status.
  boost::asio::awaitable<Result<CallOutcome>> Call(const CallRequest& request);

  // Runs a call a human approved (journal status `approved`), with the approved (possibly
  // amended) arguments: journal `started`, execute, record. An emergency stop that came into
  // force meanwhile still refuses it.
  boost::asio::awaitable<Result<CallOutcome>> ExecuteApproved(const store::ToolCall& call,
                                                              const store::Step& step,
                                                              const std::string& agent_id,
                                                              const std::string& session_id,
                                                              const Json& agent_config,
                                                              int attempt);

  // Finishes a call whose journal entry says `started` but that has no result (a crash
  // happened while it ran). `step` is that call's recorded step.
  boost::asio::awaitable<Result<CallOutcome>> Resume(const store::ToolCall& call,
                                                     const store::Step& step,
                                                     const std::string& agent_id,
                                                     const std::string& session_id,
                                                     const Json& agent_config, int attempt);
  // Every write these make for a run (a refusal, the journal, a result, a park) first checks,
  // inside its unit, that this node still holds the run at `attempt` (CallRequest::attempt):
  // a node that lost the run (paused past its lease while another took it) gets kConflict and
  // neither records nor runs anything more for it.

  // The registered tools the agent's `tools` list lets it call (what the model is offered).
  std::vector<const Tool*> ToolsFor(const Json& allowed_tools) const;

  std::string WorkspaceOf(const std::string& agent_id) const {
    return workspaces_root_ + "/" + agent_id;
  }
  // Whether the agent's `tools` list lets it call `tool` (an empty or missing list: none).
  static bool Allowed(const Json& allowed_tools, const std::string& tool);
  // Ok when every entry of an agent's `tools` list names something that exists in the tenant:
  // a registered tool, a glob matching one ("files.*", "*"), mcp__{server}__{tool} or
  // mcp__{server}__* of a registered server, or plugin__...; kInvalidArgument naming the first
  // that does not.
  boost::asio::awaitable<Status> CheckToolList(std::string tenant_id, Json tools);

 private:
  boost::asio::awaitable<Result<CallOutcome>> ExecuteAndRecord(store::ToolCall call,
                                                               store::Step step,
                                                               std::string agent_id,
                                                               std::string session_id,
                                                               Json agent_config, int attempt);

  // Records a refused call (status denied) with its reason.
  boost::asio::awaitable<Result<CallOutcome>> Deny(store::ToolCall call, store::Step step,
                                                   const CallRequest& req, std::string reason);

  store::Store& store_;
  ToolRegistry& registry_;
  const std::string workspaces_root_;
  // Runs `fn` on the tool pool, in `tenant`'s share, and resumes the caller on its executor.
  template <typename T>
  boost::asio::awaitable<T> OnPool(std::string tenant, std::function<T()> fn);

  const GatewayOptions options_;
  std::vector<VetoHook> veto_hooks_;
  AfterHook after_hook_;
  OutboxHook outbox_hook_;
  AgentTools agent_tools_;
  mcp::McpManager* mcp_;
  const secrets::Vault* vault_;
  std::unique_ptr<ToolPool> pool_;  // runs blocking tools off the event loop
};

}  // namespace keel::tools

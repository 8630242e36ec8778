#pragma once
// The records Keel keeps. Plain values; every tenant-scoped record carries tenant_id.
// Times are milliseconds since the epoch (keel/common/time.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/time.h"

namespace keel::store {

struct Tenant {
  std::string id;
  std::string name;
  Millis created_at = 0;
  // What only the platform admin may grant, because each reaches the host: agents whose
  // exec_backend is "host", and stdio MCP servers run outside the sandbox.
  bool allow_host_exec = false;
  bool allow_stdio_mcp = false;
};

struct Token {
  std::string id;
  std::string tenant_id;
  std::string name;
  std::string role;  // owner | user | guest
  std::string hash;  // sha256 hex of the secret; the secret itself is never stored
  Millis created_at = 0;
  std::optional<Millis> revoked_at;
  // A dashboard sign-in (a browser session): the token that signed in, which this one acts as;
  // "" for a token made through POST /v1/tokens or at a tenant's creation.
  std::string parent_id;
  std::optional<Millis> expires_at;  // none: until revoked
  // The user it belongs to ("" for a token of the tenant, not of a person): its role on an
  // agent is then at most its user's there (access/users.h).
  std::string user_id;
};

// A tenant's data key for secrets, wrapped (sealed) by the key-encryption key whose fingerprint
// is kept beside it.
struct TenantKey {
  std::string tenant_id;
  std::string wrapped;
  std::string kek_fingerprint;
  Millis created_at = 0;
};

// A secret's value, sealed by its tenant's data key; (tenant_id, name) is unique.
struct Secret {
  std::string tenant_id;
  std::string name;
  std::string sealed;
  Millis created_at = 0;
  Millis updated_at = 0;
};

// A policy document: the tenant's frame (scope "") or an agent's narrowing (scope = agent id).
struct PolicyDoc {
  std::string tenant_id;
  std::string scope;
  Json body;
  Millis updated_at = 0;
};

// An emergency stop: tenant-wide (agent_id "") or for one agent. While it holds, runs halt at
// their next step and every tool call is refused.
struct EmergencyStop {
  std::string tenant_id;
  std::string agent_id;
  std::string reason;
  std::string created_by;  // token id
  Millis created_at = 0;
};

// A tool call waiting for (or decided by) a human.
struct Approval {
  std::string id;
  std::string tenant_id;
  std::string run_id;
  std::string session_id;
  std::string agent_id;
  std::string call_id;
  std::string tool;
  Json arguments = Json::object();  // as the model proposed them
  Json amended_arguments;           // null unless the approver changed them
  std::string reason;               // why a human is needed
  std::string status = "pending";   // pending | approved | rejected | expired | cancelled
  std::string requested_by;         // token id of whoever asked for the run
  std::string decided_by;           // token id, or "system"
  std::string decision_reason;
  Millis created_at = 0;
  Millis expires_at = 0;
  std::optional<Millis> decided_at;
};

// A standing approval: later calls of `tool` by `agent_id` (whose arguments contain every
// member of `arguments_match`, when it is an object) need no human until `expires_at`.
struct StandingApproval {
  std::string id;
  std::string tenant_id;
  std::string agent_id;
  std::string tool;
  Json arguments_match;  // null: any arguments
  std::string created_by;
  std::string approval_id;  // the decision that granted it
  Millis created_at = 0;
  Millis expires_at = 0;
  std::optional<Millis> revoked_at;
};

// An MCP server registered for a tenant; its tools appear as mcp__{name}__{tool}.
struct McpServer {
  std::string id;
  std::string tenant_id;
  std::string name;
  std::string transport;  // stdio | http
  Json config;            // command, env, url, headers, timeout_ms (secret references, no values)
  Millis created_at = 0;
};

// A plugin registered by a tenant (docs/API.md, plugins). (tenant_id, id) is unique; the id
// comes from the manifest. Registering the same id again replaces it (a new version).
struct Plugin {
  std::string tenant_id;
  std::string id;
  std::string name;
  std::string version;
  std::string kind;                // builtin | lua | webhook
  Json manifest = Json::object();  // the manifest as registered
  std::string source;              // the Lua source (kind lua); empty otherwise
  Json config = Json::object();    // the tenant's settings for it (checked against its config schema)
  Millis created_at = 0;
  Millis updated_at = 0;
};

// A plugin's id and when it last changed: all a node needs to tell that the plugins it built
// for an agent are still the enabled ones.
struct PluginStamp {
  std::string id;
  Millis updated_at = 0;
};

// A plugin enabled for one agent, or for all of the tenant's agents (agent_id "*").
struct PluginEnablement {
  std::string tenant_id;
  std::string plugin_id;
  std::string agent_id;
  Millis created_at = 0;
};

// One event a webhook plugin must deliver, and how its delivery goes.
struct PluginDelivery {
  std::string id;
  std::string tenant_id;
  std::string plugin_id;
  std::string agent_id;
  std::string event_type;  // "tool.after@v1"
  Json payload = Json::object();
  std::string status = "pending";  // pending | delivered | dead
  int attempts = 0;
  Millis next_attempt_at = 0;
  int last_status = 0;  // the last HTTP status (0: no answer)
  std::string last_error;
  Millis created_at = 0;
  std::optional<Millis> delivered_at;
};

struct Agent {
  std::string id;
  std::string tenant_id;
  std::string name;
  std::string model;
  std::string instructions;
  Json tools = Json::array();
  Json config = Json::object();
  std::string status = "active";  // active | deleted
  Millis created_at = 0;
  Millis updated_at = 0;
};

struct Session {
  std::string id;
  std::string tenant_id;
  std::string agent_id;
  std::string status = "idle";  // idle | running | awaiting_approval | inactive
  std::string title;
  Millis created_at = 0;
  Millis updated_at = 0;
  std::string description;  // what the session is about, kept by introspection ("" until then)
  // The token id of whoever opened it (a schedule's session: the schedule's token); "" for a
  // session stored before this was recorded. Guests reach only the sessions they opened.
  std::string created_by;
  // Its own instructions, given when it was opened and never changed: a turn's context has them
  // after the agent's (the system messages of a Chat Completions conversation, api/openai_front).
  std::string instructions;
};

struct Message {
  std::string id;
  std::string tenant_id;
  std::string session_id;
  std::string run_id;
  std::string role;  // user | assistant | tool
  std::string content;
  std::string idempotency_key;  // empty when none was given
  Millis created_at = 0;
  // Its place in the session in commit order (1, 2, ...), given by the store when it is
  // inserted; read back only with the conversation (CompactionStore::ConversationSince).
  int64_t seq = 0;
};

struct Run {
  std::string id;
  std::string tenant_id;
  std::string session_id;
  std::string agent_id;
  std::string message_id;
  std::string status = "queued";  // queued | running | waiting_for_approval | done | failed | cancelled
  int attempt = 0;
  std::string output;
  Json error;  // null, or {"code","message"}
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  std::string lease_owner;
  Millis lease_expires_at = 0;
  bool cancel_requested = false;
  Millis created_at = 0;
  std::optional<Millis> started_at;
  std::optional<Millis> finished_at;
  std::string requested_by;          // token id of the caller who posted the message
  std::string caller_role = "owner";  // that caller's role: owner | user | guest
  // Whom the run acts for beside its token, so that what it makes stays bounded by them: the
  // user and channel of the chat message it answers, a webhook's channel, or a schedule's when
  // a slot posted it; "" for none.
  std::string user_id;
  std::string channel_id;

  bool Terminal() const { return status == "done" || status == "failed" || status == "cancelled"; }
};

// One recorded step of a run: a model response or a tool call. (run_id, seq) is unique.
struct Step {
  std::string id;
  std::string tenant_id;
  std::string run_id;
  int seq = 0;
  std::string kind;    // model | tool
  std::string status;  // model: succeeded | failed; tool: the tool call's status
  Json input = Json::object();
  Json output = Json::object();
  Millis started_at = 0;
  std::optional<Millis> finished_at;
};

// The effect journal's entry for one tool call. (run_id, call_id) is unique.
struct ToolCall {
  std::string id;
  std::string tenant_id;
  std::string run_id;
  std::string step_id;
  std::string call_id;  // the model's id for the call
  std::string tool;
  Json arguments = Json::object();
  std::string effect_class;  // pure | idempotent | once
  std::string effect_key;
  // proposed | denied | awaiting_approval | approved | rejected | started | succeeded | failed | unknown
  std::string status;
  Json result;
  Millis created_at = 0;
  Millis updated_at = 0;
};

struct Event {
  int64_t position = 0;  // the tenant's: 1, 2, 3, ... in commit order (a stream cursor)
  std::string id;
  std::string tenant_id;
  std::string type;  // "run.started@v1"
  std::string origin;
  int64_t origin_seq = 0;  // 1, 2, 3, ... per (tenant, origin)
  std::string agent_id;
  std::string session_id;
  std::string run_id;
  Json payload = Json::object();
  Millis occurred_at = 0;
};

// A node of the cluster as the fleet sees it (GET /v1/nodes).
struct NodeInfo {
  std::string origin;
  std::string address;  // where it serves HTTP
  Millis started_at = 0;
  Millis seen_at = 0;  // its last report
  int64_t runs_executing = 0;
  int64_t runs_finished = 0;  // since it started: done, failed or cancelled
  bool leader = false;
};

// Which runs ListRuns lists: each non-empty field narrows the list.
struct RunFilter {
  std::string session_id;
  std::string agent_id;
  std::string status;
  // Only the runs of sessions this token opened (a guest's view; "" = every session).
  std::string opened_by;
};

// A page request: items after `cursor` (opaque; empty = from the start), at most `limit`.
struct Page {
  std::string cursor;
  int limit = 50;
  // The newest first (ids descending; the cursor goes on to older ones). ListRuns,
  // ListSessions and ListApprovals only.
  bool newest_first = false;
};

template <typename T>
struct Paged {
  std::vector<T> items;
  std::string next_cursor;  // empty when there are no more
};

}  // namespace keel::store

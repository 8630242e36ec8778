#pragma once
// The client commands of the `keel` CLI, one function per command. main.cc parses the command
// line into the structs below and calls one of these; each talks to the server through the HTTP
// API (/work/shared/API.md), prints human output (or the raw JSON with --json) and returns the
// process exit code.
//
// Errors are reported here, on stderr, so every command returns an ExitCode and main() only
// passes it on.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/client.h"
#include "keel/common/status.h"

namespace keel::cli {

// Exit codes scripts can rely on.
enum ExitCode : int {
  kExitOk = 0,
  kExitServerError = 1,      // the server answered with an error, or the run failed
  kExitUsage = 2,            // bad command line
  kExitCannotConnect = 3,    // no server at the URL
  kExitUnauthenticated = 4,  // missing or rejected token
  kExitTimedOut = 5,         // the run had not finished when --wait ran out
};

// The global options as given on the command line; empty means "use the default".
struct GlobalOptions {
  std::string url;
  std::string token;
  std::string home;
  bool json = false;
  std::string field;  // --field: print only this dotted path of the JSON answer
};

// What every command runs with: the client for the resolved URL and token, and the output mode.
struct Context {
  HttpClient client;
  bool json = false;
  std::string field;                  // non-empty: PrintJson prints only this path
  mutable bool field_missing = false;  // set when the answer lacked it (the exit code says so)
};

// Resolves the defaults: --home from KEEL_HOME, else ~/.local/share/keel; --url from KEEL_URL,
// else $home/listen.addr, else http://127.0.0.1:7878; --token from KEEL_TOKEN, else
// $home/owner.token. kInvalidArgument for a URL the client cannot use.
Result<Context> MakeContext(const GlobalOptions& options);

struct AgentCreateArgs {
  std::string name;
  std::string model = "local";
  std::string instructions;
  std::vector<std::string> tools;
  std::string config_json;  // empty: none
};

// What `keel agent update` changes: only the fields given (`set`), as PATCH /v1/agents/{id}.
struct AgentUpdateArgs {
  std::string agent;  // id or name
  std::optional<std::string> name, model, instructions, config_json;
  std::optional<std::vector<std::string>> tools;  // replaces the list (empty: no tools)
};

struct SendArgs {
  std::string agent;  // id or name
  std::string text;
  std::string session_id;  // empty: create a session
  bool no_stream = false;
  int wait_seconds = 300;
};

struct ChatArgs {
  std::string agent;
  std::string session_id;
  int wait_seconds = 300;
};

// A list shown newest first: one page of `limit`, from `cursor` (a page's next_cursor), or
// every item with `all`.
struct PageArgs {
  int limit = 50;
  std::string cursor;
  bool all = false;
};

struct RunsListArgs {
  std::string session_id;  // empty: the tenant's recent runs
  std::string agent;       // an agent's name or id: only its runs
  std::string status;      // only runs in this status
  PageArgs page;
};

struct EventsArgs {
  int64_t after = 0;
  int limit = 50;
  bool follow = false;
};

int AgentCreate(Context& ctx, const AgentCreateArgs& args);
int AgentUpdate(Context& ctx, const AgentUpdateArgs& args);
int AgentList(Context& ctx);
int AgentShow(Context& ctx, const std::string& agent);
int AgentDelete(Context& ctx, const std::string& agent);

int Send(Context& ctx, const SendArgs& args);
int Chat(Context& ctx, const ChatArgs& args);

int RunsList(Context& ctx, const RunsListArgs& args);
int SessionsList(Context& ctx, const std::string& agent, const PageArgs& page);
int RunsShow(Context& ctx, const std::string& run_id);
int RunsCancel(Context& ctx, const std::string& run_id);

int SessionsShow(Context& ctx, const std::string& session_id);

int TokensCreate(Context& ctx, const std::string& name, const std::string& role);
int TokensList(Context& ctx);
int TokensRevoke(Context& ctx, const std::string& token_id);
// `value` absent: read from standard input (one trailing newline removed).
int SecretsSet(Context& ctx, const std::string& name, const std::optional<std::string>& value);
int SecretsList(Context& ctx);
int SecretsDelete(Context& ctx, const std::string& name);

struct ApprovalDecisionArgs {
  std::string id;
  std::string reason;
  std::string arguments_json;  // approve: amended arguments (a JSON object); empty: as proposed
  int64_t standing_seconds = 0;  // approve: > 0 grants a standing approval for this long
  bool standing_given = false;   // --standing appeared (so 0 is an error, not "none")
  std::string match_json;        // with a standing approval: arguments later calls must match
};
int ApprovalsList(Context& ctx, const std::string& status);
int ApprovalsShow(Context& ctx, const std::string& id);
int ApprovalsDecide(Context& ctx, const ApprovalDecisionArgs& args, bool approve);

// `agent` empty: the tenant policy; otherwise an agent id or name (its narrowing).
int PolicyShow(Context& ctx, const std::string& agent);
// Reads the document from `file` ("-": standard input).
int PolicySet(Context& ctx, const std::string& agent, const std::string& file);
int PolicyRemove(Context& ctx, const std::string& agent);

// `agent` empty: tenant-wide.
int StopEngage(Context& ctx, const std::string& agent, const std::string& reason);
int StopLift(Context& ctx, const std::string& agent);
int StopList(Context& ctx);

struct McpAddArgs {
  std::string name;
  std::vector<std::string> command;  // stdio: program and arguments
  std::string url;                   // http: the endpoint
  std::vector<std::string> env;      // NAME=value or NAME=secret:SECRET
  std::vector<std::string> headers;  // Name=value or Name=secret:SECRET
};
int McpAdd(Context& ctx, const McpAddArgs& args);
int McpList(Context& ctx);
// `server`: id or name.
int McpRemove(Context& ctx, const std::string& server);

struct PluginRegisterArgs {
  std::string dir;          // holds manifest.json, and plugin.lua for kind lua
  std::string config_file;  // empty: DIR/config.json when it exists, else no config
};
int PluginsList(Context& ctx);
int PluginsShow(Context& ctx, const std::string& id);
int PluginsRegister(Context& ctx, const PluginRegisterArgs& args);
// For one agent (`agent`: id or name) or, with `all`, for every agent ("*"); exactly one of them.
int PluginsEnable(Context& ctx, const std::string& id, const std::string& agent, bool all,
                  bool enable);
int PluginsDelete(Context& ctx, const std::string& id);
// `status` empty: every delivery.
int PluginsDeliveries(Context& ctx, const std::string& id, const std::string& status);
int PluginsReplay(Context& ctx, const std::string& id, const std::string& delivery_id);

// Skills: DIR holds SKILL.md and the skill's other files.
int SkillsRegister(Context& ctx, const std::string& dir);
int SkillsList(Context& ctx);
int SkillsShow(Context& ctx, const std::string& name);
int SkillsRemove(Context& ctx, const std::string& name);
// `agent`: id or name; `assign` false unassigns.
int SkillsAssign(Context& ctx, const std::string& agent, const std::string& name, bool assign);

// Memories: `agent` is an id or name.
struct MemorySearchArgs {
  std::string agent;
  std::string query;
  std::string tag;  // empty: any
  int limit = 10;
};
struct MemoryAddArgs {
  std::string agent;
  std::string text;
  std::vector<std::string> tags;
  std::string source;  // empty: the server's default (api)
  std::string id;      // empty: a new memory; otherwise the one to replace
};
int MemorySearch(Context& ctx, const MemorySearchArgs& args);
int MemoryAdd(Context& ctx, const MemoryAddArgs& args);
int MemoryRemove(Context& ctx, const std::string& agent, const std::string& id);
// `tag` empty: every memory.
int MemoryList(Context& ctx, const std::string& agent, const std::string& tag);

struct ScheduleAddArgs {
  std::string agent;  // id or name
  std::string cron;
  std::string at;     // RFC 3339, or relative: +90s, +5m, +2h, +1d
  std::string timezone;
  std::string session_id;
  std::string missed;
  std::string name;
  std::string prompt;
};
int ScheduleAdd(Context& ctx, const ScheduleAddArgs& args);
// `agent` empty: every agent's.
int ScheduleList(Context& ctx, const std::string& agent);
int ScheduleShow(Context& ctx, const std::string& id);
int ScheduleRemove(Context& ctx, const std::string& id);
int ScheduleSetEnabled(Context& ctx, const std::string& id, bool enabled);
// Hands a schedule (a suspended one: its token was revoked) to another token. Owners only.
int ScheduleReassign(Context& ctx, const std::string& id, const std::string& token_id);

// Usage and budgets (GET /v1/usage, PUT/GET/DELETE /v1/budgets). A budget's scope on the
// command line is "tenant" or "agent:ID|NAME".
struct UsageArgs {
  std::string agent;  // id or name; empty: the tenant and every agent
  std::string period = "day";
};
int Usage(Context& ctx, const UsageArgs& args);
struct BudgetSetArgs {
  std::string scope;
  std::string period;
  double limit_usd = 0;
};
int BudgetSet(Context& ctx, const BudgetSetArgs& args);
int BudgetList(Context& ctx);
int BudgetRemove(Context& ctx, const std::string& scope, const std::string& period);

// Channels (/v1/agents/{id}/channels, /v1/channels/{id}): today webhook channels.
struct ChannelAddArgs {
  std::string agent;  // id or name
  std::string name;
  std::string kind = "webhook";  // webhook | telegram
  std::string secret;            // webhook: the signing secret's name
  std::string bot_token;         // telegram: the bot token secret's name
  std::string api_base;          // telegram, slack, discord: empty for the platform's own
  std::string application_id;    // discord
  std::string public_key;        // discord
  std::string command;           // discord: empty for "ask"
  std::string message_template;  // empty: the server's default
  std::string conversation;
  std::string role;  // empty: guest
};
int ChannelAdd(Context& ctx, const ChannelAddArgs& args);
int ChannelList(Context& ctx, const std::string& agent);
int ChannelShow(Context& ctx, const std::string& id);
int ChannelSetEnabled(Context& ctx, const std::string& id, bool enabled);
int ChannelRemove(Context& ctx, const std::string& id);
int ChannelReplies(Context& ctx, const std::string& id);

// Users (/v1/users) and their identities ("PLATFORM:ID", e.g. telegram:123456789); an agent's
// members (/v1/agents/{id}/members) and access level (/v1/agents/{id}/access).
int UserList(Context& ctx);
int UserAdd(Context& ctx, const std::string& name, const std::vector<std::string>& identities);
int UserShow(Context& ctx, const std::string& id);
int UserLink(Context& ctx, const std::string& id, const std::string& identity, bool link);
int UserMerge(Context& ctx, const std::string& into, const std::string& from);
int MemberList(Context& ctx, const std::string& agent);
int MemberSet(Context& ctx, const std::string& agent, const std::string& user,
              const std::string& role);
int MemberRemove(Context& ctx, const std::string& agent, const std::string& user);
// `level` "" and `guest_daily_tokens` < 0 show the access; else what is given changes (`code` ""
// keeps the code unless `new_code`; `level` "" keeps the level).
int AccessSet(Context& ctx, const std::string& agent, const std::string& level,
              const std::string& code, bool new_code, int64_t guest_daily_tokens);

int TenantsCreate(Context& ctx, const std::string& name);
int TenantsList(Context& ctx);

int Events(Context& ctx, const EventsArgs& args);

int Health(Context& ctx);

}  // namespace keel::cli

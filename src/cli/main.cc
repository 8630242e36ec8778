// The `keel` executable: `keel serve` runs the server; every other command is a client of its
// HTTP API (cli/commands.h). This file only maps the command line onto those functions.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/store_commands.h"
#include "server/serve.h"

namespace keel::cli {
namespace {

std::optional<std::string> NonEmpty(const std::string& s) {
  return s.empty() ? std::nullopt : std::optional<std::string>(s);
}

// The edit distance of two short words (insertions, deletions, substitutions).
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// When a command that takes a subcommand got a word that names none ("keel agent lst"): the
// message naming the word, the nearest commands and all of them; "" otherwise.
std::string UnknownCommand(CLI::App& app, int argc, char** argv) {
  CLI::App* cur = &app;
  std::string path = "keel";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("-", 0) == 0) {
      // An option: skip its value when it takes one and it is not given with '='.
      const CLI::Option* opt = cur->get_option_no_throw(arg.substr(0, arg.find('=')));
      if (opt && arg.find('=') == std::string::npos && opt->get_expected_min() > 0) ++i;
      continue;
    }
    std::vector<CLI::App*> subs = cur->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return "";
    CLI::App* next = nullptr;
    for (CLI::App* sub : subs) {
      if (sub->check_name(arg)) next = sub;
    }
    if (next) {
      cur = next;
      path += " " + next->get_name();
      continue;
    }
    std::vector<std::string> names, near;
    for (CLI::App* sub : subs) {
      names.push_back(sub->get_name());
      const std::string& n = names.back();
      if (Distance(arg, n) <= 2 || (arg.size() >= 3 && n.rfind(arg, 0) == 0)) near.push_back(n);
    }
    std::string out = path + ": unknown command '" + arg + "'";
    if (!near.empty()) {
      out += "; did you mean";
      for (size_t k = 0; k < near.size(); ++k) out += (k ? ", '" : " '") + near[k] + "'";
      out += "?";
    }
    out += "\nThe commands of " + path + ":";
    for (const auto& n : names) out += " " + n;
    return out + "\n(" + path + " --help describes them)\n";
  }
  return "";
}

int Main(int argc, char** argv) {
  CLI::App app{"Keel: a durable runtime for AI agents.", "keel"};
  // Global options may also follow a subcommand: `keel agent list --json`.
  app.fallthrough();
  app.require_subcommand(1);

  GlobalOptions global;
  app.add_option("--url", global.url,
                 "Server URL (default: $KEEL_URL, else $KEEL_HOME/listen.addr, else "
                 "http://127.0.0.1:7878)");
  app.add_option("--token", global.token,
                 "Bearer token (default: $KEEL_TOKEN, else $KEEL_HOME/owner.token)");
  app.add_option("--home", global.home,
                 "Data directory (default: $KEEL_HOME, else ~/.local/share/keel)");
  app.add_flag("--json", global.json, "Print the raw JSON instead of human output");
  app.add_option("--field", global.field,
                 "Print only this field of the JSON answer: a dotted path such as id, items.0.id "
                 "or items.-1.id (the last item); strings print bare, for $(...) in scripts");

  // The chosen client command, set by its subcommand's callback once parsing succeeded.
  std::function<int(Context&)> action;
  auto on_parse = [&action](CLI::App* command, std::function<int(Context&)> run) {
    command->callback([&action, run = std::move(run)] { action = run; });
  };

  // keel serve
  bool serving = false;
  std::string serve_home, serve_config, serve_listen, serve_store;
  bool serve_demo = false;
  CLI::App* serve = app.add_subcommand("serve", "Run the Keel server");
  serve->add_option("--home", serve_home, "Data directory (default: $KEEL_HOME)");
  serve->add_option("--config", serve_config, "Configuration file (keel.toml)");
  serve->add_option("--listen", serve_listen,
                    "Address to bind, HOST:PORT (default 127.0.0.1:7878)");
  serve->add_option("--store", serve_store, "Store URL: sqlite:///path/keel.db or postgres://...");
  serve->add_flag("--demo", serve_demo, "Create a demo agent");
  bool serve_print_routes = false;
  serve->add_flag("--print-routes", serve_print_routes,
                  "Print the HTTP routes (METHOD PATTERN auth|public) and exit");
  serve->callback([&serving] { serving = true; });

  // keel agent ...
  CLI::App* agent = app.add_subcommand("agent", "Create, list, show and delete agents");
  agent->require_subcommand(1);
  AgentCreateArgs create_args;
  CLI::App* agent_create = agent->add_subcommand("create", "Create an agent");
  agent_create->add_option("name", create_args.name, "Agent name, unique per tenant")->required();
  agent_create->add_option("--model", create_args.model, "local or PROVIDER/MODEL")
      ->capture_default_str();
  agent_create->add_option("--instructions", create_args.instructions, "System instructions");
  agent_create->add_option("--tool", create_args.tools, "A tool the agent may use (repeatable)")
      ->allow_extra_args(false)
      ->delimiter(',');
  agent_create->add_option("--config", create_args.config_json, "Agent config as a JSON object");
  on_parse(agent_create, [&](Context& c) { return AgentCreate(c, create_args); });

  AgentUpdateArgs update_args;
  std::string update_name, update_model, update_instructions, update_config;
  std::vector<std::string> update_tools;
  bool update_no_tools = false;
  CLI::App* agent_update =
      agent->add_subcommand("update", "Change an agent: only the fields given change");
  agent_update->add_option("agent", update_args.agent, "Agent id or name")->required();
  auto* o_name = agent_update->add_option("--name", update_name, "A new name");
  auto* o_model = agent_update->add_option("--model", update_model, "local or PROVIDER/MODEL");
  auto* o_instructions =
      agent_update->add_option("--instructions", update_instructions, "System instructions");
  auto* o_tools = agent_update
                      ->add_option("--tool", update_tools,
                                   "The tools it may use, replacing the list (repeatable)")
                      ->allow_extra_args(false)
                      ->delimiter(',');
  agent_update->add_flag("--no-tools", update_no_tools, "No tools at all")->excludes(o_tools);
  auto* o_config = agent_update->add_option("--config", update_config,
                                            "Its config as a JSON object, replacing it whole");
  on_parse(agent_update, [&](Context& c) {
    if (o_name->count()) update_args.name = update_name;
    if (o_model->count()) update_args.model = update_model;
    if (o_instructions->count()) update_args.instructions = update_instructions;
    if (o_tools->count()) update_args.tools = update_tools;
    if (update_no_tools) update_args.tools = std::vector<std::string>{};
    if (o_config->count()) update_args.config_json = update_config;
    return AgentUpdate(c, update_args);
  });

  on_parse(agent->add_subcommand("list", "List agents"), [](Context& c) { return AgentList(c); });

  std::string agent_ref;
  CLI::App* agent_show = agent->add_subcommand("show", "Show an agent");
  agent_show->add_option("agent", agent_ref, "Agent id or name")->required();
  on_parse(agent_show, [&](Context& c) { return AgentShow(c, agent_ref); });
  CLI::App* agent_delete = agent->add_subcommand("delete", "Delete an agent");
  agent_delete->add_option("agent", agent_ref, "Agent id or name")->required();
  on_parse(agent_delete, [&](Context& c) { return AgentDelete(c, agent_ref); });

  // keel agent members ..., keel agent access ...
  CLI::App* members = agent->add_subcommand(
      "members", "List, set and remove the users who have a role on an agent");
  members->require_subcommand(1);
  std::string member_user, member_role;
  CLI::App* members_list = members->add_subcommand("list", "List an agent's members and roles");
  members_list->add_option("agent", agent_ref, "Agent id or name")->required();
  on_parse(members_list, [&](Context& c) { return MemberList(c, agent_ref); });
  CLI::App* members_set = members->add_subcommand(
      "set", "Give a user a role on an agent (owners): add, promote or demote");
  members_set->add_option("agent", agent_ref, "Agent id or name")->required();
  members_set->add_option("user", member_user, "User id (keel users list)")->required();
  members_set->add_option("role", member_role, "owner, user or guest")
      ->required()
      ->check(CLI::IsMember({"owner", "user", "guest"}));
  on_parse(members_set,
           [&](Context& c) { return MemberSet(c, agent_ref, member_user, member_role); });
  CLI::App* members_rm = members->add_subcommand("rm", "Take a user's role on an agent away");
  members_rm->add_option("agent", agent_ref, "Agent id or name")->required();
  members_rm->add_option("user", member_user, "User id")->required();
  on_parse(members_rm, [&](Context& c) { return MemberRemove(c, agent_ref, member_user); });
  std::string access_level, access_code;
  bool access_new_code = false;
  int64_t access_allowance = -1;
  CLI::App* access_cmd = agent->add_subcommand(
      "access",
      "Show or set who may talk to an agent from a chat platform: public (anyone, as a guest), "
      "protected (whoever sends its access code first) or private (members only, the default)");
  access_cmd->add_option("agent", agent_ref, "Agent id or name")->required();
  access_cmd->add_option("level", access_level, "public, protected or private")
      ->check(CLI::IsMember({"public", "protected", "private"}));
  auto* o_code = access_cmd->add_option("--code", access_code,
                                        "protected: the access code (8 to 128 characters)");
  access_cmd->add_flag("--new-code", access_new_code, "protected: make a new access code")
      ->excludes(o_code);
  access_cmd
      ->add_option("--guest-daily-tokens", access_allowance,
                   "Model tokens a guest's messages may cost a day (0: no allowance; default "
                   "200000)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000'000'000}));
  on_parse(access_cmd, [&](Context& c) {
    return AccessSet(c, agent_ref, access_level, access_code, access_new_code, access_allowance);
  });

  // keel send
  SendArgs send_args;
  CLI::App* send = app.add_subcommand("send", "Send one message to an agent and print the answer");
  // AGENT TEXT, or only TEXT with --session (which then fills `agent`: moved below).
  send->add_option("agent", send_args.agent, "Agent id or name (not needed with --session)");
  send->add_option("text", send_args.text, "The message");
  send->add_option("--session", send_args.session_id, "Continue this session (default: a new one)");
  send->add_flag("--no-stream", send_args.no_stream, "Wait for the run instead of streaming it");
  send->add_option("--wait", send_args.wait_seconds, "Seconds to wait for the run")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  on_parse(send, [&](Context& c) -> int {
    if (send_args.text.empty() && !send_args.session_id.empty()) {
      send_args.text = std::move(send_args.agent);  // keel send --session ID TEXT
      send_args.agent.clear();
    }
    if (send_args.text.empty()) {
      std::cerr << "keel send: give the agent and the message (keel send AGENT TEXT), or the "
                   "session and the message (keel send --session ID TEXT)\n";
      return kExitUsage;
    }
    return Send(c, send_args);
  });

  // keel chat
  ChatArgs chat_args;
  CLI::App* chat = app.add_subcommand("chat", "Chat with an agent; /exit or end of input ends it");
  chat->add_option("agent", chat_args.agent, "Agent id or name (not needed with --session)");
  chat->add_option("--session", chat_args.session_id, "Continue this session (default: a new one)");
  chat->add_option("--wait", chat_args.wait_seconds, "Seconds to wait for each run")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  on_parse(chat, [&](Context& c) -> int {
    if (chat_args.agent.empty() && chat_args.session_id.empty()) {
      std::cerr << "keel chat: name the agent (keel chat AGENT), or the session to resume "
                   "(keel chat --session ID)\n";
      return kExitUsage;
    }
    return Chat(c, chat_args);
  });

  // keel runs ...
  CLI::App* runs = app.add_subcommand("runs", "List, show and cancel runs");
  runs->require_subcommand(1);
  RunsListArgs runs_args;
  // The options of a list shown newest first (PageArgs).
  auto page_options = [](CLI::App* list, PageArgs& page, const std::string& what) {
    list->add_option("--limit", page.limit, "At most this many " + what + ", the newest")
        ->capture_default_str()
        ->check(CLI::Range(1, 500));
    list->add_option("--cursor", page.cursor,
                     "Go on from an earlier page (its next_cursor, which the hint shows)");
    list->add_flag("--all", page.all, "All of them, newest first");
  };
  CLI::App* runs_list = runs->add_subcommand("list", "List runs, the newest first");
  runs_list->add_option("--session", runs_args.session_id, "Only the runs of this session");
  runs_list->add_option("--agent", runs_args.agent, "Only the runs of this agent (name or id)");
  runs_list->add_option("--status", runs_args.status, "Only the runs in this status")
      ->check(CLI::IsMember(
          {"queued", "running", "waiting_for_approval", "done", "failed", "cancelled"}));
  page_options(runs_list, runs_args.page, "runs");
  on_parse(runs_list, [&](Context& c) { return RunsList(c, runs_args); });
  std::string run_id;
  CLI::App* runs_show = runs->add_subcommand("show", "Show a run and its steps");
  runs_show->add_option("run", run_id, "Run id")->required();
  on_parse(runs_show, [&](Context& c) { return RunsShow(c, run_id); });
  CLI::App* runs_cancel = runs->add_subcommand("cancel", "Cancel a run");
  runs_cancel->add_option("run", run_id, "Run id")->required();
  on_parse(runs_cancel, [&](Context& c) { return RunsCancel(c, run_id); });

  // keel sessions ...
  CLI::App* sessions = app.add_subcommand("sessions", "List and show sessions");
  sessions->require_subcommand(1);
  std::string sessions_ref;
  PageArgs sessions_page;
  CLI::App* sessions_list =
      sessions->add_subcommand("list", "List an agent's sessions, the newest first");
  sessions_list->add_option("agent", sessions_ref, "Agent id or name")->required();
  page_options(sessions_list, sessions_page, "sessions");
  on_parse(sessions_list, [&](Context& c) { return SessionsList(c, sessions_ref, sessions_page); });
  CLI::App* sessions_show = sessions->add_subcommand("show", "Show a session and its messages");
  sessions_show->add_option("session", sessions_ref, "Session id")->required();
  on_parse(sessions_show, [&](Context& c) { return SessionsShow(c, sessions_ref); });

  // keel tokens ...
  CLI::App* tokens = app.add_subcommand("tokens", "Create, list and revoke API tokens");
  tokens->require_subcommand(1);
  std::string token_name, token_role = "user", token_id;
  CLI::App* tokens_create = tokens->add_subcommand("create", "Create a token; prints its secret");
  tokens_create->add_option("name", token_name, "Token name")->required();
  tokens_create->add_option("--role", token_role,
                            "owner, user, or guest (guests' runs may only use read tools)")
      ->capture_default_str()
      ->check(CLI::IsMember({"owner", "user", "guest"}));
  on_parse(tokens_create, [&](Context& c) { return TokensCreate(c, token_name, token_role); });
  on_parse(tokens->add_subcommand("list", "List tokens"), [](Context& c) { return TokensList(c); });
  CLI::App* tokens_revoke = tokens->add_subcommand("revoke", "Revoke a token");
  tokens_revoke->add_option("id", token_id, "Token id")->required();
  on_parse(tokens_revoke, [&](Context& c) { return TokensRevoke(c, token_id); });

  // keel secrets ...
  CLI::App* secrets = app.add_subcommand("secrets", "Set, list and delete secrets (owners)");
  secrets->require_subcommand(1);
  std::string secret_name;
  std::optional<std::string> secret_value;
  CLI::App* secrets_set = secrets->add_subcommand(
      "set", "Set a secret; the value is read from standard input unless --value is given");
  secrets_set->add_option("name", secret_name, "Secret name")->required();
  secrets_set->add_option("--value", secret_value,
                          "The value (visible in the process list and shell history; prefer "
                          "standard input)");
  on_parse(secrets_set, [&](Context& c) { return SecretsSet(c, secret_name, secret_value); });
  on_parse(secrets->add_subcommand("list", "List secret names (never values)"),
           [](Context& c) { return SecretsList(c); });
  CLI::App* secrets_rm = secrets->add_subcommand("rm", "Delete a secret");
  secrets_rm->add_option("name", secret_name, "Secret name")->required();
  on_parse(secrets_rm, [&](Context& c) { return SecretsDelete(c, secret_name); });

  // keel approvals ...
  CLI::App* approvals = app.add_subcommand("approvals", "List, show, approve and reject tool calls "
                                                        "that wait for a human");
  approvals->require_subcommand(1);
  std::string approvals_status;
  ApprovalDecisionArgs decision;
  CLI::App* approvals_list = approvals->add_subcommand("list", "List approvals");
  approvals_list->add_option("--status", approvals_status, "pending, approved, rejected, "
                                                          "expired or cancelled (default: all)");
  on_parse(approvals_list, [&](Context& c) { return ApprovalsList(c, approvals_status); });
  CLI::App* approvals_show = approvals->add_subcommand("show", "Show one approval");
  approvals_show->add_option("id", decision.id, "Approval id")->required();
  on_parse(approvals_show, [&](Context& c) { return ApprovalsShow(c, decision.id); });
  CLI::App* approvals_approve =
      approvals->add_subcommand("approve", "Approve a call; its run goes on (owners)");
  approvals_approve->add_option("id", decision.id, "Approval id")->required();
  approvals_approve->add_option("--reason", decision.reason, "Why (kept with the decision)");
  approvals_approve->add_option("--arguments", decision.arguments_json,
                                "Amended arguments, a JSON object (the original is kept)");
  approvals_approve
      ->add_option("--standing", decision.standing_seconds,
                   "Also approve later calls of this tool by this agent for SECONDS")
      ->each([&](const std::string&) { decision.standing_given = true; });
  approvals_approve->add_option("--match", decision.match_json,
                                "With --standing: only calls whose arguments contain this JSON "
                                "object's members");
  on_parse(approvals_approve, [&](Context& c) { return ApprovalsDecide(c, decision, true); });
  CLI::App* approvals_reject = approvals->add_subcommand(
      "reject", "Reject a call; the model gets the refusal as the tool's error (owners)");
  approvals_reject->add_option("id", decision.id, "Approval id")->required();
  approvals_reject->add_option("--reason", decision.reason, "Why (the model sees it)");
  on_parse(approvals_reject, [&](Context& c) { return ApprovalsDecide(c, decision, false); });

  // keel policy ...
  CLI::App* policy = app.add_subcommand(
      "policy", "Show, set and remove the tenant policy or an agent's narrowing of it");
  policy->require_subcommand(1);
  std::string policy_agent, policy_file;
  CLI::App* policy_show = policy->add_subcommand("show", "Print a policy document");
  policy_show->add_option("--agent", policy_agent, "Agent id or name (default: the tenant's)");
  on_parse(policy_show, [&](Context& c) { return PolicyShow(c, policy_agent); });
  CLI::App* policy_set = policy->add_subcommand("set", "Set a policy from a JSON file (owners)");
  policy_set->add_option("file", policy_file, "The document, or - for standard input")
      ->required();
  policy_set->add_option("--agent", policy_agent, "Agent id or name (default: the tenant's)");
  on_parse(policy_set, [&](Context& c) { return PolicySet(c, policy_agent, policy_file); });
  CLI::App* policy_rm = policy->add_subcommand("rm", "Remove a policy (owners)");
  policy_rm->add_option("--agent", policy_agent, "Agent id or name (default: the tenant's)");
  on_parse(policy_rm, [&](Context& c) { return PolicyRemove(c, policy_agent); });

  // keel emergency-stop ...
  CLI::App* estop = app.add_subcommand(
      "emergency-stop", "Halt an agent's (or every agent's) runs and refuse every tool call");
  estop->require_subcommand(1);
  std::string estop_agent, estop_reason;
  CLI::App* estop_on = estop->add_subcommand("on", "Engage a stop (owners)");
  estop_on->add_option("--agent", estop_agent, "Agent id or name (default: the whole tenant)");
  estop_on->add_option("--reason", estop_reason, "Why");
  on_parse(estop_on, [&](Context& c) { return StopEngage(c, estop_agent, estop_reason); });
  CLI::App* estop_off = estop->add_subcommand("off", "Lift a stop (owners)");
  estop_off->add_option("--agent", estop_agent, "Agent id or name (default: the whole tenant)");
  on_parse(estop_off, [&](Context& c) { return StopLift(c, estop_agent); });
  on_parse(estop->add_subcommand("list", "List the stops in force"),
           [](Context& c) { return StopList(c); });

  // keel mcp ...
  CLI::App* mcp = app.add_subcommand("mcp", "Register, list and remove MCP servers (tool providers)");
  mcp->require_subcommand(1);
  McpAddArgs mcp_add;
  std::string mcp_server;
  CLI::App* mcp_add_cmd = mcp->add_subcommand(
      "add", "Register an MCP server: NAME -- PROGRAM ARGS... (stdio), or NAME --url URL (http)");
  mcp_add_cmd->add_option("name", mcp_add.name, "Server name (tools become mcp__NAME__TOOL)")
      ->required();
  mcp_add_cmd->add_option("command", mcp_add.command, "stdio: the program and its arguments");
  mcp_add_cmd->add_option("--url", mcp_add.url, "http: the server's MCP endpoint");
  mcp_add_cmd->add_option("--env", mcp_add.env, "stdio: NAME=value or NAME=secret:SECRET");
  mcp_add_cmd->add_option("--header", mcp_add.headers, "http: Name=value or Name=secret:SECRET");
  on_parse(mcp_add_cmd, [&](Context& c) { return McpAdd(c, mcp_add); });
  on_parse(mcp->add_subcommand("list", "List MCP servers"), [](Context& c) { return McpList(c); });
  CLI::App* mcp_rm = mcp->add_subcommand("rm", "Remove an MCP server");
  mcp_rm->add_option("server", mcp_server, "Server id or name")->required();
  on_parse(mcp_rm, [&](Context& c) { return McpRemove(c, mcp_server); });

  // keel plugins ...
  CLI::App* plugins = app.add_subcommand(
      "plugins", "Register, list, enable, disable and delete plugins; webhook deliveries");
  plugins->require_subcommand(1);
  PluginRegisterArgs plugin_register;
  std::string plugin_id, plugin_agent, plugin_status, plugin_delivery;
  bool plugin_all = false;
  on_parse(plugins->add_subcommand("list", "List the tenant's plugins"),
           [](Context& c) { return PluginsList(c); });
  CLI::App* plugins_show = plugins->add_subcommand("show", "Show a plugin (and a lua one's source)");
  plugins_show->add_option("id", plugin_id, "Plugin id")->required();
  on_parse(plugins_show, [&](Context& c) { return PluginsShow(c, plugin_id); });
  CLI::App* plugins_register = plugins->add_subcommand(
      "register", "Register a plugin from DIR/manifest.json (and DIR/plugin.lua for kind lua), "
                  "or replace the one with its id (owners)");
  plugins_register->add_option("dir", plugin_register.dir, "The plugin's directory")->required();
  plugins_register->add_option("--config", plugin_register.config_file,
                               "The plugin's config, a JSON object (default: DIR/config.json "
                               "when it exists)");
  on_parse(plugins_register, [&](Context& c) { return PluginsRegister(c, plugin_register); });
  for (bool enable : {true, false}) {
    CLI::App* cmd = plugins->add_subcommand(
        enable ? "enable" : "disable",
        std::string(enable ? "Enable" : "Disable") +
            " a plugin for an agent or for all agents; agents see the change at their next "
            "turn (owners)");
    cmd->add_option("id", plugin_id, "Plugin id")->required();
    CLI::Option* agent_opt = cmd->add_option("--agent", plugin_agent, "Agent id or name");
    cmd->add_flag("--all", plugin_all,
                  enable ? "Every agent of the tenant, present and future"
                         : "The enablement for all agents (not the per-agent ones)")
        ->excludes(agent_opt);
    on_parse(cmd, [&, enable](Context& c) {
      return PluginsEnable(c, plugin_id, plugin_agent, plugin_all, enable);
    });
  }
  CLI::App* plugins_delete =
      plugins->add_subcommand("delete", "Delete a plugin, its enablements and deliveries (owners)");
  plugins_delete->add_option("id", plugin_id, "Plugin id")->required();
  on_parse(plugins_delete, [&](Context& c) { return PluginsDelete(c, plugin_id); });
  CLI::App* plugins_deliveries = plugins->add_subcommand(
      "deliveries", "List a webhook plugin's deliveries, newest first");
  plugins_deliveries->add_option("id", plugin_id, "Plugin id")->required();
  plugins_deliveries->add_option("--status", plugin_status, "pending, delivered or dead "
                                                            "(default: all)")
      ->check(CLI::IsMember({"pending", "delivered", "dead"}));
  on_parse(plugins_deliveries,
           [&](Context& c) { return PluginsDeliveries(c, plugin_id, plugin_status); });
  CLI::App* plugins_replay = plugins->add_subcommand(
      "replay", "Send a delivery again (a dead one, or a delivered one on purpose) (owners)");
  plugins_replay->add_option("id", plugin_id, "Plugin id")->required();
  plugins_replay->add_option("delivery", plugin_delivery, "Delivery id")->required();
  on_parse(plugins_replay,
           [&](Context& c) { return PluginsReplay(c, plugin_id, plugin_delivery); });

  // keel skills ...
  CLI::App* skills = app.add_subcommand("skills", "Register, list, show, delete and assign skills");
  skills->require_subcommand(1);
  std::string skill_dir, skill_name, skill_agent;
  CLI::App* skills_register = skills->add_subcommand(
      "register", "Register a skill from DIR (SKILL.md and its other files), or replace the one "
                  "of its name (owners)");
  skills_register->add_option("dir", skill_dir, "The skill's directory")->required();
  on_parse(skills_register, [&](Context& c) { return SkillsRegister(c, skill_dir); });
  on_parse(skills->add_subcommand("list", "List the tenant's skills"),
           [](Context& c) { return SkillsList(c); });
  CLI::App* skills_show = skills->add_subcommand("show", "Show a skill, its files and SKILL.md");
  skills_show->add_option("name", skill_name, "Skill name")->required();
  on_parse(skills_show, [&](Context& c) { return SkillsShow(c, skill_name); });
  CLI::App* skills_rm = skills->add_subcommand("rm", "Delete a skill and its assignments (owners)");
  skills_rm->add_option("name", skill_name, "Skill name")->required();
  on_parse(skills_rm, [&](Context& c) { return SkillsRemove(c, skill_name); });
  for (bool assign : {true, false}) {
    CLI::App* cmd = skills->add_subcommand(
        assign ? "assign" : "unassign",
        std::string(assign ? "Assign a skill to" : "Unassign a skill from") +
            " an agent; the agent sees the change at its next turn (owners)");
    cmd->add_option("agent", skill_agent, "Agent id or name")->required();
    cmd->add_option("name", skill_name, "Skill name")->required();
    on_parse(cmd, [&, assign](Context& c) {
      return SkillsAssign(c, skill_agent, skill_name, assign);
    });
  }

  // keel memory ...
  CLI::App* memory =
      app.add_subcommand("memory", "Search, add, list and remove an agent's memories");
  memory->require_subcommand(1);
  MemorySearchArgs memory_search;
  MemoryAddArgs memory_add;
  std::string memory_agent, memory_id, memory_tag;
  CLI::App* memory_search_cmd = memory->add_subcommand(
      "search", "Search an agent's memories: words, \"a phrase\", a OR b, -word, prefix*");
  memory_search_cmd->add_option("agent", memory_search.agent, "Agent id or name")->required();
  memory_search_cmd->add_option("query", memory_search.query, "What to look for")->required();
  memory_search_cmd->add_option("--tag", memory_search.tag, "Only memories with this tag");
  memory_search_cmd->add_option("--limit", memory_search.limit, "At most this many (1 to 100)")
      ->check(CLI::Range(1, 100));
  on_parse(memory_search_cmd, [&](Context& c) { return MemorySearch(c, memory_search); });
  CLI::App* memory_add_cmd = memory->add_subcommand(
      "add", "Add a memory to an agent (or replace one with --id) (owners and users)");
  memory_add_cmd->add_option("agent", memory_add.agent, "Agent id or name")->required();
  memory_add_cmd->add_option("text", memory_add.text, "What to remember")->required();
  memory_add_cmd->add_option("--tag", memory_add.tags, "A tag (repeat for more)");
  memory_add_cmd->add_option("--source", memory_add.source, "Who wrote it (default: api)");
  memory_add_cmd->add_option("--id", memory_add.id, "The id of the memory to replace");
  on_parse(memory_add_cmd, [&](Context& c) { return MemoryAdd(c, memory_add); });
  CLI::App* memory_rm = memory->add_subcommand("rm", "Delete one of an agent's memories");
  memory_rm->add_option("agent", memory_agent, "Agent id or name")->required();
  memory_rm->add_option("id", memory_id, "Memory id")->required();
  on_parse(memory_rm, [&](Context& c) { return MemoryRemove(c, memory_agent, memory_id); });
  CLI::App* memory_list = memory->add_subcommand("list", "List an agent's memories, newest first");
  memory_list->add_option("agent", memory_agent, "Agent id or name")->required();
  memory_list->add_option("--tag", memory_tag, "Only memories with this tag");
  on_parse(memory_list, [&](Context& c) { return MemoryList(c, memory_agent, memory_tag); });

  // keel channels ...
  CLI::App* channels = app.add_subcommand(
      "channels",
      "Add, list, show, enable, disable and remove an agent's channels (webhooks, Telegram "
      "bots), and see what a bot answered");
  channels->require_subcommand(1);
  ChannelAddArgs channel_add;
  CLI::App* channel_add_cmd = channels->add_subcommand(
      "add",
      "Add a channel (owners): a webhook (Standard Webhooks deliveries become messages), a "
      "Telegram bot (polled; its answers sent back), a Slack app (its events; answers in "
      "thread) or a Discord app (a slash command)");
  channel_add_cmd->add_option("agent", channel_add.agent, "Agent id or name")->required();
  channel_add_cmd->add_option("name", channel_add.name, "The channel's name")->required();
  channel_add_cmd
      ->add_option("--kind", channel_add.kind, "webhook (default), telegram, slack or discord")
      ->check(CLI::IsMember({"webhook", "telegram", "slack", "discord"}));
  channel_add_cmd->add_option("--secret", channel_add.secret,
                              "webhook, slack: the tenant secret holding the signing key "
                              "(a webhook's whsec_BASE64 or raw text; a Slack app's signing "
                              "secret)");
  channel_add_cmd->add_option(
      "--bot-token", channel_add.bot_token,
      "telegram, slack, discord: the tenant secret holding the bot's token");
  channel_add_cmd->add_option("--application-id", channel_add.application_id,
                              "discord: the application's id");
  channel_add_cmd->add_option("--public-key", channel_add.public_key,
                              "discord: the application's public key (64 hex characters)");
  channel_add_cmd->add_option("--command", channel_add.command,
                              "discord: the slash command that talks to the agent (default ask)");
  channel_add_cmd->add_option(
      "--api-base", channel_add.api_base,
      "telegram, slack, discord: the platform's API (default https://api.telegram.org, "
      "https://slack.com/api, https://discord.com/api/v10)");
  channel_add_cmd->add_option("--template", channel_add.message_template,
                              "The message, with {{/json/pointer}} placeholders (default {{}})");
  channel_add_cmd->add_option("--conversation", channel_add.conversation,
                              "A JSON pointer: one session per distinct value there");
  channel_add_cmd->add_option("--role", channel_add.role,
                              "The role its runs act with: guest (default) or user");
  on_parse(channel_add_cmd, [&](Context& c) { return ChannelAdd(c, channel_add); });
  std::string channel_ref;
  CLI::App* channel_list = channels->add_subcommand("list", "List an agent's channels");
  channel_list->add_option("agent", channel_ref, "Agent id or name")->required();
  on_parse(channel_list, [&](Context& c) { return ChannelList(c, channel_ref); });
  CLI::App* channel_show = channels->add_subcommand("show", "Show a channel");
  channel_show->add_option("id", channel_ref, "Channel id")->required();
  on_parse(channel_show, [&](Context& c) { return ChannelShow(c, channel_ref); });
  for (bool enable : {true, false}) {
    CLI::App* cmd = channels->add_subcommand(
        enable ? "enable" : "disable",
        enable ? "Take deliveries (or poll the bot) again"
               : "Refuse deliveries (404), or stop polling the bot, until enabled");
    cmd->add_option("id", channel_ref, "Channel id")->required();
    on_parse(cmd, [&, enable](Context& c) { return ChannelSetEnabled(c, channel_ref, enable); });
  }
  CLI::App* channel_replies = channels->add_subcommand(
      "replies", "List a Telegram channel's answers: sent, waiting, or why not (unknown, dead)");
  channel_replies->add_option("id", channel_ref, "Channel id")->required();
  on_parse(channel_replies, [&](Context& c) { return ChannelReplies(c, channel_ref); });
  CLI::App* channel_rm = channels->add_subcommand("rm", "Delete a channel (its sessions stay)");
  channel_rm->add_option("id", channel_ref, "Channel id")->required();
  on_parse(channel_rm, [&](Context& c) { return ChannelRemove(c, channel_ref); });

  // keel users ...
  CLI::App* users = app.add_subcommand(
      "users", "Add, list and show users, link their chat identities, merge two users");
  users->require_subcommand(1);
  std::string user_ref, user_name, user_identity, user_from;
  std::vector<std::string> user_identities;
  on_parse(users->add_subcommand("list", "List the tenant's users"),
           [](Context& c) { return UserList(c); });
  CLI::App* users_add = users->add_subcommand("add", "Add a user (owners)");
  users_add->add_option("name", user_name, "The user's name")->required();
  users_add->add_option("--identity", user_identities,
                        "PLATFORM:ID, e.g. telegram:123456789 (repeatable)");
  on_parse(users_add, [&](Context& c) { return UserAdd(c, user_name, user_identities); });
  CLI::App* users_show = users->add_subcommand("show", "Show a user, its identities and roles");
  users_show->add_option("id", user_ref, "User id")->required();
  on_parse(users_show, [&](Context& c) { return UserShow(c, user_ref); });
  for (bool link : {true, false}) {
    CLI::App* cmd = users->add_subcommand(
        link ? "link" : "unlink",
        link ? "Say who a user is on a platform (owners)" : "Unlink a user's identity (owners)");
    cmd->add_option("id", user_ref, "User id")->required();
    cmd->add_option("identity", user_identity, "PLATFORM:ID, e.g. telegram:123456789")->required();
    on_parse(cmd, [&, link](Context& c) { return UserLink(c, user_ref, user_identity, link); });
  }
  CLI::App* users_merge = users->add_subcommand(
      "merge", "Merge one user into another: its identities and roles move there (owners)");
  users_merge->add_option("into", user_ref, "The user that stays")->required();
  users_merge->add_option("from", user_from, "The user merged into it")->required();
  on_parse(users_merge, [&](Context& c) { return UserMerge(c, user_ref, user_from); });

  // keel schedule ...
  CLI::App* sched =
      app.add_subcommand("schedule", "Add, list, show, pause, resume and remove schedules");
  sched->require_subcommand(1);
  ScheduleAddArgs schedule_add;
  CLI::App* sched_add = sched->add_subcommand(
      "add", "Schedule a prompt for an agent: --cron EXPR or --at TIME (RFC 3339 or +90s, +2h)");
  sched_add->add_option("agent", schedule_add.agent, "Agent id or name")->required();
  sched_add->add_option("prompt", schedule_add.prompt, "The message to post")->required();
  sched_add->add_option("--cron", schedule_add.cron, "Cron expression (5 fields or @daily ...)");
  sched_add->add_option("--at", schedule_add.at, "One-shot time: RFC 3339, or +N[s|m|h|d]");
  sched_add->add_option("--tz", schedule_add.timezone, "IANA time zone (default UTC)");
  sched_add->add_option("--session", schedule_add.session_id,
                        "Post into this session (default: a new session each time)");
  sched_add->add_option("--missed", schedule_add.missed,
                        "Slots missed while down: skip (default) or catch_up_one");
  sched_add->add_option("--name", schedule_add.name, "A name for it");
  on_parse(sched_add, [&](Context& c) { return ScheduleAdd(c, schedule_add); });
  std::string schedule_ref;
  CLI::App* sched_list = sched->add_subcommand("list", "List schedules (of one agent)");
  sched_list->add_option("agent", schedule_ref, "Agent id or name");
  on_parse(sched_list, [&](Context& c) { return ScheduleList(c, schedule_ref); });
  CLI::App* sched_show = sched->add_subcommand("show", "Show a schedule and its recent fires");
  sched_show->add_option("id", schedule_ref, "Schedule id")->required();
  on_parse(sched_show, [&](Context& c) { return ScheduleShow(c, schedule_ref); });
  CLI::App* sched_rm = sched->add_subcommand("rm", "Delete a schedule");
  sched_rm->add_option("id", schedule_ref, "Schedule id")->required();
  on_parse(sched_rm, [&](Context& c) { return ScheduleRemove(c, schedule_ref); });
  CLI::App* sched_pause = sched->add_subcommand("pause", "Pause a schedule");
  sched_pause->add_option("id", schedule_ref, "Schedule id")->required();
  on_parse(sched_pause, [&](Context& c) { return ScheduleSetEnabled(c, schedule_ref, false); });
  CLI::App* sched_resume = sched->add_subcommand(
      "resume", "Resume a schedule (its next slot from now, by its missed policy)");
  sched_resume->add_option("id", schedule_ref, "Schedule id")->required();
  on_parse(sched_resume, [&](Context& c) { return ScheduleSetEnabled(c, schedule_ref, true); });
  std::string reassign_token;
  CLI::App* sched_reassign = sched->add_subcommand(
      "reassign", "Hand a schedule to another token (a suspended one then fires again)");
  sched_reassign->add_option("id", schedule_ref, "Schedule id")->required();
  sched_reassign->add_option("token", reassign_token, "The token id it acts for from now on")
      ->required();
  on_parse(sched_reassign, [&](Context& c) { return ScheduleReassign(c, schedule_ref, reassign_token); });

  // keel usage, keel budget ...
  UsageArgs usage_args;
  CLI::App* usage = app.add_subcommand(
      "usage", "Show the tenant's model usage and cost in the current UTC day or month");
  usage->add_option("--agent", usage_args.agent, "Only this agent (id or name)");
  usage->add_option("--period", usage_args.period, "day (default) or month")
      ->check(CLI::IsMember({"day", "month"}));
  on_parse(usage, [&](Context& c) { return Usage(c, usage_args); });
  CLI::App* budget =
      app.add_subcommand("budget", "Set, list and remove spending budgets (owner only)");
  budget->require_subcommand(1);
  BudgetSetArgs budget_set;
  CLI::App* budget_set_cmd = budget->add_subcommand(
      "set", "Set (or replace) a budget: runs stop before a model call that would cross it");
  budget_set_cmd
      ->add_option("--scope", budget_set.scope, "tenant, or agent:ID (an agent's id or name)")
      ->required();
  budget_set_cmd->add_option("--period", budget_set.period, "day or month (UTC)")
      ->required()
      ->check(CLI::IsMember({"day", "month"}));
  budget_set_cmd->add_option("--limit-usd", budget_set.limit_usd, "The limit in USD (0 or more)")
      ->required()
      ->check(CLI::NonNegativeNumber);
  on_parse(budget_set_cmd, [&](Context& c) { return BudgetSet(c, budget_set); });
  on_parse(budget->add_subcommand("list", "List the budgets with what each has spent"),
           [](Context& c) { return BudgetList(c); });
  std::string budget_scope, budget_period;
  CLI::App* budget_rm = budget->add_subcommand("rm", "Remove a budget");
  budget_rm->add_option("--scope", budget_scope, "tenant, or agent:ID (an agent's id or name)")
      ->required();
  budget_rm->add_option("--period", budget_period, "day or month")
      ->required()
      ->check(CLI::IsMember({"day", "month"}));
  on_parse(budget_rm, [&](Context& c) { return BudgetRemove(c, budget_scope, budget_period); });

  // keel tenants create|list
  CLI::App* tenants = app.add_subcommand("tenants", "Manage tenants (platform admin only)");
  tenants->require_subcommand(1);
  std::string tenant_name;
  CLI::App* tenants_create =
      tenants->add_subcommand("create", "Create a tenant; prints its owner token");
  tenants_create->add_option("name", tenant_name, "Tenant name")->required();
  on_parse(tenants_create, [&](Context& c) { return TenantsCreate(c, tenant_name); });
  on_parse(tenants->add_subcommand("list", "List the tenants"),
           [](Context& c) { return TenantsList(c); });

  // keel events
  EventsArgs events_args;
  CLI::App* events = app.add_subcommand("events", "Read the event log, or tail it with --follow");
  events->add_option("--after", events_args.after, "Only events after this position")
      ->capture_default_str();
  events->add_option("--limit", events_args.limit, "At most this many events")
      ->capture_default_str()
      ->check(CLI::Range(1, 500));
  events->add_flag("-f,--follow", events_args.follow, "Tail the live event stream");
  on_parse(events, [&](Context& c) { return Events(c, events_args); });

  // keel export / keel import: open the store directly, like `keel serve`.
  StoreCommandArgs store_args;
  std::function<int()> store_action;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write the store's data to an archive (the server may be running)");
  export_cmd->add_option("--tenant", store_args.tenant,
                         "Only this tenant, by id or name (default: all)");
  CLI::App* import_cmd =
      app.add_subcommand("import", "Load an archive into a new, empty store (server stopped)");
  for (CLI::App* cmd : {export_cmd, import_cmd}) {
    cmd->add_option("--config", store_args.config_file, "Configuration file (keel.toml)");
    cmd->add_option("--store", store_args.store_url,
                    "Store URL: sqlite:///path/keel.db or postgres://...");
    cmd->add_option("file", store_args.file, "Archive file (.tar.zst)")->required();
  }
  export_cmd->callback([&] { store_action = [&] { return Export(store_args); }; });
  import_cmd->callback([&] { store_action = [&] { return Import(store_args); }; });
  // keel audit verify: the event log's audit chains, read from the store directly.
  CLI::App* audit_cmd = app.add_subcommand("audit", "Check the event log's audit chains");
  audit_cmd->require_subcommand(1);
  CLI::App* verify_cmd = audit_cmd->add_subcommand(
      "verify", "Check every chain (or one tenant's) and name the first event found changed, "
                "removed or moved; needs KEEL_SECRET_KEK to check the signatures");
  verify_cmd->add_option("--tenant", store_args.tenant,
                         "Only this tenant, by id or name (default: all)");
  verify_cmd->add_option("--config", store_args.config_file, "Configuration file (keel.toml)");
  verify_cmd->add_option("--store", store_args.store_url,
                         "Store URL: sqlite:///path/keel.db or postgres://...");
  verify_cmd->callback([&] { store_action = [&] { return AuditVerify(store_args); }; });
  // keel store migrate: the schema's pending migrations (PostgreSQL's as its owner role).
  CLI::App* store_cmd = app.add_subcommand("store", "Manage the store itself");
  store_cmd->require_subcommand(1);
  CLI::App* migrate_cmd = store_cmd->add_subcommand(
      "migrate",
      "Apply the store's pending schema migrations and say which versions it went "
      "between; a PostgreSQL store's as its owner role, granting the store's role its "
      "rights");
  migrate_cmd->add_option("--config", store_args.config_file, "Configuration file (keel.toml)");
  migrate_cmd->add_option("--store", store_args.store_url,
                          "Store URL: sqlite:///path/keel.db, or postgres://... (the runtime "
                          "role)");
  migrate_cmd->add_option("--owner-url", store_args.owner_url,
                          "The owner role's URL (default: store_owner, KEEL_STORE_OWNER)");
  migrate_cmd->callback([&] { store_action = [&] { return Migrate(store_args); }; });
  bool from_events = false;
  CLI::App* rebuild_cmd = store_cmd->add_subcommand(
      "rebuild", "Rebuild the store's tables from its event log into a new, empty store");
  rebuild_cmd
      ->add_flag("--from-events", from_events,
                 "Replay the events' row images (the only source there is)")
      ->required();
  rebuild_cmd->add_option("--config", store_args.config_file, "Configuration file (keel.toml)");
  rebuild_cmd->add_option("--store", store_args.store_url,
                          "The store to read, at this keel's schema version (it is not "
                          "changed): sqlite:///path/keel.db or postgres://...");
  rebuild_cmd
      ->add_option("--into", store_args.into_url, "The new store's URL (it must hold no data)")
      ->required();
  rebuild_cmd->callback([&] { store_action = [&] { return Rebuild(store_args); }; });

  // keel health
  on_parse(app.add_subcommand("health", "Check that the server is ready"),
           [](Context& c) { return Health(c); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (std::string unknown = UnknownCommand(app, argc, argv); !unknown.empty()) {
      std::cerr << unknown;
      return kExitUsage;
    }
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }

  if (serving) {
    server::ServeFlags flags;
    flags.home = NonEmpty(serve_home.empty() ? global.home : serve_home);
    flags.config_file = NonEmpty(serve_config);
    flags.listen = NonEmpty(serve_listen);
    flags.store_url = NonEmpty(serve_store);
    flags.demo = serve_demo;
    flags.print_routes = serve_print_routes;
    return server::ServeMain(flags);
  }
  if (store_action) {
    store_args.home = global.home;
    store_args.json = global.json;
    return store_action();
  }
  if (!action) {
    std::cerr << app.help();
    return kExitUsage;
  }
  Result<Context> ctx = MakeContext(global);
  if (!ctx.ok()) {
    std::cerr << "keel: " << ctx.status().message() << "\n";
    return kExitUsage;
  }
  int code = action(*ctx);
  if (code == 0 && ctx->field_missing) return 1;
  return code;
}

}  // namespace
}  // namespace keel::cli

int main(int argc, char** argv) { return keel::cli::Main(argc, argv); }

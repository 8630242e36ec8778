// Executing one run: claim it, rebuild its state from the recorded steps, and drive the
// model/tool loop to an end, recording every model response and tool result as it happens.

#include <boost/asio/use_awaitable.hpp>
#include <map>
#include <set>

#include "keel/access/access.h"
#include "keel/common/ids.h"
#include "keel/common/log.h"
#include "keel/memory/memory.h"
#include "keel/metrics.h"
#include "keel/model/provider.h"
#include "keel/plugins/bus.h"
#include "keel/plugins/host.h"
#include "keel/policy/stored.h"
#include "keel/runs/run_state.h"
#include "keel/runtime/context.h"
#include "keel/runtime/crash_note.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/model_calls.h"
#include "keel/runtime/plugin_bridge.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"
#include "keel/tools/gateway.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

Json ToolCallsJson(const std::vector<model::ToolCallRequest>& calls) {
  Json out = Json::array();
  for (const auto& c : calls) {
    out.push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
  }
  return out;
}

std::vector<model::ToolCallRequest> ToolCallsFrom(const Json& j) {
  std::vector<model::ToolCallRequest> out;
  if (!j.is_array()) return out;
  for (const auto& c : j) {
    if (!c.is_object()) continue;
    out.push_back({c.value("id", ""), c.value("name", ""), c.value("arguments", Json::object())});
  }
  return out;
}

// The conversation as plugins see it (prompt.assemble, model.before):
// [{"role", "content", "tool_calls"?, "tool_call_id"?, "tool_name"?}].
Json MessagesJson(const std::vector<model::ChatMessage>& messages) {
  Json out = Json::array();
  for (const auto& m : messages) {
    Json j = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) j["tool_calls"] = ToolCallsJson(m.tool_calls);
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.tool_name.empty()) j["tool_name"] = m.tool_name;
    out.push_back(std::move(j));
  }
  return out;
}

// A transformed payload's messages; nullopt when a transform broke their shape (the runtime
// then keeps its own).
std::optional<std::vector<model::ChatMessage>> MessagesFrom(const Json& payload) {
  if (!payload.is_object() || !payload.contains("messages") || !payload["messages"].is_array()) {
    return std::nullopt;
  }
  std::vector<model::ChatMessage> out;
  for (const auto& j : payload["messages"]) {
    if (!j.is_object() || !j.contains("role") || !j["role"].is_string() ||
        !j.contains("content") || !j["content"].is_string()) {
      return std::nullopt;
    }
    model::ChatMessage m{j["role"].get<std::string>(), j["content"].get<std::string>(), {}, "", ""};
    if (j.contains("tool_calls")) m.tool_calls = ToolCallsFrom(j["tool_calls"]);
    if (j.contains("tool_call_id") && j["tool_call_id"].is_string()) m.tool_call_id = j["tool_call_id"];
    if (j.contains("tool_name") && j["tool_name"].is_string()) m.tool_name = j["tool_name"];
    out.push_back(std::move(m));
  }
  return out;
}

// Whether a plugin's messages are the ones it was shown (most payloads pass through as they
// came): then the request, and its history mark, stay as they are.
bool SameMessages(const std::vector<model::ChatMessage>& a,
                  const std::vector<model::ChatMessage>& b) {
  auto same_calls = [](const std::vector<model::ToolCallRequest>& x,
                       const std::vector<model::ToolCallRequest>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].id != y[i].id || x[i].name != y[i].name || x[i].arguments != y[i].arguments) {
        return false;
      }
    }
    return true;
  };
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].role != b[i].role || a[i].content != b[i].content ||
        a[i].tool_call_id != b[i].tool_call_id || a[i].tool_name != b[i].tool_name ||
        !same_calls(a[i].tool_calls, b[i].tool_calls)) {
      return false;
    }
  }
  return true;
}

}  // namespace

asio::awaitable<Status> Runtime::ParkAgain(const store::Run& mine, const std::string& call_id) {
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto cur, runs::Held(tx, mine));
    KEEL_ASSIGN_OR_RETURN(auto approval,
                          tx.approvals().FindApprovalForCall(cur.tenant_id, cur.id, call_id));
    return runs::Park(tx, cur, approval ? approval->id : std::string(), NowMillis());
  });
  co_return written.status();
}

asio::awaitable<void> Runtime::ReleaseRun(const store::Run& mine) {
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto cur, runs::Held(tx, mine));
    return runs::Release(tx, cur, NowMillis());
  });
  // Not written (the store failed, or the run was taken meanwhile): its lease runs out instead.
  (void)written;
}

asio::awaitable<std::optional<std::string>> Runtime::StopFor(
    const store::Run& run, const std::vector<store::EmergencyStop>* stops) {
  if (stops) co_return policy::StopReason(*stops, run.agent_id);
  std::vector<store::EmergencyStop> read_stops;
  Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(read_stops, tx.policies().ListStops(run.tenant_id));
    return Status::Ok();
  });
  if (!read.ok()) co_return std::nullopt;  // a failing store fails the next write instead
  co_return policy::StopReason(read_stops, run.agent_id);
}

asio::awaitable<void> Runtime::RunOne(store::Run run, std::optional<KnownRun> known,
                                      RunSlots::Hold slot) {
  ++metrics_.runs_executing;
  struct Release {
    Runtime* rt;
    std::string id;
    RunSlots::Hold slot;
    int noted = -1;  // the run's slot in the crash note's table
    ~Release() {
      crash_note::Ended(noted);
      --rt->metrics_.runs_executing;
      slot.Release();  // before the dispatcher looks for runs
      rt->dispatcher_->Finished(id);
      rt->hub_.DropHeld(id);  // deltas of an intake that never committed (EventHub::HoldDeltas)
    }
  } release{this, run.id, std::move(slot)};

  // An execution that stops without writing (the store failed, or its run was taken) says
  // so: the run goes on after its lease, and a stop that repeats would otherwise be silent.
  auto stopped = [&run](const char* where, const Status& why) {
    LogError("run " + run.id + " (attempt " + std::to_string(run.attempt) + "): its execution " +
             "stopped at " + where + ": " + why.message() + "; it resumes after its lease");
  };

  // Claim: queued, or running with an expired lease (its process died).
  const std::string origin = store_.origin();
  Millis now = NowMillis();
  bool poison = false;  // the run stopped its process too often at one point: failed instead
  auto claim = [&](store::Tx& tx) -> Status {
    poison = false;  // afresh: a unit may run again (docs/decisions/0014)
    KEEL_ASSIGN_OR_RETURN(
        auto claimed, runs::ClaimRun(tx, run.tenant_id, run.id, origin, now, options_.lease_ms));
    run = std::move(claimed.run);
    poison = !claimed.poison.empty();
    if (!poison) return Status::Ok();
    // Failed by the unit that found it poison: a kill before a later unit would otherwise
    // leave it to be found again at the next start, one more try each time.
    KEEL_ASSIGN_OR_RETURN(auto totals, tx.usage().RunUsage(run.tenant_id, run.id));
    Json error = {{"code", "poison_run"}, {"message", std::move(claimed.poison)}};
    runs::Ending ending{"failed", std::string(), std::move(error), RunUsageJson(run, totals)};
    KEEL_RETURN_IF_ERROR(runs::Finish(tx, run, ending, now));
    hub_.Ending(run);  // handed to the run's waiters when this commits
    return Status::Ok();
  };
  if (!known) {
    auto written = co_await store::AsyncWrite(store_, claim);
    // Whatever the last run of the unit found: an earlier one rolled back may have told the hub.
    hub_.ForgetEnding(run.id);
    if (!written.ok()) co_return;
    if (poison) {
      ++metrics_.runs_failed;
      co_return;
    }
  }
  // The run's usage records so far, kept here so that its ending need not read them back in the
  // writer's unit: none at a first attempt; read with the rest below at a later one; unknown
  // again after a compaction, whose record is made elsewhere (the ending reads them then).
  store::UsageTotals usage_records;
  bool usage_known = run.attempt == 1;
  // Whether `run` has the run's tokens as stored: the claim read them, and this execution alone
  // adds to them (its model steps below; a compaction's summary, which does it elsewhere, and
  // after which the ending reads the run again).
  bool tokens_known = true;
  ++metrics_.runs_started;
  release.noted = crash_note::Executing(run.tenant_id, run.id, run.attempt);

  bool direct = false;  // a direct call (see below); set once the prompt is known
  std::string introspection;  // an introspection run's trigger (context.h); "" for other runs
  bool introspects = false;   // the agent has introspection triggers (context.h)
  // Ends the run in one unit of work: the final answer (or the failure) and the session's state.
  // Parameters by value: the coroutine outlives the caller's temporaries (see `fail`).
  auto finish = [&](std::string status, std::string output, Json error,
                    std::optional<store::Step> final_step, model::Usage usage,
                    const ModelCall* call = nullptr) -> asio::awaitable<Status> {
    // The execution's work is over: its slot goes back now, not once the ending commits. The
    // writer thread hands the commit to the hub before it resumes this coroutine, and the io
    // thread may meanwhile wake the run's waiter, answer its client and take that client's next
    // message, which would find the tenant's slots full and be queued instead of claimed (10 to
    // 17 % of the turns at concurrency 64 on the local model).
    release.slot.Release();
    const EndingWork owed = ending_work_ ? ending_work_(run) : EndingWork{};
    auto done = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      // The run as this execution knows it; Finish checks that the execution still holds it.
      store::Run cur = run;
      if (!tokens_known) {
        KEEL_ASSIGN_OR_RETURN(cur, runs::Held(tx, run));
      }
      Millis at = NowMillis();
      if (final_step) {
        KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(*final_step));
        tx.Carry("run_steps", store::RowImage(*final_step));
        KEEL_RETURN_IF_ERROR(tx.events()
                                 .Append({cur.tenant_id, "run.step@v1", cur.agent_id,
                                          cur.session_id, cur.id,
                                          {{"seq", final_step->seq},
                                           {"kind", final_step->kind},
                                           {"status", final_step->status}}}));
        if (call) KEEL_RETURN_IF_ERROR(call->Record(tx, cur, *final_step));
      }
      cur.input_tokens += usage.input_tokens;
      cur.output_tokens += usage.output_tokens;
      if (status == "done" && !direct && introspection.empty()) {
        store::Message reply;
        reply.id = NewId();
        reply.tenant_id = cur.tenant_id;
        reply.session_id = cur.session_id;
        reply.run_id = cur.id;
        reply.role = "assistant";
        reply.content = output;
        reply.created_at = at;
        KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(reply));
        tx.Carry("messages", store::RowImage(reply));
        KEEL_RETURN_IF_ERROR(tx.events()
                                 .Append({cur.tenant_id, "message.created@v1", cur.agent_id,
                                          cur.session_id, cur.id,
                                          {{"message_id", reply.id}, {"role", "assistant"}}}));
      }
      if (status == "done" && !introspection.empty()) {
        KEEL_RETURN_IF_ERROR(IntrospectionCompleted(tx, cur, introspection));
      }
      store::UsageTotals totals = usage_records;  // a copy: the unit may run twice
      if (!usage_known) {
        KEEL_ASSIGN_OR_RETURN(totals, tx.usage().RunUsage(cur.tenant_id, cur.id));
      } else if (final_step && call) {
        call->AddTo(totals);
      }
      // A run's reported usage includes the tokens this ending adds (RunUsageJson reads cur).
      runs::Ending ending{status, output, error, RunUsageJson(cur, totals)};
      KEEL_RETURN_IF_ERROR(runs::Finish(tx, cur, ending, at));
      if (owed.write) KEEL_RETURN_IF_ERROR(owed.write(tx, cur));
      hub_.Ending(cur);  // handed to the run's waiters when this commits
      return Status::Ok();
    });
    hub_.ForgetEnding(run.id);
    if (owed.after) owed.after(done.ok());
    if (!done.ok() && done.status().code() == Code::kConflict) {
      LogInfo("run " + run.id + ": this node's execution (attempt " + std::to_string(run.attempt) +
              ") no longer holds it (its lease ran out and another " +
              "execution took it, or it ended); its ending (" + status + ") is not recorded");
    } else if (!done.ok()) {
      stopped("its ending", done.status());
    }
    if (done.ok()) {
      if (status == "done" && !direct && introspection.empty() && introspects) TurnEnded(run);
      if (status == "done")
        ++metrics_.runs_done;
      else if (status == "cancelled")
        ++metrics_.runs_cancelled;
      else
        ++metrics_.runs_failed;
    }
    co_return done.ok() ? Status::Ok() : done.status();
  };
  auto fail = [&](std::string code, std::string message) {
    Json error = Json::object();
    error["code"] = std::move(code);
    error["message"] = std::move(message);
    return finish(std::string("failed"), std::string(), std::move(error), std::nullopt,
                  model::Usage{});
  };
  // Load what the run needs, in one snapshot: the agent, its prompt, this run's steps so far,
  // the agent's plugins and working memory, what its first model turn's context is assembled
  // from, and the emergency stops in force (the first step boundary's check).
  store::Agent agent;
  store::Message prompt;
  std::vector<store::Step> steps;
  std::vector<store::ToolCall> calls;
  std::vector<store::PluginStamp> stamps;  // the agent's plugins' (used when intake found none)
  store::WorkingMemory working;
  std::string working_memory;  // the system message showing it, or ""
  bool revoked = false;        // the token the run acts for was revoked since it was posted
  ContextRead context;
  context.known = conversations_.Take(run.tenant_id, run.session_id);
  if (known) {
    context.session.instructions = known->session_instructions;
  } else {
    context.session_read = true;
  }
  std::vector<store::EmergencyStop> stops;
  std::optional<std::vector<store::EmergencyStop>> first_stops;
  // The agent's settings as this node keeps them (settings_cache.h), taken when the tenant's
  // settings version, read with the rest, says they are current; else read with the rest.
  std::shared_ptr<const AgentSettings> kept = settings_.Get(run.tenant_id, run.agent_id);
  int64_t settings_version = -1;
  bool settings_read = false;
  Status loaded = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
    if (known) {  // a run claimed at intake was posted with an active token a moment ago
      agent = known->agent;
      prompt = known->prompt;
    } else {
      KEEL_ASSIGN_OR_RETURN(revoked, access::Revoked(tx, run.tenant_id, run.requested_by));
      KEEL_ASSIGN_OR_RETURN(agent, tx.agents().GetAgent(run.tenant_id, run.agent_id));
      KEEL_ASSIGN_OR_RETURN(prompt, tx.messages().GetMessage(run.tenant_id, run.message_id));
    }
    // These go out with the context's first read (one round trip on PostgreSQL), and are
    // looked at after the read.
    auto read_settings = [&]() -> Status {
      settings_read = true;
      KEEL_RETURN_IF_ERROR(
          tx.plugins().PluginStampsForAgentLater(run.tenant_id, run.agent_id, stamps));
      KEEL_RETURN_IF_ERROR(tx.memory().GetWorkingMemoryLater(run.tenant_id, run.agent_id, working));
      KEEL_RETURN_IF_ERROR(tx.policies().ListStopsLater(run.tenant_id, stops));
      return tx.skills().SkillsForAgentLater(run.tenant_id, run.agent_id, false, context.skills);
    };
    KEEL_RETURN_IF_ERROR(tx.tenants().SettingsVersionLater(run.tenant_id, settings_version));
    if (!kept) KEEL_RETURN_IF_ERROR(read_settings());
    if (run.attempt > 1) {  // a first attempt has recorded nothing yet
      KEEL_ASSIGN_OR_RETURN(steps, tx.runs().ListSteps(run.tenant_id, run.id));
      KEEL_ASSIGN_OR_RETURN(calls, tx.runs().ListToolCalls(run.tenant_id, run.id));
      KEEL_ASSIGN_OR_RETURN(usage_records, tx.usage().RunUsage(run.tenant_id, run.id));
    }
    if (prompt.role != "call") KEEL_RETURN_IF_ERROR(ReadContext(tx, run, prompt, context));
    if (!settings_read) {  // kept: current unless the version moved since it was read
      KEEL_RETURN_IF_ERROR(tx.Flush());
      if (settings_version != kept->version) KEEL_RETURN_IF_ERROR(read_settings());
    }
    return Status::Ok();
  });
  if (loaded.ok() && settings_read) {
    auto fresh = std::make_shared<AgentSettings>();
    fresh->version = settings_version;
    fresh->stamps = stamps;
    fresh->working = working;
    fresh->skills = context.skills;
    fresh->stops = stops;
    settings_.Put(run.tenant_id, run.agent_id, std::move(fresh));
  } else if (loaded.ok()) {
    stamps = kept->stamps;
    working = kept->working;
    context.skills = kept->skills;
    stops = kept->stops;
  }
  if (loaded.ok()) {
    usage_known = true;  // at a later attempt, read with the rest
    working_memory = memory::WorkingMemoryPrompt(working);
    first_stops = std::move(stops);
  }
  if (loaded.ok() && prompt.role != "call") {
    KeepWindow(run, context);
  } else if (context.known) {
    conversations_.Put(run.tenant_id, run.session_id, std::move(context.known));
  }
  if (!loaded.ok()) {
    std::string code = loaded.code() == Code::kNotFound ? "agent_deleted" : "internal";
    (void)co_await fail(code, loaded.message());
    co_return;
  }
  if (revoked) {  // it never acts on an authority that was withdrawn
    std::string code = "permission_denied";
    (void)co_await fail(code, "the token this run acts for (" + run.requested_by +
                                  ") was revoked before the run could go on");
    co_return;
  }
  // The agent's plugins as of this turn (built again when they changed since its last one).
  std::shared_ptr<plugins::AgentPlugins> plugins = known ? known->plugins : nullptr;
  if (!plugins) {
    auto found = co_await plugins_->PluginsFor(run.tenant_id, run.agent_id, std::move(stamps));
    if (!found.ok()) {
      stopped("its plugins' read", found.status());
      co_return;
    }
    plugins = std::move(found).value();
  }
  // A plugin whose failure mode is "fail" failed: the turn stops with its error.
  auto plugin_failed = [&](const plugins::PluginError& e) {
    std::string code = "plugin_failed";
    return fail(code, "plugin " + e.plugin_id + " failed on " + e.event + ": " + e.message);
  };
  const Json ids = {{"agent_id", run.agent_id}, {"session_id", run.session_id}, {"run_id", run.id}};
  if (plugins->broken) {
    plugins::PluginError e = *plugins->broken;
    e.event = "load";
    (void)co_await plugin_failed(e);
    co_return;
  }

  // A direct call (role "call", posted through Keel's MCP server) runs its one tool call through
  // the gateway and ends with the call's answer; the model is never asked.
  direct = prompt.role == "call";
  if (prompt.role == "introspection") introspection = IntrospectionTrigger(prompt.content);
  introspects = HasIntrospection(agent.config);
  std::vector<model::ToolCallRequest> pending;  // proposed by the last model step, not yet run
  std::string direct_answer;                    // a direct call's answer, once it has one
  model::ModelRequest request;
  HistoryMark history;  // the session's messages in request.messages, for its cache key
  if (direct) {
    auto call = ParseJson(prompt.content);
    if (!call.ok() || !call->is_object()) {
      std::string code = "invalid_call";
      (void)co_await fail(code, "the run's call is not a JSON object");
      co_return;
    }
    pending.push_back({call->value("id", ""), call->value("name", ""),
                       call->value("arguments", Json::object())});
  } else {
    std::string model_name;
    auto resolved = providers_.Resolve(agent.model, &model_name);
    if (!resolved.ok()) {
      std::string code = "invalid_model";
      (void)co_await fail(code, resolved.status().message());
      co_return;
    }
    request.model = model_name;
    request.agent_config = agent.config;
    std::string code;
    std::optional<FailedSummary> summary_failed;  // a compaction's summary call failed
    const size_t steps_before = steps.size();
    Status assembled = co_await AssembleContext(run, agent, prompt, plugins, std::move(context),
                                                request, steps, code, summary_failed, history);
    if (steps.size() != steps_before) {  // a compaction recorded its usage and tokens
      usage_known = false;
      tokens_known = false;
    }
    if (!assembled.ok()) {
      if (code.empty()) {  // the store failed; the run resumes after its lease
        stopped("the assembly of its context", assembled);
        co_return;
      }
      if (!summary_failed) {
        (void)co_await fail(code, assembled.message());
        co_return;
      }
      Json error = Json::object();
      error["code"] = code;
      error["message"] = assembled.message();
      std::string failed = "failed";
      std::optional<store::Step> step = summary_failed->step;
      const auto& answer = summary_failed->call.response;  // tokens an empty answer spent
      model::Usage spent = answer.ok() ? answer->usage : model::Usage{};
      (void)co_await finish(failed, std::string(), error, step, spent, &summary_failed->call);
      co_return;
    }
    if (!working_memory.empty()) {  // right after the system prompt
      auto at = request.messages.begin();
      if (at != request.messages.end() && at->role == "system") ++at;
      if (static_cast<size_t>(at - request.messages.begin()) <= history.begin) ++history.begin;
      request.messages.insert(at, model::ChatMessage{"system", working_memory, {}, "", ""});
    }
    if (plugins->Wants("prompt.assemble")) {
      Json payload = ids;
      payload["messages"] = MessagesJson(request.messages);
      auto out = co_await plugins_->Emit(plugins, "prompt.assemble", std::move(payload));
      if (out.abort) {
        (void)co_await plugin_failed(*out.abort);
        co_return;
      }
      auto assembled = out.changed ? MessagesFrom(out.payload) : std::nullopt;
      if (assembled && !SameMessages(*assembled, request.messages)) {
        request.messages = std::move(*assembled);
        history = {};  // the plugin's messages: hashed as they are
      }
    }
    Json allowed = RunTools(agent.tools, !introspection.empty());
    for (const auto& t : co_await gateway_.Offered(run.tenant_id, run.agent_id, allowed)) {
      if (introspection.empty() && IsIntrospectionTool(t->name())) continue;
      request.tools.push_back({t->name(), t->description(), t->parameters()});
    }
  }
  int max_steps = options_.default_max_steps;
  if (agent.config.is_object() && agent.config.contains("max_steps") &&
      agent.config["max_steps"].is_number_integer()) {
    max_steps = std::max(1, agent.config["max_steps"].get<int>());
  }

  // Replay the recorded steps into the conversation (invariant 11: resume, do not restart).
  std::map<std::string, const store::ToolCall*> call_by_step;
  for (const auto& c : calls) call_by_step[c.step_id] = &c;
  std::set<std::string> seen_call_ids;
  int model_steps = 0;
  int next_seq = 1;
  for (const auto& step : steps) {
    next_seq = step.seq + 1;
    if (step.kind == "model") {
      ++model_steps;
      model::ChatMessage m{"assistant", step.output.value("text", ""), {}, "", ""};
      m.tool_calls = ToolCallsFrom(step.output.value("tool_calls", Json::array()));
      pending = m.tool_calls;
      for (const auto& c : m.tool_calls) seen_call_ids.insert(c.id);
      request.messages.push_back(std::move(m));
      continue;
    }
    auto it = call_by_step.find(step.id);
    if (it == call_by_step.end()) continue;
    store::ToolCall call = *it->second;
    tools::CallOutcome outcome{call.status, call.result};
    if (call.status == "started") {
      auto resumed =
          co_await gateway_.Resume(call, step, run.agent_id, run.session_id, agent.config,
                                   run.attempt);
      if (!resumed.ok()) {  // the store failed; the lease will expire and we retry
        stopped("the resumption of a started call", resumed.status());
        co_return;
      }
      outcome = *resumed;
    } else if (call.status == "approved") {
      auto executed = co_await gateway_.ExecuteApproved(call, step, run.agent_id, run.session_id,
                                                        agent.config, run.attempt);
      if (!executed.ok()) {
        stopped("an approved call", executed.status());
        co_return;
      }
      outcome = *executed;
    } else if (call.status == "awaiting_approval") {
      // Still undecided (the run was queued by something else): wait again.
      Status parked = co_await ParkAgain(run, call.call_id);
      if (!parked.ok()) stopped("parking again for an undecided call", parked);
      co_return;
    }
    std::erase_if(pending, [&](const auto& p) { return p.id == call.call_id; });
    if (direct) direct_answer = outcome.ForModel();
    request.messages.push_back({"tool", outcome.ForModel(), {}, call.call_id, call.tool});
  }

  while (true) {
    if (dispatcher_->draining() && !dispatcher_->CancelRequested(run.id) && !run.cancel_requested) {
      // The node stops: the run goes back to the queue at this step boundary, with what it
      // recorded, for another node (or this one, restarted) to go on with.
      co_await ReleaseRun(run);
      co_return;
    }
    if (dispatcher_->CancelRequested(run.id) || run.cancel_requested) {
      Json error = Json::object();
      error["code"] = "cancelled";
      error["message"] = "cancelled by request";
      std::string cancelled = "cancelled";
      (void)co_await finish(cancelled, std::string(), error, std::nullopt, model::Usage{});
      co_return;
    }
    // The first boundary's stops came with the run's load; later ones are read again.
    auto stop = co_await StopFor(run, first_stops ? &*first_stops : nullptr);
    first_stops.reset();
    if (stop) {
      // Halts at this step boundary; the stop survives restarts, so a resumed run halts too.
      Json error = Json::object();
      error["code"] = "emergency_stop";
      error["message"] = *stop;
      std::string cancelled = "cancelled";
      (void)co_await finish(cancelled, std::string(), error, std::nullopt, model::Usage{});
      co_return;
    }
    if (!pending.empty()) {
      for (const auto& call : pending) {
        // Stop at the next step boundary; the calls not made yet are the resumed run's.
        if (dispatcher_->CancelRequested(run.id) || dispatcher_->draining()) break;
        ++metrics_.tool_calls;
        tools::CallRequest creq;
        creq.tenant_id = run.tenant_id;
        creq.agent_id = run.agent_id;
        creq.session_id = run.session_id;
        creq.run_id = run.id;
        creq.step_seq = next_seq++;
        creq.call_id = call.id;
        creq.tool = call.name;
        creq.arguments = call.arguments;
        creq.allowed_tools = RunTools(agent.tools, !introspection.empty());
        creq.agent_config = agent.config;
        creq.caller_role = run.caller_role;
        creq.requested_by = run.requested_by;
        creq.attempt = run.attempt;
        auto outcome = co_await gateway_.Call(creq);
        if (!outcome.ok()) {  // the store failed; the run resumes after its lease
          stopped("a tool call", outcome.status());
          co_return;
        }
        if (outcome->abort_turn) {  // a plugin that must not be skipped failed deciding
          std::string code = "plugin_failed";
          (void)co_await fail(code, outcome->ForModel());
          co_return;
        }
        if (outcome->status == "awaiting_approval") co_return;  // parked; a decision requeues it
        if (direct) direct_answer = outcome->ForModel();
        request.messages.push_back({"tool", outcome->ForModel(), {}, call.id, call.name});
      }
      pending.clear();
      // A cancel that arrived while tools ran is seen in the store too.
      Status fresh = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(auto cur, tx.runs().GetRun(run.tenant_id, run.id));
        run.cancel_requested = cur.cancel_requested;
        return Status::Ok();
      });
      (void)fresh;
      continue;
    }
    if (direct) {  // its call has its answer (the call's record says how it went)
      std::string done = "done";
      (void)co_await finish(done, direct_answer, Json(), std::nullopt, model::Usage{});
      co_return;
    }
    if (model_steps >= max_steps) {
      std::string code = "step_limit";
      std::string message =
          "the run reached its limit of " + std::to_string(max_steps) + " model steps";
      (void)co_await fail(code, message);
      co_return;
    }

    store::Step step;
    step.id = NewId();
    step.tenant_id = run.tenant_id;
    step.run_id = run.id;
    step.seq = next_seq++;
    step.kind = "model";
    step.started_at = NowMillis();
    step.input = {{"model", agent.model}, {"messages", request.messages.size()}};
    ++metrics_.model_calls;
    auto delta = [this, &run](const std::string& text) {
      hub_.PublishDelta({run.tenant_id, run.agent_id, run.session_id, run.id, text});
    };
    // model.before may rewrite what this call sends (redaction); the run's own record of the
    // conversation stays as it was.
    const model::ModelRequest* sent = &request;
    model::ModelRequest rewritten;
    if (plugins->Wants("model.before")) {
      Json payload = ids;
      payload["model"] = agent.model;
      payload["messages"] = MessagesJson(request.messages);
      Json names = Json::array();
      for (const auto& t : request.tools) names.push_back(t.name);
      payload["tools"] = names;
      auto out = co_await plugins_->Emit(plugins, "model.before", std::move(payload));
      if (out.abort) {
        (void)co_await plugin_failed(*out.abort);
        co_return;
      }
      auto messages = out.changed ? MessagesFrom(out.payload) : std::nullopt;
      if (messages && !SameMessages(*messages, request.messages)) {
        rewritten = request;
        rewritten.messages = std::move(*messages);
        sent = &rewritten;
      }
    }
    ModelCall call =
        co_await models_->Call(run, agent, *sent, delta, sent == &request ? &history : nullptr);
    if (call.store_failed) {  // the store failed; the run resumes after its lease
      stopped("a model call", Unavailable("the budgets could not be read"));
      co_return;
    }
    auto& response = call.response;
    if (response.ok() && plugins->Wants("model.after")) {
      Json payload = ids;
      payload["text"] = response->text;
      payload["tool_calls"] = ToolCallsJson(response->tool_calls);
      payload["usage"] = {{"input_tokens", response->usage.input_tokens},
                          {"output_tokens", response->usage.output_tokens}};
      co_await plugins_->Emit(plugins, "model.after", std::move(payload));
    }
    step.finished_at = NowMillis();
    ++model_steps;
    if (!response.ok()) {
      bool budget = !call.budget_exceeded.is_null();  // no call was made
      if (!budget) ++metrics_.model_errors;
      step.status = "failed";
      step.output = {{"error", response.status().message()}};
      call.Describe(step.output);
      Json error = Json::object();
      error["code"] = budget ? "budget_exceeded" : "model_error";
      error["message"] = response.status().message();
      std::string failed = "failed";
      (void)co_await finish(failed, std::string(), error, step, model::Usage{}, &call);
      co_return;
    }
    // Tool call ids must be unique within the run: make them so if the model repeats one.
    for (auto& c : response->tool_calls) {
      if (c.id.empty() || seen_call_ids.count(c.id)) c.id = "call_" + std::to_string(step.seq) + "_" + std::to_string(seen_call_ids.size() + 1);
      seen_call_ids.insert(c.id);
    }
    metrics_.input_tokens += response->usage.input_tokens;
    metrics_.output_tokens += response->usage.output_tokens;
    step.status = "succeeded";
    step.output = {{"text", response->text},
                   {"tool_calls", ToolCallsJson(response->tool_calls)},
                   {"usage",
                    {{"input_tokens", response->usage.input_tokens},
                     {"output_tokens", response->usage.output_tokens}}}};
    call.Describe(step.output);
    if (response->tool_calls.empty()) {
      std::string done = "done";
      (void)co_await finish(done, response->text, Json(), step, response->usage, &call);
      co_return;
    }
    store::Run after_step;  // the run as the step's record left it
    auto recorded = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto cur, runs::Held(tx, run));
      KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(step));
      tx.Carry("run_steps", store::RowImage(step));
      KEEL_RETURN_IF_ERROR(call.Record(tx, cur, step));
      KEEL_RETURN_IF_ERROR(
          runs::AddTokens(tx, cur, response->usage.input_tokens, response->usage.output_tokens));
      after_step = cur;
      return tx.events()
          .Append({cur.tenant_id, "run.step@v1", cur.agent_id, cur.session_id, cur.id,
                   {{"seq", step.seq},
                    {"kind", "model"},
                    {"status", "succeeded"},
                    {"tool_calls", response->tool_calls.size()}}});
    });
    if (!recorded.ok()) {
      stopped("the record of a model step", recorded.status());
      co_return;
    }
    run.cancel_requested = after_step.cancel_requested;
    run.input_tokens = after_step.input_tokens;
    run.output_tokens = after_step.output_tokens;
    call.AddTo(usage_records);
    model::ChatMessage m{"assistant", response->text, response->tool_calls, "", ""};
    request.messages.push_back(std::move(m));
    pending = response->tool_calls;
  }
}

}  // namespace keel::runtime

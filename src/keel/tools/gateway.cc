#include "keel/tools/gateway.h"

#include <boost/asio/use_awaitable.hpp>

#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/store/async.h"

namespace keel::tools {

namespace asio = boost::asio;

std::string CallOutcome::ForModel() const {
  if (result.is_string()) return result.get<std::string>();
  if (result.is_object() && result.contains("error") && result["error"].is_string()) {
    return "error: " + result["error"].get<std::string>();
  }
  return DumpJson(result);
}

bool Gateway::Allowed(const Json& allowed_tools, const std::string& tool) {
  if (!allowed_tools.is_array() || allowed_tools.empty()) return true;
  for (const auto& t : allowed_tools) {
    if (!t.is_string()) continue;
    const std::string& pattern = t.get_ref<const std::string&>();
    if (pattern == tool || pattern == "*") return true;
    if (pattern.size() > 1 && pattern.back() == '*' &&
        tool.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0) {
      return true;
    }
  }
  return false;
}

std::vector<const Tool*> Gateway::ToolsFor(const Json& allowed_tools) const {
  std::vector<const Tool*> out;
  for (const Tool* t : registry_.All()) {
    if (Allowed(allowed_tools, t->name())) out.push_back(t);
  }
  return out;
}

asio::awaitable<Result<CallOutcome>> Gateway::Call(const CallRequest& req) {
  Millis now = NowMillis();
  store::ToolCall call;
  call.id = NewId();
  call.tenant_id = req.tenant_id;
  call.run_id = req.run_id;
  call.call_id = req.call_id;
  call.tool = req.tool;
  call.arguments = req.arguments.is_object() ? req.arguments : Json::object();
  call.effect_key = req.run_id + ":" + req.call_id;
  call.created_at = call.updated_at = now;

  store::Step step;
  step.id = NewId();
  step.tenant_id = req.tenant_id;
  step.run_id = req.run_id;
  step.seq = req.step_seq;
  step.kind = "tool";
  step.input = {{"tool", req.tool}, {"call_id", req.call_id}, {"arguments", call.arguments}};
  step.started_at = now;
  call.step_id = step.id;

  // Policy: the tool must exist and be on the agent's list.
  Tool* tool = registry_.Find(req.tool);
  std::string denial;
  if (!tool) {
    denial = "unknown tool: " + req.tool;
  } else if (!Allowed(req.allowed_tools, req.tool)) {
    denial = "the agent may not call " + req.tool;
  } else if (!req.arguments.is_object()) {
    denial = "tool arguments must be a JSON object";
  }
  if (!denial.empty()) {
    call.effect_class = tool ? EffectClassName(tool->effect_class()) : "once";
    call.status = "denied";
    call.result = {{"error", denial}};
    step.status = "denied";
    step.output = call.result;
    step.finished_at = now;
    auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(step));
      KEEL_RETURN_IF_ERROR(tx.runs().InsertToolCall(call));
      return tx.events()
          .Append({req.tenant_id, "tool.call.denied@v1", req.agent_id, req.session_id, req.run_id,
                   {{"call_id", call.call_id}, {"tool", call.tool}, {"reason", denial}}});
    });
    if (!written.ok()) co_return written.status();
    co_return CallOutcome{"denied", call.result};
  }

  // Journal: the call is durably `started` before it runs.
  call.effect_class = EffectClassName(tool->effect_class());
  call.status = "started";
  call.result = nullptr;
  step.status = "started";
  auto journaled = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(step));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertToolCall(call));
    return tx.events()
        .Append({req.tenant_id, "tool.call.started@v1", req.agent_id, req.session_id, req.run_id,
                 {{"call_id", call.call_id},
                  {"tool", call.tool},
                  {"arguments", call.arguments},
                  {"effect_class", call.effect_class}}});
  });
  if (!journaled.ok()) co_return journaled.status();
  co_return co_await ExecuteAndRecord(std::move(call), std::move(step), req.agent_id,
                                      req.session_id);
}

asio::awaitable<Result<CallOutcome>> Gateway::Resume(const store::ToolCall& call,
                                                     const store::Step& step,
                                                     const std::string& agent_id,
                                                     const std::string& session_id) {
  if (call.effect_class == "pure" || call.effect_class == "idempotent") {
    co_return co_await ExecuteAndRecord(call, step, agent_id, session_id);
  }
  // A `once` call may have had its effect: never repeat it, surface it as unknown.
  store::ToolCall c = call;
  store::Step s = step;
  c.status = "unknown";
  c.result = {{"error",
               "the call to " + c.tool +
                   " was interrupted by a crash and may or may not have taken effect; it was "
                   "not repeated"}};
  c.updated_at = NowMillis();
  s.status = "unknown";
  s.output = c.result;
  s.finished_at = c.updated_at;
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateToolCall(c));
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateStep(s));
    return tx.events()
        .Append({c.tenant_id, "tool.call.unknown@v1", agent_id, session_id, c.run_id,
                 {{"call_id", c.call_id}, {"tool", c.tool}}});
  });
  if (!written.ok()) co_return written.status();
  co_return CallOutcome{"unknown", c.result};
}

asio::awaitable<Result<CallOutcome>> Gateway::ExecuteAndRecord(store::ToolCall call,
                                                               store::Step step,
                                                               const std::string& agent_id,
                                                               const std::string& session_id) {
  Tool* tool = registry_.Find(call.tool);
  Result<Json> result = tool ? Result<Json>(Status::Ok()) : Result<Json>(NotFound("unknown tool"));
  if (tool) {
    ToolContext ctx{call.tenant_id, agent_id,       session_id,          call.run_id,
                    call.call_id,   call.effect_key, WorkspaceOf(agent_id)};
    try {
      result = tool->Execute(ctx, call.arguments);
    } catch (const std::exception& e) {
      result = Internal(std::string("tool threw: ") + e.what());
    }
  }
  call.updated_at = NowMillis();
  if (result.ok()) {
    call.status = "succeeded";
    call.result = *result;
  } else {
    call.status = "failed";
    call.result = {{"error", result.status().message()}};
  }
  step.status = call.status;
  step.output = call.result;
  step.finished_at = call.updated_at;
  auto written = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateToolCall(call));
    KEEL_RETURN_IF_ERROR(tx.runs().UpdateStep(step));
    return tx.events()
        .Append({call.tenant_id, "tool.call.completed@v1", agent_id, session_id, call.run_id,
                 {{"call_id", call.call_id}, {"tool", call.tool}, {"status", call.status}}});
  });
  if (!written.ok()) co_return written.status();
  co_return CallOutcome{call.status, call.result};
}

}  // namespace keel::tools

// The event bus and Lua plugins, in process.
//
//   BM_EmitListeners/N   emitting model.after@v1 (a payload like the runtime's) on a bus with N
//                        C++ listeners that do nothing; N = 0, 1, 10. Nanoseconds per emit.
//   BM_EmitLuaTransform  emitting prompt.assemble@v1 (three short messages) on a bus whose one
//                        handler is a Lua transform that edits the last message: the payload's
//                        way into Lua and back, and the call under its budgets.
//   BM_EmitLuaVeto       emitting tool.before@v1 to a Lua veto that looks at the tool's name.
// scripts/bench.sh (section 5) also measures end-to-end turns with the built-in plugins.

#include <benchmark/benchmark.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "keel/plugins/bus.h"
#include "keel/plugins/lua_plugin.h"

namespace {

namespace asio = boost::asio;
using keel::Json;
using keel::Result;
using keel::plugins::EventBus;
using keel::plugins::HookOptions;
using keel::plugins::LuaPlugin;

// Runs the benchmark's loop in a coroutine on an io_context of its own: emissions are awaited.
template <typename Loop>
void OnLoop(Loop loop) {
  asio::io_context io;
  asio::co_spawn(io, std::move(loop), asio::detached);
  io.run();
}

Json ModelAfter() {
  return {{"agent_id", "01a22bb7-04e5-7395-986b-4e1a35403ea6"},
          {"session_id", "01a22bb7-04e5-7395-986b-4e1a35403ea7"},
          {"run_id", "01a22bb7-04e5-7395-986b-4e1a35403ea8"},
          {"text", "You said: \"hello\""},
          {"tool_calls", Json::array()},
          {"usage", {{"input_tokens", 12}, {"output_tokens", 5}}}};
}

void BM_EmitListeners(benchmark::State& state) {
  EventBus bus;
  for (int i = 0; i < state.range(0); ++i) {
    HookOptions o;
    o.plugin_id = "p" + std::to_string(i);
    o.priority = i;
    (void)bus.On("model.after@v1",
                 keel::plugins::Immediate([](const Json&) -> Result<Json> { return Json(); }), o);
  }
  const Json payload = ModelAfter();
  OnLoop([&]() -> asio::awaitable<void> {
    for (auto _ : state) {
      auto out = co_await bus.Emit("model.after", payload);
      benchmark::DoNotOptimize(out);
    }
  });
}
BENCHMARK(BM_EmitListeners)->Arg(0)->Arg(1)->Arg(10);

std::unique_ptr<LuaPlugin> LoadLua(const std::string& source, const std::string& event) {
  auto loaded = LuaPlugin::Load("bench", source, Json::object(), {event}, 100, {}, nullptr);
  if (!loaded.ok()) throw std::runtime_error(loaded.status().message());
  return std::move(*loaded);
}

void BM_EmitLuaTransform(benchmark::State& state) {
  std::shared_ptr<LuaPlugin> lua = LoadLua(R"lua(
    ctx.bus.on("prompt.assemble@v1", function(p)
      local last = p.messages[#p.messages]
      last.content = last.content .. " (checked)"
      return p
    end))lua", "prompt.assemble@v1");
  EventBus bus;
  int ref = lua->hooks()[0].ref;
  HookOptions o;
  o.plugin_id = "bench";
  (void)bus.On(
      "prompt.assemble@v1", [lua, ref](const Json& p) { return lua->Call(ref, p); }, o);
  const Json payload = {{"agent_id", "a"}, {"session_id", "s"}, {"run_id", "r"},
                        {"messages", {{{"role", "system"}, {"content", "You are a test agent."}},
                                      {{"role", "user"}, {"content", "hi"}},
                                      {{"role", "user"}, {"content", "hello"}}}}};
  OnLoop([&]() -> asio::awaitable<void> {
    for (auto _ : state) {
      auto out = co_await bus.Emit("prompt.assemble", payload);
      if (!out.errors.empty()) state.SkipWithError(out.errors[0].message.c_str());
      benchmark::DoNotOptimize(out);
    }
  });
}
BENCHMARK(BM_EmitLuaTransform);

asio::awaitable<Result<Json>> Veto(std::shared_ptr<LuaPlugin> lua, int ref, const Json& p) {
  auto r = co_await lua->Call(ref, p);
  if (r.ok() && r->is_null()) co_return Json{{"allow", true}};
  co_return r;
}

void BM_EmitLuaVeto(benchmark::State& state) {
  std::shared_ptr<LuaPlugin> lua = LoadLua(R"lua(
    ctx.bus.on("tool.before@v1", function(c)
      if c.tool == "exec" then return {allow = false, reason = "no exec"} end
    end))lua", "tool.before@v1");
  EventBus bus;
  int ref = lua->hooks()[0].ref;
  HookOptions o;
  o.plugin_id = "bench";
  (void)bus.On(
      "tool.before@v1", [lua, ref](const Json& p) { return Veto(lua, ref, p); }, o);
  const Json payload = {{"agent_id", "a"}, {"session_id", "s"}, {"run_id", "r"},
                        {"call_id", "call_1"}, {"tool", "notes.append"},
                        {"arguments", {{"line", "x"}}}, {"caller_role", "owner"}};
  OnLoop([&]() -> asio::awaitable<void> {
    for (auto _ : state) {
      auto out = co_await bus.Emit("tool.before", payload);
      benchmark::DoNotOptimize(out);
    }
  });
}
BENCHMARK(BM_EmitLuaVeto);

}  // namespace

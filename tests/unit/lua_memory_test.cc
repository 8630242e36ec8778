// ctx.memory, the Lua plugins' read-only view of their agent's memories: what it returns, that
// an agent's plugin sees that agent's memories only, that it cannot be used while loading, that
// its calls count against the sandbox's budgets, and that a read suspends the call without
// holding the event loop (the calls of one plugin taking turns meanwhile).

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <vector>

#include "await.h"
#include "keel/common/ids.h"
#include "keel/memory/memory.h"
#include "keel/plugins/host.h"
#include "keel/plugins/lua_plugin.h"
#include "keel/store/async.h"
#include "keel/store/store.h"
#include "keel/tools/tool.h"

namespace keel::plugins {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;

asio::awaitable<void> Sleep(milliseconds delay) {
  asio::steady_timer timer(co_await asio::this_coro::executor, delay);
  co_await timer.async_wait(asio::use_awaitable);
}

Result<std::unique_ptr<LuaPlugin>> Load(const std::string& src, MemoryReader memory,
                                        LuaLimits limits = {}) {
  return LuaPlugin::Load("p1", src, Json::object(), {"tool.after@v1"}, 100, limits, nullptr,
                         std::move(memory));
}

// A search that answers with one memory, after `delay` on a timer (the event loop runs on
// meanwhile), and counts the calls.
asio::awaitable<Result<Json>> FakeSearch(int* calls, milliseconds delay, std::string query,
                                         std::string tag, int limit) {
  ++*calls;
  if (delay.count()) co_await Sleep(delay);
  if (query == "bad OR") co_return InvalidArgument("OR at position 5 has no term after it");
  co_return Json::array({{{"id", "m1"},
                          {"text", query + "|" + tag + "|" + std::to_string(limit)},
                          {"tags", Json::array({"a"})},
                          {"score", 1.5}}});
}

asio::awaitable<Result<Json>> FakeGet(int* calls, std::string id) {
  ++*calls;
  if (id != "m1") co_return Json();
  co_return Json{{"id", "m1"}, {"text", "one"}, {"tags", Json::array()}};
}

MemoryReader FakeReader(int* calls, milliseconds delay = {}) {
  MemoryReader r;
  r.search = [calls, delay](std::string query, std::string tag, int limit) {
    return FakeSearch(calls, delay, std::move(query), std::move(tag), limit);
  };
  r.get = [calls](std::string id) { return FakeGet(calls, std::move(id)); };
  return r;
}

TEST(LuaMemory, SearchAndGetReturnPlainTables) {
  int calls = 0;
  auto p = Load(R"(
    ctx.bus.on("tool.after@v1", function(e)
      local hits = ctx.memory.search(e.q, {limit = 5, tag = "ops"})
      local first = hits[1]
      return {n = #hits, text = first.text, tag = first.tags[1], score = first.score,
              got = ctx.memory.get("m1").text, missing = ctx.memory.get("zz") == nil,
              default = ctx.memory.search("x")[1].text}
    end)
  )",
                FakeReader(&calls));
  ASSERT_TRUE(p.ok()) << p.status().message();
  auto r = Await((*p)->Call((*p)->hooks()[0].ref, {{"q", "kafka"}}));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, (Json{{"n", 1},
                      {"text", "kafka|ops|5"},
                      {"tag", "a"},
                      {"score", 1.5},
                      {"got", "one"},
                      {"missing", true},
                      {"default", "x||10"}}));
  EXPECT_EQ(calls, 4);
}

TEST(LuaMemory, ErrorsAreLuaErrorsThePluginMayCatch) {
  int calls = 0;
  auto p = Load(R"(
    ctx.bus.on("tool.after@v1", function(e)
      local ok, err = pcall(ctx.memory.search, e.q)
      local ok2, err2 = pcall(ctx.memory.search, "x", {limit = 1000})
      local ok3, err3 = pcall(ctx.memory.search, "x", {tag = 5})
      return {ok = ok, err = err, ok2 = ok2, err2 = err2, ok3 = ok3, err3 = err3}
    end)
  )",
                FakeReader(&calls));
  ASSERT_TRUE(p.ok()) << p.status().message();
  auto r = Await((*p)->Call((*p)->hooks()[0].ref, {{"q", "bad OR"}}));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)["ok"], false);
  EXPECT_NE((*r)["err"].get<std::string>().find("ctx.memory.search: OR at position 5"),
            std::string::npos)
      << *r;
  EXPECT_EQ((*r)["ok2"], false);
  EXPECT_NE((*r)["err2"].get<std::string>().find("limit must be between 1 and 100"),
            std::string::npos);
  EXPECT_EQ((*r)["ok3"], false);
  EXPECT_NE((*r)["err3"].get<std::string>().find("tag must be a string"), std::string::npos);
  EXPECT_EQ(calls, 1);  // the bad limit and tag never reached the store
}

TEST(LuaMemory, NotWhileLoadingNorWithoutAReader) {
  int calls = 0;
  auto loading = Load("ctx.memory.search('x')", FakeReader(&calls));
  ASSERT_FALSE(loading.ok());
  EXPECT_NE(loading.status().message().find("works only in handlers and tools"), std::string::npos)
      << loading.status().message();
  EXPECT_EQ(calls, 0);
  // A registration check loads the script without a reader: a handler then gets an error.
  auto none = Load("ctx.bus.on('tool.after@v1', function() return ctx.memory.get('m1') end)", {});
  ASSERT_TRUE(none.ok());
  auto r = Await((*none)->Call((*none)->hooks()[0].ref, Json::object()));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not available"), std::string::npos);
}

TEST(LuaMemory, CallsCountAgainstTheInstructionBudget) {
  int calls = 0;
  LuaLimits limits;
  limits.instructions = 100'000;  // ten calls' worth
  limits.wall_ms = 5'000;
  auto p = Load(R"(
    ctx.bus.on("tool.after@v1", function()
      while true do pcall(ctx.memory.search, "x") end
    end)
  )",
                FakeReader(&calls), limits);
  ASSERT_TRUE(p.ok()) << p.status().message();
  auto r = Await((*p)->Call((*p)->hooks()[0].ref, Json::object()));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("instruction budget"), std::string::npos)
      << r.status().message();
  EXPECT_LE(calls, 10);
}

// The wall clock is the call's own time: a read that waits longer than wall_ms (a slow store)
// does not stop the call, but the budgets still stop what the call does after it, and pcall
// cannot swallow that stop.
TEST(LuaMemory, TheWaitIsNotChargedToTheWallClockButWorkAfterItIs) {
  int calls = 0;
  LuaLimits limits;
  limits.instructions = 200'000;
  limits.wall_ms = 50;
  auto p = Load(R"(
    ctx.bus.on("tool.after@v1", function(e)
      local n = #ctx.memory.search("x") + #ctx.memory.search("y")
      if e.spin == "budget" then
        while true do pcall(function() while true do end end) end
      end
      return n
    end)
  )",
                FakeReader(&calls, milliseconds(120)), limits);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const int ref = (*p)->hooks()[0].ref;
  auto r = Await((*p)->Call(ref, {{"spin", "no"}}));
  ASSERT_TRUE(r.ok()) << r.status().message();  // 240 ms of reads under a 50 ms limit
  EXPECT_EQ(*r, 2);
  EXPECT_EQ(calls, 2);

  r = Await((*p)->Call(ref, {{"spin", "budget"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("instruction budget"), std::string::npos)
      << r.status().message();

  // The deadline moved out by the wait, not away: a loop after the reads runs its 50 ms.
  LuaLimits slow = limits;
  slow.instructions = int64_t{1} << 50;
  auto q = Load(R"(
    ctx.bus.on("tool.after@v1", function()
      ctx.memory.search("x")
      while true do pcall(string.find, "abc", "d") end
    end)
  )",
                FakeReader(&calls, milliseconds(120)), slow);
  ASSERT_TRUE(q.ok()) << q.status().message();
  const auto start = std::chrono::steady_clock::now();
  r = Await((*q)->Call((*q)->hooks()[0].ref, Json::object()));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("time limit"), std::string::npos) << r.status().message();
  EXPECT_GE(took, milliseconds(160));  // the read, then the call's own 50 ms
  EXPECT_LT(took, std::chrono::seconds(1));
  // The plugin's thread is made new after each stop: the next call runs.
  r = Await((*p)->Call(ref, {{"spin", "no"}}));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, 2);
}

// The runtime's readers (runtime/plugin_events.cc), on a real store.
asio::awaitable<Result<Json>> StoreSearch(store::Store& st, std::string tenant, std::string agent,
                                          std::string query, std::string tag, int limit) {
  Json hits;
  Status read = co_await store::AsyncRead(st, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(hits, memory::SearchJson(tx, tenant, agent, query, tag, limit));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  co_return hits;
}

asio::awaitable<Result<Json>> StoreGet(store::Store& st, std::string tenant, std::string agent,
                                       std::string id) {
  Json memory;
  Status read = co_await store::AsyncRead(st, [&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(memory, memory::GetJson(tx, tenant, agent, id));
    return Status::Ok();
  });
  if (!read.ok()) co_return read;
  co_return memory;
}

// Through the host, on a real store: each agent's copy of the plugin reads that agent's
// memories and no other's.
TEST(LuaMemory, AnAgentsPluginSeesOnlyThatAgentsMemories) {
  const auto dir = std::filesystem::temp_directory_path() / ("keel-luamem-" + NewId());
  std::filesystem::create_directories(dir);
  store::StoreOptions options;
  options.origin = "node-a";
  auto opened = store::OpenStore("sqlite://" + (dir / "keel.db").string(), options);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  store::Store& st = **opened;
  const std::string tenant = NewId();
  const std::string a = NewId(), b = NewId();
  ASSERT_TRUE(st.WriteSync([&](store::Tx& tx) -> Status {
                  KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant({tenant, "t", 1}));
                  for (const auto& [id, name] : {std::pair{a, "a"}, std::pair{b, "b"}}) {
                    store::Agent agent;
                    agent.id = id;
                    agent.tenant_id = tenant;
                    agent.name = name;
                    agent.model = "local";
                    agent.tools = Json::array();
                    agent.config = Json::object();
                    agent.status = "idle";
                    KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(agent));
                    for (const char* mid : {"first-", "own"}) {
                      auto m =
                          memory::MemoryFrom({{"text", std::string("secret plan of agent ") + name},
                                              {"id", std::string(mid) + name}},
                                             tenant, id, "api");
                      KEEL_RETURN_IF_ERROR(m.status());
                      KEEL_RETURN_IF_ERROR(memory::Upsert(tx, *m).status());
                    }
                  }
                  return Status::Ok();
                }).ok());

  MemoryReaders readers = [&st](const std::string& t, const std::string& agent) {
    MemoryReader r;
    r.search = [&st, t, agent](std::string q, std::string tag, int limit) {
      return StoreSearch(st, t, agent, std::move(q), std::move(tag), limit);
    };
    r.get = [&st, t, agent](std::string id) { return StoreGet(st, t, agent, std::move(id)); };
    return r;
  };
  PluginHost host((dir / "audit").string(), readers);
  store::Plugin plugin;
  plugin.tenant_id = tenant;
  plugin.id = "mem";
  plugin.kind = "lua";
  plugin.manifest = {{"id", "mem"},
                     {"name", "mem"},
                     {"version", "1"},
                     {"kind", "lua"},
                     {"events", {"tool.after@v1"}}};
  plugin.source = R"(
    ctx.tools.add{name = "probe", handler = function(args)
      local texts = {}
      for _, m in ipairs(ctx.memory.search(args.q, {limit = 10})) do texts[#texts + 1] = m.text end
      local other = ctx.memory.get(args.other)
      return {texts = texts, mine = ctx.memory.get(args.mine).text, other = other ~= nil}
    end}
  )";
  for (const auto& [agent, mine, theirs] :
       {std::tuple{a, "a", "ownb"}, std::tuple{b, "b", "owna"}}) {
    auto loaded = host.For(tenant, agent, {plugin});
    ASSERT_TRUE(loaded.errors.empty()) << loaded.errors[0].message;
    auto tool = loaded.plugins->tools.at("plugin__mem__probe");
    tools::ToolContext ctx;
    ctx.tenant_id = tenant;
    ctx.agent_id = agent;
    auto r = Await(tool->ExecuteOnLoop(
        ctx, {{"q", "secret plan"}, {"mine", std::string("own") + mine}, {"other", theirs}}));
    ASSERT_TRUE(r.ok()) << r.status().message();
    const std::string expected = std::string("secret plan of agent ") + mine;
    EXPECT_EQ((*r)["texts"], Json::array({expected, expected})) << *r;
    EXPECT_EQ((*r)["mine"], expected);
    EXPECT_EQ((*r)["other"], false);  // the other agent's memory, by its id: not there
  }
  opened->reset();
  std::filesystem::remove_all(dir);
}

// A read suspends the handler's call, not the event loop: another coroutine on the same
// io_context runs while the handler waits, and the handler then gets the reader's answer.
TEST(LuaMemory, AReadSuspendsTheCallNotTheEventLoop) {
  int calls = 0;
  auto p = Load(R"(
    ctx.bus.on("tool.after@v1", function(e) return ctx.memory.search(e.q)[1].text end)
  )",
                FakeReader(&calls, milliseconds(50)));
  ASSERT_TRUE(p.ok()) << p.status().message();
  asio::io_context io;
  const Json arg = {{"q", "kafka"}};
  auto call = asio::co_spawn(io, (*p)->Call((*p)->hooks()[0].ref, arg), asio::use_future);
  int ticks = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        while (call.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
          co_await Sleep(milliseconds(5));
          ++ticks;
        }
      },
      asio::detached);
  io.run();
  auto r = call.get();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "kafka||10");
  EXPECT_EQ(calls, 1);
  EXPECT_GE(ticks, 5);  // some ten 5 ms ticks while the read waited 50 ms
}

// Calls of one plugin take turns: while the first waits on a read, the second and third wait
// for it (in the order they came), each with budgets and a session of its own. Each call's
// loop spends some 60% of the instruction budget: a call charged with another's work fails.
TEST(LuaMemory, CallsOfOnePluginTakeTurnsWithBudgetsOfTheirOwn) {
  int calls = 0;
  LuaLimits limits;
  limits.instructions = 1'000'000;
  limits.wall_ms = 5'000;
  auto p = Load(R"(
    local seq, running = 0, false
    ctx.bus.on("tool.after@v1", function(e)
      if running then error("two calls at once") end
      running = true
      seq = seq + 1
      local mine, text = seq, ""
      if e.read then text = ctx.memory.search(e.q)[1].text end
      local x = 0
      for i = 1, 300000 do x = x + i end
      running = false
      return {seq = mine, session = ctx.session().id, text = text}
    end)
  )",
                FakeReader(&calls, milliseconds(50)), limits);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const int ref = (*p)->hooks()[0].ref;
  asio::io_context io;
  const Json args[] = {{{"read", true}, {"q", "first"}}, Json::object(), Json::object()};
  const Json sessions[] = {{{"id", "a"}}, {{"id", "b"}}, {{"id", "c"}}};
  std::vector<std::future<Result<Json>>> results;
  for (int i = 0; i < 3; ++i) {
    results.push_back(asio::co_spawn(io, (*p)->Call(ref, args[i], sessions[i]), asio::use_future));
  }
  io.run();
  const Json want[] = {{{"seq", 1}, {"session", "a"}, {"text", "first||10"}},
                       {{"seq", 2}, {"session", "b"}, {"text", ""}},
                       {{"seq", 3}, {"session", "c"}, {"text", ""}}};
  for (int i = 0; i < 3; ++i) {
    auto r = results[i].get();
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().message();
    EXPECT_EQ(*r, want[i]) << i;
  }
  EXPECT_EQ(calls, 1);
}

// Where Lua cannot yield (inside a library function's callback), ctx.memory says so, as a Lua
// error the plugin may catch, and the plugin goes on working.
TEST(LuaMemory, NotWhereLuaCannotYield) {
  int calls = 0;
  auto p = Load(R"(
    ctx.bus.on("tool.after@v1", function(e)
      local t = {3, 1, 2}
      if e.how == "sort" then
        table.sort(t, function(a, b) ctx.memory.search("x") return a < b end)
      elseif e.how == "pcall" then
        local ok, err = pcall(table.sort, t, function(a, b) ctx.memory.get("m1") return a < b end)
        return {ok = ok, err = err}
      end
      return ctx.memory.get("m1").text
    end)
  )",
                FakeReader(&calls));
  ASSERT_TRUE(p.ok()) << p.status().message();
  const int ref = (*p)->hooks()[0].ref;
  auto sorted = Await((*p)->Call(ref, {{"how", "sort"}}));
  ASSERT_FALSE(sorted.ok());
  EXPECT_NE(sorted.status().message().find(
                "ctx.memory.search cannot be called inside table.sort's comparator"),
            std::string::npos)
      << sorted.status().message();
  auto caught = Await((*p)->Call(ref, {{"how", "pcall"}}));
  ASSERT_TRUE(caught.ok()) << caught.status().message();
  EXPECT_EQ((*caught)["ok"], false);
  EXPECT_NE((*caught)["err"].get<std::string>().find("ctx.memory.get cannot be called inside"),
            std::string::npos)
      << *caught;
  EXPECT_EQ(calls, 0);
  auto plain = Await((*p)->Call(ref, {{"how", "plain"}}));
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(*plain, "one");
}

asio::awaitable<plugins::Emitted> EmitHolding(std::shared_ptr<AgentPlugins> plugins, Json payload) {
  co_return co_await plugins->bus.Emit("tool.after", std::move(payload));
}

// The plugin is dropped (the LuaPlugin directly, or the host's AgentPlugins with its tools)
// while calls wait on a read or for their turn: the calls own what they use, finish with the
// right answers, and nothing is used after it was freed (this test runs under ASan too).
TEST(LuaMemory, APluginDroppedWhileItsCallsWaitOutlivesThem) {
  int calls = 0;
  const char* source = R"(
    local function answer(e)
      if e.q then return {text = ctx.memory.search(e.q)[1].text} end
      return {text = "no read"}
    end
    ctx.bus.on("tool.after@v1", answer)
    ctx.tools.add{name = "probe", handler = answer}
  )";
  {
    auto loaded = Load(source, FakeReader(&calls, milliseconds(50)));
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    std::unique_ptr<LuaPlugin> plugin = std::move(*loaded);
    const int ref = plugin->hooks()[0].ref;
    asio::io_context io;
    const Json first = {{"q", "a"}}, second = Json::object();
    auto a = asio::co_spawn(io, plugin->Call(ref, first), asio::use_future);
    auto b = asio::co_spawn(io, plugin->Call(ref, second), asio::use_future);
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          co_await Sleep(milliseconds(10));
          plugin.reset();
        },
        asio::detached);
    io.run();
    EXPECT_FALSE(plugin);
    auto ra = a.get(), rb = b.get();
    ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status().message() << rb.status().message();
    EXPECT_EQ(*ra, (Json{{"text", "a||10"}}));
    EXPECT_EQ(*rb, (Json{{"text", "no read"}}));
  }

  PluginHost host("/nonexistent", [&calls](const std::string&, const std::string&) {
    return FakeReader(&calls, milliseconds(50));
  });
  store::Plugin plugin;
  plugin.tenant_id = "t";
  plugin.id = "mem";
  plugin.kind = "lua";
  plugin.manifest = {{"id", "mem"},
                     {"name", "mem"},
                     {"version", "1"},
                     {"kind", "lua"},
                     {"events", {"tool.after@v1"}}};
  plugin.source = source;
  auto loaded = host.For("t", "agent", {plugin});
  ASSERT_TRUE(loaded.errors.empty()) << loaded.errors[0].message;
  std::shared_ptr<tools::Tool> tool = loaded.plugins->tools.at("plugin__mem__probe");
  asio::io_context io;
  tools::ToolContext ctx;
  ctx.tenant_id = "t";
  ctx.agent_id = "agent";
  auto by_tool = asio::co_spawn(io, tool->ExecuteOnLoop(ctx, {{"q", "tool"}}), asio::use_future);
  auto by_hook = asio::co_spawn(io, EmitHolding(loaded.plugins, {{"q", "hook"}}), asio::use_future);
  bool forgotten = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await Sleep(milliseconds(10));
        tool.reset();
        loaded.plugins.reset();
        // The host's were the last references but the calls' own.
        forgotten = host.Forget("agent") != nullptr;
      },
      asio::detached);
  io.run();
  EXPECT_TRUE(forgotten);
  auto r = by_tool.get();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, (Json{{"text", "tool||10"}}));
  auto emitted = by_hook.get();
  EXPECT_TRUE(emitted.errors.empty());
}

}  // namespace
}  // namespace keel::plugins

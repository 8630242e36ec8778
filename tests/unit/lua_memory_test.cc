// ctx.memory, the Lua plugins' read-only view of their agent's memories: what it returns, that
// an agent's plugin sees that agent's memories only, that it cannot be used while loading, and
// that its calls count against the sandbox's budgets.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "keel/common/ids.h"
#include "keel/memory/memory.h"
#include "keel/plugins/host.h"
#include "keel/plugins/lua_plugin.h"
#include "keel/store/store.h"
#include "keel/tools/tool.h"

namespace keel::plugins {
namespace {

Result<std::unique_ptr<LuaPlugin>> Load(const std::string& src, MemoryReader memory,
                                        LuaLimits limits = {}) {
  return LuaPlugin::Load("p1", src, Json::object(), {"tool.after@v1"}, 100, limits, nullptr,
                         std::move(memory));
}

// A reader that answers every search with one memory and counts the calls.
MemoryReader FakeReader(int* calls, std::chrono::milliseconds delay = {}) {
  MemoryReader r;
  r.search = [calls, delay](const std::string& query, const std::string& tag,
                            int limit) -> Result<Json> {
    ++*calls;
    if (delay.count()) std::this_thread::sleep_for(delay);
    if (query == "bad OR") return InvalidArgument("OR at position 5 has no term after it");
    return Json::array({{{"id", "m1"},
                         {"text", query + "|" + tag + "|" + std::to_string(limit)},
                         {"tags", Json::array({"a"})},
                         {"score", 1.5}}});
  };
  r.get = [calls](const std::string& id) -> Result<Json> {
    ++*calls;
    if (id != "m1") return Json();
    return Json{{"id", "m1"}, {"text", "one"}, {"tags", Json::array()}};
  };
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
  auto r = (*p)->Call((*p)->hooks()[0].ref, {{"q", "kafka"}});
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
  auto r = (*p)->Call((*p)->hooks()[0].ref, {{"q", "bad OR"}});
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
  auto r = (*none)->Call((*none)->hooks()[0].ref, Json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not available"), std::string::npos);
}

TEST(LuaMemory, CallsCountAgainstTheInstructionBudgetAndTheWallClock) {
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
  auto r = (*p)->Call((*p)->hooks()[0].ref, Json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("instruction budget"), std::string::npos)
      << r.status().message();
  EXPECT_LE(calls, 10);

  calls = 0;
  limits.instructions = 100'000'000;
  limits.wall_ms = 50;
  auto slow = Load(R"(
    ctx.bus.on("tool.after@v1", function()
      for i = 1, 100 do pcall(ctx.memory.search, "x") end
    end)
  )",
                   FakeReader(&calls, std::chrono::milliseconds(30)), limits);
  ASSERT_TRUE(slow.ok());
  auto start = std::chrono::steady_clock::now();
  r = (*slow)->Call((*slow)->hooks()[0].ref, Json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("time limit"), std::string::npos) << r.status().message();
  EXPECT_LE(calls, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
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
    r.search = [&st, t, agent](const std::string& q, const std::string& tag,
                               int limit) -> Result<Json> {
      Json hits;
      KEEL_RETURN_IF_ERROR(st.Read([&](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(hits, memory::SearchJson(tx, t, agent, q, tag, limit));
        return Status::Ok();
      }));
      return hits;
    };
    r.get = [&st, t, agent](const std::string& id) -> Result<Json> {
      Json memory;
      KEEL_RETURN_IF_ERROR(st.Read([&](store::Tx& tx) -> Status {
        KEEL_ASSIGN_OR_RETURN(memory, memory::GetJson(tx, t, agent, id));
        return Status::Ok();
      }));
      return memory;
    };
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
    auto r = tool->Execute(
        ctx, {{"q", "secret plan"}, {"mine", std::string("own") + mine}, {"other", theirs}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    const std::string expected = std::string("secret plan of agent ") + mine;
    EXPECT_EQ((*r)["texts"], Json::array({expected, expected})) << *r;
    EXPECT_EQ((*r)["mine"], expected);
    EXPECT_EQ((*r)["other"], false);  // the other agent's memory, by its id: not there
  }
  opened->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace keel::plugins

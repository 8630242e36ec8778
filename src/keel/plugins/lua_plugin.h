#pragma once
// plugins::LuaPlugin — one Lua 5.4 plugin loaded for one agent, in a state of its own.
//
// The sandbox: only the base, table, string, math and utf8 libraries, without load, loadfile,
// dofile, require, collectgarbage, print, the raw* functions, get/setmetatable and string.dump.
// Budgets are checked between VM instructions, so no single library call may run long:
// string.find is plain and linear (no patterns: a backtracking pattern is one C call no budget
// can stop), match/gmatch/gsub are gone, and table.sort, table.move, table.insert and
// table.remove refuse work on more than 100,000 elements at once. Every call (the load itself,
// and each handler or tool call) runs under an instruction budget and a wall-clock limit (both
// checked every 250 instructions) and a cap on the memory it may add, within a cap on the
// whole state; exceeding one stops the call with an error the script's pcall cannot swallow.
// Library calls and large allocations are charged by their bytes and check the limits at once
// (one instruction can be a search over a 256 MiB string).
// Strings that come out are made valid UTF-8 (invalid bytes become U+FFFD).
//
// The script runs once at load with a global `ctx`:
//   ctx.plugin            {id = ...}
//   ctx.config            the plugin's config (a table)
//   ctx.bus.on(event, fn, {priority = N})   only while loading; event must be in the manifest
//   ctx.tools.add{name = ..., description = ..., schema = {...}, effect = "pure" |
//                 "idempotent" | "once", handler = fn}   only while loading
//   ctx.log.info(text), ctx.log.warn(text), ctx.log.error(text)
//   ctx.session()         during a call: a copy of the session the event belongs to
//   ctx.memory.search(query, {limit = N, tag = T}), ctx.memory.get(id)
//                         during a call: the plugin's own agent's memories, read only (through
//                         the MemoryReader its host gave it)
// It has no other way out: no files, no network, no store but that read-only view.
//
// A call runs in a Lua thread (a coroutine) of the state. A ctx.memory read does not block the
// event loop: the handler yields, Call awaits the reader (on PostgreSQL the read happens off the
// io thread), and the handler resumes with the answer. The wait is not charged to the call's
// wall clock; each read costs a fixed share of its instructions. A read can only be made where
// Lua can yield: not inside table.sort's comparator or another library call (a clear error).
//
// Threads: one event loop. Calls of one plugin take turns (first come, first served): a call
// that arrives while another is suspended on a memory read waits until that one has ended, so
// each call's budgets and ctx.session() are its own.

#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::plugins {

// ctx.memory: the read-only view of one agent's memories a host gives the plugin it loads for
// that agent. Both are awaited on the event loop by the plugin's suspended call; they take their
// inputs by value, so that the coroutine they return owns them (a target that captures state
// should call a coroutine function taking that state by value too: a capturing lambda that is
// itself a coroutine keeps its captures in the lambda, not in the coroutine).
struct MemoryReader {
  // A search's hits, best first (memory::HitJson objects), or the reason it failed (a bad
  // query, tag or limit).
  std::function<boost::asio::awaitable<Result<Json>>(std::string query, std::string tag, int limit)>
      search;
  // One memory (memory::MemoryJson), or null when the agent has none with that id.
  std::function<boost::asio::awaitable<Result<Json>>(std::string id)> get;
};

struct LuaLimits {
  int64_t instructions = 1'000'000;  // per call
  int64_t wall_ms = 250;             // per call
  size_t memory_bytes = 16u << 20;   // what one call may add to the state
  size_t state_bytes = 64u << 20;    // what the state may hold at all, across calls
};

class LuaPlugin {
 public:
  struct Hook {
    std::string event;  // "tool.before@v1"
    int priority = 100;
    int ref = 0;
  };
  struct ToolDef {
    std::string name;
    std::string description;
    Json schema;
    std::string effect;  // pure | idempotent | once
    int ref = 0;
  };
  // level: info | warn | error.
  using LogFn = std::function<void(const std::string& level, const std::string& text)>;

  // Runs `source` once in a fresh sandbox. kInvalidArgument when it does not compile, fails,
  // exceeds its limits, or subscribes to an event outside `events` (the manifest's).
  static Result<std::unique_ptr<LuaPlugin>> Load(std::string plugin_id, const std::string& source,
                                                 const Json& config,
                                                 std::vector<std::string> events,
                                                 int default_priority, LuaLimits limits,
                                                 LogFn log, MemoryReader memory = {});
  ~LuaPlugin();
  LuaPlugin(const LuaPlugin&) = delete;
  LuaPlugin& operator=(const LuaPlugin&) = delete;

  const std::vector<Hook>& hooks() const;
  const std::vector<ToolDef>& tools() const;

  // Calls a registered function with `arg`; `session` is what ctx.session() returns meanwhile.
  // A table result converts to JSON (an empty table is an array where `arg` had one); nil to
  // null. Errors name the plugin and what went wrong. It waits its turn behind the plugin's
  // other calls, and is suspended while the function waits on ctx.memory.
  // The call keeps the plugin's state alive until it ends, even if the LuaPlugin is destroyed
  // meanwhile. `session` is taken by value: a default argument's temporary would be gone by the
  // time a co_spawned call runs. REQUIRES: on the event loop; `arg` stays valid until it
  // completes.
  boost::asio::awaitable<Result<Json>> Call(int ref, const Json& arg, Json session = Json());

  size_t memory_in_use() const;

  struct Sandbox;  // internal

 private:
  LuaPlugin() = default;
  // Shared with the calls in progress, which must outlive neither the Lua state nor the reader.
  std::shared_ptr<Sandbox> sandbox_;
};

}  // namespace keel::plugins

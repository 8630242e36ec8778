#include "keel/plugins/lua_plugin.h"

#include <string.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <lua.hpp>
#include <optional>

#include "keel/common/io_work.h"
#include "keel/plugins/catalog.h"
#include "keel/tools/schema.h"

namespace keel::plugins {

namespace asio = boost::asio;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kHookEvery = 250;   // instructions between budget checks
constexpr lua_Integer kMaxBulk = 100'000;  // elements one table library call may touch
constexpr int kMaxDepth = 64;     // nesting of converted values
// Values in one Lua -> JSON conversion: a thousand-message prompt is some 5,000; the walk runs on
// the io thread, so the bound is what keeps a hostile value (one table shared 2^40 ways) short.
constexpr int64_t kMaxConvertedValues = 100'000;
constexpr size_t kMaxLogLine = 1024;
// What a ctx.memory call costs of the instruction budget, beyond the time it takes (which the
// wall clock counts): a handler that loops over searches runs out as a loop of work would.
constexpr int64_t kMemoryCallInstructions = 10'000;
// One VM instruction can be a library call over a 256 MiB string (string.find, utf8.len, a
// concatenation), which no count hook interrupts: such work is charged to the instruction
// budget by the bytes it reads or writes, one instruction per kBytesPerInstruction, and the
// budgets are checked before and after each library call and at each allocation of
// kChargedAllocation bytes or more. One call can then overrun the wall clock by the time one
// library call takes over the largest string the memory cap allows, not by hundreds of them.
constexpr int64_t kBytesPerInstruction = 64;
constexpr size_t kChargedAllocation = 64 * 1024;

}  // namespace

struct LuaPlugin::Sandbox {
  lua_State* L = nullptr;
  std::string plugin_id;
  LuaLimits limits;
  LogFn log;
  std::vector<std::string> events;
  int default_priority = 100;
  bool loading = false;
  // What the script registered while loading.
  std::vector<LuaPlugin::Hook> hooks;
  std::vector<LuaPlugin::ToolDef> tools;

  // Memory: what the state holds, and what it may hold during the current call.
  size_t used = 0;
  size_t cap = std::numeric_limits<size_t>::max();
  // Budget of the current call.
  int64_t remaining = std::numeric_limits<int64_t>::max();
  Clock::time_point deadline = Clock::time_point::max();
  // Set when the call ran out of a limit: the error is re-raised through pcall.
  std::string killed;
  Json session;
  MemoryReader memory;

  // Where calls run: a Lua thread anchored in the registry at `thread_ref`, made at load and
  // made again after a call that failed or was abandoned while suspended. (Not reset: a thread
  // whose count hook raised the stop keeps its hooks off, since lua_resetthread does not turn
  // them back on, and the next call's infinite loop would never be stopped.) Null when the
  // state had no room for a new one; the next call tries again.
  lua_State* thread = nullptr;
  int thread_ref = LUA_NOREF;
  // The ctx.memory read a suspended call yielded for (taken by Call), and the answer its
  // continuation pushes or raises.
  struct MemoryRead {
    const char* fn = "";  // "ctx.memory.search" | "ctx.memory.get": the errors' prefix
    bool search = false;
    std::string text;  // the query, or the id
    std::string tag;
    int limit = 0;
  };
  std::optional<MemoryRead> pending;
  MemoryRead answered;
  Result<Json> answer = Json();

  // The calls' turns: `busy` while one runs (suspended or not); the calls that wait, first
  // come first served, each on a timer the call before it cancels when it hands over.
  struct Waiter {
    explicit Waiter(asio::any_io_executor executor)
        : timer(std::move(executor), Clock::time_point::max()) {}
    asio::steady_timer timer;
    bool granted = false;
  };
  bool busy = false;
  std::deque<std::shared_ptr<Waiter>> waiting;

  ~Sandbox() {
    if (L) lua_close(L);
  }
};

namespace {

using Sandbox = LuaPlugin::Sandbox;

Sandbox* SandboxOf(lua_State* L) {
  void* ud = nullptr;
  lua_getallocf(L, &ud);
  return static_cast<Sandbox*>(ud);
}

// Takes `instructions` from the current call's budget and checks its limits; false (with
// `killed` set) once one ran out. Outside a call the budgets are unbounded.
bool Spend(Sandbox* sb, int64_t instructions) {
  sb->remaining -= instructions;
  if (sb->killed.empty()) {
    if (sb->remaining <= 0) {
      sb->killed = "exceeded its instruction budget";
    } else if (Clock::now() > sb->deadline) {
      sb->killed = "exceeded its time limit";
    }
  }
  return sb->killed.empty();
}

void* Alloc(void* ud, void* ptr, size_t osize, size_t nsize) {
  auto* sb = static_cast<Sandbox*>(ud);
  const size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    sb->used -= old;
    std::free(ptr);
    return nullptr;
  }
  // Refused: Lua collects garbage and tries again, then raises a memory error.
  if (nsize > old && (sb->used - old + nsize > sb->cap ||
                      sb->used - old + nsize > sb->limits.state_bytes)) {
    return nullptr;
  }
  // A large block is about to be filled: its bytes are work (a stop here is a memory error
  // that SafePcall and the caller report as the limit `killed` names).
  if (nsize >= old + kChargedAllocation &&
      !Spend(sb, static_cast<int64_t>((nsize - old) / kBytesPerInstruction))) {
    return nullptr;
  }
  void* p = std::realloc(ptr, nsize);
  if (p) sb->used = sb->used - old + nsize;
  return p;
}

void CountHook(lua_State* L, lua_Debug*) {
  if (!Spend(SandboxOf(L), kHookEvery)) luaL_error(L, "%s", SandboxOf(L)->killed.c_str());
}

// The bytes of the strings on the stack from `from` up.
int64_t StringBytes(lua_State* L, int from) {
  int64_t bytes = 0;
  for (int i = from, n = lua_gettop(L); i <= n; ++i) {
    if (lua_type(L, i) == LUA_TSTRING) bytes += static_cast<int64_t>(lua_rawlen(L, i));
  }
  return bytes;
}

// A library function (its upvalue) metered: its string arguments charged before it runs,
// its string results after (the memory cap bounded them).
int Metered(lua_State* L) {
  Sandbox* sb = SandboxOf(L);
  if (!Spend(sb, StringBytes(L, 1) / kBytesPerInstruction)) {
    return luaL_error(L, "%s", sb->killed.c_str());
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  if (!Spend(sb, StringBytes(L, 1) / kBytesPerInstruction)) {
    return luaL_error(L, "%s", sb->killed.c_str());
  }
  return lua_gettop(L);
}

// Replaces each C function of the table on top of the stack by its Metered closure.
void MeterFunctions(lua_State* L) {
  std::vector<std::string> names;
  lua_pushnil(L);
  while (lua_next(L, -2) != 0) {
    if (lua_type(L, -2) == LUA_TSTRING && lua_iscfunction(L, -1)) {
      names.emplace_back(lua_tostring(L, -2));
    }
    lua_pop(L, 1);
  }
  for (const auto& name : names) {
    lua_getfield(L, -1, name.c_str());
    lua_pushcclosure(L, Metered, 1);
    lua_setfield(L, -2, name.c_str());
  }
}

// pcall that cannot swallow a stop: once a limit is hit, the error goes on up. Yieldable (the
// function may wait on ctx.memory): lbaselib's pcall with its continuation, `finishpcall`, which
// runs both when the call returns at once and when it ends after a yield.
int FinishSafePcall(lua_State* L, int status, lua_KContext extra) {
  Sandbox* sb = SandboxOf(L);
  if (!sb->killed.empty()) return luaL_error(L, "%s", sb->killed.c_str());
  if (status == LUA_ERRMEM) return lua_error(L);  // the memory limit: no way around it either
  if (status != LUA_OK && status != LUA_YIELD) {
    lua_pushboolean(L, 0);
    lua_pushvalue(L, -2);  // the error
    return 2;
  }
  return lua_gettop(L) - static_cast<int>(extra);  // true and the function's results
}

int SafePcall(lua_State* L) {
  luaL_checkany(L, 1);
  lua_pushboolean(L, 1);  // the first result when nothing fails
  lua_insert(L, 1);
  int status = lua_pcallk(L, lua_gettop(L) - 2, LUA_MULTRET, 0, 0, FinishSafePcall);
  return FinishSafePcall(L, status, 0);
}

// string.find without patterns: (s, needle [, init]) -> start, end | nil.
int PlainFind(lua_State* L) {
  size_t n = 0, m = 0;
  const char* s = luaL_checklstring(L, 1, &n);
  const char* needle = luaL_checklstring(L, 2, &m);
  lua_Integer init = luaL_optinteger(L, 3, 1);
  if (init < 0) init = std::max<lua_Integer>(1, static_cast<lua_Integer>(n) + init + 1);
  if (init < 1) init = 1;
  if (static_cast<size_t>(init) > n + 1) {
    lua_pushnil(L);
    return 1;
  }
  const char* first = s + init - 1;
  // glibc's memmem is linear in the worst case (two-way); a naive search is quadratic.
  const void* hit = m == 0 ? first : ::memmem(first, n - (init - 1), needle, m);
  if (!hit) {
    lua_pushnil(L);
    return 1;
  }
  size_t at = static_cast<size_t>(static_cast<const char*>(hit) - first);
  lua_pushinteger(L, static_cast<lua_Integer>(init + at));
  lua_pushinteger(L, static_cast<lua_Integer>(init + at + m - 1));
  return 2;
}

// string.rep, without its one unbounded loop: the result's buffer is allocated first (so the
// memory cap stops a large result before any copying), except that an empty string repeated
// 1e15 times loops 1e15 times copying nothing. That case is answered here.
int EmptySafeRep(lua_State* L) {
  size_t l = 0, lsep = 0;
  luaL_checklstring(L, 1, &l);
  luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (l == 0 && lsep == 0) {
    lua_pushliteral(L, "");
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

// The table library's bulk operations, bounded: a call that touches more than kMaxBulk elements
// is one C loop no instruction budget can interrupt.
int Bounded(lua_State* L, const char* name, lua_Integer span) {
  if (span > kMaxBulk) {
    return luaL_error(L, "table.%s: more than %d elements at once (a sandbox limit)", name,
                      static_cast<int>(kMaxBulk));
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}
int BoundedSort(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  return Bounded(L, "sort", luaL_len(L, 1));
}
int BoundedMove(lua_State* L) {
  lua_Integer f = luaL_checkinteger(L, 2);
  lua_Integer e = luaL_checkinteger(L, 3);
  return Bounded(L, "move", e >= f ? e - f : 0);
}
int BoundedInsert(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = luaL_len(L, 1);
  lua_Integer pos = lua_gettop(L) >= 3 ? luaL_checkinteger(L, 2) : n + 1;
  return Bounded(L, "insert", n - pos);
}
int BoundedRemove(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = luaL_len(L, 1);
  lua_Integer pos = luaL_optinteger(L, 2, n);
  return Bounded(L, "remove", n - pos);
}

// Lua strings are bytes; what leaves the sandbox is valid UTF-8 (an invalid byte becomes
// U+FFFD), as everything Keel stores must be.
std::string ValidUtf8(const char* s, size_t n) {
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    }
    if (ok && len > 1) {  // no overlong forms, surrogates or values past U+10FFFF
      uint32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      ok = !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && cp < 0x10000) &&
           !(cp >= 0xD800 && cp <= 0xDFFF) && cp <= 0x10FFFF;
    }
    if (ok) {
      out.append(s + i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

// JSON -> Lua (null becomes nil).
void Push(lua_State* L, const Json& j, int depth = 0) {
  luaL_checkstack(L, 4, "nesting");
  if (depth > kMaxDepth) luaL_error(L, "a value nests deeper than %d levels", kMaxDepth);
  switch (j.type()) {
    case Json::value_t::null:
    case Json::value_t::discarded:
      lua_pushnil(L);
      return;
    case Json::value_t::boolean:
      lua_pushboolean(L, j.get<bool>());
      return;
    case Json::value_t::number_integer:
      lua_pushinteger(L, j.get<int64_t>());
      return;
    case Json::value_t::number_unsigned:
      lua_pushinteger(L, static_cast<lua_Integer>(j.get<uint64_t>()));
      return;
    case Json::value_t::number_float:
      lua_pushnumber(L, j.get<double>());
      return;
    case Json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      lua_pushlstring(L, s.data(), s.size());
      return;
    }
    case Json::value_t::array: {
      lua_createtable(L, static_cast<int>(j.size()), 0);
      lua_Integer i = 1;
      for (const auto& v : j) {
        Push(L, v, depth + 1);
        lua_rawseti(L, -2, i++);
      }
      return;
    }
    case Json::value_t::object: {
      lua_createtable(L, 0, static_cast<int>(j.size()));
      for (auto it = j.begin(); it != j.end(); ++it) {
        Push(L, it.value(), depth + 1);
        lua_setfield(L, -2, it.key().c_str());
      }
      return;
    }
    case Json::value_t::binary:
      lua_pushnil(L);
      return;
  }
}

// A Lua value is a graph, not a tree: a table may hold itself, or the same table many times, so
// a walk bounded by depth alone may still visit 2^64 values (t = {t, t}) in one C call no
// instruction budget interrupts. The walk refuses a table on its own path and counts values.
struct ToJsonWalk {
  int64_t values_left = kMaxConvertedValues;
  std::vector<const void*> path;  // the tables being converted, outermost first
};

Result<Json> ToJsonAt(lua_State* L, int index, const Json* hint, int depth, ToJsonWalk& walk);
Result<Json> TableToJson(lua_State* L, int index, const Json* hint, int depth, ToJsonWalk& walk);

// Lua -> JSON. `hint` is the value this one replaces, if any: an empty table becomes an array
// where the hint was one.
Result<Json> ToJson(lua_State* L, int index, const Json* hint) {
  ToJsonWalk walk;
  return ToJsonAt(L, index, hint, 0, walk);
}

Result<Json> ToJsonAt(lua_State* L, int index, const Json* hint, int depth, ToJsonWalk& walk) {
  if (depth > kMaxDepth) return InvalidArgument("a value nests deeper than 64 levels");
  if (--walk.values_left < 0) {
    return InvalidArgument("a value holds more than " + std::to_string(kMaxConvertedValues) +
                           " values, the limit");
  }
  index = lua_absindex(L, index);
  switch (lua_type(L, index)) {
    case LUA_TNIL:
      return Json();
    case LUA_TBOOLEAN:
      return Json(static_cast<bool>(lua_toboolean(L, index)));
    case LUA_TNUMBER:
      if (lua_isinteger(L, index)) return Json(static_cast<int64_t>(lua_tointeger(L, index)));
      {
        double d = lua_tonumber(L, index);
        return std::isfinite(d) ? Json(d) : Json();
      }
    case LUA_TSTRING: {
      size_t n = 0;
      const char* s = lua_tolstring(L, index, &n);
      return Json(ValidUtf8(s, n));
    }
    case LUA_TTABLE: {
      if (!lua_checkstack(L, 4)) return InvalidArgument("a value nests too deep");
      const void* self = lua_topointer(L, index);
      if (std::find(walk.path.begin(), walk.path.end(), self) != walk.path.end()) {
        return InvalidArgument("a table contains itself, which JSON cannot hold");
      }
      walk.path.push_back(self);
      auto out = TableToJson(L, index, hint, depth, walk);
      walk.path.pop_back();
      return out;
    }
    default:
      return InvalidArgument(std::string("a ") + luaL_typename(L, index) +
                             " cannot be turned into JSON");
  }
}

// ToJsonAt for the table at `index` (absolute).
Result<Json> TableToJson(lua_State* L, int index, const Json* hint, int depth, ToJsonWalk& walk) {
  // An array when its keys are exactly 1..n.
  lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, index));
  size_t keys = 0;
  bool only_strings_or_ints = true;
  lua_pushnil(L);
  while (lua_next(L, index) != 0) {
    ++keys;
    int kt = lua_type(L, -2);
    if (kt != LUA_TSTRING && !(kt == LUA_TNUMBER && lua_isinteger(L, -2))) {
      only_strings_or_ints = false;
    }
    lua_pop(L, 1);
  }
  if (!only_strings_or_ints) return InvalidArgument("a table key is neither a string nor an integer");
  if (keys == 0) {
    return hint && hint->is_array() ? Json::array() : Json::object();
  }
  if (n > 0 && static_cast<size_t>(n) == keys) {
    Json out = Json::array();
    for (lua_Integer i = 1; i <= n; ++i) {
      lua_rawgeti(L, index, i);
      const Json* h = hint && hint->is_array() && static_cast<size_t>(i - 1) < hint->size()
                          ? &(*hint)[i - 1] : nullptr;
      auto v = ToJsonAt(L, -1, h, depth + 1, walk);
      lua_pop(L, 1);
      if (!v.ok()) return v.status();
      out.push_back(std::move(*v));
    }
    return out;
  }
  Json out = Json::object();
  lua_pushnil(L);
  while (lua_next(L, index) != 0) {
    std::string key;
    if (lua_type(L, -2) == LUA_TSTRING) {
      size_t kn = 0;
      const char* k = lua_tolstring(L, -2, &kn);
      key = ValidUtf8(k, kn);
    } else {
      key = std::to_string(lua_tointeger(L, -2));
    }
    const Json* h = hint && hint->is_object() && hint->contains(key) ? &(*hint)[key] : nullptr;
    auto v = ToJsonAt(L, -1, h, depth + 1, walk);
    lua_pop(L, 1);
    if (!v.ok()) {
      lua_pop(L, 1);
      return v.status();
    }
    if (!v->is_null()) out[key] = std::move(*v);
  }
  return out;
}

int LogAt(lua_State* L, const char* level) {
  Sandbox* sb = SandboxOf(L);
  size_t n = 0;
  const char* s = luaL_tolstring(L, 1, &n);
  std::string text(s, std::min(n, kMaxLogLine));
  lua_pop(L, 1);
  if (sb->log) sb->log(level, text);
  return 0;
}
int LogInfoFn(lua_State* L) { return LogAt(L, "info"); }
int LogWarnFn(lua_State* L) { return LogAt(L, "warn"); }
int LogErrorFn(lua_State* L) { return LogAt(L, "error"); }

// Puts a new call thread in the registry at thread_ref; it inherits the state's count hook.
// Inside lua_pcall on the main thread: it allocates, and the state may be full.
int RenewThread(lua_State* L) {
  Sandbox* sb = SandboxOf(L);
  lua_State* thread = lua_newthread(L);
  lua_rawseti(L, LUA_REGISTRYINDEX, sb->thread_ref);
  sb->thread = thread;
  return 0;
}

// Whether the sandbox has a call thread, made anew when it has none. REQUIRES: no call runs.
bool HasThread(Sandbox* sb) {
  if (sb->thread) return true;
  lua_pushcfunction(sb->L, RenewThread);
  if (lua_pcall(sb->L, 0, 0, 0) != LUA_OK) lua_pop(sb->L, 1);
  return sb->thread != nullptr;
}

int CallReturned(lua_State*, int, lua_KContext) { return 1; }

// The body of a call's Lua thread, so that pushing the payload (which may run out of memory) is
// protected too: upvalue-free; the function ref and the payload come as light userdata. The
// function may yield (lua_callk).
int CallTrampoline(lua_State* L) {
  int ref = static_cast<int>(lua_tointeger(L, 1));
  const Json* arg = static_cast<const Json*>(lua_touserdata(L, 2));
  lua_settop(L, 0);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  Push(L, *arg);
  lua_callk(L, 1, 1, 0, CallReturned);
  return 1;
}

int SessionFn(lua_State* L) {
  Push(L, SandboxOf(L)->session);
  return 1;
}

// Charges a ctx.memory call to the budgets: refused while loading, or when the call's
// instructions or time have run out.
void StartMemoryCall(lua_State* L, const char* fn) {
  Sandbox* sb = SandboxOf(L);
  if (sb->loading) {
    luaL_error(L, "%s works only in handlers and tools, not while the plugin loads", fn);
  }
  if (!Spend(sb, kMemoryCallInstructions)) luaL_error(L, "%s", sb->killed.c_str());
}

// The continuation of a ctx.memory call once Call has its answer: the answer, or its error.
int MemoryAnswered(lua_State* L, int, lua_KContext) {
  Sandbox* sb = SandboxOf(L);
  Result<Json> answer = std::move(sb->answer);
  sb->answer = Json();
  if (!answer.ok()) {
    return luaL_error(L, "%s: %s", sb->answered.fn, answer.status().message().c_str());
  }
  Push(L, *answer);
  return 1;
}

// Suspends the call until Call has read `read` (the answer comes through MemoryAnswered).
int YieldForMemory(lua_State* L, Sandbox::MemoryRead read) {
  if (!lua_isyieldable(L)) {
    return luaL_error(L,
                      "%s cannot be called inside table.sort's comparator, a metamethod or "
                      "another library call",
                      read.fn);
  }
  SandboxOf(L)->pending = std::move(read);
  return lua_yieldk(L, 0, 0, MemoryAnswered);
}

// ctx.memory.search(query [, {limit = N, tag = T}]) -> a sequence of memories, best first.
int MemorySearchFn(lua_State* L) {
  StartMemoryCall(L, "ctx.memory.search");
  Sandbox* sb = SandboxOf(L);
  size_t n = 0;
  const char* text = luaL_checklstring(L, 1, &n);
  std::string query(text, n);
  std::string tag;
  lua_Integer limit = 10;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "limit");
    if (!lua_isnil(L, -1)) {
      if (!lua_isinteger(L, -1)) {
        return luaL_error(L, "ctx.memory.search: limit must be an integer");
      }
      limit = lua_tointeger(L, -1);
    }
    lua_getfield(L, 2, "tag");
    if (!lua_isnil(L, -1)) {
      if (lua_type(L, -1) != LUA_TSTRING) {
        return luaL_error(L, "ctx.memory.search: tag must be a string");
      }
      const char* t = lua_tolstring(L, -1, &n);
      tag.assign(t, n);
    }
    lua_pop(L, 2);
  }
  if (limit < 1 || limit > 100) {
    return luaL_error(L, "ctx.memory.search: limit must be between 1 and 100");
  }
  if (!sb->memory.search) return luaL_error(L, "ctx.memory is not available to this plugin");
  return YieldForMemory(
      L, {"ctx.memory.search", true, std::move(query), std::move(tag), static_cast<int>(limit)});
}

// ctx.memory.get(id) -> the memory, or nil.
int MemoryGetFn(lua_State* L) {
  StartMemoryCall(L, "ctx.memory.get");
  Sandbox* sb = SandboxOf(L);
  size_t n = 0;
  const char* id = luaL_checklstring(L, 1, &n);
  if (!sb->memory.get) return luaL_error(L, "ctx.memory is not available to this plugin");
  return YieldForMemory(L, {"ctx.memory.get", false, std::string(id, n), "", 0});
}

int BusOn(lua_State* L) {
  Sandbox* sb = SandboxOf(L);
  if (!sb->loading) return luaL_error(L, "ctx.bus.on works only while the plugin loads");
  std::string event = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (!FindEvent(event)) return luaL_error(L, "ctx.bus.on: unknown event '%s'", event.c_str());
  if (std::find(sb->events.begin(), sb->events.end(), event) == sb->events.end()) {
    return luaL_error(L, "ctx.bus.on: '%s' is not among the manifest's events", event.c_str());
  }
  int priority = sb->default_priority;
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "priority");
    if (!lua_isnil(L, -1)) {
      if (!lua_isinteger(L, -1)) return luaL_error(L, "ctx.bus.on: priority must be an integer");
      priority = static_cast<int>(lua_tointeger(L, -1));
    }
    lua_pop(L, 1);
  }
  lua_pushvalue(L, 2);
  int ref = luaL_ref(L, LUA_REGISTRYINDEX);
  sb->hooks.push_back({event, priority, ref});
  return 0;
}

// 1 to 64 of a-z, 0-9, '_' and '-', starting with a letter or digit.
bool IsToolName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '_' && c != '-'))) return false;
  }
  return true;
}

int ToolsAdd(lua_State* L) {
  Sandbox* sb = SandboxOf(L);
  if (!sb->loading) return luaL_error(L, "ctx.tools.add works only while the plugin loads");
  luaL_checktype(L, 1, LUA_TTABLE);
  LuaPlugin::ToolDef def;
  lua_getfield(L, 1, "name");
  if (!lua_isstring(L, -1)) return luaL_error(L, "ctx.tools.add: name must be a string");
  def.name = lua_tostring(L, -1);
  lua_pop(L, 1);
  if (!IsToolName(def.name)) {
    return luaL_error(L, "ctx.tools.add: name must be 1 to 64 of a-z, 0-9, '_' and '-'");
  }
  lua_getfield(L, 1, "description");
  def.description = lua_isstring(L, -1) ? lua_tostring(L, -1) : "";
  lua_pop(L, 1);
  lua_getfield(L, 1, "effect");
  def.effect = lua_isstring(L, -1) ? lua_tostring(L, -1) : "pure";
  lua_pop(L, 1);
  if (def.effect != "pure" && def.effect != "idempotent" && def.effect != "once") {
    return luaL_error(L, "ctx.tools.add: effect must be pure, idempotent or once");
  }
  lua_getfield(L, 1, "schema");
  if (lua_istable(L, -1)) {
    Json object = Json::object();
    auto schema = ToJson(L, -1, &object);
    if (!schema.ok() || !schema->is_object()) {
      return luaL_error(L, "ctx.tools.add: schema must be a JSON Schema object");
    }
    if (Status valid = tools::CheckSchema(*schema, "schema"); !valid.ok()) {
      return luaL_error(L, "ctx.tools.add: %s", valid.message().c_str());
    }
    def.schema = *schema;
  } else {
    def.schema = {{"type", "object"}};
  }
  lua_pop(L, 1);
  lua_getfield(L, 1, "handler");
  if (!lua_isfunction(L, -1)) return luaL_error(L, "ctx.tools.add: handler must be a function");
  def.ref = luaL_ref(L, LUA_REGISTRYINDEX);
  for (const auto& t : sb->tools) {
    if (t.name == def.name) return luaL_error(L, "ctx.tools.add: '%s' twice", def.name.c_str());
  }
  sb->tools.push_back(std::move(def));
  return 0;
}

void SetFunctions(lua_State* L, const luaL_Reg* fns) {
  lua_newtable(L);
  luaL_setfuncs(L, fns, 0);
}

// Opens the allowed libraries and takes out what could reach beyond the sandbox.
void OpenSandbox(lua_State* L) {
  luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
  luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
  luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
  luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
  luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
  lua_pop(L, 5);
  for (const char* name : {"load", "loadfile", "dofile", "require", "collectgarbage", "print",
                           "rawget", "rawset", "rawequal", "rawlen", "getmetatable",
                           "setmetatable", "xpcall"}) {
    lua_pushnil(L);
    lua_setglobal(L, name);
  }
  lua_pushcfunction(L, SafePcall);
  lua_setglobal(L, "pcall");
  lua_getglobal(L, LUA_STRLIBNAME);
  for (const char* name : {"match", "gmatch", "gsub", "dump"}) {
    lua_pushnil(L);
    lua_setfield(L, -2, name);
  }
  lua_pushcfunction(L, PlainFind);
  lua_setfield(L, -2, "find");
  lua_getfield(L, -1, "rep");  // the library's own function, as the wrapper's upvalue
  lua_pushcclosure(L, EmptySafeRep, 1);
  lua_setfield(L, -2, "rep");
  lua_pop(L, 1);
  lua_getglobal(L, LUA_TABLIBNAME);
  const std::pair<const char*, lua_CFunction> bounded[] = {
      {"sort", BoundedSort}, {"move", BoundedMove}, {"insert", BoundedInsert},
      {"remove", BoundedRemove}};
  for (const auto& [name, fn] : bounded) {
    lua_getfield(L, -1, name);       // the library's own function, as the wrapper's upvalue
    lua_pushcclosure(L, fn, 1);
    lua_setfield(L, -2, name);
  }
  lua_pop(L, 1);
  for (const char* lib : {LUA_STRLIBNAME, LUA_UTF8LIBNAME, LUA_TABLIBNAME}) {
    lua_getglobal(L, lib);
    MeterFunctions(L);
    lua_pop(L, 1);
  }
  lua_pushglobaltable(L);
  for (const char* name : {"tostring", "tonumber"}) {
    lua_getfield(L, -1, name);
    lua_pushcclosure(L, Metered, 1);
    lua_setfield(L, -2, name);
  }
  lua_pop(L, 1);
  // math.random is fine (no I/O); its seed comes from the runtime.
}

}  // namespace

Result<std::unique_ptr<LuaPlugin>> LuaPlugin::Load(std::string plugin_id, const std::string& source,
                                                   const Json& config,
                                                   std::vector<std::string> events,
                                                   int default_priority, LuaLimits limits,
                                                   LogFn log, MemoryReader memory) {
  std::unique_ptr<LuaPlugin> plugin(new LuaPlugin());
  plugin->sandbox_ = std::make_shared<Sandbox>();
  Sandbox* sb = plugin->sandbox_.get();
  sb->plugin_id = std::move(plugin_id);
  sb->limits = limits;
  sb->log = std::move(log);
  sb->memory = std::move(memory);
  sb->events = std::move(events);
  sb->default_priority = default_priority;
  sb->L = lua_newstate(Alloc, sb);
  if (!sb->L) return Internal("could not create a Lua state");
  lua_State* L = sb->L;
  lua_sethook(L, CountHook, LUA_MASKCOUNT, kHookEvery);
  OpenSandbox(L);

  // ctx
  lua_newtable(L);
  lua_newtable(L);
  lua_pushstring(L, sb->plugin_id.c_str());
  lua_setfield(L, -2, "id");
  lua_setfield(L, -2, "plugin");
  Push(L, config.is_object() ? config : Json::object());
  lua_setfield(L, -2, "config");
  static const luaL_Reg kBus[] = {{"on", BusOn}, {nullptr, nullptr}};
  SetFunctions(L, kBus);
  lua_setfield(L, -2, "bus");
  static const luaL_Reg kTools[] = {{"add", ToolsAdd}, {nullptr, nullptr}};
  SetFunctions(L, kTools);
  lua_setfield(L, -2, "tools");
  static const luaL_Reg kLog[] = {
      {"info", LogInfoFn}, {"warn", LogWarnFn}, {"error", LogErrorFn}, {nullptr, nullptr}};
  SetFunctions(L, kLog);
  lua_setfield(L, -2, "log");
  lua_pushcfunction(L, SessionFn);
  lua_setfield(L, -2, "session");
  static const luaL_Reg kMemory[] = {
      {"search", MemorySearchFn}, {"get", MemoryGetFn}, {nullptr, nullptr}};
  SetFunctions(L, kMemory);
  lua_setfield(L, -2, "memory");
  lua_setglobal(L, "ctx");

  if (luaL_loadbufferx(L, source.data(), source.size(), ("=" + sb->plugin_id).c_str(), "t") !=
      LUA_OK) {
    std::string error = lua_tostring(L, -1) ? lua_tostring(L, -1) : "?";
    return InvalidArgument("the plugin's Lua source does not compile: " + error);
  }
  sb->loading = true;
  sb->killed.clear();
  sb->remaining = limits.instructions;
  sb->deadline = Clock::now() + std::chrono::milliseconds(limits.wall_ms);
  sb->cap = sb->used + limits.memory_bytes;
  int status = lua_pcall(L, 0, 0, 0);
  sb->loading = false;
  sb->cap = std::numeric_limits<size_t>::max();
  sb->remaining = std::numeric_limits<int64_t>::max();
  sb->deadline = Clock::time_point::max();
  if (status != LUA_OK) {
    std::string error = !sb->killed.empty()       ? sb->killed
                        : status == LUA_ERRMEM    ? "exceeded its memory limit"
                        : lua_tostring(L, -1)     ? lua_tostring(L, -1)
                                                  : "an error that is not a string";
    return InvalidArgument("the plugin failed while loading: " + error);
  }
  lua_settop(L, 0);
  lua_pushboolean(L, 1);  // the call thread's place in the registry
  sb->thread_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (!HasThread(sb)) return Internal("could not create a Lua thread");
  return plugin;
}

LuaPlugin::~LuaPlugin() = default;

const std::vector<LuaPlugin::Hook>& LuaPlugin::hooks() const { return sandbox_->hooks; }
const std::vector<LuaPlugin::ToolDef>& LuaPlugin::tools() const { return sandbox_->tools; }

size_t LuaPlugin::memory_in_use() const { return sandbox_->used; }

namespace {

// A call's turn at its sandbox: Take waits until the calls before it have ended; the turn
// passes to the next waiting call when this one ends, however it ends (its coroutine may be
// destroyed while it waits or while it holds the turn).
class Turn {
 public:
  explicit Turn(Sandbox& sb) : sb_(sb) {}
  ~Turn() {
    if (waiter_ && !waiter_->granted) {
      std::erase(sb_.waiting, waiter_);
    } else if (held_ || waiter_) {
      Pass();
    }
  }
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;

  asio::awaitable<void> Take() {
    if (sb_.busy) {
      waiter_ = std::make_shared<Sandbox::Waiter>(co_await asio::this_coro::executor);
      sb_.waiting.push_back(waiter_);
      IoWorkPause paused;  // the call before this one runs meanwhile
      while (!waiter_->granted) {
        co_await waiter_->timer.async_wait(asio::as_tuple(asio::use_awaitable));
      }
      waiter_.reset();
    }
    sb_.busy = true;
    held_ = true;
  }

 private:
  void Pass() {
    if (sb_.waiting.empty()) {
      sb_.busy = false;
      return;
    }
    auto next = std::move(sb_.waiting.front());
    sb_.waiting.pop_front();
    next->granted = true;  // busy stays: the turn is the next call's
    next->timer.cancel();
  }

  Sandbox& sb_;
  std::shared_ptr<Sandbox::Waiter> waiter_;
  bool held_ = false;
};

}  // namespace

asio::awaitable<Result<Json>> LuaPlugin::Call(int ref, const Json& arg, Json session) {
  // The frame owns the sandbox: the LuaPlugin may be destroyed while this call is suspended.
  const std::shared_ptr<Sandbox> owned = sandbox_;
  Sandbox* sb = owned.get();
  Turn turn(*sb);
  co_await turn.Take();
  if (!HasThread(sb)) co_return InvalidArgument("plugin " + sb->plugin_id + ": its state is full");
  lua_State* co = sb->thread;
  sb->session = std::move(session);
  sb->killed.clear();
  sb->remaining = sb->limits.instructions;
  sb->deadline = Clock::now() + std::chrono::milliseconds(sb->limits.wall_ms);
  sb->cap = sb->used + sb->limits.memory_bytes;
  struct Reset {
    Sandbox* sb;
    ~Reset() {
      sb->cap = std::numeric_limits<size_t>::max();
      sb->remaining = std::numeric_limits<int64_t>::max();
      sb->deadline = Clock::time_point::max();
      sb->session = Json();
      sb->pending.reset();
      sb->answer = Json();
      // A thread that failed, or was left suspended, is dropped for a new one (see thread).
      if (lua_status(sb->thread) == LUA_OK) {
        lua_settop(sb->thread, 0);
      } else {
        sb->thread = nullptr;
        HasThread(sb);
      }
    }
  } reset{sb};
  // Pushing a C function and two plain values needs no allocation (the stack is empty).
  lua_pushcfunction(co, CallTrampoline);
  lua_pushinteger(co, ref);
  lua_pushlightuserdata(co, const_cast<Json*>(&arg));
  int nargs = 2;
  int status = LUA_OK;
  for (;;) {
    int nresults = 0;
    status = lua_resume(co, nullptr, nargs, &nresults);
    if (status != LUA_YIELD) break;
    lua_pop(co, nresults);
    nargs = 0;
    if (!sb->pending) {  // nothing in the sandbox yields but ctx.memory
      co_return Internal("plugin " + sb->plugin_id + ": yielded outside ctx.memory");
    }
    sb->answered = std::move(*sb->pending);
    sb->pending.reset();
    const Sandbox::MemoryRead& read = sb->answered;
    // The wait is the store's time, not the call's: its deadline moves out by it.
    const auto waited_from = Clock::now();
    Result<Json> answer = Json();
    {
      IoWorkPause paused;  // other work holds the io thread meanwhile
      try {
        // Named, not a temporary of the co_await: g++ 12 mishandles temporaries there.
        asio::awaitable<Result<Json>> reading =
            read.search ? sb->memory.search(read.text, read.tag, read.limit)
                        : sb->memory.get(read.text);
        answer = co_await std::move(reading);
      } catch (const std::exception& e) {
        answer = Internal(std::string("the read threw: ") + e.what());
      }
    }
    sb->deadline += Clock::now() - waited_from;
    sb->answer = std::move(answer);
  }
  if (status != LUA_OK) {
    std::string error = !sb->killed.empty()    ? sb->killed
                        : status == LUA_ERRMEM ? "exceeded its memory limit"
                        : lua_tostring(co, -1) ? lua_tostring(co, -1)
                                               : "an error that is not a string";
    co_return InvalidArgument("plugin " + sb->plugin_id + ": " + error);
  }
  auto out = ToJson(co, -1, &arg);
  if (!out.ok()) {
    co_return InvalidArgument("plugin " + sb->plugin_id + ": " + out.status().message());
  }
  co_return out;
}

}  // namespace keel::plugins

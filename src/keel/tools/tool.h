#pragma once
// Tools: what an agent can do outside the model. Each tool declares its effect class
// (DESIGN.md invariant 5) and the rights it needs; only tools::Gateway executes them.

#include <boost/asio/awaitable.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::store {
class Store;
}

namespace keel::tools {

enum class EffectClass { kPure, kIdempotent, kOnce };
const char* EffectClassName(EffectClass c);

// What a tool may use while it executes.
struct ToolContext {
  std::string tenant_id;
  std::string agent_id;
  std::string session_id;
  std::string run_id;
  std::string call_id;
  std::string effect_key;  // stable across retries of the same call
  std::string workspace;   // the agent's workspace directory (created on demand)
  Json agent_config;       // the agent's config (e.g. exec_backend)
};

class Tool {
 public:
  virtual ~Tool() = default;
  virtual std::string name() const = 0;  // dotted: "notes.append"
  virtual std::string description() const = 0;
  virtual Json parameters() const = 0;  // JSON Schema of the arguments
  virtual EffectClass effect_class() const = 0;
  virtual std::vector<std::string> rights() const = 0;  // read | write | send
  // Runs the tool. A failure is reported to the model as the tool's error, not a crash.
  // The gateway calls it on a worker thread when blocking() says it may take long (processes,
  // network); a tool that is not blocking runs through ExecuteOnLoop.
  virtual Result<Json> Execute(const ToolContext& ctx, const Json& arguments) = 0;
  // How the gateway runs a tool that is not blocking(): on the event loop, where it may suspend
  // without holding the loop (a Lua tool waiting on a memory read); the default runs Execute.
  // An override that suspends does so inside an IoWorkPause (common/io_work.h): the gateway
  // marks the call as the io thread's work around it. REQUIRES: on the event loop; the tool
  // and `ctx` stay valid until it completes.
  virtual boost::asio::awaitable<Result<Json>> ExecuteOnLoop(const ToolContext& ctx,
                                                             Json arguments);
  virtual bool blocking() const { return false; }
};

// Tools by name, owned by the server instance. Registration is explicit (RegisterBuiltinTools).
class ToolRegistry {
 public:
  Status Register(std::unique_ptr<Tool> tool);  // kInvalidArgument on a duplicate name
  Tool* Find(const std::string& name) const;
  std::vector<const Tool*> All() const;

 private:
  std::map<std::string, std::unique_ptr<Tool>> tools_;
};

// time.now (pure) and notes.append (once).
Status RegisterBuiltinTools(ToolRegistry& registry);
// files.read, files.list (pure), files.write (idempotent), exec (once; sandboxed by default).
Status RegisterWorkspaceTools(ToolRegistry& registry);
// memory.search (pure, read), memory.upsert and memory.delete (idempotent, write): the calling
// agent's own memories in `store` (memory_tools.cc).
Status RegisterMemoryTools(ToolRegistry& registry, store::Store& store);

}  // namespace keel::tools

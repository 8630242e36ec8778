// The memory tools: an agent searches, writes and deletes its own long-term memories (never
// another agent's: the agent comes from the call's context, not from the arguments). Writing
// needs the right `write`, so the policy refuses them to runs a guest started. Each runs on the
// gateway's tool pool (blocking()) and reads or writes the store synchronously there; a write
// and its event are one unit of work. Plugins hear of an upsert (memory.upsert@v1) from the
// runtime, which sees the call's result (runtime/plugin_events.cc).

#include "keel/common/crypto.h"
#include "keel/memory/memory.h"
#include "keel/store/store.h"
#include "keel/tools/tool.h"

namespace keel::tools {

namespace {

// The id of a memory a call writes without naming one: derived from the call's effect key, so
// that running the call again after a crash replaces that memory instead of adding a second.
// UUID-shaped (version 8, name-based).
std::string IdForCall(const ToolContext& ctx) {
  std::string h = Sha256Hex("keel.memory:" + ctx.tenant_id + ":" + ctx.effect_key);
  h[12] = '8';
  h[16] = "89ab"[h[16] % 4];
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
         "-" + h.substr(20, 12);
}

class MemorySearch final : public Tool {
 public:
  explicit MemorySearch(store::Store& store) : store_(store) {}
  std::string name() const override { return "memory.search"; }
  std::string description() const override {
    return "Searches your long-term memories. Query language: words (all must occur), "
           "\"a phrase\", a OR b, -word to exclude, prefix* for a word's start.";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties",
             {{"query", {{"type", "string"}, {"description", "what to look for"}}},
              {"tag", {{"type", "string"}, {"description", "only memories with this tag"}}},
              {"limit",
               {{"type", "integer"},
                {"minimum", 1},
                {"maximum", memory::kMaxSearchLimit},
                {"description", "at most this many results (default 10)"}}}}},
            {"required", {"query"}},
            {"additionalProperties", false}};
  }
  EffectClass effect_class() const override { return EffectClass::kPure; }
  std::vector<std::string> rights() const override { return {"read"}; }
  bool blocking() const override { return true; }
  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    KEEL_ASSIGN_OR_RETURN(std::string query, ReqString(args, "query"));
    KEEL_ASSIGN_OR_RETURN(std::string tag, OptString(args, "tag"));
    int limit = memory::kDefaultSearchLimit;
    if (args.contains("limit")) {
      if (!args["limit"].is_number_integer()) return InvalidArgument("limit must be an integer");
      limit = args["limit"].get<int>();
    }
    Json hits;
    KEEL_RETURN_IF_ERROR(store_.Read([&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(hits,
                            memory::SearchJson(tx, ctx.tenant_id, ctx.agent_id, query, tag, limit));
      return Status::Ok();
    }));
    return Json{{"results", std::move(hits)}};
  }

 private:
  store::Store& store_;
};

class MemoryUpsert final : public Tool {
 public:
  explicit MemoryUpsert(store::Store& store) : store_(store) {}
  std::string name() const override { return "memory.upsert"; }
  std::string description() const override {
    return "Writes a long-term memory: a new one, or, given the id of one of yours, a "
           "replacement of it. Answers with its id.";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties",
             {{"text", {{"type", "string"}, {"description", "what to remember"}}},
              {"tags",
               {{"type", "array"},
                {"items", {{"type", "string"}}},
                {"description", "labels to find it by"}}},
              {"id", {{"type", "string"}, {"description", "the memory to replace"}}}}},
            {"required", {"text"}},
            {"additionalProperties", false}};
  }
  EffectClass effect_class() const override { return EffectClass::kIdempotent; }
  std::vector<std::string> rights() const override { return {"write"}; }
  bool blocking() const override { return true; }
  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    Json fields = args;
    if (!fields.contains("id")) fields["id"] = IdForCall(ctx);
    KEEL_ASSIGN_OR_RETURN(store::Memory m,
                          memory::MemoryFrom(fields, ctx.tenant_id, ctx.agent_id, "tool"));
    memory::Upserted written;
    const std::string source = m.source;
    KEEL_RETURN_IF_ERROR(store_.WriteSync([&](store::Tx& tx) -> Status {
      m.source = source;  // afresh: a unit may run again (docs/decisions/0014)
      // An introspection run's memories say so (docs/CONTEXT.md).
      if (!ctx.run_id.empty()) {
        KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(ctx.tenant_id, ctx.run_id));
        KEEL_ASSIGN_OR_RETURN(auto prompt,
                              tx.messages().GetMessage(ctx.tenant_id, run.message_id));
        if (prompt.role == "introspection") m.source = "introspection";
      }
      KEEL_ASSIGN_OR_RETURN(written, memory::Upsert(tx, m, ctx.session_id, ctx.run_id));
      return Status::Ok();
    }));
    // The memory without its text, which the model has just sent (a long one would otherwise
    // make a long result).
    Json out = memory::MemoryJson(written.memory);
    out.erase("text");
    out["replaced"] = written.replaced;
    return out;
  }

 private:
  store::Store& store_;
};

class MemoryDelete final : public Tool {
 public:
  explicit MemoryDelete(store::Store& store) : store_(store) {}
  std::string name() const override { return "memory.delete"; }
  std::string description() const override { return "Deletes one of your long-term memories."; }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties", {{"id", {{"type", "string"}, {"description", "the memory's id"}}}}},
            {"required", {"id"}},
            {"additionalProperties", false}};
  }
  EffectClass effect_class() const override { return EffectClass::kIdempotent; }
  std::vector<std::string> rights() const override { return {"write"}; }
  bool blocking() const override { return true; }
  // Deleting one that is not there is no error (deleted: false): a call run again after a crash
  // answers as the first would have.
  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    KEEL_ASSIGN_OR_RETURN(std::string id, ReqString(args, "id"));
    Status st = store_.WriteSync([&](store::Tx& tx) {
      return memory::Delete(tx, ctx.tenant_id, ctx.agent_id, id, ctx.session_id, ctx.run_id);
    });
    if (!st.ok() && st.code() != Code::kNotFound) return st;
    return Json{{"id", id}, {"deleted", st.ok()}};
  }

 private:
  store::Store& store_;
};

}  // namespace

Status RegisterMemoryTools(ToolRegistry& registry, store::Store& store) {
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<MemorySearch>(store)));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<MemoryUpsert>(store)));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<MemoryDelete>(store)));
  return Status::Ok();
}

}  // namespace keel::tools

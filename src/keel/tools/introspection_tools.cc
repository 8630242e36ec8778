#include "keel/tools/introspection_tools.h"

#include "keel/memory/memory.h"
#include "keel/store/introspection_store.h"
#include "keel/store/row_images.h"
#include "keel/store/store.h"
#include "keel/tools/tool.h"

namespace keel::tools {
namespace {

// The run making the call must be an introspection run: another run of the agent never
// reaches these tools, even when its tools list would let it name them.
Status RequireIntrospectionRun(store::Tx& tx, const ToolContext& ctx, const std::string& tool) {
  KEEL_ASSIGN_OR_RETURN(auto run, tx.runs().GetRun(ctx.tenant_id, ctx.run_id));
  KEEL_ASSIGN_OR_RETURN(auto message, tx.messages().GetMessage(ctx.tenant_id, run.message_id));
  if (message.role != "introspection") {
    return PermissionDenied(tool + " works only in an introspection run");
  }
  return Status::Ok();
}

Result<std::string> TextArg(const Json& args, const char* name, size_t max) {
  if (!args.contains(name) || !args[name].is_string()) {
    return InvalidArgument(std::string("'") + name + "' must be a string");
  }
  std::string v = args[name].get<std::string>();
  if (v.size() > max) {
    return InvalidArgument(std::string("'") + name + "' is longer than " + std::to_string(max) +
                           " bytes");
  }
  return v;
}

Json OneString(const char* name, const char* description) {
  return {{"type", "object"},
          {"properties", {{name, {{"type", "string"}, {"description", description}}}}},
          {"required", {name}},
          {"additionalProperties", false}};
}

class SetDescription final : public Tool {
 public:
  explicit SetDescription(store::Store& store) : store_(store) {}
  std::string name() const override { return "introspection.set_description"; }
  std::string description() const override {
    return "Sets the session's description: one line on what the session is about.";
  }
  Json parameters() const override {
    return OneString("description", "what the session is about, in one line");
  }
  EffectClass effect_class() const override { return EffectClass::kIdempotent; }
  std::vector<std::string> rights() const override { return {"write"}; }
  bool blocking() const override { return true; }  // it waits for the store's writer

  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    KEEL_ASSIGN_OR_RETURN(std::string text, TextArg(args, "description", kMaxDescriptionBytes));
    for (char& c : text) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    KEEL_RETURN_IF_ERROR(store_.WriteSync([&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(RequireIntrospectionRun(tx, ctx, name()));
      const Millis at = NowMillis();
      KEEL_RETURN_IF_ERROR(
          tx.introspection().SetSessionDescription(ctx.tenant_id, ctx.session_id, text, at));
      tx.Carry(
          "sessions",
          store::ColumnsImage({{"id", ctx.session_id}, {"description", text}, {"updated_at", at}}));
      return tx.events().Append({ctx.tenant_id,
                                 "session.described@v1",
                                 ctx.agent_id,
                                 ctx.session_id,
                                 ctx.run_id,
                                 {{"description", text}}});
    }));
    return Json{{"description", text}};
  }

 private:
  store::Store& store_;
};

class SetWorkingMemory final : public Tool {
 public:
  explicit SetWorkingMemory(store::Store& store) : store_(store) {}
  std::string name() const override { return "introspection.set_working_memory"; }
  std::string description() const override {
    return "Replaces your working memory: the short notes you carry into every session's "
           "prompt. Keep what you will need; leave out what you will not.";
  }
  Json parameters() const override {
    return OneString("content", "the whole working memory, replacing the current one");
  }
  EffectClass effect_class() const override { return EffectClass::kIdempotent; }
  std::vector<std::string> rights() const override { return {"write"}; }
  bool blocking() const override { return true; }

  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    KEEL_ASSIGN_OR_RETURN(std::string text,
                          TextArg(args, "content", memory::kMaxWorkingMemoryBytes));
    KEEL_RETURN_IF_ERROR(store_.WriteSync([&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(RequireIntrospectionRun(tx, ctx, name()));
      return memory::PutWorkingMemory(tx, ctx.tenant_id, ctx.agent_id, text, ctx.session_id,
                                      ctx.run_id)
          .status();
    }));
    return Json{{"bytes", text.size()}};
  }

 private:
  store::Store& store_;
};

}  // namespace

Status RegisterIntrospectionTools(ToolRegistry& registry, store::Store& store) {
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<SetDescription>(store)));
  return registry.Register(std::make_unique<SetWorkingMemory>(store));
}

}  // namespace keel::tools

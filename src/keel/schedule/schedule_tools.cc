#include "keel/schedule/schedule_tools.h"

#include "keel/schedule/schedule.h"
#include "keel/store/channel_store.h"
#include "keel/store/schedule_store.h"

namespace keel::schedule {

namespace {

constexpr int kListLimit = 100;
constexpr int64_t kMaxInSeconds = 10LL * 366 * 24 * 3600;

// The run's caller, who the tools act for; kPermissionDenied for a guest. The run also says
// whom it acts for beside its token (store::Run::user_id, channel_id), which a schedule it makes
// keeps, so that each of its slots stays bounded by the same person and channel.
Result<store::Run> CallerOf(store::Store& store, const tools::ToolContext& ctx,
                            const std::string& tool) {
  store::Run run;
  KEEL_RETURN_IF_ERROR(store.Read([&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(run, tx.runs().GetRun(ctx.tenant_id, ctx.run_id));
    if (!run.user_id.empty() || !run.channel_id.empty()) return Status::Ok();
    // A run queued without them (by a node of an older release in a fleet being upgraded, or
    // imported from an older archive): its chat reply's, or its slot's schedule's.
    KEEL_ASSIGN_OR_RETURN(auto reply, tx.channels().RunReply(ctx.tenant_id, ctx.run_id));
    if (reply) {
      run.user_id = reply->user_id;
      run.channel_id = reply->channel_id;
      return Status::Ok();
    }
    KEEL_ASSIGN_OR_RETURN(auto fire, tx.schedules().FireOfRun(ctx.tenant_id, ctx.run_id));
    if (!fire) return Status::Ok();
    auto parent = tx.schedules().GetSchedule(ctx.tenant_id, fire->schedule_id);
    if (!parent.ok()) {
      return parent.status().code() == Code::kNotFound ? Status::Ok() : parent.status();
    }
    run.user_id = parent->user_id;
    run.channel_id = parent->channel_id;
    return Status::Ok();
  }));
  if (run.caller_role != "owner" && run.caller_role != "user") {
    return PermissionDenied(tool + " is for runs of owners and users; this run's caller is a " +
                            run.caller_role);
  }
  return run;
}

class ScheduleTool : public tools::Tool {
 public:
  ScheduleTool(store::Store& store, std::function<void()> on_change)
      : store_(store), on_change_(std::move(on_change)) {}
  bool blocking() const override { return true; }

 protected:
  store::Store& store_;
  std::function<void()> on_change_;
};

class CreateTool final : public ScheduleTool {
 public:
  using ScheduleTool::ScheduleTool;
  std::string name() const override { return "schedule.create"; }
  std::string description() const override {
    return "Schedules a prompt for this agent: a cron expression (five fields, or @daily ...) "
           "in a time zone, or once at a time or in some seconds. It is posted into this "
           "session, or a new session each time with session \"new\".";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties",
             {{"prompt", {{"type", "string"}, {"description", "the message to post"}}},
              {"cron", {{"type", "string"}, {"description", "e.g. \"0 9 * * MON-FRI\""}}},
              {"at", {{"type", "string"}, {"description", "once, at this RFC 3339 time"}}},
              {"in_seconds",
               {{"type", "integer"}, {"minimum", 0}, {"description", "once, this long from now"}}},
              {"timezone", {{"type", "string"}, {"description", "IANA zone, default UTC"}}},
              {"name", {{"type", "string"}}},
              {"missed", {{"type", "string"}, {"enum", {"skip", "catch_up_one"}}}},
              {"session", {{"type", "string"}, {"enum", {"current", "new"}}}}}},
            {"required", {"prompt"}},
            {"additionalProperties", false}};
  }
  tools::EffectClass effect_class() const override { return tools::EffectClass::kOnce; }
  std::vector<std::string> rights() const override { return {"write"}; }

  Result<Json> Execute(const tools::ToolContext& ctx, const Json& args) override {
    KEEL_ASSIGN_OR_RETURN(store::Run run, CallerOf(store_, ctx, name()));
    ScheduleRequest r;
    r.agent_id = ctx.agent_id;
    r.prompt = args.value("prompt", "");
    r.cron = args.value("cron", "");
    r.name = args.value("name", "");
    r.timezone = args.value("timezone", "UTC");
    r.missed = args.value("missed", "skip");
    r.session_id = args.value("session", "current") == "new" ? "" : ctx.session_id;
    const Millis now = NowMillis();
    int whens = !r.cron.empty() + args.contains("at") + args.contains("in_seconds");
    if (whens != 1) return InvalidArgument("give exactly one of cron, at and in_seconds");
    if (args.contains("at")) {
      r.at = ParseRfc3339(args["at"].get<std::string>());
      if (!r.at) return InvalidArgument("at must be an RFC 3339 time such as 2026-11-30T12:00:00Z");
    } else if (args.contains("in_seconds")) {
      int64_t in = args["in_seconds"].get<int64_t>();
      if (in > kMaxInSeconds) return InvalidArgument("in_seconds is more than ten years");
      r.at = now + in * 1000;
    }
    KEEL_ASSIGN_OR_RETURN(store::Schedule s,
                          MakeSchedule(r, ctx.tenant_id, run.requested_by, run.caller_role, now));
    s.user_id = run.user_id;
    s.channel_id = run.channel_id;
    KEEL_RETURN_IF_ERROR(store_.WriteSync([&](store::Tx& tx) { return InsertSchedule(tx, s); }));
    if (on_change_) on_change_();
    return ScheduleJson(s);
  }
};

class ListTool final : public ScheduleTool {
 public:
  using ScheduleTool::ScheduleTool;
  std::string name() const override { return "schedule.list"; }
  std::string description() const override { return "This agent's schedules."; }
  Json parameters() const override {
    return {{"type", "object"}, {"properties", Json::object()}, {"additionalProperties", false}};
  }
  tools::EffectClass effect_class() const override { return tools::EffectClass::kPure; }
  std::vector<std::string> rights() const override { return {"read"}; }

  Result<Json> Execute(const tools::ToolContext& ctx, const Json&) override {
    KEEL_RETURN_IF_ERROR(CallerOf(store_, ctx, name()).status());
    store::Paged<store::Schedule> page;
    KEEL_RETURN_IF_ERROR(store_.Read([&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(page, tx.schedules().ListSchedules(ctx.tenant_id, ctx.agent_id,
                                                               store::Page{"", kListLimit}));
      return Status::Ok();
    }));
    Json items = Json::array();
    for (const auto& s : page.items) items.push_back(ScheduleJson(s));
    return Json{{"schedules", items}, {"more", !page.next_cursor.empty()}};
  }
};

class CancelTool final : public ScheduleTool {
 public:
  using ScheduleTool::ScheduleTool;
  std::string name() const override { return "schedule.cancel"; }
  std::string description() const override { return "Deletes one of this agent's schedules."; }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties", {{"id", {{"type", "string"}, {"description", "the schedule's id"}}}}},
            {"required", {"id"}},
            {"additionalProperties", false}};
  }
  tools::EffectClass effect_class() const override { return tools::EffectClass::kIdempotent; }
  std::vector<std::string> rights() const override { return {"write"}; }

  Result<Json> Execute(const tools::ToolContext& ctx, const Json& args) override {
    KEEL_RETURN_IF_ERROR(CallerOf(store_, ctx, name()).status());
    std::string id = args.value("id", "");
    KEEL_RETURN_IF_ERROR(store_.WriteSync(
        [&](store::Tx& tx) { return RemoveSchedule(tx, ctx.tenant_id, id, ctx.agent_id); }));
    return Json{{"deleted", id}};
  }
};

}  // namespace

Status RegisterScheduleTools(tools::ToolRegistry& registry, store::Store& store,
                             std::function<void()> on_change) {
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<CreateTool>(store, on_change)));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<ListTool>(store, on_change)));
  return registry.Register(std::make_unique<CancelTool>(store, on_change));
}

}  // namespace keel::schedule

#pragma once
// The agents' schedule tools, so an agent can schedule its own follow-ups through the gateway:
//   schedule.create  a cron or one-shot schedule of the calling agent, posting into the
//                    calling session (default) or a new session each time   (write, once)
//   schedule.list    the calling agent's schedules                           (read, pure)
//   schedule.cancel  deletes one of the calling agent's schedules            (write, idempotent)
// Only runs whose caller is an owner or a user may use them: the gateway's policy already
// keeps guests from write tools, and each tool also refuses a run whose caller_role is guest
// (schedule.list too). A schedule made by a tool carries the run's caller (token and role).
//
// The tools are blocking(): they run on the gateway's tool pool and use the store
// synchronously (Store::Read, Store::WriteSync). `on_change` is called from that thread after a
// schedule was created; the server posts it to the runtime (Runtime::WakeSchedules).

#include <functional>

#include "keel/common/status.h"
#include "keel/store/store.h"
#include "keel/tools/tool.h"

namespace keel::schedule {

Status RegisterScheduleTools(tools::ToolRegistry& registry, store::Store& store,
                             std::function<void()> on_change);

}  // namespace keel::schedule

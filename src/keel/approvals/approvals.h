#pragma once
// approvals — the one decision function for tool calls that wait for a human (DESIGN.md
// invariant 7). The API, the CLI (through the API), the expiry sweep and run cancellation all
// decide through Decide, inside the caller's unit of work, so every decision writes the same
// records and events and re-queues the parked run the same way, whatever its channel.

#include <optional>
#include <string>

#include "keel/common/json_util.h"
#include "keel/common/time.h"
#include "keel/store/store.h"

namespace keel::approvals {

enum class Verdict {
  kApprove,  // a human allows the call (possibly with amended arguments)
  kReject,   // a human refuses it: the model gets the refusal as the tool's error
  kExpire,   // nobody decided in time: refused as expired
  kCancel,   // the run was cancelled while it waited
};

// A standing approval granted with an approval: later calls of the same tool by the same agent
// (whose arguments contain every member of `arguments_match`, when given) need no human until
// `expires_at`.
struct StandingGrant {
  Millis expires_at = 0;
  Json arguments_match;  // null: any arguments
};

struct DecisionRequest {
  std::string tenant_id;
  std::string approval_id;
  Verdict verdict = Verdict::kReject;
  std::string decided_by;  // a token id, "user:USER_ID" (a chat card's button), or "system"
  std::string reason;
  Json amended_arguments;  // kApprove only; null: as proposed
  std::optional<StandingGrant> standing;  // kApprove only
};

// Decides a pending approval inside `tx`: the approval, and through the run state machine
// (runs/run_state.h) its tool call and step (runs::SettleParkedCall) and, when the run still
// waits and the verdict is not a cancel, the run queued again (runs::Requeue); with the events
// of each. kConflict
// when the approval is not pending (decided twice) or has expired (for a human verdict);
// kPermissionDenied when the policy asks for a separate approver and `decided_by` asked for the
// run (the person whose chat message started it, when one did; else the token that asked, or
// another token of the same person); kInvalidArgument for amended arguments that are not an object
// or a bad standing grant. Returns the approval as decided. The caller wakes the dispatcher after
// the commit.
Result<store::Approval> Decide(store::Tx& tx, const DecisionRequest& request, Millis now);

// Whether a standing approval covers a call with `arguments`.
bool StandingCovers(const store::StandingApproval& standing, const Json& arguments);

// Renders an approval as the API shows it.
Json ApprovalJson(const store::Approval& a);

const char* VerdictName(Verdict v);

}  // namespace keel::approvals

#include "keel/approvals/approvals.h"

#include "keel/access/users.h"
#include "keel/common/ids.h"
#include "keel/policy/policy.h"
#include "keel/policy/stored.h"
#include "keel/runs/run_state.h"
#include "keel/store/row_images.h"

namespace keel::approvals {
namespace {

// The approval's new status, the tool call's, and the error the model sees when refused.
struct Outcome {
  const char* approval_status;
  const char* call_status;
  std::string error;  // empty when approved
};

Outcome OutcomeOf(const DecisionRequest& d) {
  std::string why = d.reason.empty() ? "" : ": " + d.reason;
  switch (d.verdict) {
    case Verdict::kApprove:
      return {"approved", "approved", ""};
    case Verdict::kReject:
      return {"rejected", "rejected", "a human rejected this call" + why};
    case Verdict::kExpire:
      return {"expired", "rejected", "the approval expired without a decision; the call was not made"};
    case Verdict::kCancel:
      return {"cancelled", "rejected", "the run was cancelled while the call waited for approval"};
  }
  return {"rejected", "rejected", "rejected"};
}

// The user a token belongs to, as merges left them ("" for a token of no one, or no token).
Result<std::string> TokenUser(store::Tx& tx, const std::string& tenant_id,
                              const std::string& token_id) {
  if (token_id.empty() || token_id == "system") return std::string();
  auto token = tx.tokens().GetToken(tenant_id, token_id);
  if (token.status().code() == Code::kNotFound) return std::string();
  KEEL_RETURN_IF_ERROR(token.status());
  if (token->user_id.empty()) return std::string();
  auto user = access::CurrentUser(tx, tenant_id, token->user_id);
  if (user.status().code() == Code::kNotFound) return std::string();
  KEEL_RETURN_IF_ERROR(user.status());
  return user->id;
}

// Whether `decided_by` is whoever asked for the approval's run: the person whose chat message
// started it (a channel's run acts with the channel creator's token, who asked for nothing), or
// else the token that asked, or another token of the same person.
Result<bool> AskedForTheRun(store::Tx& tx, const store::Approval& a,
                            const std::string& decided_by) {
  std::string decider;  // the deciding person, "" when the decision is no one's in particular
  if (decided_by.rfind("user:", 0) == 0) {
    KEEL_ASSIGN_OR_RETURN(auto user, access::CurrentUser(tx, a.tenant_id, decided_by.substr(5)));
    decider = user.id;
  } else {
    KEEL_ASSIGN_OR_RETURN(decider, TokenUser(tx, a.tenant_id, decided_by));
  }
  KEEL_ASSIGN_OR_RETURN(auto answer, tx.channels().RunReply(a.tenant_id, a.run_id));
  if (answer && !answer->user_id.empty()) {
    auto asker = access::CurrentUser(tx, a.tenant_id, answer->user_id);
    if (asker.status().code() == Code::kNotFound) return false;
    KEEL_RETURN_IF_ERROR(asker.status());
    return decider == asker->id;
  }
  if (!a.requested_by.empty() && a.requested_by == decided_by) return true;
  KEEL_ASSIGN_OR_RETURN(std::string asker, TokenUser(tx, a.tenant_id, a.requested_by));
  return !asker.empty() && asker == decider;
}

}  // namespace

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kApprove: return "approve";
    case Verdict::kReject: return "reject";
    case Verdict::kExpire: return "expire";
    case Verdict::kCancel: return "cancel";
  }
  return "?";
}

bool StandingCovers(const store::StandingApproval& standing, const Json& arguments) {
  if (!standing.arguments_match.is_object()) return true;
  if (!arguments.is_object()) return false;
  for (auto it = standing.arguments_match.begin(); it != standing.arguments_match.end(); ++it) {
    auto found = arguments.find(it.key());
    if (found == arguments.end() || *found != it.value()) return false;
  }
  return true;
}

Result<store::Approval> Decide(store::Tx& tx, const DecisionRequest& d, Millis now) {
  KEEL_ASSIGN_OR_RETURN(store::Approval a, tx.approvals().GetApproval(d.tenant_id, d.approval_id));
  if (a.status != "pending") {
    std::string by = a.decided_by.empty() ? "" : " by " + a.decided_by;
    std::string at = a.decided_at ? " at " + FormatRfc3339(*a.decided_at) : "";
    return Conflict("approval " + a.id + " was already decided: " + a.status + by + at);
  }
  const bool human = d.verdict == Verdict::kApprove || d.verdict == Verdict::kReject;
  if (human && now >= a.expires_at) {
    return Conflict("approval " + a.id + " expired at " + FormatRfc3339(a.expires_at));
  }
  if (d.verdict != Verdict::kApprove &&
      (!d.amended_arguments.is_null() || d.standing.has_value())) {
    return InvalidArgument("amended arguments and standing approvals go with an approval only");
  }
  if (!d.amended_arguments.is_null() && !d.amended_arguments.is_object()) {
    return InvalidArgument("amended arguments must be a JSON object");
  }
  if (d.standing) {
    if (d.standing->expires_at <= now) {
      return InvalidArgument("a standing approval must expire in the future");
    }
    if (!d.standing->arguments_match.is_null() && !d.standing->arguments_match.is_object()) {
      return InvalidArgument("a standing approval's match must be a JSON object");
    }
  }
  if (human) {
    KEEL_ASSIGN_OR_RETURN(auto frame, policy::LoadPolicy(tx, d.tenant_id, ""));
    KEEL_ASSIGN_OR_RETURN(auto narrowing, policy::LoadPolicy(tx, d.tenant_id, a.agent_id));
    if (policy::SeparateApprover(frame ? &*frame : nullptr, narrowing ? &*narrowing : nullptr)) {
      KEEL_ASSIGN_OR_RETURN(bool asked, AskedForTheRun(tx, a, d.decided_by));
      if (asked) {
        return PermissionDenied(
            "the policy asks for a separate approver: whoever asked for the "
            "run may not decide its approvals");
      }
    }
  }

  const Outcome outcome = OutcomeOf(d);
  a.status = outcome.approval_status;
  a.amended_arguments = d.amended_arguments;
  a.decided_by = d.decided_by;
  a.decision_reason = d.reason;
  a.decided_at = now;
  KEEL_RETURN_IF_ERROR(tx.approvals().UpdateApproval(a));
  tx.Carry("approvals", store::RowImage(a));

  // The parked call: its journal entry and its step.
  KEEL_RETURN_IF_ERROR(runs::SettleParkedCall(tx, d.tenant_id, a.run_id, a.call_id,
                                              outcome.call_status, outcome.error,
                                              a.amended_arguments, now));

  std::string standing_id;
  if (d.standing) {
    store::StandingApproval s{NewId(), a.tenant_id, a.agent_id, a.tool,
                              d.standing->arguments_match, d.decided_by, a.id, now,
                              d.standing->expires_at, std::nullopt};
    KEEL_RETURN_IF_ERROR(tx.approvals().InsertStanding(s));
    tx.Carry("standing_approvals", store::RowImage(s));
    standing_id = s.id;
  }

  Json decided = {{"approval_id", a.id},   {"call_id", a.call_id},
                  {"tool", a.tool},        {"status", a.status},
                  {"decided_by", a.decided_by}, {"reason", a.decision_reason},
                  {"amended", a.amended_arguments.is_object()}};
  if (a.amended_arguments.is_object()) {
    decided["arguments"] = a.amended_arguments;
    decided["original_arguments"] = a.arguments;
  }
  if (!standing_id.empty()) {
    decided["standing_approval_id"] = standing_id;
    decided["standing_expires_at"] = FormatRfc3339(d.standing->expires_at);
  }
  KEEL_RETURN_IF_ERROR(tx.events().Append({a.tenant_id, "approval.decided@v1", a.agent_id,
                                           a.session_id, a.run_id, decided}));

  // The run goes back to the queue (a cancelled run ends in the caller's unit instead).
  if (d.verdict != Verdict::kCancel) {
    KEEL_RETURN_IF_ERROR(runs::Requeue(tx, d.tenant_id, a.run_id, a.id, now));
  }
  return a;
}

Json ApprovalJson(const store::Approval& a) {
  return {{"id", a.id},
          {"run_id", a.run_id},
          {"session_id", a.session_id},
          {"agent_id", a.agent_id},
          {"call_id", a.call_id},
          {"tool", a.tool},
          {"arguments", a.arguments},
          {"amended_arguments", a.amended_arguments},
          {"reason", a.reason},
          {"status", a.status},
          {"requested_by", a.requested_by.empty() ? Json(nullptr) : Json(a.requested_by)},
          {"decided_by", a.decided_by.empty() ? Json(nullptr) : Json(a.decided_by)},
          {"decision_reason", a.decision_reason.empty() ? Json(nullptr) : Json(a.decision_reason)},
          {"decided_at", a.decided_at ? Json(FormatRfc3339(*a.decided_at)) : Json(nullptr)},
          {"expires_at", FormatRfc3339(a.expires_at)},
          {"created_at", FormatRfc3339(a.created_at)}};
}

}  // namespace keel::approvals

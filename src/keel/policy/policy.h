#pragma once
// Tool policy: which tools a caller may run, with which rights, and when a human must approve.
//
// Two documents of the same shape take part in a decision. The tenant's *frame* says what the
// tenant allows at all; once set, a tool no frame rule covers is denied. An agent's *narrowing*
// can only take away: fewer rights, more approval, more denied tools. With no frame set every
// tool is allowed with the rights it needs (the behaviour before policies existed).
//
// Document shape (all top-level fields optional):
//   {"rules": [{"tool": GLOB, "rights": ["read","write","send"],
//               "approval": "never" | "always" | {"over": {"argument": NAME, "value": NUMBER}}}],
//    "deny": [GLOB...], "require_approval": [GLOB...], "separate_approver": BOOL,
//    "approvers": [USER_ID...], "approval_in_conversation": BOOL}
// `approvers` and `approval_in_conversation` say who decides an approval from a chat platform's
// button and where its card may go (channels/cards.h); they do not change which calls wait.
// A GLOB is an exact tool name, `*`, or a prefix ending in `*`. An exact name beats any glob;
// among globs the longer prefix wins.
//
// Everything here is pure: no I/O, no clock, no shared state, so any thread may call it.

#include <string>
#include <string_view>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::policy {

// Owners and users are limited only by policy; guests may only run tools that need nothing but
// `read`.
enum class Role { kOwner, kUser, kGuest };
Result<Role> ParseRole(std::string_view name);  // "owner" | "user" | "guest"
const char* RoleName(Role role);

struct Approval {
  enum class Kind { kNever, kAlways, kOver };
  Kind kind = Kind::kNever;
  // Only for kOver: approval is needed when arguments[argument] is a number > value, or when it
  // is absent or not a number (fail safe).
  std::string argument;
  double value = 0;
};

struct Rule {
  std::string tool;                 // a GLOB
  std::vector<std::string> rights;  // canonical: a subset of read, write, send in that order
  Approval approval;
};

// Invariants after ParsePolicy: every glob is valid, rule globs are distinct, each list holds at
// most 1000 entries, rights are known and canonical, an `over` value is finite and >= 0.
struct Policy {
  std::vector<Rule> rules;
  std::vector<std::string> deny;
  std::vector<std::string> require_approval;
  bool separate_approver = false;
  std::vector<std::string> approvers;  // user ids; none: the agent's owners
  bool approval_in_conversation = false;
};

// Parses and validates untrusted input. Errors are kInvalidArgument naming the path of the
// offending field, e.g. "rules[2].aproval: unknown field".
Result<Policy> ParsePolicy(const Json& doc);
// The canonical form: every field present. PolicyJson(ParsePolicy(x)) is a fixed point.
Json PolicyJson(const Policy& policy);

// True when `glob` (exact, `*` or `prefix*`) matches the tool name.
bool GlobMatches(std::string_view glob, std::string_view tool);

struct ToolInfo {
  std::string name;
  std::vector<std::string> rights;  // what the tool needs to run
};

struct Decision {
  enum class Kind { kAllow, kDeny, kNeedsApproval };
  Kind kind = Kind::kAllow;
  std::string reason;  // empty for kAllow
};

// Decides one tool call. `frame` and `narrowing` may each be null (not set). Checks, in order:
// deny lists, the frame's rule, the narrowing's rule, the caller's role, then approval. Rights
// are intersected at decision time, so a narrowing written against an older, wider frame can
// never widen the current one.
Decision Decide(const Policy* frame, const Policy* narrowing, Role role, const ToolInfo& tool,
                const Json& arguments);

// Whoever approves must differ from whoever asked when either document says so.
bool SeparateApprover(const Policy* frame, const Policy* narrowing);
// Who decides an agent's approvals from a chat button: the narrowing's approvers when it names
// any, else the frame's; empty when neither does (the agent's owners decide).
std::vector<std::string> Approvers(const Policy* frame, const Policy* narrowing);
// Whether an approval card may go to the conversation the run came from when no approver can
// be reached directly: when either document says so.
bool ApprovalInConversation(const Policy* frame, const Policy* narrowing);

// Rejects (kInvalidArgument, message says "widens") a narrowing that grants more rights or looser
// approval than the frame rule that would decide the same tools. Checked when the narrowing is
// written; with no frame set any narrowing is accepted.
Status CheckNarrowing(const Policy* frame, const Policy& narrowing);

}  // namespace keel::policy

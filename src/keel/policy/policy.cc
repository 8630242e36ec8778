#include "keel/policy/policy.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <utility>

namespace keel::policy {
namespace {

constexpr std::size_t kMaxEntries = 1000;
constexpr std::array<std::string_view, 3> kRights = {"read", "write", "send"};
constexpr const char* kFrameName = "tenant policy";
constexpr const char* kNarrowingName = "agent policy";

int RightIndex(std::string_view right) {
  for (std::size_t i = 0; i < kRights.size(); ++i) {
    if (kRights[i] == right) return static_cast<int>(i);
  }
  return -1;
}

bool IsGlob(std::string_view glob) { return !glob.empty() && glob.back() == '*'; }

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

std::string Quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::string JoinList(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

// Shortest text that reads back as the same double, so 100 prints as "100", not "100.000000".
std::string FormatNumber(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string FieldPath(const std::string& path, std::string_view field) {
  return path.empty() ? std::string(field) : path + "." + std::string(field);
}

// Null counts as absent, as in OptString: clients often send explicit nulls for unset fields.
const Json* Field(const Json& obj, const std::string& name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

Status CheckNoUnknownFields(const Json& obj, std::initializer_list<std::string_view> known,
                            const std::string& path) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (std::string_view k : known) ok = ok || it.key() == k;
    if (!ok) return InvalidArgument(FieldPath(path, it.key()) + ": unknown field");
  }
  return Status::Ok();
}

Status CheckGlob(std::string_view glob, const std::string& path) {
  if (glob.empty()) return InvalidArgument(path + ": empty tool glob");
  std::string_view prefix = IsGlob(glob) ? glob.substr(0, glob.size() - 1) : glob;
  for (char c : prefix) {
    if (c == '*') return InvalidArgument(path + ": " + Quoted(glob) + ": '*' may only end a glob");
    if (!IsNameChar(c)) {
      return InvalidArgument(path + ": " + Quoted(glob) +
                             ": tool names use only A-Z a-z 0-9 _ . - (and a final '*')");
    }
  }
  return Status::Ok();
}

Result<std::string> ParseGlob(const Json& j, const std::string& path) {
  if (!j.is_string()) return InvalidArgument(path + ": must be a string");
  std::string glob = j.get<std::string>();
  KEEL_RETURN_IF_ERROR(CheckGlob(glob, path));
  return glob;
}

Result<std::vector<std::string>> ParseGlobList(const Json& doc, const char* field) {
  std::vector<std::string> out;
  const Json* list = Field(doc, field);
  if (list == nullptr) return out;
  if (!list->is_array()) return InvalidArgument(std::string(field) + ": must be a list");
  if (list->size() > kMaxEntries) {
    return InvalidArgument(std::string(field) + ": at most " + std::to_string(kMaxEntries) +
                           " globs");
  }
  for (std::size_t i = 0; i < list->size(); ++i) {
    KEEL_ASSIGN_OR_RETURN(std::string glob, ParseGlob((*list)[i], std::string(field) + "[" +
                                                                      std::to_string(i) + "]"));
    out.push_back(std::move(glob));
  }
  return out;
}

Result<std::vector<std::string>> ParseRights(const Json& j, const std::string& path) {
  if (!j.is_array()) return InvalidArgument(path + ": must be a list");
  std::array<bool, kRights.size()> seen{};
  for (std::size_t i = 0; i < j.size(); ++i) {
    std::string item_path = path + "[" + std::to_string(i) + "]";
    if (!j[i].is_string()) return InvalidArgument(item_path + ": must be a string");
    std::string right = j[i].get<std::string>();
    int index = RightIndex(right);
    if (index < 0) {
      return InvalidArgument(item_path + ": unknown right " + Quoted(right) +
                             " (rights are read, write, send)");
    }
    if (seen[index]) return InvalidArgument(item_path + ": duplicate right " + Quoted(right));
    seen[index] = true;
  }
  std::vector<std::string> rights;
  for (std::size_t i = 0; i < kRights.size(); ++i) {
    if (seen[i]) rights.emplace_back(kRights[i]);
  }
  return rights;
}

Result<Approval> ParseApproval(const Json& j, const std::string& path) {
  Approval approval;
  if (j.is_string() && j.get<std::string>() == "never") return approval;
  if (j.is_string() && j.get<std::string>() == "always") {
    approval.kind = Approval::Kind::kAlways;
    return approval;
  }
  if (!j.is_object()) {
    return InvalidArgument(path + R"(: must be "never", "always" or {"over": {...}})");
  }
  KEEL_RETURN_IF_ERROR(CheckNoUnknownFields(j, {"over"}, path));
  const std::string over_path = path + ".over";
  const Json* over = Field(j, "over");
  if (over == nullptr) return InvalidArgument(over_path + ": required");
  if (!over->is_object()) return InvalidArgument(over_path + ": must be an object");
  KEEL_RETURN_IF_ERROR(CheckNoUnknownFields(*over, {"argument", "value"}, over_path));

  const Json* argument = Field(*over, "argument");
  if (argument == nullptr) return InvalidArgument(over_path + ".argument: required");
  if (!argument->is_string() || argument->get<std::string>().empty()) {
    return InvalidArgument(over_path + ".argument: must be a non-empty string");
  }
  const Json* value = Field(*over, "value");
  if (value == nullptr) return InvalidArgument(over_path + ".value: required");
  if (!value->is_number()) return InvalidArgument(over_path + ".value: must be a number");
  double v = value->get<double>();
  if (!std::isfinite(v) || v < 0) {
    return InvalidArgument(over_path + ".value: must be a finite number >= 0");
  }
  approval.kind = Approval::Kind::kOver;
  approval.argument = argument->get<std::string>();
  approval.value = v;
  return approval;
}

Result<Rule> ParseRule(const Json& j, const std::string& path) {
  if (!j.is_object()) return InvalidArgument(path + ": must be an object");
  KEEL_RETURN_IF_ERROR(CheckNoUnknownFields(j, {"tool", "rights", "approval"}, path));
  Rule rule;
  const Json* tool = Field(j, "tool");
  if (tool == nullptr) return InvalidArgument(path + ".tool: required");
  KEEL_ASSIGN_OR_RETURN(rule.tool, ParseGlob(*tool, path + ".tool"));
  // Required so that a forgotten field reads as an error, not as "no rights at all".
  const Json* rights = Field(j, "rights");
  if (rights == nullptr) return InvalidArgument(path + ".rights: required");
  KEEL_ASSIGN_OR_RETURN(rule.rights, ParseRights(*rights, path + ".rights"));
  if (const Json* approval = Field(j, "approval")) {
    KEEL_ASSIGN_OR_RETURN(rule.approval, ParseApproval(*approval, path + ".approval"));
  }
  return rule;
}

// The most specific rule covering `tool`: an exact name first, else the longest glob prefix.
// Globs are distinct, so two matching globs never tie.
const Rule* FindRule(const Policy& policy, std::string_view tool) {
  const Rule* best = nullptr;
  for (const Rule& rule : policy.rules) {
    if (!GlobMatches(rule.tool, tool)) continue;
    if (!IsGlob(rule.tool)) return &rule;
    if (best == nullptr || rule.tool.size() > best->tool.size()) best = &rule;
  }
  return best;
}

const std::string* FirstMatch(const std::vector<std::string>& globs, std::string_view tool) {
  for (const std::string& glob : globs) {
    if (GlobMatches(glob, tool)) return &glob;
  }
  return nullptr;
}

// The entries of `wanted` not in `granted`, each once.
std::vector<std::string> Missing(const std::vector<std::string>& wanted,
                                 const std::vector<std::string>& granted) {
  std::vector<std::string> missing;
  for (const std::string& right : wanted) {
    bool have = false;
    for (const std::string& g : granted) have = have || g == right;
    bool listed = false;
    for (const std::string& m : missing) listed = listed || m == right;
    if (!have && !listed) missing.push_back(right);
  }
  return missing;
}

Json ApprovalJson(const Approval& approval) {
  switch (approval.kind) {
    case Approval::Kind::kNever:
      return "never";
    case Approval::Kind::kAlways:
      return "always";
    case Approval::Kind::kOver:
      break;
  }
  // Whole numbers stay integers so a document written as 100 reads back as 100, not 100.0.
  Json value = approval.value;
  if (approval.value == std::floor(approval.value) && std::fabs(approval.value) < 9.0e15) {
    value = static_cast<std::int64_t>(approval.value);
  }
  return {{"over", {{"argument", approval.argument}, {"value", value}}}};
}

std::string DescribeApproval(const Approval& approval) {
  switch (approval.kind) {
    case Approval::Kind::kNever:
      return "never";
    case Approval::Kind::kAlways:
      return "always";
    case Approval::Kind::kOver:
      break;
  }
  return "over " + approval.argument + " " + FormatNumber(approval.value);
}

// Whether `narrowing` asks for approval at least whenever `frame` does.
bool NoLooser(const Approval& narrowing, const Approval& frame) {
  switch (frame.kind) {
    case Approval::Kind::kNever:
      return true;
    case Approval::Kind::kAlways:
      return narrowing.kind == Approval::Kind::kAlways;
    case Approval::Kind::kOver:
      break;
  }
  return narrowing.kind == Approval::Kind::kAlways ||
         (narrowing.kind == Approval::Kind::kOver && narrowing.argument == frame.argument &&
          narrowing.value <= frame.value);
}

// Appends why `rule` (from the policy called `who`) wants approval for this call, if it does.
void AddApprovalReason(const Rule& rule, const char* who, const ToolInfo& tool,
                       const Json& arguments, std::vector<std::string>& reasons) {
  const Approval& a = rule.approval;
  const std::string owner = std::string("the ") + who + "'s";
  switch (a.kind) {
    case Approval::Kind::kNever:
      return;
    case Approval::Kind::kAlways:
      reasons.push_back(tool.name + ": " + owner + " rule " + rule.tool +
                        " always requires approval");
      return;
    case Approval::Kind::kOver:
      break;
  }
  const Json* arg = arguments.is_object() ? Field(arguments, a.argument) : nullptr;
  if (arg == nullptr || !arg->is_number() || !std::isfinite(arg->get<double>())) {
    // Fail safe: a model can omit or garble the argument to slip under the threshold.
    reasons.push_back(tool.name + ": " + a.argument + " is missing or not a number, so " + owner +
                      " threshold " + FormatNumber(a.value) + " requires approval");
    return;
  }
  if (arg->get<double>() > a.value) {
    reasons.push_back(tool.name + ": " + a.argument + " " + DumpJson(*arg) + " is over " + owner +
                      " threshold " + FormatNumber(a.value));
  }
}

Decision Deny(std::string reason) { return {Decision::Kind::kDeny, std::move(reason)}; }

}  // namespace

Result<Role> ParseRole(std::string_view name) {
  if (name == "owner") return Role::kOwner;
  if (name == "user") return Role::kUser;
  if (name == "guest") return Role::kGuest;
  return InvalidArgument("unknown role " + Quoted(name) + " (roles are owner, user, guest)");
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kOwner:
      return "owner";
    case Role::kUser:
      return "user";
    case Role::kGuest:
      return "guest";
  }
  return "unknown";
}

bool GlobMatches(std::string_view glob, std::string_view tool) {
  if (IsGlob(glob)) return tool.starts_with(glob.substr(0, glob.size() - 1));
  return glob == tool;
}

Result<Policy> ParsePolicy(const Json& doc) {
  if (!doc.is_object()) return InvalidArgument("policy: must be a JSON object");
  KEEL_RETURN_IF_ERROR(
      CheckNoUnknownFields(doc,
                           {"rules", "deny", "require_approval", "separate_approver", "approvers",
                            "approval_in_conversation"},
                           ""));
  Policy policy;
  if (const Json* rules = Field(doc, "rules")) {
    if (!rules->is_array()) return InvalidArgument("rules: must be a list");
    if (rules->size() > kMaxEntries) {
      return InvalidArgument("rules: at most " + std::to_string(kMaxEntries) + " rules");
    }
    std::map<std::string, std::size_t> seen;  // glob -> index of the rule that has it
    for (std::size_t i = 0; i < rules->size(); ++i) {
      const std::string path = "rules[" + std::to_string(i) + "]";
      KEEL_ASSIGN_OR_RETURN(Rule rule, ParseRule((*rules)[i], path));
      auto [it, inserted] = seen.emplace(rule.tool, i);
      if (!inserted) {
        return InvalidArgument(path + ".tool: duplicate rule for " + Quoted(rule.tool) +
                               " (also rules[" + std::to_string(it->second) + "])");
      }
      policy.rules.push_back(std::move(rule));
    }
  }
  KEEL_ASSIGN_OR_RETURN(policy.deny, ParseGlobList(doc, "deny"));
  KEEL_ASSIGN_OR_RETURN(policy.require_approval, ParseGlobList(doc, "require_approval"));
  if (const Json* separate = Field(doc, "separate_approver")) {
    if (!separate->is_boolean()) return InvalidArgument("separate_approver: must be a boolean");
    policy.separate_approver = separate->get<bool>();
  }
  if (const Json* approvers = Field(doc, "approvers")) {
    if (!approvers->is_array()) return InvalidArgument("approvers: must be a list of user ids");
    if (approvers->size() > kMaxEntries) {
      return InvalidArgument("approvers: at most " + std::to_string(kMaxEntries) + " users");
    }
    for (std::size_t i = 0; i < approvers->size(); ++i) {
      const Json& id = (*approvers)[i];
      if (!id.is_string() || id.get<std::string>().empty() || id.get<std::string>().size() > 128) {
        return InvalidArgument("approvers[" + std::to_string(i) +
                               "]: must be a user id (1 to 128 characters)");
      }
      policy.approvers.push_back(id.get<std::string>());
    }
  }
  if (const Json* in_conversation = Field(doc, "approval_in_conversation")) {
    if (!in_conversation->is_boolean()) {
      return InvalidArgument("approval_in_conversation: must be a boolean");
    }
    policy.approval_in_conversation = in_conversation->get<bool>();
  }
  return policy;
}

Json PolicyJson(const Policy& policy) {
  Json rules = Json::array();
  for (const Rule& rule : policy.rules) {
    rules.push_back(
        {{"tool", rule.tool}, {"rights", rule.rights}, {"approval", ApprovalJson(rule.approval)}});
  }
  return {{"rules", std::move(rules)},
          {"deny", policy.deny},
          {"require_approval", policy.require_approval},
          {"separate_approver", policy.separate_approver},
          {"approvers", policy.approvers},
          {"approval_in_conversation", policy.approval_in_conversation}};
}

Decision Decide(const Policy* frame, const Policy* narrowing, Role role, const ToolInfo& tool,
                const Json& arguments) {
  const std::pair<const Policy*, const char*> policies[] = {{frame, kFrameName},
                                                            {narrowing, kNarrowingName}};
  for (const auto& [policy, who] : policies) {
    if (policy == nullptr) continue;
    if (const std::string* glob = FirstMatch(policy->deny, tool.name)) {
      return Deny(tool.name + " is denied by the " + who + " (deny " + *glob + ")");
    }
  }

  const Rule* frame_rule = frame != nullptr ? FindRule(*frame, tool.name) : nullptr;
  if (frame != nullptr && frame_rule == nullptr) {
    return Deny("no rule of the tenant policy covers " + tool.name);
  }
  // A tool the narrowing does not mention keeps the frame's decision.
  const Rule* narrowing_rule = narrowing != nullptr ? FindRule(*narrowing, tool.name) : nullptr;
  const std::pair<const Rule*, const char*> rules[] = {{frame_rule, kFrameName},
                                                       {narrowing_rule, kNarrowingName}};
  // Checking the needed rights against each rule in turn is checking them against the
  // intersection, so an old narrowing can never widen a frame that was tightened later.
  for (const auto& [rule, who] : rules) {
    if (rule == nullptr) continue;
    std::vector<std::string> missing = Missing(tool.rights, rule->rights);
    if (!missing.empty()) {
      return Deny(std::string("the ") + who + "'s rule " + rule->tool + " does not grant " +
                  JoinList(missing) + " to " + tool.name);
    }
  }

  if (role == Role::kGuest) {
    std::vector<std::string> beyond_read = Missing(tool.rights, {"read"});
    if (!beyond_read.empty()) {
      return Deny("guests may only use read tools; " + tool.name + " needs " +
                  JoinList(beyond_read));
    }
  }

  // Approval is a union: either document can ask for it, so the stricter one always applies.
  std::vector<std::string> reasons;
  for (const auto& [rule, who] : rules) {
    if (rule != nullptr) AddApprovalReason(*rule, who, tool, arguments, reasons);
  }
  for (const auto& [policy, who] : policies) {
    if (policy == nullptr) continue;
    if (const std::string* glob = FirstMatch(policy->require_approval, tool.name)) {
      reasons.push_back(tool.name + ": matches " + *glob + " in the " + who +
                        "'s require_approval list");
    }
  }
  if (!reasons.empty()) return {Decision::Kind::kNeedsApproval, JoinList(reasons, "; ")};
  return {Decision::Kind::kAllow, ""};
}

bool SeparateApprover(const Policy* frame, const Policy* narrowing) {
  return (frame != nullptr && frame->separate_approver) ||
         (narrowing != nullptr && narrowing->separate_approver);
}

std::vector<std::string> Approvers(const Policy* frame, const Policy* narrowing) {
  if (narrowing != nullptr && !narrowing->approvers.empty()) return narrowing->approvers;
  if (frame != nullptr) return frame->approvers;
  return {};
}

bool ApprovalInConversation(const Policy* frame, const Policy* narrowing) {
  return (frame != nullptr && frame->approval_in_conversation) ||
         (narrowing != nullptr && narrowing->approval_in_conversation);
}

Status CheckNarrowing(const Policy* frame, const Policy& narrowing) {
  if (frame == nullptr) return Status::Ok();  // everything is allowed; nothing to widen from
  for (std::size_t i = 0; i < narrowing.rules.size(); ++i) {
    const Rule& rule = narrowing.rules[i];
    const std::string prefix =
        "rules[" + std::to_string(i) + "]: narrowing rule for " + rule.tool + " ";
    // Matching the glob's own text as a tool name finds the frame rule deciding every tool the
    // glob covers: an exact frame rule never contains '*', and a frame glob matches the text
    // exactly when its prefix is a prefix of the narrowing glob's prefix.
    const Rule* frame_rule = FindRule(*frame, rule.tool);
    if (frame_rule == nullptr) {
      if (rule.rights.empty()) continue;
      return InvalidArgument(prefix + "grants rights but the tenant policy grants none");
    }
    std::vector<std::string> extra = Missing(rule.rights, frame_rule->rights);
    if (!extra.empty()) {
      return InvalidArgument(prefix + "widens rights: it grants " + JoinList(extra) +
                             " which the tenant policy's rule " + frame_rule->tool + " does not");
    }
    if (!NoLooser(rule.approval, frame_rule->approval)) {
      return InvalidArgument(prefix +
                             "widens approval: " + Quoted(DescribeApproval(rule.approval)) +
                             " is looser than the tenant policy's rule " + frame_rule->tool + " (" +
                             Quoted(DescribeApproval(frame_rule->approval)) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace keel::policy

#include "keel/policy/policy.h"

#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace keel::policy {
namespace {

using Kind = Decision::Kind;

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllow:
      return "allow";
    case Kind::kDeny:
      return "deny";
    case Kind::kNeedsApproval:
      return "needs_approval";
  }
  return "?";
}

Policy MustParse(const char* text) {
  Result<Policy> policy = ParsePolicy(Json::parse(text));
  EXPECT_TRUE(policy.ok()) << text << ": " << policy.status().ToString();
  return policy.ok() ? *policy : Policy{};
}

// A tenant frame exercising every kind of rule; most decision cases run against it.
constexpr const char* kFrame = R"({
  "rules": [
    {"tool": "*", "rights": ["read"]},
    {"tool": "notes.*", "rights": ["read", "write"]},
    {"tool": "notes.append", "rights": ["write"],
     "approval": {"over": {"argument": "amount", "value": 100}}},
    {"tool": "mail.*", "rights": ["read", "write", "send"], "approval": "always"},
    {"tool": "pay.*", "rights": ["send"]},
    {"tool": "mcp__*", "rights": ["read"]},
    {"tool": "mcp__fs__*", "rights": ["read", "write"]},
    {"tool": "mcp__fs__delete_file", "rights": []},
    {"tool": "empty.*", "rights": []}
  ],
  "deny": ["danger.*", "mcp__shell__exec"],
  "require_approval": ["pay.*"]
})";

// Used both as a frame and as a narrowing.
constexpr const char* kNotesReadOnly = R"({"rules": [{"tool": "notes.*", "rights": ["read"]}]})";

// ---------------------------------------------------------------------------------------------
// Decide: the matrix frame x narrowing x role x tool.

struct DecideCase {
  const char* name;
  const char* frame;      // JSON, or nullptr when the tenant has no frame
  const char* narrowing;  // JSON, or nullptr when the agent has no narrowing
  Role role;
  const char* tool;
  std::vector<std::string> rights;
  const char* arguments;  // JSON
  Kind want;
  const char* reason;  // a fragment the reason must contain ("" for allow)
};

std::ostream& operator<<(std::ostream& os, const DecideCase& c) { return os << c.name; }

// Tables read best one case per paragraph; clang-format would put each field on its own line.
// clang-format off
const DecideCase kDecideCases[] = {
    // No frame: today's behaviour, everything allowed, only guests restricted.
    {"NoFrameAllowsRead", nullptr, nullptr, Role::kUser, "time.now", {"read"}, "{}", Kind::kAllow,
     ""},
    {"NoFrameAllowsWrite", nullptr, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": 1000000})", Kind::kAllow, ""},
    {"NoFrameAllowsSendToOwner", nullptr, nullptr, Role::kOwner, "mail.send", {"send"}, "{}",
     Kind::kAllow, ""},
    {"NoFrameGuestRead", nullptr, nullptr, Role::kGuest, "time.now", {"read"}, "{}", Kind::kAllow,
     ""},
    {"NoFrameGuestWrite", nullptr, nullptr, Role::kGuest, "notes.append", {"write"}, "{}",
     Kind::kDeny, "guests may only use read tools; notes.append needs write"},
    {"NoFrameGuestSend", nullptr, nullptr, Role::kGuest, "mail.send", {"send"}, "{}", Kind::kDeny,
     "guests may only use read tools; mail.send needs send"},
    {"NoFrameGuestReadAndWrite", nullptr, nullptr, Role::kGuest, "notes.edit", {"read", "write"},
     "{}", Kind::kDeny, "notes.edit needs write"},
    {"NoFrameGuestToolWithoutRights", nullptr, nullptr, Role::kGuest, "noop", {}, "{}",
     Kind::kAllow, ""},
    {"NoFrameNarrowingDeny", nullptr, R"({"deny": ["notes.*"]})", Role::kOwner, "notes.append",
     {"write"}, "{}", Kind::kDeny, "notes.append is denied by the agent policy (deny notes.*)"},
    {"NoFrameNarrowingRemovesRight", nullptr, kNotesReadOnly, Role::kUser, "notes.append",
     {"write"}, "{}", Kind::kDeny,
     "the agent policy's rule notes.* does not grant write to notes.append"},
    {"NoFrameNarrowingLeavesOtherTools", nullptr,
     R"({"rules": [{"tool": "notes.*", "rights": []}]})", Role::kUser, "time.now", {"read"}, "{}",
     Kind::kAllow, ""},
    {"NoFrameNarrowingRequireApproval", nullptr, R"({"require_approval": ["notes.append"]})",
     Role::kUser, "notes.append", {"write"}, "{}", Kind::kNeedsApproval,
     "matches notes.append in the agent policy's require_approval list"},
    {"NoFrameNarrowingThreshold", nullptr,
     R"({"rules": [{"tool": "pay.send", "rights": ["send"],
                    "approval": {"over": {"argument": "cents", "value": 500}}}]})",
     Role::kUser, "pay.send", {"send"}, R"({"cents": 501})", Kind::kNeedsApproval,
     "pay.send: cents 501 is over the agent policy's threshold 500"},

    // A frame: uncovered tools are denied, the most specific rule decides.
    {"EmptyFrameDeniesEverything", "{}", nullptr, Role::kOwner, "time.now", {"read"}, "{}",
     Kind::kDeny, "no rule of the tenant policy covers time.now"},
    {"FrameWithoutStarDeniesUncovered", kNotesReadOnly, nullptr, Role::kOwner, "weather.get",
     {"read"}, "{}", Kind::kDeny,
     "no rule of the tenant policy covers weather.get"},
    {"StarCoversRead", kFrame, nullptr, Role::kUser, "time.now", {"read"}, "{}", Kind::kAllow, ""},
    {"StarLacksWrite", kFrame, nullptr, Role::kUser, "todo.add", {"write"}, "{}", Kind::kDeny,
     "the tenant policy's rule * does not grant write to todo.add"},
    {"MissingRightsAreAllNamed", kFrame, nullptr, Role::kOwner, "crm.sync",
     {"read", "write", "send"}, "{}", Kind::kDeny, "rule * does not grant write, send to crm.sync"},
    {"GlobGrantsWrite", kFrame, nullptr, Role::kUser, "notes.edit", {"write"}, "{}", Kind::kAllow,
     ""},
    {"ExactBeatsGlob", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": 5})", Kind::kAllow, ""},
    {"ExactBeatsGlobEvenWhenNarrower", kFrame, nullptr, Role::kUser, "notes.append",
     {"read", "write"}, R"({"amount": 5})", Kind::kDeny,
     "the tenant policy's rule notes.append does not grant read to notes.append"},
    {"LongestGlobWins", kFrame, nullptr, Role::kUser, "mcp__fs__write_file", {"write"}, "{}",
     Kind::kAllow, ""},
    {"ShorterGlobForOtherServer", kFrame, nullptr, Role::kUser, "mcp__git__push", {"write"}, "{}",
     Kind::kDeny, "the tenant policy's rule mcp__* does not grant write to mcp__git__push"},
    {"McpReadUnderServerGlob", kFrame, nullptr, Role::kUser, "mcp__fs__read_file", {"read"}, "{}",
     Kind::kAllow, ""},
    {"McpExactRuleWithNoRights", kFrame, nullptr, Role::kOwner, "mcp__fs__delete_file",
     {"write"}, "{}", Kind::kDeny, "rule mcp__fs__delete_file does not grant write"},
    {"EmptyRightsAllowToolNeedingNone", kFrame, nullptr, Role::kUser, "empty.noop", {}, "{}",
     Kind::kAllow, ""},

    // Deny lists come first, frame before narrowing.
    {"FrameDenyGlob", kFrame, nullptr, Role::kOwner, "danger.rm", {"read"}, "{}", Kind::kDeny,
     "danger.rm is denied by the tenant policy (deny danger.*)"},
    {"FrameDenyExactMcp", kFrame, nullptr, Role::kOwner, "mcp__shell__exec", {"read"}, "{}",
     Kind::kDeny, "mcp__shell__exec is denied by the tenant policy (deny mcp__shell__exec)"},
    {"NarrowingDenyBeatsFrameRule", kFrame, R"({"deny": ["notes.*"]})", Role::kOwner, "notes.edit",
     {"write"}, "{}", Kind::kDeny, "notes.edit is denied by the agent policy (deny notes.*)"},
    {"FrameDenyNamedBeforeNarrowingDeny", kFrame, R"({"deny": ["danger.*"]})", Role::kOwner,
     "danger.rm", {"read"}, "{}", Kind::kDeny, "denied by the tenant policy"},
    {"DenyBeatsGuestAndApproval", kFrame, R"({"deny": ["mail.send"]})", Role::kGuest, "mail.send",
     {"send"}, "{}", Kind::kDeny, "denied by the agent policy (deny mail.send)"},

    // The narrowing only takes away.
    {"NarrowingRemovesRight", kFrame, kNotesReadOnly, Role::kUser, "notes.edit", {"write"}, "{}",
     Kind::kDeny,
     "the agent policy's rule notes.* does not grant write to notes.edit"},
    {"NarrowingKeepsRemainingRight", kFrame, kNotesReadOnly, Role::kUser, "notes.list", {"read"},
     "{}", Kind::kAllow, ""},
    {"NarrowingCannotAddRight", kFrame,
     R"({"rules": [{"tool": "todo.*", "rights": ["read", "write"]}]})", Role::kOwner, "todo.add",
     {"write"}, "{}", Kind::kDeny, "the tenant policy's rule * does not grant write to todo.add"},
    {"NarrowingUnmentionedToolKeepsFrame", kFrame,
     R"({"rules": [{"tool": "mail.*", "rights": []}]})", Role::kUser, "notes.edit", {"write"},
     "{}", Kind::kAllow, ""},
    {"NarrowingCannotCoverWhatFrameDoesNot", kNotesReadOnly,
     R"({"rules": [{"tool": "*", "rights": ["read"]}]})", Role::kOwner, "time.now", {"read"}, "{}",
     Kind::kDeny, "no rule of the tenant policy covers time.now"},
    {"NarrowingAddsAlways", kFrame,
     R"({"rules": [{"tool": "notes.*", "rights": ["read", "write"], "approval": "always"}]})",
     Role::kUser, "notes.edit", {"write"}, "{}", Kind::kNeedsApproval,
     "notes.edit: the agent policy's rule notes.* always requires approval"},
    {"FrameAlways", kFrame, nullptr, Role::kUser, "mail.send", {"send"}, "{}",
     Kind::kNeedsApproval, "mail.send: the tenant policy's rule mail.* always requires approval"},
    {"NarrowingNeverDoesNotLoosenFrameAlways", kFrame,
     R"({"rules": [{"tool": "mail.*", "rights": ["send"], "approval": "never"}]})", Role::kUser,
     "mail.send", {"send"}, "{}", Kind::kNeedsApproval, "the tenant policy's rule mail.*"},

    // Thresholds: over needs approval, equal and below do not, garbage fails safe.
    {"ThresholdOver", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": 150})", Kind::kNeedsApproval,
     "notes.append: amount 150 is over the tenant policy's threshold 100"},
    {"ThresholdOverByFraction", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": 100.5})", Kind::kNeedsApproval, "amount 100.5 is over"},
    {"ThresholdEqualIsNotOver", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": 100})", Kind::kAllow, ""},
    {"ThresholdEqualAsFloat", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": 100.0})", Kind::kAllow, ""},
    {"ThresholdBelow", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": -3})", Kind::kAllow, ""},
    {"ThresholdArgumentMissing", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"text": "hi"})", Kind::kNeedsApproval,
     "amount is missing or not a number, so the tenant policy's threshold 100 requires approval"},
    {"ThresholdArgumentNull", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": null})", Kind::kNeedsApproval, "amount is missing or not a number"},
    {"ThresholdArgumentString", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": "150"})", Kind::kNeedsApproval, "amount is missing or not a number"},
    {"ThresholdArgumentBoolean", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     R"({"amount": true})", Kind::kNeedsApproval, "amount is missing or not a number"},
    {"ThresholdArgumentsNotAnObject", kFrame, nullptr, Role::kUser, "notes.append", {"write"},
     "[150]", Kind::kNeedsApproval, "amount is missing or not a number"},
    {"NarrowingLowersThreshold", kFrame,
     R"({"rules": [{"tool": "notes.append", "rights": ["write"],
                    "approval": {"over": {"argument": "amount", "value": 50}}}]})",
     Role::kUser, "notes.append", {"write"}, R"({"amount": 75})", Kind::kNeedsApproval,
     "notes.append: amount 75 is over the agent policy's threshold 50"},
    {"NarrowingHigherThresholdDoesNotLoosen", kFrame,
     R"({"rules": [{"tool": "notes.append", "rights": ["write"],
                    "approval": {"over": {"argument": "amount", "value": 500}}}]})",
     Role::kUser, "notes.append", {"write"}, R"({"amount": 150})", Kind::kNeedsApproval,
     "amount 150 is over the tenant policy's threshold 100"},
    {"NarrowingThresholdOnOtherArgument", kFrame,
     R"({"rules": [{"tool": "notes.*", "rights": ["read", "write"],
                    "approval": {"over": {"argument": "length", "value": 10}}}]})",
     Role::kUser, "notes.edit", {"write"}, R"({"length": 11})", Kind::kNeedsApproval,
     "notes.edit: length 11 is over the agent policy's threshold 10"},

    // require_approval lists.
    {"FrameRequireApproval", kFrame, nullptr, Role::kUser, "pay.transfer", {"send"}, "{}",
     Kind::kNeedsApproval, "pay.transfer: matches pay.* in the tenant policy's require_approval"},
    {"NarrowingRequireApproval", kFrame, R"({"require_approval": ["notes.*"]})", Role::kUser,
     "notes.edit", {"write"}, "{}", Kind::kNeedsApproval,
     "matches notes.* in the agent policy's require_approval list"},
    {"ApprovalReasonsAreCombined", kFrame, R"({"require_approval": ["mail.send"]})", Role::kUser,
     "mail.send", {"send"}, "{}", Kind::kNeedsApproval,
     "always requires approval; mail.send: matches mail.send in the agent policy's"},

    // Roles under a frame: the rights check runs first, then the guest restriction.
    {"OwnerWriteUnderFrame", kFrame, nullptr, Role::kOwner, "notes.edit", {"write"}, "{}",
     Kind::kAllow, ""},
    {"GuestReadUnderFrame", kFrame, nullptr, Role::kGuest, "time.now", {"read"}, "{}",
     Kind::kAllow, ""},
    {"GuestMcpRead", kFrame, nullptr, Role::kGuest, "mcp__fs__read_file", {"read"}, "{}",
     Kind::kAllow, ""},
    {"GuestWriteDeniedThoughFrameGrants", kFrame, nullptr, Role::kGuest, "notes.edit", {"write"},
     "{}", Kind::kDeny, "guests may only use read tools; notes.edit needs write"},
    {"GuestSendDeniedBeforeApproval", kFrame, nullptr, Role::kGuest, "mail.send", {"send"}, "{}",
     Kind::kDeny, "guests may only use read tools; mail.send needs send"},
    {"GuestMcpWriteDenied", kFrame, nullptr, Role::kGuest, "mcp__fs__write_file",
     {"read", "write"}, "{}", Kind::kDeny, "mcp__fs__write_file needs write"},
    {"GuestPolicyReasonComesFirst", kFrame, nullptr, Role::kGuest, "todo.add", {"write"}, "{}",
     Kind::kDeny, "the tenant policy's rule * does not grant write"},
};
// clang-format on

class DecideTest : public testing::TestWithParam<DecideCase> {};

TEST_P(DecideTest, Decides) {
  const DecideCase& c = GetParam();
  std::optional<Policy> frame, narrowing;
  if (c.frame != nullptr) frame = MustParse(c.frame);
  if (c.narrowing != nullptr) narrowing = MustParse(c.narrowing);
  Decision d = Decide(frame ? &*frame : nullptr, narrowing ? &*narrowing : nullptr, c.role,
                      ToolInfo{c.tool, c.rights}, Json::parse(c.arguments));
  EXPECT_EQ(KindName(d.kind), std::string(KindName(c.want))) << d.reason;
  if (c.want == Kind::kAllow) {
    EXPECT_EQ(d.reason, "");
  } else {
    EXPECT_NE(d.reason.find(c.reason), std::string::npos)
        << "reason: " << d.reason << "\nwanted fragment: " << c.reason;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, DecideTest, testing::ValuesIn(kDecideCases),
                         [](const testing::TestParamInfo<DecideCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

// ---------------------------------------------------------------------------------------------
// ParsePolicy: errors name the path of the offending field.

struct ParseErrorCase {
  const char* name;
  const char* doc;
  const char* error;  // a fragment of the error message
};

std::ostream& operator<<(std::ostream& os, const ParseErrorCase& c) { return os << c.name; }

// Tables read best one case per paragraph; clang-format would put each field on its own line.
// clang-format off
const ParseErrorCase kParseErrorCases[] = {
    {"NotAnObject", "[]", "policy: must be a JSON object"},
    {"UnknownTopLevelField", R"({"rule": []})", "rule: unknown field"},
    {"UnknownRuleField",
     R"({"rules": [{"tool": "a", "rights": []}, {"tool": "b", "rights": []},
                   {"tool": "c", "rights": [], "aproval": "never"}]})",
     "rules[2].aproval: unknown field"},
    {"UnknownApprovalField",
     R"({"rules": [{"tool": "a", "rights": [], "approval": {"under": 1}}]})",
     "rules[0].approval.under: unknown field"},
    {"UnknownOverField",
     R"({"rules": [{"tool": "a", "rights": [],
                    "approval": {"over": {"argument": "n", "value": 1, "unit": "usd"}}}]})",
     "rules[0].approval.over.unit: unknown field"},
    {"RulesNotAList", R"({"rules": {}})", "rules: must be a list"},
    {"RuleNotAnObject", R"({"rules": ["notes.*"]})", "rules[0]: must be an object"},
    {"ToolMissing", R"({"rules": [{"rights": []}]})", "rules[0].tool: required"},
    {"ToolNotAString", R"({"rules": [{"tool": 7, "rights": []}]})",
     "rules[0].tool: must be a string"},
    {"EmptyGlob", R"({"rules": [{"tool": "", "rights": []}]})", "rules[0].tool: empty tool glob"},
    {"StarInTheMiddle", R"({"rules": [{"tool": "notes.*.x", "rights": []}]})",
     "rules[0].tool: \"notes.*.x\": '*' may only end a glob"},
    {"LeadingStar", R"({"rules": [{"tool": "*.append", "rights": []}]})",
     "'*' may only end a glob"},
    {"DoubleStar", R"({"rules": [{"tool": "**", "rights": []}]})", "'*' may only end a glob"},
    {"BadCharacter", R"({"rules": [{"tool": "notes append", "rights": []}]})",
     "rules[0].tool: \"notes append\": tool names use only"},
    {"SlashInGlob", R"({"deny": ["ok", "fs/read"]})", "deny[1]: \"fs/read\": tool names use only"},
    {"EmptyDenyGlob", R"({"deny": [""]})", "deny[0]: empty tool glob"},
    {"RequireApprovalBadGlob", R"({"require_approval": ["a*b"]})",
     "require_approval[0]: \"a*b\": '*' may only end a glob"},
    {"DenyNotAList", R"({"deny": "danger.*"})", "deny: must be a list"},
    {"RequireApprovalNotAList", R"({"require_approval": 1})", "require_approval: must be a list"},
    {"DenyItemNotAString", R"({"deny": [1]})", "deny[0]: must be a string"},
    {"RightsMissing", R"({"rules": [{"tool": "a"}]})", "rules[0].rights: required"},
    {"RightsNotAList", R"({"rules": [{"tool": "a", "rights": "read"}]})",
     "rules[0].rights: must be a list"},
    {"RightNotAString", R"({"rules": [{"tool": "a", "rights": [1]}]})",
     "rules[0].rights[0]: must be a string"},
    {"UnknownRight", R"({"rules": [{"tool": "a", "rights": ["read", "admin"]}]})",
     "rules[0].rights[1]: unknown right \"admin\""},
    {"DuplicateRight", R"({"rules": [{"tool": "a", "rights": ["read", "read"]}]})",
     "rules[0].rights[1]: duplicate right \"read\""},
    {"DuplicateGlob",
     R"({"rules": [{"tool": "notes.*", "rights": []}, {"tool": "x", "rights": []},
                   {"tool": "notes.*", "rights": ["read"]}]})",
     "rules[2].tool: duplicate rule for \"notes.*\" (also rules[0])"},
    {"ApprovalUnknownWord", R"({"rules": [{"tool": "a", "rights": [], "approval": "sometimes"}]})",
     "rules[0].approval: must be \"never\", \"always\" or {\"over\""},
    {"ApprovalNumber", R"({"rules": [{"tool": "a", "rights": [], "approval": 100}]})",
     "rules[0].approval: must be"},
    {"ApprovalEmptyObject", R"({"rules": [{"tool": "a", "rights": [], "approval": {}}]})",
     "rules[0].approval.over: required"},
    {"OverNotAnObject", R"({"rules": [{"tool": "a", "rights": [], "approval": {"over": 100}}]})",
     "rules[0].approval.over: must be an object"},
    {"OverArgumentMissing",
     R"({"rules": [{"tool": "a", "rights": [], "approval": {"over": {"value": 1}}}]})",
     "rules[0].approval.over.argument: required"},
    {"OverArgumentEmpty",
     R"({"rules": [{"tool": "a", "rights": [],
                    "approval": {"over": {"argument": "", "value": 1}}}]})",
     "rules[0].approval.over.argument: must be a non-empty string"},
    {"OverValueMissing",
     R"({"rules": [{"tool": "a", "rights": [], "approval": {"over": {"argument": "n"}}}]})",
     "rules[0].approval.over.value: required"},
    {"OverValueString",
     R"({"rules": [{"tool": "a", "rights": [],
                    "approval": {"over": {"argument": "n", "value": "100"}}}]})",
     "rules[0].approval.over.value: must be a number"},
    {"OverValueNegative",
     R"({"rules": [{"tool": "a", "rights": [],
                    "approval": {"over": {"argument": "n", "value": -1}}}]})",
     "rules[0].approval.over.value: must be a finite number >= 0"},
    {"SeparateApproverNotABool", R"({"separate_approver": "yes"})",
     "separate_approver: must be a boolean"},
};
// clang-format on

class ParseErrorTest : public testing::TestWithParam<ParseErrorCase> {};

TEST_P(ParseErrorTest, RejectsWithPath) {
  const ParseErrorCase& c = GetParam();
  Result<Policy> policy = ParsePolicy(Json::parse(c.doc));
  ASSERT_FALSE(policy.ok()) << c.doc;
  EXPECT_EQ(policy.status().code(), Code::kInvalidArgument);
  EXPECT_NE(policy.status().message().find(c.error), std::string::npos)
      << "error: " << policy.status().message() << "\nwanted fragment: " << c.error;
}

INSTANTIATE_TEST_SUITE_P(Errors, ParseErrorTest, testing::ValuesIn(kParseErrorCases),
                         [](const testing::TestParamInfo<ParseErrorCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(ParsePolicyTest, RejectsNonFiniteThreshold) {
  for (double v :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Json doc = Json::parse(
        R"({"rules": [{"tool": "a", "rights": [], "approval": {"over": {"argument": "n"}}}]})");
    doc["rules"][0]["approval"]["over"]["value"] = v;
    Result<Policy> policy = ParsePolicy(doc);
    ASSERT_FALSE(policy.ok());
    EXPECT_EQ(policy.status().message(),
              "rules[0].approval.over.value: must be a finite number >= 0");
  }
}

TEST(ParsePolicyTest, LimitsEntriesToAThousand) {
  Json rules = Json::array();
  Json globs = Json::array();
  for (int i = 0; i < 1000; ++i) {
    rules.push_back({{"tool", "t" + std::to_string(i)}, {"rights", Json::array()}});
    globs.push_back("t" + std::to_string(i));
  }
  EXPECT_TRUE(ParsePolicy({{"rules", rules}, {"deny", globs}, {"require_approval", globs}}).ok());

  rules.push_back({{"tool", "t1000"}, {"rights", Json::array()}});
  globs.push_back("t1000");
  Result<Policy> too_many_rules = ParsePolicy({{"rules", rules}});
  ASSERT_FALSE(too_many_rules.ok());
  EXPECT_EQ(too_many_rules.status().message(), "rules: at most 1000 rules");
  Result<Policy> too_many_globs = ParsePolicy({{"deny", globs}});
  ASSERT_FALSE(too_many_globs.ok());
  EXPECT_EQ(too_many_globs.status().message(), "deny: at most 1000 globs");
}

TEST(ParsePolicyTest, EmptyDocumentTakesDefaults) {
  Policy p = MustParse("{}");
  EXPECT_TRUE(p.rules.empty());
  EXPECT_TRUE(p.deny.empty());
  EXPECT_TRUE(p.require_approval.empty());
  EXPECT_FALSE(p.separate_approver);
  EXPECT_TRUE(p.approvers.empty());
  EXPECT_FALSE(p.approval_in_conversation);
  EXPECT_EQ(PolicyJson(p), Json::parse(R"({"rules": [], "deny": [], "require_approval": [],
                                           "separate_approver": false, "approvers": [],
                                           "approval_in_conversation": false})"));
}

// Who decides from a chat card and where a card may go: the agent's named approvers, else the
// tenant's, else none (the agent's owners); either document allows a card in the conversation.
TEST(ParsePolicyTest, ApproversAndCardsInTheConversation) {
  Policy frame = MustParse(R"({"approvers": ["u1", "u2"]})");
  Policy narrowing = MustParse(R"({"approvers": ["u3"], "approval_in_conversation": true})");
  Policy silent = MustParse("{}");
  using V = std::vector<std::string>;
  EXPECT_EQ(Approvers(&frame, &narrowing), V({"u3"}));
  EXPECT_EQ(Approvers(&frame, &silent), V({"u1", "u2"}));
  EXPECT_EQ(Approvers(&frame, nullptr), V({"u1", "u2"}));
  EXPECT_EQ(Approvers(nullptr, nullptr), V());
  EXPECT_TRUE(ApprovalInConversation(&frame, &narrowing));
  EXPECT_TRUE(ApprovalInConversation(&narrowing, nullptr));
  EXPECT_FALSE(ApprovalInConversation(&frame, &silent));
  EXPECT_EQ(PolicyJson(narrowing)["approvers"], Json::array({"u3"}));
  for (const char* bad : {R"({"approvers": "u1"})", R"({"approvers": [1]})",
                          R"({"approvers": [""]})", R"({"approval_in_conversation": "yes"})"}) {
    auto parsed = ParsePolicy(Json::parse(bad));
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument) << bad;
  }
  auto long_id = ParsePolicy(Json{{"approvers", Json::array({std::string(129, 'u')})}});
  EXPECT_NE(long_id.status().message().find("approvers[0]"), std::string::npos);
  Json many = Json::array();
  for (int i = 0; i < 1001; ++i) many.push_back("u" + std::to_string(i));
  EXPECT_EQ(ParsePolicy(Json{{"approvers", many}}).status().code(), Code::kInvalidArgument);
}

TEST(ParsePolicyTest, NullMeansAbsent) {
  Policy p = MustParse(R"({"rules": [{"tool": "a", "rights": ["read"], "approval": null}],
                           "deny": null, "require_approval": null, "separate_approver": null})");
  ASSERT_EQ(p.rules.size(), 1u);
  EXPECT_EQ(p.rules[0].approval.kind, Approval::Kind::kNever);
  EXPECT_FALSE(p.separate_approver);
}

TEST(ParsePolicyTest, CanonicalFormIsStable) {
  Policy p = MustParse(R"({
    "separate_approver": true,
    "rules": [
      {"tool": "mail.*", "rights": ["send", "read", "write"]},
      {"tool": "notes.append", "rights": ["write"], "approval": "always"},
      {"tool": "pay.*", "rights": ["send"],
       "approval": {"over": {"argument": "cents", "value": 100}}},
      {"tool": "*", "rights": [], "approval": {"over": {"argument": "n", "value": 2.5}}}
    ],
    "deny": ["danger.*"]
  })");
  Json canonical = PolicyJson(p);
  EXPECT_EQ(canonical, Json::parse(R"({
    "rules": [
      {"tool": "mail.*", "rights": ["read", "write", "send"], "approval": "never"},
      {"tool": "notes.append", "rights": ["write"], "approval": "always"},
      {"tool": "pay.*", "rights": ["send"],
       "approval": {"over": {"argument": "cents", "value": 100}}},
      {"tool": "*", "rights": [], "approval": {"over": {"argument": "n", "value": 2.5}}}
    ],
    "deny": ["danger.*"],
    "require_approval": [],
    "separate_approver": true,
    "approvers": [],
    "approval_in_conversation": false
  })"));
  EXPECT_EQ(DumpJson(canonical["rules"][2]["approval"]["over"]["value"]), "100");
  Result<Policy> again = ParsePolicy(canonical);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(DumpJson(PolicyJson(*again)), DumpJson(canonical));
}

// ---------------------------------------------------------------------------------------------
// CheckNarrowing: a narrowing may not widen the frame.

struct NarrowingCase {
  const char* name;
  const char* frame;  // JSON, or nullptr when the tenant has no frame
  const char* narrowing;
  const char* error;  // nullptr when the narrowing is accepted, else a fragment of the error
};

std::ostream& operator<<(std::ostream& os, const NarrowingCase& c) { return os << c.name; }

constexpr const char* kThresholdFrame = R"({"rules": [
  {"tool": "pay.send", "rights": ["send"],
   "approval": {"over": {"argument": "cents", "value": 1000}}}]})";
constexpr const char* kAlwaysFrame =
    R"({"rules": [{"tool": "mail.*", "rights": ["send"], "approval": "always"}]})";

// Tables read best one case per paragraph; clang-format would put each field on its own line.
// clang-format off
const NarrowingCase kNarrowingCases[] = {
    {"NoFrameAcceptsAnything", nullptr,
     R"({"rules": [{"tool": "*", "rights": ["read", "write", "send"]}],
         "separate_approver": true})",
     nullptr},
    {"EmptyNarrowing", kFrame, "{}", nullptr},
    {"SubsetOfRights", kFrame, kNotesReadOnly, nullptr},
    {"SameRights", kFrame, R"({"rules": [{"tool": "notes.*", "rights": ["read", "write"]}]})",
     nullptr},
    {"WideningRights", kNotesReadOnly,
     R"({"rules": [{"tool": "notes.*", "rights": ["read", "write", "send"]}]})",
     "rules[0]: narrowing rule for notes.* widens rights: it grants write, send which the tenant "
     "policy's rule notes.* does not"},
    {"ErrorNamesTheRuleIndex", kFrame,
     R"({"rules": [{"tool": "notes.*", "rights": ["read"]},
                   {"tool": "time.now", "rights": ["write"]}]})",
     "rules[1]: narrowing rule for time.now widens rights: it grants write"},
    {"NoFrameRuleButRights", kNotesReadOnly,
     R"({"rules": [{"tool": "mail.send", "rights": ["send"]}]})",
     "narrowing rule for mail.send grants rights but the tenant policy grants none"},
    {"NoFrameRuleAndNoRights", kNotesReadOnly,
     R"({"rules": [{"tool": "mail.send", "rights": [], "approval": "always"}]})", nullptr},
    {"NarrowingGlobWiderThanFrameGlob", kNotesReadOnly,
     R"({"rules": [{"tool": "*", "rights": ["read"]}]})",
     "narrowing rule for * grants rights but the tenant policy grants none"},
    {"PrefixWithoutDotIsWider", kNotesReadOnly,
     R"({"rules": [{"tool": "notes*", "rights": ["read"]}]})",
     "narrowing rule for notes* grants rights"},
    {"GlobUnderShorterGlob", R"({"rules": [{"tool": "mcp__*", "rights": ["read"]}]})",
     R"({"rules": [{"tool": "mcp__fs__*", "rights": ["read"]}]})", nullptr},
    {"GlobUnderShorterGlobWidens", R"({"rules": [{"tool": "mcp__*", "rights": ["read"]}]})",
     R"({"rules": [{"tool": "mcp__fs__*", "rights": ["read", "write"]}]})",
     "narrowing rule for mcp__fs__* widens rights: it grants write which the tenant policy's rule "
     "mcp__* does not"},
    {"GlobUnderLongestFrameGlob", kFrame,
     R"({"rules": [{"tool": "mcp__fs__x*", "rights": ["read", "write"]}]})", nullptr},
    {"GlobIsNotDecidedByExactFrameRule",
     R"({"rules": [{"tool": "notes.append", "rights": ["write"]}]})",
     R"({"rules": [{"tool": "notes.*", "rights": ["write"]}]})",
     "narrowing rule for notes.* grants rights but the tenant policy grants none"},
    {"ExactUnderExactFrameRule", kFrame,
     R"({"rules": [{"tool": "notes.append", "rights": ["write"],
                    "approval": {"over": {"argument": "amount", "value": 100}}}]})",
     nullptr},
    {"ExactUnderExactFrameRuleWidens", kFrame,
     R"({"rules": [{"tool": "notes.append", "rights": ["read", "write"], "approval": "always"}]})",
     "narrowing rule for notes.append widens rights: it grants read which the tenant policy's "
     "rule notes.append does not"},
    {"ExactUnderFrameGlob", kFrame,
     R"({"rules": [{"tool": "mcp__fs__read_file", "rights": ["read"]}]})",
     nullptr},
    {"LowerThreshold", kThresholdFrame,
     R"({"rules": [{"tool": "pay.send", "rights": ["send"],
                    "approval": {"over": {"argument": "cents", "value": 500}}}]})",
     nullptr},
    {"EqualThreshold", kThresholdFrame,
     R"({"rules": [{"tool": "pay.send", "rights": ["send"],
                    "approval": {"over": {"argument": "cents", "value": 1000}}}]})",
     nullptr},
    {"LooserThreshold", kThresholdFrame,
     R"({"rules": [{"tool": "pay.send", "rights": ["send"],
                    "approval": {"over": {"argument": "cents", "value": 1001}}}]})",
     "narrowing rule for pay.send widens approval: \"over cents 1001\" is looser than the tenant "
     "policy's rule pay.send (\"over cents 1000\")"},
    {"ThresholdOnDifferentArgument", kThresholdFrame,
     R"({"rules": [{"tool": "pay.send", "rights": ["send"],
                    "approval": {"over": {"argument": "dollars", "value": 1}}}]})",
     "widens approval: \"over dollars 1\""},
    {"ThresholdNarrowedToAlways", kThresholdFrame,
     R"({"rules": [{"tool": "pay.send", "rights": ["send"], "approval": "always"}]})", nullptr},
    {"ThresholdDroppedToNever", kThresholdFrame,
     R"({"rules": [{"tool": "pay.send", "rights": ["send"]}]})",
     "widens approval: \"never\" is looser"},
    {"FrameAlwaysNarrowingNever", kAlwaysFrame,
     R"({"rules": [{"tool": "mail.*", "rights": ["send"], "approval": "never"}]})",
     "narrowing rule for mail.* widens approval: \"never\" is looser than the tenant policy's rule "
     "mail.* (\"always\")"},
    {"FrameAlwaysNarrowingThreshold", kAlwaysFrame,
     R"({"rules": [{"tool": "mail.send", "rights": ["send"],
                    "approval": {"over": {"argument": "n", "value": 0}}}]})",
     "narrowing rule for mail.send widens approval"},
    {"FrameAlwaysNarrowingAlways", kAlwaysFrame,
     R"({"rules": [{"tool": "mail.send", "rights": ["send"], "approval": "always"}]})", nullptr},
    {"FrameNeverNarrowingThreshold", kFrame,
     R"({"rules": [{"tool": "notes.*", "rights": ["write"],
                    "approval": {"over": {"argument": "length", "value": 10}}}]})",
     nullptr},
    {"SeparateApproverFalseUnderTrue", R"({"separate_approver": true})",
     R"({"separate_approver": false})", nullptr},
    {"DenyAndRequireApprovalOnlyTakeAway", kNotesReadOnly,
     R"({"deny": ["*"], "require_approval": ["*"], "separate_approver": true})", nullptr},
};
// clang-format on

class CheckNarrowingTest : public testing::TestWithParam<NarrowingCase> {};

TEST_P(CheckNarrowingTest, Checks) {
  const NarrowingCase& c = GetParam();
  std::optional<Policy> frame;
  if (c.frame != nullptr) frame = MustParse(c.frame);
  Status status = CheckNarrowing(frame ? &*frame : nullptr, MustParse(c.narrowing));
  if (c.error == nullptr) {
    EXPECT_TRUE(status.ok()) << status.ToString();
  } else {
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), Code::kInvalidArgument);
    EXPECT_NE(status.message().find(c.error), std::string::npos)
        << "error: " << status.message() << "\nwanted fragment: " << c.error;
  }
}

INSTANTIATE_TEST_SUITE_P(Table, CheckNarrowingTest, testing::ValuesIn(kNarrowingCases),
                         [](const testing::TestParamInfo<NarrowingCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(CheckNarrowingTest, WideningErrorsSayWidens) {
  Policy frame = MustParse(kThresholdFrame);
  Status rights =
      CheckNarrowing(&frame, MustParse(R"({"rules": [{"tool": "pay.send", "rights": ["read"]}]})"));
  Status approval =
      CheckNarrowing(&frame, MustParse(R"({"rules": [{"tool": "pay.send", "rights": ["send"]}]})"));
  EXPECT_NE(rights.message().find("widens"), std::string::npos) << rights.message();
  EXPECT_NE(approval.message().find("widens"), std::string::npos) << approval.message();
}

// A frame tightened after the narrowing was accepted is still not widened at decision time.
TEST(CheckNarrowingTest, DecisionIntersectsWithALaterTighterFrame) {
  Policy old_frame = MustParse(R"({"rules": [{"tool": "notes.*", "rights": ["read", "write"]}]})");
  Policy narrowing = MustParse(R"({"rules": [{"tool": "notes.*", "rights": ["read", "write"]}]})");
  ASSERT_TRUE(CheckNarrowing(&old_frame, narrowing).ok());
  Policy new_frame = MustParse(kNotesReadOnly);
  EXPECT_FALSE(CheckNarrowing(&new_frame, narrowing).ok());
  Decision d = Decide(&new_frame, &narrowing, Role::kOwner, {"notes.append", {"write"}}, {});
  EXPECT_EQ(d.kind, Kind::kDeny);
  EXPECT_NE(d.reason.find("the tenant policy's rule notes.*"), std::string::npos) << d.reason;
}

// ---------------------------------------------------------------------------------------------
// Small pieces.

TEST(GlobMatchesTest, ExactStarAndPrefix) {
  struct {
    const char* glob;
    const char* tool;
    bool want;
  } cases[] = {
      {"notes.append", "notes.append", true},
      {"notes.append", "notes.append2", false},
      {"notes.append", "notes", false},
      {"*", "anything", true},
      {"*", "mcp__fs__read_file", true},
      {"notes.*", "notes.append", true},
      {"notes.*", "notes.", true},
      {"notes.*", "notes", false},
      {"notes.*", "notesy.append", false},
      {"notes*", "notesy.append", true},
      {"mcp__fs__*", "mcp__fs__read_file", true},
      {"mcp__fs__*", "mcp__fsx__read", false},
      {"mcp__fs__read_file", "mcp__fs__read_file", true},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(GlobMatches(c.glob, c.tool), c.want) << c.glob << " vs " << c.tool;
  }
}

TEST(RoleTest, ParsesAndNamesRoles) {
  for (Role role : {Role::kOwner, Role::kUser, Role::kGuest}) {
    Result<Role> parsed = ParseRole(RoleName(role));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, role);
  }
  EXPECT_STREQ(RoleName(Role::kGuest), "guest");
  Result<Role> bad = ParseRole("admin");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(ParseRole("Owner").ok());
}

TEST(SeparateApproverTest, EitherDocumentTurnsItOn) {
  Policy on = MustParse(R"({"separate_approver": true})");
  Policy off = MustParse("{}");
  EXPECT_FALSE(SeparateApprover(nullptr, nullptr));
  EXPECT_FALSE(SeparateApprover(&off, &off));
  EXPECT_TRUE(SeparateApprover(&on, nullptr));
  EXPECT_TRUE(SeparateApprover(nullptr, &on));
  EXPECT_TRUE(SeparateApprover(&on, &off));
  EXPECT_TRUE(SeparateApprover(&off, &on));
}

}  // namespace
}  // namespace keel::policy

// The JSON Schema checker of tool arguments (keel/tools/schema): the bounds of its subset, and a
// schema whose bounds have the wrong kind, which is refused rather than ignored.

#include "keel/tools/schema.h"

#include <gtest/gtest.h>

namespace keel::tools {
namespace {

Json Parse(const std::string& text) { return Json::parse(text); }

std::string Why(const Json& schema, const Json& arguments) {
  Status s = CheckArguments(schema, arguments);
  return s.ok() ? "ok" : s.message();
}

TEST(Schema, CountsBoundStringsAndArrays) {
  Json schema = Parse(R"({"properties": {"s": {"minLength": 2, "maxLength": 3},
                                          "a": {"minItems": 1, "maxItems": 2.0}}})");
  EXPECT_EQ(Why(schema, {{"s", "ab"}, {"a", Json::array({1})}}), "ok");
  EXPECT_EQ(Why(schema, {{"s", "a"}}), "arguments.s: shorter than 2 characters");
  EXPECT_EQ(Why(schema, {{"s", "abcd"}}), "arguments.s: longer than 3 characters");
  EXPECT_EQ(Why(schema, {{"a", Json::array()}}), "arguments.a: fewer than 1 items");
  EXPECT_EQ(Why(schema, {{"a", Json::array({1, 2, 3})}}), "arguments.a: more than 2 items");
}

// A Lua plugin's schema arrives with signed integers (lua_Integer), which count all the same.
TEST(Schema, SignedIntegerCountsAreEnforced) {
  Json schema = {{"properties", {{"s", {{"minLength", int64_t{5}}}}}}};
  EXPECT_EQ(Why(schema, {{"s", "abc"}}), "arguments.s: shorter than 5 characters");
}

// 1e300 as a count is past any size; reading it must not cast it to an integer (undefined).
TEST(Schema, HugeCountsSaturateInsteadOfOverflowing) {
  Json schema = Parse(R"({"properties": {"s": {"minLength": 1e19}, "t": {"maxLength": 1e300},
                                          "a": {"minItems": 1e300}}})");
  EXPECT_EQ(CheckSchema(schema, "schema").message(), "");
  EXPECT_EQ(Why(schema, {{"s", "abc"}}),
            "arguments.s: shorter than 10000000000000000000 characters");
  EXPECT_EQ(Why(schema, {{"t", "abc"}}), "ok");
  EXPECT_EQ(Why(schema, {{"a", Json::array({1})}}),
            "arguments.a: fewer than 18446744073709551615 items");
}

TEST(Schema, BoundsOfTheWrongKindAreRefusedWithTheirPath) {
  struct Case {
    const char* schema;
    const char* why;
  };
  for (const Case& c : std::initializer_list<Case>{
           {R"({"properties": {"s": {"minLength": "5"}}})",
            R"(schema.properties.s.minLength: must be a non-negative integer, got "5")"},
           {R"({"maxLength": -1})", "schema.maxLength: must be a non-negative integer, got -1"},
           {R"({"items": {"minItems": 1.5}})",
            "schema.items.minItems: must be a non-negative integer, got 1.5"},
           {R"({"additionalProperties": {"maxItems": null}})",
            "schema.additionalProperties.maxItems: must be a non-negative integer, got null"},
           {R"({"minimum": "0"})", R"(schema.minimum: must be a number, got "0")"},
           {R"({"properties": {"n": {"maximum": [10]}}})",
            "schema.properties.n.maximum: must be a number, got [10]"},
       }) {
    Json schema = Parse(c.schema);
    EXPECT_EQ(CheckSchema(schema, "schema").message(), c.why) << c.schema;
    // At a call too, whatever the arguments: a bound is never silently dropped.
    EXPECT_EQ(Why(schema, Json::object()), c.why) << c.schema;
  }
}

}  // namespace
}  // namespace keel::tools

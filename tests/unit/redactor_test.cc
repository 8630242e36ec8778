// Redactor: a secret's value is replaced by [secret:NAME] in text, JSON (keys too) and errors,
// in its raw, JSON-escaped, percent-encoded and base64 forms; short values are refused.

#include <gtest/gtest.h>

#include "keel/common/crypto.h"
#include "keel/secrets/redactor.h"

namespace keel::secrets {
namespace {

TEST(RedactorTest, ReplacesEveryKnownFormOfTheValue) {
  Redactor r;
  const std::string value = "s3cr\"et/value+1";
  ASSERT_TRUE(r.Add("api_key", value).ok());
  EXPECT_EQ(r.Text("a " + value + " b " + value), "a [secret:api_key] b [secret:api_key]");
  EXPECT_EQ(r.Text("{\"k\":\"s3cr\\\"et/value+1\"}"), "{\"k\":\"[secret:api_key]\"}");
  EXPECT_EQ(r.Text("?q=s3cr%22et%2Fvalue%2B1&x"), "?q=[secret:api_key]&x");
  std::string b64 = Base64UrlEncode(value);
  EXPECT_EQ(r.Text("token " + b64), "token [secret:api_key]");
  EXPECT_EQ(r.Text("nothing here"), "nothing here");
}

TEST(RedactorTest, RedactsJsonStringsKeysAndErrors) {
  Redactor r;
  ASSERT_TRUE(r.Add("one", "first-secret").ok());
  ASSERT_TRUE(r.Add("two", "second-secret-longer").ok());
  Json in = {{"content", {{{"type", "text"}, {"text", "env: first-secret, second-secret-longer"}}}},
             {"first-secret", 42},
             {"n", 1}};
  Json out = r.Value(in);
  EXPECT_EQ(out["content"][0]["text"], "env: [secret:one], [secret:two]");
  EXPECT_TRUE(out.contains("[secret:one]"));
  EXPECT_EQ(out["n"], 1);
  EXPECT_EQ(DumpJson(out).find("first-secret"), std::string::npos);
  Status st = r.Error(Unavailable("exited; stderr: token=first-secret"));
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_EQ(st.message(), "exited; stderr: token=[secret:one]");
}

TEST(RedactorTest, RefusesValuesTooShortToHide) {
  Redactor r;
  Status st = r.Add("pin", "1234567");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("pin"), std::string::npos);
  EXPECT_EQ(st.message().find("1234567"), std::string::npos);
  EXPECT_TRUE(r.empty());
}

}  // namespace
}  // namespace keel::secrets

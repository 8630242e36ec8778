// The memory search language (memory::ParseQuery): what each form renders to for FTS5 and for
// PostgreSQL's to_tsquery, and the errors bad queries get. The rendered queries run against
// both backends in memory_store_test.cc.

#include <gtest/gtest.h>

#include <string>

#include "keel/memory/query.h"

namespace keel::memory {
namespace {

struct Rendered {
  std::string fts5;
  std::string tsquery;
  std::string tsquery_rank;
};

Rendered Render(const std::string& text) {
  auto q = ParseQuery(text);
  EXPECT_TRUE(q.ok()) << text << ": " << q.status().ToString();
  if (!q.ok()) return {};
  return {q->fts5, q->tsquery, q->tsquery_rank};
}

std::string ErrorOf(const std::string& text) {
  auto q = ParseQuery(text);
  EXPECT_FALSE(q.ok()) << text << " parsed as " << (q.ok() ? q->fts5 : "");
  if (q.ok()) return "";
  EXPECT_EQ(q.status().code(), Code::kInvalidArgument);
  return q.status().message();
}

TEST(MemoryQueryTest, BareWordsAreAllRequired) {
  Rendered r = Render("  disk   full ");
  EXPECT_EQ(r.fts5, "\"$ disk\" AND \"$ full\"");
  EXPECT_EQ(r.tsquery, "'disk' & 'full'");
}

TEST(MemoryQueryTest, QuotedPhrasesKeepTheirWordsTogether) {
  Rendered r = Render("\"disk is full\" alert");
  EXPECT_EQ(r.fts5, "\"$ disk is full\" AND \"$ alert\"");
  EXPECT_EQ(r.tsquery, "('disk' <-> 'is' <-> 'full') & 'alert'");
}

TEST(MemoryQueryTest, OrJoinsTheTermsOnEachSide) {
  Rendered r = Render("db postgres OR sqlite OR \"my sql\"");
  EXPECT_EQ(r.fts5, "\"$ db\" AND (\"$ postgres\" OR \"$ sqlite\" OR \"$ my sql\")");
  EXPECT_EQ(r.tsquery, "'db' & ('postgres' | 'sqlite' | ('my' <-> 'sql'))");
  EXPECT_EQ(r.tsquery_rank, "'db' | 'postgres' | 'sqlite' | 'my' | 'sql'");
}

TEST(MemoryQueryTest, LowerCaseOrIsAWord) {
  EXPECT_EQ(Render("this or that").fts5, "\"$ this\" AND \"$ or\" AND \"$ that\"");
}

TEST(MemoryQueryTest, ALeadingMinusExcludes) {
  Rendered r = Render("kafka -outage -\"consumer lag\"");
  EXPECT_EQ(r.fts5, "(\"$ kafka\") NOT \"$ outage\" NOT \"$ consumer lag\"");
  EXPECT_EQ(r.tsquery, "'kafka' & !'outage' & !('consumer' <-> 'lag')");
  EXPECT_EQ(r.tsquery_rank, "'kafka'");  // ranked by what it looks for only
  Rendered two = Render("a b -c");
  EXPECT_EQ(two.fts5, "(\"$ a\" AND \"$ b\") NOT \"$ c\"");
  EXPECT_EQ(two.tsquery, "('a' & 'b') & !'c'");
}

TEST(MemoryQueryTest, ATrailingStarMakesAPrefix) {
  Rendered r = Render("migrat* \"schema chan\"*");
  EXPECT_EQ(r.fts5, "\"$ migrat\" * AND \"$ schema chan\" *");
  EXPECT_EQ(r.tsquery, "'migrat':* & ('schema' <-> 'chan':*)");
  EXPECT_EQ(r.tsquery_rank, "'migrat':* | 'schema' | 'chan':*");
}

TEST(MemoryQueryTest, PunctuationSeparatesWordsAndNeverReachesTheBackend) {
  // Operators and quotes of either backend's own syntax are only separators here.
  Rendered r = Render("e-mail C++ (a&b)|c! x:y NEAR/2 'q' a\\b");
  EXPECT_EQ(r.fts5,
            "\"$ e mail\" AND \"$ C\" AND \"$ a b c\" AND \"$ x y\" AND \"$ NEAR 2\" AND "
            "\"$ q\" AND \"$ a b\"");
  EXPECT_EQ(r.tsquery,
            "('e' <-> 'mail') & 'C' & ('a' <-> 'b' <-> 'c') & ('x' <-> 'y') & ('NEAR' <-> '2') & "
            "'q' & ('a' <-> 'b')");
  // A term of punctuation alone is left out.
  EXPECT_EQ(Render("cats & dogs ?").fts5, "\"$ cats\" AND \"$ dogs\"");
  // Typographic punctuation separates words too; letters beyond ASCII are kept.
  EXPECT_EQ(Render("caf\xC3\xA9\xE2\x80\x94na\xC3\xAFve \xE2\x80\xA6").fts5,
            "\"$ caf\xC3\xA9 na\xC3\xAFve\"");
}

TEST(MemoryQueryTest, SyntaxErrorsNameTheProblemAndItsPosition) {
  EXPECT_EQ(ErrorOf("disk \"full"), "unbalanced quote: the '\"' at position 6 is not closed");
  EXPECT_EQ(ErrorOf("OR disk"), "OR at position 1 has no term before it");
  EXPECT_EQ(ErrorOf("disk OR"), "OR at position 6 has no term after it");
  EXPECT_EQ(ErrorOf("disk OR OR full"), "OR at position 9 has no term before it");
  EXPECT_EQ(ErrorOf("disk OR -full"), "OR at position 6 cannot join an excluded term (-word)");
  EXPECT_EQ(ErrorOf("-disk OR full"), "OR at position 7 cannot join an excluded term (-word)");
  EXPECT_EQ(ErrorOf("-disk -full"),
            "the query has only excluded terms (-word); add a term to search for");
  EXPECT_EQ(ErrorOf("disk - full"), "'-' at position 6 has no term after it");
  EXPECT_EQ(ErrorOf("disk \"?!\""), "the phrase at position 6 has no words to search for");
  EXPECT_EQ(ErrorOf(""), "the query is empty: give at least one word to search for");
  EXPECT_EQ(ErrorOf("  ?! ... "), "the query is empty: give at least one word to search for");
  // Positions count characters, not bytes.
  EXPECT_EQ(ErrorOf("\xC3\xA9t\xC3\xA9 OR"), "OR at position 5 has no term after it");
}

TEST(MemoryQueryTest, LimitsAndEncodingAreChecked) {
  std::string words;
  for (int i = 0; i < kMaxQueryTerms; ++i) words += "w" + std::to_string(i) + " ";
  EXPECT_TRUE(ParseQuery(words).ok());
  EXPECT_EQ(ErrorOf(words + "one_more"), "the query has more than 16 terms");
  EXPECT_EQ(ErrorOf(std::string(kMaxQueryBytes + 1, 'a')),
            "the query is longer than 512 bytes (513)");
  EXPECT_TRUE(ParseQuery(std::string(kMaxQueryBytes, 'a')).ok());
  EXPECT_EQ(ErrorOf("ok \xC3("), "the query is not valid UTF-8 (at byte 4)");
  EXPECT_EQ(ErrorOf(std::string("a\0b", 3)), "the query contains a NUL character");
}

}  // namespace
}  // namespace keel::memory

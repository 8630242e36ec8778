// The cron fuzzer's seed corpus (tests/fuzz/corpus/cron) as an ordinary test, and a
// deterministic mutation loop over it: random and mutated strings never crash the parser, a
// rejection is always a kInvalidArgument Status, and whatever parses fires at slots that match
// it (the property in tests/fuzz/cron_fuzz_check.h).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "cron_fuzz_check.h"

namespace keel::schedule {
namespace {

std::vector<std::string> Corpus() {
  std::vector<std::string> out;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(KEEL_TEST_FUZZ_DIR) + "/corpus/cron")) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    out.push_back(text.str());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CronFuzz, SeedCorpus) {
  auto corpus = Corpus();
  ASSERT_GE(corpus.size(), 30u);
  int parsed = 0;
  for (const auto& input : corpus) {
    EXPECT_EQ(CheckCronInput(input), "") << "input: " << input;
    parsed += CronExpr::Parse(input).ok();
  }
  EXPECT_GT(parsed, 10);  // the corpus holds valid expressions, not only rejections
}

TEST(CronFuzz, MutatedAndRandomInputs) {
  const auto corpus = Corpus();
  std::mt19937 rng(20240310);
  const std::string alphabet = "0123456789*/,-@ \tJANFEBMONSUNfri?L#\x01\xff";
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = i % 10 == 0 ? std::string() : corpus[pick(corpus.size())];
    int edits = 1 + static_cast<int>(pick(4));
    for (int e = 0; e < edits; ++e) {
      char c = alphabet[pick(alphabet.size())];
      switch (pick(i % 10 == 0 ? 1 : 4)) {
        case 0:
          s.insert(s.begin() + static_cast<long>(pick(s.size() + 1)), c);
          break;
        case 1:
          if (!s.empty()) s.erase(pick(s.size()), 1);
          break;
        case 2:
          if (!s.empty()) s[pick(s.size())] = c;
          break;
        case 3:
          s += " " + corpus[pick(corpus.size())].substr(0, 8);
          break;
      }
    }
    std::string broken = CheckCronInput(s);
    ASSERT_EQ(broken, "") << "input: \"" << s << "\"";
    parsed += CronExpr::Parse(s).ok();
  }
  EXPECT_GT(parsed, 100);
}

}  // namespace
}  // namespace keel::schedule

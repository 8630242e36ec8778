// Each fuzz target's seed corpus (tests/fuzz/corpus/NAME/) as an ordinary test, plus a
// deterministic mutation loop over it, so the properties of tests/fuzz/fuzz_checks.h hold in
// every build, not only in fuzzing runs (scripts/fuzz.sh).

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "fuzz_checks.h"

namespace keel::fuzz {
namespace {

std::vector<std::string> Corpus(const std::string& name) {
  std::vector<std::string> out;
  std::string dir = std::string(KEEL_TEST_FUZZ_DIR) + "/corpus/" + name;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    out.push_back(text.str());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class FuzzCorpusTest : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzCorpusTest, SeedsKeepTheProperty) {
  const Target& target = GetParam();
  auto corpus = Corpus(target.name);
  ASSERT_GE(corpus.size(), 5u) << "tests/fuzz/corpus/" << target.name << " needs seeds";
  for (const auto& input : corpus) {
    EXPECT_EQ(RunCheck(target, input), "") << target.name << " input: " << input.substr(0, 300);
  }
}

TEST_P(FuzzCorpusTest, MutatedSeedsKeepTheProperty) {
  const Target& target = GetParam();
  auto corpus = Corpus(target.name);
  ASSERT_FALSE(corpus.empty());
  std::mt19937 rng(20261201);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const std::string alphabet = "{}[]\":,\\0123456789-eE.tfn \n\r\tabc\x01\x7f\xc3\xa9\xff";
  for (int i = 0; i < 3000; ++i) {
    std::string s = corpus[pick(corpus.size())];
    int edits = 1 + static_cast<int>(pick(8));
    for (int e = 0; e < edits; ++e) {
      switch (pick(5)) {
        case 0:
          s.insert(s.begin() + static_cast<long>(pick(s.size() + 1)), alphabet[pick(alphabet.size())]);
          break;
        case 1:
          if (!s.empty()) s.erase(pick(s.size()), 1 + pick(std::min<size_t>(s.size(), 8)));
          break;
        case 2:
          if (!s.empty()) s[pick(s.size())] = alphabet[pick(alphabet.size())];
          break;
        case 3: {  // splice in a piece of another seed
          const std::string& other = corpus[pick(corpus.size())];
          if (other.empty()) break;
          size_t from = pick(other.size());
          s.insert(pick(s.size() + 1), other.substr(from, 1 + pick(32)));
          break;
        }
        default:
          if (!s.empty()) s.resize(pick(s.size()));
          break;
      }
      if (s.size() > 1 << 16) s.resize(1 << 16);
    }
    std::string broken = RunCheck(target, s);
    ASSERT_EQ(broken, "") << target.name << " mutated input: " << s.substr(0, 300);
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpusTest, ::testing::ValuesIn(Targets()),
                         [](const ::testing::TestParamInfo<Target>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace keel::fuzz

#pragma once
// The fuzz targets of Keel's parsers of untrusted input, each as a property that must hold for
// every input: the parser never crashes, never throws, rejects with a Status carrying a message,
// and what it accepts survives a round trip where the parser has one. The same checks run under
// libFuzzer (fuzzer_main.cc, built per target with -DKEEL_FUZZ=ON under clang; scripts/fuzz.sh)
// and as ordinary unit tests over each target's seed corpus in tests/fuzz/corpus/NAME/
// (tests/unit/fuzz_corpus_test.cc).

#include <string>
#include <string_view>
#include <vector>

namespace keel::fuzz {

struct Target {
  const char* name;  // also the corpus directory's name
  // "" when the property holds for `input`; otherwise what broke.
  std::string (*check)(std::string_view input);
};

// Every target, in a fixed order.
const std::vector<Target>& Targets();

// The target called `name`, or nullptr.
const Target* FindTarget(std::string_view name);

// Runs `target` on `input`; an exception counts as a broken property (a parser of untrusted
// input answers with a Status, never by throwing).
std::string RunCheck(const Target& target, std::string_view input);

}  // namespace keel::fuzz

// libFuzzer target for the cron parser: `cmake -DKEEL_FUZZ=ON` with clang, then
// `build/tests/keel_cron_fuzzer tests/fuzz/cron_corpus`. The same property runs as an ordinary
// unit test over the seed corpus (tests/unit/cron_fuzz_test.cc).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cron_fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string broken = keel::schedule::CheckCronInput(input);
  if (!broken.empty()) {
    std::fprintf(stderr, "cron fuzzer: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}

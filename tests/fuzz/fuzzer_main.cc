// A libFuzzer entry point for one target of fuzz_checks.h, chosen when it is built
// (-DKEEL_FUZZ_TARGET="json"): `cmake -DKEEL_FUZZ=ON` with clang builds tests/keel_fuzz_NAME
// for each target; scripts/fuzz.sh runs them.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const keel::fuzz::Target* target = keel::fuzz::FindTarget(KEEL_FUZZ_TARGET);
  if (target == nullptr) {
    std::fprintf(stderr, "no fuzz target named %s\n", KEEL_FUZZ_TARGET);
    std::abort();
  }
  std::string broken =
      keel::fuzz::RunCheck(*target, std::string_view(reinterpret_cast<const char*>(data), size));
  if (!broken.empty()) {
    std::fprintf(stderr, "fuzz target %s: %s\n", KEEL_FUZZ_TARGET, broken.c_str());
    std::abort();
  }
  return 0;
}

#pragma once
// The property every input of the cron fuzzer must keep, shared by the libFuzzer target
// (cron_fuzzer.cc, built with -DKEEL_FUZZ=ON under clang) and the ordinary unit test that runs
// the seed corpus and a deterministic mutation loop (tests/unit/cron_fuzz_test.cc):
// parsing never crashes and always answers with a Status; an expression that parses fires,
// and each slot it names is strictly later than the last and matches the expression.

#include <string>
#include <string_view>

#include "keel/schedule/cron.h"

namespace keel::schedule {

// "" when the property holds; otherwise what broke.
inline std::string CheckCronInput(std::string_view input) {
  auto cron = CronExpr::Parse(input);
  if (!cron.ok()) {
    if (cron.status().code() != Code::kInvalidArgument || cron.status().message().empty()) {
      return "a rejected expression must be kInvalidArgument with a message";
    }
    return "";
  }
  static const TimeZone kZones[] = {*TimeZone::Find("UTC"), *TimeZone::Find("Europe/Berlin"),
                                    *TimeZone::Find("America/New_York")};
  const TimeZone& zone = kZones[input.size() % 3];
  Millis after = 1710000000000 + static_cast<Millis>(input.size()) * 86'400'000;
  for (int i = 0; i < 3; ++i) {
    auto slot = NextSlot(*cron, zone, after);
    if (!slot) return "a parsed expression never fires";
    if (*slot <= after) return "a slot is not after the previous one";
    CivilTime t = zone.ToCivil(*slot);
    CivilTime before = zone.ToCivil(*slot - 60'000);
    // A slot at a DST transition (the end of a gap) need not match: it stands for the local
    // times the gap swallowed.
    unsigned step = (t.hour * 60 + t.minute + 1440 - before.hour * 60 - before.minute) % 1440;
    if (step == 1 && !cron->Matches(t)) return "a slot does not match the expression";
    after = *slot;
  }
  return "";
}

}  // namespace keel::schedule

#!/usr/bin/env bash
# Builds Keel's libFuzzer targets with clang (ASan + UBSan) and runs each for a while.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s, every target)
#
# Targets and their properties are in tests/fuzz/fuzz_checks.h; each starts from its seed
# corpus tests/fuzz/corpus/NAME (which also runs as a unit test). New inputs the fuzzer finds
# go to build-fuzz/corpus/NAME, crashing inputs to build-fuzz/crashes/NAME/ (add a crash, once
# fixed, to the seed corpus). Prints the executions and crashes of each target; exits 1 when
# any target crashed.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
BUILD=${KEEL_FUZZ_BUILD:-build-fuzz}
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is needed (apt-get install clang)" >&2; exit 2; }

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DKEEL_SANITIZE=ON -DKEEL_FUZZ=ON -DKEEL_BENCH=OFF >/dev/null || exit 2
fi
all=$(sed -n 's/.*{"\([a-z_]*\)", Check.*/\1/p' tests/fuzz/fuzz_checks.cc)
targets=${*:-$all}
echo "fuzz.sh: building $(echo $targets | wc -w) targets in $BUILD"
cmake --build "$BUILD" -j "$(nproc)" --target $(for t in $targets; do echo keel_fuzz_$t; done) \
  >"$BUILD/fuzz-build.log" 2>&1 || { tail -30 "$BUILD/fuzz-build.log"; exit 2; }

failed=0
printf '%-20s %12s %8s %s\n' TARGET EXECUTIONS CRASHES CORPUS
for t in $targets; do
  work="$BUILD/corpus/$t"; crashes="$BUILD/crashes/$t"
  mkdir -p "$work" "$crashes"
  log="$BUILD/fuzz-$t.log"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$BUILD/tests/keel_fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -artifact_prefix="$crashes/" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1 | awk '{print $2}')
  [ -n "$runs" ] || runs=$(grep -o '#[0-9]*' "$log" | tail -1 | tr -d '#')
  # Crashes, timeouts, leaks and out-of-memory inputs; not slow-unit-* (slow, not wrong).
  n=$(find "$crashes" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'leak-*' -o -name 'oom-*' \) | wc -l)
  printf '%-20s %12s %8s %s\n' "$t" "${runs:-?}" "$n" "$(ls "$work" | wc -l)"
  if [ "$n" -gt 0 ]; then
    failed=1
    echo "  crashes in $crashes; the log is $log" >&2
  fi
done
exit $failed

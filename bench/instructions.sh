#!/usr/bin/env bash
# The server's instructions per turn, counted by callgrind: a figure the machine's noise does not
# move, for comparing two builds whose difference is a few percent of a turn.
#
#   bash bench/instructions.sh [BUILD_DIR] [KEEL_BINARY...]
#
# Each binary (default BUILD_DIR/keel) serves under `valgrind --tool=callgrind` twice, on a fresh
# home, for FEW and then MANY turns of BUILD_DIR's keel_loadgen (concurrency 16, distinct
# prompts); its instructions per turn are the difference of the two totals divided by the
# difference of the turns, so start-up and shutdown cancel out. INSTR_FEW (300) and INSTR_MANY
# (1300) change the counts; INSTR_KEEP=DIR keeps the callgrind files there (callgrind_annotate
# reads them); INSTR_PLUGINS=1 enables make bench-quick's audit-log and redaction plugins on
# every agent first; INSTR_OPENAI=1 sends the turns through the OpenAI provider to BUILD_DIR's
# keel_fake_openai.
#
# What callgrind counts is not time: a `rep stosb` counts once per byte (so SQLite zeroing a
# fresh 4 KB page counts 4,096), crypto runs without the CPU's SHA instructions, and work done
# once per millisecond (NewId's random draw) happens far more often at callgrind's pace. Use it
# for A/B of the code a change touches; confirm with the timed benchmarks.
set -euo pipefail
BUILD=${1:-build}
shift || true
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=("$BUILD/keel")
FEW=${INSTR_FEW:-300}
MANY=${INSTR_MANY:-1300}
LOADGEN=$BUILD/bench/keel_loadgen
command -v valgrind >/dev/null || { echo "instructions: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
[ -x "$LOADGEN" ] || { echo "instructions: $LOADGEN is missing; build first" >&2; exit 1; }

# Instructions of one server for $2 turns.
count() {
  local bin=$1 turns=$2 home
  home=$(mktemp -d "${TMPDIR:-/tmp}/keel-instr.XXXXXX")
  env ${FAKE_URL:+OPENAI_BASE_URL=$FAKE_URL OPENAI_API_KEY=bench} valgrind --tool=callgrind --callgrind-out-file="$home/cg.out" "$bin" serve --home "$home" \
    --listen 127.0.0.1:0 >"$home/serve.log" 2>&1 &
  local pid=$! i
  for i in $(seq 600); do
    [ -s "$home/listen.addr" ] && [ -s "$home/owner.token" ] && break
    sleep 0.1
  done
  [ -s "$home/listen.addr" ] || { echo "instructions: $bin did not start" >&2; cat "$home/serve.log" >&2; exit 1; }
  if [ -n "${INSTR_PLUGINS:-}" ]; then
    python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import quick; quick.enable_plugins(*sys.argv[2:])' \
      "$(dirname "$0")" "http://$(awk '{print $1}' "$home/listen.addr")" "$home/owner.token"
  fi
  "$LOADGEN" --url "http://$(awk '{print $1}' "$home/listen.addr")" --token-file "$home/owner.token" \
    --concurrency 16 --warmup 0 --turns "$turns" --duration 600 --unique-messages \
    ${INSTR_OPENAI:+--model openai/bench} >"$home/load.txt"
  kill -TERM "$pid"
  wait "$pid" || true
  grep -q "errors=0" "$home/load.txt" || { echo "instructions: turns failed" >&2; cat "$home/load.txt" >&2; exit 1; }
  if [ -n "${INSTR_KEEP:-}" ]; then
    mkdir -p "$INSTR_KEEP"
    cp "$home/cg.out" "$INSTR_KEEP/$(basename "$bin").$turns.callgrind"
  fi
  callgrind_annotate "$home/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}'
  rm -rf "$home"
}

if [ -n "${INSTR_OPENAI:-}" ]; then
  coproc FAKE { exec "$BUILD/bench/keel_fake_openai"; }
  read -r fake_port <&"${FAKE[0]}"
  FAKE_URL="http://127.0.0.1:$fake_port/v1"
  trap 'kill $FAKE_PID 2>/dev/null' EXIT
fi

for bin in "${BINS[@]}"; do
  echo "+ valgrind --tool=callgrind $bin serve; keel_loadgen --concurrency 16 --turns $FEW, then $MANY" >&2
  few=$(count "$bin" "$FEW")
  many=$(count "$bin" "$MANY")
  echo "$bin: $(( (many - few) / (MANY - FEW) )) instructions a turn (callgrind, c=16)"
done

#!/usr/bin/env bash
# Keel's PostgreSQL benchmarks. Starts a throwaway cluster (scripts/with-pg.sh) unless
# KEEL_TEST_PG_ADMIN_URL is set, and measures on fresh databases:
#   1. event append rate: Keel's PostgresStore vs raw libpq inserts of the same rows with the
#      same batching (keel_bench BM_KeelPgAppend / BM_RawPgAppend), as ratios of one run;
#   2. end-to-end turns (keel_loadgen, local model): one node at concurrency 1 and 64, and two
#      nodes on one database at concurrency 64 (clients split over the nodes);
#   3. resume time: a node is killed with SIGKILL while running runs; the time until the
#      surviving node has resumed each of them (bench/resume_bench.py);
#   4. a stopped node: the turns/s of two nodes while a third is stopped with SIGSTOP;
#   5. tenants in parallel: two nodes' turns/s for one tenant against two tenants.
#
#   bash scripts/bench-pg.sh [BUILD_DIR] [SECONDS]
# BENCH_PG_ONLY=events|turns|resume|stop|tenants runs one part. BENCH_MIN_TIME: keel_bench min time (1s).
# BENCH_PG_RUNS: how many times parts 2, 4 and 5 measure each figure, whose median they print (3).
set -euo pipefail
BUILD=${1:-build}
DURATION=${2:-6}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "${KEEL_TEST_PG_ADMIN_URL:-}" ]; then
  exec "$HERE/with-pg.sh" bash "$0" "$BUILD" "$DURATION"
fi
ONLY=${BENCH_PG_ONLY:-}
MIN_TIME=${BENCH_MIN_TIME:-1}
RUNS=${BENCH_PG_RUNS:-3}
BENCH=$BUILD/bench/keel_bench
LOADGEN=$BUILD/bench/keel_loadgen
for bin in "$BUILD/keel" "$BENCH" "$LOADGEN"; do
  [ -x "$bin" ] || { echo "bench-pg: $bin is missing; build first: cmake --build $BUILD" >&2; exit 1; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-bench-pg.XXXXXX")
DBS=()
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  for d in "${DBS[@]}"; do psql "$KEEL_TEST_PG_ADMIN_URL" -qc "DROP DATABASE IF EXISTS $d WITH (FORCE)" || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# new_db NAME: creates a database owned and migrated by the owner role keel_owner, for the
# store's runtime role (docs/decisions/0008); prints its URL.
new_db() {
  psql "$KEEL_TEST_PG_ADMIN_URL" -qc "CREATE DATABASE $1 OWNER keel_owner" >&2
  DBS+=("$1")
  local owner=${KEEL_TEST_PG_OWNER_URL:-${KEEL_TEST_PG_ADMIN_URL/postgres@/keel_owner@}}
  "$BUILD/keel" store migrate --store "${KEEL_TEST_PG_URL%/*}/$1" --owner-url "${owner%/*}/$1" >&2
  echo "${KEEL_TEST_PG_URL%/*}/$1"
}

# median_of LABEL VALUE...: prints "LABEL: median M of a, b, c".
median_of() {
  local label=$1; shift
  python3 - "$label" "$@" <<'PY'
import statistics, sys
label, values = sys.argv[1], [float(v) for v in sys.argv[2:]]
print(f"  {label}: median {statistics.median(values):,.2f} of " + ", ".join(f"{v:,.2f}" for v in values))
PY
}

# loadgen_rate ARGS...: runs keel_loadgen on CPU 1 and prints its turns per second.
loadgen_rate() {
  taskset -c 1 "$LOADGEN" "$@" | sed -n 's/^RESULT.* turns_per_s=\([0-9.]*\).*/\1/p'
}

# The CPU seconds (user + system) that this machine's `postgres` processes used so far; empty
# when the server is elsewhere.
postgres_cpu() {
  python3 - <<'PY'
import os
ticks, seen = 0, False
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        continue
    if "(postgres)" in stat:
        fields = stat.rsplit(")", 1)[1].split()
        ticks, seen = ticks + int(fields[11]) + int(fields[12]), True
print(ticks / os.sysconf("SC_CLK_TCK") if seen else "")
PY
}

# start_node HOME URL CPU: a keel server pinned to CPU; sets NODE_PID and NODE_ADDR.
start_node() {
  mkdir -p "$1"
  taskset -c "$3" "$BUILD/keel" serve --home "$1" --listen 127.0.0.1:0 --store "$2" >"$1/log" 2>&1 &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
  for _ in $(seq 200); do [ -s "$1/listen.addr" ] && break; sleep 0.05; done
  NODE_ADDR=$(cat "$1/listen.addr")
  for _ in $(seq 200); do curl -sf "http://$NODE_ADDR/readyz" >/dev/null && return; sleep 0.05; done
  echo "bench-pg: keel at $NODE_ADDR never became ready; log:" >&2; cat "$1/log" >&2; exit 1
}

echo "Keel PostgreSQL benchmarks: build $BUILD, $(nproc) CPUs, $(psql "$KEEL_TEST_PG_ADMIN_URL" -tAc 'SHOW server_version')"

if [[ -z $ONLY || $ONLY == events ]]; then
  echo
  echo "== 1. event append: Keel's PostgresStore vs raw libpq, same rows, same batching"
  KEEL_BENCH_PG_URL=$(new_db keel_bench_ev_$$) KEEL_BENCH_PG_RAW_URL=$(new_db keel_bench_raw_$$) \
    "$BENCH" --benchmark_filter='BM_(KeelPg|RawPg)Append' --benchmark_min_time="$MIN_TIME" \
    --benchmark_out="$WORK/events.json" --benchmark_out_format=json >"$WORK/events.txt" 2>&1 ||
    { cat "$WORK/events.txt"; echo "bench-pg: keel_bench failed" >&2; exit 1; }
  python3 - "$WORK/events.json" <<'PY'
import json, re, sys
runs = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    m = re.match(r"BM_(KeelPg|RawPg)Append/(\d+)/.*threads:(\d+)", b["name"])
    if not m: continue
    if b.get("error_occurred"):
        print(f"{b['name']}: error: {b.get('error_message')}"); continue
    runs[(m.group(1), int(m.group(2)), int(m.group(3)))] = b
for (kind, per, threads), k in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2])):
    if kind != "KeelPg": continue
    r = runs.get(("RawPg", per, threads))
    what = f"{per} event{'s' if per > 1 else ''}/unit, {threads} producer{'s' if threads > 1 else ''}"
    line = f"  {what:<32} Keel {k['events_per_s']:>9,.0f} events/s"
    if r:
        ratio = k["events_per_s"] / r["events_per_s"]
        line += f"   raw {r['events_per_s']:>9,.0f}   ratio {ratio:.2f} (target >= 0.7: {'pass' if ratio >= 0.7 else 'FAIL'})"
    if k.get("units_per_commit"): line += f"   {k['units_per_commit']:.1f} units/commit"
    print(line)
PY
fi

if [[ -z $ONLY || $ONLY == turns ]]; then
  echo
  echo "== 2. turns over HTTP (local model), nodes pinned to CPU 0, keel_loadgen to CPU 1"
  URL=$(new_db keel_bench_turns_$$)
  start_node "$WORK/n1" "$URL" 0
  A_PID=$NODE_PID A_ADDR=$NODE_ADDR
  taskset -c 1 "$LOADGEN" --url "http://$A_ADDR" --token-file "$WORK/n1/owner.token" \
    --server-pid "$A_PID" --concurrency 1 --warmup 2 --duration "$DURATION" | grep -v '^RESULT'
  one=()
  pg_us=()  # PostgreSQL's CPU per turn, about: its CPU over the run (warm-up included) / turns
  for _ in $(seq "$RUNS"); do
    cpu0=$(postgres_cpu)
    one+=("$(loadgen_rate --url "http://$A_ADDR" --token-file "$WORK/n1/owner.token" \
      --concurrency 64 --warmup 2 --duration "$DURATION")")
    cpu1=$(postgres_cpu)
    [ -n "$cpu0" ] && pg_us+=("$(python3 -c "print(($cpu1 - $cpu0) * 1e6 / (${one[-1]} * ($DURATION + 2)))")")
  done
  start_node "$WORK/n2" "$URL" 0
  B_ADDR=$NODE_ADDR
  two=()
  pg_us2=()
  for _ in $(seq "$RUNS"); do
    cpu0=$(postgres_cpu)
    two+=("$(loadgen_rate --url "http://$A_ADDR" --url "http://$B_ADDR" \
      --token-file "$WORK/n1/owner.token" --concurrency 64 --warmup 2 --duration "$DURATION")")
    cpu1=$(postgres_cpu)
    [ -n "$cpu0" ] && pg_us2+=("$(python3 -c "print(($cpu1 - $cpu0) * 1e6 / (${two[-1]} * ($DURATION + 2)))")")
  done
  median_of "one node, concurrency 64, turns/s" "${one[@]}"
  median_of "two nodes, concurrency 64, turns/s" "${two[@]}"
  if [ ${#pg_us[@]} -gt 0 ]; then
    median_of "PostgreSQL CPU per turn, one node, us (about)" "${pg_us[@]}"
    median_of "PostgreSQL CPU per turn, two nodes, us (about)" "${pg_us2[@]}"
  fi
  python3 - "${one[@]}" "${two[@]}" <<'PY'
import statistics, sys
v = [float(x) for x in sys.argv[1:]]
one, two = statistics.median(v[:len(v) // 2]), statistics.median(v[len(v) // 2:])
print(f"  two nodes / one node: {two / one:.2f} (target >= 1.0: {'pass' if two >= one else 'FAIL'}); "
      f"one node (target >= 1,500 turns/s): {'pass' if one >= 1500 else 'FAIL'}")
PY
fi

if [[ -z $ONLY || $ONLY == tenants ]]; then
  echo
  echo "== 5. tenants in parallel: two nodes, one tenant's turns vs two tenants' (one per node)"
  # The same clients (c=64 in all) and nodes; first all of them as one tenant, spread over
  # both nodes, whose writes are serial across the nodes (its write lock, ADR 0014); then half
  # as another tenant on the second node, whose writes need no lock the first tenant holds.
  URL=$(new_db keel_bench_tenants_$$)
  start_node "$WORK/t1" "$URL" 0
  T1_ADDR=$NODE_ADDR
  start_node "$WORK/t2" "$URL" 0
  T2_ADDR=$NODE_ADDR
  curl -sf -X POST "http://$T1_ADDR/v1/tenants" -H "Authorization: Bearer $(cat "$WORK/t1/owner.token")" \
    -H 'Content-Type: application/json' -d '{"name":"second"}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["owner_token"])' >"$WORK/second.token"
  ratios=()
  for _ in $(seq "$RUNS"); do
    one=$(loadgen_rate --url "http://$T1_ADDR" --url "http://$T2_ADDR" \
      --token-file "$WORK/t1/owner.token" --concurrency 64 --warmup 2 --duration "$DURATION")
    loadgen_rate --url "http://$T1_ADDR" --token-file "$WORK/t1/owner.token" \
      --concurrency 32 --warmup 2 --duration "$DURATION" >"$WORK/first.txt" &
    F=$!
    second=$(loadgen_rate --url "http://$T2_ADDR" --token-file "$WORK/second.token" \
      --concurrency 32 --warmup 2 --duration "$DURATION")
    wait "$F"
    first=$(cat "$WORK/first.txt")
    echo "  one tenant on both nodes: $one turns/s; two tenants, one per node: $first + $second turns/s"
    ratios+=("$(python3 -c "print(($first + $second) / $one)")")
  done
  median_of "two tenants / one tenant" "${ratios[@]}"
fi

if [[ -z $ONLY || $ONLY == stop ]]; then
  echo
  echo "== 4. a stopped node: three nodes under load, one stopped with SIGSTOP for 10 s"
  # Turns on two nodes (keel_loadgen, c=64) while a third runs turns of its own (c=16); the
  # running nodes' rate is counted from the log (run.completed@v1 by their origins) over 10 s
  # before the third is stopped and over the 10 s it stays stopped (it holds leases, perhaps
  # leadership, perhaps a transaction), as a ratio.
  URL=$(new_db keel_bench_stop_$$)
  ADMIN_DB="${KEEL_TEST_PG_ADMIN_URL%/*}/keel_bench_stop_$$"
  start_node "$WORK/s1" "$URL" 0
  S1_ADDR=$NODE_ADDR
  start_node "$WORK/s2" "$URL" 0
  S2_ADDR=$NODE_ADDR
  start_node "$WORK/s3" "$URL" 0
  S3_PID=$NODE_PID S3_ADDR=$NODE_ADDR
  origins="'$(cat "$WORK/s1/origin")','$(cat "$WORK/s2/origin")'"
  completed() {
    psql "$ADMIN_DB" -tAc "SELECT count(*) FROM events WHERE type='run.completed@v1' AND origin IN ($origins)"
  }
  # Each of the RUNS rounds: 10 s counted, 10 s counted with the third stopped, 5 s to recover.
  load_s=$((5 + RUNS * 25 + 5))
  taskset -c 1 "$LOADGEN" --url "http://$S3_ADDR" --token-file "$WORK/s1/owner.token" \
    --concurrency 16 --warmup 0 --duration "$((load_s + 10))" >"$WORK/load3.txt" 2>&1 &
  L3=$!
  taskset -c 1 "$LOADGEN" --url "http://$S1_ADDR" --url "http://$S2_ADDR" \
    --token-file "$WORK/s1/owner.token" --concurrency 64 --warmup 0 --duration "$load_s" >"$WORK/load12.txt" 2>&1 &
  L12=$!
  sleep 5
  ratios=()
  for _ in $(seq "$RUNS"); do
    c0=$(completed); sleep 10; c1=$(completed)
    kill -STOP "$S3_PID"
    c2=$(completed); sleep 10; c3=$(completed)
    kill -CONT "$S3_PID"
    sleep 5
    ratios+=("$(python3 - "$c0" "$c1" "$c2" "$c3" <<'PY'
import sys
c0, c1, c2, c3 = map(int, sys.argv[1:])
before, during = (c1 - c0) / 10, (c3 - c2) / 10
print(f"  two running nodes: {before:,.0f} turns/s with the third running, {during:,.0f} turns/s "
      f"while it is stopped", file=sys.stderr)
print(during / before if before else 0)
PY
)")
  done
  wait "$L12" || { cat "$WORK/load12.txt"; for n in s1 s2 s3; do tail -5 "$WORK/$n/log"; done; echo "bench-pg: keel_loadgen failed" >&2; exit 1; }
  kill "$L3" 2>/dev/null || true
  wait "$L3" 2>/dev/null || true
  median_of "stopped / running ratio (target >= 0.8)" "${ratios[@]}"
fi

if [[ -z $ONLY || $ONLY == resume ]]; then
  echo
  echo "== 3. resume: kill -9 a node with runs in flight; time until the survivor resumed them"
  KEEL_BIN=$(cd "$BUILD" && pwd)/keel python3 "$HERE/../bench/resume_bench.py"
fi

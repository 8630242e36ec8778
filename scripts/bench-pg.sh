#!/usr/bin/env bash
# End-to-end turns on PostgreSQL, one node: starts a throwaway cluster (scripts/with-pg.sh),
# a keel server on a fresh database, and keel_loadgen at concurrency 1 and 64.
#   bash scripts/bench-pg.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
BUILD=${1:-build}
DURATION=${2:-6}
if [ -z "${KEEL_TEST_PG_ADMIN_URL:-}" ]; then
  exec "$(dirname "$0")/with-pg.sh" bash "$0" "$BUILD" "$DURATION"
fi
H=$(mktemp -d)
DB=keel_bench_$$
psql "$KEEL_TEST_PG_ADMIN_URL" -qc "CREATE DATABASE $DB OWNER keel"
URL=${KEEL_TEST_PG_URL%/*}/$DB
taskset -c 0 "$BUILD/keel" serve --home "$H" --listen 127.0.0.1:0 --store "$URL" > "$H/log" 2>&1 &
PID=$!
for _ in $(seq 100); do [ -f "$H/listen.addr" ] && break; sleep 0.1; done
for c in 1 64; do
  taskset -c 1 "$BUILD/bench/keel_loadgen" --url "http://$(cat "$H/listen.addr")" \
    --token-file "$H/owner.token" --server-pid "$PID" --concurrency "$c" --warmup 2 \
    --duration "$DURATION"
done
kill "$PID"; wait "$PID" || true
psql "$KEEL_TEST_PG_ADMIN_URL" -qc "DROP DATABASE $DB WITH (FORCE)"
rm -rf "$H"

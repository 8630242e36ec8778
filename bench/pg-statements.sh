#!/usr/bin/env bash
# What PostgreSQL spends on a turn, statement by statement: one node on the local model under
# keel_loadgen (concurrency 64, distinct prompts), on a throwaway cluster started with
# pg_stat_statements, then the statements by total executor time, per turn.
#
#   bash bench/pg-statements.sh [BUILD_DIR] [SECONDS]
#
# The node runs on CPU 0 and the load on CPU 1, as in scripts/bench-pg.sh. Executor time only:
# parsing (the statements are prepared), the network and commits' WAL flushes are not in it.
# The extension lives in a schema of its own, so that `keel store migrate` (which grants the
# runtime role the public schema's functions) never meets its functions.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-build}" && pwd)
SECONDS_RUN=${2:-6}
if [ -z "${KEEL_PG_STATEMENTS_INNER:-}" ]; then
  export KEEL_PG_STATEMENTS_INNER=1
  export KEEL_TEST_PG_OPTIONS="-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
  exec bash "$ROOT/scripts/with-pg.sh" bash "$0" "$BUILD" "$SECONDS_RUN"
fi

db=kstmt$$
psql -X -q "$KEEL_TEST_PG_ADMIN_URL" -c "CREATE DATABASE $db OWNER keel_owner"
admin="${KEEL_TEST_PG_ADMIN_URL%/*}/$db"
url="${KEEL_TEST_PG_URL%/*}/$db"
"$BUILD/keel" store migrate --store "$url" --owner-url "${KEEL_TEST_PG_OWNER_URL%/*}/$db" >/dev/null
psql -X -q "$admin" -c "CREATE SCHEMA pgss; CREATE EXTENSION pg_stat_statements SCHEMA pgss"
home=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$home"' EXIT
taskset -c 0 "$BUILD/keel" serve --home "$home" --listen 127.0.0.1:0 --store "$url" \
  >"$home/log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  [ -s "$home/listen.addr" ] && curl -sf "http://$(cat "$home/listen.addr")/readyz" >/dev/null && break
  sleep 0.1
done
psql -X -q "$admin" -c "SELECT pgss.pg_stat_statements_reset()" >/dev/null
taskset -c 1 "$BUILD/bench/keel_loadgen" --url "http://$(cat "$home/listen.addr")" \
  --token-file "$home/owner.token" --server-pid "$pid" --concurrency 64 --warmup 0 \
  --duration "$SECONDS_RUN" --unique-messages >"$home/load.txt"
grep RESULT "$home/load.txt"
turns=$(sed -n 's/^RESULT.* turns=\([0-9]*\).*/\1/p' "$home/load.txt")
psql -X "$admin" -c "SELECT round(sum(total_exec_time)::numeric * 1000 / $turns, 1) AS exec_us_a_turn,
  round(sum(calls)::numeric / $turns, 2) AS statements_a_turn FROM pgss.pg_stat_statements"
psql -X "$admin" -c "SELECT round(calls::numeric / $turns, 2) AS a_turn,
  round((total_exec_time * 1000 / calls)::numeric, 1) AS us_each,
  round((total_exec_time * 1000 / $turns)::numeric, 1) AS us_a_turn,
  left(regexp_replace(query, '\s+', ' ', 'g'), 100) AS statement
  FROM pgss.pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25"

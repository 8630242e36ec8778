#!/usr/bin/env bash
# The soak: kill -9 at random, SOAK_KILLS times (default 1000), under a mixed load of turns
# (notes.append, exec, approvals, one-shot schedules), on one SQLite node and on three nodes on
# one PostgreSQL database (started by scripts/with-pg.sh unless KEEL_TEST_PG_ADMIN_URL names
# one), and prints one line per backend:
#
#   sqlite: N kills, M turns acknowledged, 0 lost, 0 duplicated once-effects, K unknown outcomes surfaced ...
#
# Any loss, duplicate or broken invariant makes the exit status 1. tests/integration/soak.py
# says what is counted; integration.test_soak and integration_pg.test_soak run a short form.
#
#   scripts/soak.sh [BUILD]           (default build; needs BUILD/keel)
#   SOAK_KILLS=200 SOAK_BACKENDS=sqlite SOAK_SEED=7 scripts/soak.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
KEEL_BIN=$(cd "$BUILD" && pwd)/keel
[[ -x $KEEL_BIN ]] || { echo "soak: $KEEL_BIN is missing; build first (make build)" >&2; exit 1; }
KILLS=${SOAK_KILLS:-1000}
SEED=${SOAK_SEED:-$RANDOM$RANDOM}
status=0
for backend in ${SOAK_BACKENDS:-sqlite postgres}; do
  cmd=(env KEEL_BIN="$KEEL_BIN" PYTHONDONTWRITEBYTECODE=1
       python3 "$ROOT/tests/integration/soak.py" --backend "$backend" --kills "$KILLS" --seed "$SEED")
  if [[ $backend == postgres && -z ${KEEL_TEST_PG_ADMIN_URL:-} ]]; then
    cmd=(bash "$ROOT/scripts/with-pg.sh" "${cmd[@]}")
  fi
  (cd "$ROOT/tests/integration" && "${cmd[@]}") || status=1
done
exit $status

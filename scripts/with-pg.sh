#!/usr/bin/env bash
# Runs CMD... with a throwaway PostgreSQL for the tests and returns CMD's exit status.
#
#   scripts/with-pg.sh CMD...
#
# Starts a cluster (scripts/pg-test-cluster.sh), exports KEEL_TEST_PG_URL (role keel) and
# KEEL_TEST_PG_ADMIN_URL (superuser), runs CMD, and stops and removes the cluster afterwards —
# also when CMD fails or the run is interrupted. When KEEL_TEST_PG_ADMIN_URL is already set, it
# uses that server and starts nothing.
set -uo pipefail

[ $# -ge 1 ] || { echo "usage: $0 CMD..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)

if [ -n "${KEEL_TEST_PG_ADMIN_URL:-}" ]; then
  echo "with-pg: using the existing server of KEEL_TEST_PG_ADMIN_URL (starting none)" >&2
  exec "$@"
fi

dir=$(mktemp -d /tmp/keel-pgtest.XXXXXX)
cleanup() {
  local t0=$SECONDS
  bash "$here/pg-test-cluster.sh" stop "$dir" >/dev/null 2>&1 \
    || echo "with-pg: could not stop the cluster in $dir" >&2
  echo "with-pg: PostgreSQL stopped ($((SECONDS - t0))s)" >&2
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$SECONDS
bash "$here/pg-test-cluster.sh" start "$dir" || exit 1
KEEL_TEST_PG_URL=$(cat "$dir/url")
KEEL_TEST_PG_ADMIN_URL=$(cat "$dir/admin-url")
export KEEL_TEST_PG_URL KEEL_TEST_PG_ADMIN_URL
echo "with-pg: KEEL_TEST_PG_ADMIN_URL=$KEEL_TEST_PG_ADMIN_URL (started in $((SECONDS - t0))s)" >&2

"$@"

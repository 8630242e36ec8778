#!/usr/bin/env bash
# Runs CMD... with a throwaway PostgreSQL for the tests and returns CMD's exit status.
#
#   scripts/with-pg.sh CMD...
#
# Starts a cluster (scripts/pg-test-cluster.sh), exports KEEL_TEST_PG_URL (the runtime role
# keel), KEEL_TEST_PG_OWNER_URL (the owner role keel_owner, which owns the schema; see
# docs/decisions/0008-postgres-owner-and-runtime-roles.md) and KEEL_TEST_PG_ADMIN_URL
# (superuser), runs CMD, and stops and removes the cluster afterwards — also when CMD fails or
# the run is interrupted. When KEEL_TEST_PG_ADMIN_URL is already set, it uses that server and
# starts nothing; unless KEEL_TEST_PG_URL / KEEL_TEST_PG_OWNER_URL name other roles, it makes
# sure the roles `keel` and `keel_owner` exist there (the admin role needs CREATEDB and
# CREATEROLE, or superuser).
set -uo pipefail

[ $# -ge 1 ] || { echo "usage: $0 CMD..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)

if [ -n "${KEEL_TEST_PG_ADMIN_URL:-}" ]; then
  echo "with-pg: using the existing server of KEEL_TEST_PG_ADMIN_URL (starting none)" >&2
  # The tests connect as the roles keel and keel_owner: create them when missing, and let a
  # non-superuser admin (CREATEDB, CREATEROLE) create and drop databases owned by them.
  roles=()
  [ -n "${KEEL_TEST_PG_URL:-}" ] || roles+=(keel)
  [ -n "${KEEL_TEST_PG_OWNER_URL:-}" ] || roles+=(keel_owner)
  for role in "${roles[@]}"; do
    psql -X -q -v ON_ERROR_STOP=1 "$KEEL_TEST_PG_ADMIN_URL" -c "DO \$\$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$role') THEN
          CREATE ROLE $role LOGIN NOSUPERUSER NOBYPASSRLS CREATEDB;
        END IF;
        IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
           AND NOT pg_has_role(current_user, '$role', 'MEMBER') THEN
          EXECUTE format('GRANT $role TO %I', current_user);
        END IF;
      END \$\$" >&2 || { echo "with-pg: could not prepare the role $role" >&2; exit 1; }
  done
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

t0=$SECONDS
bash "$here/pg-test-cluster.sh" start "$dir" || exit 1
KEEL_TEST_PG_URL=$(cat "$dir/url")
KEEL_TEST_PG_OWNER_URL=$(cat "$dir/owner-url")
KEEL_TEST_PG_ADMIN_URL=$(cat "$dir/admin-url")
export KEEL_TEST_PG_URL KEEL_TEST_PG_OWNER_URL KEEL_TEST_PG_ADMIN_URL
echo "with-pg: KEEL_TEST_PG_ADMIN_URL=$KEEL_TEST_PG_ADMIN_URL (started in $((SECONDS - t0))s)" >&2

# CMD runs in the background so that a SIGINT or SIGTERM to this script is handled at once (bash
# defers traps while a foreground command runs): CMD gets SIGTERM, then the cluster is stopped.
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 130' INT
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 143' TERM
wait "$child"

#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for the tests.
#
#   scripts/pg-test-cluster.sh start DIR      creates and starts a cluster; idempotent
#   scripts/pg-test-cluster.sh stop DIR       stops it (-m fast), removes DIR; idempotent
#   scripts/pg-test-cluster.sh url DIR        prints postgres://keel@127.0.0.1:PORT/keel
#   scripts/pg-test-cluster.sh owner-url DIR  prints postgres://keel_owner@127.0.0.1:PORT/keel
#   scripts/pg-test-cluster.sh admin-url DIR  prints postgres://postgres@127.0.0.1:PORT/postgres
#   scripts/pg-test-cluster.sh pause DIR      stops the server at once (-m immediate: a crash),
#                                             keeping its data; for outage tests
#   scripts/pg-test-cluster.sh resume DIR     starts a paused cluster again on the same port
#
# The cluster trusts every local connection (--auth=trust) and listens on 127.0.0.1 only, on a
# free port. It has two roles, as Keel runs (docs/decisions/0008-postgres-owner-and-runtime-roles.md):
# `keel_owner` (LOGIN NOSUPERUSER NOBYPASSRLS CREATEDB) owns a database `keel` and the schema
# Keel migrates; `keel` (LOGIN NOSUPERUSER NOBYPASSRLS CREATEDB), the runtime role, owns nothing
# in it. The superuser is `postgres`. DIR keeps `url`, `owner-url`, `admin-url`, `port` and
# `rundir`.
#
# The data directory, the log and the Unix socket live in a private directory under /tmp (its
# path is in DIR/rundir): owned by `postgres` with mode 0700 when run as root (root cannot run
# initdb, so the server runs as `postgres` through runuser, and DIR's parents need not be
# traversable by it), owned by the current user otherwise. /tmp also keeps the socket path short.
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
ME=pg-test-cluster

die() {
  echo "$ME: $*" >&2
  exit 1
}
say() { echo "$ME: $*" >&2; }

usage() {
  echo "usage: $0 start|stop|url|owner-url|admin-url|pause|resume DIR" >&2
  exit 2
}

[ $# -eq 2 ] || usage
cmd=$1
dir=$2
[ -n "$dir" ] || usage

as_server() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# 0 when the cluster recorded in $dir answers pg_ctl status.
running() {
  [ -f "$dir/rundir" ] || return 1
  local run
  run=$(cat "$dir/rundir")
  [ -d "$run/data" ] || return 1
  as_server "$PG_BIN/pg_ctl" -D "$run/data" status >/dev/null 2>&1
}

# Starts the server of run directory $1 on port $2. KEEL_TEST_PG_SHARED_BUFFERS (e.g. 1GB)
# sets its buffer cache; PostgreSQL's default, 128MB, is kept otherwise (the benchmarks of
# large data sets set it, as a server of that size would be). KEEL_TEST_PG_OPTIONS adds server
# options (e.g. "-c shared_preload_libraries=pg_stat_statements": bench/pg-statements.sh).
pg_start() {
  as_server "$PG_BIN/pg_ctl" -D "$1/data" -l "$1/log" -w -t 60 \
    -o "-p $2 -k $1 -c listen_addresses=127.0.0.1 -c fsync=on${KEEL_TEST_PG_SHARED_BUFFERS:+ -c shared_buffers=$KEEL_TEST_PG_SHARED_BUFFERS}${KEEL_TEST_PG_OPTIONS:+ $KEEL_TEST_PG_OPTIONS}" \
    start >/dev/null
}

psql_admin() {
  # Over TCP, so that it works for root and for the cluster's owner alike.
  PGCONNECT_TIMEOUT=10 psql -X -q -v ON_ERROR_STOP=1 "postgres://postgres@127.0.0.1:$1/postgres" \
    "${@:2}"
}

stop_cluster() {
  if [ -f "$dir/rundir" ]; then
    local run
    run=$(cat "$dir/rundir")
    case "$run" in
      /tmp/keel-pg.*) ;;
      *) die "refusing to remove an unexpected run directory '$run' (from $dir/rundir)" ;;
    esac
    if [ -d "$run/data" ] && as_server "$PG_BIN/pg_ctl" -D "$run/data" status >/dev/null 2>&1; then
      as_server "$PG_BIN/pg_ctl" -D "$run/data" -m fast -w stop >/dev/null \
        || say "pg_ctl stop failed (log: $run/log)"
    fi
    rm -rf "$run"
  fi
  # Only what start wrote: a DIR given by mistake (say, a build tree) keeps everything else.
  rm -f "$dir/rundir" "$dir/port" "$dir/url" "$dir/owner-url" "$dir/admin-url"
  rmdir "$dir" 2>/dev/null || say "left $dir in place: it holds files this script did not write"
}

start_cluster() {
  [ -x "$PG_BIN/initdb" ] || die "no PostgreSQL 15 at $PG_BIN (install postgresql-15: make deps)"
  command -v psql >/dev/null || die "psql not found (install postgresql-client-15: make deps)"
  if running; then
    say "already running: $(cat "$dir/url")"
    return 0
  fi
  if [ -f "$dir/rundir" ]; then
    say "removing a stale cluster in $dir"
    stop_cluster
  elif [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    die "$dir exists and is not empty; give a new or empty directory"
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local run
  run=$(mktemp -d /tmp/keel-pg.XXXXXX)
  echo "$run" >"$dir/rundir"
  chmod 0700 "$run"
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root needs the 'postgres' user (package postgresql-15)"
    chown postgres:postgres "$run"
  fi
  if ! as_server "$PG_BIN/initdb" -D "$run/data" -U postgres --auth=trust -E UTF8 \
         --locale=C.UTF-8 --no-sync >"$run/initdb.log" 2>&1; then
    cat "$run/initdb.log" >&2
    die "initdb failed"
  fi
  local port attempt started=0
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    if pg_start "$run" "$port"; then
      started=1
      break
    fi
    say "start on port $port failed (attempt $attempt); log tail:"
    tail -n 5 "$run/log" >&2 || true
  done
  [ "$started" -eq 1 ] || { tail -n 30 "$run/log" >&2 || true; die "could not start PostgreSQL"; }
  psql_admin "$port" \
    -c "CREATE ROLE keel LOGIN NOSUPERUSER NOBYPASSRLS CREATEDB" \
    -c "CREATE ROLE keel_owner LOGIN NOSUPERUSER NOBYPASSRLS CREATEDB" \
    -c "CREATE DATABASE keel OWNER keel_owner" >/dev/null \
    || die "could not create the roles keel, keel_owner and the database keel (log: $run/log)"
  echo "$port" >"$dir/port"
  echo "postgres://keel@127.0.0.1:$port/keel" >"$dir/url"
  echo "postgres://keel_owner@127.0.0.1:$port/keel" >"$dir/owner-url"
  echo "postgres://postgres@127.0.0.1:$port/postgres" >"$dir/admin-url"
  say "started PostgreSQL $("$PG_BIN/postgres" -V | awk '{print $3}') on 127.0.0.1:$port (data $run/data, log $run/log)"
}

case "$cmd" in
  start)
    start_cluster
    ;;
  stop)
    if [ ! -e "$dir" ]; then
      say "nothing to stop in $dir"
      exit 0
    fi
    stop_cluster
    say "stopped and removed $dir"
    ;;
  pause)
    running || die "no cluster running in $dir"
    as_server "$PG_BIN/pg_ctl" -D "$(cat "$dir/rundir")/data" -m immediate -w stop >/dev/null
    say "paused (data kept): $(cat "$dir/url")"
    ;;
  resume)
    [ -f "$dir/rundir" ] && [ -f "$dir/port" ] || die "no cluster in $dir (start it: $0 start $dir)"
    if ! running; then
      pg_start "$(cat "$dir/rundir")" "$(cat "$dir/port")" \
        || die "could not start PostgreSQL again (log: $(cat "$dir/rundir")/log)"
    fi
    say "resumed: $(cat "$dir/url")"
    ;;
  url | owner-url | admin-url)
    running || die "no cluster running in $dir (start it: $0 start $dir)"
    cat "$dir/$cmd"
    ;;
  *)
    usage
    ;;
esac

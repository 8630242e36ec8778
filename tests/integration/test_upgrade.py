"""Upgrades: a store written by an older release opens in this one, migrates, and goes on.

tests/fixtures/upgrade holds what keel at an older commit left on disk (manifest.json names the
commit; make_fixture.py made the files): a SQLite store and a PostgreSQL dump, each after a
workload that left a run parked for approval. The test restores the one of the backend under
test (KEEL_TEST_STORE) into a fresh store, starts this keel on it, and checks that:
- every migration is applied (schema_migrations has one row per file in
  src/keel/store/<backend>/migrations), and the schema is exactly what a fresh store gets, so a
  migration that landed was not edited afterwards;
- tokens work as before (the revoked one stays refused), the conversation reads back in order and
  goes on with a new turn, and the parked run resumes on its approval and writes its line once;
- memories, working memory, skills, plugins, schedules, secrets and budgets are where they were;
- the event log goes on after its last position, and its audit chains verify, signatures
  included, over the old events and the new.
"""

import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
import unittest

import keel_harness
from keel_harness import KeelServer, KeelTestCase, keel_bin

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "upgrade")
POSTGRES = os.environ.get("KEEL_TEST_STORE") == "postgres"
BACKEND = "postgres" if POSTGRES else "sqlite"

with open(os.path.join(FIXTURE, "manifest.json")) as _f:
    MANIFEST = json.load(_f)
OLD = MANIFEST[BACKEND]
KEK = MANIFEST["kek"]


def migration_files():
    folder = os.path.join(ROOT, "src", "keel", "store", BACKEND, "migrations")
    return sorted(f for f in os.listdir(folder) if f.endswith(".sql"))


def psql(url, sql=None, stdin=None):
    args = ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "--dbname", url]
    if sql is not None:
        args += ["-c", sql]
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError("psql failed (%d): %s" % (proc.returncode, proc.stderr[-2000:]))
    return proc.stdout


def admin_url(database):
    return keel_harness._pg_url_with(os.environ["KEEL_TEST_PG_ADMIN_URL"], db=database)


def pg_schema(database):
    proc = subprocess.run(["pg_dump", "--schema-only", "--dbname", admin_url(database)],
                          capture_output=True, text=True, timeout=120, check=True)
    return [line for line in proc.stdout.splitlines()
            if line and not line.startswith(("--", "\\restrict", "\\unrestrict"))]


def sqlite_schema(path):
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                            "ORDER BY type, name").fetchall()


class UpgradeTest(KeelTestCase):

    def setUp(self):
        # The older release's store, restored; the tests start this keel on it (start()).
        self.home = tempfile.mkdtemp(prefix="keel-upgrade-")
        self.database = None
        self.server = None
        if POSTGRES:
            # The dump is restored as the owner role: the role `keel store migrate` runs as.
            self.database, self.url = keel_harness.create_pg_database()
            with gzip.open(os.path.join(FIXTURE, "postgres.sql.gz"), "rt") as f:
                psql(keel_harness.pg_owner_url(self.url), stdin=f.read())
        else:
            self.url = "sqlite://" + os.path.join(self.home, "keel.db")
            with gzip.open(os.path.join(FIXTURE, "sqlite.db.gz"), "rb") as f, \
                    open(os.path.join(self.home, "keel.db"), "wb") as out:
                shutil.copyfileobj(f, out)
            with open(os.path.join(self.home, "origin"), "w") as f:
                f.write(OLD["origin"] + "\n")
        # The parked run's approval was made with the fixture, so its time to live ran out a day
        # later: it is given an hour from now, as if the upgrade came while it waited.
        sql = "UPDATE approvals SET expires_at = %d WHERE status = 'pending'" % (
            int(time.time() * 1000) + 3600 * 1000)
        if POSTGRES:
            psql(admin_url(self.database), sql)
        else:
            with sqlite3.connect(os.path.join(self.home, "keel.db")) as conn:
                self.assertEqual(conn.execute(sql).rowcount, 1)

    def start(self):
        self.server = KeelServer(home=self.home, env={"KEEL_SECRET_KEK": KEK},
                                 store_url=self.url if POSTGRES else None,
                                 token=OLD["platform_token"])
        return self.server

    def servers(self):
        return [self.server] if self.server else []

    def tearDown(self):
        if self.server:
            self.server.stop()
        if self.database and not os.environ.get("KEEL_TEST_KEEP"):
            keel_harness.drop_pg_database(self.database)
        shutil.rmtree(self.home, ignore_errors=True)

    def keel(self, *args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env["KEEL_SECRET_KEK"] = KEK
        return subprocess.run([keel_bin()] + list(args), capture_output=True, text=True,
                              timeout=120, env=env)

    def versions(self):
        sql = "SELECT version FROM schema_migrations ORDER BY version"
        if POSTGRES:
            return [int(v) for v in psql(admin_url(self.database), sql).split()]
        with sqlite3.connect(os.path.join(self.home, "keel.db")) as conn:
            return [v for (v,) in conn.execute(sql)]

    def test_the_schema_is_migrated_to_what_a_fresh_store_has(self):
        old = max(self.versions())
        self.assertLess(old, len(migration_files()), "the fixture is older than this keel")
        self.start()
        self.assertEqual(self.versions(), list(range(1, len(migration_files()) + 1)))
        with open(self.server.stderr_path) as f:
            self.assertIn("the store's schema went from version %d to %d"
                          % (old, len(migration_files())), f.read())
        fresh = KeelServer()
        try:
            if POSTGRES:
                self.assertEqual(pg_schema(self.database), pg_schema(fresh.pg_database))
            else:
                self.assertEqual(sqlite_schema(os.path.join(self.home, "keel.db")),
                                 sqlite_schema(os.path.join(fresh.home, "keel.db")))
        finally:
            fresh.stop()

    def test_keel_store_migrate_says_what_it_applied(self):
        old, new = max(self.versions()), len(migration_files())
        owner = ["--owner-url", keel_harness.pg_owner_url(self.url)] if POSTGRES else []
        proc = self.keel("store", "migrate", "--store", self.url, *owner)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.splitlines()[0], "schema version %d -> %d: %d migration%s "
                         "applied" % (old, new, new - old, "" if new - old == 1 else "s"))
        self.assertEqual(self.versions(), list(range(1, new + 1)))
        proc = self.keel("store", "migrate", "--store", self.url, *owner)
        self.assertEqual(proc.stdout.splitlines()[0],
                         "schema version %d: current, nothing to apply" % new)
        with open(self.start().stderr_path) as f:
            self.assertNotIn("schema went from", f.read(), "migrated already")
        if not POSTGRES:
            # The owner role is PostgreSQL's; a path without a store is not created.
            proc = self.keel("store", "migrate", "--store", self.url, "--owner-url",
                             "postgres://keel_owner@127.0.0.1:1/keel")
            self.assertEqual((proc.returncode, proc.stderr.strip()),
                             (2, "keel: --owner-url applies to a PostgreSQL store only"))
            missing = os.path.join(self.home, "no", "keel.db")
            proc = self.keel("store", "migrate", "--store", "sqlite://" + missing)
            self.assertEqual((proc.returncode, proc.stderr.strip()),
                             (2, "keel: no SQLite store at " + missing))
            self.assertFalse(os.path.exists(missing))

    def test_a_store_from_a_newer_release_is_refused(self):
        # A release with one migration more wrote this store: this keel does not start on it,
        # says why, and leaves it as it was.
        self.start().stop()
        newer = len(migration_files()) + 1
        sql = "INSERT INTO schema_migrations(version, applied_at) VALUES(%d, 0)" % newer
        if POSTGRES:
            psql(admin_url(self.database), sql)
        else:
            with sqlite3.connect(os.path.join(self.home, "keel.db")) as conn:
                conn.execute(sql)
        with self.assertRaises(keel_harness.ServerDied) as refused:
            self.server.start()
        self.assertIn("database schema version %d is newer than this keel (%d); upgrade keel"
                      % (newer, newer - 1), str(refused.exception))
        self.assertEqual(self.versions(), list(range(1, newer + 1)))

    def test_a_rebuild_refuses_what_older_events_cannot_rebuild(self):
        # The older release's events carry no row images: a rebuild from them would lose the
        # tenants' older rows, so it is refused, naming a tenant, and writes nothing.
        self.start().stop()  # upgraded first
        target = os.path.join(self.home, "rebuilt.db")
        proc = self.keel("store", "rebuild", "--from-events", "--store", self.url,
                         "--into", "sqlite://" + target)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertRegex(proc.stderr, r"tenant [0-9a-f-]{36} was created before events carried "
                                      r"row images: its tables cannot be rebuilt from its events")
        if os.path.exists(target):
            with sqlite3.connect(target) as conn:
                self.assertEqual(conn.execute("SELECT count(*) FROM events").fetchone(), (0,))

    def test_the_tenant_goes_on_where_it_stopped(self):
        s = self.start()
        token = OLD["owner_token"]
        aid, sid = OLD["agent_id"], OLD["session_id"]

        # Tokens: as they were.
        self.assertEqual(s.request("GET", "/v1/agents", token=OLD["revoked_token"])[0], 401)
        self.assertEqual(s.request("GET", "/v1/agents", token=OLD["user_token"])[0], 200)
        self.assertEqual(s.ok("GET", "/v1/agents/%s" % aid, token=token)["name"], "upgrade-agent")

        # The conversation reads back in order and goes on: the new turn's messages come last.
        def conversation():
            return [[m["role"], m["content"]]
                    for m in s.list_all("/v1/sessions/%s/messages" % sid, token=token)]
        self.assertEqual(conversation(), OLD["conversation"])
        status, body, _ = s.post_message(sid, "the first turn after the upgrade", wait=15,
                                         token=token)
        self.assertEqual(body["run"]["status"], "done", body)
        after = conversation()
        self.assertEqual(after[:len(OLD["conversation"])], OLD["conversation"])
        self.assertEqual([r for r, _ in after[len(OLD["conversation"]):]], ["user", "assistant"])
        self.assertEqual(after[-2][1], "the first turn after the upgrade")

        # The run parked before the upgrade resumes on its approval, and writes its line once.
        parked = OLD["parked"]
        self.assertEqual(s.get_run(parked["run_id"], token=token)["status"],
                         "waiting_for_approval")
        s.ok("POST", "/v1/approvals/%s/approve" % parked["approval_id"], {}, token=token)
        run = s.wait_run(parked["run_id"], token=token)
        self.assertEqual(run["status"], "done", run)
        with open(os.path.join(self.home, "workspaces", aid, "notes.txt")) as f:
            self.assertEqual(f.read().splitlines(), ["after the upgrade"])

        # What the tenant had: memories (searchable), working memory, skills, plugins,
        # schedules, secrets, budgets.
        found = s.ok("GET", "/v1/agents/%s/memories?q=tea" % aid, token=token)["items"]
        self.assertEqual([(m["id"], m["text"]) for m in found],
                         [("tea", "the user likes green tea")])
        self.assertEqual(s.ok("GET", "/v1/agents/%s/working-memory" % aid, token=token)["text"],
                         "the user is upgrading")
        self.assertEqual([k["name"] for k in s.ok("GET", "/v1/agents/%s/skills" % aid,
                                                   token=token)["items"]], ["greeter"])
        [plugin] = s.ok("GET", "/v1/plugins", token=token)["items"]
        self.assertEqual(plugin["id"], "audit")
        schedule = s.ok("GET", "/v1/schedules/%s" % OLD["schedule_id"], token=token)
        self.assertEqual((schedule["cron"], schedule["status"]), ("0 3 * * *", "active"))
        self.assertTrue(schedule["next_fire_at"])
        self.assertEqual([x["name"] for x in s.ok("GET", "/v1/secrets", token=token)["items"]],
                         ["api_key"])
        [budget] = s.ok("GET", "/v1/budgets", token=token)["items"]
        self.assertEqual((budget["scope"], budget["period"]), ("tenant", "month"))

        # The log goes on after its last position, with no gap, and every chain verifies.
        events = s.list_all("/v1/events", token=token)
        positions = [e["position"] for e in events]
        self.assertEqual(positions, list(range(positions[0], positions[0] + len(positions))))
        self.assertGreater(positions[-1], OLD["last_position"])
        self.assertEqual(len([p for p in positions if p <= OLD["last_position"]]), OLD["events"])
        s.stop()
        proc = self.keel("audit", "verify", "--store", self.url)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


if __name__ == "__main__":
    unittest.main()

"""The audit chain over the event log, attacked by someone who can write the database.

A real server with a KEK; each test works on a tenant of its own, whose events it changes,
removes or moves directly in the database (the sqlite3 module on the SQLite file, psql as the
schema's owner on PostgreSQL), then asks `GET /v1/audit/verify` and `keel audit verify`, which
must name the first event found wrong. A chain recomputed without the key (SHA-256 needs none)
fails its head's signature. An export archive changed after the export is refused on import,
naming the event. The route is the tenant owner's: a user or guest gets 403, a revoked token
401, and another tenant's owner sees only its own tenant's chains.
"""

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import unittest

from keel_harness import KeelServer, KeelTestCase, Tenant, keel_bin, pg_owner_url, unique_name

KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
COLUMNS = ("position", "id", "tenant_id", "type", "origin", "origin_seq", "agent_id",
           "session_id", "run_id", "payload", "occurred_at", "hash")


def literal(v):
    return str(v) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'"


def event_hash(e, prev):
    """The hash of store/audit.h: each field as its byte length, ':' and its bytes."""
    data = b"keel-event-v1\n"
    for v in (e["id"], e["tenant_id"], e["type"], e["origin"], e["agent_id"], e["session_id"],
              e["run_id"], e["payload"], str(e["occurred_at"]), prev):
        b = v.encode()
        data += str(len(b)).encode() + b":" + b
    return hashlib.sha256(data).hexdigest()


class Database:
    """The server's store, reached behind its back."""

    def __init__(self, server):
        self.server = server
        self.pg = bool(server.pg_database)

    def execute(self, sql):
        if self.pg:
            subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                            pg_owner_url(self.server.store_url), "-c", sql],
                           check=True, capture_output=True, timeout=60)
            return
        db = sqlite3.connect(os.path.join(self.server.home, "keel.db"), timeout=30)
        try:
            db.executescript(sql)
            db.commit()
        finally:
            db.close()

    def events(self, tenant_id):
        sql = ("SELECT %s FROM events WHERE tenant_id=%s ORDER BY position"
               % (", ".join(COLUMNS), literal(tenant_id)))
        if self.pg:
            out = subprocess.run(["psql", "-X", "-At", "-F", "\t",
                                  pg_owner_url(self.server.store_url), "-c", sql],
                                 check=True, capture_output=True, text=True, timeout=60).stdout
            rows = [line.split("\t") for line in out.splitlines() if line]
        else:
            db = sqlite3.connect(os.path.join(self.server.home, "keel.db"), timeout=30)
            try:
                rows = db.execute(sql).fetchall()
            finally:
                db.close()
        events = []
        for row in rows:
            e = dict(zip(COLUMNS, row))
            for k in ("position", "origin_seq", "occurred_at"):
                e[k] = int(e[k])
            events.append(e)
        return events

    def set(self, position, **fields):
        assignments = ", ".join("%s=%s" % (k, literal(v)) for k, v in fields.items())
        self.execute("UPDATE events SET %s WHERE position=%d" % (assignments, position))


class AuditChainTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_SECRET_KEK": KEK})
        cls.db = Database(cls.server)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def tenant_with_events(self, turns=3):
        """A tenant of its own, with an agent, a session and a few turns."""
        t = Tenant(self.server)
        agent = t.ok("POST", "/v1/agents", {"name": unique_name("agent")}, expect=201)
        session = t.ok("POST", "/v1/agents/%s/sessions" % agent["id"], {}, expect=201)
        for i in range(turns):
            t.ok("POST", "/v1/sessions/%s/messages?wait=10" % session["id"],
                 {"content": "turn %d" % i}, expect=(200, 201, 202))
        events = self.db.events(t.id)
        self.assertGreaterEqual(len(events), 6, "the turns wrote events")
        return t, events

    def verify(self, t):
        return t.ok("GET", "/v1/audit/verify")

    def cli_verify(self, tenant_id, kek=KEK):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        if kek:
            env["KEEL_SECRET_KEK"] = kek
        cmd = [keel_bin(), "audit", "verify", "--home", self.server.home, "--tenant", tenant_id]
        if self.server.store_url:
            cmd += ["--store", self.server.store_url]
            if self.db.pg:
                env["KEEL_STORE_OWNER"] = pg_owner_url(self.server.store_url)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    def assertNamed(self, report, event_id):
        self.assertEqual(report["status"], "tampered", report)
        self.assertEqual(report["problem"]["event_id"], event_id, report)
        self.assertIn(event_id, report["problem"]["message"])

    def test_an_untouched_log_verifies(self):
        t, events = self.tenant_with_events()
        report = self.verify(t)
        self.assertEqual(report["status"], "verified", report)
        self.assertEqual(report["tenant_id"], t.id)
        self.assertEqual(report["events"], len(events))
        self.assertIsNone(report["problem"])
        self.assertEqual([c["status"] for c in report["chains"]], ["verified"])
        cli = self.cli_verify(t.id)
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertIn("verified", cli.stdout)

    def test_a_changed_payload_is_named(self):
        t, events = self.tenant_with_events()
        target = events[len(events) // 2]
        self.db.set(target["position"], payload='{"text":"something else"}')
        self.assertNamed(self.verify(t), target["id"])
        cli = self.cli_verify(t.id)
        self.assertEqual(cli.returncode, 1, cli.stdout + cli.stderr)
        self.assertIn(target["id"], cli.stdout)
        self.assertIn("tampered", cli.stdout)

    def test_a_removed_event_is_named(self):
        t, events = self.tenant_with_events()
        gone, after = events[3], events[4]
        self.db.execute("DELETE FROM events WHERE position=%d" % gone["position"])
        report = self.verify(t)
        # The event itself is gone: the chain breaks at the one after it.
        self.assertNamed(report, after["id"])
        self.assertIn("removed", report["problem"]["message"])

    def test_a_removed_tail_is_named_by_the_head(self):
        t, events = self.tenant_with_events()
        self.db.execute("DELETE FROM events WHERE position>=%d AND tenant_id=%s"
                        % (events[-2]["position"], literal(t.id)))
        self.assertNamed(self.verify(t), events[-1]["id"])

    def test_swapped_events_are_named(self):
        t, events = self.tenant_with_events()
        a, b = events[2], events[3]
        content = [c for c in COLUMNS if c != "position"]
        # The two rows exchange everything but their positions: the log reads in another order.
        self.db.set(a["position"], origin_seq=-1)
        self.db.set(b["position"], **{c: a[c] for c in content})
        self.db.set(a["position"], **{c: b[c] for c in content})
        self.assertNamed(self.verify(t), b["id"])

    def test_a_chain_recomputed_without_the_key_fails_its_signature(self):
        t, events = self.tenant_with_events()
        start = len(events) // 2
        forged = [dict(e) for e in events]
        forged[start]["payload"] = '{"text":"forged"}'
        prev = forged[start - 1]["hash"]
        for e in forged[start:]:
            e["hash"] = event_hash(e, prev)
            prev = e["hash"]
        # Our hashing matches Keel's: the untouched prefix recomputes to the stored hashes.
        self.assertEqual(event_hash(events[1], events[0]["hash"]), events[1]["hash"])
        for e in forged[start:]:
            self.db.set(e["position"], payload=e["payload"], hash=e["hash"])
        self.db.execute("UPDATE audit_heads SET hash=%s WHERE tenant_id=%s"
                        % (literal(prev), literal(t.id)))
        report = self.verify(t)
        self.assertEqual(report["status"], "tampered", report)
        self.assertIn("signature", report["problem"]["message"])
        # Without the key only the hashes can be checked, and the CLI says so.
        cli = self.cli_verify(t.id, kek=None)
        self.assertEqual(cli.returncode, 1, cli.stdout)
        self.assertIn("unchecked", cli.stdout)
        self.assertIn("KEEL_SECRET_KEK is not set", cli.stderr)

    def test_the_route_is_the_owners_alone(self):
        t, _ = self.tenant_with_events(turns=1)
        user, _ = t.new_token("user")
        guest, _ = t.new_token("guest")
        revoked, revoked_id = t.new_token("owner")
        t.ok("DELETE", "/v1/tokens/" + revoked_id, expect=204)
        for token, status in ((user, 403), (guest, 403), (revoked, 401), (None, 401)):
            got, body, _ = self.server.request("GET", "/v1/audit/verify", token=token)
            self.assertEqual(got, status, body)
            self.assertIn("error", body)
        # Another tenant's owner verifies its own tenant; it learns nothing of this one's log,
        # not even that it was tampered with.
        self.db.execute("UPDATE events SET payload='{}' WHERE tenant_id=%s" % literal(t.id))
        other, _ = self.tenant_with_events(turns=1)
        report = self.verify(other)
        self.assertEqual(report["tenant_id"], other.id)
        self.assertEqual(report["status"], "verified", report)
        self.assertEqual(self.verify(t)["status"], "tampered")

    def export(self, tenant_id, path):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env["KEEL_SECRET_KEK"] = KEK
        cmd = [keel_bin(), "export", "--home", self.server.home, "--tenant", tenant_id, path]
        if self.server.store_url:
            cmd[-1:-1] = ["--store", self.server.store_url]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)

    def import_into_new_store(self, path, kek=KEK):
        home = tempfile.mkdtemp(prefix="keel-it-import-")
        self.addCleanup(shutil.rmtree, home, True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        if kek:
            env["KEEL_SECRET_KEK"] = kek
        return subprocess.run([keel_bin(), "import", "--home", home, "--store",
                               "sqlite://" + os.path.join(home, "keel.db"), path],
                              env=env, capture_output=True, text=True, timeout=120), home

    @staticmethod
    def count_events(home):
        path = os.path.join(home, "keel.db")
        if not os.path.exists(path):
            return 0
        db = sqlite3.connect(path)
        try:
            return db.execute("SELECT count(*) FROM events").fetchone()[0]
        finally:
            db.close()

    def rewrite_archive(self, path, edit):
        """Unpacks the archive, lets `edit` change its events, fixes the manifest's checksums
        (anyone can) and packs it again in the same order."""
        d = tempfile.mkdtemp(prefix="keel-it-archive-")
        self.addCleanup(shutil.rmtree, d, True)
        names = subprocess.run(["tar", "--zstd", "-tf", path], check=True, capture_output=True,
                               text=True).stdout.split()
        subprocess.run(["tar", "--zstd", "-xf", path, "-C", d], check=True)
        with open(os.path.join(d, "events.jsonl")) as f:
            events = [json.loads(line) for line in f]
        with open(os.path.join(d, "audit_heads.jsonl")) as f:
            heads = [json.loads(line) for line in f]
        edit(events, heads)
        manifest_path = os.path.join(d, "manifest.json")
        with open(manifest_path) as f:
            manifest = json.load(f)
        for name, rows in (("events", events), ("audit_heads", heads)):
            text = "".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n"
                           for r in rows)
            with open(os.path.join(d, name + ".jsonl"), "w") as f:
                f.write(text)
            manifest["tables"][name] = {"rows": len(rows),
                                        "sha256": hashlib.sha256(text.encode()).hexdigest()}
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=2)
        out = path + ".edited.tar.zst"
        subprocess.run(["tar", "--zstd", "-cf", out, "-C", d] + names, check=True)
        return out

    def test_a_tampered_archive_is_refused_on_import(self):
        t, events = self.tenant_with_events()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "export.tar.zst")
            self.export(t.id, path)
            ok, home = self.import_into_new_store(path)
            self.assertEqual(ok.returncode, 0, ok.stderr)
            target = events[2]

            def change(rows, heads):
                for r in rows:
                    if r["id"] == target["id"]:
                        r["payload"] = '{"text":"changed in the archive"}'

            changed, home = self.import_into_new_store(self.rewrite_archive(path, change))
            self.assertEqual(changed.returncode, 1, changed.stdout)
            self.assertIn(target["id"], changed.stderr)
            self.assertIn("audit chain", changed.stderr)
            self.assertEqual(self.count_events(home), 0, "nothing was imported")

            def forge(rows, heads):
                prev = ""
                for r in rows:
                    if r["id"] == target["id"]:
                        r["payload"] = '{"text":"forged in the archive"}'
                    r["hash"] = event_hash(r, prev)
                    prev = r["hash"]
                heads[0]["hash"] = prev

            forged, _ = self.import_into_new_store(self.rewrite_archive(path, forge))
            self.assertEqual(forged.returncode, 1, forged.stdout)
            self.assertIn("signature", forged.stderr)

            # The same forgery with the head's signature removed: refused under the key, for
            # anyone can hash a chain again; without a key the hashes are all there is to check,
            # and the command says so.
            def forge_unsigned(rows, heads):
                forge(rows, heads)
                heads[0]["mac"] = ""
                heads[0]["anchor"] = ""

            unsigned = self.rewrite_archive(path, forge_unsigned)
            refused, home = self.import_into_new_store(unsigned)
            self.assertEqual(refused.returncode, 1, refused.stdout)
            self.assertIn("unsigned head", refused.stderr)
            self.assertEqual(self.count_events(home), 0, "nothing was imported")
            keyless, _ = self.import_into_new_store(unsigned, kek=None)
            self.assertEqual(keyless.returncode, 0, keyless.stderr)
            self.assertIn("hashes only", keyless.stderr)


class AuditCrashTest(KeelTestCase):
    """A kill -9 while turns commit leaves every chain and head whole: the heads are written in
    the transactions that extend the chains, and the node carries them on after its restart."""

    def test_chains_survive_a_crash_under_load(self):
        self.server = KeelServer(env={"KEEL_SECRET_KEK": KEK})
        try:
            t = Tenant(self.server)
            agent = t.ok("POST", "/v1/agents", {"name": unique_name("agent")}, expect=201)
            sessions = [t.ok("POST", "/v1/agents/%s/sessions" % agent["id"], {}, expect=201)
                        for _ in range(4)]
            runs = []
            for i in range(40):
                body = t.ok("POST", "/v1/sessions/%s/messages" % sessions[i % 4]["id"],
                            {"content": "turn %d" % i}, expect=(200, 201, 202))
                runs.append(body["run"]["id"])
            self.server.restart(kill=True)
            body = t.ok("POST", "/v1/sessions/%s/messages?wait=10" % sessions[0]["id"],
                        {"content": "after the crash"}, expect=(200, 201, 202))
            runs.append(body["run"]["id"])
            # The runs the crash cut off resume; once all are done the log stands still.
            for run_id in runs:
                self.server.wait_run(run_id, token=t.token)
            report = t.ok("GET", "/v1/audit/verify")
            self.assertEqual(report["status"], "verified", report)
            self.assertEqual(report["events"], len(Database(self.server).events(t.id)))
        finally:
            self.server.stop()


@unittest.skipUnless(os.environ.get("KEEL_TEST_STORE") == "postgres",
                     "several nodes share a store on PostgreSQL only")
class AuditTwoNodesTest(KeelTestCase):
    """Two nodes append to one tenant under the tenant's write lock: a chain per origin, each
    verified; one node's tampered event is named in its own chain."""

    def servers(self):
        return [s for s in (getattr(self, "a", None), getattr(self, "b", None)) if s]

    def test_each_nodes_chain_verifies_and_names_its_tampered_event(self):
        self.a = KeelServer(env={"KEEL_SECRET_KEK": KEK})
        try:
            self.b = KeelServer(env={"KEEL_SECRET_KEK": KEK}, store_url=self.a.store_url,
                                token=self.a.token)
            try:
                t = Tenant(self.a)
                agent = t.ok("POST", "/v1/agents", {"name": unique_name("agent")}, expect=201)
                for server in (self.a, self.b, self.a, self.b):
                    session = server.ok("POST", "/v1/agents/%s/sessions" % agent["id"], {},
                                        token=t.token, expect=201)
                    server.ok("POST", "/v1/sessions/%s/messages?wait=10" % session["id"],
                              {"content": "hello"}, token=t.token, expect=(200, 201, 202))
                report = t.ok("GET", "/v1/audit/verify")
                self.assertEqual(report["status"], "verified", report)
                self.assertEqual(len(report["chains"]), 2, report)
                events = Database(self.a).events(t.id)
                origin_b = [e for e in events if e["origin"] != events[0]["origin"]]
                target = origin_b[1]
                Database(self.a).set(target["position"], payload='{"x":1}')
                report = self.b.ok("GET", "/v1/audit/verify", token=t.token)
                self.assertEqual(report["problem"]["event_id"], target["id"], report)
                self.assertEqual(report["problem"]["origin"], target["origin"])
                self.assertEqual(sorted(c["status"] for c in report["chains"]),
                                 ["tampered", "verified"])
            finally:
                self.b.stop()
        finally:
            self.a.stop()


class AuditWithoutKekTest(KeelTestCase):
    def test_heads_are_unsigned_and_verify_says_so(self):
        server = KeelServer()
        self.server = server
        try:
            self.assertIn("audit chain heads are unsigned", server.log_tail())
            t = Tenant(server)
            t.ok("POST", "/v1/agents", {"name": unique_name("agent")}, expect=201)
            report = t.ok("GET", "/v1/audit/verify")
            self.assertEqual(report["status"], "unsigned", report)
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main()

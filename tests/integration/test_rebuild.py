"""`keel store rebuild --from-events`: the tables rebuilt from the event log alone.

A real server runs a mixed workload over two tenants (tokens made and revoked, tenant settings,
agents created, changed and deleted, sessions closed and reopened, turns, tool calls, approvals
approved, rejected, amended, cancelled and made standing, policies and emergency stops set and
lifted). Once it stops, the store is rebuilt from its events into a new, empty store, and both
are exported: every table the log rebuilds (RebuiltTables, store/row_images.h) must be the same,
row for row, and so must the events and the audit chains' heads. A server on the rebuilt store
then serves the same token, and a session's conversation goes on where it stopped.

Attacks: the events' row images reach no client (the event list, for the owner and a guest); a
rebuild into a store that holds data is refused; a log whose events were changed behind the
server's back (an image added to a stored event) is refused by its audit chain, naming it, and
nothing is written (a target the command created is removed again); the same change hashed
again by someone without the key is refused under the key, for its unsigned head; a forged image
in one tenant's event does not rewrite another tenant's row; and the source must be an existing
keel store of this version, which the command only reads: a missing path, another program's
database and an older store are refused and left as they were (migrate refuses another
program's database and a FIFO too).
"""

import base64
import hashlib
import hmac
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
import unittest

import keel_harness
from keel_harness import (KeelServer, KeelTestCase, create_pg_database, drop_pg_database,
                          keel_bin, pg_owner_url, wait_for)

WAIT = 15
KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
SKILL = "---\nname: %s\ndescription: %s\n---\n# %s\n"
FRAME = {"rules": [
    {"tool": "*", "rights": ["read", "write"], "approval": "never"},
    {"tool": "notes.append", "rights": ["write"], "approval": "always"},
]}
# The tables the log rebuilds; the rest are left empty (and the command names them).
REBUILT = ["tenants", "api_tokens", "tenant_keys", "secrets", "agents", "sessions", "messages",
           "runs", "run_steps", "tool_calls", "policies", "emergency_stops", "approvals",
           "standing_approvals", "mcp_servers", "plugins", "agent_plugins", "schedules",
           "schedule_fires", "memories", "working_memories", "skills", "agent_skills",
           "compactions", "budgets", "model_usage", "usage_totals", "channels",
           "channel_conversations", "channel_deliveries", "users", "identities",
           "agent_members", "agent_access"]


def note_call(line):
    return "/call notes.append " + json.dumps({"line": line})


class Tenant(keel_harness.Tenant):
    def post(self, session_id, content, wait=WAIT, token=None):
        status, body, _ = self.server.post_message(session_id, content, wait=wait,
                                                   token=token or self.token)
        if status not in (200, 202):
            raise AssertionError("POST message -> %s: %s" % (status, body))
        return body["run"]

    def pending(self, run_id):
        found = [a for a in self.ok("GET", "/v1/approvals?status=pending")["items"]
                 if a["run_id"] == run_id]
        assert len(found) == 1, found
        return found[0]

    def park(self, session_id, line):
        run = self.post(session_id, note_call(line))
        assert run["status"] == "waiting_for_approval", run
        return run, self.pending(run["id"])


class Store:
    """A store URL that the test owns: a SQLite file, or a fresh PostgreSQL database."""

    def __init__(self, directory):
        self.pg_database = None
        if os.environ.get("KEEL_TEST_STORE") == "postgres":
            self.pg_database, self.url = create_pg_database()
            keel(["store", "migrate", "--store", self.url, "--owner-url", pg_owner_url(self.url)])
        else:
            self.url = "sqlite://" + os.path.join(directory, "rebuilt.db")

    def drop(self):
        if self.pg_database and not os.environ.get("KEEL_TEST_KEEP"):
            drop_pg_database(self.pg_database)


def keel(args, check=True, kek=KEK):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    if kek:
        env["KEEL_SECRET_KEK"] = kek  # the server's: the chains' signatures are checked
    proc = subprocess.run([keel_bin()] + args, capture_output=True, text=True, timeout=300,
                          env=env)
    if check and proc.returncode != 0:
        raise AssertionError("keel %s -> %d\n%s%s" % (" ".join(args), proc.returncode,
                                                     proc.stdout, proc.stderr))
    return proc


def rehash(path, *sql):
    """Runs `sql` on the SQLite store at `path`, then hashes every chain again and writes its
    head unsigned, as someone with the file but without the key can."""
    db = sqlite3.connect(path)
    try:
        for statement in sql:
            db.execute(statement)

        def field(v):
            b = (v if v is not None else "").encode() if not isinstance(v, bytes) else v
            return str(len(b)).encode() + b":" + b
        heads = {}
        for (pos, id_, tenant, typ, origin, agent, session, run, payload, at, seq) in db.execute(
                "SELECT position, id, tenant_id, type, origin, agent_id, session_id, run_id, "
                "payload, occurred_at, origin_seq FROM events ORDER BY position").fetchall():
            prev = heads.get((tenant, origin), (None, None, ""))[2]
            digest = hashlib.sha256(b"keel-event-v1\n" + b"".join(
                field(x) for x in (id_, tenant, typ, origin, agent, session, run, payload,
                                   str(at), prev))).hexdigest()
            db.execute("UPDATE events SET hash=? WHERE position=?", (digest, pos))
            heads[(tenant, origin)] = (id_, seq, digest)
        db.execute("DELETE FROM audit_heads")
        for (tenant, origin), (last_id, last_seq, digest) in heads.items():
            db.execute("INSERT INTO audit_heads(tenant_id, origin, last_id, last_seq, hash, "
                       "anchor, mac) VALUES(?,?,?,?,?,'','')",
                       (tenant, origin, last_id, last_seq, digest))
        db.commit()
    finally:
        db.close()


def dump(path):
    """The database file's bytes, by their hash."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def source_url(server):
    return server.store_url or "sqlite://" + os.path.join(server.home, "keel.db")


def export_tables(url, directory):
    """`keel export` of every tenant, unpacked: {table: [line, ...]}."""
    os.makedirs(directory)
    archive = os.path.join(directory, "export.tar.zst")
    keel(["export", "--store", url, archive])
    out = os.path.join(directory, "export")
    os.makedirs(out)
    subprocess.run(["tar", "--zstd", "-xf", archive, "-C", out], check=True, timeout=60)
    tables = {}
    for name in os.listdir(out):
        if name.endswith(".jsonl"):
            with open(os.path.join(out, name)) as f:
                tables[name[:-6]] = f.read().splitlines()
    return tables


class RebuildTest(KeelTestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="keel-rebuild-")
        self.server = KeelServer(env={"KEEL_SECRET_KEK": KEK})
        self.targets = []

    def tearDown(self):
        for s in getattr(self, "others", []):
            s.stop()
        self.server.stop()
        for t in self.targets:
            t.drop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def target(self):
        t = Store(self.dir)
        self.targets.append(t)
        return t

    def workload(self):
        s = self.server
        t = Tenant(s)
        other = Tenant(s)
        user, _ = t.new_token("user")
        guest, _ = t.new_token("guest")
        _, revoked_id = t.new_token("user")
        t.ok("DELETE", "/v1/tokens/%s" % revoked_id)
        s.ok("PATCH", "/v1/tenants/%s" % other.id, {"allow_host_exec": True})
        t.ok("PUT", "/v1/policy", FRAME)
        t.ok("PUT", "/v1/emergency-stop", {"reason": "drill"})
        t.ok("DELETE", "/v1/emergency-stop")

        agent = s.create_agent(tools=["time.now", "notes.append"], token=t.token)
        gone = s.create_agent(tools=["time.now"], token=t.token)
        t.ok("PATCH", "/v1/agents/%s" % agent["id"], {"instructions": "Be brief."})
        t.ok("PUT", "/v1/agents/%s/policy" % agent["id"], {"rules": [
            {"tool": "time.now", "rights": ["read"], "approval": "never"},
            {"tool": "notes.append", "rights": ["write"], "approval": "always"}]})
        t.ok("PUT", "/v1/agents/%s/emergency-stop" % gone["id"], {"reason": "retired"})

        sess = s.create_session(agent["id"], token=t.token)
        for i in range(6):
            self.assertEqual(t.post(sess["id"], "hello %d" % i)["status"], "done")
        t.post(sess["id"], "/call time.now {}")
        # Approvals: approved, approved with amended arguments and standing, rejected, and a
        # waiting run cancelled.
        run, a = t.park(sess["id"], "one")
        t.ok("POST", "/v1/approvals/%s/approve" % a["id"], {})
        t.server.wait_run(run["id"], token=t.token)
        run, a = t.park(sess["id"], "two")
        t.ok("POST", "/v1/approvals/%s/approve" % a["id"],
             {"arguments": {"line": "two, amended"},
              "standing": {"expires_in": 3600, "match": {"line": "two, amended"}}})
        t.server.wait_run(run["id"], token=t.token)
        run, a = t.park(sess["id"], "three")
        t.ok("POST", "/v1/approvals/%s/reject" % a["id"], {"reason": "no"})
        t.server.wait_run(run["id"], token=t.token)
        run, _ = t.park(sess["id"], "four")
        t.ok("POST", "/v1/runs/%s/cancel" % run["id"], {})
        standing = t.ok("GET", "/v1/standing-approvals")["items"]
        for st in standing:
            t.ok("DELETE", "/v1/standing-approvals/%s" % st["id"])

        # Another user's and a guest's sessions; a session closed and reopened.
        for token in (user, guest):
            other_sess = s.create_session(agent["id"], token=token)
            t.post(other_sess["id"], "mine", token=token)
        closed = s.create_session(agent["id"], token=t.token)
        t.post(closed["id"], "before closing")
        t.ok("PATCH", "/v1/sessions/%s" % closed["id"], {"status": "inactive"})
        t.ok("PATCH", "/v1/sessions/%s" % closed["id"], {"status": "idle"})
        t.ok("DELETE", "/v1/agents/%s/emergency-stop" % gone["id"])
        t.ok("DELETE", "/v1/agents/%s/policy" % agent["id"])
        t.ok("DELETE", "/v1/agents/%s" % gone["id"])

        self.everything_else(t, agent)

        other_agent = s.create_agent(token=other.token)
        other_sess = s.create_session(other_agent["id"], token=other.token)
        for i in range(3):
            other.post(other_sess["id"], "other %d" % i)
        other.ok("PUT", "/v1/emergency-stop", {"reason": "end of the day"})
        return t, sess

    def everything_else(self, t, agent):
        """Secrets, MCP servers, plugins, memories, skills, schedules, budgets, compaction."""
        s = self.server
        aid = agent["id"]
        t.ok("PUT", "/v1/secrets/api_key", {"value": "first"})
        t.ok("PUT", "/v1/secrets/api_key", {"value": "second"})
        t.ok("PUT", "/v1/secrets/gone", {"value": "x"})
        t.ok("DELETE", "/v1/secrets/gone")
        kept = s.ok("POST", "/v1/mcp-servers", {"name": "kept", "command": ["/no/such/server"]},
                    expect=201)
        gone = s.ok("POST", "/v1/mcp-servers", {"name": "gone", "command": ["/no/such/server"]},
                    expect=201)
        s.ok("DELETE", "/v1/mcp-servers/%s" % gone["id"])
        self.assertTrue(kept["id"])

        def plugin(pid):
            return {"manifest": {"id": pid, "name": pid, "version": "1.0.0", "kind": "builtin",
                                 "builtin": "audit-log", "events": ["tool.after@v1"]}}
        t.ok("POST", "/v1/plugins", plugin("audit"), expect=201)
        t.ok("POST", "/v1/plugins", plugin("audit"), expect=(200, 201))
        t.ok("POST", "/v1/plugins/audit/enable", {"agent_id": aid})
        t.ok("POST", "/v1/plugins/audit/enable", {"agent_id": "*"})
        t.ok("POST", "/v1/plugins/audit/disable", {"agent_id": "*"})
        t.ok("POST", "/v1/plugins", plugin("brief"), expect=201)
        t.ok("POST", "/v1/plugins/brief/enable", {"agent_id": aid})
        t.ok("DELETE", "/v1/plugins/brief")

        t.ok("POST", "/v1/agents/%s/memories" % aid, {"text": "likes tea", "id": "tea"},
             expect=201)
        t.ok("POST", "/v1/agents/%s/memories" % aid,
             {"text": "likes green tea", "id": "tea", "tags": ["drinks"]})
        m = t.ok("POST", "/v1/agents/%s/memories" % aid, {"text": "to forget"}, expect=201)
        t.ok("DELETE", "/v1/agents/%s/memories/%s" % (aid, m["id"]))
        t.ok("PUT", "/v1/agents/%s/working-memory" % aid, {"text": "the user is testing"})

        t.ok("POST", "/v1/skills", {"files": {"SKILL.md": SKILL % ("kept", "one", "One")}},
             expect=201)
        t.ok("POST", "/v1/skills", {"files": {"SKILL.md": SKILL % ("kept", "two", "Two")}},
             expect=(200, 201))
        t.ok("POST", "/v1/skills", {"files": {"SKILL.md": SKILL % ("gone", "x", "X")}},
             expect=201)
        t.ok("POST", "/v1/agents/%s/skills" % aid, {"name": "kept"})
        t.ok("POST", "/v1/agents/%s/skills" % aid, {"name": "gone"})
        t.ok("DELETE", "/v1/skills/gone")

        nightly = t.ok("POST", "/v1/agents/%s/schedules" % aid,
                       {"cron": "0 3 * * *", "prompt": "nightly"}, expect=201)
        t.ok("POST", "/v1/schedules/%s/pause" % nightly["id"], {})
        t.ok("POST", "/v1/schedules/%s/resume" % nightly["id"], {})
        for name in ("once", "gone"):
            once = t.ok("POST", "/v1/agents/%s/schedules" % aid,
                        {"name": name, "at": "2026-01-01T00:00:00Z", "prompt": "once"},
                        expect=201)
            wait_for(lambda: t.ok("GET", "/v1/schedules/%s" % once["id"]).get("last_fired_at"))
        t.ok("DELETE", "/v1/schedules/%s" % once["id"])

        self.channels(t, aid)
        self.users(t, aid)

        t.ok("PUT", "/v1/budgets", {"scope": "tenant", "period": "day", "limit_usd": 100})
        t.ok("PUT", "/v1/budgets", {"scope": "tenant", "period": "day", "limit_usd": 200})
        t.ok("PUT", "/v1/budgets", {"scope": aid, "period": "month", "limit_usd": 5})
        t.ok("DELETE", "/v1/budgets?scope=%s&period=month" % aid)

        small = s.create_agent(config={"context_tokens": 256}, token=t.token)
        sess = s.create_session(small["id"], token=t.token)
        for i in range(8):
            t.post(sess["id"], ("turn %d: " % i) + "words " * 60)
        # Every run ended (schedules' runs too) before the store is read.
        for run in s.list_all("/v1/runs", token=t.token):
            s.wait_run(run["id"], token=t.token)

    def users(self, t, aid):
        """Users: made with identities, renamed, linked and unlinked, given roles, merged (roles
        and identities move, one role removed); an agent's access level and code changed."""
        ann = t.ok("POST", "/v1/users", {"name": "Ann", "identities": [
            {"platform": "telegram", "platform_user_id": "11"}]}, expect=201)
        bob = t.ok("POST", "/v1/users", {"name": "Bob"}, expect=201)
        t.ok("PATCH", "/v1/users/%s" % bob["id"], {"name": "Robert"})
        t.ok("POST", "/v1/users/%s/identities" % bob["id"],
             {"platform": "slack", "platform_user_id": "U22"}, expect=201)
        t.ok("POST", "/v1/users/%s/identities" % bob["id"],
             {"platform": "discord", "platform_user_id": "33"}, expect=201)
        t.ok("DELETE", "/v1/users/%s/identities/discord/33" % bob["id"])
        t.ok("PUT", "/v1/agents/%s/members/%s" % (aid, ann["id"]), {"role": "guest"})
        t.ok("PUT", "/v1/agents/%s/members/%s" % (aid, bob["id"]), {"role": "owner"})
        t.ok("PUT", "/v1/agents/%s/members/%s" % (aid, ann["id"]), {"role": "user"})
        t.ok("POST", "/v1/users/%s/merge" % ann["id"], {"from": bob["id"]})
        cy = t.ok("POST", "/v1/users", {"name": "Cy"}, expect=201)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (aid, cy["id"]), {"role": "guest"})
        t.ok("DELETE", "/v1/agents/%s/members/%s" % (aid, cy["id"]))
        t.ok("PUT", "/v1/agents/%s/access" % aid, {"level": "protected", "new_code": True})
        t.ok("PUT", "/v1/agents/%s/access" % aid, {"level": "public"})

    def channels(self, t, aid):
        """Webhook channels: created, changed, delivered to (once again as a retry), deleted."""
        key = os.urandom(32)
        for name in ("kept", "gone"):  # a secret signs one channel
            t.ok("PUT", "/v1/secrets/hook-" + name,
                 {"value": "whsec_" + base64.b64encode(key).decode()})

        def deliver(channel, delivery_id, body):
            raw = json.dumps(body).encode()
            ts = str(int(time.time()))
            mac = hmac.new(key, ("%s.%s." % (delivery_id, ts)).encode() + raw, hashlib.sha256)
            headers = {"webhook-id": delivery_id, "webhook-timestamp": ts,
                       "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode()}
            st, out, _ = self.server.request("POST", channel["url"], token=None,
                                             headers=headers, raw_body=raw)
            self.assertIn(st, (200, 202), out)
            self.server.wait_run(out["run_id"], token=t.token)

        for name in ("kept", "gone"):
            settings = {"signing_secret": "hook-" + name, "template": "hook: {{/text}}",
                        "conversation": "/thread"}
            channel = t.ok("POST", "/v1/agents/%s/channels" % aid,
                           {"kind": "webhook", "name": name, "settings": settings}, expect=201)
            deliver(channel, name + "-1", {"text": "one", "thread": "a"})
            deliver(channel, name + "-1", {"text": "one", "thread": "a"})
            deliver(channel, name + "-2", {"text": "two", "thread": "b"})
        t.ok("PATCH", "/v1/channels/%s" % channel["id"], {"name": "renamed", "enabled": False})
        t.ok("DELETE", "/v1/channels/%s" % channel["id"])

    def test_a_mixed_workload_rebuilds_every_table_it_wrote(self):
        t, sess = self.workload()
        history = [m["content"] for m in
                   self.server.list_all("/v1/sessions/%s/messages" % sess["id"], token=t.token)]
        self.server.terminate()
        target = self.target()
        out = keel(["store", "rebuild", "--from-events", "--store", source_url(self.server),
                    "--into", target.url]).stdout
        self.assertIn("rebuilt from", out)
        self.assertNotIn("left empty", out)

        before = export_tables(source_url(self.server), os.path.join(self.dir, "a"))
        after = export_tables(target.url, os.path.join(self.dir, "b"))
        for table in REBUILT + ["events", "audit_heads"]:
            self.assertTrue(before[table], "the workload wrote no %s row" % table)
            self.assertEqual(before[table], after[table], "table %s differs" % table)

        # A server on the rebuilt store: the same token, the conversation where it stopped.
        home = os.path.join(self.dir, "home")
        rebuilt = KeelServer(home=home, store_url=target.url, token=self.server.token)
        self.others = [rebuilt]
        messages = rebuilt.list_all("/v1/sessions/%s/messages" % sess["id"], token=t.token)
        self.assertEqual([m["content"] for m in messages], history)
        status, body, _ = rebuilt.post_message(sess["id"], "after the rebuild", wait=WAIT,
                                               token=t.token)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["run"]["status"], "done", body)
        messages = rebuilt.list_all("/v1/sessions/%s/messages" % sess["id"], token=t.token)
        self.assertEqual([m["content"] for m in messages][:len(history) + 1],
                         history + ["after the rebuild"])

    def test_no_client_sees_the_row_images(self):
        s = self.server
        t = Tenant(s)
        guest, _ = t.new_token("guest")
        agent = s.create_agent(tools=["time.now"], token=t.token)
        sess = s.create_session(agent["id"], token=guest)
        t.post(sess["id"], "secret words", token=guest)
        for token in (t.token, guest):
            events = s.ok("GET", "/v1/events?limit=500", token=token)["items"]
            self.assertTrue(events)
            for e in events:
                self.assertNotIn("rows", e["payload"], e)
        if not s.pg_database:  # the stored payloads do carry them
            db = sqlite3.connect(os.path.join(s.home, "keel.db"))
            try:
                payloads = [json.loads(p) for (p,) in db.execute(
                    "SELECT payload FROM events WHERE type='message.created@v1'")]
            finally:
                db.close()
            self.assertTrue(any(p.get("rows", {}).get("messages", [{}])[0].get("content") ==
                                "secret words" for p in payloads), payloads)

    def test_a_store_with_data_is_not_a_target(self):
        Tenant(self.server)
        self.server.terminate()
        target = self.target()
        keel(["store", "rebuild", "--from-events", "--store", source_url(self.server),
              "--into", target.url])
        again = keel(["store", "rebuild", "--from-events", "--store", source_url(self.server),
                      "--into", target.url], check=False)
        self.assertNotEqual(again.returncode, 0)
        self.assertIn("not empty", again.stderr)

    def test_a_store_with_only_runtime_rows_is_not_a_target(self):
        # The response cache and the webhook deliveries are not exported, so a rebuild does not
        # write them; a target holding some (a store made by hand, without its foreign keys)
        # would hand a rebuilt tenant another store's cached answers.
        if self.server.pg_database:
            self.skipTest("the rows are written through the SQLite file")
        Tenant(self.server)
        self.server.terminate()
        target = self.target()
        keel(["store", "rebuild", "--from-events", "--store", source_url(self.server),
              "--into", target.url])
        # Foreign keys off, as Python's sqlite3 has them. The workload wrote no memories (whose
        # text index needs keel's tokenizer).
        db = sqlite3.connect(target.url[len("sqlite://"):])
        try:
            tables = [n for (n,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite%' "
                "AND name NOT LIKE 'memories%' AND name != 'schema_migrations'")]
            for name in tables:
                db.execute("DELETE FROM " + name)
            db.execute("INSERT INTO model_cache VALUES('t-other', 'g', 'k', 'm', '{}', 1, 1, 1)")
            db.commit()
        finally:
            db.close()
        again = keel(["store", "rebuild", "--from-events", "--store", source_url(self.server),
                      "--into", target.url], check=False)
        self.assertEqual(again.returncode, 1, again.stderr)
        self.assertIn("not empty", again.stderr)

    def test_a_changed_log_is_refused(self):
        if self.server.pg_database:
            self.skipTest("the event is changed through the SQLite file")
        t = Tenant(self.server)
        agent = self.server.create_agent(token=t.token)
        self.server.terminate()
        db = sqlite3.connect(os.path.join(self.server.home, "keel.db"))
        try:
            (position, payload), = db.execute(
                "SELECT position, payload FROM events WHERE type='agent.created@v1' AND "
                "agent_id=?", (agent["id"],)).fetchall()
            forged = json.loads(payload)
            forged["rows"]["agents"][0]["instructions"] = "forged"
            db.execute("UPDATE events SET payload=? WHERE position=?",
                       (json.dumps(forged), position))
            db.commit()
        finally:
            db.close()
        target = self.target()
        out = keel(["store", "rebuild", "--from-events", "--store", source_url(self.server),
                    "--into", target.url], check=False)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("audit chain", out.stderr)
        # Nothing was written: the target it created is gone again.
        self.assertFalse(os.path.exists(target.url[len("sqlite://"):]))

    def changed_log(self, *sql):
        """The stopped server's SQLite store, changed by `sql` and hashed again without the
        key; the target to rebuild it into."""
        self.server.terminate()
        path = os.path.join(self.server.home, "keel.db")
        rehash(path, *sql)
        return path, self.target()

    def test_an_unsigned_log_is_refused_under_the_key(self):
        if self.server.pg_database:
            self.skipTest("the log is changed through the SQLite file")
        t = Tenant(self.server)
        agent = self.server.create_agent(token=t.token)
        path, target = self.changed_log(
            "UPDATE events SET payload=json_set(payload, '$.rows.agents[0].instructions', "
            "'forged') WHERE type='agent.created@v1' AND agent_id='%s'" % agent["id"])
        out = keel(["store", "rebuild", "--from-events", "--store", "sqlite://" + path,
                    "--into", target.url], check=False)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("unsigned head", out.stderr)
        # The target it created is gone again.
        self.assertEqual([f for f in os.listdir(self.dir) if f.startswith("rebuilt.db")], [])
        # Without the key, the operator asked for the hashes alone, and is told so.
        out = keel(["store", "rebuild", "--from-events", "--store", "sqlite://" + path,
                    "--into", target.url], kek=None)
        self.assertIn("hashes only", out.stderr)

    def test_one_tenants_log_does_not_write_anothers_rows(self):
        if self.server.pg_database:
            self.skipTest("the log is changed through the SQLite file")
        victim, attacker = Tenant(self.server), Tenant(self.server)
        agent = self.server.create_agent(token=victim.token)
        sess = self.server.create_session(agent["id"], token=victim.token)
        victim.post(sess["id"], "the victim's words")
        mine = self.server.create_agent(token=attacker.token)
        db = sqlite3.connect(os.path.join(self.server.home, "keel.db"))
        try:
            (message_id,), = db.execute(
                "SELECT id FROM messages WHERE content='the victim''s words'").fetchall()
        finally:
            db.close()
        for image in ({"id": message_id, "content": "forged"},
                      {"id": message_id, "tenant_id": victim.id, "content": "forged"}):
            with self.subTest(image=image):
                path, target = self.changed_log(
                    "UPDATE events SET payload=json_set(payload, '$.rows.messages', "
                    "json('[%s]')) WHERE type='agent.created@v1' AND agent_id='%s'"
                    % (json.dumps(image), mine["id"]))
                out = keel(["store", "rebuild", "--from-events", "--store", "sqlite://" + path,
                            "--into", target.url], check=False, kek=None)
                self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
                self.assertIn("is not of the event's tenant", out.stderr)

    def test_usage_that_does_not_add_up_is_refused(self):
        if self.server.pg_database:
            self.skipTest("the log is changed through the SQLite file")
        t = Tenant(self.server)
        agent = self.server.create_agent(token=t.token)
        sess = self.server.create_session(agent["id"], token=t.token)
        for i in range(2):
            t.post(sess["id"], "turn %d" % i)
        path, target = self.changed_log(
            "UPDATE events SET payload=json_set(payload, '$.rows.model_usage[0].input_tokens', "
            "9223372036854775807) WHERE json_type(payload, '$.rows.model_usage[0]') IS NOT NULL")
        out = keel(["store", "rebuild", "--from-events", "--store", "sqlite://" + path,
                    "--into", target.url], check=False, kek=None)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("does not add up", out.stderr)

    def test_the_source_is_an_existing_store_it_only_reads(self):
        if self.server.pg_database:
            self.skipTest("SQLite paths")
        self.server.terminate()
        target = self.target()
        missing = os.path.join(self.dir, "typo.db")
        out = keel(["store", "rebuild", "--from-events", "--store", missing, "--into",
                    target.url], check=False)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("no keel store", out.stderr)
        self.assertFalse(os.path.exists(missing))
        # Another program's database, and a store of an older schema: refused as they are.
        foreign = os.path.join(self.dir, "foreign.db")
        db = sqlite3.connect(foreign)
        db.execute("CREATE TABLE customers(name TEXT)")
        db.execute("INSERT INTO customers VALUES('ada')")
        db.commit()
        db.close()
        older = os.path.join(self.dir, "older.db")
        src, db = sqlite3.connect(os.path.join(self.server.home, "keel.db")), sqlite3.connect(older)
        src.backup(db)
        src.close()
        db.execute("DELETE FROM schema_migrations WHERE version=(SELECT max(version) FROM "
                   "schema_migrations)")
        db.commit()
        db.close()
        for path, said in ((foreign, "not a keel store"), (older, "keel store migrate")):
            before = dump(path)
            out = keel(["store", "rebuild", "--from-events", "--store", path, "--into",
                        target.url], check=False)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn(said, out.stderr)
            self.assertEqual(dump(path), before)
        # Nor does migrate or serve take another program's database or a FIFO for a store.
        before = dump(foreign)
        out = keel(["store", "migrate", "--store", foreign], check=False)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("not a keel store", out.stderr)
        self.assertEqual(dump(foreign), before)
        fifo = os.path.join(self.dir, "fifo")
        os.mkfifo(fifo)
        out = keel(["store", "migrate", "--store", fifo], check=False)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("not a regular file", out.stderr)


if __name__ == "__main__":
    unittest.main()

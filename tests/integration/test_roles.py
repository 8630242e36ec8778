"""The role table of docs/API.md ("Roles"), attacked with real tokens of every role: an owner,
a user, a guest, a revoked token and another tenant's owner against the routes that reach
sessions, runs and events, both stream transports (SSE and WebSocket) and Keel's MCP server;
and the authority a token lends to work that acts later (a schedule, a queued run) ending when
the token is revoked, and introspection never writing what a guest wrote into the agent's
memory.

Every test works in tenants of its own (POST /v1/tenants as the platform admin). The local
model: `/call TOOL {json}` makes that call; notes.append appends to
$KEEL_HOME/workspaces/<agent_id>/notes.txt. Runs on SQLite and, with KEEL_TEST_STORE=postgres,
on PostgreSQL."""

import base64
import json
import os
import subprocess
import time
import unittest
from datetime import datetime, timedelta, timezone

import keel_harness
from keel_harness import (KeelServer, KeelTestCase, SseClient, WebSocketClient, http_request,
                          keel_bin, sse_url, wait_for)

WAIT = 15

# The tools the tests' agents call (an agent has only the tools it is given).
TOOLS = ["time.now", "notes.append", "files.read", "memory.*", "introspection.*"]

# notes.append always waits for a human; files.read too, so a guest's own run parks as well.
APPROVAL_FRAME = {"rules": [
    {"tool": "*", "rights": ["read", "write"], "approval": "never"},
    {"tool": "notes.append", "rights": ["write"], "approval": "always"},
    {"tool": "files.read", "rights": ["read"], "approval": "always"},
]}
OPEN_FRAME = {"rules": [{"tool": "*", "rights": ["read", "write"], "approval": "never"}]}

OWNER_SECRET = "owner-secret-line-4711"
GUEST_SECRET = "guest-secret-path-0815.txt"


def call(tool, args):
    return "/call %s %s" % (tool, json.dumps(args))


def in_seconds(s):
    dt = datetime.now(timezone.utc) + timedelta(seconds=s)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (dt.microsecond // 1000)


class Tenant(keel_harness.Tenant):
    """A tenant with a token of each role."""

    def __init__(self, server, frame=None):
        super().__init__(server)
        if frame is not None:
            self.ok("PUT", "/v1/policy", frame)
        self.user, self.user_id = self.new_token("user")
        self.guest, self.guest_id = self.new_token("guest")

    def post(self, session_id, content, token=None, wait=WAIT):
        status, body, _ = self.server.post_message(session_id, content, wait=wait,
                                                   token=token or self.token, timeout=wait + 30)
        assert status in (200, 202), (status, body)
        return body["run"]

    def notes(self, agent_id):
        path = os.path.join(self.server.home, "workspaces", agent_id, "notes.txt")
        try:
            with open(path) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return None

    def pending(self, run_id):
        items = self.ok("GET", "/v1/approvals?status=pending", expect=200)["items"]
        return [a for a in items if a["run_id"] == run_id]


def mcp(server, token, message, session_id=None, query=""):
    """One POST /v1/mcp; returns (status, body, headers)."""
    headers = {"Accept": "application/json", "MCP-Protocol-Version": "2025-06-18"}
    if session_id:
        headers["Mcp-Session-Id"] = session_id
    return http_request(server.addr, "POST", "/v1/mcp" + query, body=message, token=token,
                        headers=headers)


def mcp_initialize(server, token, agent_id):
    status, body, headers = mcp(server, token, {
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "roles-test", "version": "1"}}}, query="?agent=" + agent_id)
    assert status == 200 and "result" in body, (status, body)
    return headers["mcp-session-id"]


class SessionAccessTest(KeelTestCase):
    """What each role reaches of an owner's session, and what it sees of the event log."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        s = self.server
        self.t = Tenant(s, APPROVAL_FRAME)
        self.other = Tenant(s)
        self.revoked, revoked_id = self.t.new_token("user")
        self.t.ok("DELETE", "/v1/tokens/" + revoked_id, expect=204)
        self.agent = s.create_agent(tools=TOOLS, token=self.t.token)
        # The owner's session: one run parked on an approval whose arguments hold a secret,
        # and an idle session.
        self.owner_session = s.create_session(self.agent["id"], token=self.t.token)["id"]
        self.parked = self.t.post(self.owner_session, call("notes.append", {"line": OWNER_SECRET}))
        self.assertEqual(self.parked["status"], "waiting_for_approval")
        self.idle_session = s.create_session(self.agent["id"], token=self.t.token)["id"]

    def test_a_guest_reaches_none_of_an_owners_sessions(self):
        t, g = self.t, self.t.guest
        sid, run = self.owner_session, self.parked["id"]
        for method, path, body in [
                ("GET", "/v1/sessions/" + sid, None),
                ("GET", "/v1/sessions/%s/messages" % sid, None),
                ("GET", "/v1/sessions/%s/runs" % sid, None),
                ("GET", "/v1/runs?session_id=" + sid, None),
                ("GET", "/v1/sessions/%s/compactions" % sid, None),
                ("GET", "/v1/runs/" + run, None),
                ("GET", "/v1/runs/%s/steps" % run, None),
                ("POST", "/v1/sessions/%s/messages" % sid, {"content": "hi from a guest"}),
                ("POST", "/v1/runs/%s/cancel" % run, {}),
                ("PATCH", "/v1/sessions/" + self.idle_session, {"status": "inactive"})]:
            self.assertError(t.request(method, path, body, token=g), 404, "not_found",
                             "guest %s %s" % (method, path))
        # Nothing changed: the run still waits, the idle session is open, no message was added.
        self.assertEqual(self.server.get_run(run, token=t.token)["status"], "waiting_for_approval")
        self.assertEqual(t.ok("GET", "/v1/sessions/" + self.idle_session)["status"], "idle")
        messages = self.server.list_all("/v1/sessions/%s/messages" % sid, token=t.token)
        self.assertEqual([m["role"] for m in messages], ["user"])
        # Lists hold only the guest's own sessions and runs.
        mine = self.server.create_session(self.agent["id"], token=g)["id"]
        own_run = t.post(mine, "hello", token=g)
        listed = self.server.list_all("/v1/agents/%s/sessions" % self.agent["id"], token=g)
        self.assertEqual([x["id"] for x in listed], [mine])
        runs = self.server.list_all("/v1/runs", token=g)
        self.assertEqual([r["id"] for r in runs], [own_run["id"]])
        # Its own session it may use whole: read, post, close.
        self.assertEqual(t.ok("GET", "/v1/runs/" + own_run["id"], token=g)["status"], "done")
        t.ok("PATCH", "/v1/sessions/" + mine, {"status": "inactive"}, token=g)

    def test_a_guests_run_pages_and_cursors_hold_only_its_own_runs(self):
        """A page of runs is cut after the guest's filter, not before: its cursors are ids of
        its own runs, never of a run it may not see, and every page is full until the last."""
        t, g = self.t, self.t.guest
        mine = self.server.create_session(self.agent["id"], token=g)["id"]
        own = []
        for i in range(3):  # the owner's runs between the guest's, so a cut page would show
            own.append(t.post(mine, "guest %d" % i, token=g)["id"])
            t.post(self.idle_session, "owner %d" % i)
            t.post(self.idle_session, "owner %d again" % i)
        everyone = {r["id"] for r in self.server.list_all("/v1/runs", token=t.token)}
        self.assertTrue(set(own) < everyone)
        for query in ("", "&status=done", "&order=desc", "&agent_id=" + self.agent["id"]):
            seen, cursor = [], ""
            for _ in range(10):
                page = t.ok("GET", "/v1/runs?limit=1%s%s" % (
                    query, "&cursor=" + cursor if cursor else ""), token=g, expect=200)
                seen += [r["id"] for r in page["items"]]
                cursor = page["next_cursor"]
                if not cursor:
                    break
                self.assertEqual(len(page["items"]), 1, query)
                named = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
                self.assertIn(named, own, "%s: a cursor names a run the guest cannot see" % query)
            expected = own[::-1] if "desc" in query else own
            self.assertEqual(seen, expected, query)

    def test_a_guests_session_pages_and_cursors_hold_only_its_own_sessions(self):
        """The sessions' list is filtered in the store's statement as the runs' is: full pages
        of the guest's own sessions, cursors naming only them, in both orders."""
        t, g, agent = self.t, self.t.guest, self.agent["id"]
        own, owners = [], []
        for _ in range(3):  # the owner's sessions between the guest's
            own.append(self.server.create_session(agent, token=g)["id"])
            owners.append(self.server.create_session(agent, token=t.token)["id"])
            owners.append(self.server.create_session(agent, token=t.token)["id"])
        every = [x["id"] for x in self.server.list_all("/v1/agents/%s/sessions" % agent,
                                                         token=g)]
        self.assertTrue(set(own) <= set(every))
        self.assertFalse(set(owners) & set(every))
        for query in ("", "&order=desc"):
            seen, cursor = [], ""
            for _ in range(len(every) + 2):
                page = t.ok("GET", "/v1/agents/%s/sessions?limit=1%s%s" % (
                    agent, query, "&cursor=" + cursor if cursor else ""), token=g, expect=200)
                seen += [x["id"] for x in page["items"]]
                cursor = page["next_cursor"]
                if not cursor:
                    break
                self.assertEqual(len(page["items"]), 1, query)
                named = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
                self.assertIn(named, every, "%s: a cursor names another's session" % query)
            self.assertEqual(seen, every[::-1] if query else every, query)
            self.assertTrue(all(self.t.ok("GET", "/v1/sessions/" + x, token=g)["id"] == x
                                for x in seen))

    def test_a_user_reaches_every_session_but_decides_no_approval(self):
        t, u = self.t, self.t.user
        self.assertEqual(t.ok("GET", "/v1/sessions/" + self.owner_session, token=u)["id"],
                         self.owner_session)
        approval = t.pending(self.parked["id"])[0]
        self.assertEqual(approval["arguments"], {"line": OWNER_SECRET})  # users read approvals
        self.assertError(t.request("POST", "/v1/approvals/%s/approve" % approval["id"], {},
                                   token=u), 403, "permission_denied")
        t.ok("PATCH", "/v1/sessions/" + self.idle_session, {"status": "inactive"}, token=u)
        t.ok("POST", "/v1/runs/%s/cancel" % self.parked["id"], {}, token=u)
        self.assertEqual(self.server.wait_run(self.parked["id"], token=u)["status"], "cancelled")

    def test_other_tenants_and_revoked_tokens_reach_nothing(self):
        o = self.other
        for method, path, body in [
                ("GET", "/v1/sessions/" + self.owner_session, None),
                ("POST", "/v1/runs/%s/cancel" % self.parked["id"], {}),
                ("PATCH", "/v1/sessions/" + self.idle_session, {"status": "inactive"})]:
            self.assertError(o.request(method, path, body), 404, "not_found",
                             "another tenant's owner: %s %s" % (method, path))
            self.assertError(self.t.request(method, path, body, token=self.revoked), 401,
                             "unauthenticated", "a revoked token: %s %s" % (method, path))
        seen = self.server.all_events(token=o.token)
        self.assertFalse([e for e in seen if e.get("session_id") == self.owner_session])

    def guest_turn(self):
        """The guest's own session and a run in it that parks on files.read (its approval's
        arguments hold GUEST_SECRET); then the guest's session is closed after a reject."""
        g = self.t.guest
        mine = self.server.create_session(self.agent["id"], token=g)["id"]
        run = self.t.post(mine, call("files.read", {"path": GUEST_SECRET}), token=g)
        self.assertEqual(run["status"], "waiting_for_approval", run)
        approval = self.t.pending(run["id"])[0]
        self.t.ok("POST", "/v1/approvals/%s/reject" % approval["id"], {"reason": "no"})
        self.server.wait_run(run["id"], token=self.t.token)
        return mine, run["id"]

    def assertGuestView(self, events, mine, what):
        """Only the guest's own session's events, with no tool-call arguments anywhere."""
        self.assertTrue(events, what)
        for e in events:
            data = e.get("data", e)
            self.assertEqual(data.get("session_id"), mine, "%s: %r" % (what, data))
            text = json.dumps(data)
            self.assertNotIn(OWNER_SECRET, text, what)
            self.assertNotIn(GUEST_SECRET, text, what)
            if isinstance(data.get("payload"), dict):
                self.assertNotIn("arguments", data["payload"], "%s: %r" % (what, data))
        types = [e.get("data", e).get("type") for e in events]
        self.assertIn("approval.requested@v1", types, what)
        self.assertIn("approval.decided@v1", types, what)

    def test_a_guest_sees_only_its_own_sessions_events_without_arguments(self):
        g = self.t.guest
        # Streams opened before anything of the guest's happens, replaying from position 0.
        sse = SseClient(sse_url(self.server), g, last_event_id="0")
        ws = WebSocketClient(sse_url(self.server, after="0"), g)
        try:
            # While they are open the owner has a turn of its own (its token deltas too).
            self.t.post(self.idle_session, "an owner's turn while the guest listens")
            mine, run = self.guest_turn()
            last = lambda e: (e.get("event") == "run.completed@v1" or
                              e.get("event") == "run.failed@v1" or
                              e.get("event") == "run.cancelled@v1") and \
                e["data"].get("run_id") == run
            self.assertGuestView(sse.collect_until(last), mine, "SSE")
            self.assertGuestView(ws.collect_until(last), mine, "WebSocket")
        finally:
            sse.close()
            ws.close()
        paged = self.server.all_events(token=g)
        self.assertGuestView(paged, mine, "GET /v1/events")
        # Its run's steps show no tool-call arguments either; the owner's do.
        tool_steps = [x for x in self.server.steps(run, token=g) if x["kind"] == "tool"]
        self.assertTrue(tool_steps)
        self.assertNotIn(GUEST_SECRET, json.dumps(tool_steps))
        self.assertIn(GUEST_SECRET, json.dumps(self.server.steps(run, token=self.t.token)))
        # The owner (and a user) still see all of it, arguments included.
        owner_view = json.dumps(self.server.all_events(token=self.t.token))
        self.assertIn(OWNER_SECRET, owner_view)
        self.assertIn(GUEST_SECRET, owner_view)
        self.assertIn(OWNER_SECRET, json.dumps(self.server.all_events(token=self.t.user)))

    def test_mcp_sessions_serve_only_the_token_that_opened_them(self):
        s, t = self.server, self.t
        tools_call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "time.now", "arguments": {}}}
        before = s.list_all("/v1/sessions/%s/messages" % self.owner_session, token=t.token)
        # A guest naming an owner's plain session, or an owner's MCP session, as its MCP session.
        owners_mcp = mcp_initialize(s, t.token, self.agent["id"])
        for sid in (self.owner_session, owners_mcp):
            for token in (t.guest, t.user, self.other.token):
                status, body, _ = mcp(s, token, tools_call, session_id=sid)
                self.assertEqual(status, 404, (sid, body))
        after = s.list_all("/v1/sessions/%s/messages" % self.owner_session, token=t.token)
        self.assertEqual(len(before), len(after), "nothing was posted into the owner's session")
        self.assertEqual(s.list_all("/v1/sessions/%s/messages" % owners_mcp, token=t.token), [])
        # Its own MCP session serves the guest.
        mine = mcp_initialize(s, t.guest, self.agent["id"])
        status, body, _ = mcp(s, t.guest, tools_call, session_id=mine)
        self.assertEqual(status, 200, body)
        self.assertFalse(body["result"]["isError"], body)


class RevokedAuthorityTest(KeelTestCase):
    """A revoked token's schedules and queued runs stop acting on its authority."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_a_revoked_users_one_shot_is_suspended_and_fires_after_reassignment(self):
        s = self.server
        t = Tenant(s, OPEN_FRAME)
        agent = s.create_agent(tools=TOOLS, token=t.token)
        control = s.create_agent(tools=TOOLS, token=t.token)
        at = in_seconds(2)
        line = "from the user's schedule"
        sched = t.ok("POST", "/v1/schedules",
                     {"agent_id": agent["id"], "at": at, "missed": "catch_up_one",
                      "prompt": call("notes.append", {"line": line})}, expect=201, token=t.user)
        self.assertEqual(sched["created_by"], t.user_id)
        # The owner's own one-shot at the same slot: it fires, and shows the loop went past it.
        ctl = t.ok("POST", "/v1/schedules",
                   {"agent_id": control["id"], "at": at,
                    "prompt": call("notes.append", {"line": "control"})}, expect=201)
        t.ok("DELETE", "/v1/tokens/" + t.user_id, expect=204)

        got = t.ok("GET", "/v1/schedules/" + sched["id"], expect=200)
        self.assertEqual(got["status"], "suspended")
        self.assertIn(t.user_id, got["suspended_reason"])
        self.assertIn("revoked", got["suspended_reason"])
        listed = {x["id"]: x for x in s.list_all("/v1/schedules", token=t.token)}
        self.assertEqual(listed[sched["id"]]["status"], "suspended")
        self.assertEqual(listed[ctl["id"]]["status"], "active")
        # Neither resume nor pause lifts a suspension.
        self.assertError(t.request("POST", "/v1/schedules/%s/resume" % sched["id"]), 409,
                         "conflict")

        wait_for(lambda: t.ok("GET", "/v1/schedules/" + ctl["id"])["status"] == "done", 20,
                 "the control schedule fired")
        wait_for(lambda: t.notes(control["id"]) == ["control"], 20, "the control's note")
        self.assertIsNone(t.notes(agent["id"]), "a revoked token's schedule fired")
        self.assertEqual(t.ok("GET", "/v1/schedules/" + sched["id"])["status"], "suspended")
        self.assertEqual(t.ok("GET", "/v1/schedules/" + sched["id"])["recent_fires"], [])

        # Reassigning: owners only, to an active token of the tenant.
        other_user, other_user_id = t.new_token("user")
        self.assertError(t.request("PATCH", "/v1/schedules/" + sched["id"],
                                   {"token_id": other_user_id}, token=other_user), 403,
                         "permission_denied")
        self.assertError(t.request("PATCH", "/v1/schedules/" + sched["id"],
                                   {"token_id": t.user_id}), 400, "invalid_argument")
        self.assertError(t.request("PATCH", "/v1/schedules/" + sched["id"],
                                   {"token_id": t.guest_id}), 400, "invalid_argument")
        self.assertEqual(t.ok("GET", "/v1/schedules/" + sched["id"])["status"], "suspended")
        moved = t.ok("PATCH", "/v1/schedules/" + sched["id"], {"token_id": other_user_id},
                     expect=200)
        self.assertEqual(moved["created_by"], other_user_id)
        self.assertEqual(moved["status"], "active")
        self.assertIsNone(moved["suspended_reason"])
        wait_for(lambda: t.notes(agent["id"]) == [line], 20, "the reassigned schedule's note")
        done = t.ok("GET", "/v1/schedules/" + sched["id"])
        self.assertEqual(done["status"], "done")
        run = s.wait_run(done["recent_fires"][0]["run_id"], token=t.token)
        self.assertEqual(run["status"], "done")

    def test_the_cli_shows_a_suspended_schedule_and_reassigns_it(self):
        s = self.server
        t = Tenant(s, OPEN_FRAME)
        agent = s.create_agent(tools=TOOLS, token=t.token)
        sched = t.ok("POST", "/v1/schedules", {"agent_id": agent["id"], "cron": "0 9 * * *",
                                               "prompt": "good morning"}, expect=201, token=t.user)
        t.ok("DELETE", "/v1/tokens/" + t.user_id, expect=204)

        def keel(*args):
            env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
            env.update({"KEEL_URL": s.base_url, "KEEL_TOKEN": t.token})
            return subprocess.run([keel_bin(), *args], capture_output=True, text=True, env=env,
                                  timeout=60, stdin=subprocess.DEVNULL)

        listed = keel("schedule", "list")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertIn("suspended", listed.stdout)
        self.assertIn("%s is suspended: the token it acts for (%s) was revoked"
                      % (sched["id"], t.user_id), listed.stdout)
        moved = keel("schedule", "reassign", sched["id"], t.token_id)
        self.assertEqual(moved.returncode, 0, moved.stderr)
        self.assertIn("is active", moved.stdout)
        got = t.ok("GET", "/v1/schedules/" + sched["id"])
        self.assertEqual((got["status"], got["created_by"]), ("active", t.token_id))

    def test_a_revoked_owners_standing_approval_covers_no_more_calls(self):
        s = self.server
        t = Tenant(s, APPROVAL_FRAME)
        second, second_id = t.new_token("owner")
        agent = s.create_agent(tools=TOOLS, token=t.token)
        sid = s.create_session(agent["id"], token=t.token)["id"]
        run = t.post(sid, call("notes.append", {"line": "same"}))
        approval = t.pending(run["id"])[0]
        t.ok("POST", "/v1/approvals/%s/approve" % approval["id"],
             {"standing": {"expires_in": 600, "match": {"line": "same"}}}, token=second)
        self.assertEqual(s.wait_run(run["id"], token=t.token)["status"], "done")
        covered = t.post(sid, call("notes.append", {"line": "same"}))
        self.assertEqual(covered["status"], "done", "the standing approval covers the call")
        t.ok("DELETE", "/v1/tokens/" + second_id, expect=204)
        [standing] = t.ok("GET", "/v1/standing-approvals")["items"]
        self.assertIsNotNone(standing["revoked_at"])
        again = t.post(sid, call("notes.append", {"line": "same"}))
        self.assertEqual(again["status"], "waiting_for_approval",
                         "a revoked owner's standing approval still let a call through")

    def test_a_queued_run_of_a_revoked_token_fails_when_claimed(self):
        s = self.server
        t = Tenant(s, APPROVAL_FRAME)
        agent = s.create_agent(tools=TOOLS, token=t.token)
        sid = s.create_session(agent["id"], token=t.token)["id"]
        parked = t.post(sid, call("notes.append", {"line": "owner"}))
        self.assertEqual(parked["status"], "waiting_for_approval")
        # The user's message queues behind the parked run; then the user's token is revoked.
        queued = t.post(sid, "hello from the user", token=t.user, wait=0)
        self.assertEqual(queued["status"], "queued")
        t.ok("DELETE", "/v1/tokens/" + t.user_id, expect=204)
        approval = t.pending(parked["id"])[0]
        t.ok("POST", "/v1/approvals/%s/approve" % approval["id"], {})
        self.assertEqual(s.wait_run(parked["id"], token=t.token)["status"], "done")
        failed = s.wait_run(queued["id"], token=t.token)
        self.assertEqual(failed["status"], "failed", failed)
        self.assertEqual(failed["error"]["code"], "permission_denied")
        self.assertIn(t.user_id, failed["error"]["message"])


class IntrospectionRoleTest(KeelTestCase):
    """Introspection acts with the rights of the least privileged author of a session."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_a_guests_session_is_not_introspected_into_memory(self):
        s = self.server
        t = Tenant(s)
        agent = s.create_agent(config={"introspection": {"every_turns": 2}}, token=t.token)
        guest_session = s.create_session(agent["id"], token=t.guest)["id"]
        t.post(guest_session, "guest wrote: remember the launch codes", token=t.guest)
        t.post(guest_session, "guest wrote: and the vault combination", token=t.guest)
        # An owner's session of the same agent, after the guest's: it is introspected.
        owner_session = s.create_session(agent["id"], token=t.token)["id"]
        t.post(owner_session, "owner wrote: plan the offsite")
        t.post(owner_session, "owner wrote: book the venue")
        events = lambda sid: [e for e in s.all_events(token=t.token)
                              if e["type"] == "introspection.completed@v1"
                              and e["session_id"] == sid]
        wait_for(lambda: events(owner_session), 30, "the owner's session introspected")

        memories = t.ok("GET", "/v1/agents/%s/memories" % agent["id"], expect=200)["items"]
        texts = [m["text"] for m in memories]
        self.assertTrue(any("owner wrote" in x for x in texts), texts)
        self.assertFalse([x for x in texts if "guest wrote" in x], texts)
        wm = t.ok("GET", "/v1/agents/%s/working-memory" % agent["id"], expect=200)
        self.assertNotIn("guest wrote", wm["text"])
        messages = s.list_all("/v1/sessions/%s/messages" % guest_session, token=t.token)
        self.assertNotIn("introspection", [m["role"] for m in messages])
        self.assertEqual(events(guest_session), [])

    def test_a_users_session_is_still_introspected(self):
        s = self.server
        t = Tenant(s)
        agent = s.create_agent(config={"introspection": {"every_turns": 2}}, token=t.token)
        sid = s.create_session(agent["id"], token=t.user)["id"]
        t.post(sid, "user wrote: one", token=t.user)
        t.post(sid, "user wrote: two", token=t.user)
        wait_for(lambda: [m for m in s.list_all("/v1/sessions/%s/messages" % sid, token=t.token)
                          if m["role"] == "introspection"], 30, "the introspection run")
        runs = s.list_all("/v1/sessions/%s/runs" % sid, token=t.token)
        self.assertEqual(s.wait_run(runs[-1]["id"], token=t.token)["status"], "done")
        memories = t.ok("GET", "/v1/agents/%s/memories" % agent["id"], expect=200)["items"]
        self.assertTrue([m for m in memories if "user wrote" in m["text"]], memories)


if __name__ == "__main__":
    unittest.main()

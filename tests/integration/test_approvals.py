"""Policy, approvals and emergency stops end to end over HTTP: a tool call that needs a human
parks its run (`waiting_for_approval`); approving, rejecting, expiry and cancellation each end
the wait through the one decision function; amended arguments and standing approvals; the
separate-approver rule; restarts (SIGTERM and kill -9) while a run waits; the policy documents
(validation, canonical form, narrowings that may not widen the frame, roles); deny rules, guest
tokens; and emergency stops for one agent and for the whole tenant.

Every test works in a tenant of its own (POST /v1/tenants), so a tenant policy or a tenant-wide
stop set by one test never reaches another.

The local model: the user line `/call notes.append {"line": "x"}` makes that tool call, and after
the result it answers `The tool notes.append returned: <result>.` (a refusal shows as
`error: <reason>`). notes.append appends the line to $KEEL_HOME/workspaces/<agent_id>/notes.txt.
"""

import http.client
import json
import os
import time
import unittest

import keel_harness
from keel_harness import (TERMINAL_RUN_STATES, KeelServer, KeelTestCase, parse_time,
                          unique_name)

# The frame of most tests: every tool with read and write, no approval, except notes.append,
# which always needs a human.
APPROVAL_FRAME = {"rules": [
    {"tool": "*", "rights": ["read", "write"], "approval": "never"},
    {"tool": "notes.append", "rights": ["write"], "approval": "always"},
]}

WAIT = 15  # ?wait= seconds: long enough for any state these tests wait for


def note_call(line):
    return "/call notes.append " + json.dumps({"line": line})


def answer_for(line):
    """The local model's final answer after notes.append succeeded with `line`."""
    return "The tool notes.append returned: %s." % json.dumps({"appended": line},
                                                               separators=(",", ":"))


class Tenant(keel_harness.Tenant):
    """A tenant of its own, with the resources and decisions these tests use."""

    # ------------------------------------------------------------------ resources

    def agent(self, config=None):
        return self.server.create_agent(tools=["time.now", "notes.append"], config=config,
                                        token=self.token)

    def session(self, agent_id, token=None):
        return self.server.create_session(agent_id, token=token or self.token)

    def agent_session(self, config=None):
        agent = self.agent(config)
        return agent, self.session(agent["id"])

    def post(self, session_id, content, wait=WAIT, token=None):
        """Posts a message (with ?wait= unless wait is None) and returns the run."""
        status, body, _ = self.server.post_message(session_id, content, wait=wait,
                                                   token=token or self.token)
        if status not in (200, 202):
            raise AssertionError("POST message -> %s: %s\n%s"
                                 % (status, body, self.server.log_tail(30)))
        return body["run"]

    def run(self, run_id):
        return self.ok("GET", "/v1/runs/%s" % run_id)

    def wait_run(self, run_id, states=TERMINAL_RUN_STATES, timeout=20):
        return self.server.wait_run(run_id, states=states, timeout=timeout, token=self.token)

    def steps(self, run_id):
        return self.server.steps(run_id, token=self.token)

    def tool_steps(self, run_id):
        return [s for s in self.steps(run_id) if s["kind"] == "tool"]

    def session_status(self, session_id):
        return self.ok("GET", "/v1/sessions/%s" % session_id)["status"]

    def events(self, run_id=None, **filters):
        q = "&".join("%s=%s" % kv for kv in filters.items())
        path = "/v1/events?limit=500" + ("&run_id=%s" % run_id if run_id else "") + \
            ("&" + q if q else "")
        return self.ok("GET", path)["items"]

    def event_types(self, run_id):
        return [e["type"] for e in self.events(run_id)]

    # ------------------------------------------------------------------ approvals

    def approvals(self, status=None):
        path = "/v1/approvals" + ("?status=%s" % status if status else "")
        return self.server.list_all(path, token=self.token)

    def pending_for(self, run_id):
        return [a for a in self.approvals("pending") if a["run_id"] == run_id]

    def the_pending(self, run_id):
        found = self.pending_for(run_id)
        assert len(found) == 1, "run %s: pending approvals %r" % (run_id, found)
        return found[0]

    def approval(self, approval_id):
        return self.ok("GET", "/v1/approvals/%s" % approval_id)

    def decide(self, approval_id, verdict, body=None, token=None):
        """POST approve|reject; returns (status, body, headers)."""
        return self.request("POST", "/v1/approvals/%s/%s" % (approval_id, verdict),
                            body if body is not None else {}, token=token)

    def park(self, session_id, line):
        """Posts a notes.append call that needs approval; returns (run, pending approval)."""
        run = self.post(session_id, note_call(line))
        if run["status"] != "waiting_for_approval":
            raise AssertionError("the run did not park: %r\n%s" % (run, self.server.log_tail(30)))
        return run, self.the_pending(run["id"])

    # ------------------------------------------------------------------ workspace

    def notes(self, agent_id):
        """notes.txt of the agent's workspace as a list of lines, or None when never written."""
        path = os.path.join(self.server.home, "workspaces", agent_id, "notes.txt")
        try:
            with open(path) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return None


class ApprovalsTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def tenant(self, frame=None):
        t = Tenant(self.server)
        if frame is not None:
            t.ok("PUT", "/v1/policy", frame)
        return t

    def assertEventOrder(self, types, expected, what=""):
        """`expected` appear in `types` in this order (other types may come between)."""
        pos = -1
        for e in expected:
            try:
                pos = types.index(e, pos + 1)
            except ValueError:
                self.fail("%s: %s missing (in order %s) from %s" % (what, e, expected, types))

    # ------------------------------------------------------------------ 1. approve

    def test_approve(self):
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        line = unique_name("line")
        run = t.post(sess["id"], note_call(line))
        self.assertEqual(run["status"], "waiting_for_approval", run)
        self.assertIsNone(run["finished_at"])
        self.assertEqual(t.session_status(sess["id"]), "awaiting_approval")

        pending = t.approvals("pending")
        self.assertEqual(len(pending), 1, pending)
        a = pending[0]
        self.assertEqual(a["status"], "pending")
        self.assertEqual(a["tool"], "notes.append")
        self.assertEqual(a["arguments"], {"line": line})
        self.assertIsNone(a["amended_arguments"])
        self.assertEqual((a["run_id"], a["session_id"], a["agent_id"]),
                         (run["id"], sess["id"], agent["id"]))
        self.assertEqual(a["call_id"], "call_1")
        self.assertIn("always requires approval", a["reason"])
        self.assertIn("notes.append", a["reason"])
        self.assertEqual(a["requested_by"], t.token_id)
        self.assertIsNone(a["decided_by"])
        self.assertIsNone(a["decided_at"])
        self.assertTime(a["created_at"])
        self.assertTime(a["expires_at"])
        ttl = parse_time(a["expires_at"]) - parse_time(a["created_at"])
        self.assertAlmostEqual(ttl.total_seconds(), 24 * 3600, delta=1, msg="default TTL 24 h")
        self.assertEqual(t.approval(a["id"]), a)

        self.assertIsNone(t.notes(agent["id"]), "the tool ran before anyone approved it")
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "awaiting_approval")
        self.assertEqual(step["tool_call"]["status"], "awaiting_approval")
        self.assertEqual(step["input"]["decision"]["outcome"], "approval")
        self.assertEqual(step["input"]["decision"]["approval_id"], a["id"])
        evs = t.events(run["id"])
        types = [e["type"] for e in evs]
        self.assertEventOrder(types, ["run.step@v1", "approval.requested@v1",
                                      "run.waiting_for_approval@v1"], "parked")
        self.assertNotIn("tool.call.started@v1", types)
        req = [e for e in evs if e["type"] == "approval.requested@v1"][0]["payload"]
        self.assertEqual(req["approval_id"], a["id"])
        self.assertEqual(req["tool"], "notes.append")
        self.assertEqual(req["arguments"], {"line": line})
        # the wait lasts: nothing moves the run without a decision
        time.sleep(0.6)
        self.assertEqual(t.run(run["id"])["status"], "waiting_for_approval")

        st, decided, _ = t.decide(a["id"], "approve", {"reason": "looks fine"})
        self.assertEqual(st, 200, decided)
        self.assertEqual(decided["status"], "approved")
        self.assertEqual(decided["decided_by"], t.token_id)
        self.assertEqual(decided["decision_reason"], "looks fine")
        self.assertTime(decided["decided_at"])

        done = t.wait_run(run["id"])
        self.assertEqual(done["status"], "done", done)
        self.assertEqual(done["output"], answer_for(line))
        self.assertEqual(t.notes(agent["id"]), [line], "the approved line, exactly once")
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "succeeded")
        self.assertEqual(step["tool_call"]["status"], "succeeded")
        self.assertEqual(step["output"], {"appended": line})
        self.assertEqual(t.session_status(sess["id"]), "idle")

        evs = t.events(run["id"])
        types = [e["type"] for e in evs]
        self.assertEventOrder(types, ["approval.requested@v1", "run.waiting_for_approval@v1",
                                      "approval.decided@v1", "run.queued@v1", "run.started@v1",
                                      "tool.call.started@v1", "tool.call.completed@v1",
                                      "run.completed@v1"], "approved")
        self.assertEqual(types.count("tool.call.started@v1"), 1)
        dec = [e for e in evs if e["type"] == "approval.decided@v1"]
        self.assertEqual(len(dec), 1)
        self.assertEqual(dec[0]["payload"]["status"], "approved")
        self.assertEqual(dec[0]["payload"]["approval_id"], a["id"])
        self.assertEqual(dec[0]["payload"]["decided_by"], t.token_id)
        self.assertFalse(dec[0]["payload"]["amended"])

        got = t.approval(a["id"])
        self.assertEqual(got["status"], "approved")
        self.assertEqual(got["decided_by"], t.token_id)
        self.assertEqual(got["decided_at"], decided["decided_at"])
        self.assertEqual(t.approvals("pending"), [])
        self.assertEqual([x["id"] for x in t.approvals("approved")], [a["id"]])
        self.assertError(t.request("GET", "/v1/approvals?status=bogus"), 400, "invalid_argument")

    def test_approvals_newest_first(self):
        t = self.tenant(APPROVAL_FRAME)
        ids = []
        for i in range(3):
            _, sess = t.agent_session()
            ids.append(t.park(sess["id"], "line %d" % i)[1]["id"])
        t.decide(ids[0], "reject", {"reason": "no"})
        page = t.ok("GET", "/v1/approvals?order=desc&limit=2")
        self.assertEqual([a["id"] for a in page["items"]], ids[::-1][:2])
        rest = t.ok("GET", "/v1/approvals?order=desc&limit=2&cursor=" + page["next_cursor"])
        self.assertEqual([a["id"] for a in rest["items"]], [ids[0]])
        pending = t.ok("GET", "/v1/approvals?status=pending&order=desc")["items"]
        self.assertEqual([a["id"] for a in pending], ids[::-1][:2])
        self.assertError(t.request("GET", "/v1/approvals?order=newest"), 400, "invalid_argument")

    # ------------------------------------------------------------------ 2. reject

    def test_reject(self):
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "never written")
        st, decided, _ = t.decide(a["id"], "reject", {"reason": "not today"})
        self.assertEqual(st, 200, decided)
        self.assertEqual(decided["status"], "rejected")
        self.assertEqual(decided["decision_reason"], "not today")
        self.assertEqual(decided["decided_by"], t.token_id)

        done = t.wait_run(run["id"])
        self.assertEqual(done["status"], "done", done)
        self.assertEqual(done["output"], "The tool notes.append returned: error: a human "
                                         "rejected this call: not today.")
        self.assertIsNone(t.notes(agent["id"]))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "rejected")
        self.assertEqual(step["tool_call"]["status"], "rejected")
        self.assertEqual(step["output"], {"error": "a human rejected this call: not today"})
        self.assertIsNotNone(step["finished_at"])
        types = t.event_types(run["id"])
        self.assertNotIn("tool.call.started@v1", types)
        dec = [e for e in t.events(run["id"]) if e["type"] == "approval.decided@v1"]
        self.assertEqual([d["payload"]["status"] for d in dec], ["rejected"])
        self.assertEqual(t.session_status(sess["id"]), "idle")
        # a rejection without a reason says only that
        run2, a2 = t.park(sess["id"], "also never written")
        self.assertEqual(t.decide(a2["id"], "reject")[0], 200)
        self.assertEqual(t.wait_run(run2["id"])["output"],
                         "The tool notes.append returned: error: a human rejected this call.")
        self.assertIsNone(t.notes(agent["id"]))

    # ------------------------------------------------------------------ 3. decide twice

    def test_decide_twice_and_unknown(self):
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        user, _ = t.new_token("user")
        guest, _ = t.new_token("guest")
        run, a = t.park(sess["id"], "once")

        # who may decide and what a decision may carry, before any decision
        self.assertError(t.decide(a["id"], "approve", token=user), 403, "permission_denied",
                         "a user token approves")
        self.assertError(t.decide(a["id"], "reject", token=guest), 403, "permission_denied",
                         "a guest token rejects")
        self.assertEqual(t.ok("GET", "/v1/approvals/%s" % a["id"], token=user)["status"],
                         "pending", "users may look")
        self.assertError(t.request("GET", "/v1/approvals", token=guest), 403,
                         "permission_denied", "guests may not look")
        self.assertError(t.decide(a["id"], "approve", {"bogus": 1}), 400, "invalid_argument")
        self.assertError(t.decide(a["id"], "reject", {"arguments": {"line": "x"}}), 400,
                         "invalid_argument", "amended arguments on a rejection")
        self.assertError(t.decide(a["id"], "approve", {"arguments": "x"}), 400,
                         "invalid_argument", "arguments not an object")
        self.assertError(t.request("POST", "/v1/approvals/%s/approve" % a["id"],
                                   raw_body="{not json"), 400, "invalid_argument")
        self.assertEqual(t.approval(a["id"])["status"], "pending", "a refused decision decides")
        self.assertEqual(t.run(run["id"])["status"], "waiting_for_approval")

        self.assertEqual(t.decide(a["id"], "approve")[0], 200)
        err = self.assertError(t.decide(a["id"], "approve"), 409, "conflict", "approve twice")
        self.assertIn("already decided", err["message"])
        self.assertError(t.decide(a["id"], "reject", {"reason": "too late"}), 409, "conflict",
                         "reject after approve")
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        self.assertError(t.decide(a["id"], "approve"), 409, "conflict", "approve after the run")
        self.assertEqual(t.notes(agent["id"]), ["once"], "one approval, one effect")
        got = t.approval(a["id"])
        self.assertEqual(got["status"], "approved")
        self.assertIsNone(got["decision_reason"], "a refused second decision changed the first")

        run2, b = t.park(sess["id"], "twice")
        self.assertEqual(t.decide(b["id"], "reject")[0], 200)
        self.assertError(t.decide(b["id"], "approve"), 409, "conflict", "approve after reject")
        self.assertError(t.decide(b["id"], "reject"), 409, "conflict", "reject twice")
        self.assertEqual(t.wait_run(run2["id"])["status"], "done")
        self.assertEqual(t.notes(agent["id"]), ["once"])
        self.assertEqual(t.approval(b["id"])["status"], "rejected")

        for verdict in ("approve", "reject"):
            self.assertError(t.decide("01a00000-0000-7000-8000-000000000000", verdict), 404,
                             "not_found", "unknown approval")
        self.assertError(t.request("GET", "/v1/approvals/01a00000-0000-7000-8000-000000000000"),
                         404, "not_found")
        # another tenant's approval is unknown here
        other = Tenant(self.server)
        self.assertError(other.decide(b["id"], "approve"), 404, "not_found", "cross-tenant")
        self.assertError(other.request("GET", "/v1/approvals/%s" % a["id"]), 404, "not_found")
        self.assertEqual(other.approvals(), [])

    # ------------------------------------------------------------------ 5. cancel while waiting

    def test_cancel_while_waiting(self):
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "cancelled")
        start = time.monotonic()
        cancelled = t.ok("POST", "/v1/runs/%s/cancel" % run["id"], {}, expect=200)
        self.assertEqual(cancelled["status"], "cancelled", "a waiting run is cancelled at once")
        self.assertEqual(cancelled["error"]["code"], "cancelled")
        self.assertIsNotNone(cancelled["finished_at"])
        self.assertLess(time.monotonic() - start, 2)

        got = t.approval(a["id"])
        self.assertEqual(got["status"], "cancelled")
        self.assertEqual(got["decided_by"], "system")
        self.assertEqual(t.session_status(sess["id"]), "idle")
        self.assertError(t.decide(a["id"], "approve"), 409, "conflict", "approve a cancelled one")
        self.assertError(t.request("POST", "/v1/runs/%s/cancel" % run["id"], {}), 409,
                         "conflict", "cancel twice")
        # the decision does not bring the run back
        time.sleep(0.7)
        after = t.run(run["id"])
        self.assertEqual(after["status"], "cancelled")
        self.assertEqual(after["error"]["code"], "cancelled")
        self.assertIsNone(t.notes(agent["id"]))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["tool_call"]["status"], "rejected")
        self.assertEqual(step["output"]["error"],
                         "the run was cancelled while the call waited for approval")
        evs = t.events(run["id"])
        types = [e["type"] for e in evs]
        self.assertEventOrder(types, ["approval.requested@v1", "approval.decided@v1",
                                      "run.cancelled@v1"], "cancelled")
        self.assertEqual(types.count("run.cancelled@v1"), 1)
        self.assertNotIn("tool.call.started@v1", types)
        dec = [e for e in evs if e["type"] == "approval.decided@v1"][0]["payload"]
        self.assertEqual(dec["status"], "cancelled")

        # the session takes a new message and runs it
        nxt = t.post(sess["id"], "hello again")
        self.assertEqual(nxt["status"], "done", nxt)
        self.assertEqual(nxt["output"], 'You said: "hello again"')
        self.assertEqual(t.run(run["id"])["status"], "cancelled")
        self.assertEqual(t.approvals("pending"), [])

    def test_message_queued_behind_a_waiting_run(self):
        """A message posted while a run waits queues behind it and runs after the decision."""
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "first")
        behind = t.post(sess["id"], "second message", wait=0.5)
        self.assertEqual(behind["status"], "queued", "a later run overtook a waiting one")
        self.assertEqual(t.decide(a["id"], "approve")[0], 200)
        first = t.wait_run(run["id"])
        second = t.wait_run(behind["id"])
        self.assertEqual((first["status"], second["status"]), ("done", "done"))
        self.assertLessEqual(parse_time(first["finished_at"]), parse_time(second["started_at"]))
        self.assertEqual(t.notes(agent["id"]), ["first"])

    def test_two_calls_park_twice(self):
        """A model step with two calls that each need approval parks the run twice; the first
        call's effect is not repeated when the run resumes for the second."""
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run = t.post(sess["id"], note_call("one") + "\n" + note_call("two"))
        self.assertEqual(run["status"], "waiting_for_approval", run)
        first = t.the_pending(run["id"])
        self.assertEqual((first["call_id"], first["arguments"]), ("call_1", {"line": "one"}))
        self.assertEqual(t.decide(first["id"], "approve")[0], 200)
        run = t.wait_run(run["id"], states=TERMINAL_RUN_STATES + ("waiting_for_approval",))
        self.assertEqual(run["status"], "waiting_for_approval", run)
        second = t.the_pending(run["id"])
        self.assertEqual((second["call_id"], second["arguments"]), ("call_2", {"line": "two"}))
        self.assertEqual(t.notes(agent["id"]), ["one"])
        self.assertEqual(t.session_status(sess["id"]), "awaiting_approval")
        self.assertEqual(t.decide(second["id"], "reject", {"reason": "one is enough"})[0], 200)
        done = t.wait_run(run["id"])
        self.assertEqual(done["status"], "done", done)
        self.assertEqual(done["output"], answer_for("one") + " The tool notes.append returned: "
                         "error: a human rejected this call: one is enough.")
        self.assertEqual(t.notes(agent["id"]), ["one"], "the first call ran again on resume")
        self.assertEqual([(s["input"]["call_id"], s["status"]) for s in t.tool_steps(run["id"])],
                         [("call_1", "succeeded"), ("call_2", "rejected")])
        types = t.event_types(run["id"])
        self.assertEqual(types.count("approval.requested@v1"), 2)
        self.assertEqual(types.count("tool.call.started@v1"), 1)

    # ------------------------------------------------------------------ 7. amendments

    def test_amended_arguments(self):
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "original")
        st, decided, _ = t.decide(a["id"], "approve", {"arguments": {"line": "amended"},
                                                       "reason": "fixed the text"})
        self.assertEqual(st, 200, decided)
        self.assertEqual(decided["arguments"], {"line": "original"})
        self.assertEqual(decided["amended_arguments"], {"line": "amended"})
        got = t.approval(a["id"])
        self.assertEqual(got["arguments"], {"line": "original"})
        self.assertEqual(got["amended_arguments"], {"line": "amended"})
        dec = [e for e in t.events(run["id"]) if e["type"] == "approval.decided@v1"][0]["payload"]
        self.assertTrue(dec["amended"])
        self.assertEqual(dec["arguments"], {"line": "amended"})
        self.assertEqual(dec["original_arguments"], {"line": "original"})

        done = t.wait_run(run["id"])
        self.assertEqual(done["status"], "done", done)
        self.assertEqual(t.notes(agent["id"]), ["amended"],
                         "the tool ran with the proposed arguments, not the amended ones")
        self.assertEqual(done["output"], answer_for("amended"))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "succeeded")
        self.assertEqual(step["input"]["arguments"], {"line": "amended"})
        self.assertEqual(step["input"]["amended_from"], {"line": "original"})
        started = [e for e in t.events(run["id"]) if e["type"] == "tool.call.started@v1"]
        self.assertEqual([e["payload"]["arguments"] for e in started], [{"line": "amended"}])

    # ------------------------------------------------------------------ 8. standing approvals

    def test_standing_approval(self):
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "same")
        # bad grants are refused and decide nothing
        for bad in ({}, {"expires_in": 0},
                    {"expires_in": 600, "expires_at": "2030-01-01T00:00:00Z"},
                    {"expires_in": "600"}, {"expires_in": 600, "match": "same"},
                    {"expires_in": 600, "bogus": 1}, {"expires_at": "tomorrow"},
                    {"expires_at": "2001-01-01T00:00:00.000Z"}):
            self.assertError(t.decide(a["id"], "approve", {"standing": bad}), 400,
                             "invalid_argument", "standing %r" % bad)
        self.assertEqual(t.approval(a["id"])["status"], "pending")
        self.assertEqual(t.ok("GET", "/v1/standing-approvals")["items"], [])

        st, decided, _ = t.decide(a["id"], "approve", {"standing": {"expires_in": 600,
                                                                    "match": {"line": "same"}}})
        self.assertEqual(st, 200, decided)
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        [standing] = t.ok("GET", "/v1/standing-approvals")["items"]
        self.assertEqual(standing["agent_id"], agent["id"])
        self.assertEqual(standing["tool"], "notes.append")
        self.assertEqual(standing["match"], {"line": "same"})
        self.assertEqual(standing["created_by"], t.token_id)
        self.assertEqual(standing["approval_id"], a["id"])
        self.assertIsNone(standing["revoked_at"])
        life = parse_time(standing["expires_at"]) - parse_time(standing["created_at"])
        self.assertAlmostEqual(life.total_seconds(), 600, delta=1)
        dec = [e for e in t.events(run["id"]) if e["type"] == "approval.decided@v1"][0]["payload"]
        self.assertEqual(dec["standing_approval_id"], standing["id"])

        # the same arguments pass without a human
        again = t.post(sess["id"], note_call("same"))
        self.assertEqual(again["status"], "done", again)
        self.assertEqual(t.pending_for(again["id"]), [])
        [step] = t.tool_steps(again["id"])
        self.assertEqual(step["status"], "succeeded")
        self.assertIn("standing approval " + standing["id"], step["input"]["decision"]["reason"])
        self.assertEqual(t.notes(agent["id"]), ["same", "same"])
        # other arguments still wait
        other_run, other = t.park(sess["id"], "different")
        self.assertEqual(t.decide(other["id"], "reject")[0], 200)
        self.assertEqual(t.wait_run(other_run["id"])["status"], "done")
        # another agent of the tenant is not covered
        agent2, sess2 = t.agent_session()
        run2, a2 = t.park(sess2["id"], "same")
        self.assertEqual(t.decide(a2["id"], "reject")[0], 200)
        self.assertEqual(t.wait_run(run2["id"])["status"], "done")
        self.assertIsNone(t.notes(agent2["id"]))

        # users may list, not revoke; revoked, the same line waits again
        user, _ = t.new_token("user")
        guest, _ = t.new_token("guest")
        self.assertEqual(len(t.ok("GET", "/v1/standing-approvals", token=user)["items"]), 1)
        self.assertError(t.request("GET", "/v1/standing-approvals", token=guest), 403,
                         "permission_denied")
        self.assertError(t.request("DELETE", "/v1/standing-approvals/%s" % standing["id"],
                                   token=user), 403, "permission_denied")
        t.ok("DELETE", "/v1/standing-approvals/%s" % standing["id"], expect=204)
        [revoked] = t.ok("GET", "/v1/standing-approvals")["items"]
        self.assertTime(revoked["revoked_at"])
        self.assertError(t.request("DELETE", "/v1/standing-approvals/%s" % standing["id"]), 404,
                         "not_found", "revoke twice")
        run3, a3 = t.park(sess["id"], "same")
        self.assertEqual(t.decide(a3["id"], "reject")[0], 200)
        self.assertEqual(t.wait_run(run3["id"])["status"], "done")
        self.assertEqual(t.notes(agent["id"]), ["same", "same"])

    def test_standing_approval_without_match_and_expires_at(self):
        t = self.tenant(APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "one")
        at = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() + 3600))
        st, _, _ = t.decide(a["id"], "approve", {"standing": {"expires_at": at}})
        self.assertEqual(st, 200)
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        [standing] = t.ok("GET", "/v1/standing-approvals")["items"]
        self.assertIsNone(standing["match"])
        self.assertEqual(standing["expires_at"], at)
        for line in ("two", "three"):
            r = t.post(sess["id"], note_call(line))
            self.assertEqual(r["status"], "done", r)
        self.assertEqual(t.notes(agent["id"]), ["one", "two", "three"])
        # a standing approval never overrides a deny
        t.ok("PUT", "/v1/policy", dict(APPROVAL_FRAME, deny=["notes.append"]))
        r = t.post(sess["id"], note_call("four"))
        self.assertEqual(r["status"], "done", r)
        self.assertIn("error: notes.append is denied by the tenant policy", r["output"])
        self.assertEqual(t.notes(agent["id"]), ["one", "two", "three"])

    # ------------------------------------------------------------------ 9. separate approver

    def test_separate_approver(self):
        frame = dict(APPROVAL_FRAME, separate_approver=True)
        t = self.tenant(frame)
        token_b, id_b = t.new_token("owner", "second-owner")
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "four eyes")
        self.assertEqual(a["requested_by"], t.token_id)
        self.assertError(t.decide(a["id"], "approve"), 403, "permission_denied",
                         "the poster approves its own call")
        self.assertError(t.decide(a["id"], "reject"), 403, "permission_denied",
                         "the poster rejects its own call")
        self.assertEqual(t.approval(a["id"])["status"], "pending")
        self.assertIsNone(t.notes(agent["id"]))
        st, decided, _ = t.decide(a["id"], "approve", token=token_b)
        self.assertEqual(st, 200, decided)
        self.assertEqual(decided["decided_by"], id_b)
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        self.assertEqual(t.notes(agent["id"]), ["four eyes"])
        # a message posted by B may be decided by A, not by B
        run3 = t.post(sess["id"], note_call("by b"), token=token_b)
        self.assertEqual(run3["status"], "waiting_for_approval")
        a3 = t.the_pending(run3["id"])
        self.assertEqual(a3["requested_by"], id_b)
        self.assertError(t.decide(a3["id"], "approve", token=token_b), 403, "permission_denied")
        self.assertEqual(t.decide(a3["id"], "approve")[0], 200)
        self.assertEqual(t.wait_run(run3["id"])["status"], "done")
        self.assertEqual(t.notes(agent["id"]), ["four eyes", "by b"])

    def test_separate_approver_from_the_agent_policy(self):
        t = self.tenant(APPROVAL_FRAME)
        token_b, _ = t.new_token("owner")
        agent, sess = t.agent_session()
        t.ok("PUT", "/v1/agents/%s/policy" % agent["id"], {"separate_approver": True})
        run, a = t.park(sess["id"], "narrowed")
        self.assertError(t.decide(a["id"], "approve"), 403, "permission_denied")
        self.assertEqual(t.decide(a["id"], "approve", token=token_b)[0], 200)
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        # another agent of the tenant: the poster may decide
        _, sess2 = t.agent_session()
        run2, a2 = t.park(sess2["id"], "plain")
        self.assertEqual(t.decide(a2["id"], "approve")[0], 200)
        self.assertEqual(t.wait_run(run2["id"])["status"], "done")

    # ------------------------------------------------------------------ 10. policy API

    def test_policy_validation(self):
        t = self.tenant()
        self.assertError(t.request("GET", "/v1/policy"), 404, "not_found", "no frame yet")
        bad = [
            ({"rules": [], "bogus": 1}, "bogus: unknown field"),
            ({"rules": [{"tool": "notes.append", "rights": ["write"], "aproval": "always"}]},
             "rules[0].aproval: unknown field"),
            ({"rules": [{"tool": "*", "rights": []}, {"tool": "no*tes", "rights": []}]},
             "rules[1].tool"),
            ({"rules": [{"tool": "notes append", "rights": []}]}, "rules[0].tool"),
            ({"rules": [{"tool": "*", "rights": ["read", "execute"]}]}, "rules[0].rights[1]"),
            ({"rules": [{"tool": "*", "rights": ["read", "read"]}]}, "rules[0].rights[1]"),
            ({"rules": [{"tool": "*"}]}, "rules[0].rights: required"),
            ({"rules": [{"rights": ["read"]}]}, "rules[0].tool: required"),
            ({"rules": [{"tool": "*", "rights": []}, {"tool": "*", "rights": ["read"]}]},
             "rules[1].tool: duplicate"),
            ({"rules": [{"tool": "*", "rights": [], "approval": "sometimes"}]},
             "rules[0].approval"),
            ({"rules": [{"tool": "*", "rights": [], "approval": {"over": {"argument": "n"}}}]},
             "rules[0].approval.over.value: required"),
            ({"rules": [{"tool": "*", "rights": [],
                         "approval": {"over": {"argument": "n", "value": -1}}}]},
             "rules[0].approval.over.value"),
            ({"deny": ["ok", "a b"]}, "deny[1]"),
            ({"require_approval": "notes.*"}, "require_approval: must be a list"),
            ({"separate_approver": "yes"}, "separate_approver: must be a boolean"),
            ({"rules": {}}, "rules: must be a list"),
        ]
        for doc, path in bad:
            for route in ("/v1/policy", None):
                if route is None:
                    agent = t.agent()
                    route = "/v1/agents/%s/policy" % agent["id"]
                err = self.assertError(t.request("PUT", route, doc), 400, "invalid_argument",
                                       "PUT %s %r" % (route, doc))
                self.assertIn(path, err["message"], "PUT %r: the message names the field" % doc)
        self.assertError(t.request("PUT", "/v1/policy", [1, 2]), 400, "invalid_argument")
        self.assertError(t.request("PUT", "/v1/policy", raw_body="{"), 400, "invalid_argument")
        self.assertError(t.request("GET", "/v1/policy"), 404, "not_found",
                         "a refused PUT wrote nothing")

        # canonical form, a fixed point
        doc = {"rules": [{"tool": "notes.*", "rights": ["write", "read"],
                          "approval": {"over": {"argument": "n", "value": 10.0}}},
                         {"tool": "time.now", "rights": ["read"]}],
               "deny": ["shell.*"]}
        canonical = {"rules": [{"tool": "notes.*", "rights": ["read", "write"],
                                "approval": {"over": {"argument": "n", "value": 10}}},
                               {"tool": "time.now", "rights": ["read"], "approval": "never"}],
                     "deny": ["shell.*"], "require_approval": [], "separate_approver": False,
                     "approvers": [], "approval_in_conversation": False}
        self.assertEqual(t.ok("PUT", "/v1/policy", doc, expect=200), canonical)
        self.assertEqual(t.ok("GET", "/v1/policy", expect=200), canonical)
        self.assertEqual(t.ok("PUT", "/v1/policy", canonical, expect=200), canonical)
        self.assertEqual(t.ok("PUT", "/v1/policy", {}, expect=200),
                         {"rules": [], "deny": [], "require_approval": [],
                          "separate_approver": False, "approvers": [],
                          "approval_in_conversation": False})
        t.ok("PUT", "/v1/policy", doc, expect=200)

        # narrowings: may only take away
        agent = t.agent()
        ap = "/v1/agents/%s/policy" % agent["id"]
        self.assertError(t.request("GET", ap), 404, "not_found", "no narrowing yet")
        widening = [
            {"rules": [{"tool": "time.now", "rights": ["read", "write"]}]},
            {"rules": [{"tool": "notes.append", "rights": ["read", "write", "send"],
                        "approval": "always"}]},
            {"rules": [{"tool": "notes.append", "rights": ["write"],
                        "approval": {"over": {"argument": "n", "value": 20}}}]},
            {"rules": [{"tool": "notes.append", "rights": ["write"]}]},
            {"rules": [{"tool": "notes.append", "rights": ["write"],
                        "approval": {"over": {"argument": "m", "value": 1}}}]},
        ]
        for doc_w in widening:
            err = self.assertError(t.request("PUT", ap, doc_w), 400, "invalid_argument",
                                   "widening narrowing %r" % doc_w)
            self.assertIn("widens", err["message"])
            self.assertIn("rules[0]", err["message"])
        self.assertError(t.request("PUT", ap, {"rules": [{"tool": "other.tool",
                                                          "rights": ["read"]}]}),
                         400, "invalid_argument", "rights for a tool the frame does not cover")
        self.assertError(t.request("GET", ap), 404, "not_found", "a refused PUT wrote nothing")
        narrow = {"rules": [{"tool": "notes.append", "rights": ["write"],
                             "approval": {"over": {"argument": "n", "value": 5}}},
                            {"tool": "time.now", "rights": [], "approval": "always"}],
                  "deny": ["notes.delete"], "separate_approver": True}
        narrow_canonical = {"rules": [{"tool": "notes.append", "rights": ["write"],
                                       "approval": {"over": {"argument": "n", "value": 5}}},
                                      {"tool": "time.now", "rights": [], "approval": "always"}],
                            "deny": ["notes.delete"], "require_approval": [],
                            "separate_approver": True, "approvers": [],
                            "approval_in_conversation": False}
        self.assertEqual(t.ok("PUT", ap, narrow, expect=200), narrow_canonical)
        self.assertEqual(t.ok("GET", ap, expect=200), narrow_canonical)
        unknown = "/v1/agents/01a00000-0000-7000-8000-000000000000/policy"
        self.assertError(t.request("PUT", unknown, {}), 404, "not_found", "PUT unknown agent")
        self.assertError(t.request("GET", unknown), 404, "not_found", "GET unknown agent")

        # roles: users read, guests do not, only owners write
        user, _ = t.new_token("user")
        guest, _ = t.new_token("guest")
        self.assertEqual(t.ok("GET", "/v1/policy", token=user, expect=200), canonical)
        self.assertEqual(t.ok("GET", ap, token=user, expect=200), narrow_canonical)
        for method, path, body in (("PUT", "/v1/policy", {}), ("DELETE", "/v1/policy", None),
                                   ("PUT", ap, {}), ("DELETE", ap, None)):
            self.assertError(t.request(method, path, body, token=user), 403,
                             "permission_denied", "user %s %s" % (method, path))
            self.assertError(t.request(method, path, body, token=guest), 403,
                             "permission_denied", "guest %s %s" % (method, path))
        for path in ("/v1/policy", ap, "/v1/approvals", "/v1/standing-approvals",
                     "/v1/emergency-stops"):
            self.assertError(t.request("GET", path, token=guest), 403, "permission_denied",
                             "guest GET %s" % path)
        self.assertEqual(t.ok("GET", "/v1/policy", expect=200), canonical, "unchanged")

        # another tenant sees none of it
        other = Tenant(self.server)
        self.assertError(other.request("GET", "/v1/policy"), 404, "not_found")
        self.assertError(other.request("GET", ap), 404, "not_found")

        # delete
        t.ok("DELETE", ap, expect=204)
        self.assertError(t.request("GET", ap), 404, "not_found")
        self.assertError(t.request("DELETE", ap), 404, "not_found", "delete twice")
        t.ok("DELETE", "/v1/policy", expect=204)
        self.assertError(t.request("GET", "/v1/policy"), 404, "not_found")
        self.assertError(t.request("DELETE", "/v1/policy"), 404, "not_found", "delete twice")
        types = [e["type"] for e in t.events()]
        self.assertIn("policy.updated@v1", types)
        self.assertIn("policy.deleted@v1", types)

    # ------------------------------------------------------------------ 11. deny and roles

    def test_deny_rules(self):
        t = self.tenant({"rules": [{"tool": "*", "rights": ["read", "write"]}],
                         "deny": ["notes.*"]})
        agent, sess = t.agent_session()
        run = t.post(sess["id"], note_call("denied"))
        self.assertEqual(run["status"], "done", run)
        reason = "notes.append is denied by the tenant policy (deny notes.*)"
        self.assertEqual(run["output"], "The tool notes.append returned: error: %s." % reason)
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied")
        self.assertEqual(step["tool_call"]["status"], "denied")
        self.assertEqual(step["output"], {"error": reason})
        self.assertEqual(step["input"]["decision"], {"outcome": "deny", "reason": reason})
        denied = [e for e in t.events(run["id"]) if e["type"] == "tool.call.denied@v1"]
        self.assertEqual([e["payload"]["reason"] for e in denied], [reason])
        self.assertIsNone(t.notes(agent["id"]))
        self.assertEqual(t.approvals(), [], "a denied call asks no one")
        ok = t.post(sess["id"], "/call time.now {}")
        self.assertEqual(ok["status"], "done")
        self.assertTrue(ok["output"].startswith("The tool time.now returned: 20"), ok)

        # a tool no frame rule covers; a rule without the right
        t.ok("PUT", "/v1/policy", {"rules": [{"tool": "time.now", "rights": ["read"]}]})
        run = t.post(sess["id"], note_call("uncovered"))
        self.assertIn("error: no rule of the tenant policy covers notes.append", run["output"])
        t.ok("PUT", "/v1/policy", {"rules": [{"tool": "*", "rights": ["read"]}]})
        run = t.post(sess["id"], note_call("no write"))
        self.assertIn("does not grant write to notes.append", run["output"])
        self.assertIsNone(t.notes(agent["id"]))

        # an agent's narrowing denies for that agent only
        t.ok("PUT", "/v1/policy", {"rules": [{"tool": "*", "rights": ["read", "write"]}]})
        t.ok("PUT", "/v1/agents/%s/policy" % agent["id"], {"deny": ["notes.append"]})
        run = t.post(sess["id"], note_call("narrowed"))
        self.assertIn("error: notes.append is denied by the agent policy", run["output"])
        self.assertIsNone(t.notes(agent["id"]))
        agent2, sess2 = t.agent_session()
        run = t.post(sess2["id"], note_call("allowed"))
        self.assertEqual(run["output"], answer_for("allowed"))
        self.assertEqual(t.notes(agent2["id"]), ["allowed"])

        # a threshold on an argument the call does not carry fails safe: it needs approval
        t.ok("PUT", "/v1/policy", {"rules": [{"tool": "*", "rights": ["read", "write"],
                                              "approval": {"over": {"argument": "amount",
                                                                    "value": 10}}}]})
        run, a = t.park(sess2["id"], "thresholded")
        self.assertIn("amount is missing or not a number", a["reason"])
        self.assertEqual(t.decide(a["id"], "reject")[0], 200)
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        # require_approval lists work too
        t.ok("PUT", "/v1/policy", {"rules": [{"tool": "*", "rights": ["read", "write"]}],
                                   "require_approval": ["notes.*"]})
        run, a = t.park(sess2["id"], "listed")
        self.assertIn("require_approval", a["reason"])
        self.assertEqual(t.decide(a["id"], "approve")[0], 200)
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        self.assertEqual(t.notes(agent2["id"]), ["allowed", "listed"])

    def test_roles_without_policy(self):
        t = self.tenant()
        guest, _ = t.new_token("guest")
        user, user_id = t.new_token("user")
        agent, sess = t.agent_session()
        guests = t.session(agent["id"], token=guest)  # a guest reaches only the sessions it opened
        run = t.post(guests["id"], note_call("from a guest"), token=guest)
        self.assertEqual(run["status"], "done", run)
        self.assertIn("error: guests may only use read tools", run["output"])
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied")
        self.assertIsNone(t.notes(agent["id"]))
        run = t.post(guests["id"], "/call time.now {}", token=guest)
        self.assertEqual(run["status"], "done", run)
        self.assertTrue(run["output"].startswith("The tool time.now returned: 20"), run)
        # users and owners are limited only by policy (none is set)
        run = t.post(sess["id"], note_call("from a user"), token=user)
        self.assertEqual(run["output"], answer_for("from a user"))
        run = t.post(sess["id"], note_call("from an owner"))
        self.assertEqual(run["output"], answer_for("from an owner"))
        self.assertEqual(t.notes(agent["id"]), ["from a user", "from an owner"])
        # a guest's call that needs approval under a frame is still refused for the role
        t.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        run = t.post(guests["id"], note_call("guest again"), token=guest)
        self.assertEqual(run["status"], "done", run)
        self.assertIn("guests may only use read tools", run["output"])
        self.assertEqual(t.approvals(), [])
        # a user's parked call records the user as the requester
        run = t.post(sess["id"], note_call("user asks"), token=user)
        self.assertEqual(run["status"], "waiting_for_approval", run)
        a = t.the_pending(run["id"])
        self.assertEqual(a["requested_by"], user_id)
        self.assertEqual(t.decide(a["id"], "approve")[0], 200)
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        self.assertEqual(t.notes(agent["id"]), ["from a user", "from an owner", "user asks"])

    # ------------------------------------------------------------------ 12. emergency stops

    def test_agent_emergency_stop(self):
        t = self.tenant()
        agent, sess = t.agent_session()
        other, other_sess = t.agent_session()
        user, _ = t.new_token("user")
        stop_path = "/v1/agents/%s/emergency-stop" % agent["id"]
        self.assertError(t.request("PUT", stop_path, {"reason": "x"}, token=user), 403,
                         "permission_denied")
        self.assertError(t.request("PUT", stop_path, {"reason": "x", "why": 1}), 400,
                         "invalid_argument")
        self.assertError(t.request("PUT", "/v1/agents/01a00000-0000-7000-8000-000000000000/"
                                   "emergency-stop", {"reason": "x"}), 404, "not_found")
        self.assertError(t.request("DELETE", stop_path), 404, "not_found", "no stop to lift")

        stop = t.ok("PUT", stop_path, {"reason": "incident"}, expect=200)
        self.assertEqual(stop["agent_id"], agent["id"])
        self.assertEqual(stop["reason"], "incident")
        self.assertEqual(stop["created_by"], t.token_id)
        self.assertTime(stop["created_at"])
        self.assertEqual(t.ok("GET", "/v1/emergency-stops", token=user)["items"], [stop])

        why = "an emergency stop is in force for this agent: incident"
        run = t.post(sess["id"], note_call("stopped"))
        self.assertEqual(run["status"], "cancelled", run)
        self.assertEqual(run["error"], {"code": "emergency_stop", "message": why})
        self.assertEqual(t.tool_steps(run["id"]), [], "a stopped agent made a tool call")
        self.assertIsNone(t.notes(agent["id"]))
        self.assertEqual(t.session_status(sess["id"]), "idle")
        # the other agent works
        ok = t.post(other_sess["id"], note_call("unaffected"))
        self.assertEqual(ok["output"], answer_for("unaffected"))

        t.ok("DELETE", stop_path, expect=204)
        self.assertEqual(t.ok("GET", "/v1/emergency-stops")["items"], [])
        run = t.post(sess["id"], note_call("after the stop"))
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(t.notes(agent["id"]), ["after the stop"])
        types = [e["type"] for e in t.events()]
        self.assertIn("emergency_stop.engaged@v1", types)
        self.assertIn("emergency_stop.lifted@v1", types)

    def test_emergency_stop_halts_a_running_run(self):
        t = self.tenant()
        agent, sess = t.agent_session(config={"local_latency_ms": 1500})
        run = t.post(sess["id"], note_call("a") + "\n" + note_call("b"), wait=None)
        deadline = time.monotonic() + 10
        while t.run(run["id"])["status"] != "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # inside the first (slow) model step
        t.ok("PUT", "/v1/agents/%s/emergency-stop" % agent["id"], {"reason": "incident"})
        start = time.monotonic()
        ended = t.wait_run(run["id"], timeout=10)
        self.assertLess(time.monotonic() - start, 3, "the run did not halt at its next step")
        self.assertEqual(ended["status"], "cancelled", ended)
        self.assertEqual(ended["error"]["code"], "emergency_stop")
        self.assertIn("incident", ended["error"]["message"])
        steps = t.steps(run["id"])
        self.assertEqual([s["kind"] for s in steps], ["model"],
                         "the run went past the step boundary after the stop")
        self.assertIsNone(t.notes(agent["id"]))
        cancelled = [e for e in t.events(run["id"]) if e["type"] == "run.cancelled@v1"]
        self.assertEqual(len(cancelled), 1)
        self.assertEqual(cancelled[0]["payload"]["error"]["code"], "emergency_stop")
        self.assertEqual(t.session_status(sess["id"]), "idle")
        t.ok("DELETE", "/v1/agents/%s/emergency-stop" % agent["id"], expect=204)

    def test_emergency_stop_beats_an_approval(self):
        """An approved call is not made while a stop is in force: the approval does not bypass
        it."""
        t = self.tenant()
        agent, sess = t.agent_session()
        # no frame: a narrowing alone asks for approval for this agent
        t.ok("PUT", "/v1/agents/%s/policy" % agent["id"],
             {"rules": [{"tool": "notes.append", "rights": ["write"], "approval": "always"}]})
        run, a = t.park(sess["id"], "approved during a stop")
        t.ok("PUT", "/v1/agents/%s/emergency-stop" % agent["id"], {"reason": "incident"})
        self.assertEqual(t.decide(a["id"], "approve")[0], 200)
        ended = t.wait_run(run["id"])
        self.assertEqual(ended["status"], "cancelled", ended)
        self.assertEqual(ended["error"]["code"], "emergency_stop")
        self.assertIsNone(t.notes(agent["id"]), "an approval bypassed the emergency stop")
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied")
        self.assertIn("incident", step["output"]["error"])

    def test_tenant_emergency_stop(self):
        t = self.tenant()
        a1, s1 = t.agent_session()
        a2, s2 = t.agent_session()
        other = Tenant(self.server)
        oa, os_ = other.agent_session()
        stop = t.ok("PUT", "/v1/emergency-stop", {"reason": "all hands"}, expect=200)
        self.assertIsNone(stop["agent_id"])
        why = "an emergency stop is in force for the tenant: all hands"
        for sess in (s1, s2):
            run = t.post(sess["id"], note_call("stopped"))
            self.assertEqual(run["status"], "cancelled", run)
            self.assertEqual(run["error"], {"code": "emergency_stop", "message": why})
        self.assertIsNone(t.notes(a1["id"]))
        self.assertIsNone(t.notes(a2["id"]))
        # another tenant is not stopped
        run = other.post(os_["id"], note_call("elsewhere"))
        self.assertEqual(run["output"], answer_for("elsewhere"))
        self.assertEqual(other.ok("GET", "/v1/emergency-stops")["items"], [])
        # an agent stop and the tenant stop: lifting the tenant's leaves the agent's
        t.ok("PUT", "/v1/agents/%s/emergency-stop" % a1["id"], {"reason": "agent only"})
        self.assertEqual(len(t.ok("GET", "/v1/emergency-stops")["items"]), 2)
        t.ok("DELETE", "/v1/emergency-stop", expect=204)
        run = t.post(s2["id"], note_call("resumed"))
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(t.notes(a2["id"]), ["resumed"])
        run = t.post(s1["id"], note_call("still stopped"))
        self.assertEqual(run["status"], "cancelled", run)
        self.assertIn("agent only", run["error"]["message"])
        t.ok("DELETE", "/v1/agents/%s/emergency-stop" % a1["id"], expect=204)
        run = t.post(s1["id"], note_call("free"))
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(t.notes(a1["id"]), ["free"])


class ApprovalExpiryTest(KeelTestCase):
    """4. A pending approval expires after KEEL_APPROVAL_TIMEOUT_MS without a decision."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_APPROVAL_TIMEOUT_MS": "1500"})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_expiry(self):
        t = Tenant(self.server)
        t.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "too slow")
        ttl = parse_time(a["expires_at"]) - parse_time(a["created_at"])
        self.assertAlmostEqual(ttl.total_seconds(), 1.5, delta=0.01)
        start = time.monotonic()
        deadline = start + 6
        got = a
        while time.monotonic() < deadline:
            try:
                got = t.approval(a["id"])
            except (OSError, http.client.HTTPException) as e:
                self.fail("keel died while the approval expired (%r; alive=%s):\n%s"
                          % (e, self.server.alive(), self.server.log_tail(20)))
            if got["status"] != "pending":
                break
            time.sleep(0.05)
        took = time.monotonic() - start
        self.assertEqual(got["status"], "expired", got)
        self.assertLess(took, 5, "expired only after %.1fs" % took)
        self.assertEqual(got["decided_by"], "system")
        self.assertGreaterEqual(parse_time(got["decided_at"]), parse_time(got["expires_at"]))

        done = t.wait_run(run["id"])
        self.assertEqual(done["status"], "done", done)
        self.assertEqual(done["output"], "The tool notes.append returned: error: the approval "
                                         "expired without a decision; the call was not made.")
        self.assertIsNone(t.notes(agent["id"]))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["tool_call"]["status"], "rejected")
        dec = [e for e in t.events(run["id"]) if e["type"] == "approval.decided@v1"]
        self.assertEqual([d["payload"]["status"] for d in dec], ["expired"])
        self.assertError(t.decide(a["id"], "approve"), 409, "conflict", "approve after expiry")
        self.assertError(t.decide(a["id"], "reject"), 409, "conflict", "reject after expiry")
        self.assertEqual(t.session_status(sess["id"]), "idle")
        self.assertEqual(t.approvals("pending"), [])
        self.assertEqual([x["id"] for x in t.approvals("expired")], [a["id"]])

    def test_decided_in_time(self):
        """Decided before the timeout, the approval does not expire afterwards."""
        t = Tenant(self.server)
        t.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        agent, sess = t.agent_session()
        run, a = t.park(sess["id"], "quick")
        self.assertEqual(t.decide(a["id"], "approve")[0], 200)
        self.assertEqual(t.wait_run(run["id"])["status"], "done")
        time.sleep(2.2)
        self.assertEqual(t.approval(a["id"])["status"], "approved")
        self.assertEqual(t.notes(agent["id"]), ["quick"])


class ApprovalRestartTest(KeelTestCase):
    """6. A waiting run and its approval survive SIGTERM and kill -9."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def assertStillWaiting(self, t, run, a, sess, what):
        self.assertEqual(t.run(run["id"])["status"], "waiting_for_approval", what)
        got = t.approval(a["id"])
        self.assertEqual(got["status"], "pending", what)
        self.assertEqual(got["arguments"], a["arguments"], what)
        self.assertEqual(got["expires_at"], a["expires_at"], what)
        self.assertEqual(t.session_status(sess["id"]), "awaiting_approval", what)

    def test_restart_while_waiting(self):
        s = self.server
        t = Tenant(s)
        t.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        agent1, sess1 = t.agent_session()
        agent2, sess2 = t.agent_session()
        run1, a1 = t.park(sess1["id"], "after sigterm")
        run2, a2 = t.park(sess2["id"], "after kill")

        self.assertEqual(s.restart(), s)  # SIGTERM: drain and stop
        time.sleep(1.2)  # the dispatcher has polled at least twice
        self.assertStillWaiting(t, run1, a1, sess1, "after SIGTERM")
        self.assertStillWaiting(t, run2, a2, sess2, "after SIGTERM")
        self.assertIsNone(t.notes(agent1["id"]))
        self.assertEqual(t.decide(a1["id"], "approve")[0], 200)
        done = t.wait_run(run1["id"])
        self.assertEqual(done["status"], "done", done)
        self.assertEqual(done["output"], answer_for("after sigterm"))
        self.assertEqual(t.notes(agent1["id"]), ["after sigterm"])

        s.restart(kill=True)  # kill -9
        time.sleep(1.2)
        self.assertStillWaiting(t, run2, a2, sess2, "after kill -9")
        self.assertIsNone(t.notes(agent2["id"]))
        self.assertEqual(t.run(run1["id"])["status"], "done")
        self.assertEqual(t.decide(a1["id"], "approve")[0], 409)
        self.assertEqual(t.decide(a2["id"], "approve")[0], 200)
        done = t.wait_run(run2["id"])
        self.assertEqual(done["status"], "done", done)
        self.assertEqual(t.notes(agent2["id"]), ["after kill"])
        self.assertEqual(t.notes(agent1["id"]), ["after sigterm"], "a restart repeated a call")
        for r in (run1, run2):
            started = [e for e in t.events(r["id"]) if e["type"] == "tool.call.started@v1"]
            self.assertEqual(len(started), 1)
        self.assertHealthy()


if __name__ == "__main__":
    unittest.main()

"""Graceful drain: SIGTERM stops taking work (intake, new streams and /readyz answer 503 with
Retry-After; /healthz says draining), ends live streams so their clients reconnect, hands each
executing run back to the queue at its next step boundary (run.queued@v1 with "released") and
exits; a second signal exits at once. The handed-back run goes on where it stopped: on SQLite
when the node restarts, on PostgreSQL on another node at once (not after its lease), with no
step made twice and no event missing from a stream that reconnects after its last event id.
"""

import os
import signal
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, SseClient, WebSocketClient, sse_url

ON_PG = os.environ.get("KEEL_TEST_STORE") == "postgres"
SLOW_MODEL_MS = 1500  # a model step that SIGTERM finds in flight


def wait_until(pred, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return pred()


class DrainTest(KeelTestCase):
    def setUp(self):
        self.workspaces = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                       "keel-drain-ws-%d-%d" % (os.getpid(), id(self)))
        self.env = {"KEEL_WORKSPACES": self.workspaces, "KEEL_LEASE_MS": "30000"}
        self.server = KeelServer(env=self.env)
        self.addCleanup(self.server.stop)

    def servers(self):
        return [s for s in (getattr(self, "server", None), getattr(self, "other", None)) if s]

    def slow_turn(self, server):
        agent = server.create_agent(tools=["notes.append"],
                                    config={"local_latency_ms": SLOW_MODEL_MS})
        session = server.create_session(agent["id"])
        status, body, _ = server.post_message(
            session["id"], '/call notes.append {"line": "drained once"}')
        self.assertIn(status, (200, 202), body)
        run = body["run"]
        self.assertEqual(run["status"], "running", "intake claims the run on an idle node")
        return agent, session, run

    def stream_until_closed(self, sse, timeout):
        events = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = sse.next(timeout=max(0.05, deadline - time.monotonic()))
            if ev is None:
                break
            if ev.get("closed"):
                return events, True
            if ev.get("event") != "message.delta":
                events.append(ev)
        return events, False

    def assert_ran_once(self, server, run_id, agent_id):
        steps = server.steps(run_id)
        seqs = [s["seq"] for s in steps]
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)), "steps: %s" % steps)
        self.assertEqual([s["kind"] for s in steps], ["model", "tool", "model"], steps)
        with open(os.path.join(self.workspaces, agent_id, "notes.txt")) as f:
            self.assertEqual(f.read().count("drained once"), 1, "the call was made twice")
        log = [e for e in server.all_events() if e["run_id"] == run_id]
        released = [e for e in log if e["type"] == "run.queued@v1" and e["payload"].get("released")]
        self.assertEqual(len(released), 1, "run.queued@v1 with released: %s"
                         % [e["type"] for e in log])
        self.assertEqual([e["type"] for e in log].count("tool.call.started@v1"), 1)
        self.assertEqual([e["type"] for e in log].count("run.completed@v1"), 1)
        return log

    def test_sigterm_refuses_new_work_and_the_run_goes_on_after_a_restart(self):
        if ON_PG:
            self.skipTest("one node: on PostgreSQL another node takes the run (the next test)")
        s = self.server
        agent, session, run = self.slow_turn(s)
        sse = SseClient(sse_url(s, session_id=session["id"]), s.token, last_event_id=0)
        self.addCleanup(sse.close)
        ws = WebSocketClient(sse_url(s, session_id=session["id"]), s.token, last_event_id=0)
        self.addCleanup(ws.close)
        time.sleep(0.3)  # the first model step is in flight
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)

        # Draining (once the signal is handled): still answering, refusing work.
        status, body, headers = wait_until(
            lambda: (lambda r: r if r[0] == 503 else None)(s.request("GET", "/readyz", token=None)),
            timeout=3) or s.request("GET", "/readyz", token=None)
        self.assertEqual((status, body.get("status")), (503, "draining"), body)
        self.assertEqual(headers.get("retry-after"), "1")
        status, body, _ = s.request("GET", "/healthz", token=None)
        self.assertEqual((status, body.get("status")), (200, "draining"), body)
        status, body, headers = s.post_message(session["id"], "one more")
        self.assertEqual(status, 503, body)
        self.assertEqual(headers.get("retry-after"), "1")
        status, body, _ = s.request("GET", "/v1/stream")
        self.assertEqual(status, 503, body)
        # The live stream ends (the client reconnects by itself).
        seen, closed = self.stream_until_closed(sse, timeout=5)
        self.assertTrue(closed, "the stream stayed open while the node drained")
        _, ws_closed = self.stream_until_closed(ws, timeout=5)
        self.assertTrue(ws_closed, "the WebSocket stayed open while the node drained")
        self.assertEqual(ws.close_code, 1012, "a WebSocket is closed with 'service restart'")

        # It exits at the step boundary, long before the drain timeout.
        s.proc.wait(timeout=10)
        self.assertLess(time.monotonic() - t0, SLOW_MODEL_MS / 1000 + 4)
        self.assertEqual(s.proc.returncode, 0, s.log_tail())

        s.start()
        final = wait_until(lambda: (lambda r: r if r["status"] == "done" else None)(
            s.ok("GET", "/v1/runs/%s" % run["id"])), timeout=20)
        self.assertEqual(final["status"], "done", final)
        self.assertEqual(final["attempt"], 2, "handed back once, claimed again once")
        log = self.assert_ran_once(s, run["id"], agent["id"])

        # A client that reconnects after its last event id misses nothing and sees nothing twice.
        last = seen[-1]["id"] if seen else "0"
        again = SseClient(sse_url(s, session_id=session["id"]), s.token, last_event_id=last)
        self.addCleanup(again.close)
        more = again.collect_until(lambda ev: ev.get("event") == "run.completed@v1", timeout=15)
        streamed = [int(e["id"]) for e in seen + more if e.get("event") != "message.delta"
                    and not e.get("closed")]
        stored = [e["position"] for e in s.all_events() if e["session_id"] == session["id"]]
        self.assertEqual(streamed, stored[:len(streamed)], "the reconnected stream has a gap")
        self.assertIn(log[-1]["position"], streamed)

    @unittest.skipUnless(ON_PG, "another node on the same database: PostgreSQL only")
    def test_sigterm_hands_the_run_to_another_node_at_once(self):
        a = self.server
        self.other = KeelServer(env=self.env, store_url=a.store_url, token=a.token)
        self.addCleanup(self.other.stop)
        agent, session, run = self.slow_turn(a)
        time.sleep(0.3)
        t0 = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        final = wait_until(lambda: (lambda r: r if r["status"] == "done" else None)(
            self.other.ok("GET", "/v1/runs/%s" % run["id"])), timeout=20)
        took = time.monotonic() - t0
        self.assertEqual(final["status"], "done", final)
        # The lease is 30 s: only a handed-back run is taken this soon.
        self.assertLess(took, 2 * SLOW_MODEL_MS / 1000 + 5, "the other node took %.1fs" % took)
        a.proc.wait(timeout=10)
        self.assertEqual(a.proc.returncode, 0, a.log_tail())
        log = self.assert_ran_once(self.other, run["id"], agent["id"])
        origins = {e["origin"] for e in log}
        self.assertEqual(len(origins), 2, "both nodes wrote the run's events: %s" % origins)

    @unittest.skipUnless(ON_PG, "another node on the same database: PostgreSQL only")
    def test_a_draining_leader_hands_the_lead_over_at_once(self):
        # Its cluster-wide duties (schedules, expiries) stop when it drains: another node must
        # take them over now, not when its lease of 5 s has run out after the drain.
        self.other = KeelServer(env=self.env, store_url=self.server.store_url,
                                token=self.server.token)
        self.addCleanup(self.other.stop)

        def leads(node):
            status, body, _ = node.request("GET", "/healthz", token=None, timeout=10)
            return status == 200 and bool(body.get("leader"))

        got = wait_until(lambda: (lambda g: g if sum(g) == 1 else None)(
            [leads(self.server), leads(self.other)]), timeout=10)
        self.assertTrue(got, "exactly one node leads")
        leader, other = (self.server, self.other) if got[0] else (self.other, self.server)
        agent = leader.create_agent(config={"local_latency_ms": 20000})
        session = leader.create_session(agent["id"])
        status, body, _ = leader.post_message(session["id"], "keep the drain going")
        self.assertIn(status, (200, 202), body)
        time.sleep(0.3)
        t0 = time.monotonic()
        leader.proc.send_signal(signal.SIGTERM)
        self.assertTrue(wait_until(lambda: leads(other), timeout=4),
                        "the other node did not take the lead from a draining one")
        took = time.monotonic() - t0
        self.assertIsNone(leader.proc.poll(), "the leader should still drain its 20 s step")
        self.assertLess(took, 3.0, "the lead moved only after %.1fs" % took)
        self.assertIn("no longer leads the cluster: it is draining", leader.log_tail())
        leader.proc.send_signal(signal.SIGINT)
        leader.proc.wait(timeout=5)

    def test_a_second_signal_stops_at_once(self):
        s = self.server
        agent = s.create_agent(tools=["notes.append"], config={"local_latency_ms": 20000})
        session = s.create_session(agent["id"])
        status, body, _ = s.post_message(session["id"], "take your time")
        self.assertIn(status, (200, 202), body)
        time.sleep(0.3)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        self.assertIsNone(s.proc.poll(), "it should still drain: the model step takes 20 s")
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGINT)
        s.proc.wait(timeout=5)
        self.assertLess(time.monotonic() - t0, 3.0)
        # The run was not handed back (no step boundary came): it resumes after the restart.
        s.start()
        run = s.ok("GET", "/v1/runs/%s" % body["run"]["id"])
        self.assertIn(run["status"], ("queued", "running"), run)


if __name__ == "__main__":
    unittest.main()

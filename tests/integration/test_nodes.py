"""Several `keel serve` nodes on one PostgreSQL database: a commit on one node wakes live readers
on the others (LISTEN/NOTIFY), well before their 15 s fallback, and the event log stays the truth
(every event exactly once, in position order).

Runs only with KEEL_TEST_STORE=postgres (integration_pg.test_nodes); SQLite has one node."""

import os
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, SseClient, sse_url

DELTA = "message.delta"
ON_PG = os.environ.get("KEEL_TEST_STORE") == "postgres"
NODE_ENV = {"KEEL_LEASE_MS": "2000"}  # for a kill -9 test to come (needs a slow tool)


def completes(run_id):
    def pred(ev):
        return (ev.get("event") in ("run.completed@v1", "run.failed@v1", "run.cancelled@v1")
                and isinstance(ev.get("data"), dict) and ev["data"].get("run_id") == run_id)
    return pred


@unittest.skipUnless(ON_PG, "several nodes need a shared store: runs only with "
                            "KEEL_TEST_STORE=postgres (ctest integration_pg.test_nodes)")
class NodesTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.a = KeelServer(env=NODE_ENV)
        cls.b = KeelServer(env=NODE_ENV, store_url=cls.a.store_url, token=cls.a.token)

    @classmethod
    def tearDownClass(cls):
        cls.b.stop()
        cls.a.stop()  # drops the database last

    def servers(self):
        return [s for s in (getattr(self, "a", None), getattr(self, "b", None)) if s is not None]

    def open(self, server, **filters):
        sse = SseClient(sse_url(server, **filters), server.token)
        self.addCleanup(sse.close)
        self.assertEqual(sse.status, 200, "stream status")
        return sse

    def test_sse_on_b_sees_commits_of_a_promptly_once_and_in_order(self):
        a, b = self.a, self.b
        agent = a.create_agent()
        session = a.create_session(agent["id"])
        sse = self.open(b, session_id=session["id"])
        time.sleep(0.3)  # let B's stream settle into its wait
        for turn in range(3):
            t0 = time.monotonic()
            status, body, _ = a.post_message(session["id"], "/call time.now {}\n/call time.now {}")
            self.assertIn(status, (200, 202), "POST message on A: %s %r" % (status, body))
            run_id = body["run"]["id"]
            first = sse.next(timeout=10)
            latency = time.monotonic() - t0
            self.assertIsNotNone(first, "turn %d: B's stream saw nothing within 10s" % turn)
            self.assertFalse(first.get("closed"), "B's stream closed: %r" % first)
            self.assertLess(latency, 2.0, "turn %d: B saw A's commit only after %.2fs (the "
                            "fallback is 15s: no cross-node wake-up?)" % (turn, latency))
            got = [first] if completes(run_id)(first) else \
                [first] + sse.collect_until(completes(run_id), timeout=10)
            self.assertLess(time.monotonic() - t0, 8.0, "turn %d: run's events were slow" % turn)
            stored = [e for e in got if e.get("event") != DELTA]
            positions = [e["data"]["position"] for e in stored]
            self.assertEqual(positions, sorted(set(positions)),
                             "turn %d: not exactly once in order: %s" % (turn, positions))
            for e in stored:
                self.assertEqual(e["id"], str(e["data"]["position"]))
            # Exactly the log's events of this session from the first streamed one on.
            log = [e["position"] for e in a.all_events()
                   if e.get("session_id") == session["id"] and e["position"] >= positions[0]
                   and e["position"] <= positions[-1]]
            self.assertEqual(positions, log, "turn %d: stream differs from the log" % turn)
        # Nothing further: no duplicate replays.
        extra = [e for e in sse.drain(quiet=0.7) if e.get("event") != DELTA]
        self.assertEqual(extra, [], "events streamed twice")

    def test_wait_on_b_returns_when_any_node_finishes(self):
        a, b = self.a, self.b
        agent = a.create_agent()
        session = a.create_session(agent["id"])
        for turn in range(4):
            t0 = time.monotonic()
            body = b.send(session["id"], "/call time.now {}", wait=10)
            took = time.monotonic() - t0
            self.assertIn(body["run"]["status"], ("done", "failed"),
                          "turn %d: ?wait=10 on B returned a run still %r after %.1fs"
                          % (turn, body["run"]["status"], took))
            self.assertLess(took, 5.0, "turn %d: ?wait on B took %.1fs" % (turn, took))


if __name__ == "__main__":
    unittest.main()

"""GET /v1/stream: Server-Sent Events with filters, token deltas, and Last-Event-ID resume that
delivers every later matching event exactly once, in order; and the same stream over a WebSocket
(the route upgraded; every test of the SSE class runs again over it, plus the WebSocket's own)."""

import json
import random
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, SseClient, WebSocketClient, sse_url

DELTA = "message.delta"


def stored(events):
    """The stream's stored events (everything but token deltas)."""
    return [e for e in events if e.get("event") != DELTA]


def completes(run_id):
    def pred(ev):
        return (ev.get("event") in ("run.completed@v1", "run.failed@v1", "run.cancelled@v1")
                and isinstance(ev.get("data"), dict) and ev["data"].get("run_id") == run_id)
    return pred


class SseTest(KeelTestCase):
    client = SseClient  # the transport under test
    open_status = 200

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def open(self, last_event_id=None, **filters):
        sse = self.client(sse_url(self.server, **filters), self.server.token,
                          last_event_id=last_event_id)
        self.addCleanup(sse.close)
        self.assertEqual(sse.status, self.open_status, "stream status")
        if self.client is SseClient:
            self.assertIn("text/event-stream", sse.headers.get("content-type", ""))
        return sse

    def log(self, **match):
        """The event log (GET /v1/events), filtered client-side by the given fields."""
        return [e for e in self.server.all_events()
                if all(e.get(k) == v for k, v in match.items())]

    def check_frames(self, events):
        """Every stored event: id is its position, event is its type, data is the event JSON;
        ids strictly increase."""
        log = {e["position"]: e for e in self.server.all_events()}
        last = 0
        for ev in stored(events):
            data = ev["data"]
            self.assertIsInstance(data, dict, "data is not JSON: %r" % ev)
            self.assertIsNotNone(ev["id"], "a stored event without id: %r" % ev)
            self.assertEqual(ev["id"], str(data["position"]), "id is not the position: %r" % ev)
            self.assertEqual(ev["event"], data["type"], "event is not the type: %r" % ev)
            self.assertGreater(data["position"], last, "ids not increasing")
            last = data["position"]
            self.assertIn(data["position"], log, "streamed event not in /v1/events: %r" % data)
            self.assertEqual(data, log[data["position"]],
                             "the streamed event differs from /v1/events")

    # ------------------------------------------------------------------ format and filters

    def test_session_filter_and_format(self):
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        s1 = s.create_session(agent["id"])
        s2 = s.create_session(agent["id"])
        sse = self.open(session_id=s1["id"])
        other = s.send(s2["id"], "/call time.now {}")["run"]
        run = s.send(s1["id"], "/call time.now {}")["run"]
        got = sse.collect_until(completes(run["id"]))
        got += sse.drain(quiet=0.5)
        self.check_frames(got)
        for ev in got:
            if isinstance(ev["data"], dict) and "session_id" in ev["data"]:
                self.assertEqual(ev["data"]["session_id"], s1["id"],
                                 "session filter leaked %r" % ev)
            self.assertNotEqual(ev["data"].get("run_id") if isinstance(ev["data"], dict) else None,
                                other["id"])
        positions = [e["data"]["position"] for e in stored(got)]
        expected = [e["position"] for e in self.log(session_id=s1["id"])
                    if e["position"] >= positions[0]]
        self.assertEqual(positions, expected, "stream vs log for the session")
        types = [e["event"] for e in stored(got)]
        for t in ("message.created@v1", "run.queued@v1", "run.started@v1", "run.step@v1",
                  "tool.call.started@v1", "tool.call.completed@v1", "run.completed@v1"):
            self.assertIn(t, types)

    def test_agent_filter(self):
        s = self.server
        a = s.create_agent(tools=["time.now"])
        b = s.create_agent(tools=["time.now"])
        sa = s.create_session(a["id"])
        sb = s.create_session(b["id"])
        sse = self.open(agent_id=a["id"])
        s.send(sb["id"], "for b")
        run = s.send(sa["id"], "for a")["run"]
        got = sse.collect_until(completes(run["id"]))
        got += sse.drain(quiet=0.5)
        self.check_frames(got)
        for ev in got:
            data = ev["data"] if isinstance(ev["data"], dict) else {}
            if "agent_id" in data:
                self.assertEqual(data["agent_id"], a["id"], "agent filter leaked %r" % ev)
            if "session_id" in data:
                self.assertNotEqual(data["session_id"], sb["id"], "agent filter leaked %r" % ev)

    def test_run_filter_replay_from_zero(self):
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        sess = s.create_session(agent["id"])
        s.send(sess["id"], "before")
        run = s.send(sess["id"], "/call time.now {}")["run"]
        s.send(sess["id"], "after")
        sse = self.open(last_event_id=0, run_id=run["id"])
        got = sse.collect_until(completes(run["id"]))
        got += sse.drain(quiet=0.5)
        self.check_frames(got)
        self.assertEqual([e["data"]["position"] for e in stored(got)],
                         [e["position"] for e in self.log(run_id=run["id"])],
                         "replay of one run's events")

    # ------------------------------------------------------------------ deltas

    def test_message_delta(self):
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        sess = s.create_session(agent["id"])
        other = s.create_session(agent["id"])
        sse = self.open(session_id=sess["id"])
        s.send(other["id"], "noise from another session")
        text = "stream these words one by one please"
        run = s.send(sess["id"], text)["run"]
        got = sse.collect_until(completes(run["id"]))
        deltas = [e for e in got if e["event"] == DELTA]
        self.assertTrue(deltas, "no message.delta events while the run streamed: %s"
                        % [e["event"] for e in got])
        last_pos = 0
        for ev in got:
            if ev["event"] != DELTA:
                last_pos = ev["data"]["position"]
                continue
            self.assertIsInstance(ev["data"], dict, ev)
            self.assertIsInstance(ev["data"].get("text"), str, ev)
            if ev["data"].get("session_id") is not None:
                self.assertEqual(ev["data"]["session_id"], sess["id"])
            if ev["data"].get("run_id") is not None:
                self.assertEqual(ev["data"]["run_id"], run["id"])
            # a delta is not in the log: it must not move the client's Last-Event-ID forward
            if ev["id"]:
                self.assertLessEqual(int(ev["id"]), last_pos,
                                     "a delta carries an id past the last stored event: %r" % ev)
        self.assertEqual("".join(e["data"]["text"] for e in deltas), run["output"],
                         "deltas concatenate to the answer")
        # Nothing of a run shows before it is on disk: its deltas come after its first stored
        # event, although the ?wait= post's intake is told before its commit (ADR 0023).
        first_stored = next(i for i, e in enumerate(got)
                            if e["event"] != DELTA and e["data"].get("run_id") == run["id"])
        first_delta = next(i for i, e in enumerate(got) if e["event"] == DELTA)
        self.assertLess(first_stored, first_delta, [e["event"] for e in got])
        self.assertNotIn(DELTA, [e["type"] for e in s.all_events()],
                         "deltas must not be stored in the log")

    # ------------------------------------------------------------------ resume

    def test_resume_after_quiet_disconnect(self):
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        sess = s.create_session(agent["id"])
        sse = self.open(last_event_id=0, session_id=sess["id"])
        r1 = s.send(sess["id"], "/call time.now {}")["run"]
        got = stored(sse.collect_until(completes(r1["id"])))
        sse.close()
        # pretend we saw only up to the middle of the first run
        cut = got[len(got) // 2]["data"]["position"]
        s.send(sess["id"], "second")
        r3 = s.send(sess["id"], "/call time.now {}")["run"]
        sse2 = self.open(last_event_id=cut, session_id=sess["id"])
        again = sse2.collect_until(completes(r3["id"]))
        again += sse2.drain(quiet=0.7)
        self.check_frames(again)
        self.assertEqual([e["data"]["position"] for e in stored(again)],
                         [e["position"] for e in self.log(session_id=sess["id"])
                          if e["position"] > cut],
                         "resume from Last-Event-ID: every later event exactly once, in order")

    def test_resume_while_running(self):
        """Disconnect and reconnect several times while a run produces events: the union of
        what the client saw is the log of its session, with no gap and no duplicate."""
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        sess = s.create_session(agent["id"])
        n = 120
        st, body, _ = s.post_message(sess["id"], "\n".join(["/call time.now {}"] * n))
        self.assertEqual(st, 202, body)
        rid = body["run"]["id"]
        seen = []
        last = 0
        rng = random.Random(7)
        reconnects = 0
        finished = False
        deadline = time.monotonic() + 120
        while not finished and time.monotonic() < deadline:
            sse = self.client(sse_url(s, session_id=sess["id"]), s.token, last_event_id=last)
            try:
                self.assertEqual(sse.status, self.open_status)
                want = rng.randint(1, 15)
                for _ in range(want):
                    ev = sse.next(timeout=10)
                    if ev is None:
                        break
                    self.assertFalse(ev.get("closed"), "stream closed: %r" % ev)
                    if ev["event"] == DELTA:
                        continue
                    seen.append(ev)
                    last = ev["data"]["position"]
                    if completes(rid)(ev):
                        finished = True
                        break
            finally:
                sse.close()
            reconnects += 1
        self.assertTrue(finished, "never saw the run complete (%d reconnects)" % reconnects)
        self.assertGreater(reconnects, 3)
        self.check_frames(seen)
        positions = [e["data"]["position"] for e in seen]
        self.assertEqual(len(positions), len(set(positions)), "duplicates across reconnects")
        self.assertEqual(positions, [e["position"] for e in self.log(session_id=sess["id"])
                                     if e["position"] <= positions[-1]],
                         "gap across reconnects")

    def test_two_streams_same_view(self):
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        sess = s.create_session(agent["id"])
        a = self.open(last_event_id=0, agent_id=agent["id"])
        b = self.open(last_event_id=0, session_id=sess["id"])
        run = s.send(sess["id"], "/call time.now {}")["run"]
        ga = stored(a.collect_until(completes(run["id"])))
        gb = stored(b.collect_until(completes(run["id"])))
        pa = [e["data"]["position"] for e in ga if e["data"]["run_id"] == run["id"]]
        pb = [e["data"]["position"] for e in gb if e["data"]["run_id"] == run["id"]]
        self.assertTrue(pa)
        self.assertEqual(pa, pb)

    def test_stream_needs_token(self):
        s = self.server
        st, body, _ = s.request("GET", "/v1/stream", token=None)
        self.assertEqual(st, 401, body)
        sse = self.client(sse_url(s), "bad-token")
        try:
            self.assertEqual(sse.status, 401)
        finally:
            sse.close()


class WebSocketStreamTest(SseTest):
    """Every test above over a WebSocket, and what is the WebSocket's own."""
    client = WebSocketClient
    open_status = 101

    def test_each_message_is_one_event_and_the_handshake_is_checked(self):
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        sess = s.create_session(agent["id"])
        ws = self.open(session_id=sess["id"])
        run = s.send(sess["id"], "/call time.now {}")["run"]
        got = ws.collect_until(completes(run["id"]))
        self.check_frames(got)
        for ev in got:  # one JSON object per message, nothing else
            self.assertEqual(json.loads(ev["raw_data"]), ev["data"])
        # A handshake without its key is refused (400), and an upgrade of a route that does not
        # stream gets that route's plain answer.
        st, body, _ = s.request("GET", "/v1/stream",
                                headers={"Upgrade": "websocket", "Connection": "Upgrade"})
        self.assertEqual(st, 400, body)
        other = WebSocketClient(s.base_url + "/v1/agents", s.token)
        self.addCleanup(other.close)
        self.assertEqual(other.status, 200, "a plain route answers plainly, without upgrading")


class WebSocketCloseTest(KeelTestCase):
    """A server of its own: no other stream may come or go while the gauge is read."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def clients(self):
        _, body, _ = self.server.request("GET", "/metrics")
        for line in body.splitlines():
            if line.startswith("keel_sse_clients "):
                return int(float(line.split()[1]))
        raise AssertionError("keel_sse_clients not in /metrics")

    def wait_clients(self, n):
        deadline = time.monotonic() + 20
        while self.clients() != n and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.clients(), n)

    def test_a_client_that_closes_is_let_go(self):
        s = self.server
        ws = WebSocketClient(sse_url(s), s.token)
        self.addCleanup(ws.close)
        self.assertEqual(ws.status, 101)
        self.wait_clients(1)
        ws.close()
        # The server reads the close frame; the stream ends at its next write (or ping).
        agent = s.create_agent(tools=["time.now"])
        s.send(s.create_session(agent["id"])["id"], "wake the stream")
        self.wait_clients(0)


class SseAcrossRestartTest(KeelTestCase):
    """A client that resumes with Last-Event-ID after the server died (kill -9) and came back
    gets every later event exactly once: positions are durable, not per process."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_resume_across_kill9(self):
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        sess = s.create_session(agent["id"])
        sse = SseClient(sse_url(s, session_id=sess["id"]), s.token, last_event_id=0)
        seen = []
        try:
            self.assertEqual(sse.status, 200)
            st, body, _ = s.post_message(sess["id"], "\n".join(["/call time.now {}"] * 200))
            self.assertEqual(st, 202, body)
            rid = body["run"]["id"]
            # read a few events of the running run, then kill the server under the stream
            while len(stored(seen)) < 8:
                ev = sse.next(timeout=20)
                self.assertIsNotNone(ev, "no events from the stream")
                self.assertFalse(ev.get("closed"), ev)
                seen.append(ev)
            s.kill9()
            rest = sse.drain(quiet=1.0)  # whatever was in flight, then the close
            seen += [e for e in rest if not e.get("closed")]
        finally:
            sse.close()
        s.start()
        seen = stored(seen)
        last = seen[-1]["data"]["position"]
        sse2 = SseClient(sse_url(s, session_id=sess["id"]), s.token, last_event_id=last)
        try:
            self.assertEqual(sse2.status, 200)
            more = sse2.collect_until(completes(rid), timeout=120)
            more += sse2.drain(quiet=0.5)
        finally:
            sse2.close()
        seen += stored(more)
        positions = [e["data"]["position"] for e in seen]
        self.assertEqual(len(positions), len(set(positions)), "duplicates across the restart")
        log = [e["position"] for e in s.all_events() if e["session_id"] == sess["id"]]
        self.assertEqual(positions, [p for p in log if p <= positions[-1]],
                         "stream across a kill -9 differs from the log (gap or reorder)")
        self.assertEqual(s.get_run(rid)["status"], "done")


if __name__ == "__main__":
    unittest.main()

"""Event positions and origin_seqs are per tenant: what a tenant sees of the log (GET /v1/events,
its cursors, the SSE ids, Last-Event-ID, the WebSocket) counts its own events only, so another
tenant's activity shows as no gap, and a cursor another tenant's events used shows nothing of
them. Tenant B is busy between each of tenant A's turns; A's owner, user and guest tokens, B's
owner and a revoked token of A's are tried."""

import unittest

from keel_harness import KeelServer, KeelTestCase, SseClient, Tenant, WebSocketClient, sse_url


def stored(events):
    return [e for e in events if e.get("event") != "message.delta"]


class TenantPositionsTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def turn(self, tenant, session_id, text, token=None):
        body = self.server.send(session_id, text, token=token or tenant.token)
        run = self.server.wait_run(body["run"]["id"], token=token or tenant.token)
        self.assertEqual(run["status"], "done", run)
        return run

    def events(self, tenant, after=0, token=None, limit=500):
        """Every event `token` (default: the tenant's owner) sees after `after`, paged."""
        out, cursor = [], None
        while True:
            path = "/v1/events?limit=%d&" % limit + ("cursor=%s" % cursor if cursor
                                                      else "after=%d" % after)
            page = tenant.ok("GET", path, expect=200, token=token)
            out.extend(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                return out

    def assertConsecutive(self, events, first=1, what=""):
        positions = [e["position"] for e in events]
        self.assertEqual(positions, list(range(first, first + len(events))),
                         "%s: positions are not the tenant's 1, 2, 3, ..." % what)
        seqs = {}
        for e in events:
            seqs.setdefault(e["origin"], []).append(e["origin_seq"])
        for origin, got in seqs.items():
            self.assertEqual(got, list(range(got[0], got[0] + len(got))),
                             "%s: origin_seq of %s has gaps" % (what, origin))

    def setUp(self):
        s = self.server
        self.a, self.b = Tenant(s), Tenant(s)
        self.a_agent = s.create_agent(token=self.a.token)
        self.a_session = s.create_session(self.a_agent["id"], token=self.a.token)["id"]
        b_agent = s.create_agent(token=self.b.token)
        self.b_session = s.create_session(b_agent["id"], token=self.b.token)["id"]

    def busy_b(self, turns=4):
        for i in range(turns):
            self.turn(self.b, self.b_session, "b is busy %d" % i)

    def test_positions_and_origin_seqs_show_nothing_of_another_tenant(self):
        a, b = self.a, self.b
        self.busy_b()
        self.turn(a, self.a_session, "a one")
        self.busy_b()
        self.turn(a, self.a_session, "a two")
        self.busy_b()
        a_events = self.events(a)
        b_events = self.events(b)
        self.assertGreater(len(a_events), 4)
        self.assertGreater(len(b_events), 3 * len(a_events))
        # A's log starts at 1 and has no gap, though B wrote before, between and after its turns;
        # its origin_seq starts at 1 too. (The agent and session events count as well.)
        self.assertConsecutive(a_events, what="A")
        self.assertEqual(a_events[0]["origin_seq"], 1)
        self.assertConsecutive(b_events, what="B")
        b_ids = {e["id"] for e in b_events}
        self.assertFalse(b_ids & {e["id"] for e in a_events})
        # Cursors B's events used show A nothing of B: past A's end there is nothing at all.
        last_a = a_events[-1]["position"]
        for after in (last_a, last_a + 1, b_events[-1]["position"] - 1, b_events[-1]["position"]):
            page = a.ok("GET", "/v1/events?after=%d" % after, expect=200)
            self.assertEqual(page["items"], [], "A after=%d" % after)
            self.assertIsNone(page["next_cursor"])
        # Within A's range a cursor resumes exactly.
        middle = a_events[len(a_events) // 2]["position"]
        self.assertEqual(self.events(a, after=middle), a_events[len(a_events) // 2:][1:])
        # Paging by next_cursor (2 a page) reads the same log.
        self.assertEqual(self.events(a, limit=2), a_events)

    def test_user_and_guest_see_their_tenants_positions_and_nothing_of_b(self):
        a = self.a
        user, _ = a.new_token("user")
        guest, _ = a.new_token("guest")
        self.busy_b(2)
        self.turn(a, self.a_session, "owner turn")
        guest_session = self.server.create_session(self.a_agent["id"], token=guest)["id"]
        self.busy_b(2)
        self.turn(a, guest_session, "guest turn", token=guest)
        self.busy_b(2)
        owner_view = self.events(a)
        self.assertConsecutive(owner_view, what="A's owner")
        self.assertEqual(self.events(a, token=user), owner_view, "a user sees the owner's log")
        # A guest sees only its session's events, each at A's position and none of B's.
        guest_view = self.events(a, token=guest)
        self.assertTrue(guest_view)
        by_id = {e["id"]: e for e in owner_view}
        for e in guest_view:
            self.assertEqual(e["session_id"], guest_session)
            self.assertIn(e["id"], by_id)
            self.assertEqual(e["position"], by_id[e["id"]]["position"])
            self.assertEqual(e["origin_seq"], by_id[e["id"]]["origin_seq"])
        # B's owner, with A's cursors, sees only B's own log.
        b_view = self.events(self.b)
        self.assertConsecutive(b_view, what="B")
        self.assertFalse({e["id"] for e in b_view} & set(by_id))

    def test_revoked_and_missing_tokens_read_no_positions(self):
        revoked, revoked_id = self.a.new_token("user")
        self.a.ok("DELETE", "/v1/tokens/" + revoked_id, expect=204)
        for token in (revoked, None):
            status, body, _ = self.server.request("GET", "/v1/events?after=0", token=token)
            self.assertEqual(status, 401, body)
            self.assertIn("error", body)
            status, body, _ = self.server.request("GET", "/v1/stream", token=token,
                                                  headers={"Last-Event-ID": "0"})
            self.assertEqual(status, 401, body)

    def stream(self, client, tenant, last_event_id=None):
        sse = client(sse_url(self.server), tenant.token, last_event_id=last_event_id)
        self.addCleanup(sse.close)
        self.assertIn(sse.status, (101, 200))
        return sse

    def check_stream(self, client):
        a = self.a
        self.busy_b(2)
        self.turn(a, self.a_session, "before the stream")
        log = self.events(a)
        n = len(log)
        # From the start: exactly A's log, ids 1..n.
        sse = self.stream(client, a, last_event_id=0)
        got = stored(sse.collect_until(lambda ev: ev.get("id") == str(n)))
        self.assertEqual([ev["id"] for ev in got], [str(p) for p in range(1, n + 1)])
        self.assertEqual([ev["data"] for ev in got], log)
        # A new client tails from A's end (not the store's): B's busy turns come through to
        # neither, and A's next turn arrives numbered n+1, n+2, ...
        tail = self.stream(client, a)
        self.busy_b(3)
        self.turn(a, self.a_session, "while streaming")
        after = self.events(a, after=n)
        m = after[-1]["position"]
        for s in (sse, tail):
            more = stored(s.collect_until(lambda ev: ev.get("id") == str(m)))
            self.assertEqual([ev["id"] for ev in more], [str(p) for p in range(n + 1, m + 1)])
            self.assertEqual([ev["data"] for ev in more], after)
        # Resumption from any id in between is exact: the next one, no gap, no duplicate.
        cut = n + 1
        resumed = self.stream(client, a, last_event_id=cut)
        again = stored(resumed.collect_until(lambda ev: ev.get("id") == str(m)))
        self.assertEqual([ev["id"] for ev in again], [str(p) for p in range(cut + 1, m + 1)])
        # A cursor past A's end, at positions B used, streams nothing of B: A's next event is
        # the next A writes, and B's turns in between show nowhere.
        ahead = self.stream(client, a, last_event_id=m + 40)
        self.busy_b(1)
        self.assertEqual(stored(ahead.drain(quiet=1.0)), [])

    def test_sse_ids_are_the_tenants_positions(self):
        self.check_stream(SseClient)

    def test_websocket_positions_are_the_tenants(self):
        self.check_stream(WebSocketClient)

    def test_a_bad_last_event_id_is_refused(self):
        for bad in ("-1", "x", "1.5", "99999999999999999999"):
            status, body, _ = self.a.request("GET", "/v1/stream", headers={"Last-Event-ID": bad})
            self.assertEqual(status, 400, (bad, body))
            self.assertEqual(body["error"]["code"], "invalid_argument")


if __name__ == "__main__":
    unittest.main()

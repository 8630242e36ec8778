"""The fleet's view (GET /v1/nodes and its once-a-second stream): the platform admin sees every
node serving the store, the leader and the cluster's load, and nobody else sees any of it. On
SQLite the one node; with KEEL_TEST_STORE=postgres two nodes on one database, each seeing both."""

import os
import unittest

from keel_harness import KeelServer, KeelTestCase, SseClient, Tenant, unique_name, wait_for

ON_PG = os.environ.get("KEEL_TEST_STORE") == "postgres"


class FleetTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.a = KeelServer()
        cls.b = None
        if ON_PG:
            cls.b = KeelServer(store_url=cls.a.store_url, token=cls.a.token)

    @classmethod
    def tearDownClass(cls):
        if cls.b:
            cls.b.stop()
        cls.a.stop()

    def servers(self):
        return [s for s in (self.a, self.b) if s]

    def fleet(self, server):
        return server.ok("GET", "/v1/nodes")

    def test_the_platform_admin_sees_every_node_and_the_load(self):
        nodes = [s for s in (self.a, self.b) if s]
        # Each node sees every node (on PostgreSQL once they have reported: within a second).
        for server in nodes:
            fleet = wait_for(lambda: (lambda f: f if len(f["nodes"]) == len(nodes) else None)(
                self.fleet(server)), 10, "every node in the fleet")
            self.assertEqual(sorted(n["address"] for n in fleet["nodes"]),
                             sorted(s.addr for s in nodes))
            self.assertEqual([n["this_node"] for n in fleet["nodes"]].count(True), 1)
            me = [n for n in fleet["nodes"] if n["this_node"]][0]
            self.assertEqual(me["address"], server.addr)
            for n in fleet["nodes"]:
                self.assertTime(n["started_at"])
                self.assertTime(n["seen_at"])
            self.assertTime(fleet["at"])
            self.assertIsInstance(fleet["runs_queued"], int)
        fleet = wait_for(lambda: (lambda f: f if f["leader"] else None)(self.fleet(self.a)), 10,
                         "a leader")
        self.assertEqual([n["origin"] for n in fleet["nodes"] if n["leader"]], [fleet["leader"]])
        # A turn on the last node shows in its finished runs, as the first node sees them.
        last = nodes[-1]

        def finished():
            f = self.fleet(self.a)
            return sum(n["runs_finished"] for n in f["nodes"] if n["address"] == last.addr)

        before = finished()
        agent = last.create_agent()
        session = last.create_session(agent["id"])
        run = last.send(session["id"], "count me", wait=20)["run"]
        last.wait_run(run["id"])
        wait_for(lambda: finished() > before, 10, "the finished turn in the fleet")

    def test_the_feed_streams_a_snapshot_a_second(self):
        sse = SseClient(self.a.base_url + "/v1/nodes/stream", self.a.token)
        self.addCleanup(sse.close)
        self.assertEqual(sse.status, 200)
        first, second = sse.next(timeout=10), sse.next(timeout=10)
        for ev in (first, second):
            self.assertEqual(ev["event"], "fleet")
            self.assertIn("nodes", ev["data"])
        self.assertLess(first["data"]["at"], second["data"]["at"])

    def test_nobody_else_sees_the_fleet(self):
        t = Tenant(self.a)
        user, _ = t.new_token("user")
        admin_user = self.a.ok("POST", "/v1/tokens", {"name": unique_name("u"), "role": "user"},
                               expect=201)["token"]
        revoked = self.a.ok("POST", "/v1/tokens", {"name": unique_name("r"), "role": "owner"},
                            expect=201)
        self.a.ok("DELETE", "/v1/tokens/" + revoked["id"], expect=204)
        for path in ("/v1/nodes", "/v1/nodes/stream"):
            for token, status in ((t.token, 403), (user, 403), (admin_user, 403),
                                  (None, 401), (revoked["token"], 401)):
                st, body, _ = self.a.request("GET", path, token=token, timeout=10)
                self.assertEqual(st, status, (path, body))


if __name__ == "__main__":
    unittest.main()

"""Cross-origin requests from browser pages (docs/API.md section 1, cors_origins): none by
default; the listed origins get preflights answered and may read answers of the API, the stream
and /v1/mcp; other origins get neither; no answer allows credentials; a malformed setting stops
the server at start."""

import json
import unittest

from keel_harness import KeelServer, KeelTestCase, ServerDied, http_request

ALLOWED = "https://app.example.com"
DEV = "http://localhost:5173"
STRANGER = "https://evil.example.net"


def preflight(server, path, origin, method="POST", headers="authorization, content-type"):
    h = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers:
        h["Access-Control-Request-Headers"] = headers
    return http_request(server.addr, "OPTIONS", path, token=None, headers=h)


class CorsTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_CORS_ORIGINS": "%s, %s" % (ALLOWED, DEV)})
        cls.plain = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.plain.stop()

    def servers(self):
        return [self.server, self.plain]

    def events(self, server):
        return server.ok("GET", "/v1/events?limit=500")["items"]

    def test_listed_origins_get_their_preflights_answered(self):
        before = self.events(self.server)
        for path in ("/v1/agents", "/v1/chat/completions", "/v1/stream", "/v1/mcp",
                     "/v1/sessions/x/messages"):
            for origin in (ALLOWED, DEV):
                st, body, h = preflight(self.server, path, origin)
                self.assertEqual(st, 204, (path, body))
                self.assertEqual(h.get("access-control-allow-origin"), origin)
                self.assertIn("POST", h.get("access-control-allow-methods", ""))
                allowed = h.get("access-control-allow-headers", "").lower()
                for header in ("authorization", "content-type", "idempotency-key",
                               "last-event-id", "mcp-session-id", "x-keel-session"):
                    self.assertIn(header, allowed)
                self.assertNotIn("access-control-allow-credentials", h)
                self.assertIn("Origin", h.get("vary", ""))
        self.assertEqual(self.events(self.server), before, "a preflight wrote something")

    def test_other_origins_are_refused(self):
        for server in (self.server, self.plain):
            for origin in (STRANGER, ALLOWED + ".evil.net", "null", ALLOWED.upper()):
                st, body, h = preflight(server, "/v1/agents", origin)
                self.assertEqual(st, 403, (origin, body))
                self.assertNotIn("access-control-allow-origin", h)
                st, body, h = server.request("GET", "/v1/agents", headers={"Origin": origin})
                self.assertEqual(st, 200, body)  # answered: the browser keeps it from the page
                self.assertNotIn("access-control-allow-origin", h)
        # No setting: not even the origins the other server lists.
        st, _, h = preflight(self.plain, "/v1/agents", ALLOWED)
        self.assertEqual(st, 403)
        st, _, h = self.plain.request("GET", "/v1/agents", headers={"Origin": ALLOWED})
        self.assertNotIn("access-control-allow-origin", h)

    def test_a_listed_origin_may_read_answers_and_their_headers(self):
        st, body, h = self.server.request("GET", "/v1/agents", headers={"Origin": ALLOWED})
        self.assertEqual(st, 200, body)
        self.assertEqual(h.get("access-control-allow-origin"), ALLOWED)
        exposed = h.get("access-control-expose-headers", "").lower()
        for header in ("x-keel-session", "x-keel-run", "mcp-session-id", "retry-after"):
            self.assertIn(header, exposed)
        self.assertNotIn("access-control-allow-credentials", h)
        # Errors too (a page reads why it was refused); the token still decides.
        st, body, h = self.server.request("GET", "/v1/agents", token=None,
                                          headers={"Origin": ALLOWED})
        self.assertEqual(st, 401, body)
        self.assertEqual(h.get("access-control-allow-origin"), ALLOWED)

    def test_mcp_takes_a_listed_origin_and_refuses_others(self):
        agent = self.server.create_agent()
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "page", "version": "1"}}}
        path = "/v1/mcp?agent=%s" % agent["id"]
        st, body, h = self.server.request("POST", path, init, headers={"Origin": ALLOWED})
        self.assertEqual(st, 200, body)
        self.assertEqual(h.get("access-control-allow-origin"), ALLOWED)
        self.assertTrue(h.get("mcp-session-id"))
        st, body, h = self.server.request("POST", path, init, headers={"Origin": STRANGER})
        self.assertEqual(st, 403, body)

    def test_a_wildcard_allows_any_origin_without_credentials(self):
        server = KeelServer(env={"KEEL_CORS_ORIGINS": "*"})
        try:
            st, _, h = preflight(server, "/v1/agents", STRANGER)
            self.assertEqual(st, 204)
            self.assertEqual(h.get("access-control-allow-origin"), STRANGER)
            self.assertNotIn("access-control-allow-credentials", h)
            st, _, h = server.request("GET", "/v1/agents", headers={"Origin": STRANGER})
            self.assertEqual(h.get("access-control-allow-origin"), STRANGER)
            self.assertNotIn("access-control-allow-credentials", h)
        finally:
            server.stop()

    def test_a_malformed_setting_stops_the_server(self):
        for bad in ("https://app.example.com/", "app.example.com", "ftp://x.example.com",
                    "https://App.example.com", "https://x.example.com:99999",
                    "https://x.example.com/path"):
            server = KeelServer(env={"KEEL_CORS_ORIGINS": bad}, start=False)
            try:
                with self.assertRaises(ServerDied) as refused:
                    server.start()
                self.assertIn("KEEL_CORS_ORIGINS", str(refused.exception))
                self.assertIn("is not an origin", str(refused.exception))
            finally:
                server.stop()


if __name__ == "__main__":
    unittest.main()

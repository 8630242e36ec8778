"""Tenancy and auth: bearer tokens, token management, secrets at rest, tenant isolation."""

import glob
import hashlib
import os
import stat
import unittest

from keel_harness import KeelServer, KeelTestCase, SseClient, sse_url, unique_name


class AuthTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_missing_token_401(self):
        s = self.server
        for method, path in (("GET", "/v1/agents"), ("POST", "/v1/agents"),
                             ("GET", "/v1/events"), ("GET", "/v1/tokens"),
                             ("GET", "/v1/agents/whatever"), ("GET", "/metrics"),
                             ("GET", "/v1/stream")):
            body = {"name": "x", "model": "local"} if method == "POST" else None
            self.assertError(s.request(method, path, body, token=None), 401, "unauthenticated",
                             "%s %s without a token" % (method, path))

    def test_bad_token_401(self):
        s = self.server
        self.assertError(s.request("GET", "/v1/agents", token="not-a-real-token"), 401,
                         "unauthenticated", "bad token")
        self.assertError(s.request("GET", "/v1/agents", token=s.token + "x"), 401,
                         "unauthenticated", "token with a suffix")
        self.assertError(s.request("GET", "/v1/agents", token=None,
                                   headers={"Authorization": "Basic " + s.token}),
                         401, "unauthenticated", "Basic scheme")
        self.assertError(s.request("GET", "/v1/agents", token=None,
                                   headers={"Authorization": "Bearer"}),
                         401, "unauthenticated", "empty bearer")
        # no agent got created by an unauthenticated POST
        st, _, _ = s.request("POST", "/v1/agents", {"name": "sneaky", "model": "local"},
                             token="bogus")
        self.assertEqual(st, 401)
        names = [a["name"] for a in s.list_all("/v1/agents")]
        self.assertNotIn("sneaky", names)

    def test_health_needs_no_token(self):
        for path in ("/healthz", "/readyz"):
            st, _, _ = self.server.request("GET", path, token=None)
            self.assertEqual(st, 200, path)

    def test_owner_token_file_mode(self):
        path = os.path.join(self.server.home, "owner.token")
        mode = stat.S_IMODE(os.stat(path).st_mode)
        self.assertEqual(mode, 0o600, "owner.token mode is %o" % mode)
        with open(path) as f:
            self.assertEqual(f.read().strip(), self.server.token)
        self.assertTrue(len(self.server.token) >= 20, "owner token looks too short to be secret")

    def test_token_lifecycle(self):
        s = self.server
        st, tok, _ = s.request("POST", "/v1/tokens", {"name": "ci", "role": "user"})
        self.assertEqual(st, 201, tok)
        for k in ("id", "name", "role", "token"):
            self.assertIn(k, tok, "token response lacks %s: %r" % (k, tok))
        self.assertEqual(tok["name"], "ci")
        self.assertEqual(tok["role"], "user")
        secret = tok["token"]
        self.assertIsInstance(secret, str)
        self.assertGreaterEqual(len(secret), 20)

        # it works
        st, body, _ = s.request("GET", "/v1/agents", token=secret)
        self.assertEqual(st, 200, body)

        # listing never shows secrets
        st, body, _ = s.request("GET", "/v1/tokens")
        self.assertEqual(st, 200, body)
        self.assertIn("items", body)
        ids = [t["id"] for t in body["items"]]
        self.assertIn(tok["id"], ids)
        raw = repr(body)
        self.assertNotIn(secret, raw, "GET /v1/tokens shows a secret")
        self.assertNotIn(s.token, raw, "GET /v1/tokens shows the owner secret")
        for t in body["items"]:
            self.assertNotIn("token", t, "a listed token carries its secret field: %r" % t)

        # revoke, then 401
        st, body, _ = s.request("DELETE", "/v1/tokens/%s" % tok["id"])
        self.assertIn(st, (200, 204), body)
        self.assertError(s.request("GET", "/v1/agents", token=secret), 401, "unauthenticated",
                         "revoked token")
        # revoking twice or an unknown id: 404
        st, body, _ = s.request("DELETE", "/v1/tokens/%s" % tok["id"])
        self.assertIn(st, (404, 409), body)
        self.assertError(s.request("DELETE", "/v1/tokens/no-such-token"), 404, "not_found")
        # the owner token still works
        st, _, _ = s.request("GET", "/v1/agents")
        self.assertEqual(st, 200)

    def test_owner_role_token(self):
        s = self.server
        tok = s.ok("POST", "/v1/tokens", {"name": "second-owner", "role": "owner"}, expect=201)
        self.assertEqual(tok["role"], "owner")
        st, _, _ = s.request("GET", "/v1/agents", token=tok["token"])
        self.assertEqual(st, 200)

    def test_bad_token_requests(self):
        s = self.server
        self.assertError(s.request("POST", "/v1/tokens", {"name": "x", "role": "emperor"}), 400,
                         "invalid_argument", "unknown role")
        self.assertError(s.request("POST", "/v1/tokens", raw_body="{nope"), 400,
                         "invalid_argument", "malformed JSON")

    def test_no_plaintext_tokens_at_rest(self):
        s = self.server
        tok = s.ok("POST", "/v1/tokens", {"name": "at-rest", "role": "user"}, expect=201)
        # make sure something was written after the token (so a WAL has moved on)
        s.create_agent()
        contents = s.store_contents()
        self.assertTrue(contents, "nothing of the store found at rest (KEEL_HOME: %s)"
                        % os.listdir(s.home))
        for secret in (s.token, tok["token"]):
            for label, data in contents:
                self.assertNotIn(secret.encode(), data,
                                 "a token is stored in plaintext in %s" % label)
            # and a hash is stored (sanity: the store knows the token by its digest)
        digest = hashlib.sha256(s.token.encode()).hexdigest()
        found = any(digest.encode() in data or bytes.fromhex(digest) in data
                    for _, data in contents)
        if not found:
            # Not required by the contract (another hash construction is fine); note it.
            print("note: owner token's plain sha256 not found in the store (a keyed hash?)")

    def test_non_admin_cannot_create_tenant(self):
        s = self.server
        user = s.ok("POST", "/v1/tokens", {"name": "u", "role": "user"}, expect=201)
        self.assertError(s.request("POST", "/v1/tenants", {"name": unique_name("t")},
                                   token=user["token"]), 403, "permission_denied",
                         "a user-role token creates a tenant")


class TenantIsolationTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = s = KeelServer()
        # tenant A (the default tenant, platform admin) has an agent, a session, a finished run
        cls.a_agent = s.create_agent(name="shared-name", tools=["time.now"])
        cls.a_session = s.create_session(cls.a_agent["id"])
        cls.a_run = s.send(cls.a_session["id"], "/call time.now {}")["run"]
        st, body, _ = s.request("POST", "/v1/tenants", {"name": "tenant-b"})
        assert st == 201, "POST /v1/tenants -> %s %r\n%s" % (st, body, s.log_tail())
        cls.tenant_b = body
        cls.b_token = body["owner_token"]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_create_tenant_shape(self):
        b = self.tenant_b
        self.assertIn("tenant", b)
        for k in ("id", "name", "created_at"):
            self.assertIn(k, b["tenant"])
        self.assertEqual(b["tenant"]["name"], "tenant-b")
        self.assertTime(b["tenant"]["created_at"])
        self.assertIsInstance(self.b_token, str)
        self.assertNotEqual(self.b_token, self.server.token)

    def test_b_sees_nothing_of_a(self):
        s, tb = self.server, self.b_token
        agents = s.list_all("/v1/agents", token=tb)
        self.assertNotIn(self.a_agent["id"], [a["id"] for a in agents])
        a_ids = {self.a_agent["id"], self.a_session["id"], self.a_run["id"]}
        events = s.all_events(token=tb)
        for e in events:
            self.assertFalse({e.get("agent_id"), e.get("session_id"), e.get("run_id")} & a_ids,
                             "tenant B sees tenant A's event %r" % e)
        self.assertNotIn(s.token, repr(events))

    def test_b_gets_404_on_a_objects(self):
        s, tb = self.server, self.b_token
        ag, se, ru = self.a_agent["id"], self.a_session["id"], self.a_run["id"]
        cases = [
            ("GET", "/v1/agents/%s" % ag, None),
            ("PATCH", "/v1/agents/%s" % ag, {"instructions": "hijacked"}),
            ("DELETE", "/v1/agents/%s" % ag, None),
            ("GET", "/v1/agents/%s/sessions" % ag, None),
            ("POST", "/v1/agents/%s/sessions" % ag, {"title": "x"}),
            ("GET", "/v1/sessions/%s" % se, None),
            ("GET", "/v1/sessions/%s/messages" % se, None),
            ("POST", "/v1/sessions/%s/messages" % se, {"content": "hi from b"}),
            ("GET", "/v1/sessions/%s/runs" % se, None),
            ("GET", "/v1/runs/%s" % ru, None),
            ("GET", "/v1/runs/%s/steps" % ru, None),
            ("POST", "/v1/runs/%s/cancel" % ru, None),
        ]
        for method, path, body in cases:
            self.assertError(s.request(method, path, body, token=tb), 404, "not_found",
                             "tenant B: %s %s" % (method, path))
        # A's objects are untouched
        agent = s.ok("GET", "/v1/agents/%s" % ag, expect=200)
        self.assertNotEqual(agent["instructions"], "hijacked")
        msgs = s.list_all("/v1/sessions/%s/messages" % se)
        self.assertNotIn("hi from b", [m["content"] for m in msgs])
        self.assertEqual(len(s.list_all("/v1/agents/%s/sessions" % ag)), 1)
        self.assertEqual(s.get_run(ru)["status"], "done")

    def test_b_tokens_do_not_see_a_tokens(self):
        s, tb = self.server, self.b_token
        a_tok = s.ok("POST", "/v1/tokens", {"name": "a-only", "role": "user"}, expect=201)
        listed = s.ok("GET", "/v1/tokens", token=tb, expect=200)["items"]
        self.assertNotIn(a_tok["id"], [t["id"] for t in listed])
        self.assertError(s.request("DELETE", "/v1/tokens/%s" % a_tok["id"], token=tb), 404,
                         "not_found", "B revokes A's token")
        st, _, _ = s.request("GET", "/v1/agents", token=a_tok["token"])
        self.assertEqual(st, 200, "A's token must still work")

    def test_b_has_its_own_namespace(self):
        s, tb = self.server, self.b_token
        # the same agent name is free in another tenant
        b_agent = s.create_agent(name="shared-name", token=tb)
        b_sess = s.create_session(b_agent["id"], token=tb)
        run = s.send(b_sess["id"], "hello from b", token=tb)["run"]
        self.assertEqual(run["status"], "done")
        # A does not see B's objects
        self.assertNotIn(b_agent["id"], [a["id"] for a in s.list_all("/v1/agents")])
        self.assertError(s.request("GET", "/v1/agents/%s" % b_agent["id"]), 404, "not_found")
        self.assertError(s.request("GET", "/v1/sessions/%s" % b_sess["id"]), 404, "not_found")
        self.assertError(s.request("GET", "/v1/runs/%s" % run["id"]), 404, "not_found")
        a_events = s.all_events()
        self.assertNotIn(run["id"], [e["run_id"] for e in a_events])
        b_events = s.all_events(token=tb)
        self.assertIn(run["id"], [e["run_id"] for e in b_events])

    def test_b_stream_sees_nothing_of_a(self):
        s, tb = self.server, self.b_token
        sse = SseClient(sse_url(s), tb, last_event_id=0)
        try:
            self.assertEqual(sse.status, 200)
            # new activity in A while B listens
            s.send(self.a_session["id"], "secret business of A")
            got = sse.drain(quiet=1.0)
        finally:
            sse.close()
        a_ids = {self.a_agent["id"], self.a_session["id"]}
        for ev in got:
            data = ev["data"] if isinstance(ev["data"], dict) else {}
            self.assertFalse({data.get("agent_id"), data.get("session_id")} & a_ids,
                             "B's stream carries A's event %r" % ev)
            self.assertNotIn("secret business", ev["raw_data"])

    def test_b_owner_is_not_admin(self):
        self.assertError(self.server.request("POST", "/v1/tenants", {"name": "c"},
                                             token=self.b_token),
                         403, "permission_denied", "tenant B's owner creates a tenant")

    def test_tenant_b_token_survives_restart_as_hash_only(self):
        s = self.server
        files = [p for p in glob.glob(os.path.join(s.home, "keel.db*")) if os.path.isfile(p)]
        for p in files:
            with open(p, "rb") as f:
                self.assertNotIn(self.b_token.encode(), f.read(),
                                 "tenant B's owner token in plaintext in %s" % p)


if __name__ == "__main__":
    unittest.main()

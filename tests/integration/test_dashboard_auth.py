"""The dashboard's sign-in (docs/API.md section 24): an API token exchanged for a sign-in of the
browser's own, held in an HttpOnly SameSite=Strict cookie; writes need the sign-in's CSRF token;
a sign-in acts as the token that made it, is stored durably (another node, a restart), and ends
at sign-out and when that token is revoked. And the dashboard's files at / with a strict
Content-Security-Policy. Attacked as another tenant, a guest, a revoked token, a forged cookie
and bad bodies."""

import http.client
import os
import re
import threading
import unittest

from keel_harness import KeelServer, KeelTestCase, Tenant, http_request, unique_name


def cookie_of(headers):
    """The keel_session value a Set-Cookie header sets, and the header's attributes."""
    raw = headers.get("set-cookie", "")
    m = re.match(r"keel_session=([^;]*)(.*)", raw)
    assert m, "no keel_session cookie in %r" % raw
    attrs = [a.strip() for a in m.group(2).split(";") if a.strip()]
    return m.group(1), attrs


class Browser:
    """What a browser sends: the cookie, and the CSRF header on writes once it knows it."""

    def __init__(self, server, cookie, csrf=None):
        self.server = server
        self.cookie = cookie
        self.csrf = csrf

    def request(self, method, path, body=None, csrf=True, headers=None, **kw):
        h = {"Cookie": "theme=dark; keel_session=%s" % self.cookie}
        if csrf and self.csrf and method not in ("GET", "HEAD"):
            h["X-Keel-CSRF"] = self.csrf
        h.update(headers or {})
        return self.server.request(method, path, body=body, token=None, headers=h, **kw)


class RawStream:
    """A stream read in a thread until the server closes it."""

    def __init__(self, server, path, headers):
        host, port = server.addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.conn.request("GET", path, headers=dict(headers, Accept="text/event-stream"))
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.done = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        try:
            while self.resp.read1(65536):
                pass
        except Exception:  # noqa: BLE001
            pass
        self.done.set()

    def closed_within(self, seconds):
        closed = self.done.wait(seconds)
        self.conn.close()
        return closed


def sign_in(server, token):
    st, body, h = server.request("POST", "/v1/dashboard/sign-in", {"token": token}, token=None)
    assert st == 201, (st, body)
    cookie, attrs = cookie_of(h)
    return Browser(server, cookie, body["csrf_token"]), body, attrs


class DashboardSignInTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_sign_in_sets_an_http_only_strict_cookie_that_acts_as_the_token(self):
        a = Tenant(self.server)
        browser, body, attrs = sign_in(self.server, a.token)
        self.assertIn("HttpOnly", attrs)
        self.assertIn("SameSite=Strict", attrs)
        self.assertIn("Path=/", attrs)
        self.assertTrue(any(x.startswith("Max-Age=") and int(x[8:]) > 0 for x in attrs), attrs)
        self.assertNotIn("Secure", attrs)  # plain HTTP on loopback: the browser would drop it
        self.assertEqual(body["tenant_id"], a.id)
        self.assertEqual(body["token_id"], a.token_id)
        self.assertEqual(body["role"], "owner")
        self.assertIs(body["platform_admin"], False)
        self.assertIs(sign_in(self.server, self.server.token)[1]["platform_admin"], True)
        self.assertTime(body["expires_at"])
        self.assertNotIn(browser.cookie, str(body))  # the secret is only in the cookie
        # The cookie reads what the token reads, as the token.
        agent = a.ok("POST", "/v1/agents", {"name": unique_name("a"), "model": "local"},
                     expect=201)
        st, listed, _ = browser.request("GET", "/v1/agents")
        self.assertEqual(st, 200, listed)
        self.assertEqual([x["id"] for x in listed["items"]], [agent["id"]])
        st, session, _ = browser.request("GET", "/v1/dashboard/session")
        self.assertEqual(st, 200, session)
        self.assertEqual(session["csrf_token"], browser.csrf)
        self.assertIs(session["signed_in"], True)
        self.assertEqual(session["token_id"], a.token_id)
        # A session it opens is the token's: the front door lets that token, and no other,
        # continue it.
        st, s, _ = browser.request("POST", "/v1/agents/%s/sessions" % agent["id"], {})
        self.assertEqual(st, 201, s)
        turn = {"model": agent["id"], "messages": [{"role": "user", "content": "hi"}]}
        st, out, _ = a.request("POST", "/v1/chat/completions", turn,
                               headers={"X-Keel-Session": s["id"]})
        self.assertEqual(st, 200, out)
        other, _ = a.new_token("owner")
        st, out, _ = a.request("POST", "/v1/chat/completions", turn, token=other,
                               headers={"X-Keel-Session": s["id"]})
        self.assertNotEqual(st, 200, out)
        # The sign-in is listed among the tenant's tokens, with the token it acts as.
        tokens = a.ok("GET", "/v1/tokens")["items"]
        signins = [t for t in tokens if t["parent_id"] == a.token_id]
        self.assertEqual(len(signins), 1, tokens)
        self.assertEqual(signins[0]["role"], "owner")
        self.assertTime(signins[0]["expires_at"])
        # Its event names the parent, and carries no row images or secrets.
        events = a.ok("GET", "/v1/events?limit=500")["items"]
        created = [e for e in events if e["type"] == "token.created@v1"
                   and e["payload"]["token_id"] == signins[0]["id"]]
        self.assertEqual(len(created), 1)
        self.assertEqual(created[0]["payload"]["parent_id"], a.token_id)
        self.assertNotIn("rows", created[0]["payload"])

    def test_writes_need_the_csrf_header_and_the_servers_own_origin(self):
        a = Tenant(self.server)
        browser, _, _ = sign_in(self.server, a.token)
        body = {"name": unique_name("a"), "model": "local"}
        for csrf in (None, "", "0" * 64, browser.csrf[:-1] + ("0" if browser.csrf[-1] != "0" else "1")):
            h = {} if csrf is None else {"X-Keel-CSRF": csrf}
            self.assertError(browser.request("POST", "/v1/agents", body, csrf=False, headers=h),
                             403, "permission_denied", "csrf %r" % csrf)
        self.assertEqual(a.ok("GET", "/v1/agents")["items"], [], "a refused write wrote")
        # Another origin's page, reading or writing, even with the right header.
        for origin in ("https://evil.example.net", "http://127.0.0.1.evil.net", "null"):
            self.assertError(browser.request("GET", "/v1/agents", headers={"Origin": origin}),
                             403, "permission_denied", origin)
            self.assertError(browser.request("POST", "/v1/agents", body,
                                             headers={"Origin": origin}),
                             403, "permission_denied", origin)
        st, created, _ = browser.request("POST", "/v1/agents", body,
                                         headers={"Origin": "http://" + self.server.addr})
        self.assertEqual(st, 201, created)
        # Another sign-in's CSRF token does not fit this cookie.
        other, _, _ = sign_in(self.server, a.token)
        self.assertNotEqual(other.csrf, browser.csrf)
        crossed = Browser(self.server, browser.cookie, other.csrf)
        self.assertError(crossed.request("DELETE", "/v1/agents/%s" % created["id"]),
                         403, "permission_denied")
        # A bearer token needs no CSRF header (no browser sends one on its own).
        a.ok("DELETE", "/v1/agents/%s" % created["id"], expect=204)

    def test_sign_out_ends_the_sign_in_and_clears_the_cookie(self):
        a = Tenant(self.server)
        browser, _, _ = sign_in(self.server, a.token)
        keep, _, _ = sign_in(self.server, a.token)
        # Sign-out is a write: without the CSRF header it does nothing.
        self.assertError(browser.request("POST", "/v1/dashboard/sign-out", csrf=False),
                         403, "permission_denied")
        st, _, h = browser.request("POST", "/v1/dashboard/sign-out")
        self.assertEqual(st, 204)
        value, attrs = cookie_of(h)
        self.assertEqual(value, "")
        self.assertIn("Max-Age=0", attrs)
        for path in ("/v1/agents", "/v1/stream"):
            self.assertError(browser.request("GET", path), 401, "unauthenticated", path)
        self.assertEqual(browser.request("GET", "/v1/dashboard/session")[1], {"signed_in": False})
        self.assertError(browser.request("POST", "/v1/dashboard/sign-out"), 401, "unauthenticated")
        # Only that sign-in ended: the token and its other sign-in still work.
        self.assertEqual(keep.request("GET", "/v1/agents")[0], 200)
        a.ok("GET", "/v1/agents")

    def test_revoking_the_token_ends_its_sign_ins(self):
        a = Tenant(self.server)
        secret, token_id = a.new_token("user")
        browser, body, _ = sign_in(self.server, secret)
        self.assertEqual(body["role"], "user")
        self.assertEqual(browser.request("GET", "/v1/agents")[0], 200)
        a.ok("DELETE", "/v1/tokens/%s" % token_id, expect=204)
        self.assertError(browser.request("GET", "/v1/agents"), 401, "unauthenticated")
        signin = [t for t in a.ok("GET", "/v1/tokens")["items"] if t["parent_id"] == token_id]
        self.assertEqual(len(signin), 1)
        self.assertIsNotNone(signin[0]["revoked_at"])
        # And a revoked token cannot sign in again.
        st, body, h = self.server.request("POST", "/v1/dashboard/sign-in", {"token": secret},
                                          token=None)
        self.assertEqual(st, 401, body)
        self.assertNotIn("set-cookie", h)

    def test_an_owner_may_end_a_sign_in_by_revoking_it(self):
        a = Tenant(self.server)
        browser, _, _ = sign_in(self.server, a.token)
        signin = [t for t in a.ok("GET", "/v1/tokens")["items"] if t["parent_id"]][0]
        a.ok("DELETE", "/v1/tokens/%s" % signin["id"], expect=204)
        self.assertError(browser.request("GET", "/v1/agents"), 401, "unauthenticated")
        a.ok("GET", "/v1/agents")  # the owner token itself is untouched

    def test_a_sign_in_stays_in_its_tenant_and_role(self):
        a, b = Tenant(self.server), Tenant(self.server)
        b_agent = b.ok("POST", "/v1/agents", {"name": unique_name("b"), "model": "local"},
                       expect=201)
        browser, _, _ = sign_in(self.server, a.token)
        self.assertEqual(browser.request("GET", "/v1/agents")[1]["items"], [])
        for method, path in (("GET", "/v1/agents/%s" % b_agent["id"]),
                             ("DELETE", "/v1/agents/%s" % b_agent["id"]),
                             ("POST", "/v1/agents/%s/sessions" % b_agent["id"])):
            st, body, _ = browser.request(method, path, {} if method == "POST" else None)
            self.assertEqual(st, 404, (method, path, body))
        b.ok("GET", "/v1/agents/%s" % b_agent["id"])
        # Not the platform admin's routes either.
        self.assertError(browser.request("GET", "/v1/tenants"), 403, "permission_denied")
        # A guest's sign-in is a guest.
        guest_secret, _ = a.new_token("guest")
        guest, body, _ = sign_in(self.server, guest_secret)
        self.assertEqual(body["role"], "guest")
        self.assertError(guest.request("POST", "/v1/agents", {"name": "x", "model": "local"}),
                         403, "permission_denied")
        self.assertError(guest.request("GET", "/v1/tokens"), 403, "permission_denied")

    def test_forged_and_borrowed_cookies_are_refused(self):
        a = Tenant(self.server)
        # An API token in the cookie is not a sign-in: no cookie-only path around CSRF.
        self.assertError(Browser(self.server, a.token, "x").request("GET", "/v1/agents"),
                         401, "unauthenticated")
        for forged in ("keel_" + "A" * 43, "", "x" * 5000, "%00", "keel_session"):
            st, body, _ = Browser(self.server, forged).request("GET", "/v1/agents")
            self.assertEqual(st, 401, (forged[:20], body))
        # A sign-in's secret cannot sign in again (no endless chain of sign-ins).
        browser, _, _ = sign_in(self.server, a.token)
        st, body, h = self.server.request("POST", "/v1/dashboard/sign-in",
                                          {"token": browser.cookie}, token=None)
        self.assertEqual(st, 401, body)
        # A bearer token wins over the cookie: its own rights, no CSRF needed.
        b = Tenant(self.server)
        st, listed, _ = self.server.request(
            "GET", "/v1/agents", token=b.token,
            headers={"Cookie": "keel_session=%s" % browser.cookie})
        self.assertEqual(st, 200)
        self.assertEqual(listed["items"], [])
        # The session route reads sign-ins only: signed out without one, whatever else is sent.
        for st, body, _ in (a.request("GET", "/v1/dashboard/session"),
                            self.server.request("GET", "/v1/dashboard/session", token=None),
                            Browser(self.server, a.token).request("GET", "/v1/dashboard/session"),
                            Browser(self.server, "keel_" + "B" * 43).request(
                                "GET", "/v1/dashboard/session")):
            self.assertEqual((st, body), (200, {"signed_in": False}))
        self.assertError(browser.request("GET", "/v1/dashboard/session",
                                          headers={"Origin": "https://evil.example.net"}),
                         403, "permission_denied")
        self.assertError(a.request("POST", "/v1/dashboard/sign-out"), 400, "invalid_argument")

    def test_a_sign_in_racing_its_tokens_revocation_never_outlives_it(self):
        a = Tenant(self.server)
        for trial in range(4):
            secret, token_id = a.new_token("owner")
            results = []

            def attempt():
                results.append(self.server.request("POST", "/v1/dashboard/sign-in",
                                                   {"token": secret}, token=None))

            threads = [threading.Thread(target=attempt) for _ in range(24)]
            for i, t in enumerate(threads):
                t.start()
                if i == len(threads) // 2:
                    a.ok("DELETE", "/v1/tokens/%s" % token_id, expect=204)
            for t in threads:
                t.join()
            for st, body, h in results:
                if st != 201:
                    self.assertEqual(st, 401, body)
                    continue
                cookie, _ = cookie_of(h)
                browser = Browser(self.server, cookie, body["csrf_token"])
                self.assertError(browser.request("GET", "/v1/agents"), 401, "unauthenticated",
                                 "trial %d: a sign-in outlived its token" % trial)
                st, _, _ = self.server.request("GET", "/v1/agents", token=cookie)
                self.assertEqual(st, 401, "trial %d: its secret as a bearer token" % trial)

    def test_only_the_servers_own_pages_sign_in(self):
        a = Tenant(self.server)
        for origin in ("http://127.0.0.1:1", "https://evil.example.net", "null"):
            st, body, h = self.server.request("POST", "/v1/dashboard/sign-in", {"token": a.token},
                                              token=None, headers={"Origin": origin})
            self.assertEqual(st, 403, (origin, body))
            self.assertNotIn("set-cookie", h)
        st, body, h = self.server.request("POST", "/v1/dashboard/sign-in", token=None,
                                          raw_body='{"token": "%s"}' % a.token,
                                          headers={"Content-Type": "text/plain;charset=UTF-8"})
        self.assertEqual(st, 400, body)
        self.assertNotIn("set-cookie", h)
        # Its own page, over https (behind a TLS proxy passing Host): the cookie is Secure.
        st, body, h = self.server.request("POST", "/v1/dashboard/sign-in", {"token": a.token},
                                          token=None,
                                          headers={"Origin": "https://" + self.server.addr})
        self.assertEqual(st, 201, body)
        self.assertIn("Secure", cookie_of(h)[1])
        st, _, h = self.server.request("POST", "/v1/dashboard/sign-in", {"token": a.token},
                                       token=None, headers={"Host": "keel.example.com"})
        self.assertIn("Secure", cookie_of(h)[1])

    def test_two_session_cookies_are_refused(self):
        a, b = Tenant(self.server), Tenant(self.server)
        mine, _, _ = sign_in(self.server, a.token)
        planted, _, _ = sign_in(self.server, b.token)
        for header in ("keel_session=%s; keel_session=%s" % (planted.cookie, mine.cookie),
                       "keel_session=%s; keel_session=%s" % (mine.cookie, mine.cookie)):
            st, body, _ = self.server.request("GET", "/v1/agents", token=None,
                                              headers={"Cookie": header})
            self.assertEqual(st, 401, body)
            st, body, _ = self.server.request("GET", "/v1/dashboard/session", token=None,
                                              headers={"Cookie": header})
            self.assertEqual(body, {"signed_in": False})

    def test_a_token_has_at_most_twenty_sign_ins(self):
        a = Tenant(self.server)
        browsers = [sign_in(self.server, a.token)[0] for _ in range(21)]
        self.assertError(browsers[0].request("GET", "/v1/agents"), 401, "unauthenticated")
        for b in browsers[1:]:
            self.assertEqual(b.request("GET", "/v1/agents")[0], 200)
        live = [t for t in a.ok("GET", "/v1/tokens")["items"]
                if t["parent_id"] == a.token_id and t["revoked_at"] is None]
        self.assertEqual(len(live), 20)

    def test_streams_end_when_their_credential_does(self):
        a = Tenant(self.server)
        user, user_id = a.new_token("user")
        browser, _, _ = sign_in(self.server, a.token)
        cookie_stream = RawStream(self.server, "/v1/stream",
                                  {"Cookie": "keel_session=" + browser.cookie})
        token_stream = RawStream(self.server, "/v1/stream", {"Authorization": "Bearer " + user})
        for s in (cookie_stream, token_stream):
            self.assertEqual(s.status, 200)
        self.assertEqual(browser.request("POST", "/v1/dashboard/sign-out")[0], 204)
        a.ok("DELETE", "/v1/tokens/%s" % user_id, expect=204)
        for s in (cookie_stream, token_stream):
            self.assertTrue(s.closed_within(25), "a stream outlived its credential")

    def test_bad_sign_in_bodies(self):
        cases = [
            (None, 400), ("", 400), ("[]", 400), ("{\"token\": 5}", 400),
            ("{\"token\": \"\"}", 400), ("{\"token\": \"x\", \"role\": \"owner\"}", 400),
            ("{\"token\": \"nope\"}", 401), ("{", 400), ("[" * 200000 + "]" * 200000, 400),
        ]
        for raw, want in cases:
            st, body, h = self.server.request("POST", "/v1/dashboard/sign-in", token=None,
                                              raw_body=raw if raw is not None else b"")
            self.assertEqual(st, want, (str(raw)[:40], body))
            self.assertNotIn("set-cookie", h)
        big = "{\"token\": \"%s\"}" % ("k" * (2 << 20))
        st, _, h = self.server.request("POST", "/v1/dashboard/sign-in", token=None, raw_body=big)
        self.assertEqual(st, 413)
        self.assertHealthy()

    def test_the_dashboard_is_served_with_a_strict_policy(self):
        st, html, h = http_request(self.server.addr, "GET", "/", headers={"Accept": "text/html"})
        self.assertEqual(st, 200)
        self.assertTrue(h["content-type"].startswith("text/html"), h)
        csp = h["content-security-policy"]
        for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'",
                          "frame-ancestors 'none'", "base-uri 'none'"):
            self.assertIn(directive, csp)
        self.assertNotIn("unsafe", csp)
        self.assertEqual(h["x-content-type-options"], "nosniff")
        self.assertEqual(h["x-frame-options"], "DENY")
        self.assertNotRegex(html, r"<script(?![^>]*\bsrc=)[^>]*>", "an inline script")
        self.assertNotIn("<style", html)
        # Its files are served, compressed for browsers, cached for good, 304 when unchanged.
        assets = re.findall(r'(?:src|href)="(/assets/[^"]+)"', html)
        self.assertTrue(any(x.endswith(".js") for x in assets), html)
        for path in assets:
            st, _, h = http_request(self.server.addr, "GET", path,
                                    headers={"Accept-Encoding": "gzip, deflate, br"})
            self.assertEqual(st, 200, path)
            self.assertEqual(h.get("content-encoding"), "gzip")
            self.assertIn("immutable", h["cache-control"])
            st, _, _ = http_request(self.server.addr, "GET", path,
                                    headers={"If-None-Match": h["etag"]})
            self.assertEqual(st, 304, path)
        for path in ("/assets/../v1/agents", "/assets/%2e%2e%2fowner.token", "/assets/nope.js",
                     "/index.html.bak", "/assets/"):
            st, _, _ = http_request(self.server.addr, "GET", path)
            self.assertIn(st, (400, 404), path)


class DashboardSignInDurableTest(KeelTestCase):
    """A sign-in is a stored row: it outlives the process, and another node on the same
    PostgreSQL store takes it."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()
        cls.other = None

    @classmethod
    def tearDownClass(cls):
        if cls.other:
            cls.other.stop()
        cls.server.stop()

    def servers(self):
        return [s for s in (self.server, self.other) if s]

    def test_a_sign_in_survives_kill_9_and_holds_on_every_node(self):
        a = Tenant(self.server)
        browser, _, _ = sign_in(self.server, a.token)
        self.server.restart(kill=True)
        browser.server = self.server
        st, body, _ = browser.request("POST", "/v1/agents",
                                      {"name": unique_name("a"), "model": "local"})
        self.assertEqual(st, 201, body)
        if not (self.server.store_url or "").startswith(("postgres://", "postgresql://")):
            return
        type(self).other = KeelServer(store_url=self.server.store_url, token=self.server.token)
        there = Browser(self.other, browser.cookie, browser.csrf)
        st, listed, _ = there.request("GET", "/v1/agents")
        self.assertEqual(st, 200, listed)
        self.assertEqual([x["id"] for x in listed["items"]], [body["id"]])
        self.assertEqual(there.request("POST", "/v1/dashboard/sign-out")[0], 204)
        self.assertError(browser.request("GET", "/v1/agents"), 401, "unauthenticated")


if __name__ == "__main__":
    unittest.main()

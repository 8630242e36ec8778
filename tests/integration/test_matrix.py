"""The hostile-tenant matrix: every route the router knows, with every kind of caller.

The routes come from the server itself (`keel serve --print-routes`), so a route is covered the
day it is added, and the role each needs comes from docs/API.md (the role in its heading, read
by `role_table`): a route the document gives no heading fails the test until it has one. The
callers: the tenant's owner, a user, a guest, a revoked token, no token, and the owner of
another tenant. For each route and caller the test checks the status the role table says, and
that a refused request wrote nothing: no event appears in either tenant's log.

Objects named in paths are real objects of the first tenant (an agent, the owner's session and
run, a pending approval, a schedule, a memory, a skill, a plugin, a token); a guest did not
start that session, so it may not see it. Allowed callers are probed with GET only (a write by
an allowed caller would change the fixtures; the other test files cover what writes do).
"""

import os
import re
import subprocess
import tempfile
import unittest

from keel_harness import KeelServer, KeelTestCase, Tenant, keel_bin, unique_name

KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

PUBLIC, ANY, MEMBER, OWNER, ADMIN = "public", "any", "member", "owner", "admin"
RANK = {ANY: 0, MEMBER: 1, OWNER: 2, ADMIN: 3}

API_MD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "API.md")
ROLE_OF_HEADING = {"": ANY, "no auth": PUBLIC, "owner or user": MEMBER, "owner": OWNER,
                   "platform admin": ADMIN, "the platform admin's token": ADMIN}


def role_table(path=API_MD):
    """Who may call each route, as docs/API.md says it: every route has a `### ` heading that
    names it in backquotes (`METHOD /path`, several per heading allowed) and ends with the role
    after an em dash (`— owner`, `— owner or user`, `— platform admin`, `— no auth`); a heading
    without one is open to every role: owner, user and guest (a guest only on what it started,
    see `GUEST_OWN`). The first heading that names a route is its row (a later one, such as
    "Reassigning", narrows one body of the route and is covered by its own test)."""
    table = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("### "):
                continue
            routes = re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/[^` ?]*)[^`]*`", line)
            suffix = re.search(r" — (.*)$", line.rstrip("\n"))
            role = suffix.group(1) if suffix else ""
            if routes and role not in ROLE_OF_HEADING:
                raise ValueError("docs/API.md: unknown role in heading %r" % line.strip())
            for route in routes:
                table.setdefault(route, ROLE_OF_HEADING.get(role))
    return table


ROLE_TABLE = role_table()

# Routes on a session or run of someone else: a guest gets them only for what it started.
GUEST_OWN = {"/v1/sessions/{id}", "/v1/sessions/{id}/messages", "/v1/sessions/{id}/runs",
             "/v1/sessions/{id}/compactions", "/v1/runs/{id}", "/v1/runs/{id}/steps",
             "/v1/runs/{id}/cancel"}

# Path segments whose ids in the matrix name no object (their fixtures would need outside
# servers): an allowed caller gets 404 there, a refused one 403 or 404.
FAKE_OBJECTS = ("/v1/mcp-servers/{id}", "/v1/standing-approvals/{id}", "/deliveries/{delivery}")

# Routes whose answer is not a plain JSON request-response (they hold the connection).
STREAMING = {("GET", "/v1/stream"), ("GET", "/v1/mcp"), ("GET", "/v1/nodes/stream")}


def print_routes():
    home = tempfile.mkdtemp(prefix="keel-routes-")
    try:
        out = subprocess.run([keel_bin(), "serve", "--print-routes", "--home", home],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=60, check=True).stdout
    finally:
        subprocess.run(["rm", "-rf", home])
    routes = []
    for line in out.splitlines():
        method, pattern, auth = line.split()
        routes.append((method, pattern, auth == "auth"))
    return routes


class HostileTenantMatrixTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.routes = print_routes()
        cls.server = s = KeelServer(env={"KEEL_SECRET_KEK": KEK})
        cls.owner = s.token
        cls.user = s.ok("POST", "/v1/tokens", {"name": unique_name("user"), "role": "user"})["token"]
        cls.guest = s.ok("POST", "/v1/tokens", {"name": unique_name("guest"), "role": "guest"})["token"]
        revoked = s.ok("POST", "/v1/tokens", {"name": unique_name("revoked"), "role": "owner"})
        s.ok("DELETE", "/v1/tokens/" + revoked["id"])
        cls.revoked = revoked["token"]
        cls.spare_token = s.ok("POST", "/v1/tokens", {"name": unique_name("spare"), "role": "user"})["id"]
        cls.other = Tenant(s)
        # Dashboard sign-ins (cookies): the guest's, the other tenant's owner's, and one signed
        # out; each sent with its CSRF token, so that only the sign-in decides.
        cls.guest_cookie = cls.sign_in(cls.guest)
        cls.other_cookie = cls.sign_in(cls.other.token)
        cls.signed_out_cookie = cls.sign_in(cls.owner)
        st, body, _ = s.request("POST", "/v1/dashboard/sign-out", token=None,
                                headers=cls.cookie_headers(cls.signed_out_cookie))
        assert st == 204, (st, body)
        # The first tenant's objects, made by its owner.
        cls.agent = s.create_agent(tools=["time.now", "notes.append"])
        cls.session = s.create_session(cls.agent["id"])
        cls.owner_run = s.send(cls.session["id"], "hello")["run"]
        s.ok("PUT", "/v1/policy", {"rules": [
            {"tool": "*", "rights": ["read", "write"]},
            {"tool": "notes.append", "rights": ["write"], "approval": "always"}]})
        s.ok("PUT", "/v1/agents/%s/policy" % cls.agent["id"], {"rules": [
            {"tool": "*", "rights": ["read", "write"]}]})
        waiting = s.create_session(cls.agent["id"])
        parked = s.send(waiting["id"], '/call notes.append {"line": "x"}')["run"]
        cls.approval = s.ok("GET", "/v1/approvals?status=pending")["items"][0]
        assert cls.approval["run_id"] == parked["id"], cls.approval
        cls.schedule = s.ok("POST", "/v1/schedules", {
            "agent_id": cls.agent["id"], "prompt": "hi", "cron": "0 3 1 1 *", "timezone": "UTC"},
            expect=201)
        cls.memory = s.ok("POST", "/v1/agents/%s/memories" % cls.agent["id"],
                          {"text": "the matrix remembers"}, expect=201)
        skill_md = "---\nname: matrix-skill\ndescription: A skill.\n---\nBody.\n"
        cls.skill = s.ok("POST", "/v1/skills", {"files": {"SKILL.md": skill_md}},
                         expect=201)
        cls.plugin = s.ok("POST", "/v1/plugins", {
            "manifest": {"id": "matrix-plugin", "name": "Matrix", "version": "1.0.0",
                         "kind": "lua", "events": ["tool.before@v1"]},
            "source": "ctx.bus.on('tool.before@v1', function(call) end)"}, expect=201)
        s.ok("PUT", "/v1/secrets/MATRIX", {"value": "s3cr3t"})
        cls.channel = s.ok("POST", "/v1/agents/%s/channels" % cls.agent["id"], {
            "kind": "webhook", "name": "matrix-hook", "settings": {"signing_secret": "MATRIX"}},
            expect=201)
        cls.person = s.ok("POST", "/v1/users", {
            "name": "Matrix Person", "identities": [{"platform": "telegram",
                                                     "platform_user_id": "777"}]}, expect=201)
        s.ok("PUT", "/v1/agents/%s/members/%s" % (cls.agent["id"], cls.person["id"]),
             {"role": "user"})

    @classmethod
    def sign_in(cls, token):
        st, body, h = cls.server.request("POST", "/v1/dashboard/sign-in", {"token": token},
                                         token=None)
        assert st == 201, (st, body)
        return (re.match(r"keel_session=([^;]*)", h["set-cookie"]).group(1), body["csrf_token"])

    @staticmethod
    def cookie_headers(cookie):
        return {"Cookie": "keel_session=" + cookie[0], "X-Keel-CSRF": cookie[1]}

    def setUp(self):
        # Each test starts from the log as it is; a test's own refused requests must add nothing.
        self.marks = self.mark()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def path_of(self, pattern):
        values = {
            "agents": self.agent["id"], "sessions": self.session["id"], "runs": self.owner_run["id"],
            "approvals": self.approval["id"], "schedules": self.schedule["id"],
            "memories": self.memory["id"], "skills": self.skill.get("name", "matrix-skill"),
            "plugins": self.plugin.get("id", "matrix-plugin"), "tokens": self.spare_token,
            "channels": self.channel["id"], "hooks": self.channel["id"],
            "secrets": "MATRIX", "tenants": self.other.id, "mcp-servers": "01a00000-0000-7000-8000-000000000000",
            "standing-approvals": "01a00000-0000-7000-8000-000000000001",
            "deliveries": "01a00000-0000-7000-8000-000000000002",
            "users": self.person["id"], "members": self.person["id"],
            "identities": "telegram", "telegram": "777",
        }
        out, previous = [], None
        for segment in pattern.strip("/").split("/"):
            if segment.startswith("{"):
                if segment == "{memory}":
                    segment = self.memory["id"]
                elif segment == "{name}" and previous == "skills":
                    segment = self.skill.get("name", "matrix-skill")
                else:
                    segment = values[previous]
            out.append(segment)
            previous = segment
        path = "/" + "/".join(out)
        if pattern == "/v1/mcp" or pattern.startswith("/v1/mcp?"):
            path += "?agent=" + self.agent["id"]
        return path

    def mark(self):
        """The last event position each tenant sees now."""
        marks = []
        for ok in (self.server.ok, self.other.ok):
            after = 0
            while True:
                page = ok("GET", "/v1/events?after=%d&limit=500" % after)
                if not page["items"]:
                    break
                after = page["items"][-1]["position"]
            marks.append(after)
        return marks

    def assertNothingWritten(self, marks, where):
        for ok, after, tenant in ((self.server.ok, marks[0], "this tenant"),
                                  (self.other.ok, marks[1], "the other tenant")):
            new = ok("GET", "/v1/events?after=%d&limit=5" % after)["items"]
            self.assertEqual([e["type"] for e in new], [], "%s wrote into %s" % (where, tenant))

    def call(self, method, pattern, token):
        """`token`: a bearer token, or a dashboard sign-in (cookie, CSRF token)."""
        body = None if method in ("GET", "DELETE") else {"matrix_probe": True}
        kwargs = {"timeout": 10}
        if isinstance(token, tuple):
            kwargs["headers"] = self.cookie_headers(token)
            token = None
        return self.server.request(method, self.path_of(pattern), body, token=token, **kwargs)

    def test_every_route_is_in_the_role_table(self):
        missing = [(m, p) for m, p, _ in self.routes if (m, p) not in ROLE_TABLE]
        self.assertEqual(missing, [], "routes without a heading in docs/API.md")
        self.assertGreater(len(self.routes), 60)

    def test_no_token_and_revoked_tokens_get_401(self):
        for method, pattern, auth in self.routes:
            if not auth or (method, pattern) in STREAMING:
                continue
            for name, token in (("no token", None), ("revoked", self.revoked),
                                ("signed-out cookie", self.signed_out_cookie)):
                st, body, _ = self.call(method, pattern, token)
                self.assertEqual(st, 401, "%s %s with %s: %s %r" % (method, pattern, name, st, body))
        self.assertNothingWritten(self.marks, "a request without a valid token")

    def test_roles_below_the_table_are_refused_and_write_nothing(self):
        callers = (("user", self.user, 1), ("guest", self.guest, 0),
                   ("guest's cookie", self.guest_cookie, 0))
        for method, pattern, auth in self.routes:
            need = ROLE_TABLE.get((method, pattern))
            if need in (None, PUBLIC) or (method, pattern) in STREAMING:
                continue
            for name, token, rank in callers:
                refused = RANK[need] > rank or (name.startswith("guest") and pattern in GUEST_OWN)
                if not refused:
                    continue
                st, body, _ = self.call(method, pattern, token)
                # 403 or 404; or 400 for the probe's body, checked before the object is looked
                # up (the same answer whatever the id, so it tells nothing).
                expected = (403, 404) if method in ("GET", "DELETE") else (400, 403, 404)
                self.assertIn(st, expected, "%s %s as %s: %s %r" % (method, pattern, name, st, body))
                self.assertNothingWritten(self.marks, "%s %s as %s (refused)" % (method, pattern, name))

    def test_allowed_roles_can_read(self):
        callers = (("owner", self.owner, 3), ("user", self.user, 1), ("guest", self.guest, 0))
        for method, pattern, auth in self.routes:
            need = ROLE_TABLE.get((method, pattern))
            if method != "GET" or need in (None, PUBLIC) or (method, pattern) in STREAMING:
                continue
            for name, token, rank in callers:
                if RANK[need] > rank or (name == "guest" and pattern in GUEST_OWN):
                    continue
                st, body, _ = self.call(method, pattern, token)
                where = "%s %s as %s: %s %r" % (method, pattern, name, st, body)
                if any(fake in pattern for fake in FAKE_OBJECTS):
                    self.assertEqual(st, 404, where)  # allowed, and the id names nothing
                else:
                    self.assertNotIn(st, (401, 403, 404, 500), where)

    def test_another_tenants_owner_sees_nothing_of_this_one(self):
        mine = {self.agent["id"], self.session["id"], self.owner_run["id"], self.approval["id"],
                self.schedule["id"], self.memory["id"], self.channel["id"], self.person["id"]}
        for method, pattern, auth in self.routes:
            need = ROLE_TABLE.get((method, pattern))
            if not auth or need is None or (method, pattern) in STREAMING:
                continue
            for other in (self.other.token, self.other_cookie):
                if other is self.other_cookie and pattern == "/v1/dashboard/sign-out":
                    continue  # it would end the sign-in the rest of the loop uses
                self.check_other_tenant(method, pattern, need, other, mine)

    def check_other_tenant(self, method, pattern, need, other, mine):
        st, body, _ = self.call(method, pattern, other)
        where = "%s %s as another tenant's owner (%s): %s %r" % (
            method, pattern, "cookie" if isinstance(other, tuple) else "token", st, body)
        if need == ADMIN:
            self.assertEqual(st, 403, where)
        elif "{" in pattern and pattern != "/v1/secrets/{name}":
            # 404; or 400 for the probe's body, checked before the object is looked up
            # (the same answer whatever the id, so it tells nothing).
            self.assertIn(st, (404,) if method in ("GET", "DELETE") else (400, 404), where)
        if 200 <= st < 300:  # an error may quote the id the caller sent
            text = repr(body)
            for object_id in mine:
                self.assertNotIn(object_id, text, where)
        if "{" in pattern or method == "GET":
            new = self.server.ok("GET", "/v1/events?after=%d&limit=5" % self.marks[0])["items"]
            self.assertEqual(new, [], "%s wrote into this tenant" % where)


if __name__ == "__main__":
    unittest.main()

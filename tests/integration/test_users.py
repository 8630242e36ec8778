"""Users, identities, agent members and access levels (/v1/users, /v1/agents/{id}/members,
/v1/agents/{id}/access), and whom a Telegram channel (tests/fakes/fake_telegram.py) lets talk to
its agent, attacked: the routes' answers, events and validation (400, nothing written), roles
and tenants (403, 404, 401), codes shown once or never (not in an answer, an event, the log or
the store); private agents answer strangers with a notice, public ones make them guests,
protected ones let in who sends the code in a direct chat; in a group only owners are heard
unaddressed; the lower of the channel's and the member's role bounds tools; guests are rate
limited. Every answer a Tenant receives is checked for the access codes it set (`never`). Runs
on SQLite and, with KEEL_TEST_STORE=postgres, on PostgreSQL."""

import json
import os
import secrets
import subprocess
import sys
import time
import unittest

import keel_harness
from keel_harness import KeelServer, KeelTestCase, http_request, parse_time, wait_for

KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
BOT_ID = 7000001
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes", "fake_telegram.py")
ENDED = ("sent", "skipped", "unknown", "dead")
OPEN_FRAME = {"rules": [{"tool": "*", "rights": ["read", "write"], "approval": "never"}]}
DEEP = 200000
NOT_MEMBER = ("This agent talks only with its members: ask its owner to add you "
              "(you are telegram:%d).")
NEEDS_CODE = "This agent needs an access code: send it as your message."
GRANTED = "Access granted: you can talk to this agent now."
TOO_FAST = "You are writing faster than this agent takes messages from guests: wait a minute."
ALLOWANCE = ("You have used today's allowance of this agent for guests (%d tokens); it renews "
             "at 00:00 UTC.")
SERVER = None


def setUpModule():
    global SERVER
    SERVER = KeelServer(env={"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": "127.0.0.1/32"})


def tearDownModule():
    SERVER.stop()


def said(text):
    return 'You said: "%s"' % text


def ident(platform, pid):
    return {"platform": platform, "platform_user_id": str(pid)}


def pairs(user):
    return sorted((i["platform"], i["platform_user_id"]) for i in user["identities"])


class FakeTelegram:
    """tests/fakes/fake_telegram.py in a process of its own, and its control endpoints."""

    def __init__(self):
        self.token = "%d:AA%s" % (BOT_ID, secrets.token_urlsafe(24))
        self.proc = subprocess.Popen([sys.executable, FAKE, "--token", self.token,
                                      "--bot-id", str(BOT_ID)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().strip())
        self.api_base = "http://127.0.0.1:%d" % self.port

    def control(self, method, path, body=None):
        st, data, _ = http_request("127.0.0.1:%d" % self.port, method, path, body=body)
        assert st == 200, "fake %s %s -> %s %r" % (method, path, st, data)
        return data

    def message(self, chat_id, text, **kw):
        """Queues a text message; returns its update_id."""
        return self.control("POST", "/_message", dict(kw, chat_id=chat_id, text=text))["update_id"]

    def group(self, chat_id, text, **kw):
        kw.setdefault("chat_type", "supergroup")
        return self.message(chat_id, text, **kw)

    def updates(self, *updates):
        return self.control("POST", "/_updates", {"updates": list(updates)})["update_ids"]

    def sent(self):
        return self.control("GET", "/_sent")

    def to(self, chat_id):
        return [m["_text"] for m in self.sent()["messages"] if m["chat_id"] == chat_id]

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


def private_update(update_id, from_id, text, first_name, last_name=None):
    sender = {"id": from_id, "is_bot": False, "first_name": first_name}
    if last_name:
        sender["last_name"] = last_name
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "text": text, "from": sender,
        "chat": {"id": from_id, "type": "private", "first_name": first_name}}}


class Tenant(keel_harness.Tenant):
    """A tenant with a user and a guest token. Every answer it receives is checked for the
    values in `never` (access codes)."""

    def __init__(self, server):
        self.never = []
        super().__init__(server)
        self.user, _ = self.new_token("user")
        self.guest, _ = self.new_token("guest")

    def request(self, method, path, body=None, token=None, **kw):
        resp = self.server.request(method, path, body=body, token=token or self.token, **kw)
        text = resp[1] if isinstance(resp[1], str) else json.dumps(resp[1])
        for value in self.never:
            assert value not in text, "%s %s: the answer holds a code: %s" % (method, path, text)
        return resp

    def ok(self, method, path, body=None, expect=(200, 201, 204), token=None, **kw):
        st, data, _ = self.request(method, path, body, token=token, **kw)
        expect = (expect,) if isinstance(expect, int) else expect
        assert st in expect, "%s %s -> %s (expected %s): %r" % (method, path, st, expect, data)
        return data

    def pages(self, path, token=None):
        items, cursor = [], None
        while True:
            sep = "&" if "?" in path else "?"
            data = self.ok("GET", path + (sep + "cursor=" + cursor if cursor else ""), token=token)
            items += data["items"]
            cursor = data.get("next_cursor")
            if not cursor:
                return items

    def agent(self, **kw):
        return self.server.create_agent(token=self.token, **kw)

    def person(self, name, *identities):
        body = {"name": name}
        if identities:
            body["identities"] = [ident(p, i) for p, i in identities]
        return self.ok("POST", "/v1/users", body, expect=201)

    def member(self, agent, user, role):
        return self.ok("PUT", "/v1/agents/%s/members/%s" % (agent["id"], user["id"]),
                       {"role": role}, expect=200)

    def members(self, agent):
        return {m["user_id"]: m["role"] for m in self.pages("/v1/agents/%s/members" % agent["id"])}

    def roles(self, user):
        got = self.ok("GET", "/v1/users/" + user["id"], expect=200)
        return {r["agent_id"]: r["role"] for r in got["roles"]}

    def all_events(self):
        return self.server.all_events(token=self.token)

    def events(self, kind, since=0):
        return [e["payload"] for e in self.all_events()[since:] if e["type"] == kind]

    def bot(self, fake, level=None, code=None, tools=None, **settings):
        """A new agent (its access level set first) and a telegram channel polling `fake`."""
        agent = self.agent(tools=tools)
        if level:
            body = {"level": level}
            if code:
                self.never.append(code)
                body["code"] = code
            self.ok("PUT", "/v1/agents/%s/access" % agent["id"], body, expect=200)
        name = "TG_" + os.urandom(6).hex().upper()
        self.ok("PUT", "/v1/secrets/" + name, {"value": fake.token}, expect=204)
        ch = self.ok("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "telegram", "name": "tg", "settings": dict(
                {"bot_token": name, "api_base": fake.api_base, "poll_timeout": 1}, **settings)},
            expect=201)
        return agent, ch

    def replies(self, ch):
        return {r["delivery_id"]: r for r in self.pages("/v1/channels/%s/replies" % ch["id"])}

    def wait_reply(self, ch, update_id, statuses=ENDED, timeout=30):
        return wait_for(lambda: (lambda r: r if r and r["status"] in statuses else None)(
            self.replies(ch).get(str(update_id))), timeout,
            "the reply to update %s %s" % (update_id, "/".join(statuses)))

    def sessions(self, agent):
        return {s["title"]: s for s in self.pages("/v1/agents/%s/sessions" % agent["id"])}

    def said_in(self, session):
        return [m["content"] for m in self.pages("/v1/sessions/%s/messages" % session["id"])
                if m["role"] == "user"]


# ---------------------------------------------------------------------------------- the API


class UsersApiTest(KeelTestCase):
    def setUp(self):
        self.server = SERVER
        self.t = Tenant(SERVER)

    def test_users_are_created_listed_shown_and_renamed(self):
        t = self.t
        ann = t.person("Ann", ("telegram", 42))
        self.assertEqual(sorted(ann), ["created_at", "id", "identities", "merged_into", "name",
                                       "updated_at"])
        self.assertEqual((ann["name"], ann["merged_into"]), ("Ann", None))
        [i] = ann["identities"]
        self.assertEqual(sorted(i), ["created_at", "name", "platform", "platform_user_id"])
        self.assertEqual((i["platform"], i["platform_user_id"]), ("telegram", "42"))
        for value in (ann["created_at"], ann["updated_at"], i["created_at"]):
            self.assertTime(value)
        self.assertEqual((bob := t.person("Bob"))["identities"], [])
        cy = t.person("x" * 200, ("slack", "U0CY"), ("discord", "80351110224678912"),
                      ("telegram", "A-z.0_9" + "9" * 57))
        self.assertEqual(len(cy["identities"]), 3)
        ids = [ann["id"], bob["id"], cy["id"]]
        listed = t.pages("/v1/users?limit=1")
        self.assertEqual([u["id"] for u in listed], sorted(ids), "paged by id, each once")
        self.assertEqual({u["id"]: u for u in listed}[ann["id"]], ann)
        self.assertEqual(t.ok("GET", "/v1/users/" + ann["id"]), dict(ann, roles=[]))
        since = len(t.all_events())
        renamed = t.ok("PATCH", "/v1/users/" + ann["id"], {"name": "Ann Lee"}, expect=200)
        self.assertEqual(renamed, dict(ann, name="Ann Lee", updated_at=renamed["updated_at"]))
        self.assertGreaterEqual(parse_time(renamed["updated_at"]), parse_time(ann["updated_at"]))
        self.assertEqual(t.ok("GET", "/v1/users/" + ann["id"])["name"], "Ann Lee")
        self.assertEqual(t.events("user.updated@v1", since), [{"user_id": ann["id"],
                                                              "name": "Ann Lee"}])
        created = t.events("user.created@v1")
        self.assertEqual(sorted(p["user_id"] for p in created), sorted(ids))
        self.assertEqual(len(t.events("identity.linked@v1")), 4)
        for method, body in (("GET", None), ("PATCH", {"name": "X"})):
            self.assertError(t.request(method, "/v1/users/no-such-user", body), 404, "not_found")

    def test_identities_are_linked_once_and_unlinked_by_their_holder(self):
        t = self.t
        ann, bob = t.person("Ann", ("telegram", 42)), t.person("Bob")
        n_events = len(t.all_events())
        held = ident("telegram", 42)
        for path, body in (("/v1/users/%s/identities" % bob["id"], held),
                           ("/v1/users", {"name": "Eve", "identities": [held]}),
                           ("/v1/users", {"name": "Eve", "identities": [ident("slack", "U7"),
                                                                        held]})):
            err = self.assertError(t.request("POST", path, body), 409, "conflict", path)
            self.assertIn(ann["id"], err["message"], "the 409 names the holder")
        self.assertError(t.request("POST", "/v1/users", {"name": "Eve", "identities": [
            ident("telegram", 7), ident("telegram", 7)]}), 400, "invalid_argument",
            "one id twice")
        self.assertEqual(len(t.pages("/v1/users")), 2, "a refused user was written")
        self.assertEqual(len(t.all_events()), n_events, "a refused link wrote events")
        bobs = "/v1/users/%s/identities" % bob["id"]
        linked = t.ok("POST", bobs, ident("slack", "U0BOB"), expect=201)
        self.assertEqual((linked["platform"], linked["platform_user_id"]), ("slack", "U0BOB"))
        self.assertTime(linked["created_at"])
        # The same id on another platform is another identity.
        t.ok("POST", bobs, ident("discord", 42), expect=201)
        self.assertEqual(pairs(t.ok("GET", "/v1/users/" + bob["id"])),
                         [("discord", "42"), ("slack", "U0BOB")])
        # Only the holder unlinks an identity.
        for user, platform, pid in ((ann, "slack", "U0BOB"), (bob, "telegram", "42"),
                                    (bob, "slack", "U0NOONE")):
            self.assertError(t.request("DELETE", "/v1/users/%s/identities/%s/%s"
                                       % (user["id"], platform, pid)), 404, "not_found")
        self.assertEqual(pairs(t.ok("GET", "/v1/users/" + ann["id"])), [("telegram", "42")])
        since = len(t.all_events())
        t.ok("DELETE", bobs + "/slack/U0BOB", expect=204)
        self.assertError(t.request("DELETE", bobs + "/slack/U0BOB"), 404, "not_found")
        self.assertEqual(t.events("identity.unlinked@v1", since), [
            {"user_id": bob["id"], "platform": "slack", "platform_user_id": "U0BOB"}])
        t.ok("POST", "/v1/users/%s/identities" % ann["id"], ident("slack", "U0BOB"), expect=201)
        self.assertEqual(pairs(t.ok("GET", "/v1/users/" + ann["id"])),
                         [("slack", "U0BOB"), ("telegram", "42")])
        self.assertEqual(pairs(t.ok("GET", "/v1/users/" + bob["id"])), [("discord", "42")])
        self.assertError(t.request("POST", "/v1/users/no-such-user/identities",
                                   ident("slack", "U9")), 404, "not_found")

    def test_a_merge_moves_identities_and_roles_and_the_higher_role_wins(self):
        t = self.t
        a1, a2, a3 = t.agent(), t.agent(), t.agent()
        ann = t.person("Ann", ("telegram", 1))
        bob = t.person("Bob", ("telegram", 2), ("slack", "U0BOB"))
        for agent, user, role in ((a1, ann, "guest"), (a1, bob, "owner"), (a2, ann, "user"),
                                  (a2, bob, "guest"), (a3, bob, "user")):
            t.member(agent, user, role)
        since = len(t.all_events())
        kept = t.ok("POST", "/v1/users/%s/merge" % ann["id"], {"from": bob["id"]}, expect=200)
        self.assertEqual((kept["id"], kept["name"], kept["merged_into"]), (ann["id"], "Ann", None))
        self.assertEqual(pairs(kept), [("slack", "U0BOB"), ("telegram", "1"), ("telegram", "2")])
        want = {a1["id"]: "owner", a2["id"]: "user", a3["id"]: "user"}
        self.assertEqual(t.roles(ann), want)
        for agent in (a1, a2, a3):
            self.assertEqual(t.members(agent), {ann["id"]: want[agent["id"]]})
        gone = t.ok("GET", "/v1/users/" + bob["id"])
        self.assertEqual((gone["merged_into"], gone["identities"], gone["roles"]),
                         (ann["id"], [], []))
        self.assertEqual(t.events("user.merged@v1", since),
                         [{"user_id": bob["id"], "into": ann["id"]}])
        cy = t.person("Cy")
        n_events = len(t.all_events())
        for into, source in ((ann, ann), (ann, bob), (cy, bob), (bob, cy)):
            self.assertError(t.request("POST", "/v1/users/%s/merge" % into["id"],
                                       {"from": source["id"]}), 400, "invalid_argument",
                             "merge %s into %s" % (source["name"], into["name"]))
        self.assertError(t.request("POST", "/v1/users/%s/identities" % bob["id"],
                                   ident("telegram", 3)), 400, "invalid_argument")
        self.assertError(t.request("PUT", "/v1/agents/%s/members/%s" % (a1["id"], bob["id"]),
                                   {"role": "owner"}), 400, "invalid_argument")
        self.assertError(t.request("POST", "/v1/users/%s/merge" % cy["id"],
                                   {"from": "no-such-user"}), 404, "not_found")
        self.assertEqual(len(t.all_events()), n_events, "a refused merge wrote")
        self.assertEqual(t.ok("GET", "/v1/users/" + cy["id"])["merged_into"], None)

    def test_members_are_set_listed_and_removed(self):
        t = self.t
        agent, other, dead = t.agent(), t.agent(), t.agent()
        ann, bob = t.person("Ann"), t.person("Bob")
        since = len(t.all_events())
        m = t.member(agent, ann, "user")
        self.assertEqual(sorted(m), ["agent_id", "created_at", "name", "role", "updated_at",
                                     "user_id"])
        self.assertEqual((m["agent_id"], m["user_id"], m["name"], m["role"]),
                         (agent["id"], ann["id"], "Ann", "user"))
        up = t.member(agent, ann, "owner")
        self.assertEqual((up["role"], up["created_at"]), ("owner", m["created_at"]))
        t.member(agent, bob, "guest")
        listed = t.pages("/v1/agents/%s/members?limit=1" % agent["id"])
        self.assertEqual(sorted((x["user_id"], x["name"], x["role"]) for x in listed),
                         sorted([(ann["id"], "Ann", "owner"), (bob["id"], "Bob", "guest")]))
        self.assertEqual(t.members(other), {})
        self.assertEqual(t.roles(ann), {agent["id"]: "owner"})
        t.ok("DELETE", "/v1/agents/" + dead["id"], expect=(200, 202, 204))
        n_events = len(t.all_events())
        path = "/v1/agents/%s/members/%s" % (agent["id"], bob["id"])
        for bad in ({"role": "admin"}, {"role": "Owner"}, {"role": ""}, {"role": 1}, {},
                    {"role": "user", "until": 5}):
            self.assertError(t.request("PUT", path, bad), 400, "invalid_argument", repr(bad))
        for method, p in (("PUT", "/v1/agents/no-such-agent/members/" + bob["id"]),
                          ("PUT", "/v1/agents/%s/members/no-such-user" % agent["id"]),
                          ("PUT", "/v1/agents/%s/members/%s" % (dead["id"], bob["id"])),
                          ("GET", "/v1/agents/no-such-agent/members"),
                          ("GET", "/v1/agents/%s/members" % dead["id"]),
                          ("DELETE", "/v1/agents/%s/members/%s" % (agent["id"], "no-such-user"))):
            self.assertError(t.request(method, p, {"role": "user"} if method == "PUT" else None),
                             404, "not_found", "%s %s" % (method, p))
        self.assertEqual(len(t.all_events()), n_events, "a refused member change wrote")
        self.assertEqual(t.members(agent), {ann["id"]: "owner", bob["id"]: "guest"})
        t.ok("DELETE", path, expect=204)
        self.assertError(t.request("DELETE", path), 404, "not_found", "removed twice")
        self.assertEqual(t.members(agent), {ann["id"]: "owner"})
        self.assertEqual(t.roles(bob), {})
        self.assertEqual([(p["user_id"], p["role"]) for p in t.events("agent.member_set@v1",
                                                                      since)],
                         [(ann["id"], "user"), (ann["id"], "owner"), (bob["id"], "guest")])
        self.assertEqual([p["user_id"] for p in t.events("agent.member_removed@v1", since)],
                         [bob["id"]])

    def test_access_levels_and_codes_shown_once_or_never(self):
        t = self.t
        agent = t.agent()
        path = "/v1/agents/%s/access" % agent["id"]
        self.assertEqual(t.ok("GET", path), {"agent_id": agent["id"], "level": "private",
                                             "code_set": False, "guest_daily_tokens": 200000,
                                             "updated_at": None})
        since = len(t.all_events())
        pub = t.ok("PUT", path, {"level": "public"})
        self.assertEqual((pub["agent_id"], pub["level"], pub["code_set"]),
                         (agent["id"], "public", False))
        self.assertNotIn("code", pub)
        self.assertTime(pub["updated_at"])
        made = t.ok("PUT", path, {"level": "protected"})  # no code yet: Keel makes one
        code = made.get("code")
        self.assertRegex(code or "", r"^[a-z0-9]{12}$", made)
        self.assertEqual((made["level"], made["code_set"]), ("protected", True))
        t.never.append(code)
        shown = t.ok("GET", path)
        self.assertEqual(sorted(shown), ["agent_id", "code_set", "guest_daily_tokens", "level",
                                         "updated_at"])
        self.assertEqual((shown["level"], shown["code_set"]), ("protected", True))
        self.assertNotIn("code", t.ok("PUT", path, {"level": "protected"}), "a code shown twice")
        fresh = t.ok("PUT", path, {"level": "protected", "new_code": True})
        self.assertRegex(fresh.get("code", ""), r"^[a-z0-9]{12}$", fresh)
        self.assertNotEqual(fresh["code"], code)
        t.never.append(fresh["code"])
        given = "correct horse " + os.urandom(6).hex()
        t.never.append(given)
        kept = t.ok("PUT", path, {"level": "protected", "code": given})
        self.assertEqual((kept["level"], kept["code_set"], "code" in kept),
                         ("protected", True, False))
        before, n_events = t.ok("GET", path), len(t.all_events())
        pr = "protected"
        for body in ({"level": "open"}, {"guest_daily_tokens": -1}, {"level": 1},
                     {"guest_daily_tokens": 1.5}, {"guest_daily_tokens": "100"},
                     {"guest_daily_tokens": 10 ** 13}, {"guest_daily_tokens": None},
                     {"level": pr, "code": "1234567"}, {"level": pr, "code": "c" * 129},
                     {"level": pr, "code": "abcdefghij "}, {"level": pr, "code": 12345678},
                     {"level": pr, "new_code": "yes"},
                     {"level": pr, "code": "abcdefghij", "new_code": True},
                     {"level": "public", "codes": "abcdefghij"}):
            self.assertError(t.request("PUT", path, body), 400, "invalid_argument", repr(body))
        self.assertEqual(t.ok("GET", path), before, "a refused access change was written")
        self.assertEqual(len(t.all_events()), n_events)
        changed = t.events("agent.access_changed@v1", since)
        self.assertEqual([(p["level"], p["code_changed"]) for p in changed],
                         [("public", False), ("protected", True), ("protected", False),
                          ("protected", True), ("protected", True)])
        # The level stays when only the allowance changes, and the allowance when only the level
        # does.
        allowance = t.ok("PUT", path, {"guest_daily_tokens": 5000})
        self.assertEqual((allowance["level"], allowance["code_set"],
                          allowance["guest_daily_tokens"]), ("protected", True, 5000))
        self.assertEqual(t.ok("PUT", path, {"level": "public"})["guest_daily_tokens"], 5000)
        self.assertEqual(t.events("agent.access_changed@v1", since)[-1]["guest_daily_tokens"],
                         5000)
        for method in ("GET", "PUT"):
            self.assertError(t.request(method, "/v1/agents/no-such-agent/access",
                                       {"level": "public"} if method == "PUT" else None),
                             404, "not_found")
        # The codes are nowhere: events (checked by the Tenant), the log, the store at rest.
        with open(SERVER.stderr_path, "rb") as f:
            log = f.read()
        stored = SERVER.store_contents()
        for value in t.never:
            self.assertNotIn(value.encode(), log, "the server's log holds an access code")
            for label, data in stored:
                self.assertNotIn(value.encode(), data, "%s holds an access code" % label)

    def test_bad_bodies_are_400_and_write_nothing(self):
        t = self.t
        ann, agent = t.person("Ann", ("telegram", 1)), t.agent()
        users, n_events = t.pages("/v1/users"), len(t.all_events())
        deep = "[" * DEEP + "]" * DEEP
        for method, path in (("POST", "/v1/users"), ("PATCH", "/v1/users/" + ann["id"]),
                             ("POST", "/v1/users/%s/identities" % ann["id"]),
                             ("POST", "/v1/users/%s/merge" % ann["id"]),
                             ("PUT", "/v1/agents/%s/members/%s" % (agent["id"], ann["id"])),
                             ("PUT", "/v1/agents/%s/access" % agent["id"])):
            for raw in (deep, '{"name": "X", "identities": %s}' % deep, "[]", '"Ann"', "null",
                        "42", '{"name": "X"', ""):
                st, body, _ = t.request(method, path, raw_body=raw)
                self.assertEqual(st, 400, "%s %s with %r: %s %r"
                                 % (method, path, raw[:20], st, str(body)[:200]))
            self.assertHealthy()

        def one(*ids):
            return {"name": "Eve", "identities": list(ids)}
        tg = [ident("telegram", x) for x in ("a/b", "9" * 65, "", "4 2", "4%2F2")]
        for body in ([{}, {"name": ""}, {"name": "x" * 201}, {"name": "a\nb"}, {"name": "a\rb"},
                      {"name": 7}, {"name": None}, {"name": "Eve", "email": "e@example.com"},
                      one(ident("irc", 5)), one(ident("Telegram", 5)),
                      one({"platform": "telegram", "platform_user_id": 42}),
                      one(dict(ident("telegram", 5), name="x")), one("telegram:5"),
                      {"name": "Eve", "identities": {}},
                      one(*[ident("telegram", i) for i in range(17)]),
                      one(ident("telegram", 500), ident("telegram", "a/b"))] +
                     [one(i) for i in tg]):
            self.assertError(t.request("POST", "/v1/users", body), 400, "invalid_argument",
                             repr(body)[:80])
        for body in [ident("irc", 5), ident("slack", "U" * 65),
                     dict(ident("slack", "U1"), user_id=ann["id"])] + tg:
            self.assertError(t.request("POST", "/v1/users/%s/identities" % ann["id"], body),
                             400, "invalid_argument", repr(body)[:80])
        for body in ({"name": ""}, {"name": "x" * 201}, {"name": "Ann", "identities": []}):
            self.assertError(t.request("PATCH", "/v1/users/" + ann["id"], body), 400,
                             "invalid_argument", repr(body)[:40])
        self.assertError(t.request("POST", "/v1/users/%s/merge" % ann["id"],
                                   {"from": ann["id"], "into": "x"}), 400, "invalid_argument")
        self.assertEqual(t.pages("/v1/users"), users, "a refused body wrote")
        self.assertEqual(len(t.all_events()), n_events, "a refused body wrote events")
        self.assertEqual(t.members(agent), {})
        self.assertEqual(t.ok("GET", "/v1/agents/%s/access" % agent["id"])["level"], "private")
        # 16 identities is the most, not too many.
        t.ok("POST", "/v1/users", one(*[ident("discord", i) for i in range(16)]), expect=201)


class RolesTest(KeelTestCase):
    def test_users_read_guests_nothing_other_tenants_404_revoked_401(self):
        self.server = SERVER
        t, other = Tenant(SERVER), Tenant(SERVER)
        agent, ann, bob = t.agent(), t.person("Ann", ("telegram", 9)), t.person("Bob")
        t.member(agent, ann, "user")
        uid, aid = ann["id"], agent["id"]
        members, access = "/v1/agents/%s/members" % aid, "/v1/agents/%s/access" % aid
        reads = ["/v1/users/" + uid, members, access]
        writes = [("PATCH", "/v1/users/" + uid, {"name": "X"}),
                  ("POST", "/v1/users/%s/identities" % uid, ident("slack", "U1")),
                  ("DELETE", "/v1/users/%s/identities/telegram/9" % uid, None),
                  ("POST", "/v1/users/%s/merge" % uid, {"from": bob["id"]}),
                  ("PUT", members + "/" + uid, {"role": "owner"}),
                  ("DELETE", members + "/" + uid, None),
                  ("PUT", access, {"level": "public"})]
        snapshot = [t.ok("GET", p) for p in reads + ["/v1/users"]]
        for path in reads + ["/v1/users"]:
            self.assertEqual(t.ok("GET", path, token=t.user), t.ok("GET", path), path)
            self.assertError(t.request("GET", path, token=t.guest), 403, "permission_denied")
        for method, path, body in writes + [("POST", "/v1/users", {"name": "X"})]:
            for token in (t.user, t.guest):
                self.assertError(t.request(method, path, body, token=token), 403,
                                 "permission_denied", "%s %s" % (method, path))
        theirs, their_agent = other.person("Theirs"), other.agent()
        for method, path, body in [("GET", p, None) for p in reads] + writes + [
                ("POST", "/v1/users/%s/merge" % theirs["id"], {"from": uid}),
                ("PUT", "/v1/agents/%s/members/%s" % (their_agent["id"], uid), {"role": "user"}),
                ("PUT", "/v1/agents/%s/members/%s" % (aid, theirs["id"]), {"role": "user"}),
                ("GET", "/v1/users/%s" % bob["id"], None)]:
            self.assertError(other.request(method, path, body), 404, "not_found",
                             "%s %s as another tenant" % (method, path))
        self.assertEqual([u["id"] for u in other.pages("/v1/users")], [theirs["id"]])
        # Identities are a tenant's: another tenant's telegram:9 is another person.
        other.ok("POST", "/v1/users/%s/identities" % theirs["id"], ident("telegram", 9),
                 expect=201)
        self.assertEqual([t.ok("GET", p) for p in reads + ["/v1/users"]], snapshot)
        revoked, revoked_id = t.new_token("owner")
        t.ok("DELETE", "/v1/tokens/" + revoked_id, expect=(200, 204))
        for method, path, body in (("GET", "/v1/users", None), ("POST", "/v1/users", {"name": "X"}),
                                   ("PUT", access, {"level": "public"}), ("GET", members, None)):
            self.assertError(t.request(method, path, body, token=revoked), 401,
                             "unauthenticated", "%s %s with a revoked token" % (method, path))
        self.assertEqual(t.ok("GET", access)["level"], "private")


class PersonTokenTest(KeelTestCase):
    """A token of a user: on an agent, the lower of its role and the user's there; an agent the
    user has no role on (and that is not public) does not exist for it; the tenant's other
    routes reach no further than a guest's."""

    def token_of(self, t, user, role):
        got = t.ok("POST", "/v1/tokens", {"name": "person", "role": role, "user_id": user["id"]},
                   expect=201)
        self.assertEqual(got["user_id"], user["id"])
        return got["token"], got["id"]

    def test_a_persons_token_has_the_lower_role_and_reaches_only_its_agents(self):
        self.server = SERVER
        t, other = Tenant(SERVER), Tenant(SERVER)
        mine, theirs, open_to_all = t.agent(tools=["notes.append"]), t.agent(), t.agent()
        t.ok("PUT", "/v1/agents/%s/access" % open_to_all["id"], {"level": "public"})
        ann = t.person("Ann")
        t.member(mine, ann, "user")
        tok, tok_id = self.token_of(t, ann, "owner")
        # Created for a user of this tenant that is not merged; listed with it.
        for body in ({"name": "x", "role": "user", "user_id": other.person("Eve")["id"]},
                     {"name": "x", "role": "user", "user_id": "nope"},
                     {"name": "x", "role": "user", "user_id": 5}):
            self.assertError(t.request("POST", "/v1/tokens", body), 400, "invalid_argument")
        [listed] = [x for x in t.ok("GET", "/v1/tokens")["items"] if x["id"] == tok_id]
        self.assertEqual(listed["user_id"], ann["id"])
        # On its agent: a user's reach (the lower of owner and user).
        path = "/v1/agents/%s" % mine["id"]
        self.assertEqual(t.ok("GET", path, token=tok)["id"], mine["id"])
        self.assertError(t.request("PATCH", path, {"name": "x"}, token=tok), 403,
                         "permission_denied")
        t.ok("POST", path + "/memories", {"text": "a user may write this"}, expect=201, token=tok)
        session = t.ok("POST", path + "/sessions", {"title": "s"}, expect=201, token=tok)
        self.assertEqual(t.ok("GET", "/v1/sessions/" + session["id"], token=tok)["id"],
                         session["id"])
        # Promoted, it is an owner there; demoted to guest, a guest.
        t.member(mine, ann, "owner")
        t.ok("PATCH", path, {"name": mine["name"] + "-renamed"}, token=tok)
        t.member(mine, ann, "guest")
        self.assertError(t.request("POST", path + "/memories", {"text": "x"}, token=tok), 403,
                         "permission_denied")
        # An agent it has no role on is not found, with its sessions; a public one as a guest.
        their_session = SERVER.create_session(theirs["id"], token=t.token)
        for method, p, body in (("GET", "/v1/agents/" + theirs["id"], None),
                                ("POST", "/v1/agents/%s/sessions" % theirs["id"], {}),
                                ("GET", "/v1/sessions/" + their_session["id"], None),
                                ("POST", "/v1/sessions/%s/messages" % their_session["id"],
                                 {"content": "hi"}),
                                ("GET", "/v1/agents/%s/members" % theirs["id"], None)):
            self.assertError(t.request(method, p, body, token=tok), 404, "not_found", p)
        their_memory = t.ok("POST", "/v1/agents/%s/memories" % theirs["id"], {"text": "theirs"},
                            expect=201)
        err = self.assertError(t.request("GET", "/v1/memories/" + their_memory["id"],
                                         token=tok), 404, "not_found")
        self.assertEqual(err["message"], "memory not found: " + their_memory["id"])
        t.ok("POST", "/v1/agents/%s/sessions" % open_to_all["id"], {}, expect=201, token=tok)
        self.assertError(t.request("POST", "/v1/agents/%s/memories" % open_to_all["id"],
                                   {"text": "x"}, token=tok), 403, "permission_denied")
        # Lists and the front doors name only what it reaches.
        listed = {a["id"] for a in t.pages("/v1/agents", token=tok)}
        self.assertEqual(listed, {mine["id"], open_to_all["id"]})
        models = {m["id"] for m in t.ok("GET", "/v1/models", token=tok)["data"]}
        self.assertNotIn(theirs["name"], models)
        st, body, _ = t.request("POST", "/v1/chat/completions", {
            "model": theirs["name"], "messages": [{"role": "user", "content": "hi"}]}, token=tok)
        self.assertEqual(st, 404, body)
        st, body, _ = t.request("POST", "/v1/mcp?agent=" + theirs["id"], {
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "x", "version": "1"}}}, token=tok,
            headers={"Accept": "application/json, text/event-stream"})
        self.assertIn("error", body if isinstance(body, dict) else json.loads(body), body)
        # The tenant's own routes: no further than a guest (no tokens, secrets, policies).
        for method, p, body in (("POST", "/v1/tokens", {"name": "x", "role": "owner"}),
                                ("GET", "/v1/tokens", None), ("GET", "/v1/secrets", None),
                                ("PUT", "/v1/policy", {"rules": []}),
                                ("POST", "/v1/users", {"name": "x"})):
            self.assertError(t.request(method, p, body, token=tok), 403, "permission_denied", p)
        # Merged away, its user is the one it went to.
        bob = t.person("Bob")
        t.member(mine, bob, "owner")
        t.ok("POST", "/v1/users/%s/merge" % bob["id"], {"from": ann["id"]})
        t.ok("PATCH", path, {"name": mine["name"] + "-again"}, token=tok)
        # Another tenant's owner cannot give its token this tenant's user.
        self.assertError(other.request("POST", "/v1/tokens", {
            "name": "x", "role": "owner", "user_id": bob["id"]}), 400, "invalid_argument")


    def test_a_persons_schedule_posts_with_its_users_role_at_each_slot(self):
        # A schedule runs its slots as its creator's token; a person's token acts with the lower
        # of its role and its user's role on the agent as that role is when the slot comes, and
        # a person who is only a guest there (who could not make a schedule) has none fire.
        self.server = SERVER
        t = Tenant(SERVER)
        agent = t.agent(tools=["notes.append"])
        ann = t.person("Ann")
        t.member(agent, ann, "user")
        tok, _ = self.token_of(t, ann, "owner")
        notes = os.path.join(SERVER.home, "workspaces", agent["id"], "notes.txt")

        def schedule(line, after, **body):
            """A one-shot schedule of Ann's, `after` seconds from now, that appends `line`."""
            return t.ok("POST", "/v1/agents/%s/schedules" % agent["id"], dict({
                "prompt": '/call notes.append {"line": "%s"}' % line,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + after))},
                **body), expect=201, token=tok)

        def slot(s, line):
            """The slot's event (fired or refused), and whether the line was written."""
            ev = wait_for(lambda: next((e for e in SERVER.all_events(token=t.token)
                                        if e["type"] in ("schedule.fired@v1",
                                                         "schedule.refused@v1")
                                        and e["payload"].get("schedule_id") == s["id"]), None),
                          30, "the slot of schedule " + s["id"])
            if ev["type"] == "schedule.fired@v1":
                SERVER.wait_run(ev["run_id"], token=t.token)
            written = ""
            if os.path.exists(notes):
                with open(notes) as f:
                    written = f.read()
            return ev, line in written

        # Made while Ann is a user there: one slot as a user, one after she is made a guest
        # (into a session the tenant's owner opened), one after she is no member (the agent is
        # private).
        theirs = SERVER.create_session(agent["id"], token=t.token)
        first, shared, third = (
            schedule("as-a-user", 2), schedule("as-a-guest", 6, session_id=theirs["id"]),
            schedule("as-nobody", 10))
        ev, wrote = slot(first, "as-a-user")
        self.assertEqual(ev["type"], "schedule.fired@v1", ev)
        self.assertTrue(wrote, "a user's scheduled call was not made")
        t.member(agent, ann, "guest")
        ev, wrote = slot(shared, "as-a-guest")
        self.assertEqual(ev["type"], "schedule.refused@v1", ev)
        self.assertIn("is only a guest on the agent now", ev["payload"]["reason"])
        self.assertFalse(wrote)
        self.assertEqual([m for m in t.pages("/v1/sessions/%s/messages" % theirs["id"])
                          if m["role"] == "user"], [], "a guest's slot posted into another's "
                                                       "session")
        t.ok("DELETE", "/v1/agents/%s/members/%s" % (agent["id"], ann["id"]), expect=(200, 204))
        ev, wrote = slot(third, "as-nobody")
        self.assertEqual(ev["type"], "schedule.refused@v1", ev)
        self.assertIn("no role on the agent", ev["payload"]["reason"])
        self.assertFalse(wrote)


# ---------------------------------------------------------------------------------- Telegram


class TelegramCase(KeelTestCase):
    def the_server(self):
        """The module's server (a module importing this case gives its own)."""
        return SERVER

    def setUp(self):
        self.server = self.the_server()
        self.t = Tenant(self.server)
        self.fake = FakeTelegram()
        self.addCleanup(self.fake.stop)

    def bot(self, **kw):
        agent, ch = self.t.bot(self.fake, **kw)
        self.addCleanup(self.t.request, "DELETE", "/v1/channels/" + ch["id"])
        return agent, ch

    def refused(self, ch, update, notice, chat):
        """The update was answered with `notice` (no run), which reached the chat."""
        r = self.t.wait_reply(ch, update, ("sent",))
        self.assertEqual((r["run_id"], r["text"]), ("", notice), r)
        self.assertIn(notice, self.fake.to(chat))
        return r

    def answered(self, ch, update, chat, text):
        r = self.t.wait_reply(ch, update, ("sent",))
        self.assertTrue(r["run_id"], r)
        self.assertIn(said(text), self.fake.to(chat))
        return r

    def handled(self, update):
        """Everything up to `update` was handled: the offset moved past it."""
        wait_for(lambda: update + 1 in self.fake.sent()["polls"], 20, "a poll past %d" % update)


class PrivateAgentTest(TelegramCase):
    def test_a_stranger_gets_a_notice_until_made_a_member(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot()  # private: the default
        left = 60 - time.time() % 60
        if left < 30:  # a sender's notices are counted per minute: all of these within one
            time.sleep(left + 0.2)
        first = fake.message(111, "hello?", first_name="Stranger")
        self.refused(ch, first, NOT_MEMBER % 111, 111)
        self.assertEqual(t.sessions(agent), {}, "a refused message made a session")
        self.assertEqual(t.pages("/v1/users"), [], "a refused stranger became a user")
        self.assertEqual(t.members(agent), {})
        [d] = [p for p in t.events("channel.delivered@v1") if p["channel_id"] == ch["id"]]
        self.assertEqual((d["delivery_id"], d["admitted"], d["sender"]),
                         (str(first), False, "telegram:111"))
        # A member of another agent is a stranger to this one.
        ann = t.person("Ann", ("telegram", 111))
        t.member(t.agent(), ann, "owner")
        self.refused(ch, fake.message(111, "and now?"), NOT_MEMBER % 111, 111)
        self.assertEqual(t.sessions(agent), {})
        t.member(agent, ann, "user")
        self.answered(ch, fake.message(111, "hello again"), 111, "hello again")
        session = t.sessions(agent)["tg: chat:111"]
        self.assertEqual(t.said_in(session), ["hello again"])
        # Removed, a stranger again: its fourth message this minute, past the notices a
        # stranger is sent in one (three), is passed over in silence, with nothing written.
        t.ok("DELETE", "/v1/agents/%s/members/%s" % (agent["id"], ann["id"]), expect=204)
        late = fake.message(111, "still there?")
        self.handled(late)
        time.sleep(1)
        self.assertNotIn(str(late), t.replies(ch))
        self.assertEqual(t.said_in(session), ["hello again"])
        self.assertEqual(fake.to(111), [NOT_MEMBER % 111] * 2 + [said("hello again")])
        # Another stranger is told.
        self.refused(ch, fake.message(112, "hi"), NOT_MEMBER % 112, 112)


class PublicAgentTest(TelegramCase):
    def test_a_strangers_first_message_makes_a_guest_user(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot(level="public")
        first = private_update(50000, 5150, "hi there", "Zed", "Quill")
        fake.updates(first, first)  # the same update twice in one batch: taken once
        self.answered(ch, 50000, 5150, "hi there")
        [user] = t.pages("/v1/users")
        self.assertEqual((user["name"], user["merged_into"]), ("Zed Quill", None))
        self.assertEqual([(i["platform"], i["platform_user_id"], i["name"])
                          for i in user["identities"]], [("telegram", "5150", "Zed Quill")])
        [m] = t.pages("/v1/agents/%s/members" % agent["id"])
        self.assertEqual((m["user_id"], m["name"], m["role"]), (user["id"], "Zed Quill", "guest"))
        self.assertEqual(t.roles(user), {agent["id"]: "guest"})
        session = t.sessions(agent)["tg: chat:5150"]
        self.assertEqual(t.said_in(session), ["hi there"])
        # An owner's choice stands: made a user, the sender stays one; no second user.
        t.member(agent, user, "user")
        self.answered(ch, fake.message(5150, "me again", first_name="Zed"), 5150, "me again")
        self.assertEqual([u["id"] for u in t.pages("/v1/users")], [user["id"]])
        self.assertEqual(t.members(agent), {user["id"]: "user"})
        self.assertEqual(t.said_in(session), ["hi there", "me again"])
        self.assertEqual(fake.to(5150), [said("hi there"), said("me again")])
        self.assertEqual([p["user_id"] for p in t.events("user.created@v1")], [user["id"]])
        self.assertEqual([(p["user_id"], p["role"]) for p in t.events("agent.member_set@v1")],
                         [(user["id"], "guest"), (user["id"], "user")])

    def test_one_new_sender_in_four_chats_at_once_is_one_guest(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot(level="public")
        text = "@keel_test_bot hello"
        groups = [{"update_id": 60001 + i, "message": {
            "message_id": 1, "date": int(time.time()), "text": text,
            "entities": [{"type": "mention", "offset": 0, "length": 14}],
            "from": {"id": 6160, "is_bot": False, "first_name": "Kim"},
            "chat": {"id": -6161 - i, "type": "group", "title": "G"}}} for i in range(3)]
        fake.updates(private_update(60000, 6160, "hello", "Kim"), *groups)  # one batch
        self.answered(ch, 60000, 6160, "hello")
        for i in range(3):
            self.answered(ch, 60001 + i, -6161 - i, "Kim: " + text)
        [user] = t.pages("/v1/users")
        self.assertEqual(pairs(user), [("telegram", "6160")])
        self.assertEqual(t.members(agent), {user["id"]: "guest"})

    def test_a_guest_over_20_messages_a_minute_gets_a_notice(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot(level="public")
        left = 60 - time.time() % 60
        if left < 20:  # the count is per minute: all 24 within one
            time.sleep(left + 0.2)
        updates = [fake.message(777, "msg %d" % i) for i in range(24)]
        replies = wait_for(lambda: (lambda rs: rs if all(
            str(u) in rs and rs[str(u)]["status"] in ENDED for u in updates[:21]) else None)(
            t.replies(ch)), 60, "21 replies ended")
        self.handled(updates[-1])
        time.sleep(1)
        replies = t.replies(ch)
        got = [(bool(replies[str(u)]["run_id"]), replies[str(u)]["text"]
                if not replies[str(u)]["run_id"] else "") for u in updates[:21]]
        # Twenty run, the next is told once, and the rest are passed over (no reply to post).
        self.assertEqual(got, [(True, "")] * 20 + [(False, TOO_FAST)])
        self.assertEqual([str(u) in replies for u in updates[21:]], [False] * 3)
        self.assertEqual(fake.to(777).count(TOO_FAST), 1)
        self.assertEqual(t.said_in(t.sessions(agent)["tg: chat:777"]),
                         ["msg %d" % i for i in range(20)])


    def test_a_guest_past_the_daily_allowance_gets_a_notice(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot(level="public")
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"guest_daily_tokens": 3})
        left = 60 - time.time() % 60
        if left < 20:  # notices are counted per minute: these within one
            time.sleep(left + 0.2)
        first = fake.message(888, "one two three four")  # more than 3 tokens to answer
        self.answered(ch, first, 888, "one two three four")
        over = fake.message(888, "again")
        r = self.refused(ch, over, ALLOWANCE % 3, 888)
        self.assertEqual(r["run_id"], "")
        self.assertEqual(t.said_in(t.sessions(agent)["tg: chat:888"]), ["one two three four"])
        # Another guest has an allowance of their own; a member with a role above guest none.
        self.answered(ch, fake.message(889, "hi"), 889, "hi")
        [guest] = [u for u in t.pages("/v1/users")
                   if pairs(u) == [("telegram", "888")]]
        t.member(agent, guest, "user")
        self.answered(ch, fake.message(888, "as a user"), 888, "as a user")
        # No allowance: 0.
        t.member(agent, guest, "guest")
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"guest_daily_tokens": 0})
        self.answered(ch, fake.message(888, "unlimited"), 888, "unlimited")


class ProtectedAgentTest(TelegramCase):
    def test_the_access_code_lets_in_once_and_is_posted_nowhere(self):
        t, fake = self.t, self.fake
        code = "open-sesame-" + os.urandom(4).hex()
        agent, ch = self.bot(level="protected", code=code)
        self.refused(ch, fake.message(601, "hello"), NEEDS_CODE, 601)
        self.refused(ch, fake.message(601, code + "x"), NEEDS_CODE, 601)
        # In a group the code lets no one in (everyone there would see it).
        g = fake.group(-6000, "@keel_test_bot " + code, from_id=601)
        r = t.wait_reply(ch, g, ("sent",))
        self.assertEqual(r["run_id"], "")
        self.assertIn("direct message", r["text"])
        self.assertEqual((t.members(agent), t.pages("/v1/users")), ({}, []))
        self.refused(ch, fake.message(601, code), GRANTED, 601)
        deep_link = private_update(70000, 602, "/start " + code, "Bo")
        fake.updates(deep_link, deep_link)
        self.refused(ch, 70000, GRANTED, 602)
        users = {u["identities"][0]["platform_user_id"]: u for u in t.pages("/v1/users")}
        self.assertEqual(sorted(users), ["601", "602"])
        self.assertEqual(t.members(agent), {users["601"]["id"]: "guest",
                                            users["602"]["id"]: "guest"})
        self.answered(ch, fake.message(601, "what now?"), 601, "what now?")
        self.answered(ch, fake.message(602, "and me?", first_name="Bo"), 602, "and me?")
        self.assertEqual(fake.to(602), [GRANTED, said("and me?")], "granted twice")
        sessions = t.sessions(agent)  # the Tenant checks every answer for the code
        self.assertEqual(sorted(sessions), ["tg: chat:601", "tg: chat:602"])
        self.assertEqual(t.said_in(sessions["tg: chat:601"]), ["what now?"])
        self.assertEqual(t.said_in(sessions["tg: chat:602"]), ["and me?"])
        t.replies(ch), t.all_events()  # their answers too
        # A new code: the old one lets no one else in.
        t.never.append(t.ok("PUT", "/v1/agents/%s/access" % agent["id"],
                            {"level": "protected", "new_code": True})["code"])
        self.refused(ch, fake.message(603, code), NEEDS_CODE, 603)
        self.assertEqual(len(t.members(agent)), 2)


class GroupTest(TelegramCase):
    def test_unaddressed_messages_are_taken_from_owners_only(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        ann, bob = t.person("Ann", ("telegram", 301)), t.person("Bob", ("telegram", 302))
        t.member(agent, ann, "owner"), t.member(agent, bob, "user")
        g = -100777
        owner = fake.group(g, "status please", from_id=301, first_name="Ann")
        ignored = [fake.group(g, "just chatting", from_id=302, first_name="Bob"),
                   fake.group(g, "me too", from_id=303, first_name="Carl")]
        mention = fake.group(g, "@keel_test_bot help", from_id=302, first_name="Bob")
        reply = fake.group(g, "thanks", from_id=302, first_name="Bob", reply_to_bot=True)
        stranger = fake.group(g, "@keel_test_bot let me in", from_id=303, first_name="Carl")
        anchor = fake.message(301, "anchor", first_name="Ann")
        self.answered(ch, owner, g, "Ann: status please")
        self.answered(ch, mention, g, "Bob: @keel_test_bot help")
        self.answered(ch, reply, g, "Bob: thanks")
        self.refused(ch, stranger, NOT_MEMBER % 303, g)
        self.answered(ch, anchor, 301, "anchor")
        self.handled(anchor)
        self.assertEqual(sorted(t.replies(ch)),
                         sorted(str(u) for u in (owner, mention, reply, stranger, anchor)))
        self.assertEqual(t.said_in(t.sessions(agent)["tg: chat:%d" % g]),
                         ["Ann: status please", "Bob: @keel_test_bot help", "Bob: thanks"])
        self.assertEqual(sorted(fake.to(g)), sorted([
            said("Ann: status please"), said("Bob: @keel_test_bot help"), said("Bob: thanks"),
            NOT_MEMBER % 303]))
        self.assertEqual(fake.sent()["pending"], [], "ignored updates were not confirmed")
        self.assertEqual(len(t.pages("/v1/users")), 2, "a group stranger became a user")
        self.assertLess(max(ignored), anchor)


class RoleBoundTest(TelegramCase):
    """Ann is a user member, Bob a guest member, of an agent whose channel's role is user."""

    def setUp(self):
        super().setUp()
        t = self.t
        t.ok("PUT", "/v1/policy", OPEN_FRAME)
        self.agent, self.ch = self.bot(tools=["notes.append"], role="user")
        t.member(self.agent, t.person("Ann", ("telegram", 401)), "user")
        t.member(self.agent, t.person("Bob", ("telegram", 402)), "guest")

    def call(self, chat, line):
        """Whether `line` was written by a notes.append call sent from `chat`; the run's steps."""
        t = self.t
        r = t.wait_reply(self.ch, self.fake.message(
            chat, '/call notes.append {"line": "%s"}' % line))
        self.assertTrue(r["run_id"], r)
        SERVER.wait_run(r["run_id"], token=t.token)
        notes = os.path.join(SERVER.home, "workspaces", self.agent["id"], "notes.txt")
        written = ""
        if os.path.exists(notes):
            with open(notes) as f:
                written = f.read()
        return line in written, json.dumps(SERVER.steps(r["run_id"], token=t.token))

    def lower(self):
        self.t.ok("PATCH", "/v1/channels/" + self.ch["id"],
                  {"settings": dict(self.ch["settings"], role="guest")})

    def test_the_lower_of_the_channels_and_the_members_role_bounds_tools(self):
        self.assertTrue(self.call(401, "by-ann-as-user")[0], "user channel, user member")
        wrote, steps = self.call(402, "by-bob-as-guest")
        self.assertFalse(wrote, "a guest member wrote through a user channel")
        self.assertIn("guests may only use read tools", steps)
        self.lower()
        # The second poll from now read the channel's settings after the change.
        since = time.time()
        wait_for(lambda: len([c for c in self.fake.sent()["calls"] if c["method"] ==
                              "getUpdates" and c["at"] > since]) >= 2, 20, "two new polls")
        wrote, steps = self.call(401, "by-ann-on-a-guest-channel")
        self.assertFalse(wrote, "a user member wrote through a guest channel")
        self.assertIn("guests may only use read tools", steps)

    def test_a_lowered_channel_role_holds_for_the_next_message(self):
        # The owner lowered the channel's role (200): a message sent afterwards must not act
        # with the old one, though a long poll asked before the change brings it.
        wait_for(lambda: self.fake.sent()["polls"], 20, "the channel polling")
        self.lower()
        wrote, steps = self.call(401, "right-after-the-change")
        self.assertFalse(wrote, "a message sent after the channel's role was lowered to guest "
                                "acted with its old role (user)")


if __name__ == "__main__":
    unittest.main()

"""Channels: webhook channel bindings (/v1/agents/{id}/channels, /v1/channels/{id}) and the
Standard Webhooks ingress POST /v1/hooks/{id}, attacked.

End to end (a signed delivery with no bearer token posts the rendered template into its
conversation's session and the agent answers; values are not expanded twice; a raw secret is the
key; the channel's role bounds the run's tools); redeliveries (the same webhook-id, re-signed or
concurrent, answers the first ids and posts nothing); forgeries and stale timestamps (401, nothing
written: sessions and the event log unchanged); bad bodies (400, an oversized one 413, nothing
written); unknown, disabled and deleted channels (404); roles and tenants on the routes, and no
answer, event or log line holding the secret's value; validation of channel bodies (400, 409).

Every answer a Tenant receives is checked for its secrets' values. Runs on SQLite and, with
KEEL_TEST_STORE=postgres, on PostgreSQL."""

import base64
import hashlib
import hmac
import json
import os
import subprocess
import threading
import time
import unittest

import keel_harness
from keel_harness import KeelServer, KeelTestCase, keel_bin, unique_name

KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
TEMPLATE = "issue {{/issue/title}} by {{/sender/login}}"
OPEN_FRAME = {"rules": [{"tool": "*", "rights": ["read", "write"], "approval": "never"}]}
MAX_BODY = 1 << 20  # max_body_bytes' default (docs/API.md, section 22)
SERVER = None


def setUpModule():
    global SERVER
    SERVER = KeelServer(env={"KEEL_SECRET_KEK": KEK})


def tearDownModule():
    SERVER.stop()


def sign(key, msg_id, ts, raw):
    mac = hmac.new(key, ("%s.%s." % (msg_id, ts)).encode() + raw, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def issue(repo="acme/app", title="Crash on start", login="alice"):
    return {"issue": {"title": title}, "sender": {"login": login}, "repo": repo}


class Tenant(keel_harness.Tenant):
    """A tenant with a user and a guest token. Every answer it receives is checked for the
    values of the secrets it set (`never`)."""

    def __init__(self, server):
        self.never = []
        super().__init__(server)
        self.user, _ = self.new_token("user")
        self.guest, _ = self.new_token("guest")

    def check(self, resp, what):
        text = resp[1] if isinstance(resp[1], str) else json.dumps(resp[1])
        for value in self.never:
            assert value not in text, "%s: the answer holds a secret's value: %s" % (what, text)
        return resp

    def request(self, method, path, body=None, token=None, **kw):
        return self.check(self.server.request(method, path, body=body, token=token or self.token,
                                              **kw), "%s %s" % (method, path))

    def ok(self, method, path, body=None, expect=(200, 201, 204), token=None, **kw):
        st, data, _ = self.request(method, path, body, token=token, **kw)
        expect = (expect,) if isinstance(expect, int) else expect
        assert st in expect, "%s %s -> %s (expected %s): %r" % (method, path, st, expect, data)
        return data

    def secret(self, raw=False):
        """Sets a new secret; returns (name, HMAC key)."""
        name = "HOOK_" + os.urandom(6).hex().upper()
        if raw:
            value = "raw-signing-key-" + os.urandom(12).hex()
            key = value.encode()
        else:
            key = os.urandom(32)
            value = "whsec_" + base64.b64encode(key).decode()
            self.never.append(value[len("whsec_"):])
        self.never.append(value)
        self.ok("PUT", "/v1/secrets/" + name, {"value": value}, expect=204)
        return name, key

    def hook(self, template=TEMPLATE, conversation="/repo", raw=False, tools=None, **settings):
        """A new agent, secret and webhook channel; returns (agent, channel, key)."""
        name, key = self.secret(raw)
        agent = self.server.create_agent(tools=tools, token=self.token)
        settings.update(signing_secret=name, template=template, conversation=conversation)
        ch = self.ok("POST", "/v1/agents/%s/channels" % agent["id"],
                     {"kind": "webhook", "name": unique_name("ch"), "settings": settings},
                     expect=201)
        return agent, ch, key

    def deliver(self, ch, key, body=None, msg_id=None, ts=None, signature=None, drop=(),
                raw=None, signed_raw=None):
        """POSTs a delivery with no bearer token, signed with `key` unless `signature` is given
        (over `signed_raw` when given: a body altered after signing)."""
        raw = raw if raw is not None else json.dumps(body).encode()
        msg_id = "msg_" + os.urandom(8).hex() if msg_id is None else msg_id
        ts = str(int(time.time())) if ts is None else str(ts)
        sig = signature if signature is not None else \
            sign(key, msg_id, ts, signed_raw if signed_raw is not None else raw)
        headers = {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": sig}
        for name in drop:
            headers.pop(name)
        return self.check(self.server.request("POST", ch["url"], token=None, headers=headers,
                                              raw_body=raw, timeout=60), "POST " + ch["url"])

    def messages(self, sid):
        return [(m["role"], m["content"]) for m in
                self.server.list_all("/v1/sessions/%s/messages" % sid, token=self.token)]

    def sessions(self, agent_id):
        return sorted(s["id"] for s in
                      self.server.list_all("/v1/agents/%s/sessions" % agent_id, token=self.token))

    def last_position(self):
        after = 0
        while True:
            items = self.ok("GET", "/v1/events?after=%d&limit=500" % after)["items"]
            if not items:
                return after
            after = items[-1]["position"]

    def mark(self):
        """The last event position once the log has stopped moving (runs ended)."""
        last = None
        for _ in range(60):
            pos = self.last_position()
            if pos == last:
                return pos
            last = pos
            time.sleep(0.3)
        return last


class ChannelCase(KeelTestCase):
    def setUp(self):
        self.server = SERVER
        self.t = Tenant(SERVER)

    def accepted(self, resp, what="delivery"):
        st, body, _ = resp
        self.assertEqual(st, 202, "%s: %s %r" % (what, st, body))
        self.assertIs(body["replayed"], False, body)
        run = self.server.wait_run(body["run_id"], token=self.t.token)
        self.assertEqual(run["status"], "done", run)
        return body

    def unauthenticated(self, resp, what):
        self.assertError(resp, 401, "unauthenticated", what)

    def assertNothingWritten(self, agent, sessions, mark, what):
        self.assertEqual(self.t.sessions(agent["id"]), sessions, "%s opened a session" % what)
        new = self.t.ok("GET", "/v1/events?after=%d&limit=20" % mark)["items"]
        self.assertEqual([e["type"] for e in new], [], "%s wrote events" % what)


class EndToEndTest(ChannelCase):
    def test_signed_delivery_is_rendered_into_its_conversations_session(self):
        t = self.t
        agent, ch, key = t.hook()
        self.assertEqual(ch["url"], "/v1/hooks/" + ch["id"])
        self.assertEqual((ch["agent_id"], ch["kind"], ch["enabled"], ch["created_by"]),
                         (agent["id"], "webhook", True, t.token_id))
        self.assertEqual(ch["settings"], {"signing_secret": ch["settings"]["signing_secret"],
                                          "template": TEMPLATE, "conversation": "/repo",
                                          "role": "guest"})
        first = self.accepted(t.deliver(ch, key, issue()))
        sid = first["session_id"]
        msgs = t.messages(sid)
        self.assertEqual(msgs[0], ("user", "issue Crash on start by alice"), msgs)
        self.assertEqual([r for r, _ in msgs], ["user", "assistant"], msgs)
        self.assertTrue(msgs[1][1], msgs)
        full = self.server.list_all("/v1/sessions/%s/messages" % sid, token=t.token)
        self.assertEqual((full[0]["id"], full[1]["run_id"]), (first["message_id"], first["run_id"]))
        # Same repo: same session. A value that looks like a placeholder is not expanded again.
        second = self.accepted(t.deliver(ch, key, issue(title="{{/sender/login}}")))
        self.assertEqual(second["session_id"], sid)
        self.assertNotEqual(second["message_id"], first["message_id"])
        self.assertEqual(t.messages(sid)[2], ("user", "issue {{/sender/login}} by alice"))
        # Another repo: another session; a non-string value as compact JSON.
        third = self.accepted(t.deliver(ch, key, issue(repo="acme/other", title=42)))
        self.assertNotEqual(third["session_id"], sid)
        self.assertEqual(t.messages(third["session_id"])[0], ("user", "issue 42 by alice"))
        self.assertEqual(t.sessions(agent["id"]), sorted([sid, third["session_id"]]))

    def test_defaults_post_the_whole_body_into_one_session_and_a_raw_secret_is_the_key(self):
        t = self.t
        name, key = t.secret(raw=True)
        agent = self.server.create_agent(token=t.token)
        ch = t.ok("POST", "/v1/agents/%s/channels" % agent["id"],
                  {"kind": "webhook", "name": "defaults", "settings": {"signing_secret": name}},
                  expect=201)
        self.assertEqual(ch["settings"], {"signing_secret": name, "template": "{{}}",
                                          "conversation": "", "role": "guest"})
        a = self.accepted(t.deliver(ch, key, raw=b'{"a":[1,"x"]}'))
        b = self.accepted(t.deliver(ch, key, raw=b'{"b":true}'))
        self.assertEqual(a["session_id"], b["session_id"])
        users = [c for r, c in t.messages(a["session_id"]) if r == "user"]
        self.assertEqual(users, ['{"a":[1,"x"]}', '{"b":true}'])

    def test_the_channels_role_bounds_the_runs_tool_calls(self):
        t = self.t
        t.ok("PUT", "/v1/policy", OPEN_FRAME)
        for role, allowed in (("guest", False), ("user", True)):
            agent, ch, key = t.hook(template="{{/text}}", conversation="", role=role,
                                    tools=["notes.append"])
            line = "written-by-a-%s-hook" % role
            st, got, _ = t.deliver(ch, key, {"text": '/call notes.append {"line": "%s"}' % line})
            self.assertEqual(st, 202, got)
            run = self.server.wait_run(got["run_id"], token=t.token)
            path = os.path.join(self.server.home, "workspaces", agent["id"], "notes.txt")
            notes = ""
            if os.path.exists(path):
                with open(path) as f:
                    notes = f.read()
            self.assertEqual(line in notes, allowed, "%s: %r, notes %r" % (role, run, notes))
            if not allowed:
                steps = json.dumps(self.server.steps(got["run_id"], token=t.token))
                self.assertIn("guests may only use read tools", steps)


    def test_a_schedule_made_in_a_hooks_run_keeps_to_the_channels_role(self):
        # A webhook's runs act with its channel's role; a schedule one of them makes records the
        # channel, so that its slots keep to the role the channel has when each comes (and stop
        # once it is deleted), as a chat's do.
        t = self.t
        t.ok("PUT", "/v1/policy", OPEN_FRAME)
        agent, ch, key = t.hook(template="{{/text}}", conversation="", role="user",
                                tools=["schedule.create"])
        prompt = "a reminder"
        st, got, _ = t.deliver(ch, key, {"text": "/call schedule.create " + json.dumps(
            {"prompt": prompt, "in_seconds": 3600})})
        self.assertEqual(st, 202, got)
        run = self.server.wait_run(got["run_id"], token=t.token)
        self.assertEqual(run["status"], "done", run)
        [made] = [x for x in self.server.list_all("/v1/agents/%s/schedules" % agent["id"],
                                                  token=t.token) if x["prompt"] == prompt]
        self.assertEqual((made["channel_id"], made["user_id"]), (ch["id"], None), made)


class RedeliveryTest(ChannelCase):
    def test_same_webhook_id_is_answered_with_the_first_ids(self):
        t = self.t
        agent, ch, key = t.hook()
        raw = json.dumps(issue()).encode()
        first = self.accepted(t.deliver(ch, key, raw=raw, msg_id="msg_redeliver"))
        msgs, mark = t.messages(first["session_id"]), t.mark()
        same = {k: first[k] for k in ("session_id", "message_id", "run_id")}
        for what, kw in (("the same request", {}),
                         ("re-signed at a later time", {"ts": int(time.time()) + 5})):
            kw.setdefault("raw", raw)
            st, body, _ = t.deliver(ch, key, msg_id="msg_redeliver", **kw)
            self.assertEqual(st, 200, "%s: %s %r" % (what, st, body))
            self.assertIs(body["replayed"], True, body)
            self.assertEqual({k: body[k] for k in same}, same, what)
        self.unauthenticated(t.deliver(ch, os.urandom(32), raw=raw, msg_id="msg_redeliver"),
                             "a redelivery signed by another key")
        self.assertEqual(t.messages(first["session_id"]), msgs)
        self.assertEqual(t.sessions(agent["id"]), [first["session_id"]])
        new = self.t.ok("GET", "/v1/events?after=%d&limit=50" % mark)["items"]
        self.assertEqual([e["type"] for e in new if e["type"].startswith(("message.", "run."))],
                         [], "a redelivery posted something")

    def test_a_webhook_id_is_one_delivery_whatever_its_body(self):
        """The contract: the same webhook-id again is a redelivery, 200 with the first ids."""
        t = self.t
        agent, ch, key = t.hook()
        first = self.accepted(t.deliver(ch, key, issue(), msg_id="msg_once"))
        for what, body in (("another title", issue(title="edited")),
                           ("another conversation", issue(repo="acme/elsewhere"))):
            st, got, _ = t.deliver(ch, key, body, msg_id="msg_once")
            self.assertEqual((st, got), (200, dict(first, replayed=True)), what)
        self.assertEqual(t.sessions(agent["id"]), [first["session_id"]])
        self.assertEqual([r for r, _ in t.messages(first["session_id"])], ["user", "assistant"])

    def test_concurrent_redeliveries_post_once(self):
        t = self.t
        agent, ch, key = t.hook()
        raw = json.dumps(issue()).encode()
        answers = []

        def fire():
            st, body, _ = t.deliver(ch, key, raw=raw, msg_id="msg_race")
            answers.append((st, body))
        threads = [threading.Thread(target=fire) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(sorted(st for st, _ in answers), [200] * 7 + [202], answers)
        self.assertEqual(len({(b["session_id"], b["message_id"], b["run_id"]) for _, b in answers}),
                         1, answers)
        sid = answers[0][1]["session_id"]
        self.server.wait_run(answers[0][1]["run_id"], token=t.token)
        self.assertEqual([r for r, _ in t.messages(sid)], ["user", "assistant"])
        self.assertEqual(t.sessions(agent["id"]), [sid])


class ForgeryTest(ChannelCase):
    def test_forgeries_are_401_and_write_nothing(self):
        t = self.t
        agent, ch, key = t.hook()
        good = self.accepted(t.deliver(ch, key, issue()))
        sessions, mark = t.sessions(agent["id"]), t.mark()
        body = issue(repo="forged/repo")
        raw = json.dumps(body).encode()
        now = int(time.time())
        whsec = ("whsec_" + base64.b64encode(key).decode()).encode()
        mac = sign(key, "msg_f", now, raw)[3:]
        bad = "v1," + base64.b64encode(os.urandom(32)).decode()
        cases = [
            ("a random signature", {"signature": bad}),
            ("another key's signature", {"signature": sign(os.urandom(32), "msg_f", now, raw)}),
            ("the whsec_ string as the key", {"signature": sign(whsec, "msg_f", now, raw)}),
            ("a body altered after signing", {"signed_raw": json.dumps(issue()).encode()}),
            ("no webhook-id", {"drop": ["webhook-id"]}),
            ("no webhook-timestamp", {"drop": ["webhook-timestamp"]}),
            ("no webhook-signature", {"drop": ["webhook-signature"]}),
            ("a timestamp 301 s old", {"ts": now - 301}),
            ("a timestamp 301 s ahead", {"ts": now + 301}),
            ("a non-integer timestamp", {"ts": "%d.5" % now}),
            ("a word as timestamp", {"ts": "now"}),
            ("a v2 signature", {"signature": "v2," + mac}),
            ("a truncated MAC", {"signature": "v1," + base64.b64encode(
                base64.b64decode(mac)[:16]).decode()}),
            ("a hex MAC", {"signature": "v1," + base64.b64decode(mac).hex()}),
            ("an empty signature", {"signature": ""}),
            ("signed for another id", {"signature": sign(key, "msg_other", now, raw)}),
        ]
        for what, kw in cases:
            kw.setdefault("ts", now)
            self.unauthenticated(t.deliver(ch, key, raw=raw, msg_id="msg_f", **kw), what)
        for msg_id in ("m" * 257, "", "msg\x01ctl"):  # outside 1-256 printable ASCII
            st, got, _ = t.deliver(ch, key, raw=raw, msg_id=msg_id, ts=now)
            self.assertIn(st, (400, 401), "webhook-id %r: %s %r" % (msg_id[:20], st, got))
        # The owner's bearer token does not stand in for a signature.
        st, got, _ = t.check(self.server.request(
            "POST", ch["url"], raw_body=raw, token=t.token,
            headers={"webhook-id": "msg_b", "webhook-timestamp": str(now)}), "bearer")
        self.unauthenticated((st, got, None), "a bearer token and no signature")
        self.assertNothingWritten(agent, sessions, mark, "a forgery")
        # One matching signature in a list is enough; 200 s old is within tolerance.
        ts = now - 200
        for msg_id, first in (("msg_l1", bad), ("msg_l2", "v2,abc")):
            sigs = "%s %s" % (first, sign(key, msg_id, ts, raw))
            got = self.accepted(t.deliver(ch, key, raw=raw, msg_id=msg_id, ts=ts, signature=sigs),
                                "the signature list " + sigs)
            self.assertNotEqual(got["session_id"], good["session_id"])


class BadBodyTest(ChannelCase):
    def test_bad_bodies_are_400_and_write_nothing(self):
        t = self.t
        agent, ch, key = t.hook()
        self.accepted(t.deliver(ch, key, issue()))
        sessions, mark = t.sessions(agent["id"]), t.mark()
        deep = ("[" * 200000 + "]" * 200000).encode()
        cases = [
            ("not JSON", b"issue: crash"),
            ("truncated JSON", b'{"issue": {"title": "x"'),
            ("200,000 levels of nesting", deep),
            ("no /issue/title", json.dumps({"sender": {"login": "a"}, "repo": "r"}).encode()),
            ("no /repo", json.dumps({"issue": {"title": "t"}, "sender": {"login": "a"}}).encode()),
            ("an object as conversation", json.dumps(issue(repo={"name": "r"})).encode()),
            ("an array as body", b"[1, 2, 3]"),
        ]
        for what, raw in cases:
            st, body, _ = t.deliver(ch, key, raw=raw)
            self.assertEqual(st, 400, "%s: %s %r" % (what, st, str(body)[:300]))
            self.assertEqual(body["error"]["code"], "invalid_argument", what)
        self.assertHealthy()
        # Just over max_body_bytes (a body far over it may be cut off before the answer).
        big = b'{"pad": "' + b"a" * MAX_BODY + b'"}'
        self.assertError(t.deliver(ch, key, raw=big), 413, "payload_too_large", "oversized")
        self.assertHealthy()
        self.assertNothingWritten(agent, sessions, mark, "a bad body")


class LifecycleTest(ChannelCase):
    def test_unknown_disabled_and_deleted_channels_are_404(self):
        t = self.t
        agent, ch, key = t.hook()
        for fake in ("01a00000-0000-7000-8000-00000000c0de", "nope"):
            self.assertError(t.deliver(dict(ch, url="/v1/hooks/" + fake), key, issue()), 404,
                             "not_found", "an unknown channel " + fake)
        off = t.ok("PATCH", "/v1/channels/" + ch["id"], {"enabled": False}, expect=200)
        self.assertIs(off["enabled"], False)
        self.assertEqual(off["settings"], ch["settings"])
        mark = t.mark()
        self.assertError(t.deliver(ch, key, issue()), 404, "not_found", "a disabled channel")
        self.assertNothingWritten(agent, [], mark, "a delivery to a disabled channel")
        t.ok("PATCH", "/v1/channels/" + ch["id"], {"enabled": True}, expect=200)
        got = self.accepted(t.deliver(ch, key, issue()), "after re-enabling")
        t.ok("DELETE", "/v1/channels/" + ch["id"], expect=204)
        mark = t.mark()
        self.assertError(t.deliver(ch, key, issue(repo="new/repo")), 404, "not_found", "deleted")
        self.assertError(t.request("GET", "/v1/channels/" + ch["id"]), 404, "not_found")
        self.assertError(t.request("DELETE", "/v1/channels/" + ch["id"]), 404, "not_found")
        self.assertEqual(t.ok("GET", "/v1/agents/%s/channels" % agent["id"])["items"], [])
        self.assertNothingWritten(agent, [got["session_id"]], mark, "a deleted channel")
        self.assertEqual([r for r, _ in t.messages(got["session_id"])], ["user", "assistant"])


class AccessTest(ChannelCase):
    def test_users_read_guests_and_users_cannot_write(self):
        t = self.t
        agent, ch, key = t.hook()
        channels = "/v1/agents/%s/channels" % agent["id"]
        one = "/v1/channels/" + ch["id"]
        name, _ = t.secret()
        create = {"kind": "webhook", "name": "mine", "settings": {"signing_secret": name}}
        for who, token, codes in (("user", t.user, (403,)), ("guest", t.guest, (403, 404))):
            for method, path, body in (("POST", channels, create), ("DELETE", one, None),
                                       ("PATCH", one, {"enabled": False}),
                                       ("PATCH", one, {"settings": {"signing_secret": name}})):
                st, got, _ = t.request(method, path, body, token=token)
                self.assertIn(st, codes, "%s %s as %s: %s %r" % (method, path, who, st, got))
        for path in (channels, one):
            st, got, _ = t.request("GET", path, token=t.guest)
            self.assertIn(st, (403, 404), "GET %s as guest: %s %r" % (path, st, got))
        self.assertEqual(t.ok("GET", one, token=t.user), ch)
        items = t.ok("GET", channels, token=t.user)["items"]
        self.assertEqual([c["id"] for c in items], [ch["id"]])
        self.accepted(t.deliver(ch, key, issue()), "after the refused writes")

    def test_another_tenant_sees_nothing(self):
        t, other = self.t, Tenant(self.server)
        agent, ch, key = t.hook()
        mine_secret = ch["settings"]["signing_secret"]
        one = "/v1/channels/" + ch["id"]
        theirs, _ = other.secret()
        for method, path, body in (
                ("GET", one, None), ("PATCH", one, {"enabled": False}), ("DELETE", one, None),
                ("GET", "/v1/agents/%s/channels" % agent["id"], None),
                ("POST", "/v1/agents/%s/channels" % agent["id"],
                 {"kind": "webhook", "name": "x", "settings": {"signing_secret": theirs}})):
            self.assertError(other.request(method, path, body), 404, "not_found",
                             "%s %s as another tenant" % (method, path))
        # Its own agent cannot name this tenant's secret.
        own = self.server.create_agent(token=other.token)
        self.assertError(other.request("POST", "/v1/agents/%s/channels" % own["id"], {
            "kind": "webhook", "name": "steal", "settings": {"signing_secret": mine_secret}}),
            400, "invalid_argument", "another tenant's secret name")
        self.assertEqual(t.ok("GET", one), ch)
        self.accepted(t.deliver(ch, key, issue()))

    def test_no_event_or_log_line_holds_the_secret(self):
        t = self.t
        agent, ch, key = t.hook()
        self.accepted(t.deliver(ch, key, issue()))
        t.deliver(ch, os.urandom(32), issue())
        t.ok("PATCH", "/v1/channels/" + ch["id"], {"settings": dict(ch["settings"], role="user")})
        t.ok("GET", "/v1/agents/%s/channels" % agent["id"])
        events = json.dumps(self.server.all_events(token=t.token))
        with open(self.server.stderr_path, errors="replace") as f:
            log = f.read()
        with open(self.server.stdout_path, errors="replace") as f:
            log += f.read()
        for value in t.never:
            self.assertNotIn(value, events, "an event holds the secret's value")
            self.assertNotIn(value, log, "the server's log holds the secret's value")


class ValidationTest(ChannelCase):
    def test_bad_channels_are_refused_and_write_nothing(self):
        t = self.t
        name, _ = t.secret()
        agent = self.server.create_agent(token=t.token)
        path = "/v1/agents/%s/channels" % agent["id"]
        good = t.ok("POST", path, {"kind": "webhook", "name": "github",
                                   "settings": {"signing_secret": name}}, expect=201)

        def body(**kw):
            b = {"kind": "webhook", "name": unique_name("v"), "settings": {"signing_secret": name}}
            b.update(kw)
            return b
        s = {"signing_secret": name}
        cases = [
            ("kind telegram", body(kind="telegram")),
            ("no kind", {"name": "nokind", "settings": s}),
            ("unknown settings field", body(settings=dict(s, chat_id="1"))),
            ("unknown body field", body(colour="red")),
            ("no signing_secret", body(settings={"template": "{{}}"})),
            ("a missing secret", body(settings={"signing_secret": "NO_SUCH_SECRET"})),
            ("signing_secret not a string", body(settings={"signing_secret": 7})),
            ("role owner", body(settings=dict(s, role="owner"))),
            ("role admin", body(settings=dict(s, role="admin"))),
            ("a slash in the name", body(name="a/b")),
            ("an empty name", body(name="")),
            ("a 65-byte name", body(name="n" * 65)),
            ("a space in the name", body(name="a b")),
            ("a template over 4096 bytes", body(settings=dict(s, template="x" * 4097))),
            ("65 placeholders", body(settings=dict(s, template="{{/a}}" * 65))),
            ("enabled not a boolean", body(enabled="yes")),
            ("settings not an object", body(settings="github")),
        ]
        for what, b in cases:
            self.assertError(t.request("POST", path, b), 400, "invalid_argument", what)
        self.assertError(t.request("POST", path, raw_body="{nope"), 400, "invalid_argument")
        self.assertError(t.request("POST", path, body(name="github")), 409, "conflict", "dup")
        # One secret signs one channel: a delivery to one could be replayed to another.
        self.assertError(t.request("POST", path, body(name="gitlab")), 409, "conflict", "shared")
        second, _ = t.secret()
        other = t.ok("POST", path, body(name="gitlab", settings={"signing_secret": second}),
                     expect=201)
        self.assertError(t.request("PATCH", "/v1/channels/" + other["id"],
                                   {"settings": {"signing_secret": name}}), 409, "conflict")
        one = "/v1/channels/" + other["id"]
        for what, b in (("rename to a taken name", {"name": "github"}),
                        ("a missing secret", {"settings": {"signing_secret": "NO_SUCH"}}),
                        ("role owner", {"settings": dict(s, role="owner")}),
                        ("an unknown field", {"kind": "slack"})):
            st, got, _ = t.request("PATCH", one, b)
            self.assertIn(st, (400, 409), "PATCH %s: %s %r" % (what, st, got))
        self.assertEqual(t.ok("GET", one), other)
        items = self.server.list_all(path, limit=1, token=t.token)
        self.assertEqual(sorted(c["id"] for c in items), sorted([good["id"], other["id"]]))
        self.assertError(t.request("GET", "/v1/agents/%s/channels" % "no-such-agent"), 404,
                         "not_found")


class HardeningTest(ChannelCase):
    """What an attack review of the first version found, each refused with nothing written."""

    def setUp(self):
        super().setUp()
        self.name, self.key = self.t.secret()
        self.agent = self.server.create_agent(token=self.t.token)

    def channel(self, token=None, **settings):
        return self.t.ok("POST", "/v1/agents/%s/channels" % self.agent["id"], {
            "kind": "webhook", "name": unique_name("h"),
            "settings": dict({"signing_secret": self.name}, **settings)},
            expect=201, token=token)

    def mark(self):
        return self.t.ok("GET", "/v1/events?order=desc&limit=1")["items"][0]["position"]

    def assertNoEvents(self, mark, what):
        new = self.t.ok("GET", "/v1/events?after=%d&limit=20" % mark)["items"]
        self.assertEqual([e["type"] for e in new], [], what)

    def test_a_revoked_creators_channel_takes_no_delivery(self):
        t = self.t
        token, token_id = t.new_token("owner")
        ch = self.channel(token=token)
        self.accepted(t.deliver(ch, self.key, {"x": 1}))
        t.ok("DELETE", "/v1/tokens/" + token_id)
        mark = self.mark()
        self.assertError(t.deliver(ch, self.key, {"x": 2}), 403, "permission_denied")
        self.assertNoEvents(mark, "a delivery to a revoked creator's channel")
        shown = t.ok("GET", "/v1/channels/" + ch["id"])
        self.assertEqual(shown["status"], "error")
        self.assertIn("was revoked", shown["error"])
        # Unsigned, it is 401 as for any channel: the suspension is told only to the signer.
        self.assertError(t.deliver(ch, os.urandom(32), {"x": 3}), 401, "unauthenticated")

    def test_clients_may_not_take_a_deliverys_idempotency_key(self):
        t = self.t
        ch = self.channel()
        first = self.accepted(t.deliver(ch, self.key, {"x": 1}))
        st, body, _ = self.server.post_message(first["session_id"], "attacker text",
                                               idempotency_key="webhook:evt_42",
                                               token=t.token)
        self.assertEqual(st, 400, body)
        later = self.accepted(t.deliver(ch, self.key, {"x": 2}, msg_id="evt_42"))
        self.assertNotIn("attacker text", [c for _, c in t.messages(later["session_id"])])

    def test_a_template_cannot_make_a_message_past_the_request_limit(self):
        ch = self.channel(template="{{/a}}" * 64)
        mark = self.mark()
        st, body, _ = self.t.deliver(ch, self.key, {"a": "x" * 20000})
        self.assertEqual(st, 400, body)
        self.assertIn("longer than 1048576 bytes", body["error"]["message"])
        self.assertNoEvents(mark, "an oversized message")

    def test_a_long_non_ascii_conversation_opens_a_session_with_a_whole_title(self):
        ch = self.channel(conversation="/c")
        conv = "a" * 199 + "\u00e9\u00e9"
        got = self.accepted(self.t.deliver(ch, self.key, {"c": conv}))
        title = self.t.ok("GET", "/v1/sessions/" + got["session_id"])["title"]
        self.assertTrue(title.endswith("a" * 10), title)
        self.assertNotIn("\ufffd", title)
        again = self.accepted(self.t.deliver(ch, self.key, {"c": conv}))
        self.assertEqual(again["session_id"], got["session_id"])

    def test_nul_bodies_and_deleted_agents_write_nothing(self):
        t = self.t
        ch = self.channel(conversation="/c")
        mark = self.mark()
        st, body, _ = t.deliver(ch, self.key, raw=b'{"a": "hi\\u0000there", "c": "n1"}')
        self.assertEqual(st, 400, body)
        self.assertError(t.deliver(ch, self.key, raw=b'["an", "array"]'), 400,
                         "invalid_argument")
        self.assertNoEvents(mark, "a NUL in a delivery")
        t.ok("DELETE", "/v1/agents/" + self.agent["id"])
        mark = self.mark()
        for _ in range(3):
            self.assertError(t.deliver(ch, self.key, {"c": "n2"}), 404, "not_found")
        self.assertNoEvents(mark, "deliveries to a deleted agent's channel")
        self.assertEqual(t.ok("GET", "/v1/channels/" + ch["id"])["status"], "error")

    def test_headers_are_checked_before_the_channel_is_read(self):
        # No channel by that id: a delivery without its headers is told so, not "not found".
        st, body, _ = self.server.request("POST", "/v1/hooks/no-such-channel", token=None,
                                          raw_body=b"{}")
        self.assertEqual(st, 401, body)
        self.assertError(self.t.deliver({"url": "/v1/hooks/no-such-channel"}, self.key, {}),
                         404, "not_found")


class PluginTest(ChannelCase):
    def test_channel_message_in_rewrites_or_drops_a_delivery(self):
        """channel.message.in@v1: the agent's plugins see each delivery's message before it is
        posted; a rewrite is what the session gets, a drop posts nothing and records nothing."""
        t = self.t
        key = os.urandom(32)
        t.ok("PUT", "/v1/secrets/PLUG_HOOK", {"value": "whsec_" + base64.b64encode(key).decode()})
        agent = t.ok("POST", "/v1/agents", {"name": unique_name("plug"), "model": "local"},
                     expect=201)
        ch = t.ok("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "webhook", "name": "plugged",
            "settings": {"signing_secret": "PLUG_HOOK", "template": "{{/text}}"}}, expect=201)
        source = """
ctx.bus.on('channel.message.in@v1', function(m)
  if m.channel_id ~= '%s' or m.kind ~= 'webhook' then error('not this channel') end
  if string.find(m.content, 'spam') then m.drop = true
  else m.content = 'via ' .. m.delivery_id .. ': ' .. string.upper(m.content) end
  return m
end)""" % ch["id"]
        t.ok("POST", "/v1/plugins", {
            "manifest": {"id": "inbound", "name": "Inbound", "version": "1.0.0", "kind": "lua",
                         "events": ["channel.message.in@v1"]},
            "source": source}, expect=201)
        t.ok("POST", "/v1/plugins/inbound/enable", {"agent_id": agent["id"]})
        first = self.accepted(t.deliver(ch, key, {"text": "hello"}, msg_id="m-1"))
        self.assertEqual([c for r, c in t.messages(first["session_id"]) if r == "user"],
                         ["via m-1: HELLO"])
        mark = t.ok("GET", "/v1/events?order=desc&limit=1")["items"][0]["position"]
        st, body, _ = t.deliver(ch, key, {"text": "buy spam now"}, msg_id="m-2")
        self.assertEqual((st, body), (200, {"dropped": True, "replayed": False}))
        new = t.ok("GET", "/v1/events?after=%d&limit=20" % mark)["items"]
        self.assertEqual([e["type"] for e in new], [], "a dropped delivery wrote events")
        self.assertEqual(len([c for r, c in t.messages(first["session_id"]) if r == "user"]), 1)


class CliTest(ChannelCase):
    def keel(self, *args, token=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update({"KEEL_URL": self.server.base_url, "KEEL_TOKEN": token or self.t.token})
        return subprocess.run([keel_bin(), *args], capture_output=True, text=True, env=env,
                              timeout=60, stdin=subprocess.DEVNULL)

    def test_add_list_show_disable_enable_and_remove(self):
        key = os.urandom(32)
        self.t.ok("PUT", "/v1/secrets/CLI_HOOK", {"value": "whsec_" + base64.b64encode(key).decode()})
        agent = self.t.ok("POST", "/v1/agents", {"name": unique_name("cli"), "model": "local"},
                          expect=201)
        added = self.keel("channels", "add", agent["name"], "deploys", "--secret", "CLI_HOOK",
                          "--template", "Deploy {{/service}}", "--conversation", "/service",
                          "--role", "user")
        self.assertEqual(added.returncode, 0, added.stderr)
        cid = added.stdout.split("(")[1].split(")")[0]
        self.assertIn(self.server.base_url + "/v1/hooks/" + cid, added.stdout)
        listed = self.keel("channels", "list", agent["name"])
        self.assertIn(cid, listed.stdout)
        self.assertIn("Deploy {{/service}}", listed.stdout)
        shown = self.keel("channels", "show", cid)
        self.assertIn("role:         user", shown.stdout)
        self.assertIn("status:       ready", shown.stdout)
        self.assertNotIn(base64.b64encode(key).decode(), added.stdout + listed.stdout + shown.stdout)
        # A deleted secret: the list says why the channel takes no delivery.
        self.t.ok("PUT", "/v1/secrets/CLI_SPARE", {"value": "spare-signing-key-0123456789"})
        spare = self.keel("channels", "add", agent["name"], "spare", "--secret", "CLI_SPARE")
        self.assertEqual(spare.returncode, 0, spare.stderr)
        self.t.ok("DELETE", "/v1/secrets/CLI_SPARE")
        listed = self.keel("channels", "list", agent["name"])
        self.assertIn("spare is not working: its secret 'CLI_SPARE' "
                      "(settings.signing_secret) is missing", listed.stdout)
        self.assertEqual(self.keel("channels", "disable", cid).returncode, 0)
        ch = self.t.ok("GET", "/v1/channels/" + cid)
        self.assertFalse(ch["enabled"])
        self.assertError(self.t.deliver(ch, key, {"service": "x"}), 404, "not_found")
        self.assertEqual(self.keel("channels", "enable", cid).returncode, 0)
        self.accepted(self.t.deliver(ch, key, {"service": "x"}))
        # A user's token may list but not add; a missing secret is named.
        refused = self.keel("channels", "add", agent["name"], "x", "--secret", "CLI_HOOK",
                            token=self.t.user)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("permission_denied", refused.stderr)
        missing = self.keel("channels", "add", agent["name"], "y", "--secret", "NOPE")
        self.assertEqual(missing.returncode, 1)
        self.assertIn("names no secret of this tenant: 'NOPE'", missing.stderr)
        usage = self.keel("channels", "add", agent["name"], "z")
        self.assertEqual(usage.returncode, 2)
        self.assertEqual(self.keel("channels", "rm", cid).returncode, 0)
        self.assertError(self.t.request("GET", "/v1/channels/" + cid), 404, "not_found")


class CrashTest(KeelTestCase):
    """kill -9 while deliveries arrive: a delivery answered 2xx survives it, and a sender that
    sends everything again afterwards (retrying what it did not see answered, and some of what
    it did) gets every delivery as one message, in its conversation's one session."""

    def test_deliveries_across_kill9_are_each_one_message(self):
        s = KeelServer(env={"KEEL_SECRET_KEK": KEK})
        self.addCleanup(s.stop)
        key = os.urandom(32)
        s.ok("PUT", "/v1/secrets/HOOK", {"value": "whsec_" + base64.b64encode(key).decode()})
        agent = s.create_agent()
        ch = s.ok("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "webhook", "name": "crash", "settings": {
                "signing_secret": "HOOK", "template": "n={{/n}}", "conversation": "/conv"}},
            expect=201)
        total, answered, lock = 80, {}, threading.Lock()

        def send(i):
            raw = json.dumps({"n": i, "conv": "c%d" % (i % 4)}).encode()
            ts = str(int(time.time()))
            headers = {"webhook-id": "d%d" % i, "webhook-timestamp": ts,
                       "webhook-signature": sign(key, "d%d" % i, ts, raw)}
            return s.request("POST", ch["url"], token=None, headers=headers, raw_body=raw,
                             timeout=10)

        def sender(first):
            for i in range(first, total, 4):
                try:
                    st, body, _ = send(i)
                except OSError:
                    return  # the server is gone
                if st in (200, 202):
                    with lock:
                        answered[i] = (body["message_id"], body["session_id"])

        threads = [threading.Thread(target=sender, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while len(answered) < total // 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        s.kill9()
        for t in threads:
            t.join()
        self.assertGreater(len(answered), 0)
        self.assertLess(len(answered), total, "the kill came after every delivery")
        s.start()
        for i in range(total):  # everything again, answered or not
            st, body, _ = send(i)
            self.assertIn(st, (200, 202), body)
            if i in answered:
                self.assertEqual(st, 200, "an answered delivery was taken again: %r" % body)
                self.assertEqual((body["message_id"], body["session_id"]), answered[i])
            s.wait_run(body["run_id"])
        sessions = s.list_all("/v1/agents/%s/sessions" % agent["id"])
        self.assertEqual(len(sessions), 4, "one session per conversation")
        contents = []
        for session in sessions:
            for m in s.list_all("/v1/sessions/%s/messages" % session["id"]):
                if m["role"] == "user":
                    contents.append(m["content"])
        self.assertEqual(sorted(contents), sorted("n=%d" % i for i in range(total)))


if __name__ == "__main__":
    unittest.main()

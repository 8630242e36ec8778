"""Discord channels: a Discord application's Interactions Endpoint bound to an agent, whose slash
commands (POSTed by tests/fakes/fake_discord.py to the channel's url, /v1/hooks/{id}, signed with
Ed25519) Keel verifies, posts into the session of their Discord channel, defers, and answers
through the durable outbox by editing the deferred response (then follow-ups), attacked.

Covered: the command registered by the leader (refused: status error; changed: registered
again); PING; a command deferred once durable, "NAME: text" in a guild, one session per Discord
channel, a resent interaction one message; another command or a bot: an ephemeral notice,
nothing written; forged, stale, unsigned and tampered requests (401, nothing written); the outbox
(429, 500, 403 Missing Access, a dropped send; parts of 2,000 characters; markdown as written,
allowed_mentions parse []; <NO_REPLY>; past the token's life, a channel message); roles, tenants,
validation, no secret or interaction token anywhere; kill -9 twice; approvals in chat (a parked
tool call's card in its approver's DM, or in the conversation; a press approves or rejects and
the card is edited; a press by anyone else, a second press, a forged press decide nothing; a
decision through the API edits the card too; the separate-approver rule; nobody to show it to).

Every answer a Tenant receives is checked for its secrets' values and the interaction tokens
issued. Each test has a fake of its own. Runs on SQLite and, with KEEL_TEST_STORE=postgres, on
PostgreSQL."""

import base64
import json
import os
import random
import secrets
import subprocess
import sys
import threading
import time
import unittest

import keel_harness
from keel_harness import KeelServer, KeelTestCase, http_request, unique_name, wait_for

KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes", "fake_discord.py")
APP_ID = "1100000000000000001"
GUILD, C1, C2 = "4400000000000000001", "2200000000000000101", "2200000000000000102"
DM1, DM2 = "2300000000000000001", "2300000000000000002"
ANN = {"id": "3300000000000000001", "username": "ann", "global_name": "Ann"}
BOB = {"id": "3300000000000000002", "username": "bob"}
ROBOT = {"id": "3300000000000000009", "username": "robot", "bot": True}
ENDED = ("sent", "skipped", "unknown", "dead")
SERVER = None


def server_env():
    return {"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": "127.0.0.1/32"}


def setUpModule():
    global SERVER
    SERVER = KeelServer(env=server_env())


def tearDownModule():
    SERVER.stop()


def bot_token(app_id=APP_ID):
    """A token shaped as Discord's: the base64 app id, a stamp and an HMAC, dot-separated."""
    head = base64.b64encode(app_id.encode()).decode().rstrip("=")
    return "%s.%s.%s" % (head, secrets.token_urlsafe(4)[:6], secrets.token_urlsafe(28)[:38])


def said(text):
    return 'You said: "%s"' % text


class FakeDiscord:
    """tests/fakes/fake_discord.py in a process of its own, and its control endpoints."""

    def __init__(self):
        self.token, self.app_id = bot_token(), APP_ID
        self.proc = subprocess.Popen([sys.executable, FAKE, "--token", self.token,
                                      "--application-id", self.app_id],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().strip())
        self.api_base = "http://127.0.0.1:%d/api/v10" % self.port
        self.public_key = self.control("GET", "/_public_key")["public_key"]

    def control(self, method, path, body=None):
        st, data, _ = http_request("127.0.0.1:%d" % self.port, method, path, body=body,
                                   timeout=60)
        assert st == 200, "fake %s %s -> %s %r" % (method, path, st, data)
        return data

    def sent(self):
        return self.control("GET", "/_sent")

    def fail(self, route, *answers):
        self.control("POST", "/_fail", {"route": route, "answers": list(answers)})

    def commands(self):
        return {c["name"]: c for c in self.sent()["commands"]}

    def messages(self, what="messages", **match):
        """The messages taken (or the calls, answered or not) whose fields have the values
        given (kind, token, channel_id; route)."""
        return [m for m in self.sent()[what] if all(m.get(k) == v for k, v in match.items())]

    def calls(self, route, **match):
        return self.messages("calls", route=route, **match)

    def wait_messages(self, n=1, timeout=30, **match):
        return wait_for(lambda: (lambda ms: ms if len(ms) >= n else None)(self.messages(**match)),
                        timeout, "%d message(s) %r" % (n, match))

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


class Endpoint:
    """A discord channel of an agent as Discord sees it: send() POSTs one interaction to the
    channel's url on the server's current address, signed with the fake's key; the fake answers
    with Keel's status and body. Each interaction token issued joins the tenant's `never`."""

    def __init__(self, tenant, fake, agent, ch):
        self.t, self.fake, self.agent, self.ch = tenant, fake, agent, ch

    def send(self, **body):
        base = self.t.server.base_url or "http://127.0.0.1:1"  # down: the POST fails
        got = self.fake.control("POST", "/_interaction", dict(body, url=base + self.ch["url"]))
        self.t.never.append(got["token"])
        return got

    def command(self, text, channel=DM1, guild=None, user=ANN, nick=None, name="ask", **kw):
        c = {"name": name, "message": text, "channel_id": channel, "user": user,
             "guild_id": guild, "nick": nick}
        return self.send(command={k: v for k, v in c.items() if v is not None}, **kw)

    def press(self, message_id, button=None, user=None, **kw):
        """Presses a button (its label or custom_id; or kw custom_id=... sent as given) of a bot
        message as `user` (default: in a DM its person, else Ann), through the fake's /_press;
        returns the fake's answer (Keel's status and body)."""
        base = self.t.server.base_url or "http://127.0.0.1:1"
        body = dict(kw, url=base + self.ch["url"], message_id=message_id)
        if button is not None:
            body["button"] = button
        if user is not None:
            body["user"] = user
        got = self.fake.control("POST", "/_press", body)
        self.t.never.append(got["token"])
        return got

    def taken(self, got):
        """Asserts Keel deferred the command (200 {"type": 5}); returns the fake's answer."""
        assert (got["status"], got["body"]) == (200, {"type": 5}), "not taken: %r" % got
        return got


class Tenant(keel_harness.Tenant):
    """A tenant with a user and a guest token. Every answer it receives is checked for the
    values of the secrets it set and the interaction tokens its endpoints were sent (`never`)."""

    def __init__(self, server):
        self.never = []
        super().__init__(server)
        self.user, _ = self.new_token("user")
        self.guest, _ = self.new_token("guest")

    def check(self, resp, what):
        text = resp[1] if isinstance(resp[1], str) else json.dumps(resp[1])
        for value in self.never:
            assert value not in text, "%s: the answer holds a secret: %s" % (what, text)
        return resp

    def request(self, method, path, body=None, token=None, **kw):
        return self.check(self.server.request(method, path, body=body, token=token or self.token,
                                              **kw), "%s %s" % (method, path))

    def ok(self, method, path, body=None, expect=(200, 201, 204), token=None, **kw):
        st, data, _ = self.request(method, path, body, token=token, **kw)
        expect = (expect,) if isinstance(expect, int) else expect
        assert st in expect, "%s %s -> %s (expected %s): %r" % (method, path, st, expect, data)
        return data

    def secret(self, value):
        name = "DC_" + os.urandom(6).hex().upper()
        self.never.append(value)
        self.ok("PUT", "/v1/secrets/" + name, {"value": value}, expect=204)
        return name

    def app(self, fake, model="local", config=None, tools=None, **settings):
        """A new agent (with `tools`), a secret holding the bot token and a discord channel `dc`
        on `fake`."""
        settings = dict({"application_id": fake.app_id, "public_key": fake.public_key,
                         "bot_token": self.secret(fake.token), "api_base": fake.api_base},
                        **settings)
        agent = self.server.create_agent(model=model, config=config, tools=tools,
                                         token=self.token)
        # Anyone on the platform may talk to it (an agent is private until said).
        self.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "public"})
        ch = self.ok("POST", "/v1/agents/%s/channels" % agent["id"],
                     {"kind": "discord", "name": "dc", "settings": settings}, expect=201)
        return Endpoint(self, fake, agent, ch)

    def pages(self, path, token=None):
        items, cursor = [], None
        while True:
            sep = "&" if "?" in path else "?"
            data = self.ok("GET", path + (sep + "cursor=" + cursor if cursor else ""), token=token)
            items += data["items"]
            cursor = data.get("next_cursor")
            if not cursor:
                return items

    def replies(self, ch, token=None):
        return {r["delivery_id"]: r for r in self.pages("/v1/channels/%s/replies" % ch["id"],
                                                        token=token)}

    def wait_reply(self, ch, interaction_id, statuses=ENDED, timeout=30):
        return wait_for(lambda: (lambda r: r if r and r["status"] in statuses else None)(
            self.replies(ch).get(interaction_id)), timeout,
            "the reply to interaction %s %s" % (interaction_id, "/".join(statuses)))

    def sessions(self, agent):
        return {s["title"]: s for s in self.pages("/v1/agents/%s/sessions" % agent["id"])}

    def users(self, session):
        return [m["content"] for m in self.pages("/v1/sessions/%s/messages" % session["id"])
                if m["role"] == "user"]

    def events(self, kind, ch):
        return [e for e in self.server.all_events(token=self.token)
                if e["type"] == kind and e["payload"].get("channel_id") == ch["id"]]

    def status(self, ch, want):
        return wait_for(lambda: (lambda c: c if c["status"] == want else None)(
            self.ok("GET", "/v1/channels/" + ch["id"])), 30, "channel status " + want)


class DiscordCase(KeelTestCase):
    """The module's server, a fresh tenant and a fake of the test's own. app() deletes its
    channel when the test ends, before the fake stops, and waits for its command to be
    registered (so that nothing the leader does later changes what a test counts)."""

    def setUp(self):
        self.server = SERVER
        self.t = Tenant(SERVER)
        self.fake = FakeDiscord()
        self.addCleanup(self.fake.stop)

    def app(self, fake=None, registered=True, **kw):
        ep = self.t.app(fake or self.fake, **kw)
        self.addCleanup(self.t.request, "DELETE", "/v1/channels/" + ep.ch["id"])
        if registered:
            name = ep.ch["settings"]["command"]
            wait_for(lambda: ep.fake.commands().get(name), 20, "command %s registered" % name)
            self.t.status(ep.ch, "ready")
        return ep

    def answered(self, ep, text, **kw):
        """A command, taken; (the fake's answer, the deferred response's edit)."""
        got = ep.taken(ep.command(text, **kw))
        [m] = self.fake.wait_messages(token=got["token"])
        return got, m

    def assertNoLeak(self, *values):
        events = json.dumps(self.server.all_events(token=self.t.token))
        log = ""
        for path in (self.server.stderr_path, self.server.stdout_path):
            with open(path, errors="replace") as f:
                log += f.read()
        for value in values:
            self.assertNotIn(value, events, "an event holds a secret")
            self.assertNotIn(value, log, "the server's log holds a secret")


class EndToEndTest(DiscordCase):
    def test_commands_in_guilds_and_dms_are_answered_each_in_its_session(self):
        t, fake = self.t, self.fake
        ep = self.app()
        agent, ch = ep.agent, ep.ch
        self.assertEqual((ch["kind"], ch["name"], ch["enabled"], ch["url"]),
                         ("discord", "dc", True, "/v1/hooks/" + ch["id"]))
        self.assertEqual(ch["settings"], {
            "application_id": APP_ID, "public_key": fake.public_key,
            "bot_token": ch["settings"]["bot_token"], "api_base": fake.api_base,
            "command": "ask", "role": "guest"})
        # Registered with the bot token: a chat-input command with one required string option.
        body = fake.commands()["ask"]["body"]
        self.assertEqual((body["name"], body["type"]), ("ask", 1))
        self.assertTrue(body["description"])
        [option] = body["options"]
        self.assertEqual((option["type"], option["name"], option["required"]),
                         (3, "message", True))
        self.assertTrue(option["description"])
        self.assertEqual(fake.sent()["unauthorized"], 0)
        # Discord checks the endpoint with a PING first.
        got = ep.send(ping=True)
        self.assertEqual((got["status"], got["body"]), (200, {"type": 1}), got)
        # In a guild "NAME: text" (nick, else global name, else username); in a DM the text.
        convs = [(dict(channel=C1, guild=GUILD), "hello there", "Ann: hello there"),
                 (dict(channel=C1, guild=GUILD, user=BOB), "me too", "bob: me too"),
                 (dict(channel=C1, guild=GUILD, nick="Annie"), "by nick", "Annie: by nick"),
                 (dict(channel=DM1), "a private word", "a private word"),
                 (dict(channel=DM1), "second", "second"),
                 (dict(channel=DM2, user=BOB), "other DM", "other DM")]
        taken = {}
        for kw, text, content in convs:
            got, m = self.answered(ep, text, **kw)
            self.assertEqual((m["kind"], m["content"], m.get("allowed_mentions"),
                              m["channel_id"]),
                             ("original", said(content), {"parse": []}, kw["channel"]))
            taken[got["interaction_id"]] = (kw["channel"], content, got["token"])
        titles = {C1: "dc: channel:" + C1, DM1: "dc: dm:" + DM1, DM2: "dc: dm:" + DM2}
        sessions = t.sessions(agent)
        self.assertEqual(sorted(sessions), sorted(titles.values()))
        for c, title in titles.items():
            self.assertEqual(t.users(sessions[title]),
                             [content for cc, content, _ in taken.values() if cc == c])
        replies = {i: t.wait_reply(ch, i) for i in taken}
        for i, (c, content, _) in taken.items():
            r = replies[i]
            self.assertEqual((r["channel_id"], r["session_id"], r["status"], r["text"],
                              r["parts_sent"], r["attempts"], r["error"]),
                             (ch["id"], sessions[titles[c]]["id"], "sent", said(content), 1, 1,
                              ""), r)
        self.assertEqual(sorted(t.replies(ch)), sorted(taken))
        self.assertEqual(sorted(e["payload"]["delivery_id"]
                                for e in t.events("channel.delivered@v1", ch)), sorted(taken))
        # The same interaction again: no second message, no second answer.
        first = next(iter(taken))
        self.assertEqual(ep.send(resend=first)["status"], 200)
        self.answered(ep, "anchor", channel=DM2, user=BOB)
        self.assertEqual(t.users(sessions[titles[C1]]),
                         ["Ann: hello there", "bob: me too", "Annie: by nick"])
        self.assertEqual(len(fake.messages(token=taken[first][2])), 1, "answered twice")
        self.assertEqual(len(t.replies(ch)), len(taken) + 1)
        sent = fake.sent()
        self.assertEqual([m["kind"] for m in sent["messages"]], ["original"] * (len(taken) + 1))
        self.assertEqual((sent["no_allowed_mentions"], sent["unauthorized"]), (0, 0))


class IgnoredTest(DiscordCase):
    def test_another_command_and_bots_get_an_ephemeral_notice_and_nothing_is_written(self):
        t, fake = self.t, self.fake
        ep = self.app()
        for what, got in (("another command", ep.command("hi", name="help", channel=C1,
                                                          guild=GUILD)),
                          ("a bot in a DM", ep.command("hi", channel=DM2, user=ROBOT)),
                          ("a bot in a guild", ep.command("hi", channel=C2, guild=GUILD,
                                                          user=ROBOT))):
            self.assertEqual(got["status"], 200, "%s: %r" % (what, got))
            self.assertEqual((got["body"]["type"], got["body"]["data"]["flags"]), (4, 64), what)
            self.assertIsInstance(got["body"]["data"]["content"], str, what)
            self.assertTrue(got["body"]["data"]["content"], what)
        anchor, _ = self.answered(ep, "anchor")
        t.wait_reply(ep.ch, anchor["interaction_id"])
        self.assertEqual(list(t.sessions(ep.agent)), ["dc: dm:" + DM1])
        self.assertEqual(list(t.replies(ep.ch)), [anchor["interaction_id"]])
        self.assertEqual([e["payload"]["delivery_id"] for e in t.events("channel.delivered@v1",
                                                                        ep.ch)],
                         [anchor["interaction_id"]])
        self.assertEqual([m["token"] for m in fake.sent()["messages"]], [anchor["token"]])


class SignatureTest(DiscordCase):
    def test_forged_stale_unsigned_and_tampered_requests_are_401_and_write_nothing(self):
        t, fake = self.t, self.fake
        ep = self.app()
        before = len(self.server.all_events(token=t.token))
        now = int(time.time())
        cases = [("another key", {"wrong_key": True}),
                 ("a zero signature", {"signature": "00" * 64}),
                 ("a signature not hex", {"signature": "zz" * 64}),
                 ("a short signature", {"signature": "ab" * 32}),
                 ("an empty signature", {"signature": ""}),
                 ("no signature", {"signature": None}),
                 ("no timestamp", {"timestamp": None}),
                 ("neither header", {"signature": None, "timestamp": None}),
                 ("signed 301 s ago", {"timestamp": now - 301}),
                 ("signed 310 s ahead", {"timestamp": now + 310}),
                 ("a word as timestamp", {"timestamp": "now"}),
                 ("a body with a space after signing", {"body_suffix": " "}),
                 ("a body with more after signing", {"body_suffix": ',"x":1}'})]
        for what, kw in cases:
            got = ep.command("forged", channel=DM2, **kw)
            self.assertEqual(got["status"], 401, "%s: %r" % (what, got))
            got = ep.send(ping=True, **kw)
            self.assertEqual(got["status"], 401, "a ping, %s: %r" % (what, got))
        self.assertEqual(t.sessions(ep.agent), {}, "a forgery opened a session")
        self.assertEqual(len(self.server.all_events(token=t.token)), before,
                         "a forgery wrote events")
        self.assertEqual(fake.sent()["messages"], [])
        # 200 s old, correctly signed: within the tolerance, taken.
        got, m = self.answered(ep, "a little late", timestamp=now - 200)
        self.assertEqual(m["content"], said("a little late"))
        self.assertEqual(t.wait_reply(ep.ch, got["interaction_id"])["status"], "sent")


class OutboxTest(DiscordCase):
    """The outbox against the fake's injected failures; each answer is sent at most once."""

    def sent_after(self, failures, text):
        """The reply to a command whose answer meets `failures` first; the edits' calls."""
        ep = self.app()
        self.fake.fail("original", *failures)
        got = ep.taken(ep.command(text))
        r = self.t.wait_reply(ep.ch, got["interaction_id"], timeout=40)
        self.assertEqual((r["status"], r["attempts"]), ("sent", len(failures) + 1), r)
        self.assertEqual([m["content"] for m in self.fake.messages(token=got["token"])],
                         [said(text)])
        return self.fake.calls("original", token=got["token"])

    def test_429_is_retried_after_retry_after_and_sent_once(self):
        calls = self.sent_after([{"status": 429, "retry_after": 2}], "rate limited")
        self.assertEqual([c["status"] for c in calls], [429, 200])
        self.assertGreaterEqual(calls[1]["at"] - calls[0]["at"], 1.9, "retry_after not waited")

    def test_500_is_retried_with_backoff_and_sent_once(self):
        calls = self.sent_after([{"status": 500}, {"status": 500}], "server trouble")
        self.assertEqual([c["status"] for c in calls], [500, 500, 200])
        gaps = [b["at"] - a["at"] for a, b in zip(calls, calls[1:])]
        self.assertGreaterEqual(gaps[0], 0.8, gaps)
        self.assertGreaterEqual(gaps[1], 1.6, "no backoff: %s" % gaps)

    def test_missing_access_is_dead_at_once_and_a_cut_send_is_unknown(self):
        t, fake = self.t, self.fake
        ep = self.app()
        tokens = []
        for failure, status in (({"status": 403, "code": 50001, "message": "Missing Access"},
                                 "dead"), ({"drop": True}, "unknown")):
            fake.fail("original", failure)
            got = ep.taken(ep.command("doomed"))
            tokens.append(got["token"])
            r = t.wait_reply(ep.ch, got["interaction_id"], (status,))
            self.assertEqual(r["attempts"], 1, r)
            if status == "dead":
                self.assertIn("Missing Access", r["error"])
            failed = [e["payload"] for e in t.events("channel.reply_failed@v1", ep.ch)
                      if e["payload"].get("reply_id") == r["id"]]
            self.assertEqual([p["status"] for p in failed], [status], failed)
        self.answered(ep, "anchor", channel=DM2)  # by then neither was tried again
        for token in tokens:
            self.assertEqual(len(fake.calls("original", token=token)), 1, "resent")
            self.assertEqual(fake.calls("followup", token=token), [])
            self.assertEqual(fake.messages(token=token), [])
        self.assertEqual(fake.messages(kind="channel"), [], "a refused answer went elsewhere")

    LINES = "\n".join("%03d " % i + "x" * 60 for i in range(150))  # 9,749 characters
    LONG = "y" * 4500  # no newline, no space
    MARKUP = "**bold** _it_ `a < b && c > d` <@3300000000000000002> @everyone @here &amp; <#1>"

    def test_parts_markdown_and_no_reply(self):
        t, fake = self.t, self.fake
        ep = self.app(config={"local_rules": [
            {"match": "markup", "reply": self.MARKUP},
            {"match": "many lines", "reply": self.LINES},
            {"match": "one long line", "reply": self.LONG},
            {"match": "quiet", "reply": "Nothing to add. <NO_REPLY>"}]})
        # Not escaped (Discord markdown); no ping, since allowed_mentions parses nothing.
        got, m = self.answered(ep, "markup please")
        self.assertEqual((m["content"], m.get("allowed_mentions")), (self.MARKUP, {"parse": []}))
        self.assertEqual(t.wait_reply(ep.ch, got["interaction_id"])["text"], self.MARKUP)
        # Long: parts of at most 2,000 characters, cut at newlines where there are some; the
        # first edits the deferred response, the others are follow-ups, in order.
        for text, answer, least in (("many lines", self.LINES, 5), ("one long line", self.LONG,
                                                                     3)):
            got = ep.taken(ep.command(text, channel=C1, guild=GUILD))
            r = t.wait_reply(ep.ch, got["interaction_id"])
            n = r["parts_sent"]
            self.assertEqual(r["status"], "sent", r)
            self.assertGreaterEqual(n, least, r)
            parts = fake.messages(token=got["token"])
            self.assertEqual([p["kind"] for p in parts], ["original"] + ["followup"] * (n - 1))
            self.assertEqual([p.get("allowed_mentions") for p in parts], [{"parse": []}] * n)
            pos = 0
            for i, p in enumerate(p["content"] for p in parts):
                self.assertLessEqual(len(p), 2000)
                self.assertEqual(answer[pos:pos + len(p)], p, "part %d is not the next" % i)
                pos += len(p)
                if i < n - 1 and "\n" in answer:
                    self.assertTrue(p.endswith("\n") or answer[pos] == "\n",
                                    "part %d was not cut at a newline" % i)
                if i < n - 1 and answer[pos:pos + 1] == "\n":
                    pos += 1  # the newline it was cut at may be left out
            self.assertEqual(pos, len(answer), "the parts do not make up the answer")
        # <NO_REPLY>: skipped, nothing sent.
        got = ep.taken(ep.command("be quiet", channel=DM2))
        self.assertEqual(t.wait_reply(ep.ch, got["interaction_id"])["status"], "skipped")
        self.answered(ep, "anchor")
        self.assertEqual(fake.calls("original", token=got["token"]), [], "<NO_REPLY> was sent")
        self.assertEqual(fake.sent()["no_allowed_mentions"], 0)

    def test_an_answer_past_the_tokens_life_goes_to_the_channel_with_the_bot_token(self):
        """The interaction (its snowflake id and, in the fake, its token) was made 15.5 minutes
        ago: the token no longer edits anything, so the answer is a channel message."""
        t, fake = self.t, self.fake
        ep = self.app()
        got = ep.taken(ep.command("late answer", channel=C1, guild=GUILD, age=930))
        r = t.wait_reply(ep.ch, got["interaction_id"], timeout=40)
        self.assertEqual(r["status"], "sent", r)
        [m] = fake.messages(kind="channel", channel_id=C1)
        self.assertEqual((m["content"], m.get("allowed_mentions")),
                         (said("Ann: late answer"), {"parse": []}))
        self.assertEqual([c["auth"] for c in fake.calls("channel")], [True])
        self.assertEqual(fake.messages(token=got["token"]), [], "the old token edited a message")
        # A fresh interaction in the same channel is still answered by its token.
        _, m = self.answered(ep, "on time", channel=C1, guild=GUILD)
        self.assertEqual(m["content"], said("Ann: on time"))
        self.assertEqual(len(fake.messages(kind="channel")), 1)


class RegistrationTest(DiscordCase):
    def test_a_refused_registration_is_an_error_with_discords_reason(self):
        t, fake = self.t, self.fake
        ep = self.app(registered=False, application_id="1199999999999999999")
        shown = t.status(ep.ch, "error")
        self.assertIn("Unknown Application", shown["error"])
        self.assertEqual(fake.commands(), {})
        self.assertGreater(len(fake.calls("commands")), 0)

    def test_a_changed_command_is_registered_and_answered(self):
        t, fake = self.t, self.fake
        ep = self.app()
        ch = t.ok("PATCH", "/v1/channels/" + ep.ch["id"],
                  {"settings": dict(ep.ch["settings"], command="help-me")})
        self.assertEqual(ch["settings"]["command"], "help-me")
        wait_for(lambda: fake.commands().get("help-me"), 20, "help-me registered")
        self.assertEqual(fake.commands()["help-me"]["body"]["options"][0]["name"], "message")
        got = ep.taken(ep.command("renamed", name="help-me"))
        fake.wait_messages(token=got["token"])
        old = ep.command("the old name")
        self.assertEqual((old["status"], old["body"]["type"]), (200, 4), old)
        self.assertEqual(list(t.replies(ep.ch)), [got["interaction_id"]])


class AccessTest(DiscordCase):
    def test_roles_tenants_and_no_secret_anywhere(self):
        t, fake = self.t, self.fake
        ep = self.app()
        ch = ep.ch
        self.answered(ep, "hello")
        one, replies = "/v1/channels/" + ch["id"], "/v1/channels/%s/replies" % ch["id"]
        channels = "/v1/agents/%s/channels" % ep.agent["id"]
        create = {"kind": "discord", "name": "mine", "settings": {
            "application_id": APP_ID, "public_key": fake.public_key,
            "bot_token": t.secret(bot_token()), "api_base": fake.api_base}}
        self.assertError(t.request("POST", channels, create, token=t.guest), 403,
                         "permission_denied", "a guest creating a channel")
        self.assertEqual(t.request("GET", replies, token=t.guest)[0], 403)
        for method, path, body in (("POST", channels, create), ("DELETE", one, None),
                                   ("PATCH", one, {"enabled": False})):
            self.assertError(t.request(method, path, body, token=t.user), 403,
                             "permission_denied", "%s %s as a user" % (method, path))
        self.assertEqual(t.replies(ch, token=t.user), t.replies(ch))
        other = Tenant(self.server)
        for method, path, body in (("GET", one, None), ("GET", replies, None),
                                   ("PATCH", one, {"enabled": False}), ("DELETE", one, None)):
            self.assertError(other.request(method, path, body), 404, "not_found",
                             "%s %s as another tenant" % (method, path))
        own = self.server.create_agent(token=other.token)
        self.assertError(other.request("POST", "/v1/agents/%s/channels" % own["id"], {
            "kind": "discord", "name": "steal", "settings": dict(ch["settings"])}),
            400, "invalid_argument")
        t.ok("PATCH", one, {"settings": dict(ch["settings"], role="user")})
        self.answered(ep, "still mine", channel=C1, guild=GUILD)
        tokens = [m["token"] for m in fake.sent()["messages"]]
        self.assertEqual(len(tokens), 2)
        self.assertNoLeak(fake.token, *tokens)


class ValidationTest(DiscordCase):
    def test_bad_settings_are_400_and_a_bot_token_serves_one_channel(self):
        t, fake = self.t, self.fake
        token = t.secret(fake.token)
        agent = self.server.create_agent(token=t.token)
        path = "/v1/agents/%s/channels" % agent["id"]
        s = {"application_id": APP_ID, "public_key": fake.public_key, "bot_token": token,
             "api_base": fake.api_base}

        def body(**settings):
            return {"kind": "discord", "name": unique_name("v"), "enabled": False,
                    "settings": dict(s, **settings)}
        no_token = body()
        del no_token["settings"]["bot_token"]
        for what, b, field in (
                ("no settings", {"kind": "discord", "name": "x", "settings": {}}, None),
                ("application_id not digits", body(application_id="app-1"), "application_id"),
                ("application_id of 21 digits", body(application_id="1" * 21),
                 "application_id"),
                ("application_id a number", body(application_id=int(APP_ID)),
                 "application_id"),
                ("public_key of 63 hex", body(public_key=fake.public_key[:63]), "public_key"),
                ("public_key not hex", body(public_key="zz" * 32), "public_key"),
                ("command upper case", body(command="Ask"), "command"),
                ("command of 33", body(command="a" * 33), "command"),
                ("command with a space", body(command="ask me"), "command"),
                ("command with a !", body(command="ask!"), "command"),
                ("no bot_token", no_token, "bot_token"),
                ("a missing bot token", body(bot_token="NO_SUCH"), "bot_token"),
                ("bot_token not a string", body(bot_token=7), "bot_token"),
                ("role owner", body(role="owner"), None),
                ("an unknown field", body(guild_id=GUILD), None),
                ("settings not an object", {"kind": "discord", "name": "y", "settings": "x"},
                 None)):
            err = self.assertError(t.request("POST", path, b), 400, "invalid_argument", what)
            if field:
                self.assertIn(field, err["message"], what)
        self.assertEqual(t.ok("GET", path)["items"], [], "a refused channel was written")
        # Defaults filled in (disabled: it points at the real Discord).
        ch = t.ok("POST", path, {"kind": "discord", "name": "dc", "enabled": False, "settings": {
            "application_id": APP_ID, "public_key": fake.public_key, "bot_token": token}},
            expect=201)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch["id"])
        self.assertEqual(ch["settings"], {"application_id": APP_ID,
                                          "public_key": fake.public_key, "bot_token": token,
                                          "api_base": "https://discord.com/api/v10",
                                          "command": "ask", "role": "guest"})
        self.assertEqual((ch["status"], ch["url"]), ("disabled", "/v1/hooks/" + ch["id"]))
        # A bot token serves one channel, in this agent or another.
        other = self.server.create_agent(token=t.token)
        for where in (path, "/v1/agents/%s/channels" % other["id"]):
            self.assertError(t.request("POST", where, body()), 409, "conflict",
                             "a shared bot token")
        second = t.ok("POST", path, body(command="ask_me-2", bot_token=t.secret(bot_token())),
                      expect=201)
        self.assertEqual(second["settings"]["command"], "ask_me-2")
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + second["id"])
        self.assertError(t.request("PATCH", "/v1/channels/" + second["id"], {
            "settings": dict(second["settings"], bot_token=token)}), 409, "conflict")
        self.assertEqual(fake.sent()["calls"], [], "a disabled channel called Discord")


class ApprovalCardTest(DiscordCase):
    """Approvals in chat on Discord (docs/CHANNELS.md, "Approvals in chat"): a notes.append call
    that the tenant's policy parks, in a run Bob's command in a server channel started, is shown
    to the agent's owner Ann as a card (a bot message with an Approve and a Reject button) in her
    DM with the bot, which she opened with the command before; her press (a signed
    MESSAGE_COMPONENT interaction) decides it as the API would, Keel answers DEFERRED_UPDATE_MESSAGE
    and edits the card to say who decided; every other press is refused with an ephemeral
    notice and decides nothing."""

    FRAME = {"rules": [{"tool": "*", "rights": ["read", "write"], "approval": "never"},
                       {"tool": "notes.append", "rights": ["write"], "approval": "always"}]}
    NOTE = "from discord"
    ASK = "please write it down"

    def cards(self, policy=None, dm=True):
        """The tenant's policy (FRAME and `policy`), an agent with notes.append whose local model
        calls it for ASK, its channel; Ann (owner) and Bob (user), each with their Discord
        identity; Ann's command in her DM first when `dm`. Returns (endpoint, ann, bob)."""
        t = self.t
        t.ok("PUT", "/v1/policy", dict(self.FRAME, **(policy or {})), expect=200)
        # Runs act as their sender's member role, at most "user" (a guest may not write).
        ep = self.app(tools=["notes.append"], role="user", config={"local_rules": [
            {"match": "write it down",
             "call": {"tool": "notes.append", "arguments": {"line": self.NOTE}}}]})
        people = []
        for who, role in ((ANN, "owner"), (BOB, "user")):
            user = t.ok("POST", "/v1/users", {"name": who["username"].title(), "identities": [
                {"platform": "discord", "platform_user_id": who["id"]}]}, expect=201)
            t.ok("PUT", "/v1/agents/%s/members/%s" % (ep.agent["id"], user["id"]),
                 {"role": role}, expect=200)
            people.append(user)
        if dm:
            got, m = self.answered(ep, "hello bot", channel=DM1, user=ANN)
            self.assertEqual(m["content"], said("hello bot"))
            t.wait_reply(ep.ch, got["interaction_id"])
        return ep, people[0], people[1]

    def park(self, ep, user=BOB):
        """`user` asks in the server channel C1 for what makes the agent call notes.append;
        returns (the fake's answer to the command, the answer's reply, the pending approval)."""
        got = ep.taken(ep.command(self.ASK, channel=C1, guild=GUILD, user=user))
        reply = self.t.replies(ep.ch)[got["interaction_id"]]
        run = self.server.wait_run(reply["run_id"], states=("waiting_for_approval",),
                                   token=self.t.token)
        [a] = [a for a in self.t.pages("/v1/approvals?status=pending")
               if a["run_id"] == run["id"]]
        self.assertEqual(a["tool"], "notes.append", a)
        return got, reply, a

    def card(self, channel, a, ep):
        """The card of approval `a` the bot posted in `channel` (waited for), checked: its text,
        its two buttons, no pings, the bot token. Returns the fake's record of it."""
        [m] = self.fake.wait_messages(kind="channel", channel_id=channel)
        self.assertEqual(m["content"].split("\n"), [
            "Approval needed: %s wants to run notes.append" % ep.agent["name"],
            "Arguments: " + json.dumps({"line": self.NOTE}, separators=(",", ":")),
            "Why: " + a["reason"],
            "Expires: " + a["expires_at"],
            "Approval " + a["id"]], m["content"])
        self.assertEqual(m.get("allowed_mentions"), {"parse": []})
        self.assertEqual(m["components"], [{"type": 1, "components": [
            {"type": 2, "style": 3, "label": "Approve", "custom_id": "keel:approve:" + a["id"]},
            {"type": 2, "style": 4, "label": "Reject", "custom_id": "keel:reject:" + a["id"]}]}])
        self.assertEqual([(c["auth"], c["status"]) for c in self.fake.calls("channel")],
                         [(True, 200)])
        return m

    def card_reply(self, ep, delivery, statuses=("shown",)):
        return wait_for(lambda: (lambda r: r if r and r["status"] in statuses else None)(
            self.t.replies(ep.ch).get(delivery)), 20,
            "card %s %s" % (delivery, "/".join(statuses)))

    def edited(self, m, text):
        """Asserts the card `m` was edited once, within seconds, to `text` without buttons."""
        [e] = wait_for(lambda: self.fake.messages("edits", message_id=m["message_id"]), 20,
                       "the card %s edited" % m["message_id"])
        self.assertEqual((e["channel_id"], e["content"], e["components"],
                          e.get("allowed_mentions")),
                         (m["channel_id"], text, [], {"parse": []}), e)
        self.assertTrue(all(c["auth"] for c in self.fake.calls("edit")))
        now = self.fake.control("GET", "/_message?id=" + m["message_id"])
        self.assertEqual((now["content"], now["components"]), (text, []))
        return e

    def refused(self, got, notice, what=""):
        self.assertEqual(got["status"], 200, "%s: %r" % (what, got))
        body = got["body"]
        self.assertEqual((body["type"], body["data"]["flags"]), (4, 64), what)
        self.assertTrue(body["data"]["content"].startswith(notice),
                        "%s: %r" % (what, body["data"]["content"]))

    def undecided(self, a, reply):
        """Nothing decided: the approval pending, the run waiting, no edit, nothing written."""
        self.assertEqual(self.t.ok("GET", "/v1/approvals/" + a["id"])["status"], "pending")
        self.assertEqual(self.server.get_run(reply["run_id"], token=self.t.token)["status"],
                         "waiting_for_approval")
        self.assertEqual(self.fake.sent()["edits"], [])
        self.assertIsNone(self.notes(a["agent_id"]))

    def notes(self, agent_id):
        path = os.path.join(self.server.home, "workspaces", agent_id, "notes.txt")
        try:
            with open(path) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return None

    def answer(self, ep, got, text):
        """The run went on: its answer edited the command's deferred response."""
        [m] = self.fake.wait_messages(token=got["token"])
        self.assertEqual((m["kind"], m["content"]), ("original", text))
        self.assertEqual(self.t.wait_reply(ep.ch, got["interaction_id"])["status"], "sent")

    APPROVED = 'The tool notes.append returned: {"appended":"from discord"}.'
    REJECTED = "The tool notes.append returned: error: a human rejected this call."

    def test_an_owner_approves_from_the_card_in_her_dm(self):
        t, fake = self.t, self.fake
        ep, ann, bob = self.cards()
        got, reply, a = self.park(ep)
        self.assertEqual((reply["kind"], reply["user_id"], reply["approval_id"]),
                         ("answer", bob["id"], None), reply)
        m = self.card(DM1, a, ep)
        delivery = "approval:%s:%s" % (a["id"], ann["id"])
        r = self.card_reply(ep, delivery)
        self.assertEqual((r["kind"], r["approval_id"], r["user_id"], r["run_id"]),
                         ("approval_card", a["id"], ann["id"], a["run_id"]), r)
        self.assertEqual(t.replies(ep.ch)[got["interaction_id"]]["status"], "waiting")
        # Ann presses Approve in her DM: acknowledged without a message of its own.
        pressed = ep.press(m["message_id"], "Approve", user=ANN)
        self.assertEqual((pressed["status"], pressed["body"]), (200, {"type": 6}), pressed)
        [p] = fake.sent()["presses"]
        self.assertEqual((p["channel_id"], p["user_id"]), (DM1, ANN["id"]))
        decided = t.ok("GET", "/v1/approvals/" + a["id"])
        self.assertEqual((decided["status"], decided["decided_by"]),
                         ("approved", "user:" + ann["id"]), decided)
        # The run goes on: the note is written, Bob's command answered.
        self.answer(ep, got, self.APPROVED)
        self.assertEqual(self.notes(ep.agent["id"]), [self.NOTE])
        # The card says who decided, without its buttons.
        self.edited(m, "Approved by Ann: notes.append\nApproval %s" % a["id"])
        self.assertEqual(self.card_reply(ep, delivery, ("sent",))["status"], "sent")
        self.assertEqual(len(fake.messages(kind="channel")), 1, "a second card")
        self.assertEqual(fake.sent()["no_allowed_mentions"], 0)
        self.assertNoLeak(fake.token, got["token"], pressed["token"])

    def test_an_owner_rejects_from_the_card(self):
        t, fake = self.t, self.fake
        ep, ann, _ = self.cards()
        got, _, a = self.park(ep)
        m = self.card(DM1, a, ep)
        self.card_reply(ep, "approval:%s:%s" % (a["id"], ann["id"]))
        pressed = ep.press(m["message_id"], "Reject")  # as the DM's person, Ann
        self.assertEqual((pressed["status"], pressed["body"]), (200, {"type": 6}), pressed)
        decided = t.ok("GET", "/v1/approvals/" + a["id"])
        self.assertEqual((decided["status"], decided["decided_by"]),
                         ("rejected", "user:" + ann["id"]), decided)
        self.answer(ep, got, self.REJECTED)
        self.assertIsNone(self.notes(ep.agent["id"]))
        self.edited(m, "Rejected by Ann: notes.append\nApproval %s" % a["id"])

    def test_a_press_by_anyone_but_an_approver_decides_nothing(self):
        """Ann never wrote to the bot in a DM: the policy lets the card go to the server channel
        the run came from, where anyone may press. Only Ann's press counts."""
        t, fake = self.t, self.fake
        ep, ann, _ = self.cards(policy={"approval_in_conversation": True}, dm=False)
        got, reply, a = self.park(ep)
        m = self.card(C1, a, ep)
        r = self.card_reply(ep, "approval:" + a["id"])
        self.assertEqual((r["kind"], r["approval_id"], r["user_id"]),
                         ("approval_card", a["id"], None), r)
        cy = {"id": "3300000000000000003", "username": "cy"}  # no identity in Keel
        for what, kw, notice in (
                ("Bob, a member but no owner", dict(button="Approve", user=BOB),
                 "You may not decide this approval"),
                ("Bob rejecting", dict(button="Reject", user=BOB),
                 "You may not decide this approval"),
                ("an unknown Discord user", dict(button="Approve", user=cy),
                 "You may not decide this approval"),
                ("a bot", dict(button="Approve", user=ROBOT),
                 "This button is not one of this channel's approval cards."),
                ("another approval's button", dict(
                    custom_id="keel:approve:01a00000-0000-7000-8000-000000000000", user=ANN),
                 "This approval is not known here."),
                ("another app's button", dict(custom_id="vote:yes", user=ANN),
                 "This button is not one of this channel's approval cards.")):
            self.refused(ep.press(m["message_id"], **kw), notice, what)
            self.undecided(a, reply)
        # Ann, in the same channel: decided.
        pressed = ep.press(m["message_id"], "Approve", user=ANN, nick="Annie")
        self.assertEqual((pressed["status"], pressed["body"]), (200, {"type": 6}), pressed)
        self.assertEqual(t.ok("GET", "/v1/approvals/" + a["id"])["decided_by"],
                         "user:" + ann["id"])
        self.answer(ep, got, self.APPROVED)
        self.edited(m, "Approved by Ann: notes.append\nApproval %s" % a["id"])

    def test_a_second_press_is_told_it_is_already_decided(self):
        t, fake = self.t, self.fake
        ep, ann, _ = self.cards()
        got, _, a = self.park(ep)
        m = self.card(DM1, a, ep)
        self.card_reply(ep, "approval:%s:%s" % (a["id"], ann["id"]))
        first = ep.press(m["message_id"], "Approve")
        self.assertEqual((first["status"], first["body"]), (200, {"type": 6}), first)
        # Pressed again from a client that still shows the buttons: nothing changes.
        for custom_id in ("keel:approve:" + a["id"], "keel:reject:" + a["id"]):
            self.refused(ep.press(m["message_id"], custom_id=custom_id),
                         "Already decided: approved.", custom_id)
        again = ep.send(resend=first["interaction_id"])  # the same interaction again
        self.refused(again, "Already decided: approved.", "the first press resent")
        decided = t.ok("GET", "/v1/approvals/" + a["id"])
        self.assertEqual((decided["status"], decided["decided_by"]),
                         ("approved", "user:" + ann["id"]))
        self.answer(ep, got, self.APPROVED)
        self.assertEqual(self.notes(ep.agent["id"]), [self.NOTE], "one approval, one effect")
        self.edited(m, "Approved by Ann: notes.append\nApproval %s" % a["id"])
        # Once edited the card has no buttons to press.
        st, body, _ = http_request("127.0.0.1:%d" % fake.port, "POST", "/_press", body={
            "url": self.server.base_url + ep.ch["url"], "message_id": m["message_id"],
            "button": "Approve"})
        self.assertEqual(st, 400, body)

    def test_a_badly_signed_press_is_401_and_decides_nothing(self):
        t, fake = self.t, self.fake
        ep, ann, _ = self.cards()
        got, reply, a = self.park(ep)
        m = self.card(DM1, a, ep)
        self.card_reply(ep, "approval:%s:%s" % (a["id"], ann["id"]))
        now = int(time.time())
        for what, kw in (("another key", {"wrong_key": True}),
                         ("a zero signature", {"signature": "00" * 64}),
                         ("no signature", {"signature": None}),
                         ("no timestamp", {"timestamp": None}),
                         ("signed 301 s ago", {"timestamp": now - 301}),
                         ("a body changed after signing", {"body_suffix": " "})):
            pressed = ep.press(m["message_id"], "Approve", **kw)
            self.assertEqual(pressed["status"], 401, "%s: %r" % (what, pressed))
            self.undecided(a, reply)
        pressed = ep.press(m["message_id"], "Approve")
        self.assertEqual((pressed["status"], pressed["body"]), (200, {"type": 6}), pressed)
        self.answer(ep, got, self.APPROVED)
        self.edited(m, "Approved by Ann: notes.append\nApproval %s" % a["id"])

    def test_a_decision_through_the_api_edits_the_card(self):
        t, fake = self.t, self.fake
        ep, ann, _ = self.cards()
        got, _, a = self.park(ep)
        m = self.card(DM1, a, ep)
        delivery = "approval:%s:%s" % (a["id"], ann["id"])
        self.card_reply(ep, delivery)
        decided = t.ok("POST", "/v1/approvals/%s/approve" % a["id"], {}, expect=200)
        self.assertEqual(decided["decided_by"], t.token_id)
        self.edited(m, "Approved by an API token: notes.append\nApproval %s" % a["id"])
        self.assertEqual(self.card_reply(ep, delivery, ("sent",))["status"], "sent")
        self.answer(ep, got, self.APPROVED)
        # The button Ann may still see: already decided.
        self.refused(ep.press(m["message_id"], custom_id="keel:reject:" + a["id"]),
                     "Already decided: approved.")
        self.assertEqual(t.ok("GET", "/v1/approvals/" + a["id"])["status"], "approved")

    def test_a_cancelled_run_and_an_expired_approval_edit_their_cards(self):
        t, fake = self.t, self.fake
        ep, ann, _ = self.cards()
        got, reply, a = self.park(ep)
        m = self.card(DM1, a, ep)
        self.card_reply(ep, "approval:%s:%s" % (a["id"], ann["id"]))
        t.ok("POST", "/v1/runs/%s/cancel" % reply["run_id"], {}, expect=200)
        self.edited(m, "Cancelled with its run: notes.append\nApproval " + a["id"])
        self.refused(ep.press(m["message_id"], custom_id="keel:approve:" + a["id"]),
                     "Already decided: cancelled.")
        self.assertIsNone(self.notes(ep.agent["id"]))
        # An approval nobody decides expires (a server of its own, where they last 4 s): its
        # card says so.
        s = self.server = KeelServer(env=dict(server_env(), KEEL_APPROVAL_TIMEOUT_MS="4000"))
        self.addCleanup(s.stop)
        fake = self.fake = FakeDiscord()
        self.addCleanup(fake.stop)
        self.t = Tenant(s)
        ep, ann, _ = self.cards()
        got, reply, a = self.park(ep)
        m = self.card(DM1, a, ep)
        self.card_reply(ep, "approval:%s:%s" % (a["id"], ann["id"]))
        self.edited(m, "Expired: nobody decided in time: notes.append\nApproval " + a["id"])
        self.assertEqual(self.t.ok("GET", "/v1/approvals/" + a["id"])["status"], "expired")
        self.refused(ep.press(m["message_id"], custom_id="keel:approve:" + a["id"]),
                     "Already decided: expired.")
        self.assertIsNone(self.notes(ep.agent["id"]))

    def test_a_card_is_retried_on_429_and_500_and_a_cut_one_is_never_sent_again(self):
        t, fake = self.t, self.fake
        ep, ann, _ = self.cards()
        fake.fail("channel", {"status": 429, "retry_after": 1}, {"status": 500})
        got, reply, a = self.park(ep)
        [m] = fake.wait_messages(kind="channel", channel_id=DM1, timeout=30)
        self.assertEqual([c["status"] for c in fake.calls("channel")], [429, 500, 200])
        delivery = "approval:%s:%s" % (a["id"], ann["id"])
        self.assertEqual(self.card_reply(ep, delivery)["attempts"], 3)
        fake.fail("edit", {"status": 500})
        pressed = ep.press(m["message_id"], "Approve")
        self.assertEqual((pressed["status"], pressed["body"]), (200, {"type": 6}), pressed)
        self.answer(ep, got, self.APPROVED)
        self.card_reply(ep, delivery, ("sent",))
        self.assertEqual([c["status"] for c in fake.calls("edit")], [500, 200])
        self.edited(m, "Approved by Ann: notes.append\nApproval %s" % a["id"])
        # A card whose send is cut may have reached Discord: "unknown", never sent again.
        fake.fail("channel", {"drop": True})
        got, reply, a = self.park(ep)
        delivery = "approval:%s:%s" % (a["id"], ann["id"])
        r = self.card_reply(ep, delivery, ("unknown",))
        self.assertEqual(r["attempts"], 1, r)
        t.ok("POST", "/v1/approvals/%s/approve" % a["id"], {}, expect=200)
        self.answer(ep, got, self.APPROVED)  # by then the card was looked at again
        time.sleep(1.5)
        self.assertEqual(self.t.replies(ep.ch)[delivery]["status"], "unknown")
        self.assertEqual([c["status"] for c in fake.calls("channel")], [429, 500, 200, "drop"])
        self.assertEqual(len(fake.messages(kind="channel")), 1)
        self.assertEqual(len(fake.sent()["edits"]), 1)

    def test_the_separate_approver_rule_holds_on_a_press(self):
        """Ann, an owner, asks in the server channel herself; the policy asks for a separate
        approver: her press is refused, another owner's decides."""
        t, fake = self.t, self.fake
        ep, ann, bob = self.cards(policy={"separate_approver": True})
        t.ok("PUT", "/v1/agents/%s/members/%s" % (ep.agent["id"], bob["id"]), {"role": "owner"},
             expect=200)
        self.answered(ep, "hello from bob", channel=DM2, user=BOB)  # Bob's DM with the bot
        got, reply, a = self.park(ep, user=ANN)
        cards = {c["channel_id"]: c for c in wait_for(
            lambda: (lambda ms: ms if len(ms) >= 2 else None)(
                fake.messages(kind="channel")), 20, "two cards")}
        self.assertEqual(sorted(cards), sorted([DM1, DM2]))
        for user, channel in ((ann, DM1), (bob, DM2)):
            self.card_reply(ep, "approval:%s:%s" % (a["id"], user["id"]))
        self.refused(ep.press(cards[DM1]["message_id"], "Approve"),
                     "The policy asks for a separate approver", "Ann, who asked")
        self.undecided(a, reply)
        pressed = ep.press(cards[DM2]["message_id"], "Approve")  # Bob, in his DM
        self.assertEqual((pressed["status"], pressed["body"]), (200, {"type": 6}), pressed)
        self.assertEqual(t.ok("GET", "/v1/approvals/" + a["id"])["decided_by"],
                         "user:" + bob["id"])
        self.answer(ep, got, self.APPROVED)
        text = "Approved by Bob: notes.append\nApproval %s" % a["id"]
        for m in cards.values():  # both cards say so
            self.edited(m, text)

    def test_no_reachable_approver_is_a_skipped_card_and_nothing_sent(self):
        t, fake = self.t, self.fake
        ep, ann, _ = self.cards(dm=False)
        got, reply, a = self.park(ep)
        r = self.card_reply(ep, "approval:" + a["id"], ("skipped",))
        self.assertEqual((r["kind"], r["approval_id"]), ("approval_card", a["id"]), r)
        self.assertIn(ann["id"], r["error"])
        self.assertEqual(fake.messages(kind="channel"), [])
        self.undecided(a, reply)


class CrashTest(KeelTestCase):
    """kill -9 twice at random moments while 30 commands arrive over two DMs and two guild
    channels and answers go out (some slowly, so that a kill may cut one). Discord does not
    resend an interaction: each that got a 2xx is one message in its channel's session, one
    that did not is at most one; each answer was sent at most once (once when its reply is
    sent), and every reply has ended."""

    def test_interactions_and_answers_across_two_kill9s(self):
        seed = random.randrange(1 << 30)
        rng, pace = random.Random(seed), random.Random(seed + 1)
        fake = FakeDiscord()
        self.addCleanup(fake.stop)
        s = self.server = KeelServer(env=server_env())
        self.addCleanup(s.stop)
        t = Tenant(s)
        ep = t.app(fake)
        # Ann sends 30 commands in seconds: as a member, not a guest held to 20 a minute.
        ann = t.ok("POST", "/v1/users", {"name": "Ann", "identities": [
            {"platform": "discord", "platform_user_id": ANN["id"]}]}, expect=201)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (ep.agent["id"], ann["id"]), {"role": "user"})
        convs = [(DM1, None), (DM2, None), (C1, GUILD), (C2, GUILD)]
        fake.fail("original", *[{"delay": rng.choice((0, 0, 0.3, 0.6))} for _ in range(30)])
        pushed = {}  # interaction id -> (channel, content, status, token)

        def sender():
            for i in range(30):
                channel, guild = convs[i % len(convs)]
                text = "crash %d" % i
                got = ep.command(text, channel=channel, guild=guild)
                content = "Ann: " + text if guild else text
                pushed[got["interaction_id"]] = (channel, content, got["status"], got["token"])
                time.sleep(pace.uniform(0.03, 0.25))

        th = threading.Thread(target=sender)
        th.start()
        for _ in range(2):
            time.sleep(rng.uniform(0.4, 1.6))
            s.kill9()
            s.start()
        th.join()
        why = "seed %d" % seed
        self.assertEqual(len(pushed), 30, why)
        ok = {i for i, p in pushed.items() if p[2] and 200 <= p[2] < 300}
        self.assertTrue(ok, "no interaction was taken (%s)" % why)
        replies = wait_for(lambda: (lambda rs: rs if ok <= set(rs) and all(
            r["status"] in ENDED for r in rs.values()) else None)(t.replies(ep.ch)), 120,
            "a reply to each interaction taken, each ended (%s)" % why)
        self.assertLessEqual(set(replies), set(pushed), why)
        sessions = t.sessions(ep.agent)
        titles = {c: ("dc: channel:" if g else "dc: dm:") + c for c, g in convs}
        self.assertLessEqual(set(sessions), set(titles.values()), why)
        for c, title in titles.items():
            users = t.users(sessions[title]) if title in sessions else []
            for i, (cc, content, _, _) in pushed.items():
                if cc == c:
                    self.assertLessEqual(users.count(content), 1, "%s twice (%s)" % (i, why))
                    if i in ok:
                        self.assertEqual(users.count(content), 1, "%s lost (%s)" % (i, why))
            self.assertLessEqual(set(users), {p[1] for p in pushed.values() if p[0] == c}, why)
        messages = fake.sent()["messages"]
        for i, r in replies.items():
            channel, content, _, token = pushed[i]
            self.assertIn(r["status"], ("sent", "unknown"), "%r (%s)" % (r, why))
            copies = [m for m in messages if m.get("token") == token]
            self.assertLessEqual(len(copies), 1, "%s answered twice (%s)" % (i, why))
            if r["status"] == "sent":
                self.assertEqual([(m["kind"], m["content"]) for m in copies],
                                 [("original", said(content))], "%s (%s)" % (i, why))
        self.assertEqual([m for m in messages if m["kind"] != "original"], [], why)
        delivered = [e["payload"]["delivery_id"] for e in t.events("channel.delivered@v1",
                                                                   ep.ch)]
        self.assertEqual(len(delivered), len(set(delivered)), "a delivery twice (%s)" % why)
        # Each reply is a delivery's. An interaction the kill cut before its answer (Discord does
        # not send it again) may have been recorded without a reply: nobody waits for one.
        self.assertLessEqual(set(replies), set(delivered), why)
        self.assertLessEqual(ok, set(delivered), why)


if __name__ == "__main__":
    unittest.main()

"""Slack channels: a Slack app bound to an agent, whose Events API requests (POSTed by
tests/fakes/fake_slack.py to the channel's Request URL, /v1/hooks/{id}) Keel verifies, posts into
the session of their conversation, and answers through the durable outbox with chat.postMessage
to the fake's Web API, attacked.

End to end (url_verification answered with its challenge; a direct message, one session per DM
channel, its text as sent; an app_mention, one session per thread, the bot's mention removed;
the answer escaped and posted with the bot token, in the mention's thread; a retried event one
message and one answer); what the agent does not take (channel messages, bots, edits, the bot
itself, other event types: 200 and nothing written; an event_callback without an event_id: 400);
forged, stale, unsigned and tampered requests (401, nothing written); the outbox (429 after
Retry-After, 500 with backoff, Slack's ok:false errors dead at once, a dropped send unknown and
never repeated; escaping; answers past 4,000 characters split in one thread; <NO_REPLY>); roles,
tenants, settings validation and no answer, event or log line holding a secret's value; kill -9
twice while events are pushed and answers sent.

Every answer a Tenant receives is checked for its secrets' values. Each test has a fake of its
own. Runs on SQLite and, with KEEL_TEST_STORE=postgres, on PostgreSQL."""

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
BOT_USER = "UBOT0001"
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes", "fake_slack.py")
ENDED = ("sent", "skipped", "unknown", "dead")
SERVER = None


def server_env():
    return {"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": "127.0.0.1/32"}


def setUpModule():
    global SERVER
    SERVER = KeelServer(env=server_env())


def tearDownModule():
    SERVER.stop()


def bot_token():
    return "xoxb-%d-%d-%s" % (random.randrange(10**11, 10**12), random.randrange(10**12, 10**13),
                              secrets.token_hex(12))


def said(text):
    return 'You said: "%s"' % text


def escaped(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class FakeSlack:
    """tests/fakes/fake_slack.py in a process of its own, and its control endpoints."""

    def __init__(self):
        self.token = bot_token()
        self.proc = subprocess.Popen([sys.executable, FAKE, "--token", self.token],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().strip())
        self.api_base = "http://127.0.0.1:%d/api" % self.port

    def control(self, method, path, body=None):
        st, data, _ = http_request("127.0.0.1:%d" % self.port, method, path, body=body,
                                   timeout=60)
        assert st == 200, "fake %s %s -> %s %r" % (method, path, st, data)
        return data

    def sent(self):
        return self.control("GET", "/_sent")

    def fail(self, method, *answers):
        self.control("POST", "/_fail", {"method": method, "answers": list(answers)})

    def to(self, channel):
        return [m for m in self.sent()["messages"] if m["channel"] == channel]

    def posts(self, channel):
        """chat.postMessage calls to the channel, answered or not."""
        return [c for c in self.sent()["calls"]
                if c["method"] == "chat.postMessage" and c.get("channel") == channel]

    def wait_sent(self, channel, n=1, timeout=30):
        return wait_for(lambda: (lambda ms: ms if len(ms) >= n else None)(self.to(channel)),
                        timeout, "%d message(s) posted to %s" % (n, channel))

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


class App:
    """A slack channel of an agent as the Slack app sees it: push() sends one Events API request
    to the channel's Request URL (the server's current address + its url), signed with the
    signing secret's value; the fake answers with Keel's status and body."""

    def __init__(self, server, fake, agent, ch, signing):
        self.server, self.fake, self.agent, self.ch, self.signing = server, fake, agent, ch, signing

    def push(self, **body):
        base = self.server.base_url or "http://127.0.0.1:1"  # down: the POST fails
        body.setdefault("signing_secret", self.signing)
        return self.fake.control("POST", "/_event", dict(body, url=base + self.ch["url"]))

    def dm(self, channel, text, user="U0ANN", thread_ts=None, **kw):
        return self.push(dm={"channel": channel, "user": user, "text": text,
                             "thread_ts": thread_ts}, **kw)

    def mention(self, channel, text, user="U0BOB", thread_ts=None, **kw):
        return self.push(mention={"channel": channel, "user": user, "text": text,
                                  "thread_ts": thread_ts}, **kw)

    def taken(self, got):
        """Asserts Keel took a push (200); returns its event_id."""
        assert got["status"] == 200, "the push was not taken: %r" % got
        return got["event_id"]


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

    def secret(self, value):
        name = "SL_" + os.urandom(6).hex().upper()
        self.never.append(value)
        self.ok("PUT", "/v1/secrets/" + name, {"value": value}, expect=204)
        return name

    def app(self, fake, model="local", config=None, **settings):
        """A new agent, its two secrets and a slack channel `sl` posting to `fake`; an App."""
        signing = secrets.token_hex(16)  # Slack's signing secrets are 32 hex characters
        settings = dict({"signing_secret": self.secret(signing),
                         "bot_token": self.secret(fake.token), "api_base": fake.api_base},
                        **settings)
        agent = self.server.create_agent(model=model, config=config, token=self.token)
        # Anyone on the platform may talk to it (an agent is private until said).
        self.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "public"})
        ch = self.ok("POST", "/v1/agents/%s/channels" % agent["id"],
                     {"kind": "slack", "name": "sl", "settings": settings}, expect=201)
        return App(self.server, fake, agent, ch, signing)

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

    def wait_reply(self, ch, event_id, statuses=ENDED, timeout=30):
        return wait_for(lambda: (lambda r: r if r and r["status"] in statuses else None)(
            self.replies(ch).get(event_id)), timeout,
            "the reply to event %s %s" % (event_id, "/".join(statuses)))

    def sessions(self, agent):
        return {s["title"]: s for s in self.pages("/v1/agents/%s/sessions" % agent["id"])}

    def users(self, session):
        return [m["content"] for m in self.pages("/v1/sessions/%s/messages" % session["id"])
                if m["role"] == "user"]

    def events(self, kind, ch):
        return [e for e in self.server.all_events(token=self.token)
                if e["type"] == kind and e["payload"].get("channel_id") == ch["id"]]


class SlackCase(KeelTestCase):
    """The module's server, a fresh tenant and a fake of the test's own. app() deletes its
    channel when the test ends, before the fake stops."""

    def setUp(self):
        self.server = SERVER
        self.t = Tenant(SERVER)
        self.fake = FakeSlack()
        self.addCleanup(self.fake.stop)

    def app(self, fake=None, **kw):
        app = self.t.app(fake or self.fake, **kw)
        self.addCleanup(self.t.request, "DELETE", "/v1/channels/" + app.ch["id"])
        return app

    def answered(self, app, channel, text, n=1):
        """A direct message, taken; the channel's messages once the nth is posted."""
        app.taken(app.dm(channel, text))
        return self.fake.wait_sent(channel, n)

    def assertNoLeak(self, *values):
        events = json.dumps(self.server.all_events(token=self.t.token))
        log = ""
        for path in (self.server.stderr_path, self.server.stdout_path):
            with open(path, errors="replace") as f:
                log += f.read()
        for value in values:
            self.assertNotIn(value, events, "an event holds a secret's value")
            self.assertNotIn(value, log, "the server's log holds a secret's value")


class EndToEndTest(SlackCase):
    def test_direct_messages_are_answered_each_in_its_session(self):
        t, fake = self.t, self.fake
        app = self.app()
        agent, ch = app.agent, app.ch
        self.assertEqual((ch["kind"], ch["name"], ch["enabled"], ch["status"], ch["url"]),
                         ("slack", "sl", True, "ready", "/v1/hooks/" + ch["id"]))
        self.assertEqual(ch["settings"], {"signing_secret": ch["settings"]["signing_secret"],
                                          "bot_token": ch["settings"]["bot_token"],
                                          "api_base": fake.api_base, "role": "guest"})
        # Slack checks the Request URL first: the challenge back, as JSON.
        got = app.push(url_verification=True)
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(json.loads(got["body"]), {"challenge": got["challenge"]})
        texts = {"D0AAA1": ["hello there", "second"], "D0BBB2": ["other conversation"]}
        ids = {"D0AAA1": [app.taken(app.dm("D0AAA1", "hello there"))]}
        [m] = fake.wait_sent("D0AAA1")
        self.assertEqual((m["text"], m["_text"]), (said("hello there"), said("hello there")))
        self.assertNotIn("thread_ts", m, "a DM answer to a top-level message is not threaded")
        ids["D0AAA1"].append(app.taken(app.dm("D0AAA1", "second")))
        ids["D0BBB2"] = [app.taken(app.dm("D0BBB2", "other conversation", user="U0CAT"))]
        fake.wait_sent("D0AAA1", 2)
        fake.wait_sent("D0BBB2")
        for e in ids["D0AAA1"] + ids["D0BBB2"]:
            t.wait_reply(ch, e)
        sessions = t.sessions(agent)
        self.assertEqual(sorted(sessions), ["sl: im:D0AAA1", "sl: im:D0BBB2"])
        replies = t.replies(ch)
        self.assertEqual(sorted(replies), sorted(ids["D0AAA1"] + ids["D0BBB2"]))
        for channel, events in ids.items():
            session = sessions["sl: im:" + channel]
            self.assertEqual(t.users(session), texts[channel])
            answers = [m for m in t.pages("/v1/sessions/%s/messages" % session["id"])
                       if m["role"] == "assistant"]
            self.assertEqual([a["content"] for a in answers], [said(x) for x in texts[channel]])
            for m, e, a in zip(fake.to(channel), events, answers):
                self.assertEqual(m["text"], a["content"])
                r = replies[e]
                self.assertEqual((r["channel_id"], r["session_id"], r["run_id"], r["status"],
                                  r["text"], r["parts_sent"], r["attempts"], r["error"]),
                                 (ch["id"], session["id"], a["run_id"], "sent", a["content"],
                                  1, 1, ""))
        self.assertEqual(sorted(e["payload"]["delivery_id"]
                                for e in t.events("channel.delivered@v1", ch)), sorted(replies))
        self.assertEqual(sorted(e["payload"]["reply_id"]
                                for e in t.events("channel.replied@v1", ch)),
                         sorted(r["id"] for r in replies.values()))
        # A DM in a thread: the same session, the answer in that thread.
        root = fake.to("D0AAA1")[0]["_ts"]
        app.taken(app.dm("D0AAA1", "in a thread", thread_ts=root))
        m = fake.wait_sent("D0AAA1", 3)[2]
        self.assertEqual((m["text"], m.get("thread_ts")), (said("in a thread"), root))
        self.assertEqual(sorted(t.sessions(agent)), ["sl: im:D0AAA1", "sl: im:D0BBB2"])
        # Slack's retries of an event: 200, no second message, no second answer.
        for n in (1, 2):
            self.assertEqual(app.push(event_id=ids["D0AAA1"][0], retry_num=n)["status"], 200)
        self.answered(app, "D0BBB2", "anchor", 2)
        self.assertEqual(t.users(sessions["sl: im:D0AAA1"]), texts["D0AAA1"] + ["in a thread"])
        self.assertEqual(len(fake.to("D0AAA1")), 3, "a retried event was answered again")
        self.assertEqual(len(t.replies(ch)), 5)
        self.assertEqual(fake.sent()["unauthorized"], 0)

    def test_mentions_open_a_session_per_thread(self):
        t, fake = self.t, self.fake
        app = self.app()
        c = "C0GENERAL"
        first = app.mention(c, "<@%s> first question" % BOT_USER)
        root = first["ts"]
        app.taken(first)
        [m] = fake.wait_sent(c)
        self.assertEqual((m["text"], m.get("thread_ts")), (said("first question"), root))
        # In the same thread (the mention last, another user's kept): the same session; the
        # answer escaped, so that Slack shows <@U0OTHER> as text and pings nobody.
        app.taken(app.mention(c, "ask <@U0OTHER> about it <@%s>" % BOT_USER, thread_ts=root))
        m = fake.wait_sent(c, 2)[1]
        self.assertEqual((m["text"], m["_text"], m.get("thread_ts")),
                         (escaped(said("ask <@U0OTHER> about it")),
                          said("ask <@U0OTHER> about it"), root))
        # A new thread, and a mention inside a thread a person started: a session each.
        other = app.mention(c, "  <@%s>   another topic  " % BOT_USER)
        app.taken(other)
        started = "1700000000.000100"
        app.taken(app.mention(c, "<@%s> joining in" % BOT_USER, thread_ts=started))
        posted = {m["_text"]: m.get("thread_ts") for m in fake.wait_sent(c, 4)}
        self.assertEqual(posted[said("another topic")], other["ts"])
        self.assertEqual(posted[said("joining in")], started)
        sessions = t.sessions(app.agent)
        want = {root: ["first question", "ask <@U0OTHER> about it"],
                other["ts"]: ["another topic"], started: ["joining in"]}
        self.assertEqual(sorted(sessions), sorted("sl: thread:%s:%s" % (c, r) for r in want))
        for r, contents in want.items():
            self.assertEqual(t.users(sessions["sl: thread:%s:%s" % (c, r)]), contents)
        self.assertEqual(fake.sent()["unescaped"], 0)


class OwnersTest(SlackCase):
    def test_an_owner_is_heard_in_a_channel_without_a_mention_and_no_one_else_is(self):
        # The app subscribed to message.channels: every message of the channel comes, and a
        # mention twice (as a message and as an app_mention).
        t, fake = self.t, self.fake
        app = self.app()
        olga = t.ok("POST", "/v1/users", {"name": "Olga", "identities": [
            {"platform": "slack", "platform_user_id": "U0OLGA"}]}, expect=201)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (app.agent["id"], olga["id"]),
             {"role": "owner"})
        c = "C0TEAM"

        def message(user, text, **kw):
            ts = "%.6f" % time.time()
            return app.taken(app.push(event=dict({
                "type": "message", "channel": c, "channel_type": "channel", "user": user,
                "text": text, "ts": ts, "event_ts": ts}, **kw))), ts

        heard, root = message("U0OLGA", "status of the deploy?")
        [m] = fake.wait_sent(c)
        self.assertEqual((m["_text"], m.get("thread_ts")), (said("status of the deploy?"), root))
        t.wait_reply(app.ch, heard)
        # Another's message calls no one: passed over, nothing written.
        ignored, _ = message("U0ANN", "lunch anyone?")
        # A mention comes as a message (passed over) and as an app_mention (taken once).
        mention_text = "<@%s> what about you?" % BOT_USER
        twice, _ = message("U0ANN", mention_text)
        app.taken(app.mention(c, mention_text, user="U0ANN"))
        fake.wait_sent(c, 2)
        time.sleep(1)
        replies = t.replies(app.ch)
        self.assertNotIn(ignored, replies)
        self.assertNotIn(twice, replies)
        self.assertEqual([x["_text"] for x in fake.to(c)],
                         [said("status of the deploy?"), said("what about you?")])
        delivered = [e["payload"]["delivery_id"] for e in t.events("channel.delivered@v1",
                                                                    app.ch)]
        self.assertNotIn(ignored, delivered)
        self.assertNotIn(twice, delivered)


class IgnoredTest(SlackCase):
    def test_what_the_agent_does_not_take_is_200_and_writes_nothing(self):
        t, fake = self.t, self.fake
        app = self.app()
        now = "%d.000200" % time.time()
        msg = {"type": "message", "user": "U0ANN", "text": "hello all", "ts": now,
               "event_ts": now}
        ignored = [
            ("a channel message", dict(msg, channel="C0X", channel_type="channel")),
            ("a private channel message", dict(msg, channel="G0X", channel_type="group")),
            ("a group DM message", dict(msg, channel="G0Y", channel_type="mpim")),
            ("a bot's DM", dict(msg, channel="D0X", channel_type="im", bot_id="B0OTHER")),
            ("a bot_message", dict(msg, channel="D0X", channel_type="im", subtype="bot_message",
                                   bot_id="B0OTHER")),
            ("an edit", {"type": "message", "subtype": "message_changed", "channel": "D0X",
                         "channel_type": "im", "ts": now, "event_ts": now, "hidden": True,
                         "message": dict(msg, text="edited")}),
            ("the bot's own message", dict(msg, channel="D0X", channel_type="im",
                                           user=BOT_USER)),
            ("the bot mentioning itself", {"type": "app_mention", "user": BOT_USER,
                                           "channel": "C0X", "ts": now, "event_ts": now,
                                           "text": "<@%s> me" % BOT_USER}),
            ("a reaction", {"type": "reaction_added", "user": "U0ANN", "reaction": "thumbsup",
                            "item_user": BOT_USER, "event_ts": now,
                            "item": {"type": "message", "channel": "C0X", "ts": now}}),
        ]
        for what, event in ignored:
            got = app.push(event=event)
            self.assertEqual(got["status"], 200, "%s: %r" % (what, got))
        got = app.push(dm={"channel": "D0X", "user": "U0ANN", "text": "no id"}, event_id=None)
        self.assertEqual(got["status"], 400, got)
        anchor = app.taken(app.dm("D0ANCHOR", "anchor"))
        fake.wait_sent("D0ANCHOR")
        t.wait_reply(app.ch, anchor)
        self.assertEqual(list(t.sessions(app.agent)), ["sl: im:D0ANCHOR"])
        self.assertEqual(list(t.replies(app.ch)), [anchor])
        self.assertEqual([e["payload"]["delivery_id"]
                          for e in t.events("channel.delivered@v1", app.ch)], [anchor])
        self.assertEqual([m["channel"] for m in fake.sent()["messages"]], ["D0ANCHOR"])


class SignatureTest(SlackCase):
    def test_forged_stale_unsigned_and_tampered_requests_are_401_and_write_nothing(self):
        t, fake = self.t, self.fake
        app = self.app()
        before = len(self.server.all_events(token=t.token))
        now = int(time.time())
        dm = {"channel": "D0EVE", "user": "U0EVE", "text": "forged"}
        cases = [("another secret", {"signing_secret": secrets.token_hex(16)}),
                 ("a zero signature", {"signature": "v0=" + "0" * 64}),
                 ("a v1 signature", {"signature": "v1=" + "0" * 64}),
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
            got = app.push(dm=dm, **kw)
            self.assertEqual(got["status"], 401, "%s: %r" % (what, got))
            got = app.push(url_verification=True, **kw)
            self.assertEqual(got["status"], 401, "url_verification, %s: %r" % (what, got))
            self.assertNotIn(got["challenge"], got["body"])
        self.assertEqual(t.sessions(app.agent), {}, "a forgery opened a session")
        self.assertEqual(len(self.server.all_events(token=t.token)), before,
                         "a forgery wrote events")
        self.assertEqual(fake.posts("D0EVE"), [])
        # 200 s old, correctly signed: within the tolerance, taken.
        event = app.taken(app.dm("D0ANN", "a little late", timestamp=now - 200))
        fake.wait_sent("D0ANN")
        self.assertEqual(t.wait_reply(app.ch, event)["status"], "sent")


class OutboxTest(SlackCase):
    """The outbox against the fake's injected failures; each answer is sent at most once."""

    def sent_after(self, failures, text):
        """The reply to a DM whose answer meets `failures` first; the chat.postMessage calls."""
        app = self.app()
        self.fake.fail("chat.postMessage", *failures)
        r = self.t.wait_reply(app.ch, app.taken(app.dm("D0ANN", text)), timeout=40)
        self.assertEqual((r["status"], r["attempts"]), ("sent", len(failures) + 1), r)
        self.assertEqual([m["text"] for m in self.fake.to("D0ANN")], [said(text)])
        return self.fake.posts("D0ANN")

    def test_429_is_retried_after_retry_after_and_sent_once(self):
        calls = self.sent_after([{"status": 429, "retry_after": 2}], "rate limited")
        self.assertEqual([c["status"] for c in calls], [429, 200])
        self.assertGreaterEqual(calls[1]["at"] - calls[0]["at"], 1.9, "Retry-After not waited")

    def test_500_is_retried_with_backoff_and_sent_once(self):
        calls = self.sent_after([{"status": 500}, {"status": 500}], "server trouble")
        self.assertEqual([c["status"] for c in calls], [500, 500, 200])
        gaps = [b["at"] - a["at"] for a, b in zip(calls, calls[1:])]
        self.assertGreaterEqual(gaps[0], 0.8, gaps)
        self.assertGreaterEqual(gaps[1], 1.6, "no backoff: %s" % gaps)

    def test_slacks_refusals_are_dead_at_once_and_a_cut_send_is_unknown(self):
        t, fake = self.t, self.fake
        app = self.app()
        for channel, failure, status in (
                ("D0NF", {"error": "channel_not_found"}, "dead"),
                ("D0NIC", {"error": "not_in_channel"}, "dead"),
                ("D0AUTH", {"error": "invalid_auth"}, "dead"),
                ("D0DROP", {"drop": True}, "unknown")):
            fake.fail("chat.postMessage", failure)
            r = t.wait_reply(app.ch, app.taken(app.dm(channel, "doomed")), (status,))
            self.assertEqual(r["attempts"], 1, r)
            if status == "dead":
                self.assertIn(failure["error"], r["error"])
            failed = [e["payload"] for e in t.events("channel.reply_failed@v1", app.ch)
                      if e["payload"].get("reply_id") == r["id"]]
            self.assertEqual([p["status"] for p in failed], [status], failed)
        self.answered(app, "D0ANCHOR", "anchor")  # by then none was tried again
        for channel in ("D0NF", "D0NIC", "D0AUTH", "D0DROP"):
            self.assertEqual(len(fake.posts(channel)), 1, "%s's answer was resent" % channel)
            self.assertEqual(fake.to(channel), [])

    LINES = "\n".join("%03d " % i + "x" * 60 for i in range(150))  # 9,749 characters
    LONG = "y" * 9001  # no newline, no space
    MARKUP = "a < b && c > d: <@U0OTHER> <!channel> <https://evil.example|click> &amp; &lt;"

    def test_escaping_long_answers_and_no_reply(self):
        t, fake = self.t, self.fake
        app = self.app(config={"local_rules": [
            {"match": "markup", "reply": self.MARKUP},
            {"match": "many lines", "reply": self.LINES},
            {"match": "one long line", "reply": self.LONG},
            {"match": "quiet", "reply": "Nothing to add. <NO_REPLY>"}]})
        # Escaped: Slack shows the answer as written, with no mention, @channel or link.
        e = app.taken(app.dm("D0ESC", "markup please"))
        [m] = fake.wait_sent("D0ESC")
        self.assertEqual((m["text"], m["_text"]), (escaped(self.MARKUP), self.MARKUP))
        self.assertEqual(fake.sent()["unescaped"], 0)
        self.assertEqual(t.wait_reply(app.ch, e)["text"], self.MARKUP)
        # Long: parts of at most 4,000 characters, cut at newlines where there are some, in
        # order and in one thread.
        for channel, got, answer, n in (
                ("C0LONG", app.mention("C0LONG", "<@%s> many lines" % BOT_USER), self.LINES, 3),
                ("D0LONG", app.dm("D0LONG", "one long line"), self.LONG, 3)):
            e = app.taken(got)
            parts = fake.wait_sent(channel, n)
            self.assertEqual(len(fake.to(channel)), n)
            pos = 0
            for i, p in enumerate(m["text"] for m in parts):
                self.assertLessEqual(len(p), 4000)
                self.assertEqual(answer[pos:pos + len(p)], p, "part %d is not the next" % i)
                pos += len(p)
                if i < n - 1 and "\n" in answer:
                    self.assertTrue(p.endswith("\n") or answer[pos] == "\n",
                                    "part %d was not cut at a newline" % i)
                if i < n - 1 and answer[pos:pos + 1] == "\n":
                    pos += 1  # the newline it was cut at may be left out
            self.assertEqual(pos, len(answer), "the parts do not make up the answer")
            want = got["ts"] if channel.startswith("C") else parts[0].get("thread_ts")
            self.assertEqual([m.get("thread_ts") for m in parts], [want] * n, "one thread")
            self.assertEqual([m["_ts"] for m in parts], sorted(m["_ts"] for m in parts))
            r = t.wait_reply(app.ch, e)
            self.assertEqual((r["status"], r["parts_sent"]), ("sent", n), r)
        # <NO_REPLY>: skipped, nothing posted.
        e = app.taken(app.dm("D0QUIET", "be quiet"))
        self.assertEqual(t.wait_reply(app.ch, e)["status"], "skipped")
        self.answered(app, "D0ANCHOR", "anchor")
        self.assertEqual(fake.posts("D0QUIET"), [], "a <NO_REPLY> answer was posted")


class AccessTest(SlackCase):
    def test_roles_tenants_and_no_secret_anywhere(self):
        t, fake = self.t, self.fake
        app = self.app()
        ch = app.ch
        self.answered(app, "D0ANN", "hello")
        one, replies = "/v1/channels/" + ch["id"], "/v1/channels/%s/replies" % ch["id"]
        channels = "/v1/agents/%s/channels" % app.agent["id"]
        create = {"kind": "slack", "name": "mine", "settings": {
            "signing_secret": t.secret(secrets.token_hex(16)),
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
            "kind": "slack", "name": "steal", "settings": dict(ch["settings"])}),
            400, "invalid_argument")
        t.ok("PATCH", one, {"settings": dict(ch["settings"], role="user")})
        self.answered(app, "D0ANN", "still mine", 2)
        self.assertNoLeak(app.signing, fake.token)


class ValidationTest(SlackCase):
    def test_bad_settings_are_400_and_a_signing_secret_serves_one_channel(self):
        t, fake = self.t, self.fake
        signing, token = t.secret(secrets.token_hex(16)), t.secret(fake.token)
        agent = self.server.create_agent(token=t.token)
        path = "/v1/agents/%s/channels" % agent["id"]
        s = {"signing_secret": signing, "bot_token": token, "api_base": fake.api_base}

        def body(**settings):
            return {"kind": "slack", "name": unique_name("v"), "settings": dict(s, **settings)}
        no_signing, no_token = body(), body()
        del no_signing["settings"]["signing_secret"], no_token["settings"]["bot_token"]
        for what, b, names in (
                ("no settings", {"kind": "slack", "name": "x", "settings": {}}, None),
                ("no signing_secret", no_signing, "signing_secret"),
                ("no bot_token", no_token, "bot_token"),
                ("a missing signing secret", body(signing_secret="NO_SUCH"), "signing_secret"),
                ("a missing bot token", body(bot_token="NO_SUCH"), "bot_token"),
                ("bot_token not a string", body(bot_token=7), "bot_token"),
                ("role owner", body(role="owner"), None),
                ("an unknown field", body(channel="C0X"), None),
                ("settings not an object", {"kind": "slack", "name": "y", "settings": "x"},
                 None)):
            err = self.assertError(t.request("POST", path, b), 400, "invalid_argument", what)
            if names:
                self.assertIn(names, err["message"], what)
        self.assertEqual(t.ok("GET", path)["items"], [], "a refused channel was written")
        # Defaults filled in (disabled: it points at the real Slack).
        ch = t.ok("POST", path, {"kind": "slack", "name": "sl", "enabled": False, "settings": {
            "signing_secret": signing, "bot_token": token}}, expect=201)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch["id"])
        self.assertEqual(ch["settings"], {"signing_secret": signing, "bot_token": token,
                                          "api_base": "https://slack.com/api", "role": "guest"})
        self.assertEqual((ch["status"], ch["url"]), ("disabled", "/v1/hooks/" + ch["id"]))
        # A signing secret serves one channel, in this agent or another.
        other = self.server.create_agent(token=t.token)
        for where in (path, "/v1/agents/%s/channels" % other["id"]):
            self.assertError(t.request("POST", where, body(bot_token=t.secret(bot_token()))),
                             409, "conflict", "a shared signing secret")
        second = dict(body(signing_secret=t.secret(secrets.token_hex(16)),
                           bot_token=t.secret(bot_token())), enabled=False)
        second = t.ok("POST", path, second, expect=201)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + second["id"])
        self.assertError(t.request("PATCH", "/v1/channels/" + second["id"], {
            "settings": dict(second["settings"], signing_secret=signing)}), 409, "conflict")


class CrashTest(KeelTestCase):
    """kill -9 twice at random moments while 30 events are pushed over three DMs and two
    threads and answers go out (some slowly, so that a kill may cut one); afterwards Slack's
    retries of the pushes it saw no 2xx for are sent: every event is then one message in its
    conversation's session (one for a push that got a 2xx), each answer was posted at most once
    (once when its reply is sent), and every reply has ended."""

    def test_events_and_answers_across_two_kill9s(self):
        seed = random.randrange(1 << 30)
        rng, pace = random.Random(seed), random.Random(seed + 1)
        fake = FakeSlack()
        self.addCleanup(fake.stop)
        s = self.server = KeelServer(env=server_env())
        self.addCleanup(s.stop)
        t = Tenant(s)
        app = t.app(fake)
        roots = {"C0ONE": "1700000000.000100", "C0TWO": "1700000000.000200"}
        convs = ["D0ONE", "D0TWO", "D0THREE", "C0ONE", "C0TWO"]
        fake.fail("chat.postMessage",
                  *[{"delay": rng.choice((0, 0, 0.3, 0.6))} for _ in range(30)])
        pushed = {}  # event_id -> (channel, content, status of the first push)

        def sender():
            for i in range(30):
                channel, text = convs[i % len(convs)], "crash %d" % i
                if channel.startswith("D"):
                    got = app.dm(channel, text)
                else:
                    got = app.mention(channel, "<@%s> %s" % (BOT_USER, text),
                                      thread_ts=roots[channel])
                pushed[got["event_id"]] = (channel, text, got["status"])
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
        for event_id, (_, _, status) in pushed.items():  # Slack retries what it saw fail,
            if not (status and 200 <= status < 300):        # three times at most
                for n in (1, 2, 3):
                    got = app.push(event_id=event_id, retry_num=n)
                    if got["status"] == 200:
                        break
                    time.sleep(1)
                self.assertEqual(got["status"], 200, "the retries of %s: %r (%s)"
                                 % (event_id, got, why))
        replies = wait_for(lambda: (lambda rs: rs if len(rs) == 30 and all(
            r["status"] in ENDED for r in rs.values()) else None)(t.replies(app.ch)), 120,
            "30 replies, each ended (%s)" % why)
        self.assertEqual(sorted(replies), sorted(pushed), why)
        sessions = t.sessions(app.agent)
        titles = {c: "sl: im:" + c if c.startswith("D") else "sl: thread:%s:%s" % (c, roots[c])
                  for c in convs}
        self.assertEqual(sorted(sessions), sorted(titles.values()), why)
        for c in convs:
            self.assertEqual(sorted(t.users(sessions[titles[c]])),
                             sorted(text for ch, text, _ in pushed.values() if ch == c),
                             "%s: each event one message (%s)" % (c, why))
        messages = fake.sent()["messages"]
        for event_id, (channel, text, _) in pushed.items():
            r = replies[event_id]
            self.assertIn(r["status"], ("sent", "unknown"), "%r (%s)" % (r, why))
            copies = [m for m in messages if m["channel"] == channel and m["text"] == said(text)]
            self.assertLessEqual(len(copies), 1, "%s answered twice (%s)" % (event_id, why))
            if r["status"] == "sent":
                self.assertEqual(len(copies), 1, "%s is sent but was not (%s)" % (event_id, why))
                if channel.startswith("C"):
                    self.assertEqual(copies[0].get("thread_ts"), roots[channel], why)
        delivered = [e["payload"]["delivery_id"] for e in t.events("channel.delivered@v1",
                                                                   app.ch)]
        self.assertEqual(sorted(delivered), sorted(replies), why)


if __name__ == "__main__":
    unittest.main()

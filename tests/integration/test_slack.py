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
twice while events are pushed and answers sent; approval cards (a tool call parked for a human
shown to the agent's owner in their IM with the bot, Approve and Reject pressed as Slack's signed
block_actions requests, the wrong person's, a second and a forged press refused, a decision
through the API closing the card, a card in the conversation when the policy allows it).

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

    def app(self, fake, model="local", config=None, tools=None, **settings):
        """A new agent (with `tools`), its two secrets and a slack channel `sl` posting to
        `fake`; an App."""
        signing = secrets.token_hex(16)  # Slack's signing secrets are 32 hex characters
        settings = dict({"signing_secret": self.secret(signing),
                         "bot_token": self.secret(fake.token), "api_base": fake.api_base},
                        **settings)
        agent = self.server.create_agent(model=model, config=config, tools=tools,
                                         token=self.token)
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

        # A reply in a thread the agent talks in answers it: taken, in that thread's session.
        sessions = t.sessions(app.agent)
        replied, _ = message("U0ANN", "and the rollback plan?", thread_ts=root)
        t.wait_reply(app.ch, replied)
        m = fake.wait_sent(c, 3)[2]
        self.assertEqual((m["_text"], m.get("thread_ts")), (said("and the rollback plan?"), root))
        self.assertEqual(t.users(sessions["sl: thread:%s:%s" % (c, root)]),
                         ["status of the deploy?", "and the rollback plan?"])
        # A reply in a thread it does not talk in (a person's, no mention) calls no one.
        elsewhere, _ = message("U0ANN", "+1", thread_ts="1700000000.000200")
        time.sleep(1)
        self.assertNotIn(elsewhere, t.replies(app.ch))
        self.assertEqual(len(fake.to(c)), 3)
        self.assertNotIn("sl: thread:%s:1700000000.000200" % c, t.sessions(app.agent))
        # On a private agent a stranger's reply in that thread is passed over in silence: no
        # notice in the thread, nothing recorded.
        t.ok("PUT", "/v1/agents/%s/access" % app.agent["id"], {"level": "private"})
        stranger, _ = message("U0STRANGER", "+1, same question", thread_ts=root)
        member, _ = message("U0OLGA", "thanks", thread_ts=root)
        t.wait_reply(app.ch, member)
        self.assertNotIn(stranger, t.replies(app.ch))
        self.assertEqual([x["_text"] for x in fake.to(c)][3:], [said("thanks")])
        self.assertNotIn(stranger, [e["payload"]["delivery_id"]
                                    for e in t.events("channel.delivered@v1", app.ch)])


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


# The frame of the approval cards' tests: every tool with read and write, no approval, except
# notes.append, which always needs a human (as in test_approvals.py).
APPROVAL_FRAME = {"rules": [
    {"tool": "*", "rights": ["read", "write"], "approval": "never"},
    {"tool": "notes.append", "rights": ["write"], "approval": "always"},
]}


def note_call(line):
    return "/call notes.append " + json.dumps({"line": line})


def note_answer(line):
    """The local model's answer once notes.append appended `line`."""
    return "The tool notes.append returned: %s." % json.dumps({"appended": line},
                                                               separators=(",", ":"))


class ApprovalCardTest(SlackCase):
    """Approval cards on Slack (docs/CHANNELS.md, "Approvals in chat"): a run that an
    app_mention started calls notes.append, which the tenant's policy parks for a human. Olga,
    the agent's owner with a Slack identity, has written to the bot in her IM (D0OLGA): the card
    goes there (chat.postMessage with a section and an actions block), a press of its buttons
    comes back as Slack's signed block_actions interactivity request to the channel's url, and
    once decided (by a press or otherwise) the card is edited with chat.update and loses its
    buttons. A refused press decides nothing and is told to the presser with
    chat.postEphemeral."""

    IM, TEAM_CHANNEL, OLGA = "D0OLGA", "C0TEAM", "U0OLGA"

    def setUp(self):
        super().setUp()
        self.prepare()

    def own_server(self, **env):
        """A server of the test's own (with `env`), prepared as setUp prepares the module's."""
        self.server = KeelServer(env=dict(server_env(), **env))
        self.addCleanup(self.server.stop)
        self.t = Tenant(self.server)
        self.prepare()

    def prepare(self):
        """The tenant's frame, the agent and its slack channel, Olga its owner, Bob a user."""
        t = self.t
        t.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        self.slack = self.app(tools=["notes.append"], role="user")
        self.agent = self.slack.agent
        self.olga = t.ok("POST", "/v1/users", {"name": "Olga", "identities": [
            {"platform": "slack", "platform_user_id": self.OLGA}]}, expect=201)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (self.agent["id"], self.olga["id"]),
             {"role": "owner"})
        # Bob, who asks in #team, is one of the agent's users (a guest's runs may not write).
        self.bob = t.ok("POST", "/v1/users", {"name": "Bob", "identities": [
            {"platform": "slack", "platform_user_id": "U0BOB"}]}, expect=201)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (self.agent["id"], self.bob["id"]),
             {"role": "user"})

    # ------------------------------------------------------------------ helpers

    def olga_writes_first(self):
        """Olga's DM to the bot (her IM's conversation records her as its contact), answered."""
        self.slack.taken(self.slack.dm(self.IM, "hello bot", user=self.OLGA))
        [m] = self.fake.wait_sent(self.IM)
        self.assertEqual(m["_text"], said("hello bot"))

    def park(self, line, user="U0BOB"):
        """An app_mention by `user` in #team asking for notes.append; (the push's answer, the
        pending approval it parked)."""
        got = self.slack.mention(self.TEAM_CHANNEL, "<@%s> %s" % (BOT_USER, note_call(line)),
                                 user=user)
        self.slack.taken(got)
        approval = wait_for(lambda: [a for a in self.t.pages("/v1/approvals?status=pending")
                                     if a["agent_id"] == self.agent["id"]
                                     and a["arguments"] == {"line": line}],
                            20, "the approval of notes.append %r" % line)
        self.assertEqual(len(approval), 1, approval)
        self.assertEqual(approval[0]["tool"], "notes.append")
        return got, approval[0]

    def cards(self, channel, approval_id):
        """The messages posted to `channel` whose buttons name the approval."""
        return [m for m in self.fake.to(channel)
                if approval_id in json.dumps(m.get("blocks") or [])]

    def wait_card(self, channel, approval_id, timeout=20):
        [card] = wait_for(lambda: self.cards(channel, approval_id), timeout,
                          "the card of approval %s in %s" % (approval_id, channel))
        return card

    def press(self, card, user, action="approve", **kw):
        """A press of a card's button by Slack user `user`, as Slack sends it."""
        base = self.server.base_url
        kw.setdefault("signing_secret", self.slack.signing)
        return self.fake.control("POST", "/_press", dict(
            kw, url=base + self.slack.ch["url"], channel=card["channel"], ts=card["_ts"],
            user=user, action=action))

    def pressed(self, card, user, action="approve", **kw):
        """A press Keel took: 200 with {}."""
        got = self.press(card, user, action, **kw)
        self.assertEqual((got["status"], got.get("body") and json.loads(got["body"])), (200, {}),
                         got)
        return got

    def updates(self, card):
        return [u for u in self.fake.sent()["updates"]
                if u.get("channel") == card["channel"] and u.get("ts") == card["_ts"]]

    def wait_update(self, card, timeout=20):
        [u] = wait_for(lambda: self.updates(card), timeout,
                       "the card %s in %s edited" % (card["_ts"], card["channel"]))
        return u

    def ephemerals(self, user=None):
        return [e for e in self.fake.sent()["ephemerals"] if user is None or e["user"] == user]

    def wait_ephemeral(self, user, n=1, timeout=15):
        return wait_for(lambda: (lambda es: es if len(es) >= n else None)(self.ephemerals(user)),
                        timeout, "%d ephemeral message(s) to %s" % (n, user))

    def card_reply(self, approval_id, user_id=None):
        key = "approval:" + approval_id + (":" + user_id if user_id else "")
        return self.t.replies(self.slack.ch).get(key)

    def wait_card_reply(self, approval_id, user_id=None, statuses=("sent",), timeout=20):
        return wait_for(lambda: (lambda r: r if r and r["status"] in statuses else None)(
            self.card_reply(approval_id, user_id)), timeout,
            "the card of %s %s" % (approval_id, "/".join(statuses)))

    def notes(self):
        path = os.path.join(self.server.home, "workspaces", self.agent["id"], "notes.txt")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return f.read().splitlines()

    def approval(self, approval_id):
        return self.t.ok("GET", "/v1/approvals/" + approval_id)

    def assertCard(self, card, a, channel, thread_ts=None):
        """The card's request as the spec has it: text and blocks, escaped, two buttons."""
        text = card["_text"]
        self.assertTrue(text.startswith(
            "Approval needed: %s wants to run notes.append\nArguments: %s\n"
            % (self.agent["name"], json.dumps(a["arguments"], separators=(",", ":")))), text)
        self.assertIn("\nExpires: %s\n" % a["expires_at"], text)
        self.assertTrue(text.endswith("\nApproval " + a["id"]), text)
        self.assertEqual((card["channel"], card.get("thread_ts")), (channel, thread_ts))
        self.assertEqual(card["text"], escaped(text))
        self.assertEqual(card["blocks"], [
            {"type": "section", "text": {"type": "mrkdwn", "text": escaped(text)}},
            {"type": "actions", "block_id": "keel_approval", "elements": [
                {"type": "button", "action_id": "keel_approve",
                 "text": {"type": "plain_text", "text": "Approve"}, "style": "primary",
                 "value": "keel:approve:" + a["id"]},
                {"type": "button", "action_id": "keel_reject",
                 "text": {"type": "plain_text", "text": "Reject"}, "style": "danger",
                 "value": "keel:reject:" + a["id"]}]}])

    def assertClosed(self, card, a, how):
        """The card edited once with chat.update to say how it was decided, its buttons gone."""
        u = self.wait_update(card)
        text = "%s: notes.append\nApproval %s" % (how, a["id"])
        self.assertEqual((u["_text"], u["text"]), (text, escaped(text)))
        self.assertEqual(u["blocks"], [{"type": "section",
                                        "text": {"type": "mrkdwn", "text": escaped(text)}}])
        r = self.wait_card_reply(a["id"], self.olga["id"] if card["channel"] == self.IM else None)
        self.assertEqual((r["kind"], r["approval_id"], r["status"], r["text"]),
                         ("approval_card", a["id"], "sent", text), r)
        return u

    def wait_answer(self, got, text):
        """The run's answer, posted in the mention's thread in #team."""
        m = wait_for(lambda: [m for m in self.fake.to(self.TEAM_CHANNEL)
                              if m["_text"] == text], 20, "the answer %r in #team" % text)
        self.assertEqual(len(m), 1, m)
        self.assertEqual(m[0].get("thread_ts"), got["ts"])
        r = self.t.wait_reply(self.slack.ch, got["event_id"])
        self.assertEqual((r["kind"], r["status"], r["text"]), ("answer", "sent", text), r)
        return m[0]

    def decided_by_olga(self, a, status):
        got = self.approval(a["id"])
        self.assertEqual((got["status"], got["decided_by"]),
                         (status, "user:" + self.olga["id"]), got)
        return got

    # ------------------------------------------------------------------ tests

    def test_the_owner_approves_from_the_card_in_her_im(self):
        t, fake = self.t, self.fake
        self.olga_writes_first()
        got, a = self.park("approved from slack")
        card = self.wait_card(self.IM, a["id"])
        self.assertCard(card, a, self.IM)
        self.assertEqual(self.cards(self.TEAM_CHANNEL, a["id"]), [], "a card in the channel")
        r = self.wait_card_reply(a["id"], self.olga["id"], ("shown",))
        self.assertEqual((r["kind"], r["approval_id"], r["user_id"], r["text"]),
                         ("approval_card", a["id"], self.olga["id"], card["_text"]), r)
        answer = t.replies(self.slack.ch)[got["event_id"]]
        self.assertEqual(answer["kind"], "answer")
        self.assertNotEqual(answer["status"], "sent", "answered before the decision")
        self.assertEqual(self.notes(), [])
        # Olga presses Approve: decided by her, the run goes on, the answer in the thread.
        self.pressed(card, self.OLGA, "approve")
        decided = self.decided_by_olga(a, "approved")
        self.wait_answer(got, note_answer("approved from slack"))
        self.assertEqual(self.notes(), ["approved from slack"])
        run = self.server.wait_run(a["run_id"], token=t.token)
        self.assertEqual(run["status"], "done", run)
        self.assertClosed(card, a, "Approved by Olga")
        events = [e for e in self.server.all_events(token=t.token)
                  if e["type"] == "approval.decided@v1"
                  and e["payload"]["approval_id"] == a["id"]]
        self.assertEqual([(e["payload"]["status"], e["payload"]["decided_by"]) for e in events],
                         [("approved", "user:" + self.olga["id"])])
        time.sleep(1)  # nothing more comes: no notice to Olga, no second edit
        self.assertEqual(self.ephemerals(), [])
        self.assertEqual(len(self.updates(card)), 1)
        self.assertEqual(self.approval(a["id"]), decided)
        self.assertEqual(fake.sent()["unescaped"], 0)
        self.assertEqual(fake.sent()["unauthorized"], 0)

    def test_the_owner_rejects_from_the_card(self):
        self.olga_writes_first()
        got, a = self.park("rejected from slack")
        card = self.wait_card(self.IM, a["id"])
        self.pressed(card, self.OLGA, "reject")
        self.decided_by_olga(a, "rejected")
        self.wait_answer(got, "The tool notes.append returned: error: a human rejected this "
                              "call.")
        self.assertEqual(self.notes(), [])
        self.assertClosed(card, a, "Rejected by Olga")
        self.assertEqual(self.ephemerals(), [])

    def test_the_wrong_person_decides_nothing_and_is_told_so(self):
        t = self.t
        self.olga_writes_first()
        got, a = self.park("the right person")
        card = self.wait_card(self.IM, a["id"])
        before = self.approval(a["id"])
        # Bob (who asked) is a user of the agent, not an owner; U0EVE is nobody Keel knows.
        for who in ("U0BOB", "U0EVE"):
            for action in ("approve", "reject"):
                self.pressed(card, who, action)
            notices = self.wait_ephemeral(who, 2)
            for e in notices:
                self.assertEqual((e["channel"], e["user"]), (self.IM, who), e)
                self.assertTrue(e["_text"].startswith("You may not decide this approval"), e)
            self.assertEqual(self.approval(a["id"]), before, "%s's press decided" % who)
        # A button of an approval that is not this card's (another agent's, in the same
        # tenant), pressed by an owner of both: not known here, nothing decided.
        other = self.server.create_agent(tools=["notes.append"], token=t.token)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (other["id"], self.olga["id"]),
             {"role": "owner"})
        session = self.server.create_session(other["id"], token=t.token)
        st, body, _ = self.server.post_message(session["id"], note_call("elsewhere"), wait=10,
                                               token=t.token)
        self.assertIn(st, (200, 202), body)
        elsewhere = wait_for(lambda: [x for x in t.pages("/v1/approvals?status=pending")
                                      if x["run_id"] == body["run"]["id"]], 20,
                             "the other agent's approval")[0]
        self.pressed(card, self.OLGA, "approve", value="keel:approve:" + elsewhere["id"])
        [e] = self.wait_ephemeral(self.OLGA)
        self.assertEqual((e["channel"], e["_text"]), (self.IM, "This approval is not known here."))
        self.assertEqual(self.approval(elsewhere["id"])["status"], "pending")
        self.assertEqual(self.approval(a["id"]), before)
        # The card's own button, brought by another Slack channel (app) of the same agent: the
        # approval was not carded there, so it is not known there.
        signing = secrets.token_hex(16)
        second = t.ok("POST", "/v1/agents/%s/channels" % self.agent["id"], {
            "kind": "slack", "name": "sl2", "settings": {
                "signing_secret": t.secret(signing), "bot_token": t.secret(self.fake.token),
                "api_base": self.fake.api_base, "role": "user"}}, expect=201)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + second["id"])
        got2 = self.fake.control("POST", "/_press", {
            "url": self.server.base_url + second["url"], "signing_secret": signing,
            "channel": card["channel"], "ts": card["_ts"], "user": self.OLGA,
            "action": "approve"})
        self.assertEqual(got2["status"], 200, got2)
        notices = self.wait_ephemeral(self.OLGA, 2)
        self.assertEqual(notices[1]["_text"], "This approval is not known here.")
        self.assertEqual(self.approval(a["id"]), before)
        self.assertEqual(self.updates(card), [])
        self.assertEqual(self.notes(), [])
        # Then Olga's own press decides it.
        self.pressed(card, self.OLGA, "approve")
        self.decided_by_olga(a, "approved")
        self.wait_answer(got, note_answer("the right person"))
        self.assertClosed(card, a, "Approved by Olga")
        self.assertEqual(len(self.ephemerals(self.OLGA)), 2, "Olga's press was refused")
        t.ok("POST", "/v1/approvals/%s/reject" % elsewhere["id"], {}, expect=200)

    def test_a_second_press_is_told_already_decided_and_changes_nothing(self):
        self.olga_writes_first()
        got, a = self.park("pressed twice")
        card = self.wait_card(self.IM, a["id"])
        self.pressed(card, self.OLGA, "approve")
        decided = self.decided_by_olga(a, "approved")
        self.wait_answer(got, note_answer("pressed twice"))
        self.assertClosed(card, a, "Approved by Olga")
        # A client that had not seen the edit yet presses again, Reject and then Approve.
        for action in ("reject", "approve"):
            self.pressed(card, self.OLGA, action, stale=True)
        notices = self.wait_ephemeral(self.OLGA, 2)
        self.assertEqual([(e["channel"], e["_text"]) for e in notices],
                         [(self.IM, "Already decided: approved.")] * 2)
        time.sleep(1)
        self.assertEqual(self.approval(a["id"]), decided)
        self.assertEqual(len(self.updates(card)), 1, "the card was edited again")
        self.assertEqual(self.notes(), ["pressed twice"])
        self.assertEqual(len(self.fake.to(self.TEAM_CHANNEL)), 1, "answered twice")
        self.assertEqual(len(self.ephemerals()), 2)

    def test_forged_presses_are_401_and_decide_nothing(self):
        self.olga_writes_first()
        got, a = self.park("forged")
        card = self.wait_card(self.IM, a["id"])
        now = int(time.time())
        cases = [("another secret", {"signing_secret": secrets.token_hex(16)}),
                 ("a zero signature", {"signature": "v0=" + "0" * 64}),
                 ("no signature", {"signature": None}),
                 ("no timestamp", {"timestamp": None}),
                 ("signed 301 s ago", {"timestamp": now - 301}),
                 ("a body with more after signing", {"body_suffix": "&x=1"})]
        for what, kw in cases:
            for action in ("approve", "reject"):
                pressed = self.press(card, self.OLGA, action, **kw)
                self.assertEqual(pressed["status"], 401, "%s: %r" % (what, pressed))
        time.sleep(1)
        self.assertEqual(self.approval(a["id"])["status"], "pending")
        self.assertEqual(self.ephemerals(), [], "a forged press was answered")
        self.assertEqual(self.updates(card), [])
        self.assertEqual(self.notes(), [])
        self.assertEqual(self.card_reply(a["id"], self.olga["id"])["status"], "shown")
        # The card still works.
        self.pressed(card, self.OLGA, "approve")
        self.decided_by_olga(a, "approved")
        self.wait_answer(got, note_answer("forged"))
        self.assertNoLeak(self.slack.signing, self.fake.token)

    def test_a_decision_through_the_api_closes_the_card(self):
        t = self.t
        self.olga_writes_first()
        got, a = self.park("decided by the api")
        card = self.wait_card(self.IM, a["id"])
        t.ok("POST", "/v1/approvals/%s/approve" % a["id"], {}, expect=200)
        decided = self.approval(a["id"])
        self.assertEqual((decided["status"], decided["decided_by"]), ("approved", t.token_id))
        self.wait_answer(got, note_answer("decided by the api"))
        self.assertClosed(card, a, "Approved by an API token")
        # The card's stale button is told so.
        self.pressed(card, self.OLGA, "reject", stale=True)
        [e] = self.wait_ephemeral(self.OLGA)
        self.assertEqual(e["_text"], "Already decided: approved.")
        self.assertEqual(self.approval(a["id"]), decided)

    def test_no_reachable_approver_skips_the_card_or_shows_it_in_the_conversation(self):
        t = self.t
        # Olga never wrote to the bot: her card cannot reach her. Skipped, nothing sent.
        got, a = self.park("nowhere to show")
        r = self.wait_card_reply(a["id"], statuses=("skipped",))
        self.assertEqual((r["kind"], r["approval_id"], r["user_id"]),
                         ("approval_card", a["id"], None), r)
        self.assertIn(self.olga["id"], r["error"])
        self.assertIn("decide it in the dashboard or the API", r["error"])
        t.ok("POST", "/v1/approvals/%s/reject" % a["id"], {}, expect=200)
        self.wait_answer(got, "The tool notes.append returned: error: a human rejected this "
                              "call.")
        self.assertEqual([m for m in self.fake.sent()["messages"] if m.get("blocks")], [])
        # The policy allows a card in the conversation: in the mention's thread, where anyone
        # may press, but only an approver's press counts (Bob asked; Olga is the owner).
        t.ok("PUT", "/v1/policy", dict(APPROVAL_FRAME, approval_in_conversation=True))
        got, a = self.park("shown in the thread")
        card = self.wait_card(self.TEAM_CHANNEL, a["id"])
        self.assertCard(card, a, self.TEAM_CHANNEL, got["ts"])
        r = self.wait_card_reply(a["id"], statuses=("shown",))
        self.assertEqual(r["user_id"], None, r)
        self.pressed(card, "U0BOB", "approve")
        [e] = self.wait_ephemeral("U0BOB")
        self.assertEqual(e["channel"], self.TEAM_CHANNEL)
        self.assertTrue(e["_text"].startswith("You may not decide this approval"), e)
        self.assertEqual(self.approval(a["id"])["status"], "pending")
        self.pressed(card, self.OLGA, "approve")
        self.decided_by_olga(a, "approved")
        self.wait_answer(got, note_answer("shown in the thread"))
        self.assertClosed(card, a, "Approved by Olga")

    def test_separation_of_duties_holds_for_a_press(self):
        t = self.t
        t.ok("PUT", "/v1/policy", dict(APPROVAL_FRAME, separate_approver=True))
        self.olga_writes_first()
        # Olga asks herself: her press is refused.
        got, a = self.park("asked by olga", user=self.OLGA)
        card = self.wait_card(self.IM, a["id"])
        self.pressed(card, self.OLGA, "approve")
        [e] = self.wait_ephemeral(self.OLGA)
        self.assertTrue(e["_text"].startswith("The policy asks for a separate approver"), e)
        self.assertEqual(self.approval(a["id"])["status"], "pending")
        # Bob asks: Olga decides.
        got2, b = self.park("asked by bob")
        card2 = self.wait_card(self.IM, b["id"])
        self.pressed(card2, self.OLGA, "approve")
        self.decided_by_olga(b, "approved")
        self.wait_answer(got2, note_answer("asked by bob"))
        # The API's decision by another owner token (the channel's runs are asked for by the
        # token that created it, which may not decide them either).
        other, other_id = t.new_token("owner")
        t.ok("POST", "/v1/approvals/%s/reject" % a["id"], {}, expect=200, token=other)
        self.assertEqual(self.approval(a["id"])["decided_by"], other_id)
        self.wait_answer(got, "The tool notes.append returned: error: a human rejected this "
                              "call.")
        self.assertClosed(card, a, "Rejected by an API token")


    def test_every_approvers_card_is_closed_by_one_press(self):
        t = self.t
        # The agent's policy names its approvers: Olga and Bob (a user, not an owner); Ann, an
        # owner too, is not one then.
        ann = t.ok("POST", "/v1/users", {"name": "Ann", "identities": [
            {"platform": "slack", "platform_user_id": "U0ANN"}]}, expect=201)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (self.agent["id"], ann["id"]), {"role": "owner"})
        t.ok("PUT", "/v1/agents/%s/policy" % self.agent["id"],
             {"approvers": [self.olga["id"], self.bob["id"]]})
        self.olga_writes_first()
        for im, user in (("D0BOB", "U0BOB"), ("D0ANN", "U0ANN")):
            self.slack.taken(self.slack.dm(im, "hello bot", user=user))
            self.fake.wait_sent(im)
        got, a = self.park("two approvers", user="U0ANN")
        olgas, bobs = self.wait_card(self.IM, a["id"]), self.wait_card("D0BOB", a["id"])
        self.assertCard(olgas, a, self.IM)
        self.assertCard(bobs, a, "D0BOB")
        for user in (self.olga, self.bob):
            r = self.wait_card_reply(a["id"], user["id"], ("shown",))
            self.assertEqual(r["user_id"], user["id"])
        self.assertEqual(self.cards("D0ANN", a["id"]), [], "a card to an owner not named")
        # Ann's press on a card (say, forwarded to her) is refused: she is not an approver.
        self.pressed(olgas, "U0ANN", "approve")
        [e] = self.wait_ephemeral("U0ANN")
        self.assertTrue(e["_text"].startswith("You may not decide this approval"), e)
        self.assertEqual(self.approval(a["id"])["status"], "pending")
        # Bob rejects on his card: both cards say so.
        self.pressed(bobs, "U0BOB", "reject")
        got_a = self.approval(a["id"])
        self.assertEqual((got_a["status"], got_a["decided_by"]),
                         ("rejected", "user:" + self.bob["id"]))
        how = "Rejected by Bob"
        self.assertClosed(olgas, a, how)
        u = self.wait_update(bobs)
        self.assertEqual(u["_text"], "%s: notes.append\nApproval %s" % (how, a["id"]))
        self.assertEqual(self.wait_card_reply(a["id"], self.bob["id"])["status"], "sent")
        self.wait_answer(got, "The tool notes.append returned: error: a human rejected this "
                              "call.")
        # Olga's card, pressed late: already decided.
        self.pressed(olgas, self.OLGA, "approve", stale=True)
        [e] = self.wait_ephemeral(self.OLGA)
        self.assertEqual(e["_text"], "Already decided: rejected.")

    def test_markup_in_the_arguments_is_escaped_on_the_card(self):
        self.olga_writes_first()
        line = "<!channel> <@U0OTHER> a < b && c > d <https://evil.example|click>"
        # Slack escapes what was typed in the event's text as it escapes what it shows.
        got = self.slack.mention(self.TEAM_CHANNEL, "<@%s> %s" % (BOT_USER, escaped(
            note_call(line))), user="U0BOB")
        self.slack.taken(got)
        a = wait_for(lambda: [x for x in self.t.pages("/v1/approvals?status=pending")
                              if x["agent_id"] == self.agent["id"]], 20, "the approval")[0]
        self.assertEqual(a["arguments"], {"line": line})
        card = self.wait_card(self.IM, a["id"])
        self.assertCard(card, a, self.IM)
        self.assertIn(json.dumps(line), card["_text"])
        self.assertEqual(self.fake.sent()["unescaped"], 0, "a card's markup went unescaped")
        self.pressed(card, self.OLGA, "approve")
        self.wait_answer(got, note_answer(line))
        self.assertEqual(self.notes(), [line])
        self.assertClosed(card, a, "Approved by Olga")
        self.assertEqual(self.fake.sent()["unescaped"], 0)

    def test_two_approvers_pressing_at_once_decide_once(self):
        t = self.t
        t.ok("PUT", "/v1/agents/%s/policy" % self.agent["id"],
             {"approvers": [self.olga["id"], self.bob["id"]]})
        self.olga_writes_first()
        self.slack.taken(self.slack.dm("D0BOB", "hello bot", user="U0BOB"))
        self.fake.wait_sent("D0BOB")
        for n in range(3):
            line = "race %d" % n
            got, a = self.park(line)
            olgas, bobs = self.wait_card(self.IM, a["id"]), self.wait_card("D0BOB", a["id"])
            for user in (self.olga, self.bob):
                self.wait_card_reply(a["id"], user["id"], ("shown",))
            answers = {}

            def press(card, who, action):
                answers[who] = self.press(card, who, action)
            threads = [threading.Thread(target=press, args=(olgas, self.OLGA, "approve")),
                       threading.Thread(target=press, args=(bobs, "U0BOB", "reject"))]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            self.assertEqual({w: x["status"] for w, x in answers.items()},
                             {self.OLGA: 200, "U0BOB": 200}, answers)
            decided = self.approval(a["id"])
            self.assertIn(decided["status"], ("approved", "rejected"), decided)
            winner, loser = ((self.olga, "U0BOB") if decided["status"] == "approved"
                             else (self.bob, self.OLGA))
            self.assertEqual(decided["decided_by"], "user:" + winner["id"])
            [e] = self.wait_ephemeral(loser)
            self.assertEqual(e["_text"], "Already decided: %s." % decided["status"], e)
            self.assertEqual(len(self.ephemerals()), 1, "the winner was told something")
            how = "%s by %s" % (decided["status"].capitalize(), winner["name"])
            for card in (olgas, bobs):
                u = self.wait_update(card)
                self.assertEqual(u["_text"], "%s: notes.append\nApproval %s" % (how, a["id"]))
            events = [e for e in self.server.all_events(token=t.token)
                      if e["type"] == "approval.decided@v1"
                      and e["payload"]["approval_id"] == a["id"]]
            self.assertEqual(len(events), 1, events)
            self.wait_answer(got, note_answer(line) if decided["status"] == "approved" else
                             "The tool notes.append returned: error: a human rejected this "
                             "call.")
            self.fake.control("POST", "/_reset")  # the next round's notices start from none

    def test_a_card_of_many_escaped_characters_stays_within_slacks_section_limit(self):
        """Escaping makes each & five characters and each < or > four: a card of them is cut
        to fit Slack's 3,000 characters once escaped, and is shown."""
        self.olga_writes_first()
        line = "&" * 780
        got = self.slack.mention(self.TEAM_CHANNEL, "<@%s> %s" % (BOT_USER, escaped(
            note_call(line))), user="U0BOB")
        self.slack.taken(got)
        a = wait_for(lambda: [x for x in self.t.pages("/v1/approvals?status=pending")
                              if x["agent_id"] == self.agent["id"]], 20, "the approval")[0]
        r = self.wait_card_reply(a["id"], self.olga["id"], ("shown", "dead", "unknown"))
        self.t.ok("POST", "/v1/approvals/%s/reject" % a["id"], {}, expect=200)
        self.assertEqual((r["status"], r["error"]), ("shown", ""), r)
        card = self.wait_card(self.IM, a["id"])
        self.assertLessEqual(len(card["blocks"][0]["text"]["text"]), 3000)

    def test_cancelling_the_run_closes_the_card(self):
        t = self.t
        self.olga_writes_first()
        got, a = self.park("cancelled")
        card = self.wait_card(self.IM, a["id"])
        t.ok("POST", "/v1/runs/%s/cancel" % a["run_id"], {}, expect=200)
        self.assertEqual(self.approval(a["id"])["status"], "cancelled")
        self.assertClosed(card, a, "Cancelled with its run")
        self.pressed(card, self.OLGA, "approve", stale=True)
        [e] = self.wait_ephemeral(self.OLGA)
        self.assertEqual(e["_text"], "Already decided: cancelled.")
        self.assertEqual(self.notes(), [])

    def test_expiry_closes_the_card(self):
        self.own_server(KEEL_APPROVAL_TIMEOUT_MS="4000")
        self.olga_writes_first()
        got, a = self.park("too late")
        card = self.wait_card(self.IM, a["id"], timeout=3)
        self.wait_card_reply(a["id"], self.olga["id"], ("shown",), timeout=3)
        self.assertClosed(card, a, "Expired: nobody decided in time")
        got_a = self.approval(a["id"])
        self.assertEqual((got_a["status"], got_a["decided_by"]), ("expired", "system"))
        self.pressed(card, self.OLGA, "approve", stale=True)
        [e] = self.wait_ephemeral(self.OLGA)
        self.assertEqual(e["_text"], "Already decided: expired.")
        self.assertEqual(self.notes(), [])

    def test_cards_go_through_the_outbox(self):
        t, fake = self.t, self.fake
        self.olga_writes_first()
        # A card Slack rate-limits is posted after Retry-After, once; an edit Slack answers
        # 500 is made again.
        fake.fail("chat.postMessage", {"status": 429, "retry_after": 1})
        fake.fail("chat.update", {"status": 500})
        got, a = self.park("through the outbox")
        card = self.wait_card(self.IM, a["id"])
        posts = [c["status"] for c in fake.posts(self.IM)]
        self.assertEqual(posts, [200, 429, 200], "the DM's answer, then the card twice")
        r = self.wait_card_reply(a["id"], self.olga["id"], ("shown",))
        self.assertEqual(r["attempts"], 2, r)
        self.pressed(card, self.OLGA, "approve")
        self.wait_answer(got, note_answer("through the outbox"))
        self.assertClosed(card, a, "Approved by Olga")
        self.assertEqual([c["status"] for c in fake.sent()["calls"]
                          if c["method"] == "chat.update"], [500, 200])
        # A card whose post is cut (Slack may have it) is never posted again: "unknown"; the
        # approval waits in the API.
        fake.fail("chat.postMessage", {"drop": True})
        got, b = self.park("cut")
        r = self.wait_card_reply(b["id"], self.olga["id"], ("unknown",))
        self.assertEqual(r["attempts"], 1, r)
        time.sleep(2)
        self.assertEqual(len(fake.posts(self.IM)), 4, "the cut card was posted again")
        self.assertEqual(self.cards(self.IM, b["id"]), [])
        t.ok("POST", "/v1/approvals/%s/approve" % b["id"], {}, expect=200)
        self.wait_answer(got, note_answer("cut"))
        self.assertEqual(self.card_reply(b["id"], self.olga["id"])["status"], "unknown")
        # A card Slack refuses is dead at once.
        fake.fail("chat.postMessage", {"error": "invalid_blocks"})
        got, c = self.park("refused")
        r = self.wait_card_reply(c["id"], self.olga["id"], ("dead",))
        self.assertIn("invalid_blocks", r["error"])
        t.ok("POST", "/v1/approvals/%s/reject" % c["id"], {}, expect=200)
        self.wait_answer(got, "The tool notes.append returned: error: a human rejected this "
                              "call.")

    def test_an_edit_cut_by_kill9_is_made_after_the_restart(self):
        self.own_server()
        fake = self.fake
        self.olga_writes_first()
        got, a = self.park("across a crash")
        card = self.wait_card(self.IM, a["id"])
        self.wait_card_reply(a["id"], self.olga["id"], ("shown",))
        fake.fail("chat.update", {"delay": 3})
        self.pressed(card, self.OLGA, "approve")
        self.decided_by_olga(a, "approved")
        self.wait_answer(got, note_answer("across a crash"))
        wait_for(lambda: [c for c in fake.sent()["calls"]
                          if c["method"] == "chat.update" and c["status"] is None], 10,
                 "the card's edit under way")
        self.server.kill9()
        self.server.start()
        # Edited after the restart (the cut edit's late answer may add a copy: the same text).
        r = self.wait_card_reply(a["id"], self.olga["id"])
        text = "Approved by Olga: notes.append\nApproval %s" % a["id"]
        self.assertEqual(r["text"], text)
        time.sleep(3.5)  # the cut edit is answered by then
        edits = self.updates(card)
        self.assertIn(len(edits), (1, 2), edits)
        self.assertEqual({e["_text"] for e in edits}, {text})
        self.assertEqual([e["blocks"] for e in edits],
                         [[{"type": "section", "text": {"type": "mrkdwn",
                                                        "text": escaped(text)}}]] * len(edits))
        self.assertEqual(self.notes(), ["across a crash"])


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

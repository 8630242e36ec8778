"""Telegram channels: a bot bound to an agent that long-polls the Bot API (getUpdates) of
tests/fakes/fake_telegram.py, posts each update it takes into the session of its chat, and sends
the agent's answer back through the durable outbox (sendMessage), attacked.

End to end (getMe, then getUpdates with the offset after the last handled update; one session
per chat, the text as sent; the answer HTML-escaped, which the fake proves by refusing what does
not parse; a typing action per update; the outbox items and their events); groups (only
mentions of the bot and replies to it, prefixed with the sender's name, answered as replies and
in their topic; bots, non-text messages, other updates and channel posts ignored, the offset
moving past them); long answers split at 4096 UTF-16 code units, at newlines when there are
some, never inside an entity or a surrogate pair; `<NO_REPLY>` and failed runs; the outbox's
retries (429 after retry_after, 500 with backoff), a blocked bot (dead at once) and a send cut
after its request (unknown, never repeated); a wrong token (status error, fixed by setting the
secret again); disabling and enabling; the offset and the outbox across SIGTERM and kill -9,
and kill -9 twice while 30 updates arrive (each update one message, each answer sent at most
once, nothing left pending); roles, tenants and settings validation; no answer, event or log
line holding the bot token. Approvals in chat (ApprovalCardTest): a parked tool call's card with
Approve and Reject buttons in each owner's private chat (or the group, when the policy allows
it), decided by an approver's press (polled or pushed to the webhook) and edited once decided;
presses that may not decide (others, the asker under separate_approver, a decided approval, a
forged approval id) decide nothing and are told why.

Every answer a Tenant receives is checked for its secrets' values. Each test has a fake of its
own (one bot token, one update queue). Runs on SQLite and, with KEEL_TEST_STORE=postgres, on
PostgreSQL."""

import json
import os
import random
import secrets
import socket
import subprocess
import sys
import threading
import time
import unittest

import keel_harness
from keel_harness import (FakeOpenAi, KeelServer, KeelTestCase, http_request, keel_bin,
                          unique_name, wait_for)

KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
BOT_ID = 7000001
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes", "fake_telegram.py")
ENDED = ("sent", "skipped", "unknown", "dead")
SERVER = OPENAI = None


def server_env():
    return dict(OPENAI.env, KEEL_SECRET_KEK=KEK, KEEL_OUTBOUND_ALLOW="127.0.0.1/32")


def setUpModule():
    global SERVER, OPENAI
    OPENAI = FakeOpenAi()  # openai/bad-request: a model that fails the run at once
    SERVER = KeelServer(env=server_env())


def tearDownModule():
    try:
        SERVER.stop()
    finally:
        OPENAI.stop()


def utf16(text):
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def bot_token():
    return "%d:AA%s" % (BOT_ID, secrets.token_urlsafe(24))


class FakeTelegram:
    """tests/fakes/fake_telegram.py in a process of its own, and its control endpoints."""

    def __init__(self, bot_id=BOT_ID):
        self.token = bot_token()
        self.proc = subprocess.Popen([sys.executable, FAKE, "--token", self.token,
                                      "--bot-id", str(bot_id)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().strip())
        self.api_base = "http://127.0.0.1:%d" % self.port
        self.message_ids = {}  # update_id -> the message_id of the message it carries

    def control(self, method, path, body=None):
        st, data, _ = http_request("127.0.0.1:%d" % self.port, method, path, body=body)
        assert st == 200, "fake %s %s -> %s %r" % (method, path, st, data)
        return data

    def message(self, chat_id, text, **kw):
        """Queues a text message; returns its update_id."""
        got = self.control("POST", "/_message", dict(kw, chat_id=chat_id, text=text))
        self.message_ids[got["update_id"]] = got["message_id"]
        return got["update_id"]

    def group(self, chat_id, text, **kw):
        kw.setdefault("chat_type", "supergroup")
        return self.message(chat_id, text, **kw)

    def updates(self, *updates):
        return self.control("POST", "/_updates", {"updates": list(updates)})["update_ids"]

    def sent(self):
        return self.control("GET", "/_sent")

    def fail(self, method, *answers):
        self.control("POST", "/_fail", {"method": method, "answers": list(answers)})

    def to(self, chat_id):
        return [m for m in self.sent()["messages"] if m["chat_id"] == chat_id]

    def sends(self, chat_id):
        """sendMessage calls to the chat, answered or not."""
        return [c for c in self.sent()["calls"]
                if c["method"] == "sendMessage" and c.get("chat_id") == chat_id]

    def wait_sent(self, chat_id, n=1, timeout=30):
        return wait_for(lambda: (lambda ms: ms if len(ms) >= n else None)(self.to(chat_id)),
                        timeout, "%d message(s) sent to chat %s" % (n, chat_id))

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


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
        name = "TG_" + os.urandom(6).hex().upper()
        self.never.append(value)
        self.ok("PUT", "/v1/secrets/" + name, {"value": value}, expect=204)
        return name

    def bot(self, fake, token=None, model="local", config=None, **settings):
        """A new agent, secret and telegram channel `tg` polling `fake`; (agent, channel)."""
        settings = dict({"bot_token": self.secret(token or fake.token),
                         "api_base": fake.api_base, "poll_timeout": 1}, **settings)
        agent = self.server.create_agent(model=model, config=config, token=self.token)
        # Anyone on the platform may talk to it (an agent is private until said).
        self.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "public"})
        ch = self.ok("POST", "/v1/agents/%s/channels" % agent["id"],
                     {"kind": "telegram", "name": "tg", "settings": settings}, expect=201)
        return agent, ch

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

    def wait_reply(self, ch, update_id, statuses=ENDED, timeout=30):
        return wait_for(lambda: (lambda r: r if r and r["status"] in statuses else None)(
            self.replies(ch).get(str(update_id))), timeout,
            "the reply to update %s %s" % (update_id, "/".join(statuses)))

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


class TelegramCase(KeelTestCase):
    """The module's server, a fresh tenant and a fake of the test's own. bot() deletes its
    channel when the test ends, before the fake stops."""

    def setUp(self):
        self.server = SERVER
        self.t = Tenant(SERVER)
        self.fake = FakeTelegram()
        self.addCleanup(self.fake.stop)

    def bot(self, fake=None, **kw):
        agent, ch = self.t.bot(fake or self.fake, **kw)
        self.addCleanup(self.t.request, "DELETE", "/v1/channels/" + ch["id"])
        return agent, ch

    def agent_with_channel(self, fake=None, tools=("notes.append",), **settings):
        """A private agent with `tools` and a telegram channel (role user) polling the fake;
        (agent, channel)."""
        t, fake = self.t, fake or self.fake
        agent = self.server.create_agent(tools=list(tools), token=t.token)
        ch = t.ok("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "telegram", "name": "tg", "settings": dict({
                "bot_token": t.secret(fake.token), "api_base": fake.api_base,
                "poll_timeout": 1, "role": "user"}, **settings)}, expect=201)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch["id"])
        return agent, ch

    def person(self, name, telegram_id=None):
        body = {"name": name}
        if telegram_id is not None:
            body["identities"] = [{"platform": "telegram", "platform_user_id": str(telegram_id)}]
        return self.t.ok("POST", "/v1/users", body, expect=201)

    def member(self, agent, user, role):
        self.t.ok("PUT", "/v1/agents/%s/members/%s" % (agent["id"], user["id"]), {"role": role},
                  expect=200)

    def answered(self, chat_id, text, n=1):
        """Sends a private message and returns the chat's messages once the nth is sent."""
        self.fake.message(chat_id, text)
        return self.fake.wait_sent(chat_id, n)

    def assertNoLeak(self, *values):
        events = json.dumps(self.server.all_events(token=self.t.token))
        log = ""
        for path in (self.server.stderr_path, self.server.stdout_path):
            with open(path, errors="replace") as f:
                log += f.read()
        for value in values:
            self.assertNotIn(value, events, "an event holds the bot token")
            self.assertNotIn(value, log, "the server's log holds the bot token")


class EndToEndTest(TelegramCase):
    def test_private_chats_are_answered_each_in_its_session(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        self.assertEqual((ch["kind"], ch["name"], ch["enabled"], ch["status"]),
                         ("telegram", "tg", True, "ready"))
        self.assertEqual(ch["settings"], {"bot_token": ch["settings"]["bot_token"],
                                          "api_base": fake.api_base, "role": "guest",
                                          "poll_timeout": 1, "mode": "polling"})
        wait_for(lambda: fake.sent()["poll_requests"], 20, "a first getUpdates")
        sent = fake.sent()
        methods = [c["method"] for c in sent["calls"]]
        self.assertEqual(methods[0], "getMe", methods)
        first = sent["poll_requests"][0]
        self.assertNotIn("offset", first, "the very first getUpdates carries no offset")
        self.assertEqual((first["timeout"], first["allowed_updates"]),
                         (1, ["message", "callback_query"]), first)
        # Escaped so that Telegram shows it as written: the fake refuses what does not parse, and
        # unescaped <i>x</i> would show as x.
        texts = {111: ['1 < 2 & <i>x</i> "q" &amp; \U0001f600', "second"], 222: ["other chat"]}
        ids = {111: [fake.message(111, texts[111][0])]}
        self.assertEqual(fake.wait_sent(111)[0]["_text"], 'You said: "%s"' % texts[111][0])
        ids[111].append(fake.message(111, texts[111][1]))
        ids[222] = [fake.message(222, texts[222][0])]
        fake.wait_sent(111, 2)
        fake.wait_sent(222)
        sessions = t.sessions(agent)
        self.assertEqual(sorted(sessions), ["tg: chat:111", "tg: chat:222"])
        # The fake has the answers before Keel records them sent.
        for u in ids[111] + ids[222]:
            t.wait_reply(ch, u)
        replies = t.replies(ch)
        self.assertEqual(sorted(replies), sorted(str(u) for u in ids[111] + ids[222]))
        for chat, updates in ids.items():
            session = sessions["tg: chat:%d" % chat]
            self.assertEqual(t.users(session), texts[chat])
            msgs = t.pages("/v1/sessions/%s/messages" % session["id"])
            answers = [m for m in msgs if m["role"] == "assistant"]
            self.assertEqual([m["content"] for m in answers],
                             ['You said: "%s"' % x for x in texts[chat]])
            for m, update, answer in zip(fake.to(chat), updates, answers):
                self.assertEqual((m["chat_id"], m["parse_mode"], m["_text"]),
                                 (chat, "HTML", answer["content"]))
                self.assertIsInstance(m["chat_id"], int)
                self.assertNotIn("reply_parameters", m, "a private answer replies to nothing")
                self.assertNotIn("message_thread_id", m)
                r = replies[str(update)]
                self.assertEqual((r["channel_id"], r["session_id"], r["run_id"], r["status"],
                                  r["text"], r["parts_sent"], r["attempts"]),
                                 (ch["id"], session["id"], answer["run_id"], "sent",
                                  answer["content"], 1, 1))
                self.assertFalse(r["error"], r)
                self.assertTime(r["created_at"])
                self.assertTime(r["updated_at"])
        # One typing action per update, to its chat.
        wait_for(lambda: len(fake.sent()["actions"]) >= 3, 20, "three chat actions")
        actions = [(a["chat_id"], a["action"]) for a in fake.sent()["actions"]]
        self.assertEqual(sorted(actions), [(111, "typing")] * 2 + [(222, "typing")])
        # Events: one delivery per update, one replied per answer.
        delivered = t.events("channel.delivered@v1", ch)
        self.assertEqual(sorted(e["payload"]["delivery_id"] for e in delivered), sorted(replies))
        replied = {e["payload"]["reply_id"]: e["payload"]
                   for e in t.events("channel.replied@v1", ch)}
        self.assertEqual(sorted(replied), sorted(r["id"] for r in replies.values()))
        for r in replies.values():
            self.assertEqual((replied[r["id"]]["run_id"], replied[r["id"]]["parts"]),
                             (r["run_id"], 1))
        # The offset moves past the last handled update; one poller only.
        last = max(ids[111] + ids[222])
        wait_for(lambda: last + 1 in fake.sent()["polls"], 20, "a poll with offset %d" % last)
        self.assertEqual(fake.sent()["conflicts"], 0, "two pollers of one bot")
        # The message's idempotency key is telegram:<update_id>: a client reusing it in the
        # session is refused or gets the update's message back, never posts a second one.
        session = sessions["tg: chat:111"]
        st, body, _ = self.server.post_message(session["id"], "forged",
                                               idempotency_key="telegram:%d" % ids[111][0],
                                               token=t.token)
        first_msg = t.pages("/v1/sessions/%s/messages" % session["id"])[0]
        if st != 400:
            self.assertEqual((body.get("replayed"), body["message"]["id"]),
                             (True, first_msg["id"]), body)
        self.assertEqual(t.users(session), texts[111])

    def test_groups_take_mentions_and_replies_to_the_bot_and_nothing_else(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        g, small = -1001234, -42
        taken, ignored = [], []
        ignored.append(fake.group(g, "hello everyone"))
        taken.append((fake.group(g, "hey @KEEL_Test_Bot what's up", first_name="Ann"),
                      g, "Ann: hey @KEEL_Test_Bot what's up", None))
        ignored.append(fake.group(g, "@other_bot do it"))
        ignored.append(fake.group(g, "@keel_test_botty is another bot"))
        ignored.append(fake.group(g, "@keel_test_bot I am a bot", from_id=900, is_bot=True,
                                  first_name="Robo"))
        taken.append((fake.group(g, "thanks!", reply_to_bot=True, from_id=42, first_name="Bob"),
                      g, "Bob: thanks!", None))
        ignored.append(fake.message(-1005005, "@keel_test_bot news", chat_type="channel"))
        eve, now = {"id": 7, "is_bot": False, "first_name": "Eve"}, int(time.time())
        ignored += fake.updates(  # an edit, a photo with a caption, a button press
            {"edited_message": {"message_id": 50, "from": eve, "date": now, "chat": {
                "id": g, "type": "supergroup", "title": "G"}, "text": "@keel_test_bot edited"}},
            {"message": {"message_id": 3, "from": eve, "chat": dict(eve, type="private"),
                         "date": now, "photo": [{"file_id": "p", "width": 9, "height": 9}],
                         "caption": "@keel_test_bot look"}},
            {"callback_query": {"id": "cb1", "from": eve, "data": "x"}})
        taken.append((fake.group(g, "@keel_test_bot in a topic", message_thread_id=77,
                                 first_name="Cy"), g, "Cy: @keel_test_bot in a topic", 77))
        taken.append((fake.group(small, "ping @keel_test_bot", chat_type="group",
                                 first_name="Dee"), small, "Dee: ping @keel_test_bot", None))
        anchor = fake.message(444, "anchor")  # after everything else: its answer is the proof
        fake.wait_sent(444)
        fake.wait_sent(g, 3)
        fake.wait_sent(small)
        wait_for(lambda: anchor + 1 in fake.sent()["polls"], 20, "the offset past the anchor")
        sent = fake.sent()
        self.assertEqual(sorted({m["chat_id"] for m in sent["messages"]}), [g, small, 444])
        self.assertEqual(len(sent["messages"]), 5, sent["messages"])
        by_text = {m["_text"]: m for m in sent["messages"]}
        for update, chat, content, thread in taken:
            m = by_text.get('You said: "%s"' % content)
            self.assertIsNotNone(m, "no answer to %r in %r" % (content, list(by_text)))
            self.assertEqual(m["chat_id"], chat)
            self.assertEqual(t.wait_reply(ch, update)["status"], "sent")
            self.assertEqual(m.get("reply_parameters"), {"message_id": fake.message_ids[update],
                                                         "allow_sending_without_reply": True})
            self.assertEqual(m.get("message_thread_id"), thread, m)
        self.assertNotIn("reply_parameters", by_text['You said: "anchor"'])
        sessions = t.sessions(agent)
        self.assertEqual(sorted(sessions), sorted(["tg: chat:%d" % g, "tg: chat:%d" % small,
                                                   "tg: chat:444"]))
        self.assertEqual(t.users(sessions["tg: chat:%d" % g]),
                         [c for _, chat, c, _ in taken if chat == g])
        delivered = sorted(int(e["payload"]["delivery_id"])
                           for e in t.events("channel.delivered@v1", ch))
        self.assertEqual(delivered, sorted([u for u, _, _, _ in taken] + [anchor]))
        self.assertEqual(sorted(int(k) for k in t.replies(ch)), delivered)
        wait_for(lambda: len(fake.sent()["actions"]) >= 5, 20, "five chat actions")
        self.assertEqual(sorted(a["chat_id"] for a in fake.sent()["actions"]),
                         sorted([g] * 3 + [small, 444]))
        self.assertEqual(fake.sent()["pending"], [], "ignored updates were not confirmed")
        self.assertLess(max(ignored), anchor)


class LongAnswerTest(TelegramCase):
    """Answers past 4096 UTF-16 code units: the fake refuses a longer part, a part cut inside
    an entity (it does not parse) or a surrogate pair (not UTF-8)."""

    LINES = "\n".join('%03d <tag> & "q" \U0001f600 ' % i + "x" * 50 for i in range(150))
    LONG = "abc" + "\U0001f600<&" * 1500  # no newline, no space; 4096 falls inside an emoji

    def parts(self, chat_id, answer, n):
        """Waits for the n parts of `answer` to chat_id and checks they make it up."""
        parts = self.fake.wait_sent(chat_id, n)
        self.assertEqual(len(self.fake.to(chat_id)), n)
        pos = 0
        for i, m in enumerate(parts):
            p = m["_text"]
            self.assertLessEqual(utf16(p), 4096)
            self.assertEqual(answer[pos:pos + len(p)], p, "part %d is not the answer's next" % i)
            pos += len(p)
            if i < n - 1 and "\n" in answer:
                self.assertTrue(p.endswith("\n") or answer[pos] == "\n",
                                "part %d was not cut at a newline" % i)
            if i < n - 1 and answer[pos:pos + 1] == "\n":
                pos += 1  # the newline it was cut at may be left out
        self.assertEqual(pos, len(answer), "the parts do not make up the whole answer")
        self.assertEqual([m["_message_id"] for m in parts],
                         sorted(m["_message_id"] for m in parts), "parts out of order")
        return parts

    def test_long_answers_are_split_into_parts_telegram_takes(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot(config={"local_rules": [
            {"match": "many lines", "reply": self.LINES},
            {"match": "one long line", "reply": self.LONG}]})
        self.assertGreater(utf16(self.LINES), 2 * 4096)
        g = -700
        u1 = fake.group(g, "@keel_test_bot many lines")
        parts = self.parts(g, self.LINES, 3)
        self.assertIn("reply_parameters", parts[0])
        for p in parts[1:]:
            self.assertNotIn("reply_parameters", p, "only the first part replies")
        u2 = fake.message(555, "one long line")
        self.parts(555, self.LONG, 2)
        # The fake has every part; the reply is recorded sent once the last part's answer is
        # read (a moment later).
        replies = {str(u): t.wait_reply(ch, u, ("sent",)) for u in (u1, u2)}
        replied = {e["payload"]["reply_id"]: e["payload"]["parts"]
                   for e in t.events("channel.replied@v1", ch)}
        for u, n in ((u1, 3), (u2, 2)):
            r = replies[str(u)]
            self.assertEqual((r["status"], r["parts_sent"], replied.get(r["id"])), ("sent", n, n))


class OutboxTest(TelegramCase):
    """The outbox against the fake's injected failures; each answer is sent at most once."""

    def sent_after(self, failures, text):
        """The reply to a message whose answer meets `failures` first; the sendMessage calls."""
        agent, ch = self.bot()
        self.fake.fail("sendMessage", *failures)
        r = self.t.wait_reply(ch, self.fake.message(111, text), timeout=40)
        self.assertEqual((r["status"], r["attempts"]), ("sent", len(failures) + 1), r)
        self.assertEqual([m["_text"] for m in self.fake.to(111)], ['You said: "%s"' % text])
        return self.fake.sends(111)

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

    def test_the_outgoing_hook_transforms_an_answer_once_however_often_it_is_tried(self):
        # channel.message.out@v1 runs before the answer's first request; what it made is what
        # each retry sends (a plugin that signs the answer signs it once).
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        source = """
ctx.bus.on('channel.message.out@v1', function(m)
  m.content = m.content .. ' -- signed'
  return m
end)"""
        plugin = "signer-" + os.urandom(4).hex()
        t.ok("POST", "/v1/plugins", {
            "manifest": {"id": plugin, "name": "Signer", "version": "1.0.0", "kind": "lua",
                         "events": ["channel.message.out@v1"]},
            "source": source}, expect=201)
        t.ok("POST", "/v1/plugins/%s/enable" % plugin, {"agent_id": agent["id"]})
        fake.fail("sendMessage", {"status": 500}, {"status": 429, "retry_after": 1})
        r = t.wait_reply(ch, fake.message(111, "sign this"), timeout=40)
        self.assertEqual((r["status"], r["attempts"]), ("sent", 3), r)
        self.assertEqual([m["_text"] for m in fake.to(111)],
                         ['You said: "sign this" -- signed'])
        self.assertEqual([c["status"] for c in fake.sends(111)], [500, 429, 200])

    def test_a_blocked_bot_is_dead_at_once_and_a_cut_send_is_unknown(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        for chat, failure, status in (
                (111, {"status": 403, "description": "Forbidden: bot was blocked by the user"},
                 "dead"),
                (222, {"drop": True}, "unknown")):
            fake.fail("sendMessage", failure)
            update = fake.message(chat, "doomed")
            r = t.wait_reply(ch, update, (status,))
            self.assertEqual(r["attempts"], 1, r)
            if status == "dead":
                self.assertIn("bot was blocked by the user", r["error"])
            failed = [e["payload"] for e in t.events("channel.reply_failed@v1", ch)
                      if e["payload"].get("reply_id") == r["id"]]
            self.assertEqual([p["status"] for p in failed], [status], failed)
        # An answer after both is sent: by then neither was tried again.
        self.answered(333, "anchor")
        self.assertEqual(len(fake.sends(111)), 1, "a blocked bot's answer was tried again")
        self.assertEqual(len(fake.sends(222)), 1, "a send cut after its request was repeated")
        self.assertEqual(fake.to(111) + fake.to(222), [])
        # The outbox by status, and the newest first.
        path = "/v1/channels/%s/replies" % ch["id"]
        every = t.pages(path)
        for status in ("dead", "unknown", "sent"):
            got = t.pages(path + "?status=" + status)
            self.assertEqual(got, [r for r in every if r["status"] == status], status)
            self.assertTrue(got, status)
        self.assertEqual(t.pages(path + "?status=pending"), [])
        newest = t.ok("GET", path + "?order=desc&limit=2")
        self.assertEqual(newest["items"], every[::-1][:2])
        older = t.ok("GET", path + "?order=desc&limit=2&cursor=" + newest["next_cursor"])
        self.assertEqual(older["items"], every[::-1][2:4])
        self.assertEqual(t.ok("GET", path + "?order=desc&status=dead")["items"],
                         [r for r in every if r["status"] == "dead"])
        for bad in ("?status=DEAD", "?status=dead,unknown", "?status=" + "x" * 5000,
                    "?order=newest", "?status=%00"):
            self.assertError(t.request("GET", path + bad), 400, "invalid_argument", bad)

    def test_a_gateways_502_or_504_and_an_unreadable_200_are_unknown_never_repeated(self):
        # Each may have reached Telegram (a proxy passed the request on; Telegram took it and
        # the proxy mangled the answer): sent again, the chat could show the answer twice.
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        for chat, failure in ((441, {"status": 502}), (442, {"status": 504}),
                              (443, {"garbled": True})):
            fake.fail("sendMessage", failure)
            r = t.wait_reply(ch, fake.message(chat, "maybe"), ("unknown",))
            self.assertEqual(r["attempts"], 1, r)
            self.assertIn("may or may not have it", r["error"])
        self.answered(444, "anchor")
        for chat in (441, 442, 443):
            self.assertEqual(len(fake.sends(chat)), 1, "sent again to %d" % chat)
        self.assertEqual(len(fake.to(443)), 1, "the mangled answer's message is shown once")

    def test_a_text_longer_than_any_platform_sends_is_passed_over(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        huge = fake.message(451, "x" * (64 * 1024 + 1))
        self.answered(452, "after the huge one")
        self.assertNotIn(str(huge), t.replies(ch))
        self.assertNotIn("tg: chat:451", t.sessions(agent))

    def test_no_reply_is_skipped_and_a_failed_run_says_so(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot(config={"local_rules": [
            {"match": "quiet", "reply": "Nothing to add. <NO_REPLY>"}]})
        update = fake.message(111, "be quiet")
        self.assertEqual(t.wait_reply(ch, update)["status"], "skipped")
        self.answered(222, "anchor")
        self.assertEqual(fake.sends(111), [], "a <NO_REPLY> answer was sent")
        other = FakeTelegram()
        self.addCleanup(other.stop)
        agent, ch = self.bot(other, model="openai/bad-request")
        update = other.message(111, "fail please")
        [m] = other.wait_sent(111)
        r = t.wait_reply(ch, update)
        run = self.server.get_run(r["run_id"], token=t.token)
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(m["_text"], "The agent could not answer (error: %s)."
                         % run["error"]["code"])
        self.assertEqual(run["error"]["code"], "model_error")


class AccessTest(TelegramCase):
    def test_roles_tenants_and_no_token_anywhere(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        self.answered(111, "hello")
        one, replies = "/v1/channels/" + ch["id"], "/v1/channels/%s/replies" % ch["id"]
        create = {"kind": "telegram", "name": "mine",
                  "settings": {"bot_token": t.secret(bot_token()), "api_base": fake.api_base}}
        channels = "/v1/agents/%s/channels" % agent["id"]
        self.assertError(t.request("POST", channels, create, token=t.guest), 403,
                         "permission_denied", "a guest creating a channel")
        self.assertEqual(t.request("GET", replies, token=t.guest)[0], 403)
        self.assertEqual(t.request("GET", replies + "?status=sent&order=desc", token=t.guest)[0],
                         403)
        for method, path, body in (("POST", channels, create), ("DELETE", one, None),
                                   ("PATCH", one, {"enabled": False})):
            self.assertError(t.request(method, path, body, token=t.user), 403,
                             "permission_denied", "%s %s as a user" % (method, path))
        self.assertEqual(t.replies(ch, token=t.user), t.replies(ch))
        other = Tenant(self.server)
        for method, path, body in (("GET", one, None), ("GET", replies, None),
                                   ("GET", replies + "?status=sent&order=desc", None),
                                   ("PATCH", one, {"enabled": False}), ("DELETE", one, None)):
            self.assertError(other.request(method, path, body), 404, "not_found",
                             "%s %s as another tenant" % (method, path))
        own = self.server.create_agent(token=other.token)
        self.assertError(other.request("POST", "/v1/agents/%s/channels" % own["id"], {
            "kind": "telegram", "name": "steal",
            "settings": {"bot_token": ch["settings"]["bot_token"]}}), 400, "invalid_argument")
        t.ok("PATCH", one, {"settings": dict(ch["settings"], role="user")})
        self.answered(111, "still mine", 2)
        t.ok("GET", channels)
        self.assertNoLeak(fake.token)


class ValidationTest(TelegramCase):
    def test_bad_settings_are_400_and_a_secret_serves_one_channel(self):
        t, fake = self.t, self.fake
        name = t.secret(fake.token)
        agent = self.server.create_agent(token=t.token)
        path = "/v1/agents/%s/channels" % agent["id"]
        s = {"bot_token": name, "api_base": fake.api_base, "poll_timeout": 1}

        def body(**settings):
            return {"kind": "telegram", "name": unique_name("v"), "settings": dict(s, **settings)}
        cases = [("no bot_token", {"kind": "telegram", "name": "x", "settings": {}}),
                 ("a missing secret", body(bot_token="NO_SUCH_SECRET")),
                 ("bot_token not a string", body(bot_token=7)),
                 ("an ftp api_base", body(api_base="ftp://127.0.0.1:21")),
                 ("an api_base without a scheme", body(api_base="127.0.0.1:80")),
                 ("an empty api_base", body(api_base="")),
                 ("poll_timeout -1", body(poll_timeout=-1)),
                 ("poll_timeout 51", body(poll_timeout=51)),
                 ("poll_timeout a string", body(poll_timeout="5")),
                 ("role owner", body(role="owner")),
                 ("an unknown field", body(chat_id=5)),
                 ("settings not an object", {"kind": "telegram", "name": "y", "settings": "x"})]
        for what, b in cases:
            self.assertError(t.request("POST", path, b), 400, "invalid_argument", what)
        self.assertEqual(t.ok("GET", path)["items"], [], "a refused channel was written")
        # Defaults, disabled so that it polls nothing.
        ch = t.ok("POST", path, {"kind": "telegram", "name": "tg", "enabled": False,
                                 "settings": {"bot_token": name}}, expect=201)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch["id"])
        self.assertEqual(ch["settings"], {"bot_token": name, "api_base": "https://api.telegram.org",
                                          "role": "guest", "poll_timeout": 25,
                                          "mode": "polling"})
        self.assertEqual(ch["status"], "disabled")
        for timeout in (0, 50):
            got = t.ok("PATCH", "/v1/channels/" + ch["id"],
                       {"settings": dict(ch["settings"], poll_timeout=timeout)})
            self.assertEqual(got["settings"]["poll_timeout"], timeout)
        other = self.server.create_agent(token=t.token)
        for where in (path, "/v1/agents/%s/channels" % other["id"]):
            self.assertError(t.request("POST", where, body()), 409, "conflict", "a shared secret")


class WrongTokenTest(TelegramCase):
    """A token Telegram refuses, and a deleted secret: the channel's status says why."""

    def test_a_wrong_token_is_an_error_until_the_secret_is_fixed(self):
        t, fake = self.t, self.fake
        wrong = bot_token()
        agent, ch = self.bot(token=wrong)
        shown = t.status(ch, "error")
        self.assertIn("401", shown["error"])
        self.assertIn("Unauthorized", shown["error"])
        self.assertGreater(fake.sent()["unauthorized"], 0)
        self.assertEqual(fake.sent()["polls"], [], "an unauthorized poll was taken")
        fake.message(111, "after the fix")
        t.ok("PUT", "/v1/secrets/" + ch["settings"]["bot_token"], {"value": fake.token},
             expect=204)
        [m] = fake.wait_sent(111, timeout=60)
        self.assertEqual(m["_text"], 'You said: "after the fix"')
        t.status(ch, "ready")
        # A deleted secret is an error the channel names; set again, it answers again.
        t.ok("DELETE", "/v1/secrets/" + ch["settings"]["bot_token"], expect=204)
        self.assertIn("secret", t.status(ch, "error")["error"].lower())
        t.ok("PUT", "/v1/secrets/" + ch["settings"]["bot_token"], {"value": fake.token},
             expect=204)
        fake.message(111, "back again")
        fake.wait_sent(111, 2, timeout=60)  # within the poller's backoff
        t.status(ch, "ready")
        # Each change of the poll's state is an event, once: failing (the 401), working again;
        # the missing secret, if a poll met it before it was set again, the same.
        statuses = [(e["payload"]["status"], e["payload"]["error"] != "")
                    for e in t.events("channel.status@v1", ch)]
        self.assertIn(statuses, ([("error", True), ("ready", False)],
                                 [("error", True), ("ready", False)] * 2), statuses)
        self.assertIn("401", t.events("channel.status@v1", ch)[0]["payload"]["error"])
        self.assertNoLeak(wrong, fake.token)


class WebhookWithoutPublicUrlTest(TelegramCase):
    def test_webhook_mode_needs_the_servers_public_url(self):
        t = self.t
        agent = self.server.create_agent(token=t.token)
        st, data, _ = t.request("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "telegram", "name": "hooked",
            "settings": {"bot_token": t.secret(self.fake.token), "mode": "webhook"}})
        self.assertEqual(st, 400, data)
        self.assertIn("public_url", data["error"]["message"])
        for mode in ("push", "", 1, None):
            st, data, _ = t.request("POST", "/v1/agents/%s/channels" % agent["id"], {
                "kind": "telegram", "name": "m",
                "settings": {"bot_token": t.secret(self.fake.token), "mode": mode}})
            self.assertEqual(st, 400, (mode, data))
        self.assertEqual(self.fake.sent()["setwebhook_calls"], 0)


class DisableTest(TelegramCase):
    """A disabled channel polls nothing; enabled again, it takes what was queued meanwhile."""

    def polls(self):
        return self.fake.sent()["attempts"].get("getUpdates", 0)

    def quiet(self, seconds=3):
        """Whether no getUpdates came for `seconds` (an active poller with poll_timeout 1 polls
        at least twice in 3 s, as the test shows first)."""
        before = self.polls()
        time.sleep(seconds)
        return self.polls() == before

    def test_disabled_channels_stop_polling_and_catch_up_when_enabled(self):
        t, fake = self.t, self.fake
        agent, ch = self.bot()
        self.answered(111, "first")
        before = self.polls()
        wait_for(lambda: self.polls() >= before + 2, 3.5, "two polls within 3 s")
        one = "/v1/channels/" + ch["id"]
        off = t.ok("PATCH", one, {"enabled": False})
        self.assertEqual((off["enabled"], off["status"]), (False, "disabled"))
        wait_for(self.quiet, 15, "polling to stop", interval=0)
        queued = fake.message(111, "while disabled")
        self.assertTrue(self.quiet(), "a disabled channel polled")
        self.assertEqual(len(fake.to(111)), 1)
        self.assertEqual(t.ok("PATCH", one, {"enabled": True})["status"], "ready")
        self.assertEqual(fake.wait_sent(111, 2)[1]["_text"], 'You said: "while disabled"')
        self.assertEqual(t.wait_reply(ch, queued)["status"], "sent")
        # New settings take effect with one poller still.
        t.ok("PATCH", one, {"settings": dict(ch["settings"], poll_timeout=2)})
        self.answered(111, "after the patch", 3)
        wait_for(lambda: fake.sent()["poll_requests"][-1].get("timeout") == 2, 20,
                 "polls with the new timeout")
        self.assertEqual(fake.sent()["conflicts"], 0, "two pollers of one bot at once")


class CliTest(TelegramCase):
    """`keel channels` with Telegram bots: add (--bot-token, --api-base; the other kind's flags
    refused before anything is written), show and list (the secret's name, never its value), and
    replies (the outbox). Every output is checked for the tenant's secrets' values."""

    def keel(self, *args, token=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update({"KEEL_URL": self.server.base_url, "KEEL_TOKEN": token or self.t.token})
        out = subprocess.run([keel_bin(), *args], capture_output=True, text=True, env=env,
                             timeout=60, stdin=subprocess.DEVNULL)
        for value in self.t.never:
            self.assertNotIn(value, out.stdout + out.stderr,
                             "keel %s printed a secret's value" % " ".join(args))
        return out

    def listed(self, agent):
        return {c["name"]: c for c in self.t.pages("/v1/agents/%s/channels" % agent["id"])}

    def test_add_refuses_the_other_kinds_flags_and_writes_nothing(self):
        t, fake = self.t, self.fake
        agent = self.server.create_agent(token=t.token)
        # Both secrets exist: a refusal can only be the command line's.
        name, spare = t.secret(fake.token), t.secret(bot_token())
        add = ("channels", "add", agent["name"], "nope")
        for args, says in (
                (("--kind", "telegram"), "--bot-token"),
                (("--kind", "telegram", "--api-base", fake.api_base), "--bot-token"),
                (("--kind", "telegram", "--secret", spare), "--bot-token"),
                (("--kind", "telegram", "--secret", spare, "--bot-token", name), "--secret"),
                (("--kind", "telegram", "--bot-token", name, "--template", "{{}}"), "--template"),
                (("--kind", "telegram", "--bot-token", name, "--conversation", "/x"),
                 "--conversation"),
                (("--kind", "webhook", "--bot-token", name, "--secret", spare), "--bot-token"),
                (("--bot-token", name, "--secret", spare), "--bot-token"),  # webhook by default
                (("--kind", "webhook", "--api-base", fake.api_base, "--secret", spare),
                 "--api-base")):
            out = self.keel(*add, *args)
            self.assertEqual(out.returncode, 2, "%s (kExitUsage): %s" % (args, out.stderr))
            self.assertIn(says, out.stderr, args)
            self.assertEqual(out.stdout, "", args)
        self.assertEqual(self.listed(agent), {}, "a refused add wrote a channel")

    def test_add_show_list_and_replies(self):
        t, fake = self.t, self.fake
        agent = self.server.create_agent(token=t.token)
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "public"})
        name = t.secret(fake.token)
        # --json: the channel as created, naming the secret (its value is never printed).
        out = self.keel("--json", "channels", "add", agent["name"], "tg", "--kind", "telegram",
                        "--bot-token", name, "--api-base", fake.api_base + "/")
        self.assertEqual(out.returncode, 0, out.stderr)
        ch = json.loads(out.stdout)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch["id"])
        self.assertEqual((ch["kind"], ch["name"], ch["agent_id"]), ("telegram", "tg", agent["id"]))
        self.assertEqual(ch["settings"], {"bot_token": name, "api_base": fake.api_base,
                                          "role": "guest", "poll_timeout": 25,
                                          "mode": "polling"})
        self.assertEqual(t.ok("GET", "/v1/channels/" + ch["id"])["settings"], ch["settings"])
        # Without --json: the id, said once the channel exists; --role goes through.
        other = FakeTelegram()
        self.addCleanup(other.stop)
        out = self.keel("channels", "add", agent["id"], "tg-two", "--kind", "telegram",
                        "--bot-token", t.secret(other.token), "--api-base", other.api_base,
                        "--role", "user")
        self.assertEqual(out.returncode, 0, out.stderr)
        two = self.listed(agent).get("tg-two")
        self.assertIsNotNone(two, out.stdout)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + two["id"])
        self.assertIn("created channel tg-two (%s)" % two["id"], out.stdout)
        self.assertEqual((two["kind"], two["settings"]["role"], two["settings"]["api_base"]),
                         ("telegram", "user", other.api_base))
        self.assertEqual(sorted(self.listed(agent)), ["tg", "tg-two"])
        # The same secret for a second channel: the server's conflict, exit 1, nothing written.
        again = self.keel("channels", "add", agent["name"], "tg-three", "--kind", "telegram",
                          "--bot-token", name)
        self.assertEqual(again.returncode, 1, again.stderr)
        self.assertIn("conflict", again.stderr)
        self.assertEqual(sorted(self.listed(agent)), ["tg", "tg-two"])

        # show: the secret's name and the api base, not a webhook's fields.
        shown = self.keel("channels", "show", ch["id"])
        self.assertEqual(shown.returncode, 0, shown.stderr)
        fields = {label.strip(): value.strip() for label, _, value in
                  (line.partition(":") for line in shown.stdout.splitlines())}
        self.assertEqual((fields.get("id"), fields.get("kind"), fields.get("bot token"),
                          fields.get("api base"), fields.get("role")),
                         (ch["id"], "telegram", name, fake.api_base, "guest"), shown.stdout)
        for webhook_only in ("secret", "template", "conversation", "url"):
            self.assertNotIn(webhook_only, fields, shown.stdout)
        shown = self.keel("--json", "channels", "show", ch["id"])
        self.assertEqual(json.loads(shown.stdout)["settings"], ch["settings"])

        # list: both, as telegram channels.
        listed = self.keel("channels", "list", agent["name"])
        self.assertEqual(listed.returncode, 0, listed.stderr)
        lines = listed.stdout.splitlines()
        self.assertEqual(lines[0].split()[:4], ["ID", "NAME", "KIND", "STATUS"])
        rows = {r[0]: r for r in (line.split() for line in lines[1:]) if r}
        self.assertEqual(rows.get(ch["id"], [])[1:3], ["tg", "telegram"], listed.stdout)
        self.assertEqual(rows.get(two["id"], [])[1:3], ["tg-two", "telegram"], listed.stdout)
        listed = json.loads(self.keel("--json", "channels", "list", agent["name"]).stdout)
        self.assertEqual(sorted((c["name"], c["kind"]) for c in listed["items"]),
                         [("tg", "telegram"), ("tg-two", "telegram")])

        # replies: an answered message's row (its update id, sent), and the items with --json.
        empty = self.keel("channels", "replies", ch["id"])
        self.assertEqual(empty.returncode, 0, empty.stderr)
        self.assertEqual(empty.stdout.splitlines()[1:], [], "replies before any message")
        update = fake.message(111, "hello from the cli")
        [m] = fake.wait_sent(111, timeout=40)
        self.assertEqual(m["_text"], 'You said: "hello from the cli"')
        r = t.wait_reply(ch, update, ("sent",))
        out = self.keel("channels", "replies", ch["id"])
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(lines[0].split(), ["UPDATE", "STATUS", "ATTEMPTS", "RUN", "TEXT", "OR",
                                            "ERROR"])
        self.assertEqual([line.split()[:4] for line in lines[1:]],
                         [[str(update), "sent", str(r["attempts"]), r["run_id"]]], out.stdout)
        self.assertIn('You said: "hello from the cli"', lines[1])
        out = self.keel("--json", "channels", "replies", ch["id"])
        self.assertEqual(out.returncode, 0, out.stderr)
        items = json.loads(out.stdout)["items"]
        self.assertEqual([(i["id"], i["delivery_id"], i["status"], i["channel_id"], i["text"])
                          for i in items],
                         [(r["id"], str(update), "sent", ch["id"],
                           'You said: "hello from the cli"')])
        # The other channel answered nothing; a guest may not read the replies.
        self.assertEqual(self.keel("channels", "replies", two["id"]).stdout.splitlines()[1:], [])
        refused = self.keel("channels", "replies", ch["id"], token=t.guest)
        self.assertEqual(refused.returncode, 1, refused.stderr)
        self.assertIn("permission_denied", refused.stderr)


class WebhookModeTest(KeelTestCase):
    """mode "webhook": Keel calls setWebhook with the server's public_url and a secret derived
    from the bot's token; Telegram's pushes to POST /v1/hooks/{id} are authenticated by
    X-Telegram-Bot-Api-Secret-Token (nothing written otherwise), each update is one message
    however often it is pushed, and its answer goes through the outbox. Back to polling, the
    webhook is deleted first. Without public_url, webhook mode is refused."""

    @classmethod
    def setUpClass(cls):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        cls.public = "http://127.0.0.1:%d" % port
        cls.server = KeelServer(env=dict(server_env(), KEEL_PUBLIC_URL=cls.public + "/"),
                                start=False)
        cls.server.start(listen="127.0.0.1:%d" % port)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.t = Tenant(self.server)
        self.fake = FakeTelegram()
        self.addCleanup(self.fake.stop)

    def push(self, **body):
        return self.fake.control("POST", "/_push", body)

    def test_pushed_updates_are_taken_once_and_answered(self):
        t, fake = self.t, self.fake
        agent, ch = t.bot(fake, mode="webhook")
        self.assertEqual(ch["url"], "/v1/hooks/" + ch["id"])
        hook = wait_for(lambda: fake.sent()["webhook"]["url"] or None, 20, "setWebhook")
        self.assertEqual(hook, self.public + "/v1/hooks/" + ch["id"])
        secret = fake.sent()["webhook"]["secret"]
        self.assertRegex(secret, r"^[0-9a-f]{64}$")
        self.assertNotIn(fake.token, secret)
        # A forged, a missing and a stale secret: 401, nothing written.
        before = len(self.server.all_events(token=t.token))
        for forged in ("0" * 64, secret[:-1] + ("0" if secret[-1] != "0" else "1"), None, ""):
            got = self.push(message={"chat_id": 77, "text": "forged"}, secret=forged)
            self.assertEqual(got["status"], 401, (forged, got))
        self.assertEqual(len(self.server.all_events(token=t.token)), before)
        self.assertEqual(t.sessions(agent), {})
        # The real push: 200 once the message is durable, then answered.
        got = self.push(message={"chat_id": 77, "text": "hello hook"})
        self.assertEqual(got["status"], 200, got)
        update = got["update_id"]
        [m] = fake.wait_sent(77)
        self.assertEqual(m["_text"], 'You said: "hello hook"')
        self.assertEqual(t.wait_reply(ch, update)["status"], "sent")
        # Telegram's retry of the same update: 200, no second message, no second answer.
        same = fake.sent()["messages"]
        again = self.fake.control("POST", "/_push", {"update": {
            "update_id": update, "message": {"message_id": fake.message_ids.get(update, 1),
                                             "from": {"id": 77, "is_bot": False,
                                                      "first_name": "Ann"},
                                             "chat": {"id": 77, "type": "private"},
                                             "date": 0, "text": "hello hook"}}})
        self.assertEqual(again["status"], 200, again)
        session = t.sessions(agent)["tg: chat:77"]
        self.assertEqual(t.users(session), ["hello hook"])
        self.assertEqual(len(t.replies(ch)), 1)
        self.assertEqual(len(fake.sent()["messages"]), len(same))
        # Not an update: 400; a group message not for the bot: 200 and nothing.
        bad = self.push(update={"update_id": "x", "message": {}})
        self.assertEqual(bad["status"], 400, bad)
        ignored = self.push(message={"chat_id": -5, "text": "just chatting",
                                     "chat_type": "group"})
        self.assertEqual(ignored["status"], 200, ignored)
        self.assertNotIn("tg: chat:-5", t.sessions(agent))
        # No getUpdates while the webhook is set.
        self.assertEqual(fake.sent()["polls"], [])

    def test_back_to_polling_deletes_the_webhook(self):
        t, fake = self.t, self.fake
        agent, ch = t.bot(fake, mode="webhook")
        wait_for(lambda: fake.sent()["webhook"]["url"] or None, 20, "setWebhook")
        settings = dict(ch["settings"], mode="polling")
        t.ok("PATCH", "/v1/channels/" + ch["id"], {"settings": settings})
        wait_for(lambda: not fake.sent()["webhook"]["url"], 20, "deleteWebhook")
        fake.message(78, "polled again")
        [m] = fake.wait_sent(78)
        self.assertEqual(m["_text"], 'You said: "polled again"')
        self.assertEqual(t.ok("GET", "/v1/channels/" + ch["id"])["url"], "")

    def test_a_disabled_channel_and_another_channels_secret_are_refused(self):
        t, fake = self.t, self.fake
        agent, ch = t.bot(fake, mode="webhook")
        wait_for(lambda: fake.sent()["webhook"]["url"] or None, 20, "setWebhook")
        secret = fake.sent()["webhook"]["secret"]
        # The secret of this channel does not open another channel.
        other = FakeTelegram()
        self.addCleanup(other.stop)
        agent2, ch2 = t.bot(other, mode="webhook")
        st, _, _ = self.server.request(
            "POST", "/v1/hooks/" + ch2["id"], body={"update_id": 1, "message": {}},
            token=None, headers={"X-Telegram-Bot-Api-Secret-Token": secret})
        self.assertEqual(st, 401)
        t.ok("PATCH", "/v1/channels/" + ch["id"], {"enabled": False})
        got = self.push(message={"chat_id": 79, "text": "while disabled"})
        self.assertEqual(got["status"], 404, got)
        self.assertNotIn("tg: chat:79", t.sessions(agent))


class RestartTest(KeelTestCase):
    """The offset and the outbox across SIGTERM and kill -9, on a server of the test's own."""

    def setUp(self):
        self.fake = FakeTelegram()
        self.addCleanup(self.fake.stop)
        self.server = KeelServer(env=server_env())
        self.addCleanup(self.server.stop)
        self.t = Tenant(self.server)

    def test_the_offset_is_durable_and_no_update_is_handled_twice(self):
        s, t, fake = self.server, self.t, self.fake
        agent, ch = t.bot(fake)
        expected = []
        for how in ("SIGTERM", "kill -9"):
            taken = fake.message(301, "before " + how)
            ignored = fake.group(-302, "chatter before " + how)
            t.wait_reply(ch, taken, ("sent",))
            wait_for(lambda: ignored + 1 in fake.sent()["polls"], 20, "a poll past the chatter")
            if how == "kill -9":
                s.kill9()
            else:
                s.terminate()
            seen = len(fake.sent()["polls"])
            down = fake.message(301, "while down after " + how)
            s.start()
            first = wait_for(lambda: fake.sent()["polls"][seen:], 30, "a poll after the start")
            self.assertEqual(first[0], ignored + 1, "the first poll after %s" % how)
            t.wait_reply(ch, down, ("sent",))
            expected += ["before " + how, "while down after " + how]
        sessions = t.sessions(agent)
        self.assertEqual(list(sessions), ["tg: chat:301"])
        self.assertEqual(t.users(sessions["tg: chat:301"]), expected)
        self.assertEqual(sorted(m["_text"] for m in fake.to(301)),
                         sorted('You said: "%s"' % x for x in expected))
        self.assertEqual(len(t.events("channel.delivered@v1", ch)), 4)

    def test_a_send_cut_by_kill9_is_unknown_and_never_repeated(self):
        s, t, fake = self.server, self.t, self.fake
        agent, ch = t.bot(fake)
        fake.fail("sendMessage", {"delay": 4})
        update = fake.message(401, "slow answer")
        wait_for(lambda: fake.sends(401), 30, "the send on its way")
        s.kill9()
        s.start()
        r = t.wait_reply(ch, update, ("unknown",))
        self.assertEqual(r["attempts"], 1, r)
        anchor = fake.message(402, "after")
        t.wait_reply(ch, anchor, ("sent",))
        wait_for(lambda: fake.to(401), 10, "the slow send's answer")  # Telegram took it
        self.assertEqual(len(fake.sends(401)), 1, "a send cut by the crash was repeated")


class CrashTest(KeelTestCase):
    """kill -9 twice at random moments while 30 updates arrive over five chats and answers go
    out (some slowly, so that a kill may cut one): afterwards every update is one message in its
    chat's session, each answer was sent at most once, and none stays waiting or pending."""

    def test_updates_and_answers_across_two_kill9s(self):
        seed = random.randrange(1 << 30)
        rng, pace = random.Random(seed), random.Random(seed + 1)
        fake = FakeTelegram()
        self.addCleanup(fake.stop)
        s = self.server = KeelServer(env=server_env())
        self.addCleanup(s.stop)
        t = Tenant(s)
        agent, ch = t.bot(fake)
        chats = [(101, "private"), (102, "private"), (103, "private"), (-201, "group"),
                 (-202, "supergroup")]
        fake.fail("sendMessage", *[{"delay": rng.choice((0, 0, 0.3, 0.6))} for _ in range(30)])
        sent = {}  # update_id -> (chat, text)

        def sender():
            for i in range(30):
                chat, kind = chats[i % len(chats)]
                text = "crash %d" % i
                if kind == "private":
                    u = fake.message(chat, text)
                else:
                    u = fake.group(chat, "@keel_test_bot " + text, chat_type=kind,
                                   first_name="Ann")
                sent[u] = (chat, text)
                time.sleep(pace.uniform(0.03, 0.25))

        th = threading.Thread(target=sender)
        th.start()
        for _ in range(2):
            time.sleep(rng.uniform(0.4, 1.6))
            s.kill9()
            s.start()
        th.join()
        why = "seed %d" % seed
        replies = wait_for(lambda: (lambda rs: rs if len(rs) == 30 and all(
            r["status"] in ENDED for r in rs.values()) else None)(t.replies(ch)), 120,
            "30 replies, each ended (%s)" % why)
        self.assertEqual(sorted(replies), sorted(str(u) for u in sent), why)
        sessions = t.sessions(agent)
        self.assertEqual(sorted(sessions), sorted("tg: chat:%d" % c for c, _ in chats), why)
        for chat, kind in chats:
            want = [text if kind == "private" else "Ann: @keel_test_bot " + text
                    for u, (c, text) in sorted(sent.items()) if c == chat]
            self.assertEqual(t.users(sessions["tg: chat:%d" % chat]), want,
                             "chat %d: each update one message, in order (%s)" % (chat, why))
        messages = fake.sent()["messages"]
        kinds = dict(chats)
        for u, (chat, text) in sent.items():
            r = replies[str(u)]
            self.assertIn(r["status"], ("sent", "unknown"), "%r (%s)" % (r, why))
            said = text if kinds[chat] == "private" else "Ann: @keel_test_bot " + text
            copies = [m for m in messages
                      if m["chat_id"] == chat and m["_text"] == 'You said: "%s"' % said]
            self.assertLessEqual(len(copies), 1, "update %d answered twice (%s)" % (u, why))
            if r["status"] == "sent":
                self.assertEqual(len(copies), 1, "update %d is sent but was not (%s)" % (u, why))
        delivered = [e["payload"]["delivery_id"] for e in t.events("channel.delivered@v1", ch)]
        self.assertEqual(sorted(delivered), sorted(replies), why)


class HostileBotApiTest(KeelTestCase):
    """A tenant's api_base is any server it runs: one that holds its connections open (a byte
    now and then, never the end of the answer) or answers getUpdates at once with nothing; and
    an operator's changes: a channel moved to another bot, one bot token under two secrets, the
    creator's token revoked during a long poll. On a server of the test's own, since a failure
    here may leave it unable to serve."""

    def setUp(self):
        self.server = KeelServer(env=server_env())
        self.addCleanup(self.server.stop)
        self.t = Tenant(self.server)

    def hostile(self, **methods):
        """A Bot API server answering each method with methods[name](handler, params) (getMe:
        a bot; others: ok, true). Returns an object with api_base, token and calls(method)."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        log, lock = [], threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def answer(self, obj, status=200):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def hold(self):
                """The head of an answer, then a byte every two seconds, never its end."""
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 100000\r\n\r\n{")
                try:
                    while not done.is_set():
                        self.wfile.flush()
                        done.wait(2)
                        self.wfile.write(b" ")
                except OSError:
                    pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                params = json.loads(body) if body else {}
                method = self.path.rsplit("/", 1)[-1]
                with lock:
                    log.append((method, params))
                if method in methods:
                    return methods[method](self, params)
                if method == "getMe":
                    return self.answer({"ok": True, "result": {
                        "id": BOT_ID, "is_bot": True, "first_name": "B", "username": "b_bot"}})
                if method == "getUpdates":
                    time.sleep(min(params.get("timeout", 0), 1))
                self.answer({"ok": True, "result": [] if method == "getUpdates" else True})

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024  # every connection Keel opens is accepted at once

            def handle_error(self, request, client_address):
                pass  # Keel closing a connection it gave up on

        done = threading.Event()
        srv = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()

        def stop():
            done.set()
            srv.shutdown()
            srv.server_close()
        self.addCleanup(stop)

        class Api:
            api_base = "http://127.0.0.1:%d" % srv.server_address[1]
            token = bot_token()

            @staticmethod
            def calls(method):
                with lock:
                    return [p for m, p in log if m == method]
        return Api

    @staticmethod
    def updates(first, n):
        """getUpdates answering updates first..first+n-1, a private chat each, from the offset."""
        def get_updates(h, params):
            offset = params.get("offset") or first
            batch = [{"update_id": u, "message": {
                "message_id": 1, "date": int(time.time()), "text": "hello %d" % u,
                "from": {"id": u, "is_bot": False, "first_name": "Ann"},
                "chat": {"id": u, "type": "private"}}}
                for u in range(max(offset, first), first + n)][:100]
            if not batch:
                time.sleep(1)
            h.answer({"ok": True, "result": batch})
        return get_updates

    def open_descriptors(self):
        return len(os.listdir("/proc/%d/fd" % self.server.proc.pid))

    def test_a_tenant_whose_server_holds_its_sends_does_not_stall_other_tenants(self):
        # 70 answers whose sendMessage never ends, more than the sends a node makes at once.
        evil = self.hostile(getUpdates=self.updates(5000, 70), sendMessage=lambda h, p: h.hold())
        self.t.bot(evil)
        # A tenant's sends at once are bounded (8), below the node's (64).
        wait_for(lambda: len(evil.calls("sendMessage")) >= 8, 60, "8 sends held open")
        time.sleep(2)
        self.assertLessEqual(len(evil.calls("sendMessage")), 8, "one tenant's sends at once")
        other, fake = Tenant(self.server), FakeTelegram()
        self.addCleanup(fake.stop)
        agent, ch = other.bot(fake)
        update = fake.message(111, "am I stuck behind someone else's bot?")
        fake.wait_sent(111, timeout=40)
        self.assertEqual(other.wait_reply(ch, update)["status"], "sent")

    @unittest.skipUnless(os.path.isdir("/proc/self/fd"), "counts /proc/PID/fd")
    def test_typing_actions_a_server_never_finishes_are_not_kept_open(self):
        before = self.open_descriptors()
        evil = self.hostile(getUpdates=self.updates(9000, 300),
                            sendChatAction=lambda h, p: h.hold())
        _, ch = self.t.bot(evil)
        # All 300 updates taken (their messages posted), their typing actions held or not.
        wait_for(lambda: len(self.t.replies(ch)) >= 300, 90, "300 updates taken")
        # A typing action is a courtesy of at most five seconds: not a descriptor per update,
        # held for as long as the server likes (they would run out for every tenant).
        wait_for(lambda: self.open_descriptors() < before + 100, 20,
                 "the held typing actions closed (%d descriptors before, %d now)"
                 % (before, self.open_descriptors()))

    def test_a_getupdates_held_open_does_not_keep_the_channel_from_its_new_settings(self):
        t, fake = self.t, FakeTelegram()
        self.addCleanup(fake.stop)
        held = self.hostile(getUpdates=lambda h, p: h.hold())
        agent, ch = t.bot(held, token=fake.token)
        wait_for(lambda: held.calls("getUpdates"), 20, "a getUpdates held open")
        # A long poll lasts poll_timeout (1 s here) and a little more; the owner's fix (another
        # api_base) is then used.
        t.ok("PATCH", "/v1/channels/" + ch["id"],
             {"settings": dict(ch["settings"], api_base=fake.api_base)})
        fake.message(111, "after the fix")
        [m] = fake.wait_sent(111, timeout=45)
        self.assertEqual(m["_text"], 'You said: "after the fix"')

    def test_a_server_answering_getupdates_at_once_is_not_polled_in_a_loop(self):
        api = self.hostile(getUpdates=lambda h, p: h.answer({"ok": True, "result": []}))
        self.t.bot(api, poll_timeout=25)
        wait_for(lambda: api.calls("getUpdates"), 20, "a first getUpdates")
        time.sleep(1)
        before = len(api.calls("getUpdates"))
        time.sleep(5)
        polls = len(api.calls("getUpdates")) - before
        self.assertLessEqual(polls, 25, "%d getUpdates in 5 s with a 25 s timeout" % polls)

    def test_one_bot_under_two_secrets_answers_each_message_once(self):
        # "A secret serves at most one channel" is checked by the secret's name: the same bot
        # token kept under two names is one bot, which two channels must not both poll.
        t, fake = self.t, FakeTelegram()
        self.addCleanup(fake.stop)
        t.bot(fake)
        agent = self.server.create_agent(token=t.token)
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "public"})
        st, body, _ = t.request("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "telegram", "name": "tg", "settings": {
                "bot_token": t.secret(fake.token), "api_base": fake.api_base,
                "poll_timeout": 1}})
        if st == 409:
            return  # refused as the bot of another channel: nothing to poll twice
        self.assertEqual(st, 201, body)
        chats = list(range(601, 621))
        for chat in chats:
            fake.message(chat, "once please")
            time.sleep(0.3)
        for chat in chats:
            fake.wait_sent(chat)
        time.sleep(3)
        twice = [chat for chat in chats if len(fake.to(chat)) > 1]
        self.assertEqual(twice, [], "chats answered twice")

    def test_a_revoked_creators_channel_posts_no_message_after_the_revocation(self):
        t, fake = self.t, FakeTelegram()
        self.addCleanup(fake.stop)
        creator, creator_id = t.new_token("owner")
        agent = self.server.create_agent(token=t.token)
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "public"})
        ch = t.ok("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "telegram", "name": "tg",
            "settings": {"bot_token": t.secret(fake.token), "api_base": fake.api_base}},
            expect=201, token=creator)
        first = fake.message(111, "before the revocation")
        t.wait_reply(ch, first, ("sent",))
        wait_for(lambda: first + 1 in fake.sent()["polls"], 20, "a long poll past it")
        t.ok("DELETE", "/v1/tokens/" + creator_id, expect=(200, 204))
        self.assertIn("revoked", t.status(ch, "error")["error"])
        # The getUpdates under way (up to poll_timeout, 25 s) was asked before the revocation:
        # what it brings must not become a run acting for the revoked token.
        late = fake.message(111, "after the revocation")
        time.sleep(5)
        self.assertNotIn(str(late), t.replies(ch))
        self.assertEqual(t.users(t.sessions(agent)["tg: chat:111"]), ["before the revocation"])
        self.assertEqual(len(fake.to(111)), 1)

    def test_a_channel_moved_to_another_bot_says_so_and_takes_nothing_of_it(self):
        # Update ids are per bot: the new bot's (here lower than the old bot's last) would be
        # confirmed away by the old bot's place, or passed over as the old bot's replays. A
        # channel keeps its bot; moved to another, it says so, and leaves its updates pending.
        t, old, new = self.t, FakeTelegram(), FakeTelegram(bot_id=BOT_ID + 1)
        self.addCleanup(old.stop)
        self.addCleanup(new.stop)
        agent, ch = t.bot(old)
        old.updates(*[{"edited_message": {"message_id": i, "date": 0, "text": "x", "chat": {
            "id": 1, "type": "private"}}} for i in range(20)])
        last = old.message(111, "to the old bot")
        t.wait_reply(ch, last, ("sent",))
        wait_for(lambda: last + 1 in old.sent()["polls"], 20, "a poll past the old bot's updates")
        t.ok("PATCH", "/v1/channels/" + ch["id"], {"settings": dict(
            ch["settings"], bot_token=t.secret(new.token), api_base=new.api_base)})
        update = new.message(222, "to the new bot")
        self.assertLess(update, last)
        self.assertIn("another bot", t.status(ch, "error")["error"])
        time.sleep(2)
        self.assertEqual(new.to(222), [])
        self.assertNotIn(str(update), t.replies(ch))
        self.assertIn(update, new.sent()["pending"], "the new bot's update was confirmed away")

    def test_a_channel_that_handled_no_update_may_move_to_another_bot(self):
        # Its first poll recorded its bot (so that the nodes keep a bot's channels together),
        # but with no update handled there is no place to lose: a corrected token just works.
        t, old, new = self.t, FakeTelegram(), FakeTelegram(bot_id=BOT_ID + 1)
        self.addCleanup(old.stop)
        self.addCleanup(new.stop)
        agent, ch = t.bot(old)
        wait_for(lambda: len(old.sent()["polls"]) >= 2, 20, "two polls of the first bot")
        t.ok("PATCH", "/v1/channels/" + ch["id"], {"settings": dict(
            ch["settings"], bot_token=t.secret(new.token), api_base=new.api_base)})
        update = new.message(222, "to the new bot")
        self.assertEqual(new.wait_sent(222)[0]["_text"], 'You said: "to the new bot"')
        t.wait_reply(ch, update, ("sent",))
        self.assertEqual(t.status(ch, "ready")["error"], "")


# ------------------------------------------------------------------------- approval cards

# Every tool with read and write, no approval, except notes.append, which always needs a human.
APPROVAL_FRAME = {"rules": [
    {"tool": "*", "rights": ["read", "write"], "approval": "never"},
    {"tool": "notes.append", "rights": ["write"], "approval": "always"},
]}
OLGA, BOB, PETE, STRANGER = 501, 502, 503, 599  # Telegram user ids (== their private chat ids)
GROUP = -1001234500
REJECTED = "The tool notes.append returned: error: a human rejected this call."


def note_call(line):
    return "/call notes.append " + json.dumps({"line": line})


def appended(line):
    """The local model's answer once notes.append appended `line`."""
    return "The tool notes.append returned: %s." % json.dumps({"appended": line},
                                                               separators=(",", ":"))


class ApprovalCardTest(TelegramCase):
    """Approvals in chat on Telegram: a run a Telegram message started that parks a tool call
    sends each approver (the policy's approvers, else the agent's owners, who have a Telegram
    identity and wrote to the bot in a private chat) a card with Approve and Reject buttons; a
    press of an approver (polled, or pushed to the webhook) decides it as the API would
    (decided_by "user:ID"), is answered with answerCallbackQuery, and every card of the approval
    is then edited to say who decided (a press, a token, expiry, a cancelled run) and loses its
    buttons. Presses by others, of a decided approval, of the asker under separate_approver, or
    naming an approval not carded here decide nothing. Without a reachable approver the card is
    "skipped", or goes to the conversation itself when the policy allows it. Cards go through
    the outbox: retried after a 429 or 500, never sent again after a cut send.

    Olga (telegram 501) is an owner of a private agent whose channel acts as "user", Bob (502)
    a member with role user who asks in group GROUP (mentioning the bot)."""

    webhook = False  # messages and presses pushed to the webhook rather than polled

    def setUp(self):
        super().setUp()
        self.t.ok("PUT", "/v1/policy", APPROVAL_FRAME)

    # ------------------------------------------------------------------ setting up

    def people(self, agent, olga_writes=True):
        """Olga (owner) and Bob (user) on the agent; Olga says hello to the bot privately first
        (her private chat is where her cards go) unless `olga_writes` is false."""
        olga, bob = self.person("Olga", OLGA), self.person("Bob", BOB)
        self.member(agent, olga, "owner")
        self.member(agent, bob, "user")
        self.olga_hello = self.hello(OLGA, "Olga") if olga_writes else None
        return olga, bob

    def deliver(self, chat, text, **kw):
        """A message to the bot (queued for getUpdates, or pushed to the webhook in webhook
        mode); its update_id."""
        if not self.webhook:
            return self.fake.message(chat, text, **kw)
        got = self.fake.control("POST", "/_push", {"message": dict(kw, chat_id=chat, text=text)})
        self.assertEqual(got["status"], 200, got)
        return got["update_id"]

    def hello(self, chat, name, timeout=30):
        """A private message to the bot, answered: the chat is now the person's. Its
        update_id."""
        n = len(self.fake.to(chat))
        update = self.deliver(chat, "hello from " + name, first_name=name)
        [*_, m] = self.fake.wait_sent(chat, n + 1, timeout=timeout)
        self.assertEqual(m["_text"], 'You said: "hello from %s"' % name)
        return update

    # ------------------------------------------------------------------ a parked call

    def ask(self, ch, line, chat=GROUP, from_id=BOB, name="Bob"):
        """A message that makes the agent call notes.append(line): in a group from Bob
        (mentioning the bot), or in a private chat (chat == from_id). Returns (update_id,
        run_id, the pending approval) once the run waits."""
        t = self.t
        if chat == from_id:
            update = self.deliver(chat, note_call(line), from_id=from_id, first_name=name)
        else:
            update = self.deliver(chat, "@keel_test_bot please\n" + note_call(line),
                                  chat_type="supergroup", from_id=from_id, first_name=name)
        row = wait_for(lambda: (lambda r: r if r and r["run_id"] else None)(
            t.replies(ch).get(str(update))), 30, "the answer's row of update %s" % update)
        run = self.server.wait_run(row["run_id"], states=("waiting_for_approval", "done",
                                                          "failed", "cancelled"),
                                   token=t.token)
        self.assertEqual(run["status"], "waiting_for_approval", run)
        [a] = [x for x in self.server.list_all("/v1/approvals?status=pending", token=t.token)
               if x["run_id"] == run["id"]]
        self.assertEqual((a["tool"], a["arguments"]), ("notes.append", {"line": line}))
        return update, run["id"], a

    def card_text(self, agent, a):
        return ("Approval needed: %s wants to run notes.append\nArguments: %s\nWhy: %s\n"
                "Expires: %s\nApproval %s" % (agent["name"],
                                              json.dumps(a["arguments"], separators=(",", ":")),
                                              a["reason"], a["expires_at"], a["id"]))

    def buttons(self, a):
        return {"inline_keyboard": [[
            {"text": "Approve", "callback_data": "keel:approve:" + a["id"]},
            {"text": "Reject", "callback_data": "keel:reject:" + a["id"]}]]}

    def cards(self, chat, a=None):
        """The messages with buttons sent to the chat (of approval `a`'s, when given)."""
        return [m for m in self.fake.to(chat) if "reply_markup" in m and
                (a is None or a["id"] in json.dumps(m["reply_markup"]))]

    def wait_card(self, chat, a, timeout=30):
        [card] = wait_for(lambda: self.cards(chat, a), timeout,
                          "the card of approval %s in chat %s" % (a["id"], chat))
        return card

    # ------------------------------------------------------------------ presses

    def press(self, card, from_id, name, button=0, **kw):
        """Presses a button of the card (0 Approve, 1 Reject) as Telegram user `from_id`;
        returns Keel's answerCallbackQuery of it."""
        body = dict(kw, chat_id=card["chat_id"], message_id=card["_message_id"],
                    from_id=from_id, first_name=name, username=name.lower(), button=button)
        if self.webhook:  # Keel answers the query before it answers the push
            got = self.fake.control("POST", "/_push", {"press": body})
            self.assertEqual(got["status"], 200, got)
            query = got["callback_query_id"]
        else:
            query = self.fake.control("POST", "/_press", body)["callback_query_id"]
        return self.answer_of(query)

    def answer_of(self, query, timeout=30):
        [answer] = wait_for(lambda: [x for x in self.fake.sent()["callback_answers"]
                                     if x["callback_query_id"] == query], timeout,
                            "answerCallbackQuery of query %s" % query)
        return answer

    def assertRefused(self, answer, starts):
        self.assertTrue(answer["show_alert"], answer)
        self.assertTrue(answer["text"].startswith(starts), answer)

    def assertDecided(self, answer, text):
        self.assertEqual((answer["text"], answer["show_alert"]), (text, False), answer)

    def edits(self, card):
        return [e for e in self.fake.sent()["edits"] if e["chat_id"] == card["chat_id"] and
                e["message_id"] == card["_message_id"]]

    def wait_edit(self, card, timeout=15):
        [edit] = wait_for(lambda: self.edits(card), timeout,
                          "the edit of card %s in chat %s" % (card["_message_id"],
                                                               card["chat_id"]))
        self.assertEqual(edit["reply_markup"], {"inline_keyboard": []}, edit)
        self.assertNotIn("parse_mode", edit)
        return edit

    def approval(self, a):
        return self.t.ok("GET", "/v1/approvals/" + a["id"])

    def notes(self, agent):
        path = os.path.join(self.server.home, "workspaces", agent["id"], "notes.txt")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return f.read().splitlines()

    def answered_in(self, chat, text, timeout=30):
        return wait_for(lambda: [m for m in self.fake.to(chat) if m["_text"] == text],
                        timeout, "%r sent to chat %s" % (text, chat))

    # ------------------------------------------------------------------ tests

    def test_an_owner_approves_from_the_card_in_their_private_chat(self):
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel()
        olga, bob = self.people(agent)
        update, run_id, a = self.ask(ch, "approved from the card")
        self.assertIsNone(self.notes(agent), "the tool ran before anyone approved it")

        card = self.wait_card(OLGA, a)
        self.assertEqual(card["chat_id"], OLGA)
        self.assertEqual(card["text"], self.card_text(agent, a))
        self.assertEqual(card["reply_markup"], self.buttons(a))
        for field in ("parse_mode", "reply_parameters", "message_thread_id"):
            self.assertNotIn(field, card, "a card in a private chat")
        self.assertEqual(self.cards(GROUP), [], "a card in the group with an owner reachable")
        self.assertEqual(self.cards(BOB), [], "a card for Bob, who is no approver")
        row = wait_for(lambda: (lambda r: r if r and r["status"] == "shown" else None)(
            t.replies(ch).get("approval:%s:%s" % (a["id"], olga["id"]))), 15, "the card shown")
        self.assertEqual((row["kind"], row["approval_id"], row["user_id"], row["run_id"]),
                         ("approval_card", a["id"], olga["id"], run_id))
        self.assertEqual(row["text"], card["text"])
        self.assertEqual(self.server.get_run(run_id, token=t.token)["status"],
                         "waiting_for_approval")

        answer = self.press(card, OLGA, "Olga")
        self.assertDecided(answer, "Approved.")
        decided = self.approval(a)
        self.assertEqual((decided["status"], decided["decided_by"]),
                         ("approved", "user:" + olga["id"]), decided)
        run = self.server.wait_run(run_id, token=t.token)
        self.assertEqual((run["status"], run["output"]), ("done", appended(a["arguments"]["line"])))
        self.assertEqual(self.notes(agent), ["approved from the card"])
        [m] = self.answered_in(GROUP, appended("approved from the card"))
        self.assertEqual(m["reply_parameters"]["message_id"], fake.message_ids[update])

        edit = self.wait_edit(card)
        self.assertEqual(edit["text"], "Approved by Olga: notes.append\nApproval %s"
                         % a["id"])
        rows = wait_for(lambda: (lambda rs: rs if all(r["status"] == "sent" for r in rs.values())
                                 else None)(t.replies(ch)), 15, "the card and the answer sent")
        self.assertEqual(sorted(rows), sorted([str(self.olga_hello), str(update),
                                               "approval:%s:%s" % (a["id"], olga["id"])]))
        self.assertEqual(rows["approval:%s:%s" % (a["id"], olga["id"])]["text"], edit["text"])
        ans = rows[str(update)]
        self.assertEqual((ans["kind"], ans["approval_id"], ans["user_id"], ans["run_id"]),
                         ("answer", None, bob["id"], run_id))
        self.assertEqual(len(fake.sent()["callback_answers"]), 1)

    def test_reject_from_the_card(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        update, run_id, a = self.ask(ch, "rejected from the card")
        card = self.wait_card(OLGA, a)
        self.assertDecided(self.press(card, OLGA, "Olga", button=1), "Rejected.")
        decided = self.approval(a)
        self.assertEqual((decided["status"], decided["decided_by"]),
                         ("rejected", "user:" + olga["id"]))
        run = self.server.wait_run(run_id, token=t.token)
        self.assertEqual((run["status"], run["output"]), ("done", REJECTED))
        self.answered_in(GROUP, REJECTED)
        self.assertIsNone(self.notes(agent), "a rejected call ran")
        self.assertEqual(self.wait_edit(card)["text"],
                         "Rejected by Olga: notes.append\nApproval %s"
                         % a["id"])

    def test_only_an_approvers_press_decides(self):
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel()
        olga, bob = self.people(agent)
        _, run_id, a = self.ask(ch, "four eyes")
        card = self.wait_card(OLGA, a)
        # A member who is no owner, and someone Keel does not know: told, nothing decided.
        for who, name in ((BOB, "Bob"), (STRANGER, "Eve")):
            for button in (0, 1):
                answer = self.press(card, who, name, button=button)
                self.assertRefused(answer, "You may not decide this approval")
                self.assertIn(str(who), answer["text"])
        got = self.approval(a)
        self.assertEqual((got["status"], got["decided_by"]), ("pending", None))
        self.assertEqual(self.server.get_run(run_id, token=t.token)["status"],
                         "waiting_for_approval")
        self.assertEqual(self.edits(card), [], "a refused press edited the card")
        self.assertIsNone(self.notes(agent))
        # Owning another agent of the tenant does not make Bob an approver of this one's.
        other = self.server.create_agent(tools=["notes.append"], token=t.token)
        self.member(other, bob, "owner")
        self.assertRefused(self.press(card, BOB, "Bob"), "You may not decide this approval")
        self.assertEqual(self.approval(a)["status"], "pending")
        # The owner's press decides.
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")
        self.assertEqual(self.approval(a)["decided_by"], "user:" + olga["id"])
        self.assertEqual(self.server.wait_run(run_id, token=t.token)["status"], "done")
        self.assertEqual(self.notes(agent), ["four eyes"])
        self.wait_edit(card)
        self.assertEqual(len(fake.sent()["callback_answers"]), 6)

    def test_a_press_after_the_decision_changes_nothing(self):
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "once")
        card = self.wait_card(OLGA, a)
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")
        decided = self.approval(a)
        self.server.wait_run(run_id, token=t.token)
        edit = self.wait_edit(card)
        # A press made before the buttons went, delivered after the decision: either button.
        for button in (0, 1):
            self.assertRefused(self.press(card, OLGA, "Olga", button=button),
                               "Already decided: approved.")
            self.assertEqual(self.approval(a), decided)
        self.assertEqual(self.notes(agent), ["once"])
        self.assertEqual(self.edits(card), [edit])
        self.assertEqual(len(self.cards(OLGA)), 1, "a card was sent again")
        self.assertEqual(self.server.get_run(run_id, token=t.token)["status"], "done")

    def test_a_decision_through_the_api_edits_the_card(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "decided by a token")
        card = self.wait_card(OLGA, a)
        delivery = "approval:%s:%s" % (a["id"], olga["id"])
        wait_for(lambda: t.replies(ch)[delivery]["status"] == "shown", 15, "the card shown")
        got = t.ok("POST", "/v1/approvals/%s/reject" % a["id"], {}, expect=200)
        self.assertEqual((got["status"], got["decided_by"]), ("rejected", t.token_id))
        self.assertEqual(self.wait_edit(card)["text"],
                         "Rejected by an API token: notes.append\nApproval %s" % a["id"])
        run = self.server.wait_run(run_id, token=t.token)
        self.assertEqual(run["output"], REJECTED)
        self.answered_in(GROUP, REJECTED)
        # The card's buttons are gone; a press that was on its way is told.
        self.assertRefused(self.press(card, OLGA, "Olga"), "Already decided: rejected.")
        # A run cancelled while it waits takes its approval along: the card says so.
        _, run_id, a = self.ask(ch, "cancelled with its run")
        card = self.wait_card(OLGA, a)
        t.ok("POST", "/v1/runs/%s/cancel" % run_id, {}, expect=200)
        self.assertEqual(self.approval(a)["status"], "cancelled")
        self.assertEqual(self.wait_edit(card)["text"],
                         "Cancelled with its run: notes.append\nApproval " + a["id"])
        self.assertRefused(self.press(card, OLGA, "Olga", button=1),
                           "Already decided: cancelled.")
        self.assertIsNone(self.notes(agent))

    def test_separate_approver_refuses_the_askers_own_press(self):
        t = self.t
        t.ok("PUT", "/v1/policy", dict(APPROVAL_FRAME, separate_approver=True))
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        pete = self.person("Pete", PETE)
        self.member(agent, pete, "owner")
        self.hello(PETE, "Pete")
        # Olga asks in her own private chat: both owners get a card.
        _, run_id, a = self.ask(ch, "not by myself", chat=OLGA, from_id=OLGA, name="Olga")
        mine, petes = self.wait_card(OLGA, a), self.wait_card(PETE, a)
        for button in (0, 1):
            self.assertRefused(self.press(mine, OLGA, "Olga", button=button),
                               "The policy asks for a separate approver")
        self.assertEqual(self.approval(a)["status"], "pending")
        self.assertIsNone(self.notes(agent))
        # The other owner decides; both cards say so.
        self.assertDecided(self.press(petes, PETE, "Pete"), "Approved.")
        self.assertEqual(self.approval(a)["decided_by"], "user:" + pete["id"])
        run = self.server.wait_run(run_id, token=t.token)
        self.assertEqual(run["output"], appended("not by myself"))
        self.answered_in(OLGA, appended("not by myself"))
        said = "Approved by Pete: notes.append\nApproval %s" % a["id"]
        self.assertEqual(self.wait_edit(mine)["text"], said)
        self.assertEqual(self.wait_edit(petes)["text"], said)
        rows = t.replies(ch)
        for user in (olga, pete):
            self.assertEqual(rows["approval:%s:%s" % (a["id"], user["id"])]["user_id"],
                             user["id"])

    def test_the_policys_approvers_decide_instead_of_the_owners(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, bob = self.people(agent)
        # Pete is a member with role user (so that he may write to the bot), no owner.
        pete = self.person("Pete", PETE)
        self.member(agent, pete, "user")
        self.hello(PETE, "Pete")
        t.ok("PUT", "/v1/agents/%s/policy" % agent["id"], {"approvers": [pete["id"]]})
        _, run_id, a = self.ask(ch, "pete decides")
        card = self.wait_card(PETE, a)
        self.assertEqual(self.cards(OLGA), [], "an owner got a card though the policy names "
                                               "the approvers")
        rows = {r["user_id"] for r in t.replies(ch).values() if r["approval_id"] == a["id"]}
        self.assertEqual(rows, {pete["id"]})
        self.assertRefused(self.press(card, OLGA, "Olga"), "You may not decide this approval")
        self.assertEqual(self.approval(a)["status"], "pending")
        self.assertDecided(self.press(card, PETE, "Pete"), "Approved.")
        self.assertEqual(self.approval(a)["decided_by"], "user:" + pete["id"])
        self.assertEqual(self.server.wait_run(run_id, token=t.token)["status"], "done")
        self.assertEqual(self.wait_edit(card)["text"],
                         "Approved by Pete: notes.append\nApproval %s"
                         % a["id"])

    def test_no_reachable_approver_skips_the_card_or_asks_in_the_conversation(self):
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel()
        # Olga has a Telegram identity, but never wrote to the bot privately.
        olga, bob = self.people(agent, olga_writes=False)
        _, run_id, a = self.ask(ch, "nobody to ask")
        row = wait_for(lambda: t.replies(ch).get("approval:" + a["id"]), 20, "the card's row")
        self.assertEqual((row["kind"], row["status"], row["approval_id"], row["user_id"]),
                         ("approval_card", "skipped", a["id"], None), row)
        self.assertIn("no approver has an identity on telegram with a direct conversation",
                      row["error"])
        self.assertIn(olga["id"], row["error"])
        self.assertIn("decide it in the dashboard or the API", row["error"])
        self.assertEqual([m for m in fake.sent()["messages"] if "reply_markup" in m], [],
                         "a card was sent")
        self.assertEqual(self.approval(a)["status"], "pending")
        t.ok("POST", "/v1/approvals/%s/reject" % a["id"], {}, expect=200)
        self.server.wait_run(run_id, token=t.token)
        self.answered_in(GROUP, REJECTED)
        self.assertEqual(t.replies(ch)["approval:" + a["id"]]["status"], "skipped")

        # The agent's policy lets the card go to the conversation the run came from: there,
        # only an owner's press counts.
        t.ok("PUT", "/v1/agents/%s/policy" % agent["id"], {"approval_in_conversation": True})
        update, run_id, a = self.ask(ch, "ask the group")
        card = self.wait_card(GROUP, a)
        self.assertEqual(card["text"], self.card_text(agent, a))
        self.assertEqual(card["reply_markup"], self.buttons(a))
        self.assertEqual(card["reply_parameters"]["message_id"], fake.message_ids[update])
        row = t.replies(ch)["approval:" + a["id"]]
        self.assertEqual((row["kind"], row["user_id"]), ("approval_card", None))
        self.assertRefused(self.press(card, BOB, "Bob"), "You may not decide this approval")
        self.assertRefused(self.press(card, STRANGER, "Eve"), "You may not decide this approval")
        self.assertEqual(self.approval(a)["status"], "pending")
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")
        self.assertEqual(self.approval(a)["decided_by"], "user:" + olga["id"])
        self.answered_in(GROUP, appended("ask the group"))
        self.assertEqual(self.wait_edit(card)["text"],
                         "Approved by Olga: notes.append\nApproval %s"
                         % a["id"])
        self.assertEqual(self.notes(agent), ["ask the group"])
        self.assertEqual(self.cards(OLGA), [])

    def test_a_forged_press_of_an_approval_not_carded_here_decides_nothing(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "the real one")
        card = self.wait_card(OLGA, a)
        # An approval of another agent (Olga owns it too), and one of this agent asked through
        # the API (carded nowhere).
        other = self.server.create_agent(tools=["notes.append"], token=t.token)
        self.member(other, olga, "owner")
        forged = []
        for target in (other, agent):
            session = self.server.create_session(target["id"], token=t.token)
            st, body, _ = self.server.post_message(session["id"], note_call("forged"), wait=15,
                                                   token=t.token)
            self.assertIn(st, (200, 202), body)
            self.assertEqual(body["run"]["status"], "waiting_for_approval", body)
            [x] = [x for x in self.server.list_all("/v1/approvals?status=pending",
                                                   token=t.token)
                   if x["run_id"] == body["run"]["id"]]
            forged.append(x)
        for x in forged:
            for verdict in ("approve", "reject"):
                answer = self.press(card, OLGA, "Olga", data="keel:%s:%s" % (verdict, x["id"]))
                self.assertRefused(answer, "This approval is not known here.")
            self.assertEqual(self.approval(x)["status"], "pending", x)
        # Not an approval at all.
        answer = self.press(card, OLGA, "Olga", data="keel:approve:no-such-approval")
        self.assertRefused(answer, "This approval is not known here.")
        self.assertEqual(self.approval(a)["status"], "pending")
        self.assertIsNone(self.notes(other))
        # The card's own button still works.
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")
        self.assertEqual(self.server.wait_run(run_id, token=t.token)["status"], "done")
        self.assertEqual(self.notes(agent), ["the real one"])
        for x in forged:
            self.assertEqual(self.approval(x)["status"], "pending", x)

    def test_cards_go_through_the_outbox_once(self):
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        # A card's send cut after its request: unknown (Telegram may show it), never sent again,
        # and not edited once decided (where it is is not known).
        fake.fail("sendMessage", {"drop": True})
        _, run_id, a = self.ask(ch, "cut")
        cut = "approval:%s:%s" % (a["id"], olga["id"])
        row = wait_for(lambda: (lambda r: r if r and r["status"] == "unknown" else None)(
            t.replies(ch).get(cut)), 20, "the cut card unknown")
        self.assertEqual((row["kind"], row["attempts"]), ("approval_card", 1), row)
        self.assertEqual(len(fake.sends(OLGA)), 2, "hello's answer and the cut card only")
        t.ok("POST", "/v1/approvals/%s/reject" % a["id"], {}, expect=200)
        self.answered_in(GROUP, REJECTED)
        # A 429 and then a 500 on the edit: the card is shown once, after retry_after; the edit
        # is made again.
        fake.fail("sendMessage", {"status": 429, "retry_after": 1})
        fake.fail("editMessageText", {"status": 500})
        _, run_id, a = self.ask(ch, "retried")
        card = self.wait_card(OLGA, a)
        self.assertEqual([c["status"] for c in fake.sends(OLGA)][2:], [429, 200])
        self.assertEqual(len(self.cards(OLGA)), 1)
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")
        self.assertTrue(self.wait_edit(card)["text"].startswith("Approved by Olga"))
        self.assertEqual([c["status"] for c in fake.sent()["calls"]
                          if c["method"] == "editMessageText"], [500, 200])
        shown = "approval:%s:%s" % (a["id"], olga["id"])
        row = wait_for(lambda: (lambda r: r if r["status"] == "sent" else None)(
            t.replies(ch)[shown]), 15, "the card's row sent")
        self.assertEqual(row["attempts"], 4, "429, shown, 500, edited")
        self.answered_in(GROUP, appended("retried"))
        self.assertEqual(t.replies(ch)[cut]["status"], "unknown")
        self.assertEqual(self.notes(agent), ["retried"])
        # A card the platform showed is an event, once (not the cut one, nor the edit).
        shown_events = [e["payload"] for e in t.events("channel.card_shown@v1", ch)]
        self.assertEqual([(e["reply_id"], e["approval_id"]) for e in shown_events],
                         [(t.replies(ch)[shown]["id"], a["id"])], shown_events)

    def test_presses_keel_cannot_read_are_passed_over(self):
        # A Bot API server (the tenant's own api_base) may send what Telegram never would: a
        # press whose fields have other types, or of another bot's button. The channel goes on.
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "still pressable")
        card = self.wait_card(OLGA, a)
        message = {"message_id": card["_message_id"], "date": 0, "text": card["text"],
                   "chat": {"id": OLGA, "type": "private"}}
        data = "keel:approve:no-such-approval"  # whatever is made of them, nothing to decide
        odd = [{"id": "q1", "from": {"id": OLGA, "is_bot": "false", "first_name": "Olga"},
                "message": message, "chat_instance": "1", "data": data},
               {"id": "q2", "from": {"id": str(OLGA), "is_bot": 0}, "message": message,
                "chat_instance": "1", "data": data},
               {"id": 3, "from": "Olga", "message": "card", "data": data},
               {"id": "q4", "from": {"id": OLGA, "is_bot": True, "first_name": "Bot"},
                "message": message, "chat_instance": "1", "data": data},
               {"id": "q5", "from": {"id": OLGA, "is_bot": False, "first_name": "Olga"},
                "message": message, "chat_instance": "1", "data": "another:button"},
               {"id": "q6", "from": {"id": OLGA, "is_bot": False, "first_name": "Olga"},
                "message": message, "chat_instance": "1", "data": ["keel:approve", "x"]}]
        fake.updates(*({"callback_query": q} for q in odd))
        self.hello(OLGA, "Olga", timeout=15)  # taken after them: the channel did not stop
        self.assertEqual(self.approval(a)["status"], "pending")
        self.assertEqual(fake.sent()["pending"], [], "updates left unconfirmed")
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")
        self.assertEqual(self.server.wait_run(run_id, token=t.token)["status"], "done")

    def own_server(self, **env):
        """The test goes on on a server of its own (with `env`), in a tenant of its own there;
        the server's address, its public URL."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        public = "http://127.0.0.1:%d" % port
        self.server = KeelServer(env=dict(server_env(), KEEL_PUBLIC_URL=public, **env),
                                 start=False)
        self.addCleanup(self.server.stop)
        self.server.start(listen="127.0.0.1:%d" % port)
        self.t = Tenant(self.server)
        self.t.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        return public

    def test_an_expired_approvals_card_says_so(self):
        self.own_server(KEEL_APPROVAL_TIMEOUT_MS="6000")
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "too slow")
        card = self.wait_card(OLGA, a)
        edit = self.wait_edit(card, timeout=20)
        got = self.approval(a)
        self.assertEqual((got["status"], got["decided_by"]), ("expired", "system"))
        self.assertEqual(edit["text"], "Expired: nobody decided in time: notes.append\n"
                                       "Approval " + a["id"])
        self.assertRefused(self.press(card, OLGA, "Olga"), "Already decided: expired.")
        run = self.server.wait_run(run_id, token=t.token)
        self.answered_in(GROUP, run["output"])
        self.assertIn("expired", run["output"])
        self.assertIsNone(self.notes(agent))

    def test_a_press_pushed_to_the_webhook_decides(self):
        public = self.own_server()
        t, fake = self.t, self.fake
        self.webhook = True
        agent, ch = self.agent_with_channel(mode="webhook")
        self.assertEqual(wait_for(lambda: fake.sent()["webhook"]["url"] or None, 20,
                                  "setWebhook"), public + "/v1/hooks/" + ch["id"])
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "pushed")
        card = self.wait_card(OLGA, a)
        self.assertRefused(self.press(card, BOB, "Bob"), "You may not decide this approval")
        self.assertDecided(self.press(card, OLGA, "Olga", button=1), "Rejected.")
        self.assertEqual(self.approval(a)["decided_by"], "user:" + olga["id"])
        self.assertEqual(self.server.wait_run(run_id, token=t.token)["output"], REJECTED)
        self.answered_in(GROUP, REJECTED)
        self.assertTrue(self.wait_edit(card)["text"].startswith("Rejected by Olga"))
        self.assertEqual(fake.sent()["polls"], [], "a webhook channel polled")


class ChatScheduleTest(TelegramCase):
    """A schedule the agent makes in a chat message's run acts for that message's sender: the
    channel's runs go through its creator's token (an owner's), and each slot is bounded by the
    sender's role on the agent when the slot comes. Bob (a member with role user) has the agent
    schedule two calls from his private chat; the first fires while he is a member, the second,
    after he was removed from the private agent, is refused. So is a schedule that a slot of
    his made (it acts for him too)."""

    def slot(self, s):
        """The event of schedule `s`'s slot: fired or refused."""
        return wait_for(lambda: next((e for e in self.server.all_events(token=self.t.token)
                                      if e["type"] in ("schedule.fired@v1", "schedule.refused@v1")
                                      and e["payload"].get("schedule_id") == s["id"]), None),
                        30, "the slot of schedule " + s["id"])

    def test_a_schedule_made_in_a_chat_takes_its_senders_role_at_each_slot(self):
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel(tools=("schedule.create", "notes.append"))
        bob = self.person("Bob", BOB)
        self.member(agent, bob, "user")
        notes = os.path.join(self.server.home, "workspaces", agent["id"], "notes.txt")

        def schedule(line, seconds, prompt=None):
            """Bob has the agent schedule notes.append(line) (or `prompt`) `seconds` from now;
            the schedule."""
            prompt = prompt or '/call notes.append {"line": "%s"}' % line
            update = fake.message(BOB, "/call schedule.create " + json.dumps(
                {"prompt": prompt, "in_seconds": seconds}), first_name="Bob")
            r = t.wait_reply(ch, update)
            self.assertEqual(r["status"], "sent", r)
            run = self.server.wait_run(r["run_id"], token=t.token)
            self.assertEqual(run["status"], "done", run)
            made = [s for s in t.pages("/v1/agents/%s/schedules" % agent["id"])
                    if s["prompt"] == prompt]
            self.assertEqual(len(made), 1, run)
            return made[0]

        def written():
            if not os.path.exists(notes):
                return ""
            with open(notes) as f:
                return f.read()

        # A schedule whose slot makes another: notes.append("chained") a while after it fires.
        grandchild = '/call notes.append {"line": "chained"}'
        chained = "/call schedule.create " + json.dumps({"prompt": grandchild, "in_seconds": 9})
        first, second, parent = (schedule("while-a-member", 2), schedule("after-removal", 9),
                                 schedule(None, 2, prompt=chained))
        for s in (first, second, parent):
            self.assertEqual(s["user_id"], bob["id"], s)  # whom it acts for
            self.assertEqual(s["created_by"], ch["created_by"], s)  # through the channel's token
        ev = self.slot(first)
        self.assertEqual(ev["type"], "schedule.fired@v1", ev)
        self.server.wait_run(ev["run_id"], token=t.token)
        self.assertIn("while-a-member", written())
        ev = self.slot(parent)
        self.assertEqual(ev["type"], "schedule.fired@v1", ev)
        self.assertEqual(self.server.wait_run(ev["run_id"], token=t.token)["status"], "done")
        [child] = [s for s in t.pages("/v1/agents/%s/schedules" % agent["id"])
                   if s["prompt"] == grandchild]
        self.assertEqual(child["user_id"], bob["id"], child)
        t.ok("DELETE", "/v1/agents/%s/members/%s" % (agent["id"], bob["id"]), expect=(200, 204))
        ev = self.slot(second)
        self.assertEqual(ev["type"], "schedule.refused@v1",
                         "a slot of a schedule Bob made in a chat fired after he was removed "
                         "from the agent: %r" % ev)
        self.assertIn("has no role on the agent", ev["payload"]["reason"])
        self.assertNotIn("after-removal", written())
        ev = self.slot(child)
        self.assertEqual(ev["type"], "schedule.refused@v1",
                         "a schedule one of Bob's slots made fired after his removal: %r" % ev)
        self.assertNotIn("chained", written())

    def test_a_chat_schedule_takes_its_channels_role_at_each_slot(self):
        # The channel's role bounds its runs; a schedule made in one keeps to the role the
        # channel has when each slot comes: once the owner lowers it to guest, disables or
        # deletes the channel, the slots are refused (a guest holds no schedules).
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel(tools=("schedule.create", "notes.append"))
        bob = self.person("Bob", BOB)
        self.member(agent, bob, "owner")
        made = []
        for line, seconds in (("as-user", 2), ("lowered", 7), ("disabled", 12), ("deleted", 17)):
            prompt = '/call notes.append {"line": "%s"}' % line
            update = fake.message(BOB, "/call schedule.create " + json.dumps(
                {"prompt": prompt, "in_seconds": seconds}), first_name="Bob")
            r = t.wait_reply(ch, update)
            self.assertEqual(self.server.wait_run(r["run_id"], token=t.token)["status"], "done")
            [s] = [s for s in t.pages("/v1/agents/%s/schedules" % agent["id"])
                   if s["prompt"] == prompt]
            self.assertEqual((s["channel_id"], s["user_id"]), (ch["id"], bob["id"]), s)
            made.append(s)

        ev = self.slot(made[0])
        self.assertEqual(ev["type"], "schedule.fired@v1", ev)
        t.ok("PATCH", "/v1/channels/" + ch["id"], {"settings": dict(ch["settings"], role="guest")})
        ev = self.slot(made[1])
        self.assertEqual(ev["type"], "schedule.refused@v1",
                         "a slot fired with the role the channel had before: %r" % ev)
        self.assertIn("acts as a guest now", ev["payload"]["reason"])
        t.ok("PATCH", "/v1/channels/" + ch["id"],
             {"settings": dict(ch["settings"], role="user"), "enabled": False})
        ev = self.slot(made[2])
        self.assertEqual(ev["type"], "schedule.refused@v1", ev)
        self.assertIn("it was made through is disabled", ev["payload"]["reason"])
        t.ok("DELETE", "/v1/channels/" + ch["id"], expect=(200, 204))
        ev = self.slot(made[3])
        self.assertEqual(ev["type"], "schedule.refused@v1", ev)
        self.assertIn("it was made through is gone", ev["payload"]["reason"])

    def test_a_slots_run_acts_for_its_sender_after_its_schedule_is_gone(self):
        # A slot's run acts for its schedule's sender and channel whatever becomes of the
        # schedule meanwhile. Here the schedule is deleted while the run waits for the approval
        # of the schedule.create it calls (as a run may cancel its own schedule before making
        # one): the schedule that call makes still acts for Bob through the channel, rather
        # than for the channel's token alone.
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel(tools=("schedule.create",))
        bob = self.person("Bob", BOB)
        self.member(agent, bob, "user")
        t.ok("PUT", "/v1/policy", {"rules": [
            {"tool": "*", "rights": ["read", "write"], "approval": "never"},
            {"tool": "schedule.create", "rights": ["write"], "approval": "always"}]})

        def pending(run_id):
            return wait_for(lambda: next((a for a in self.server.list_all(
                "/v1/approvals?status=pending", token=t.token) if a["run_id"] == run_id), None),
                30, "the approval of run " + run_id)

        later = "/call schedule.create " + json.dumps({"prompt": "later", "in_seconds": 3600})
        update = fake.message(BOB, "/call schedule.create " + json.dumps(
            {"prompt": later, "in_seconds": 2}), first_name="Bob")
        run_id = wait_for(lambda: (t.replies(ch).get(str(update)) or {}).get("run_id"), 30,
                          "Bob's run")
        t.ok("POST", "/v1/approvals/%s/approve" % pending(run_id)["id"], {}, expect=200)
        self.assertEqual(t.wait_reply(ch, update)["status"], "sent")
        [parent] = [s for s in t.pages("/v1/agents/%s/schedules" % agent["id"])
                    if s["prompt"] == later]
        self.assertEqual((parent["user_id"], parent["channel_id"]), (bob["id"], ch["id"]))
        ev = self.slot(parent)
        self.assertEqual(ev["type"], "schedule.fired@v1", ev)
        waiting = pending(ev["run_id"])
        t.ok("DELETE", "/v1/schedules/" + parent["id"], expect=(200, 204))
        t.ok("POST", "/v1/approvals/%s/approve" % waiting["id"], {}, expect=200)
        self.assertEqual(self.server.wait_run(ev["run_id"], token=t.token)["status"], "done")
        [made] = [s for s in t.pages("/v1/agents/%s/schedules" % agent["id"])
                  if s["prompt"] == "later"]
        self.assertEqual((made["user_id"], made["channel_id"]), (bob["id"], ch["id"]),
                         "a schedule made in a slot whose schedule was deleted acts for no "
                         "one: %r" % made)

    def test_on_a_public_agent_a_removed_senders_slots_do_not_fire_as_a_guest(self):
        # Anyone talks to a public agent as a guest, within its budget per identity; a guest
        # holds no schedules (none can make one), so Bob's schedule stops when he is only a
        # guest there, rather than posting as one outside that budget.
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel(tools=("schedule.create", "notes.append"))
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "public"})
        bob = self.person("Bob", BOB)
        self.member(agent, bob, "user")
        prompt = '/call notes.append {"line": "as-a-guest"}'
        update = fake.message(BOB, "/call schedule.create " + json.dumps(
            {"prompt": prompt, "in_seconds": 4}), first_name="Bob")
        r = t.wait_reply(ch, update)
        self.assertEqual(self.server.wait_run(r["run_id"], token=t.token)["status"], "done")
        [s] = [s for s in t.pages("/v1/agents/%s/schedules" % agent["id"])
               if s["prompt"] == prompt]
        t.ok("DELETE", "/v1/agents/%s/members/%s" % (agent["id"], bob["id"]), expect=(200, 204))
        ev = self.slot(s)
        self.assertEqual(ev["type"], "schedule.refused@v1",
                         "a removed sender's slot posted as a guest: %r" % ev)
        self.assertIn("is only a guest on the agent now", ev["payload"]["reason"])


if __name__ == "__main__":
    unittest.main()

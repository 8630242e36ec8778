"""Approval cards (docs/CHANNELS.md, "Approvals in chat"; decisions/0022) and the guests' daily
allowance (docs/USERS.md) attacked by a hostile tenant, a hostile chat user and a careless
operator: presses from elsewhere (another tenant's channel, another channel of the agent, an
unlinked or merged identity, a stranger), separation of duties, forged and malformed Slack,
Discord and Telegram presses, card content injection, the allowance's bypasses and its API, and
who sees the cards. Each attack that once succeeded is a test here: separate_approver holding
against the asker's own token (a chat run's asker is the person whose message started it, not
the channel creator's token, which may then decide); a merge not resetting a guest's spending
for the day; a named approver who cannot write to the bot told why their card was skipped.

Runs on SQLite and, with KEEL_TEST_STORE=postgres, on PostgreSQL."""

import hashlib
import hmac
import json
import os
import subprocess
import threading
import time
import unittest
import urllib.parse

from keel_harness import KeelServer, KeelTestCase, http_request, keel_bin, wait_for
import test_telegram as tg
from test_telegram import APPROVAL_FRAME, BOB, OLGA, PETE, STRANGER, FakeTelegram, note_call
import test_slack as sl
import test_discord as dc
import test_users as us

KEK = tg.KEK
SERVER = None


def server_env():
    return {"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": "127.0.0.1/32"}


def setUpModule():
    global SERVER
    SERVER = KeelServer(env=server_env())


def tearDownModule():
    SERVER.stop()


class Tenant(tg.Tenant):
    def person_token(self, user, role="owner"):
        """A token of `role` belonging to `user` (a person's token)."""
        got = self.ok("POST", "/v1/tokens", {"name": "p-" + os.urandom(3).hex(), "role": role,
                                             "user_id": user["id"]}, expect=201)
        return got["token"], got["id"]


class TgCards(KeelTestCase):
    """A fresh tenant on the module's server with APPROVAL_FRAME, and a Telegram fake; the
    helpers of test_telegram.ApprovalCardTest."""

    webhook = False

    def setUp(self):
        self.server = SERVER
        self.t = Tenant(SERVER)
        self.fake = FakeTelegram()
        self.addCleanup(self.fake.stop)
        self.t.ok("PUT", "/v1/policy", APPROVAL_FRAME)

    agent_with_channel = tg.ApprovalCardTest.agent_with_channel
    person = tg.ApprovalCardTest.person
    member = tg.ApprovalCardTest.member
    people = tg.ApprovalCardTest.people
    deliver = tg.ApprovalCardTest.deliver
    hello = tg.ApprovalCardTest.hello
    ask = tg.ApprovalCardTest.ask
    cards = tg.ApprovalCardTest.cards
    wait_card = tg.ApprovalCardTest.wait_card
    press = tg.ApprovalCardTest.press
    answer_of = tg.ApprovalCardTest.answer_of
    assertRefused = tg.ApprovalCardTest.assertRefused
    assertDecided = tg.ApprovalCardTest.assertDecided
    edits = tg.ApprovalCardTest.edits
    wait_edit = tg.ApprovalCardTest.wait_edit
    approval = tg.ApprovalCardTest.approval
    notes = tg.ApprovalCardTest.notes
    answered_in = tg.ApprovalCardTest.answered_in

    def pending(self, a):
        got = self.approval(a)
        self.assertEqual((got["status"], got["decided_by"]), ("pending", None), got)


# ---------------------------------------------------------------------- separation of duties


class SeparationOfDutiesTest(TgCards):
    def test_the_asker_may_not_approve_their_own_call_with_their_own_token(self):
        # A chat run acts with the channel creator's token (requested_by), but it was asked for
        # by the person whose message started it: their press is refused, and so is their own
        # token (POST /v1/tokens with user_id, an owner of the agent) through
        # POST /v1/approvals/{id}/approve.
        t = self.t
        t.ok("PUT", "/v1/policy", dict(APPROVAL_FRAME, separate_approver=True))
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        pete = self.person("Pete", PETE)
        self.member(agent, pete, "owner")
        _, run_id, a = self.ask(ch, "by myself", chat=OLGA, from_id=OLGA, name="Olga")
        card = self.wait_card(OLGA, a)
        self.assertRefused(self.press(card, OLGA, "Olga"), "The policy asks for a separate")
        self.pending(a)
        olgas_token, _ = t.person_token(olga)
        st, body, _ = t.request("POST", "/v1/approvals/%s/approve" % a["id"], {},
                                token=olgas_token)
        self.assertEqual(st, 403, "the asker approved her own call with her token: %r" % (body,))
        self.pending(a)
        self.assertIsNone(self.notes(agent))

    def test_the_askers_other_identity_and_a_merge_after_asking_are_the_asker(self):
        # Regression: the asker is a user, not an identity: their other identity, and a user
        # merged (after asking) into an approver, are refused under separate_approver.
        t = self.t
        t.ok("PUT", "/v1/policy", dict(APPROVAL_FRAME, separate_approver=True))
        agent, ch = self.agent_with_channel()
        olga, bob = self.people(agent)
        pete = self.person("Pete", PETE)
        self.member(agent, pete, "owner")
        self.hello(PETE, "Pete")
        t.ok("POST", "/v1/users/%s/identities" % olga["id"],
             {"platform": "telegram", "platform_user_id": "504"}, expect=(200, 201))
        self.hello(504, "Olga2")
        _, run_id, a = self.ask(ch, "olga asks as 504", chat=504, from_id=504, name="Olga2")
        card = self.wait_card(OLGA, a)
        self.assertRefused(self.press(card, OLGA, "Olga"), "The policy asks for a separate")
        self.pending(a)
        # Bob asks in the group; then Bob is merged into Pete (an owner): Pete is the asker.
        _, run2, b = self.ask(ch, "bob asks")
        petes = self.wait_card(PETE, b)
        t.ok("POST", "/v1/users/%s/merge" % pete["id"], {"from": bob["id"]}, expect=200)
        self.assertRefused(self.press(petes, PETE, "Pete"), "The policy asks for a separate")
        self.assertRefused(self.press(petes, BOB, "Bob"), "The policy asks for a separate")
        self.pending(b)
        self.assertDecided(self.press(self.wait_card(OLGA, b), OLGA, "Olga"), "Approved.")
        self.assertEqual(self.approval(b)["decided_by"], "user:" + olga["id"])
        self.assertDecided(self.press(self.wait_card(PETE, a), PETE, "Pete", button=1),
                           "Rejected.")

    def test_the_channel_creators_token_may_decide_a_chat_run_under_separate_approver(self):
        # Every run a channel starts acts with the token that created the channel
        # (requested_by); with separate_approver that token (here the tenant's owner, who asked
        # for nothing) still decides the approvals of chat runs others asked for.
        t = self.t
        t.ok("PUT", "/v1/policy", dict(APPROVAL_FRAME, separate_approver=True))
        agent, ch = self.agent_with_channel()
        self.people(agent)
        _, run_id, a = self.ask(ch, "bob asked, not the tenant's owner")
        st, body, _ = t.request("POST", "/v1/approvals/%s/approve" % a["id"], {})
        self.assertEqual(st, 200, body)


# ---------------------------------------------------------------------- presses from elsewhere


class ForeignPressTest(TgCards):
    def test_another_tenants_bot_naming_this_tenants_approval_decides_nothing(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "tenant a")
        card = self.wait_card(OLGA, a)
        # Tenant B: the same Telegram person (501) is the owner of B's agent on B's own bot.
        b = Tenant(SERVER)
        b.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        fake_b = FakeTelegram(bot_id=7000002)
        self.addCleanup(fake_b.stop)
        agent_b = SERVER.create_agent(tools=["notes.append"], token=b.token)
        ch_b = b.ok("POST", "/v1/agents/%s/channels" % agent_b["id"], {
            "kind": "telegram", "name": "tg", "settings": {
                "bot_token": b.secret(fake_b.token), "api_base": fake_b.api_base,
                "poll_timeout": 1, "role": "user"}}, expect=201)
        self.addCleanup(b.request, "DELETE", "/v1/channels/" + ch_b["id"])
        olga_b = b.ok("POST", "/v1/users", {"name": "Olga", "identities": [
            {"platform": "telegram", "platform_user_id": str(OLGA)}]}, expect=201)
        b.ok("PUT", "/v1/agents/%s/members/%s" % (agent_b["id"], olga_b["id"]), {"role": "owner"})
        fake_b.message(OLGA, "hi b")
        [m] = fake_b.wait_sent(OLGA)
        for verdict in ("approve", "reject"):
            q = fake_b.control("POST", "/_press", {
                "chat_id": OLGA, "message_id": m["_message_id"], "from_id": OLGA,
                "first_name": "Olga", "data": "keel:%s:%s" % (verdict, a["id"])})
            [answer] = wait_for(lambda: [x for x in fake_b.sent()["callback_answers"]
                                         if x["callback_query_id"] == q["callback_query_id"]],
                                30, "B's answer")
            self.assertTrue(answer["show_alert"], answer)
            self.assertEqual(answer["text"], "This approval is not known here.")
        self.pending(a)
        self.assertEqual(b.replies(ch_b).keys() & {"approval:" + a["id"]}, set())
        # A's own card still decides.
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")

    def test_a_press_on_another_channel_of_the_agent_decides_nothing(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        fake2 = FakeTelegram(bot_id=7000003)
        self.addCleanup(fake2.stop)
        ch2 = t.ok("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "telegram", "name": "tg2", "settings": {
                "bot_token": t.secret(fake2.token), "api_base": fake2.api_base,
                "poll_timeout": 1, "role": "user"}}, expect=201)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch2["id"])
        fake2.message(OLGA, "hi two")
        [m] = fake2.wait_sent(OLGA)
        _, run_id, a = self.ask(ch, "carded on one")
        card = self.wait_card(OLGA, a)
        q = fake2.control("POST", "/_press", {
            "chat_id": OLGA, "message_id": m["_message_id"], "from_id": OLGA,
            "first_name": "Olga", "data": "keel:approve:" + a["id"]})
        [answer] = wait_for(lambda: [x for x in fake2.sent()["callback_answers"]
                                     if x["callback_query_id"] == q["callback_query_id"]],
                            30, "the other channel's answer")
        self.assertEqual((answer["text"], answer["show_alert"]),
                         ("This approval is not known here.", True))
        self.pending(a)
        self.assertEqual([m for m in fake2.sent()["messages"] if "reply_markup" in m], [])
        self.assertDecided(self.press(card, OLGA, "Olga", button=1), "Rejected.")

    def test_an_identity_unlinked_after_the_card_decides_nothing(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "unlinked")
        card = self.wait_card(OLGA, a)
        t.ok("DELETE", "/v1/users/%s/identities/telegram/%d" % (olga["id"], OLGA), expect=204)
        self.assertRefused(self.press(card, OLGA, "Olga"), "You may not decide this approval")
        self.pending(a)
        # Linked to someone who is no approver: still nothing.
        zed = self.person("Zed", OLGA)
        self.assertRefused(self.press(card, OLGA, "Olga"), "You may not decide this approval")
        self.pending(a)
        # Zed merged into Olga: the identity is Olga's again.
        t.ok("POST", "/v1/users/%s/merge" % olga["id"], {"from": zed["id"]}, expect=200)
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")

    def test_a_press_after_the_agent_is_deleted_decides_nothing(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "deleted agent")
        card = self.wait_card(OLGA, a)
        t.ok("DELETE", "/v1/agents/" + agent["id"], expect=(200, 204))
        time.sleep(1.5)
        self.fake.control("POST", "/_press", {
            "chat_id": OLGA, "message_id": card["_message_id"], "from_id": OLGA,
            "first_name": "Olga", "button": 0})
        time.sleep(3)
        self.assertNotEqual(self.approval(a)["status"], "approved")
        self.assertIsNone(self.notes(agent))



    def test_a_guest_of_the_agent_or_an_owner_of_another_decides_nothing(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, bob = self.people(agent)
        gus = self.person("Gus", 505)
        self.member(agent, gus, "guest")
        other = SERVER.create_agent(tools=["notes.append"], token=t.token)
        stan = self.person("Stan", 506)
        self.member(other, stan, "owner")
        t.ok("PUT", "/v1/agents/%s/policy" % other["id"], {"approvers": [stan["id"]]})
        _, run_id, a = self.ask(ch, "not yours")
        card = self.wait_card(OLGA, a)
        for who, name in ((505, "Gus"), (506, "Stan")):
            for button in (0, 1):
                self.assertRefused(self.press(card, who, name, button=button),
                                   "You may not decide this approval")
        self.pending(a)

    def test_a_webhook_press_without_the_secret_decides_nothing(self):
        import socket
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        self.server = KeelServer(env=dict(server_env(),
                                          KEEL_PUBLIC_URL="http://127.0.0.1:%d" % port),
                                 start=False)
        self.addCleanup(self.server.stop)
        self.server.start(listen="127.0.0.1:%d" % port)
        self.t = Tenant(self.server)
        self.t.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        self.webhook = True
        agent, ch = self.agent_with_channel(mode="webhook")
        wait_for(lambda: self.fake.sent()["webhook"]["url"] or None, 20, "setWebhook")
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "pushed")
        card = self.wait_card(OLGA, a)
        for secret in (None, "", "x" * 256, "wrong"):
            got = self.fake.control("POST", "/_push", {"secret": secret, "press": {
                "chat_id": OLGA, "message_id": card["_message_id"], "from_id": OLGA,
                "first_name": "Olga", "button": 0}})
            self.assertEqual(got["status"], 401, got)
        self.pending(a)
        self.assertDecided(self.press(card, OLGA, "Olga", button=1), "Rejected.")


class ApproverReachTest(TgCards):
    def test_a_named_approver_gets_cards_once_they_can_write_to_the_bot(self):
        # A user the policy names as approver but who has no role on the private agent cannot
        # talk to its bot ("This agent talks only with its members"), so no direct conversation
        # of theirs exists and their card is "skipped", saying why (CHANNELS.md: they need a
        # role, any, to start one). Made a guest, they write once and get the next card.
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, bob = self.people(agent)
        pete = self.person("Pete", PETE)  # a security officer: no role on the agent
        t.ok("PUT", "/v1/agents/%s/policy" % agent["id"], {"approvers": [pete["id"]]})
        self.deliver(PETE, "hello from Pete", first_name="Pete")
        wait_for(lambda: [m for m in self.fake.to(PETE)], 30, "Pete answered")
        _, _, first = self.ask(ch, "for the officer")
        [row] = wait_for(lambda: [r for r in t.replies(ch).values()
                                  if r["approval_id"] == first["id"]], 20, "the card's row")
        self.assertEqual(row["status"], "skipped", row)
        self.assertIn(pete["id"], row["error"])
        t.ok("POST", "/v1/approvals/%s/reject" % first["id"], {}, expect=200)
        self.member(agent, pete, "guest")
        n = len(self.fake.to(PETE))
        self.deliver(PETE, "hello again", first_name="Pete")
        wait_for(lambda: len(self.fake.to(PETE)) > n, 30, "Pete answered as a guest")
        _, _, a = self.ask(ch, "for the officer again")
        card = self.wait_card(PETE, a)
        self.assertDecided(self.press(card, PETE, "Pete"), "Approved.")


# ---------------------------------------------------------------------- Slack


def deep(n):
    return "[" * n + "]" * n


class SlackCards(KeelTestCase):
    """A fresh tenant, a Slack fake, an agent with a slack channel; Olga its owner (U0OLGA,
    IM D0OLGA), Bob a user (U0BOB): test_slack.ApprovalCardTest's setting and helpers."""

    IM, TEAM_CHANNEL, OLGA = "D0OLGA", "C0TEAM", "U0OLGA"

    def setUp(self):
        self.server = SERVER
        self.t = sl.Tenant(SERVER)
        self.fake = sl.FakeSlack()
        self.addCleanup(self.fake.stop)
        self.prepare()

    app = sl.SlackCase.app
    prepare = sl.ApprovalCardTest.prepare
    olga_writes_first = sl.ApprovalCardTest.olga_writes_first
    park = sl.ApprovalCardTest.park
    cards = sl.ApprovalCardTest.cards
    wait_card = sl.ApprovalCardTest.wait_card
    press = sl.ApprovalCardTest.press
    pressed = sl.ApprovalCardTest.pressed
    updates = sl.ApprovalCardTest.updates
    ephemerals = sl.ApprovalCardTest.ephemerals
    wait_ephemeral = sl.ApprovalCardTest.wait_ephemeral
    card_reply = sl.ApprovalCardTest.card_reply
    wait_card_reply = sl.ApprovalCardTest.wait_card_reply
    notes = sl.ApprovalCardTest.notes
    approval = sl.ApprovalCardTest.approval

    def raw(self, body, content_type="application/x-www-form-urlencoded", ch=None, sign=True):
        """POSTs `body` (bytes) to the channel's url, signed with its signing secret as Slack
        signs; (status, body)."""
        body = body.encode() if isinstance(body, str) else body
        stamp = str(int(time.time()))
        mac = hmac.new(self.slack.signing.encode(), b"v0:" + stamp.encode() + b":" + body,
                       hashlib.sha256).hexdigest()
        headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": stamp,
                   "X-Slack-Signature": "v0=" + mac}
        st, data, _ = http_request(self.server.addr, "POST", (ch or self.slack.ch)["url"],
                                   raw_body=body, headers=headers, timeout=60)
        return st, data

    def payload(self, payload):
        raw = payload if isinstance(payload, str) else json.dumps(payload)
        return self.raw("payload=" + urllib.parse.quote(raw, safe=""))

    def press_payload(self, user, value, channel=None):
        return {"type": "block_actions", "user": {"id": user, "username": user.lower()},
                "container": {"type": "message", "message_ts": "1.000001",
                              "channel_id": channel or self.IM},
                "channel": {"id": channel or self.IM}, "message": {"ts": "1.000001"},
                "actions": [{"type": "button", "action_id": "keel_approve",
                             "block_id": "keel_approval", "value": value}]}

    def still_answers(self, text):
        n = len(self.fake.to(self.IM))
        self.slack.taken(self.slack.dm(self.IM, text, user=self.OLGA))
        wait_for(lambda: [m for m in self.fake.to(self.IM)[n:] if m["_text"] == sl.said(text)],
                 30, "the channel answered %r" % text)

    def decided_events(self, a):
        return [e for e in self.server.all_events(token=self.t.token)
                if e["type"] == "approval.decided@v1" and e["payload"]["approval_id"] == a["id"]]


class SlackPressAttackTest(SlackCards):
    def test_malformed_interactivity_requests_decide_nothing_and_stop_nothing(self):
        self.olga_writes_first()
        got, a = self.park("fuzzed")
        card = self.wait_card(self.IM, a["id"])
        value = "keel:approve:" + a["id"]
        good = self.press_payload(self.OLGA, value)
        bodies = [
            "payload=" + urllib.parse.quote(deep(200000)),
            "payload=" + urllib.parse.quote('{"type":"block_actions","x":' + deep(200000) + "}"),
            "payload=" + urllib.parse.quote(json.dumps(dict(
                good, user={"id": "U0EVE"}, actions=[{"value": value, "x": "y" * 900000}]))),
            "payload=" + "%7B" * 300000,
            "payload=%ZZ%7" + urllib.parse.quote(json.dumps(good)),
            "payload=" + urllib.parse.quote(json.dumps(good))[:-3] + "%E",
            b"payload=%7B%22type%22%3A%22block_actions%22%2C%22user%22%3A%7B%22id%22%3A%22"
            b"\xff\xfe%22%7D%7D",
            "payload=%7B%22type%22%3A%22block_actions%22%2C%22user%22%3A%7B%22id%22%3A%22%FF%FE"
            "%22%7D%7D",
            "payload=",
            "payload=null",
            "payload=%5B%5D",
            "payload=%22x%22",
            "payload=1e999999",
            "payload=" + urllib.parse.quote(json.dumps(dict(good, user="U0OLGA"))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, user={"id": 7}))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, user={"id": ["U0OLGA"]}))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, user={"id": "U0OLGA" + "A" * 40}
                                                            ))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, actions={"0": {"value": value}}
                                                            ))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, actions=[value]))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, actions=[{"value": [value]}]))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, actions=[{"value": value + "x"
                                                                            * 200}]))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, type=["block_actions"]))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, type="view_submission"))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, user={"id": "U0BOB"}))) +
            "&payload=" + urllib.parse.quote(json.dumps(good)),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, user={"id": "U0EVE"}, channel=
                                                            {"id": "C" + "9" * 5000}))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, user={"id": "U0EVE"}, channel=
                                                            {"id": "D0OLGA\u0000"}))),
            "payload=" + urllib.parse.quote(json.dumps(dict(good, user={"id": "U0EVE"}, container=
                                                            {"thread_ts": {"a": 1}}))),
            "payload=" + urllib.parse.quote(json.dumps(dict(
                good, user={"id": "U0OLGA"},
                actions=[{"value": "keel:approve:" + a["id"] + "\u0000"}]))),
            "payload=" + urllib.parse.quote('{"type":"block_actions","type":"block_actions"}'),
            "payload=" + "A" * 1000000,
        ]
        for body in bodies:
            st, data = self.raw(body)
            self.assertNotEqual(st // 100, 5, (body[:80], st, data))
            self.assertHealthy()
        self.assertEqual(self.approval(a["id"])["status"], "pending")
        self.assertEqual(self.decided_events(a), [])
        self.still_answers("still here")
        self.pressed(card, self.OLGA, "approve")
        self.assertEqual(self.approval(a["id"])["decided_by"], "user:" + self.olga["id"])

    def test_presses_racing_each_other_and_the_api_decide_once(self):
        t = self.t
        self.olga_writes_first()
        got, a = self.park("raced")
        card = self.wait_card(self.IM, a["id"])
        self.wait_card_reply(a["id"], self.olga["id"], ("shown",))
        results = []

        def press(action):
            results.append(("press", self.press(card, self.OLGA, action, stale=True)["status"]))

        def api(verdict):
            st, body, _ = t.request("POST", "/v1/approvals/%s/%s" % (a["id"], verdict), {})
            results.append(("api", st))

        threads = [threading.Thread(target=press, args=("approve" if i % 2 else "reject",))
                   for i in range(16)]
        threads += [threading.Thread(target=api, args=(v,)) for v in ("approve", "reject") * 2]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        self.assertEqual(sorted(s for k, s in results if k == "press"), [200] * 16, results)
        api_ok = [s for k, s in results if k == "api" and s == 200]
        self.assertLessEqual(len(api_ok), 1, results)
        [e] = wait_for(lambda: self.decided_events(a), 20, "the decision event")
        time.sleep(1)
        self.assertEqual(len(self.decided_events(a)), 1)
        decided = self.approval(a["id"])
        self.assertIn(decided["status"], ("approved", "rejected"))
        self.assertEqual(decided["decided_by"], e["payload"]["decided_by"])
        self.server.wait_run(a["run_id"], token=t.token)
        self.assertEqual(self.notes(), ["raced"] if decided["status"] == "approved" else [])
        # The presses that lost were each told so (an ephemeral each).
        losers = 16 - (1 if decided["decided_by"].startswith("user:") else 0)
        self.wait_ephemeral(self.OLGA, losers)
        [u] = wait_for(lambda: self.updates(card), 20, "the card closed")
        time.sleep(1)
        self.assertEqual(len(self.updates(card)), 1)

    def test_a_press_to_a_disabled_channel_decides_nothing(self):
        t = self.t
        self.olga_writes_first()
        got, a = self.park("disabled")
        card = self.wait_card(self.IM, a["id"])
        t.ok("PATCH", "/v1/channels/" + self.slack.ch["id"], {"enabled": False})
        got = self.press(card, self.OLGA, "approve")
        self.assertEqual(got["status"], 404, got)
        self.assertEqual(self.approval(a["id"])["status"], "pending")
        t.ok("PATCH", "/v1/channels/" + self.slack.ch["id"], {"enabled": True})
        self.pressed(card, self.OLGA, "reject")
        self.assertEqual(self.approval(a["id"])["status"], "rejected")

    def test_card_text_pings_nobody_and_long_arguments_fit(self):
        self.olga_writes_first()
        line = ("<!channel> <!here> <!everyone> <@U0OLGA> <#C0TEAM> <https://evil.example|"
                "click> &amp; &lt; *bold* `code` \u202e\u2028 " + "<!channel>" * 700)
        got = self.slack.mention(self.TEAM_CHANNEL, "<@%s> %s" % (sl.BOT_USER, note_call(line)),
                                 user="U0BOB")
        self.slack.taken(got)
        [a] = wait_for(lambda: [a for a in self.t.pages("/v1/approvals?status=pending")
                                if a["agent_id"] == self.agent["id"]], 20, "the approval")
        self.assertIn("<!channel>", a["arguments"]["line"])
        card = self.wait_card(self.IM, a["id"])
        r = self.wait_card_reply(a["id"], self.olga["id"], ("shown",))
        sent = self.fake.sent()
        self.assertEqual(sent["unescaped"], 0)
        for b in card["blocks"]:
            if b["type"] == "section":
                self.assertLessEqual(len(b["text"]["text"]), 3000)
        self.assertNotIn("<!", card["text"])
        self.pressed(card, self.OLGA, "reject")
        [u] = wait_for(lambda: self.updates(card), 20, "the card closed")
        self.assertEqual(self.fake.sent()["unescaped"], 0)



# ---------------------------------------------------------------------- Discord


class DiscordPressAttackTest(KeelTestCase):
    """Discord's MESSAGE_COMPONENT interactions with fields of odd types, signed with the
    channel's key (the channel is switched to a key of the test's own once the card is shown)."""

    FRAME = dc.ApprovalCardTest.FRAME
    NOTE = dc.ApprovalCardTest.NOTE
    ASK = dc.ApprovalCardTest.ASK

    def setUp(self):
        self.server = SERVER
        self.t = dc.Tenant(SERVER)
        self.fake = dc.FakeDiscord()
        self.addCleanup(self.fake.stop)

    app = dc.DiscordCase.app
    answered = dc.DiscordCase.answered
    cards = dc.ApprovalCardTest.cards
    park = dc.ApprovalCardTest.park
    card = dc.ApprovalCardTest.card
    card_reply = dc.ApprovalCardTest.card_reply
    notes = dc.ApprovalCardTest.notes

    def signed(self, ep, key, interaction):
        raw = interaction if isinstance(interaction, bytes) else json.dumps(interaction).encode()
        stamp = str(int(time.time()))
        sig = key.sign(stamp.encode() + raw).hex()
        st, data, _ = http_request(self.server.addr, "POST", ep.ch["url"], raw_body=raw,
                                   headers={"X-Signature-Ed25519": sig,
                                            "X-Signature-Timestamp": stamp}, timeout=60)
        return st, data

    def test_odd_component_interactions_decide_nothing_and_stop_nothing(self):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        t = self.t
        ep, ann, bob = self.cards()
        got, reply, a = self.park(ep)
        m = self.card(dc.DM1, a, ep)
        self.card_reply(ep, "approval:%s:%s" % (a["id"], ann["id"]))
        key = Ed25519PrivateKey.generate()
        public = key.public_key().public_bytes(serialization.Encoding.Raw,
                                               serialization.PublicFormat.Raw).hex()
        t.ok("PATCH", "/v1/channels/" + ep.ch["id"],
             {"settings": dict(ep.ch["settings"], public_key=public)})
        cid = "keel:approve:" + a["id"]
        good = {"type": 3, "id": "1300000000000000001", "application_id": dc.APP_ID,
                "token": "tok", "channel_id": dc.DM1, "user": dc.ANN, "message": {
                    "id": m["message_id"], "channel_id": dc.DM1},
                "data": {"custom_id": cid, "component_type": 2}}
        noone = {k: v for k, v in good.items() if k != "user"}
        odd = [
            dict(good, user=None), dict(good, user="3300000000000000001"),
            dict(good, user={"id": 3300000000000000001}),
            dict(good, user={"id": ["3300000000000000001"]}),
            dict(good, user={"id": "3300000000000000001" + "0" * 30}),
            dict(good, user=dict(dc.ANN, bot=True)),
            dict(noone, member="ann"), dict(noone, member={"user": "ann"}),
            dict(noone, member=[dc.ANN]), dict(noone, member={"user": {"id": {"$ne": None}}}),
            dict(good, member={"user": {"id": "3300000000000000002"}}),  # Bob, in a server
            dict(good, data=None), dict(good, data="keel:approve:" + a["id"]),
            dict(good, data={"custom_id": [cid]}), dict(good, data={"custom_id": 7}),
            dict(good, data={"custom_id": cid + "\u0000"}),
            dict(good, data={"custom_id": "keel:approve:" + "x" * 100000}),
            dict(good, data={"custom_id": "keel:approve:"}),
            dict(good, data={"custom_id": "keel:maybe:" + a["id"]}),
            dict(good, message="m", user={"id": "3300000000000000007"}),
            dict(good, message={"id": {"a": 1}, "channel_id": []}, user={"id": "3300000000000000007"}),
            dict(good, type="3"), dict(good, type=[3]), dict(good, type=3.5),
            dict(good, user={"id": "3300000000000000002"}),  # Bob: no approver
            {"type": 3}, {"type": 3, "data": {}},
        ]
        for interaction in odd:
            st, body = self.signed(ep, key, interaction)
            self.assertNotEqual(st // 100, 5, (interaction, st, body))
            self.assertHealthy()
            if st == 200 and isinstance(body, dict):
                self.assertNotEqual(body.get("type"), 6, ("decided", interaction, body))
        st, body = self.signed(ep, key, b'{"type":3,"data":' + b"[" * 200000 + b"]" * 200000 +
                               b"}")
        self.assertNotEqual(st // 100, 5, (st, body))
        self.assertHealthy()
        self.assertEqual(t.ok("GET", "/v1/approvals/" + a["id"])["status"], "pending")
        # The channel still takes a command, and the right press still decides.
        cmd = {"type": 2, "id": "1300000000000000009", "application_id": dc.APP_ID,
               "token": "t2", "channel_id": dc.DM1, "user": dc.ANN,
               "data": {"name": ep.ch["settings"]["command"], "type": 1,
                        "options": [{"name": "message", "type": 3, "value": "still here"}]}}
        st, body = self.signed(ep, key, cmd)
        self.assertEqual((st, body), (200, {"type": 5}))
        st, body = self.signed(ep, key, good)
        self.assertEqual((st, body), (200, {"type": 6}))
        self.assertEqual(t.ok("GET", "/v1/approvals/" + a["id"])["decided_by"],
                         "user:" + ann["id"])



# ---------------------------------------------------------------------- the guests' allowance


class AllowanceTelegramCase(us.TelegramCase):
    def the_server(self):
        return SERVER


class AllowanceBypassTest(AllowanceTelegramCase):
    def test_a_merge_does_not_reset_a_guests_spending_for_the_day(self):
        # A guest's spending is summed over the answers recorded with their user id; once the
        # guest's user is merged into another (the same person on another platform, as
        # USERS.md asks), the answers recorded under the merged user still count: one person's
        # identities share the allowance.
        t, fake = self.t, self.fake
        agent, ch = self.bot(level="public")
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"guest_daily_tokens": 3})
        left = 60 - time.time() % 60
        if left < 30:
            time.sleep(left + 0.2)
        self.answered(ch, fake.message(888, "one two three four"), 888, "one two three four")
        self.refused(ch, fake.message(888, "again"), us.ALLOWANCE % 3, 888)
        # The same person, on another account: a user of their own, merged into by the first.
        other = t.person("Same person", ("telegram", 889))
        t.member(agent, other, "guest")
        [first] = [u for u in t.pages("/v1/users") if us.pairs(u) == [("telegram", "888")]]
        t.ok("POST", "/v1/users/%s/merge" % other["id"], {"from": first["id"]}, expect=200)
        over = fake.message(888, "after the merge")
        r = t.wait_reply(ch, over, ("sent",))
        self.assertEqual((r["run_id"], r["text"]), ("", us.ALLOWANCE % 3),
                         "the merged guest was answered past the allowance")


class AccessApiTest(KeelTestCase):
    def setUp(self):
        self.server = SERVER
        self.t = us.Tenant(SERVER)
        self.agent = SERVER.create_agent(token=self.t.token)
        self.path = "/v1/agents/%s/access" % self.agent["id"]

    def test_who_may_read_and_set_the_allowance(self):
        t, path = self.t, self.path
        t.ok("PUT", path, {"guest_daily_tokens": 1234})
        other = us.Tenant(SERVER)
        for method, body in (("GET", None), ("PUT", {"guest_daily_tokens": 1})):
            st, got, _ = t.request(method, path, body, token=other.token)
            self.assertEqual(st, 404, (method, got))
        st, got, _ = t.request("GET", path, token=t.guest)
        self.assertEqual(st, 403, got)
        self.assertEqual(t.ok("GET", path, token=t.user)["guest_daily_tokens"], 1234)
        for token in (t.guest, t.user):
            st, got, _ = t.request("PUT", path, {"guest_daily_tokens": 0}, token=token)
            self.assertEqual(st, 403, got)
        revoked, rid = t.new_token("owner")
        t.ok("DELETE", "/v1/tokens/" + rid, expect=(200, 204))
        for method, body in (("GET", None), ("PUT", {"guest_daily_tokens": 0})):
            st, got, _ = t.request(method, path, body, token=revoked)
            self.assertEqual(st, 401, (method, got))
        # A person's token: an owner of the agent may; a user of it, or an owner of another
        # agent, may not.
        ann = t.ok("POST", "/v1/users", {"name": "Ann"}, expect=201)
        bob = t.ok("POST", "/v1/users", {"name": "Bob"}, expect=201)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (self.agent["id"], ann["id"]), {"role": "user"})
        elsewhere = SERVER.create_agent(token=t.token)
        t.ok("PUT", "/v1/agents/%s/members/%s" % (elsewhere["id"], bob["id"]), {"role": "owner"})
        for user, want in ((ann, 403), (bob, 404)):
            token = t.ok("POST", "/v1/tokens", {"name": "p", "role": "owner",
                                                "user_id": user["id"]}, expect=201)["token"]
            st, got, _ = t.request("PUT", path, {"guest_daily_tokens": 0}, token=token)
            self.assertEqual(st, want, (user["name"], got))
        self.assertEqual(t.ok("GET", path)["guest_daily_tokens"], 1234)

    def test_bad_bodies_change_nothing(self):
        t, path = self.t, self.path
        t.ok("PUT", path, {"guest_daily_tokens": 77})
        bodies = [b"", b"{}", b"[]", b"null", b"1", b'"x"', b"{" * 200000,
                  b'{"guest_daily_tokens":' + b"[" * 200000 + b"]" * 200000 + b"}",
                  b'{"guest_daily_tokens":1,"guest_daily_tokens":2}',
                  b'{"guest_daily_tokens":true}', b'{"guest_daily_tokens":-1}',
                  b'{"guest_daily_tokens":-0.0}', b'{"guest_daily_tokens":1e3}',
                  b'{"guest_daily_tokens":1000000000001}',
                  b'{"guest_daily_tokens":9223372036854775807}',
                  b'{"guest_daily_tokens":9223372036854775808}',
                  b'{"guest_daily_tokens":18446744073709551615}',
                  b'{"guest_daily_tokens":18446744073709551616}',
                  b'{"guest_daily_tokens":-9223372036854775808}',
                  b'{"guest_daily_tokens":1' + b"0" * 400 + b"}",
                  b'{"guest_daily_tokens":"5"}', b'{"guest_daily_tokens":null}',
                  b'{"guest_daily_tokens":{}}', b'{"guest_daily_tokens":5,"extra":1}',
                  b'{"guest_daily_tokens":5,"level":"open"}',
                  b'{"guest_daily_tokens":5,"code":"short"}',
                  b'{"guest_daily_tokens":\xff}', b'{"guest_daily_tokens":5\x00}']
        for body in bodies:
            st, got, _ = t.request("PUT", path, raw_body=body)
            self.assertIn(st, (400, 413), (body[:60], st, got))
        self.assertEqual(t.ok("GET", path)["guest_daily_tokens"], 77)
        self.assertEqual(t.ok("PUT", path, {"guest_daily_tokens": 10 ** 12})["guest_daily_tokens"],
                         10 ** 12)
        self.assertEqual(t.ok("PUT", path, {"guest_daily_tokens": 0})["guest_daily_tokens"], 0)
        self.assertHealthy()

    def test_the_cli_refuses_bad_allowances(self):
        t = self.t
        env = dict(os.environ, KEEL_HOME=SERVER.home, KEEL_URL="http://" + SERVER.addr,
                   KEEL_TOKEN=t.token, NO_COLOR="1")

        def cli(*args):
            return subprocess.run([keel_bin()] + list(args), capture_output=True, text=True,
                                  env=env, timeout=60)

        ok = cli("agent", "access", self.agent["id"], "--guest-daily-tokens", "4321")
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn("4321", ok.stdout)
        for bad in ("-1", "abc", "1e3", "1.5", "1000000000001", "99999999999999999999",
                    "9223372036854775808", "", "--", "-0x1"):
            got = cli("agent", "access", self.agent["id"], "--guest-daily-tokens", bad)
            self.assertNotEqual(got.returncode, 0, (bad, got.stdout, got.stderr))
        self.assertEqual(t.ok("GET", self.path)["guest_daily_tokens"], 4321)
        shown = cli("agent", "access", self.agent["id"])
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertIn("4321", shown.stdout)


class PolicyLimitsTest(KeelTestCase):
    def setUp(self):
        self.server = SERVER
        self.t = us.Tenant(SERVER)
        self.agent = SERVER.create_agent(token=self.t.token)

    def test_approvers_lists_too_long_or_too_deep_are_refused(self):
        t = self.t
        for path in ("/v1/policy", "/v1/agents/%s/policy" % self.agent["id"]):
            for body in ({"approvers": ["u%d" % i for i in range(1001)]},
                         {"approvers": ["x" * 129]}, {"approvers": [""]},
                         {"approvers": [7]}, {"approvers": "u1"},
                         {"approvers": [["u1"]]}, {"approval_in_conversation": "true"},
                         {"approval_in_conversation": 1}):
                st, got, _ = t.request("PUT", path, body)
                self.assertEqual(st, 400, (path, str(body)[:60], got))
            for raw in (b'{"approvers":' + b"[" * 200000 + b"]" * 200000 + b"}",
                        b'{"approvers":["a"],"approvers":["b"]}'):
                st, got, _ = t.request("PUT", path, raw_body=raw)
                self.assertIn(st, (400, 413), (path, raw[:40], got))
            st, got, _ = t.request("PUT", path, {"approvers": ["u%d" % i for i in range(1000)]})
            self.assertEqual(st, 200, got)
        self.assertHealthy()

    def test_a_guest_or_a_user_may_not_name_the_approvers(self):
        t = self.t
        for token in (t.guest, t.user):
            for path in ("/v1/policy", "/v1/agents/%s/policy" % self.agent["id"]):
                st, got, _ = t.request("PUT", path, {"approvers": ["me"]}, token=token)
                self.assertEqual(st, 403, (path, got))


# ---------------------------------------------------------------------- who sees the cards


class CardVisibilityTest(TgCards):
    def test_cards_are_shown_to_the_agents_members_only(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, bob = self.people(agent)
        _, run_id, a = self.ask(ch, "who sees me")
        self.wait_card(OLGA, a)
        path = "/v1/channels/%s/replies" % ch["id"]
        rows = t.replies(ch)
        self.assertIn("approval:%s:%s" % (a["id"], olga["id"]), rows)
        st, got, _ = t.request("GET", path, token=t.guest)
        self.assertEqual(st, 403, got)
        other = Tenant(SERVER)
        for token in (other.token, other.user, other.guest):
            st, got, _ = t.request("GET", path, token=token)
            self.assertIn(st, (403, 404), got)
            st, got, _ = t.request("GET", "/v1/approvals/" + a["id"], token=token)
            self.assertIn(st, (403, 404), got)
        # People's tokens: a guest of the agent, and an owner of another agent, see nothing.
        guest = self.person("Gus", 505)
        self.member(agent, guest, "guest")
        elsewhere = SERVER.create_agent(token=t.token)
        stranger = self.person("Stan", 506)
        self.member(elsewhere, stranger, "owner")
        for user, want in ((guest, 403), (stranger, 404)):
            token, _ = t.person_token(user)
            st, got, _ = t.request("GET", path, token=token)
            self.assertEqual(st, want, (user["name"], got))
            st, got, _ = t.request("GET", "/v1/approvals/" + a["id"], token=token)
            self.assertEqual(st, want, (user["name"], got))
        # Bob (a user of the agent) may look, as he may look at its approvals.
        token, _ = t.person_token(bob)
        st, got, _ = t.request("GET", path, token=token)
        self.assertEqual(st, 200, got)

    def test_no_secret_reaches_a_card_a_reply_an_event_or_the_log(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        code = "sesame-" + os.urandom(6).hex()
        t.never.append(code)
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "protected", "code": code})
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "no secrets")
        card = self.wait_card(OLGA, a)
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")
        self.wait_edit(card)
        rows = json.dumps(t.replies(ch))
        events = json.dumps(self.server.all_events(token=t.token))
        with open(self.server.stderr_path, errors="replace") as f:
            log = f.read()
        with open(self.server.stdout_path, errors="replace") as f:
            log += f.read()
        for value in (self.fake.token, self.fake.token.split(":")[1], code):
            self.assertNotIn(value, rows)
            self.assertNotIn(value, events)
            self.assertNotIn(value, log)
            self.assertNotIn(value, json.dumps(self.fake.sent()["messages"]))


class TelegramCardContentTest(TgCards):
    def test_html_control_characters_and_long_arguments_are_sent_as_text(self):
        t = self.t
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        line = ("<b>bold</b> <a href=\"tg://user?id=1\">x</a> & &amp; <unclosed @everyone "
                "\u0001\u0007\u001b[31m\u007f\u202e\u2028\ufeff " + "\U0001f600" * 1500)
        _, run_id, a = self.ask(ch, line, chat=OLGA, from_id=OLGA, name="Olga")
        card = self.wait_card(OLGA, a)
        self.assertNotIn("parse_mode", card)
        row = wait_for(lambda: (lambda r: r if r and r["status"] == "shown" else None)(
            t.replies(ch).get("approval:%s:%s" % (a["id"], olga["id"]))), 15, "the card shown")
        self.assertLessEqual(len(card["text"].encode()), 4096)
        self.assertTrue(card["text"].endswith("\nApproval " + a["id"]), card["text"][-200:])
        self.assertDecided(self.press(card, OLGA, "Olga", button=1), "Rejected.")
        self.wait_edit(card)

    def test_a_tool_call_with_a_huge_argument_is_carded_cut_short(self):
        t = self.t
        big = "<b>" + "x" * 900000 + "</b>"
        agent = SERVER.create_agent(tools=["notes.append"], token=t.token, config={
            "local_rules": [{"match": "write it down",
                             "call": {"tool": "notes.append", "arguments": {"line": big}}}]})
        ch = t.ok("POST", "/v1/agents/%s/channels" % agent["id"], {
            "kind": "telegram", "name": "tg", "settings": {
                "bot_token": t.secret(self.fake.token), "api_base": self.fake.api_base,
                "poll_timeout": 1, "role": "user"}}, expect=201)
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch["id"])
        olga, _ = self.people(agent)
        update = self.deliver(OLGA, "please write it down", first_name="Olga")
        [a] = wait_for(lambda: [x for x in t.pages("/v1/approvals?status=pending")
                                if x["agent_id"] == agent["id"]], 30, "the approval")
        card = self.wait_card(OLGA, a)
        self.assertLessEqual(len(card["text"].encode()), 1900)
        self.assertTrue(card["text"].endswith("\nApproval " + a["id"]), card["text"][-100:])
        self.assertDecided(self.press(card, OLGA, "Olga", button=1), "Rejected.")
        self.wait_edit(card)

    def test_odd_callback_queries_decide_nothing(self):
        t, fake = self.t, self.fake
        agent, ch = self.agent_with_channel()
        olga, _ = self.people(agent)
        _, run_id, a = self.ask(ch, "odd presses")
        card = self.wait_card(OLGA, a)
        message = {"message_id": card["_message_id"], "date": 0, "text": "x",
                   "chat": {"id": OLGA, "type": "private"}}
        data = "keel:approve:" + a["id"]

        def q(i, **kw):
            return dict({"id": "odd%d" % i, "from": {"id": STRANGER, "is_bot": False,
                                                      "first_name": "Eve"},
                         "message": message, "chat_instance": "1", "data": data}, **kw)
        odd = [q(1, **{"from": {"id": 501.0}}), q(2, **{"from": {"id": 2 ** 64 - 1}}),
               q(3, **{"from": {"id": -OLGA}}), q(4, **{"from": {"id": "501 "}}),
               q(5, **{"from": {"id": "0501"}}), q(6, **{"from": {"id": True}}),
               q(7, **{"from": [OLGA]}), q(8, data={"data": data}),
               q(9, data=data + "\u0000"), q(10, data=data.upper()),
               q(11, id=["q"]), q(12, id="x" * 100000),
               q(13, message={"chat": {"id": "x" * 100000}}),
               q(14, data="keel:approve:" + a["id"] + " "),
               q(15, **{"from": {"id": OLGA, "is_bot": True}})]
        updates = [{"callback_query": x} for x in odd]
        updates += [{"callback_query": "press"}, {"callback_query": [1]},
                    {"callback_query": None}]
        fake.updates(*updates)
        self.hello(OLGA, "Olga", timeout=20)
        self.pending(a)
        self.assertHealthy()
        self.assertDecided(self.press(card, OLGA, "Olga"), "Approved.")


if __name__ == "__main__":
    unittest.main()

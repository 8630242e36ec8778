"""Telegram channels on several `keel serve` nodes of one PostgreSQL database: each polled
channel has a lease that one node holds at a time (docs/decisions/0020), the nodes share the
channels between them, a node stopped with SIGSTOP loses its channels to the others once their
leases run out, and, resumed, takes nothing back from the poll it was in: every message is
answered once, through whichever node polls its bot.

Runs only with KEEL_TEST_STORE=postgres (ctest integration_pg.test_channel_nodes); SQLite has
one node."""

import os
import signal
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, wait_for
from test_telegram import KEK, FakeTelegram, Tenant

ON_PG = os.environ.get("KEEL_TEST_STORE") == "postgres"
ENV = {"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": "127.0.0.1/32"}
# relay.cc: a lease runs 15 s after its last renewal, the supervisor looks every 2 s, and a
# stopped node stops counting among the nodes 5 s after its last report.
TAKEOVER_S = 15 + 2 + 3  # and three seconds for slow CI


def polled(server):
    _, text, _ = server.request("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith("keel_channels_polled "):
            return int(line.split()[1])
    raise AssertionError("no keel_channels_polled in /metrics")


@unittest.skipUnless(ON_PG, "several nodes need a shared store: runs only with "
                            "KEEL_TEST_STORE=postgres (ctest integration_pg.test_channel_nodes)")
class ChannelNodesTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.a = KeelServer(env=ENV)
        cls.b = KeelServer(env=ENV, store_url=cls.a.store_url, token=cls.a.token)

    @classmethod
    def tearDownClass(cls):
        cls.b.stop()
        cls.a.stop()  # drops the database last

    def shares(self):
        return polled(self.a), polled(self.b)

    def wait_shares(self, want, timeout):
        return wait_for(lambda: self.shares() == want, timeout,
                        "channels polled by the nodes %s (now %s)" % (want, self.shares()))

    def test_the_nodes_share_the_channels_and_a_stopped_ones_move_on(self):
        t = Tenant(self.a)
        fakes = []
        for _ in range(4):
            fake = FakeTelegram()
            self.addCleanup(fake.stop)
            fakes.append(fake)
            _, ch = t.bot(fake)
            self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch["id"])
        chats = [100 + i for i in range(len(fakes))]

        def say_to_all(text, n):
            for fake, chat in zip(fakes, chats):
                fake.message(chat, "%s %d" % (text, chat))
            for fake, chat in zip(fakes, chats):
                fake.wait_sent(chat, n, timeout=TAKEOVER_S + 30)

        # Two nodes, four channels: two each, and each bot answers.
        self.wait_shares((2, 2), 30)
        say_to_all("hello", 1)
        # Balanced, no bot is polled by two nodes: Telegram would answer one of them 409.
        conflicts = [f.sent()["conflicts"] for f in fakes]
        time.sleep(3)
        self.assertEqual([f.sent()["conflicts"] for f in fakes], conflicts,
                         "a bot was polled by two nodes at once")

        # A stops (a frozen process keeps its connections open): B takes its channels once
        # their leases ran out, and answers what came meanwhile.
        t0 = time.monotonic()
        self.a.proc.send_signal(signal.SIGSTOP)
        try:
            for fake, chat in zip(fakes, chats):
                fake.message(chat, "while A is stopped %d" % chat)
            wait_for(lambda: polled(self.b) == 4, TAKEOVER_S + 10,
                     "B polls every channel while A is stopped")
            took = time.monotonic() - t0
            for fake, chat in zip(fakes, chats):
                fake.wait_sent(chat, 2, timeout=30)
        finally:
            self.a.proc.send_signal(signal.SIGCONT)
        self.assertLess(took, TAKEOVER_S, "B took A's channels only after %.1fs" % took)

        # Resumed, A takes nothing from the poll it was in, and the nodes share again.
        self.wait_shares((2, 2), 40)
        say_to_all("again", 3)
        time.sleep(3)
        for fake, chat in zip(fakes, chats):
            texts = [m["text"] for m in fake.to(chat)]
            self.assertEqual(len(texts), 3, "chat %d: every message answered once: %s"
                             % (chat, texts))

    def test_a_bot_behind_two_channels_is_polled_by_one_node(self):
        # Two agents' channels hold one bot's token (two secrets): the nodes would take one
        # each, and both would poll the bot, each taking the same updates into its agent. Each
        # channel records its bot before its first poll and waits until the nodes' plans have
        # it: the node of its first channel takes the other too and polls through one of them
        # only, from the first poll on. A message sent before any poll is answered once.
        t = Tenant(self.a)
        fake = FakeTelegram()
        self.addCleanup(fake.stop)
        chans = []
        for _ in range(2):
            _, ch = t.bot(fake)
            self.addCleanup(t.request, "DELETE", "/v1/channels/" + ch["id"])
            chans.append(ch)
        chans.sort(key=lambda c: c["id"])
        fake.message(300, "hello early")

        def status(ch):
            got = t.ok("GET", "/v1/channels/" + ch["id"])
            return got["status"], got["error"]

        # The second channel waits for the first's node (its lease after it was given up) and
        # then shows why it does not poll.
        wait_for(lambda: "is polled by channel %s already" % chans[0]["id"] in status(chans[1])[1],
                 TAKEOVER_S + 30, "the second channel of the bot left to the first's node")
        wait_for(lambda: status(chans[0]) == ("ready", ""), 20,
                 "the bot's first channel polling without a failure")
        self.assertEqual(sorted(self.shares()), [0, 2], "both channels on one node")
        fake.wait_sent(300, 1, timeout=30)
        fake.message(300, "hello once")
        fake.wait_sent(300, 2, timeout=30)
        time.sleep(4)
        self.assertEqual([m["text"] for m in fake.to(300)],
                         ['You said: "hello early"', 'You said: "hello once"'],
                         "each message was answered once")
        self.assertEqual(fake.sent()["conflicts"], 0, "the bot was polled by two nodes at once")

if __name__ == "__main__":
    unittest.main()

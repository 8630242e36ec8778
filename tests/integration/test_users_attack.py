"""Users, members and access levels (docs/USERS.md, API.md section 26) attacked by a hostile
tenant, a hostile chat user and a careless operator: the bugs found, each a test that fails
until it is fixed.

- a stranger (private agent) or a sender without the code in a group (protected agent) is
  answered with a notice for every message that calls the bot: no bound, unlike a guest's 20 a
  minute, so one stranger makes the bot post without end in a group and grows the outbox;
- a member who sends the access code again (the bot's t.me link opened twice) has it posted to
  the agent, its session and the model, and echoed back;
- a platform's retry of one event counts again against a guest's 20 messages a minute;
- names are counted in bytes, not characters, and a line separator passes "one line";
- one identity twice in POST /v1/users is a 409 naming a user that does not exist;
- a chain of merges leaves merged_into naming a merged user;
- a deleted agent's roles stay on its members for good (its member routes are 404);
- the access code's stored form is keyed by the agent id (public): an export is an offline
  oracle for guesses.

Runs on SQLite and, with KEEL_TEST_STORE=postgres, on PostgreSQL."""

import hashlib
import hmac
import json
import os
import subprocess
import tempfile
import time
import unittest

import test_slack
from keel_harness import KeelServer, KeelTestCase, keel_bin, wait_for
import test_users
from test_users import KEK, FakeTelegram, Tenant, ident

SERVER = None


def setUpModule():
    global SERVER
    SERVER = KeelServer(env={"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": "127.0.0.1/32"})


def tearDownModule():
    SERVER.stop()


def within_one_minute(needed=30):
    """Sleeps into the next minute unless `needed` seconds of this one are left (the guest rate
    is counted per minute)."""
    left = 60 - time.time() % 60
    if left < needed:
        time.sleep(left + 0.2)


class TelegramCase(test_users.TelegramCase):
    def the_server(self):
        return SERVER

    def handled(self, update):
        wait_for(lambda: update + 1 in self.fake.sent()["polls"], 60, "a poll past %d" % update)


# ----------------------------------------------------------------------- refusals without end


class RefusalFloodTest(TelegramCase):
    def flood(self, ch, group, from_id, n=30):
        within_one_minute()
        ups = [self.fake.group(group, "@keel_test_bot let me in %d" % i, from_id=from_id,
                               first_name="Mal") for i in range(n)]
        self.handled(ups[-1])
        wait_for(lambda: all(r["status"] != "pending" for r in self.t.replies(ch).values()), 30,
                 "the notices sent")
        return [r for r in self.t.replies(ch).values() if r["run_id"] == ""]

    def test_a_strangers_mentions_in_a_group_get_no_more_notices_than_a_guest_gets_runs(self):
        # Private agent: 30 mentions by one stranger in one minute were 30 refusal notices
        # posted in the group (and 30 deliveries + 30 replies stored); a guest writing as fast
        # gets 20 runs. A stranger must not make the bot post more than a guest could.
        agent, ch = self.bot()
        g = -100901
        notices = self.flood(ch, g, 901)
        self.assertLessEqual(len(self.fake.to(g)), 20,
                             "one stranger made the bot post %d notices in the group in a "
                             "minute" % len(self.fake.to(g)))
        self.assertLessEqual(len(notices), 20, "refusal notices stored without a bound")

    def test_a_protected_agents_group_refusals_are_bounded(self):
        # Protected agent: "send it to the bot in a direct message" for every mention, without
        # the rate check a guess at the code has.
        agent, ch = self.bot(level="protected", code="harbour-" + os.urandom(4).hex())
        g = -100902
        self.flood(ch, g, 902)
        self.assertLessEqual(len(self.fake.to(g)), 20,
                             "one sender made the bot post %d notices in the group in a minute"
                             % len(self.fake.to(g)))


# ------------------------------------------------------------------------ the code, posted


class CodeResentTest(TelegramCase):
    def test_a_member_resending_the_access_code_does_not_post_it_to_the_agent(self):
        # "the code message is not shown to the agent", "the code itself is never posted": a
        # guest who opens the bot's t.me/BOT?start=CODE link again (or pastes the code again)
        # has "/start CODE" run as a message: the code is in the session (readable by every
        # user token), went to the model, and the model's answer echoed it into the chat.
        t, fake = self.t, self.fake
        code = "harbour-" + os.urandom(4).hex()
        agent, ch = self.bot(level="protected", code=code)
        t.never = []  # read what holds it, instead of failing inside a request
        first = fake.message(904, "/start " + code, first_name="Gus")
        self.handled(first)
        wait_for(lambda: "Access granted" in " ".join(fake.to(904)), 30, "access granted")
        again = [fake.message(904, "/start " + code, first_name="Gus"),
                 fake.message(904, code, first_name="Gus"),
                 fake.message(904, "anchor", first_name="Gus")]
        t.wait_reply(ch, again[-1], ("sent",))
        said_in = [m for s in t.sessions(agent).values() for m in t.said_in(s)]
        self.assertEqual([m for m in said_in if code in m], [],
                         "the access code was posted to the agent")
        self.assertEqual([m for m in fake.to(904) if code in m], [],
                         "the access code was echoed into the chat")
        self.assertEqual([r["text"] for r in t.replies(ch).values() if code in r["text"]], [],
                         "the access code is in the channel's replies (GET .../replies)")


# ------------------------------------------------------------------- retries and the rate


class RetriedEventRateTest(KeelTestCase):
    def test_a_retried_event_does_not_count_again_against_a_guests_rate(self):
        # Slack retries an event it got no quick answer for (up to 3 times, same event_id);
        # Keel takes it once, but OverRate counts each retry: 5 messages retried 3 times each
        # are 20 "messages", and the guest's 6th message in the minute is refused.
        self.server = SERVER
        t = test_slack.Tenant(SERVER)
        fake = test_slack.FakeSlack()
        self.addCleanup(fake.stop)
        app = t.app(fake)  # public
        self.addCleanup(t.request, "DELETE", "/v1/channels/" + app.ch["id"])
        within_one_minute(40)
        for i in range(5):
            event = app.taken(app.dm("D0GUEST", "question %d" % i, user="U0GUEST"))
            for retry in range(1, 4):
                app.taken(app.push(event_id=event, retry_num=retry))
        sixth = app.taken(app.dm("D0GUEST", "question 5", user="U0GUEST"))
        r = t.wait_reply(app.ch, sixth)
        self.assertTrue(r["run_id"], "a guest's 6th message in a minute was refused as over "
                                     "the rate of 20: %r" % r)


# ----------------------------------------------------------------------------- the API


class UsersApiAttackTest(KeelTestCase):
    def setUp(self):
        self.server = SERVER
        self.t = Tenant(SERVER)

    def test_a_name_is_200_characters_not_bytes_on_one_line(self):
        t = self.t
        # API.md: "name is 1 to 200 characters on one line".
        for name in ("é" * 150, "李" * 200, "🙂" * 100):
            st, body, _ = t.request("POST", "/v1/users", {"name": name})
            self.assertEqual(st, 201, "a name of %d characters: %r" % (len(name), body))
        for name in ("Ann\u2028Lee", "Ann\u2029Lee", "Ann\x0bLee", "Ann\x0cLee", "Ann\x85Lee"):
            st, body, _ = t.request("POST", "/v1/users", {"name": name})
            self.assertEqual(st, 400, "a name on two lines %r was taken: %r" % (name, body))

    def test_one_identity_twice_in_a_new_user_is_400_not_409_naming_no_one(self):
        t = self.t
        st, body, _ = t.request("POST", "/v1/users", {
            "name": "Ann", "identities": [ident("telegram", 5), ident("telegram", 5)]})
        self.assertEqual(st, 400, "one identity twice: %r (the user it names was never made)"
                         % (body,))
        self.assertEqual(t.pages("/v1/users"), [])

    def test_a_merged_users_merged_into_names_the_user_it_now_is(self):
        # users.cc: "A merge never points at a merged user (MergeUsers refuses one), so one
        # hop is the end" -- but A into B, then B into C, leaves A pointing at B, merged.
        t = self.t
        a, b, c = t.person("A"), t.person("B"), t.person("C")
        t.ok("POST", "/v1/users/%s/merge" % b["id"], {"from": a["id"]}, expect=200)
        t.ok("POST", "/v1/users/%s/merge" % c["id"], {"from": b["id"]}, expect=200)
        self.assertEqual(t.ok("GET", "/v1/users/" + a["id"])["merged_into"], c["id"],
                         "merged_into names a merged user")

    def test_a_deleted_agents_roles_do_not_stay_on_its_members(self):
        t = self.t
        agent = t.agent()
        ann = t.person("Ann", ("telegram", 31))
        t.member(agent, ann, "owner")
        t.ok("DELETE", "/v1/agents/" + agent["id"], expect=(200, 204))
        # Its member routes are 404 now, so the role cannot be removed either.
        self.assertError(t.request("DELETE", "/v1/agents/%s/members/%s" % (agent["id"],
                                                                          ann["id"])),
                         404, "not_found")
        self.assertEqual(t.roles(ann), {}, "a deleted agent's role is listed for good")

    def test_an_export_holds_nothing_a_guess_at_the_code_is_checked_against(self):
        # The code was kept as HMAC-SHA256(key = agent id, code): the key is public (in the
        # same row), so whoever held an export (or a backup) checked guesses offline at hash
        # speed. It is a sealed secret now: the archive holds only its ciphertext.
        t = self.t
        agent = t.agent()
        code = "blue-harbour-42"
        t.ok("PUT", "/v1/agents/%s/access" % agent["id"], {"level": "protected", "code": code})
        path = os.path.join(tempfile.mkdtemp(prefix="keel-ua-"), "t.tar")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env["KEEL_SECRET_KEK"] = KEK
        cmd = [keel_bin(), "export", "--home", SERVER.home, "--tenant", t.id, path]
        if SERVER.store_url:
            cmd[-1:-1] = ["--store", SERVER.store_url]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        out = subprocess.run(["tar", "-xOf", path], capture_output=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        archive = out.stdout.decode("utf-8", "replace")
        derived = [code,
                   hmac.new(agent["id"].encode(), code.encode(), hashlib.sha256).hexdigest(),
                   hashlib.sha256(code.encode()).hexdigest(),
                   hmac.new(code.encode(), agent["id"].encode(), hashlib.sha256).hexdigest()]
        for value in derived:
            self.assertNotIn(value, archive, "the archive holds the code or a hash of it")
        rows = [json.loads(line) for line in subprocess.run(
            ["tar", "-xOf", path, "agent_access.jsonl"], capture_output=True,
            timeout=60).stdout.decode().splitlines() if line.strip()]
        self.assertEqual([(r["level"], r["code_set"]) for r in rows], [("protected", 1)])

if __name__ == "__main__":
    unittest.main()

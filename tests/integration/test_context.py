"""A session's context over HTTP: compaction keeps a long conversation within the agent's token
budget (config.context_tokens) while a summary made by the model carries what was said early
(the local model's summaries are deterministic: they keep the user's statements, the first and
the last ones when there are many), the full history stays in the store, and each compaction is
a step of its run with a session.compacted@v1 event.

The local model's rule {"echo": "context"} answers with every message it was sent, as
"ROLE: CONTENT" lines, so a test sees exactly what a turn's context held.
"""

import unittest

import keel_harness
from keel_harness import KeelServer, KeelTestCase

WAIT = 20
ECHO = {"match": "^what do you know", "echo": "context"}
FACT = "Remember: my name is Ada and the code word is pineapple."


def filler(i):
    return ("Filler message number %d: the weather report for district %d says light rain in "
            "the morning, sun after noon, and a cool breeze from the west all evening long." % (i, i))


def estimate(text):
    return (len(text) + 3) // 4


class Tenant(keel_harness.Tenant):
    def turn(self, session_id, content):
        status, body, _ = self.server.post_message(session_id, content, wait=WAIT,
                                                   token=self.token, timeout=WAIT + 30)
        assert status in (200, 202), (status, body)
        run = body["run"]
        if run["status"] not in keel_harness.TERMINAL_RUN_STATES:
            run = self.server.wait_run(run["id"], timeout=WAIT, token=self.token)
        return run

    def events_of(self, type_, **filters):
        q = "&".join("%s=%s" % kv for kv in filters.items())
        return [e for e in self.server.list_all("/v1/events" + ("?" + q if q else ""), limit=500,
                                                token=self.token) if e["type"] == type_]


class CompactionTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.t = Tenant(self.server)

    def agent_session(self, config):
        agent = self.server.create_agent(config=config, token=self.t.token)
        session = self.server.create_session(agent["id"], token=self.t.token)
        return agent, session["id"]

    def test_a_long_conversation_stays_within_the_budget_and_keeps_an_early_fact(self):
        budget = 700
        agent, sid = self.agent_session({"context_tokens": budget, "local_rules": [ECHO]})
        runs = [self.t.turn(sid, FACT)]
        for i in range(40):
            runs.append(self.t.turn(sid, filler(i)))
        self.assertTrue(all(r["status"] == "done" for r in runs), [r["error"] for r in runs])

        compactions = self.server.list_all("/v1/sessions/%s/compactions" % sid, token=self.t.token)
        self.assertGreaterEqual(len(compactions), 5, "a conversation of 82 messages in 700 tokens")
        for c in compactions:
            self.assertLessEqual(c["tokens_after"], budget, c)
            self.assertGreater(c["tokens_before"], c["tokens_after"], c)
            self.assertIn("pineapple", c["summary"], "every summary carries the early fact")
        self.assertEqual([c["last_message_id"] for c in compactions],
                         sorted(c["last_message_id"] for c in compactions))

        # What the model sees now: under the budget, the fact only through the summary.
        run = self.t.turn(sid, "what do you know?")
        context = run["output"]
        self.assertLessEqual(estimate(context), budget, context)
        self.assertIn("## Earlier in this session", context)
        self.assertIn("- " + FACT, context)
        self.assertNotIn("user: " + FACT, context, "the first message itself was compacted")
        self.assertIn("user: " + filler(39), context, "the newest turns are there verbatim")
        self.assertTrue(context.endswith("user: what do you know?"), context[-200:])

        # The history is whole in the store.
        messages = self.server.list_all("/v1/sessions/%s/messages" % sid, token=self.t.token)
        self.assertEqual(len(messages), 2 * 42)
        self.assertEqual(messages[0]["content"], FACT)

        # Each compaction is a step of the run that made it, with its event.
        events = self.t.events_of("session.compacted@v1", session_id=sid)
        self.assertEqual([e["payload"]["compaction_id"] for e in events],
                         [c["id"] for c in compactions])
        first = compactions[0]
        steps = self.server.steps(first["run_id"], token=self.t.token)
        kinds = [s["kind"] for s in steps]
        self.assertEqual(kinds[0], "compaction", kinds)
        self.assertEqual(kinds[-1], "model")
        step = steps[0]
        self.assertEqual(step["status"], "succeeded")
        self.assertEqual(step["output"]["compaction_id"], first["id"])
        self.assertEqual(step["output"]["summary"], first["summary"])
        self.assertEqual(step["input"]["budget"], budget)
        self.assertGreater(step["input"]["messages"], 0)
        self.assertGreater(step["output"]["usage"]["input_tokens"], 0)
        run = self.server.get_run(first["run_id"], token=self.t.token)
        self.assertGreater(run["usage"]["input_tokens"], step["output"]["usage"]["input_tokens"],
                           "the summary's usage is part of the run's")

    def test_a_short_conversation_is_not_compacted(self):
        agent, sid = self.agent_session({"local_rules": [ECHO]})
        self.t.turn(sid, FACT)
        for i in range(5):
            self.t.turn(sid, filler(i))
        context = self.t.turn(sid, "what do you know?")["output"]
        self.assertIn("user: " + FACT, context)
        self.assertNotIn("Earlier in this session", context)
        self.assertEqual(self.server.list_all("/v1/sessions/%s/compactions" % sid,
                                              token=self.t.token), [])

    def test_context_settings_are_checked_when_the_agent_is_written(self):
        bad = [({"context_tokens": 10}, "config.context_tokens must be an integer from 256"),
               ({"context_tokens": "big"}, "config.context_tokens"),
               ({"introspection": 3}, "config.introspection must be an object"),
               ({"introspection": {"every_turns": 0}}, "introspection.every_turns"),
               ({"introspection": {"idle_seconds": -1}}, "introspection.idle_seconds"),
               ({"introspection": {"hourly": True}}, "unknown field 'hourly'")]
        for config, says in bad:
            with self.subTest(config=config):
                err = self.assertError(
                    self.t.request("POST", "/v1/agents",
                                   {"name": keel_harness.unique_name("a"), "config": config}),
                    400, "invalid_argument")
                self.assertIn(says, err["message"])
        self.assertError(self.t.request("GET", "/v1/sessions/%s/compactions"
                                        % keel_harness.unique_name("s")), 404, "not_found")


if __name__ == "__main__":
    unittest.main()

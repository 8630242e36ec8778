"""A session's context over HTTP: compaction keeps a long conversation within the agent's token
budget (config.context_tokens) while a summary made by the model carries what was said early
(the local model's summaries are deterministic: they keep the user's statements, the first and
the last ones when there are many), the full history stays in the store, and each compaction is
a step of its run with a session.compacted@v1 event.

The local model's rule {"echo": "context"} answers with every message it was sent, as
"ROLE: CONTENT" lines, so a test sees exactly what a turn's context held.
"""

import time
import unittest

import keel_harness
from keel_harness import KeelServer, KeelTestCase, wait_for

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

    def agent_session(self, config, tools=None):
        agent = self.server.create_agent(config=config, tools=tools, token=self.t.token)
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


class IntrospectionTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.t = Tenant(self.server)

    def agent_session(self, config, tools=None):
        agent = self.server.create_agent(config=config, tools=tools, token=self.t.token)
        session = self.server.create_session(agent["id"], token=self.t.token)
        return agent, session["id"]

    def completed(self, sid, count):
        return wait_for(lambda: (lambda got: got if len(got) >= count else None)(
            self.t.events_of("introspection.completed@v1", session_id=sid)), 20,
            "%d introspection(s) of session %s" % (count, sid))

    def introspection_runs(self, sid):
        messages = self.server.list_all("/v1/sessions/%s/messages" % sid, token=self.t.token)
        return [m for m in messages if m["role"] == "introspection"]

    def memories(self, agent_id):
        return self.t.ok("GET", "/v1/agents/%s/memories" % agent_id, expect=200)["items"]

    def test_every_n_turns_an_introspection_run_keeps_description_and_memory(self):
        agent, sid = self.agent_session({"introspection": {"every_turns": 2},
                                         "local_rules": [{"match": "^system", "echo": "system"}]})
        self.t.turn(sid, "I am planning a trip to Lisbon in May.")
        self.t.turn(sid, "Find me a hotel near the river.")
        events = self.completed(sid, 1)
        self.assertEqual(events[0]["payload"]["trigger"], "every_turns")
        self.assertEqual(events[0]["payload"]["description"],
                         "About: I am planning a trip to Lisbon in May.")
        session = self.t.ok("GET", "/v1/sessions/" + sid, expect=200)
        self.assertEqual(session["description"], "About: I am planning a trip to Lisbon in May.")

        # It is a run of the session, with its own message, steps and events, and no answer.
        messages = self.server.list_all("/v1/sessions/%s/messages" % sid, token=self.t.token)
        self.assertEqual([m["role"] for m in messages],
                         ["user", "assistant", "user", "assistant", "introspection"])
        run = self.server.get_run(messages[-1]["run_id"], token=self.t.token)
        self.assertEqual(run["status"], "done")
        steps = self.server.steps(run["id"], token=self.t.token)
        tools = [(s["input"]["tool"], s["status"]) for s in steps if s["kind"] == "tool"]
        self.assertEqual(tools, [("introspection.set_description", "succeeded"),
                                 ("introspection.set_working_memory", "succeeded"),
                                 ("memory.upsert", "succeeded")])
        self.assertEqual(len(self.t.events_of("session.described@v1", session_id=sid)), 1)
        self.assertEqual(len(self.t.events_of("working_memory.updated@v1", session_id=sid)), 1)
        self.assertEqual(len(self.t.events_of("memory.upserted@v1", session_id=sid)), 1)

        # The working memory is the agent's one (the memory API's), in its next turns in any
        # session; the long-term memory is one of the agent's memories, found by search.
        wm = self.t.ok("GET", "/v1/agents/%s/working-memory" % agent["id"], expect=200)
        self.assertEqual(wm["text"], "Recent requests:\n- I am planning a trip to Lisbon in May."
                                     "\n- Find me a hotel near the river.")
        other = self.server.create_session(agent["id"], token=self.t.token)["id"]
        system = self.t.turn(other, "system")["output"]
        self.assertIn("Working memory", system)
        self.assertIn("- Find me a hotel near the river.", system)
        memories = self.memories(agent["id"])
        self.assertEqual([(m["text"], m["tags"], m["source"]) for m in memories],
                         [("The user said: Find me a hotel near the river.", ["introspection"],
                           "introspection")])
        hits = self.t.ok("GET", "/v1/agents/%s/memories?q=hotel" % agent["id"],
                         expect=200)
        self.assertEqual([h["id"] for h in hits["items"]], [memories[0]["id"]])

        # One turn later: not yet; two: again.
        self.t.turn(sid, "Something with a view.")
        self.assertEqual(len(self.introspection_runs(sid)), 1)
        self.t.turn(sid, "Under 200 euros a night.")
        self.completed(sid, 2)
        self.assertEqual(len(self.introspection_runs(sid)), 2)
        self.assertEqual(sorted(m["text"] for m in self.memories(agent["id"])),
                         ["The user said: Find me a hotel near the river.",
                          "The user said: Under 200 euros a night."])

    def test_an_idle_session_is_looked_back_on_once_per_quiet_spell(self):
        agent, sid = self.agent_session({"introspection": {"idle_seconds": 1}})
        self.t.turn(sid, "Our team standup moves to 9:30 on Mondays.")
        events = self.completed(sid, 1)
        self.assertEqual(events[0]["payload"]["trigger"], "idle")
        self.assertEqual(self.t.ok("GET", "/v1/sessions/" + sid, expect=200)["description"],
                         "About: Our team standup moves to 9:30 on Mondays.")
        self.t.turn(sid, "And the retro is on Fridays.")
        events = self.completed(sid, 2)
        self.assertEqual([e["payload"]["trigger"] for e in events], ["idle", "idle"])
        self.assertEqual(len(self.introspection_runs(sid)), 2,
                         "a quiet session with nothing new is not looked at again")

    def test_introspection_is_off_by_default_and_its_tools_stay_its_own(self):
        # Even on the agent's list, the tool refuses a run that is not an introspection run.
        agent, sid = self.agent_session({"local_rules": [
            {"match": "^describe", "call": {"tool": "introspection.set_description",
                                            "arguments": {"description": "hijacked"}}}]},
            tools=["introspection.set_description"])
        for i in range(3):
            self.t.turn(sid, "message %d" % i)
        run = self.t.turn(sid, "describe")
        self.assertIn("works only in an introspection run", run["output"])
        self.assertEqual(self.t.ok("GET", "/v1/sessions/" + sid, expect=200)["description"], "")
        self.assertEqual(self.introspection_runs(sid), [])
        self.assertEqual(self.t.events_of("introspection.completed@v1", session_id=sid), [])


if __name__ == "__main__":
    unittest.main()

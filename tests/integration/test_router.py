"""The model router on the local model, end to end over HTTP: metering from the price table
(a run's usage with its cost in GET /v1/runs/{id} and in run.completed, GET /v1/usage for the
tenant and its agents), budgets (PUT/GET/DELETE /v1/budgets, owner only; a run stops with
budget_exceeded before the call that would cross one, and no call is made), and the response
cache (hits and misses, scoped to tenant and cache group, switched off per agent, its counters in
/metrics, and a cache whose table is gone degrading to normal calls).

The local model is deterministic and counts tokens in words, so costs are predictable: the price
table makes each local token cost one dollar. Each test works in a tenant of its own, so usage
and budgets of one test never reach another.
"""

import os
import sqlite3
import subprocess
import tempfile
import time
import unittest

import keel_harness
from keel_harness import KeelServer, KeelTestCase, Tenant, unique_name

WAIT = 20
USD_PER_TOKEN = 1.0  # the price of "local" below: $1,000,000 per million tokens


def write_config(text):
    fd, path = tempfile.mkstemp(prefix="keel-router-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


# One long user message: 120 words, about 200 estimated tokens; with its echoed answer the
# conversation outgrows a context budget of 256 tokens, so the next turn compacts.
LONG = " ".join("word%d" % i for i in range(120))

PRICED = ('[prices.local]\ninput_per_mtok = 1000000\noutput_per_mtok = 1000000\n')


class RouterTenant(Tenant):
    def agent(self, **config):
        return self.ok("POST", "/v1/agents", {"name": unique_name("agent"), "model": "local",
                                              "instructions": "Be brief.", "tools": [],
                                              "config": config}, expect=201)

    def turn(self, agent, content):
        session = self.ok("POST", "/v1/agents/%s/sessions" % agent["id"], {"title": "t"},
                          expect=201)
        body = self.ok("POST", "/v1/sessions/%s/messages?wait=%d" % (session["id"], WAIT),
                       {"content": content}, expect=(200, 202))
        return self.ok("GET", "/v1/runs/%s" % body["run"]["id"])

    def usage(self, period="day", agent_id=None):
        path = "/v1/usage?period=" + period
        if agent_id:
            path += "&agent_id=" + agent_id
        return self.ok("GET", path)

    def put_budget(self, scope, period, limit_usd, expect=200):
        return self.ok("PUT", "/v1/budgets", {"scope": scope, "period": period,
                                              "limit_usd": limit_usd}, expect=expect)

    def say(self, session_id, content):
        """A turn in an existing session; the run, once it ended."""
        body = self.ok("POST", "/v1/sessions/%s/messages?wait=%d" % (session_id, WAIT),
                       {"content": content}, expect=(200, 202))
        return self.server.wait_run(body["run"]["id"], timeout=WAIT, token=self.token)

    def events(self, run_id):
        return self.ok("GET", "/v1/events?run_id=%s&limit=500" % run_id)["items"]

    def steps(self, run_id):
        return self.ok("GET", "/v1/runs/%s/steps" % run_id)["items"]


def metric(server, name):
    _, text, _ = server.request("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
    raise AssertionError("no metric %s" % name)


def wait_metric(server, name, at_least, timeout=10):
    """Polls /metrics until `name` reaches `at_least` (cache writes land a moment after a turn)."""
    deadline = time.monotonic() + timeout
    while True:
        value = metric(server, name)
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


class RouterTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.config = write_config(PRICED)
        cls.server = KeelServer(env={"KEEL_CONFIG": cls.config})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        os.unlink(cls.config)

    def metric(self, name):
        return metric(self.server, name)

    # ------------------------------------------------------------------ metering

    def assert_completion_reports_stored_usage(self, t, run_id):
        """run.completed@v1 carries the usage the run's records add up to (GET /v1/runs/{id}
        sums them from the store; the executor keeps them as it goes)."""
        run = self.server.wait_run(run_id, timeout=WAIT, token=t.token)
        self.assertEqual(run["status"], "done", run)
        done = [e for e in t.events(run_id) if e["type"] == "run.completed@v1"]
        self.assertEqual(len(done), 1, done)
        self.assertEqual(done[0]["payload"]["usage"], run["usage"])
        return run

    def test_the_completion_reports_the_usage_of_every_step_cached_or_not(self):
        t = RouterTenant(self.server)
        agent = t.ok("POST", "/v1/agents", {"name": unique_name("agent"), "model": "local",
                                            "tools": ["time.now"], "config": {}}, expect=201)
        cached = []
        # The second turn's first model call is answered from the cache, at once: an answer
        # not written to the store yet is answered from the node's queue.
        for _ in range(2):
            session = t.ok("POST", "/v1/agents/%s/sessions" % agent["id"], {}, expect=201)
            body = t.ok("POST", "/v1/sessions/%s/messages?wait=%d" % (session["id"], WAIT),
                        {"content": "/call time.now {}"}, expect=(200, 202))
            run = self.assert_completion_reports_stored_usage(t, body["run"]["id"])
            self.assertEqual(run["usage"]["model_calls"], 2, run["usage"])
            self.assertGreater(run["usage"]["cost_usd"], 0, run["usage"])
            cached.append(run["usage"]["cached_calls"])
        self.assertEqual(cached, [0, 1])

    def test_a_resumed_run_reports_the_usage_of_the_steps_before_its_node_died(self):
        t = RouterTenant(self.server)
        agent = t.ok("POST", "/v1/agents", {"name": unique_name("agent"), "model": "local",
                                            "tools": ["time.now"],
                                            "config": {"local_latency_ms": 1500, "cache": False}},
                     expect=201)
        session = t.ok("POST", "/v1/agents/%s/sessions" % agent["id"], {}, expect=201)
        body = t.ok("POST", "/v1/sessions/%s/messages" % session["id"],
                    {"content": "/call time.now {}"}, expect=(200, 202))
        run_id = body["run"]["id"]
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # its first model step recorded, the second slow
            if any(s["kind"] == "tool" for s in t.steps(run_id)):
                break
            time.sleep(0.05)
        self.server.kill9()
        self.server.start()
        run = self.assert_completion_reports_stored_usage(t, run_id)
        self.assertGreaterEqual(run["attempt"], 2, run)
        self.assertEqual(run["usage"]["model_calls"], 2, run["usage"])

    def test_a_runs_usage_carries_its_cost_and_adds_up_per_agent_and_tenant(self):
        t = RouterTenant(self.server)
        agent = t.agent(cache=False)
        run = t.turn(agent, "price this turn")
        self.assertEqual(run["status"], "done", run)
        usage = run["usage"]
        tokens = usage["input_tokens"] + usage["output_tokens"]
        self.assertGreater(tokens, 0)
        self.assertEqual(usage["model_calls"], 1)
        self.assertEqual(usage["cached_calls"], 0)
        self.assertAlmostEqual(usage["cost_usd"], tokens * USD_PER_TOKEN)
        self.assertEqual(usage["cache_savings_usd"], 0)

        done = [e for e in t.events(run["id"]) if e["type"] == "run.completed@v1"]
        self.assertEqual(len(done), 1)
        self.assertEqual(done[0]["payload"]["usage"], usage)

        other = t.agent(cache=False)
        run2 = t.turn(other, "and this one too")
        for period in ("day", "month"):
            u = t.usage(period)
            self.assertEqual(u["period"], period)
            self.assertTrue(u["period_start"].endswith("T00:00:00.000Z"), u)
            self.assertEqual(u["tenant"]["model_calls"], 2, u)
            self.assertAlmostEqual(u["tenant"]["cost_usd"],
                                   usage["cost_usd"] + run2["usage"]["cost_usd"])
            by_agent = {a["agent_id"]: a for a in u["agents"]}
            self.assertEqual(set(by_agent), {agent["id"], other["id"]})
            self.assertAlmostEqual(by_agent[agent["id"]]["cost_usd"], usage["cost_usd"])
        one = t.usage("day", agent_id=other["id"])
        self.assertEqual([a["agent_id"] for a in one["agents"]], [other["id"]])
        # Another tenant sees none of it.
        self.assertEqual(RouterTenant(self.server).usage()["tenant"]["model_calls"], 0)

    def test_usage_requests_are_checked(self):
        t = RouterTenant(self.server)
        status, body, _ = t.request("GET", "/v1/usage?period=week")
        self.assertEqual(status, 400, body)
        self.assertIn("period", body["error"]["message"])
        status, body, _ = t.request("GET", "/v1/usage?agent_id=0193a1f4-2222-7000-8000-000000000020")
        self.assertEqual(status, 404, body)
        guest, _ = t.new_token("guest")
        status, body, _ = t.request("GET", "/v1/usage", token=guest)
        self.assertEqual(status, 403, body)

    # ------------------------------------------------------------------ budgets

    def test_a_budget_stops_the_run_before_the_call_that_would_cross_it(self):
        t = RouterTenant(self.server)
        agent = t.agent(cache=False)
        first = t.turn(agent, "spend a little")
        self.assertEqual(first["status"], "done", first)
        spent = first["usage"]["cost_usd"]

        # The agent's daily budget: what it spent plus less than any request costs.
        budget = t.put_budget(agent["id"], "day", spent + 1)
        self.assertEqual(budget["scope"], agent["id"])
        self.assertAlmostEqual(budget["spent_usd"], spent)
        stops = self.metric("keel_budget_stops_total")
        run = t.turn(agent, "spend more")
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "budget_exceeded", run)
        self.assertIn("agent %s's day budget" % agent["id"], run["error"]["message"])
        self.assertEqual(run["usage"]["model_calls"], 0, "no call was made")
        self.assertEqual(self.metric("keel_budget_stops_total"), stops + 1)
        steps = t.steps(run["id"])
        self.assertEqual([(s["kind"], s["status"]) for s in steps], [("model", "failed")])
        self.assertEqual(steps[0]["output"]["budget"]["scope"], agent["id"])
        self.assertGreater(steps[0]["output"]["budget"]["estimate_usd"], 1)
        exceeded = [e for e in t.events(run["id"]) if e["type"] == "budget.exceeded@v1"]
        self.assertEqual(len(exceeded), 1)
        self.assertEqual(exceeded[0]["payload"]["budget"]["period"], "day")
        self.assertEqual(t.usage("day", agent_id=agent["id"])["agents"][0]["model_calls"], 1)

        # A higher limit lets it run; a tenant-wide budget stops every agent of the tenant.
        t.put_budget(agent["id"], "day", spent + 10000)
        self.assertEqual(t.turn(agent, "spend more")["status"], "done")
        t.put_budget("tenant", "month", 0.5)
        other = t.agent(cache=False)
        stopped = t.turn(other, "anything")
        self.assertEqual(stopped["error"]["code"], "budget_exceeded", stopped)
        self.assertIn("the tenant's month budget", stopped["error"]["message"])

        listed = t.ok("GET", "/v1/budgets")["items"]
        self.assertEqual(sorted((b["scope"], b["period"]) for b in listed),
                         sorted([(agent["id"], "day"), ("tenant", "month")]))
        tenant_budget = [b for b in listed if b["scope"] == "tenant"][0]
        self.assertGreater(tenant_budget["spent_usd"], 0.5)
        t.ok("DELETE", "/v1/budgets?scope=tenant&period=month", expect=204)
        self.assertEqual(t.turn(other, "anything")["status"], "done")
        status, body, _ = t.request("DELETE", "/v1/budgets?scope=tenant&period=month")
        self.assertEqual(status, 404, body)
        types = [e["type"] for e in t.ok("GET", "/v1/events?limit=500")["items"]]
        self.assertIn("budget.set@v1", types)
        self.assertIn("budget.deleted@v1", types)

    def test_an_unpriced_model_is_never_stopped(self):
        t = RouterTenant(self.server)
        t.put_budget("tenant", "day", 0)
        # The openai provider has no price in this server's table: its calls cost nothing, so a
        # zero budget does not stop them (the call itself fails: no server is configured).
        agent = t.ok("POST", "/v1/agents", {"name": unique_name("a"), "model": "openai/x",
                                            "config": {"cache": False}}, expect=201)
        run = t.turn(agent, "free?")
        self.assertEqual(run["error"]["code"], "model_error", run)
        priced = t.turn(t.agent(cache=False), "not free")
        self.assertEqual(priced["error"]["code"], "budget_exceeded", priced)

    def test_budget_requests_are_checked_and_owner_only(self):
        t = RouterTenant(self.server)
        for body, words in (({"scope": "tenant", "period": "week", "limit_usd": 1}, "period"),
                            ({"scope": "tenant", "period": "day", "limit_usd": -1}, "limit_usd"),
                            ({"scope": "tenant", "period": "day", "limit_usd": "1"}, "limit_usd"),
                            ({"scope": "tenant", "period": "day"}, "limit_usd"),
                            ({"scope": "nobody", "period": "day", "limit_usd": 1}, "scope"),
                            ({"scope": "tenant", "period": "day", "limit_usd": 1, "x": 1}, "x")):
            status, answer, _ = t.request("PUT", "/v1/budgets", body)
            self.assertEqual(status, 400, (body, answer))
            self.assertIn(words, answer["error"]["message"], body)
        # Another tenant's agent is not a scope here.
        foreign = RouterTenant(self.server).agent()
        status, _, _ = t.request("PUT", "/v1/budgets", {"scope": foreign["id"], "period": "day",
                                                         "limit_usd": 1})
        self.assertEqual(status, 400)
        user, _ = t.new_token("user")
        for method, path, body in (("GET", "/v1/budgets", None),
                                   ("PUT", "/v1/budgets",
                                    {"scope": "tenant", "period": "day", "limit_usd": 1}),
                                   ("DELETE", "/v1/budgets?scope=tenant&period=day", None)):
            status, answer, _ = t.request(method, path, body, token=user)
            self.assertEqual(status, 403, (method, answer))

    # ------------------------------------------------------------------ compaction

    def compacting_session(self, t, agent):
        """A session whose second turn compacts: the first turn alone outgrows the agent's
        context budget of 256 tokens. Returns the session's id and the first turn's run."""
        session = t.ok("POST", "/v1/agents/%s/sessions" % agent["id"], {"title": "c"},
                       expect=201)
        first = t.say(session["id"], LONG)
        self.assertEqual(first["status"], "done", first)
        return session["id"], first

    def test_a_compactions_summary_call_is_metered(self):
        t = RouterTenant(self.server)
        agent = t.agent(cache=False, context_tokens=256)
        sid, first = self.compacting_session(t, agent)
        run = t.say(sid, "and now?")
        self.assertEqual(run["status"], "done", run)
        steps = t.steps(run["id"])
        kinds = [(s["kind"], s["status"]) for s in steps]
        compactions = len(steps) - 1
        self.assertGreaterEqual(compactions, 1, kinds)
        self.assertEqual(kinds, [("compaction", "succeeded")] * compactions + [("model", "succeeded")])
        for step in steps[:-1]:
            summary = step["output"]
            summary_tokens = summary["usage"]["input_tokens"] + summary["usage"]["output_tokens"]
            self.assertGreater(summary_tokens, 0)
            self.assertEqual(summary["model"], "local")
            self.assertEqual(summary["cached"], False)
            self.assertAlmostEqual(summary["cost_usd"], summary_tokens * USD_PER_TOKEN)

        # The run's usage counts every call, and so do the agent's and the tenant's totals.
        usage = run["usage"]
        self.assertEqual(usage["model_calls"], compactions + 1, usage)
        tokens = sum(s["output"]["usage"]["input_tokens"] + s["output"]["usage"]["output_tokens"]
                     for s in steps)
        self.assertEqual(usage["input_tokens"] + usage["output_tokens"], tokens)
        self.assertAlmostEqual(usage["cost_usd"], tokens * USD_PER_TOKEN)
        done = [e for e in t.events(run["id"]) if e["type"] == "run.completed@v1"]
        self.assertEqual(done[0]["payload"]["usage"], usage)
        day = t.usage("day", agent_id=agent["id"])
        self.assertEqual(day["agents"][0]["model_calls"], compactions + 2)
        self.assertAlmostEqual(day["agents"][0]["cost_usd"],
                               first["usage"]["cost_usd"] + usage["cost_usd"])
        self.assertEqual(day["tenant"]["model_calls"], compactions + 2)

    def test_a_budget_stops_a_compacting_run_before_its_summary_call(self):
        t = RouterTenant(self.server)
        agent = t.agent(cache=False, context_tokens=256)
        sid, first = self.compacting_session(t, agent)
        t.put_budget(agent["id"], "day", first["usage"]["cost_usd"] + 1)
        stops = self.metric("keel_budget_stops_total")
        run = t.say(sid, "and now?")
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "budget_exceeded", run)
        self.assertIn("agent %s's day budget" % agent["id"], run["error"]["message"])
        self.assertEqual(run["usage"]["model_calls"], 0, "no call was made")
        self.assertEqual(self.metric("keel_budget_stops_total"), stops + 1)
        steps = t.steps(run["id"])
        self.assertEqual([(s["kind"], s["status"]) for s in steps], [("compaction", "failed")])
        self.assertEqual(steps[0]["output"]["budget"]["scope"], agent["id"])
        exceeded = [e for e in t.events(run["id"]) if e["type"] == "budget.exceeded@v1"]
        self.assertEqual(len(exceeded), 1)
        self.assertEqual(exceeded[0]["payload"]["step_seq"], steps[0]["seq"])
        self.assertEqual(t.ok("GET", "/v1/sessions/%s/compactions" % sid)["items"], [])
        self.assertEqual(t.usage("day", agent_id=agent["id"])["agents"][0]["model_calls"], 1)

    def test_a_compactions_summary_call_uses_the_cache(self):
        t = RouterTenant(self.server)
        agent = t.agent(context_tokens=256)
        sid, _ = self.compacting_session(t, agent)
        first = t.say(sid, "and now?")
        self.assertEqual(first["usage"]["cached_calls"], 0, first)
        calls = first["usage"]["model_calls"]
        self.assertGreaterEqual(calls, 2, "a summary and the turn")
        # The same conversation in another session: the same summary requests, from the cache.
        sid2, _ = self.compacting_session(t, agent)
        second = t.say(sid2, "and now?")
        steps = t.steps(second["id"])
        self.assertEqual([s["kind"] for s in steps], [s["kind"] for s in t.steps(first["id"])])
        self.assertEqual(steps[0]["kind"], "compaction")
        self.assertTrue(all(s["output"]["cached"] for s in steps), steps)
        self.assertEqual(steps[0]["output"]["summary"],
                         t.steps(first["id"])[0]["output"]["summary"])
        self.assertEqual(second["usage"]["cached_calls"], calls, second)
        self.assertEqual(second["usage"]["cost_usd"], 0)

    # ------------------------------------------------------------------ cache

    def test_cache_hit_and_miss(self):
        t = RouterTenant(self.server)
        agent = t.agent()
        message = "the same question " + unique_name()
        hits = self.metric("keel_model_cache_hits_total")
        misses = self.metric("keel_model_cache_misses_total")
        stores = self.metric("keel_model_cache_stores_total")
        first = t.turn(agent, message)
        second = t.turn(agent, message)
        self.assertEqual(first["output"], second["output"])
        self.assertEqual(self.metric("keel_model_cache_misses_total"), misses + 1)
        self.assertEqual(self.metric("keel_model_cache_hits_total"), hits + 1)
        self.assertEqual(first["usage"]["cached_calls"], 0)
        self.assertEqual(second["usage"]["cached_calls"], 1, second)
        self.assertEqual(second["usage"]["cost_usd"], 0)
        self.assertAlmostEqual(second["usage"]["cache_savings_usd"], first["usage"]["cost_usd"])
        self.assertEqual(second["usage"]["input_tokens"], first["usage"]["input_tokens"])
        step = t.steps(second["id"])[0]
        self.assertTrue(step["output"]["cached"])
        self.assertEqual(t.steps(first["id"])[0]["output"]["cached"], False)
        day = t.usage()["tenant"]
        self.assertEqual((day["model_calls"], day["cached_calls"]), (2, 1))
        self.assertAlmostEqual(day["cache_savings_usd"], first["usage"]["cost_usd"])

        # A different message misses.
        self.assertEqual(t.turn(agent, message + "?")["usage"]["cached_calls"], 0)
        # The answer reached the store a moment after its turn (the hit may have come first,
        # from the node's queue).
        wait_metric(self.server, "keel_model_cache_stores_total", stores + 1)

    def test_cache_scope_is_the_tenant_and_the_agents_cache_group(self):
        t = RouterTenant(self.server)
        message = "scoped question " + unique_name()
        a = t.agent(cache_group="support")
        b = t.agent(cache_group="support")
        c = t.agent()
        self.assertEqual(t.turn(a, message)["usage"]["cached_calls"], 0)
        self.assertEqual(t.turn(b, message)["usage"]["cached_calls"], 1, "same group: a hit")
        self.assertEqual(t.turn(c, message)["usage"]["cached_calls"], 0, "own group: a miss")
        other = RouterTenant(self.server)
        self.assertEqual(other.turn(other.agent(cache_group="support"), message)
                         ["usage"]["cached_calls"], 0, "another tenant: a miss")

    def test_cache_false_turns_it_off(self):
        t = RouterTenant(self.server)
        agent = t.agent(cache=False)
        message = "never cached " + unique_name()
        hits = self.metric("keel_model_cache_hits_total")
        for _ in range(2):
            self.assertEqual(t.turn(agent, message)["usage"]["cached_calls"], 0)
        self.assertEqual(self.metric("keel_model_cache_hits_total"), hits)
        status, body, _ = t.request("POST", "/v1/agents", {"name": unique_name("x"),
                                                          "config": {"cache": "no"}})
        self.assertEqual(status, 400, body)


class CacheFailureTest(KeelTestCase):
    """A cache whose table is gone: every read and write fails, turns go on."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def drop_cache_table(self):
        s = self.server
        if s.pg_database:
            url = keel_harness._pg_url_with(os.environ["KEEL_TEST_PG_ADMIN_URL"], db=s.pg_database)
            subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url, "-c",
                            "DROP TABLE model_cache"], check=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, timeout=60)
        else:
            db = sqlite3.connect(os.path.join(s.home, "keel.db"), timeout=30)
            db.execute("DROP TABLE model_cache")
            db.commit()
            db.close()

    def metric(self, name):
        return metric(self.server, name)

    def test_a_failing_cache_degrades_to_normal_calls(self):
        s = self.server
        agent = s.create_agent()
        self.drop_cache_table()
        errors = self.metric("keel_model_cache_errors_total")
        message = "cache is broken " + unique_name()
        for _ in range(2):
            session = s.create_session(agent["id"])
            run = s.send(session["id"], message, wait=WAIT)["run"]
            self.assertEqual(run["status"], "done", run)
            self.assertEqual(run["output"], 'You said: "%s"' % message)
        # Each turn: a failed read (the second turn is not answered from the first's queued
        # answer: a cache that cannot be read is not a cache), and a failed write a moment
        # later, off the turn's path (once when both answers wait in the same queue).
        self.assertGreaterEqual(wait_metric(s, "keel_model_cache_errors_total", errors + 3),
                                errors + 3)
        self.assertEqual(s.get_run(run["id"])["usage"]["cached_calls"], 0)


if __name__ == "__main__":
    unittest.main()

"""The anthropic provider inside the real server, against tests/fakes/fake_anthropic.py, a fake
that speaks the Messages API's wire format (event streams cut at odd byte boundaries, tool_use
input split over several input_json_delta events, error bodies, 529 overloaded, dropped
connections). The fake checks each request as the API would (alternating roles, tool_result
blocks answering the previous turn's tool_use blocks, the headers) and answers 400 otherwise.

Also the fallback model (config.fallback_model) when the provider is unavailable, and the
response cache in front of a provider: a hit never reaches it (the fake counts requests).
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse

from keel_harness import KeelServer, KeelTestCase, SseClient, sse_url, unique_name

FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes")
DELTA = "message.delta"


def start_fake():
    fake = subprocess.Popen([sys.executable, os.path.join(FAKES, "fake_anthropic.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return fake, int(fake.stdout.readline().strip())


def stop_fake(fake):
    fake.stdin.close()
    fake.wait(timeout=10)
    fake.stdout.close()


def completes(run_id):
    return lambda e: (e.get("event") in ("run.completed@v1", "run.failed@v1") and
                      isinstance(e.get("data"), dict) and e["data"].get("run_id") == run_id)


class AnthropicProviderTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.fake, cls.port = start_fake()
        cls.config_dir = tempfile.mkdtemp(prefix="keel-anthropic-")
        config = os.path.join(cls.config_dir, "keel.toml")
        with open(config, "w") as f:
            # Fewer retries keep the always-overloaded case short; prices show the cache savings.
            f.write("[anthropic]\nmax_retries = 2\n"
                    "[prices.\"anthropic/stream-text\"]\ninput_per_mtok = 3\noutput_per_mtok = 15\n")
        cls.server = KeelServer(env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:%d" % cls.port,
                                     "ANTHROPIC_API_KEY": "test-key",
                                     "KEEL_CONFIG": config})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        stop_fake(cls.fake)
        for name in os.listdir(cls.config_dir):
            os.unlink(os.path.join(cls.config_dir, name))
        os.rmdir(cls.config_dir)

    def provider_count(self, user):
        """Requests the fake has seen whose last user text is `user`."""
        import http.client
        import json
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/_count?user=" + urllib.parse.quote(user))
        body = json.loads(conn.getresponse().read())
        conn.close()
        return body["count"]

    def agent(self, model, **config):
        return self.server.create_agent(model=model, config=config)

    def turn(self, agent, content, wait=30):
        session = self.server.create_session(agent["id"])
        return self.server.send(session["id"], content, wait=wait)["run"]

    def metric(self, name):
        _, text, _ = self.server.request("GET", "/metrics")
        for line in text.splitlines():
            if line.startswith(name + " "):
                return int(line.split()[1])
        raise AssertionError("no metric %s in /metrics" % name)

    def run_events(self, run_id):
        return self.server.ok("GET", "/v1/events?run_id=%s&limit=500" % run_id)["items"]

    # ------------------------------------------------------------------ streaming

    def test_streamed_text_reaches_an_sse_client_as_deltas(self):
        s = self.server
        agent = self.agent("anthropic/stream-text", cache=False)
        session = s.create_session(agent["id"])
        sse = SseClient(sse_url(s, session_id=session["id"]), s.token)
        try:
            run = s.send(session["id"], "stream it to me", wait=30)["run"]
            got = sse.collect_until(completes(run["id"]))
        finally:
            sse.close()
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"], "Hello, world")
        deltas = [e["data"]["text"] for e in got if e["event"] == DELTA]
        self.assertGreaterEqual(len(deltas), 2, "the answer came as one piece: %s" % deltas)
        self.assertEqual("".join(deltas), "Hello, world")
        full = s.get_run(run["id"])
        self.assertEqual(full["usage"]["input_tokens"], 12, full)
        self.assertEqual(full["usage"]["output_tokens"], 5, full)
        self.assertEqual(full["usage"]["model_calls"], 1, full)
        # 12 input tokens at $3/Mtok + 5 output at $15/Mtok = 36 + 75 micro-dollars.
        self.assertAlmostEqual(full["usage"]["cost_usd"], 0.000111, places=9)

    def test_streamed_tool_use_goes_through_the_gateway(self):
        agent = self.server.create_agent(model="anthropic/agent-tools", tools=["notes.append"],
                                         config={"cache": False})
        run = self.turn(agent, '{"line": "from claude"}')
        self.assertEqual(run["status"], "done", run)
        steps = self.server.steps(run["id"])
        self.assertEqual([(x["kind"], x["status"]) for x in steps],
                         [("model", "succeeded"), ("tool", "succeeded"), ("model", "succeeded")],
                         steps)
        calls = steps[0]["output"]["tool_calls"]
        self.assertEqual(len(calls), 1, calls)
        self.assertEqual(calls[0]["name"], "notes.append")  # mapped back from notes-append
        self.assertEqual(calls[0]["arguments"], {"line": "from claude"})
        self.assertEqual(steps[1]["tool_call"]["tool"], "notes.append")
        # The second request carried the result back as a tool_result (the fake checks the pair).
        self.assertTrue(run["output"].startswith("The tool said: "), run["output"])
        self.assertIn("from claude", run["output"])
        self.assertEqual(steps[0]["output"]["model"], "anthropic/agent-tools")

    # ------------------------------------------------------------------ errors

    def test_retries_after_529_overloaded_and_500(self):
        for model in ("overloaded-once", "server-error-once"):
            message = "retry me " + model
            run = self.turn(self.agent("anthropic/" + model, cache=False), message)
            self.assertEqual(run["status"], "done", run)
            self.assertEqual(run["output"], "Hello, world")
            self.assertEqual(self.provider_count(message), 2)

    def test_provider_failures_fail_the_run_cleanly(self):
        for model, words in (("garbage", "not a JSON object"),
                             ("garbage-stream", "not a JSON object"),
                             ("error-event", "overloaded_error: Overloaded"),
                             ("bad-request", "prompt is too long"),
                             ("overloaded", "gave up after 3 attempts")):
            run = self.turn(self.agent("anthropic/" + model, cache=False), "fail " + model)
            self.assertEqual(run["status"], "failed", (model, run))
            self.assertEqual(run["error"]["code"], "model_error", (model, run))
            self.assertIn(words, run["error"]["message"], model)
            steps = self.server.steps(run["id"])
            self.assertEqual([(x["kind"], x["status"]) for x in steps], [("model", "failed")],
                             (model, steps))
        ok = self.turn(self.agent("local"), "still here?")
        self.assertEqual(ok["status"], "done", ok)

    def test_a_stream_cut_inside_a_tool_call_records_no_call(self):
        agent = self.server.create_agent(model="anthropic/cut", tools=["notes.append"],
                                         config={"cache": False})
        run = self.turn(agent, "cut me off")
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "model_error", run)
        self.assertIn("broke off", run["error"]["message"])
        steps = self.server.steps(run["id"])
        self.assertEqual([(x["kind"], x["status"]) for x in steps], [("model", "failed")], steps)
        self.assertNotIn("tool_calls", steps[0]["output"])
        types = [e["type"] for e in self.run_events(run["id"])]
        self.assertNotIn("tool.call.started@v1", types)

    # ------------------------------------------------------------------ fallback

    def test_an_unavailable_provider_falls_back_to_the_fallback_model(self):
        agent = self.agent("anthropic/overloaded", fallback_model="local", cache=False)
        before = self.metric("keel_model_fallbacks_total")
        run = self.turn(agent, "anyone there?")
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"], 'You said: "anyone there?"')
        step = self.server.steps(run["id"])[0]
        self.assertEqual(step["input"]["model"], "anthropic/overloaded")
        self.assertEqual(step["output"]["model"], "local")
        self.assertTrue(step["output"]["fallback"])
        self.assertIn("529", step["output"]["primary_error"])
        fell = [e for e in self.run_events(run["id"]) if e["type"] == "model.fallback@v1"]
        self.assertEqual(len(fell), 1)
        self.assertEqual(fell[0]["payload"]["to"], "local")
        self.assertTrue(fell[0]["payload"]["answered"])
        self.assertEqual(self.metric("keel_model_fallbacks_total"), before + 1)

    def test_a_request_the_provider_refuses_does_not_fall_back(self):
        agent = self.agent("anthropic/bad-request", fallback_model="local", cache=False)
        run = self.turn(agent, "too long, really")
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "model_error")

    def test_the_fallback_model_is_checked_when_the_agent_is_written(self):
        status, body, _ = self.server.request(
            "POST", "/v1/agents", {"name": unique_name("fb"), "model": "anthropic/x",
                                   "config": {"fallback_model": "nosuch/model"}})
        self.assertEqual(status, 400, body)
        self.assertIn("fallback_model", body["error"]["message"])

    # ------------------------------------------------------------------ cache

    def test_a_cache_hit_never_reaches_the_provider(self):
        s = self.server
        agent = self.agent("anthropic/stream-text")
        message = "cache this answer " + unique_name()
        hits = self.metric("keel_model_cache_hits_total")
        stores = self.metric("keel_model_cache_stores_total")
        first = self.turn(agent, message)
        self.assertEqual(first["status"], "done", first)
        self.assertEqual(self.provider_count(message), 1)
        deadline = time.monotonic() + 10  # the answer is written a moment after the turn
        while self.metric("keel_model_cache_stores_total") <= stores:
            self.assertLess(time.monotonic(), deadline, "the answer was never cached")
            time.sleep(0.01)

        session = s.create_session(agent["id"])
        sse = SseClient(sse_url(s, session_id=session["id"]), s.token)
        try:
            second = s.send(session["id"], message, wait=30)["run"]
            got = sse.collect_until(completes(second["id"]))
        finally:
            sse.close()
        self.assertEqual(second["status"], "done", second)
        self.assertEqual(second["output"], "Hello, world")
        self.assertEqual(self.provider_count(message), 1, "the hit went to the provider")
        self.assertEqual([e["data"]["text"] for e in got if e["event"] == DELTA],
                         ["Hello, world"], "a hit streams its answer as one delta")
        self.assertEqual(self.metric("keel_model_cache_hits_total"), hits + 1)
        usage = s.get_run(second["id"])["usage"]
        self.assertEqual(usage["cached_calls"], 1, usage)
        self.assertEqual(usage["cost_usd"], 0, usage)
        self.assertAlmostEqual(usage["cache_savings_usd"], 0.000111, places=9)
        step = s.steps(second["id"])[0]
        self.assertTrue(step["output"]["cached"], step)


class AnthropicWithoutKeyTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.fake, cls.port = start_fake()
        cls.server = KeelServer(env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:%d" % cls.port,
                                     "ANTHROPIC_API_KEY": ""})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        stop_fake(cls.fake)

    def test_a_missing_key_is_a_clear_error_and_no_silent_fallback(self):
        s = self.server
        agent = s.create_agent(model="anthropic/stream-text",
                               config={"fallback_model": "local", "cache": False})
        session = s.create_session(agent["id"])
        run = s.send(session["id"], "no key here", wait=30)["run"]
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "model_error")
        self.assertIn("ANTHROPIC_API_KEY", run["error"]["message"])


if __name__ == "__main__":
    unittest.main()

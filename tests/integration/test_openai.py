"""The openai provider inside the real server, against a fake that speaks the OpenAI wire format."""

import unittest

from keel_harness import FakeOpenAi, KeelServer, KeelTestCase



class OpenAiProviderTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.fake = FakeOpenAi()
        cls.server = KeelServer(env=cls.fake.env)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.fake.stop()

    def turn(self, model, content):
        s = self.server
        agent = s.create_agent(model=model)
        session = s.create_session(agent["id"])
        return s.send(session["id"], content, wait=30)["run"]

    def test_streamed_answer_with_usage(self):
        run = self.turn("openai/stream-text", "say hello")
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"], "Hello, world")
        self.assertGreater(run["usage"]["input_tokens"], 0, run)
        self.assertGreater(run["usage"]["output_tokens"], 0, run)

    def test_retries_after_429(self):
        run = self.turn("openai/rate-limited-once", "retry me please")
        self.assertEqual(run["status"], "done", run)

    def test_garbage_fails_the_run_and_the_server_goes_on(self):
        run = self.turn("openai/garbage", "give me garbage")
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "model_error", run)
        self.assertTrue(run["error"]["message"], run)
        ok = self.turn("local", "still here?")
        self.assertEqual(ok["status"], "done", ok)

    def test_stream_cut_midway_fails_cleanly(self):
        run = self.turn("openai/drop", "drop the line")
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "model_error", run)

    def test_unknown_provider_is_rejected_at_create(self):
        status, body, _ = self.server.request("POST", "/v1/agents",
                                              {"name": "nope", "model": "nosuch/model"})
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["code"], "invalid_argument")


if __name__ == "__main__":
    unittest.main()

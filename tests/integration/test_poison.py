"""A run that stops the server at the same point again and again is failed, not tried forever.

The fake model (tests/fakes/fake_openai.py, scenario `hang`) starts an answer and never ends it;
the test kills the server with SIGKILL while each try waits on it, as a crash inside that model
call would. A run interrupted up to three times is resumed and calls the model again (as after any
outside kill); the fourth time in a row at the same point, the next start fails the run with
`poison_run` instead of trying once more, and the rest of the server goes on.
"""

import http.client
import json
import os
import subprocess
import sys
import time
import unittest
import urllib.parse

from keel_harness import KeelServer, KeelTestCase

FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes")


class PoisonRunTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.fake = subprocess.Popen([sys.executable, os.path.join(FAKES, "fake_openai.py")],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        cls.port = int(cls.fake.stdout.readline().strip())
        cls.server = KeelServer(env={"OPENAI_BASE_URL": "http://127.0.0.1:%d/v1" % cls.port,
                                     "OPENAI_API_KEY": "test-key",
                                     "KEEL_LEASE_MS": "1000"})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.fake.stdin.close()
        cls.fake.wait(timeout=10)

    def model_calls(self, user):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/_count?user=" + urllib.parse.quote(user))
        count = json.loads(conn.getresponse().read())["count"]
        conn.close()
        return count

    def wait_model_calls(self, user, n, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.model_calls(user) >= n:
                return
            time.sleep(0.05)
        self.fail("the model was not called %d times for %r (log:\n%s)"
                  % (n, user, self.server.log_tail()))

    def test_a_run_that_kills_the_server_four_times_is_failed(self):
        s = self.server
        hanging = s.create_agent(model="openai/hang")
        healthy = s.create_agent()
        session = s.create_session(hanging["id"])
        message = "poison %f" % time.time()
        run_id = s.post_message(session["id"], message)[1]["run"]["id"]
        for attempt in (1, 2, 3, 4):
            self.wait_model_calls(message, attempt)
            s.kill9()
            s.start()
        run = s.wait_run(run_id, timeout=30)
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "poison_run", run)
        self.assertIn("4 times in a row", run["error"]["message"])
        # Tried four times (resumed after each of the first three kills), never a fifth.
        time.sleep(0.5)
        self.assertEqual(self.model_calls(message), 4)
        # The session is usable again and other agents were never held up.
        other = s.create_session(healthy["id"])
        self.assertEqual(s.send(other["id"], "still alive")["run"]["status"], "done")
        self.assertEqual(s.get_run(run_id)["status"], "failed")
        st, session_now, _ = s.request("GET", "/v1/sessions/" + session["id"])
        self.assertEqual(session_now["status"], "idle", session_now)

    def test_progress_between_kills_resets_the_count(self):
        s = self.server
        agent = s.create_agent(model="openai/hang-twice-per-step", tools=["time.now"])
        session = s.create_session(agent["id"])
        message = "progress %f" % time.time()
        run_id = s.post_message(session["id"], message)[1]["run"]["id"]
        # Killed twice in the first model call, which then asks for time.now (a recorded
        # step), then twice in the second: never three times in a row at one point.
        for calls in (1, 2, 4, 5):
            self.wait_model_calls(message, calls)
            s.kill9()
            s.start()
        run = s.wait_run(run_id, timeout=30)
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(self.model_calls(message), 6)
        kinds = [step["kind"] for step in s.steps(run_id)]
        self.assertIn("tool", kinds)


if __name__ == "__main__":
    unittest.main()

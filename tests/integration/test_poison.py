"""A run that stops the server at the same point again and again is failed, not tried forever.

The fake model (tests/fakes/fake_openai.py, scenario `hang`) starts an answer and never ends it;
the test stops the server while each try waits on it. A crash (here SIGABRT, as an assertion or the io watchdog gives, which the server's
crash note records: runtime/crash_note.h) three times in a row at the same point fails the run
with `poison_run` at the next start. A stop with no cause known (SIGKILL, as an outside kill, a
power cut or the OOM killer) is resumed as after any outside kill; only the tenth in a row at the
same point fails the run. Progress between stops resets the count, and the rest of the server
goes on.
"""

import http.client
import json
import os
import signal
import time
import unittest
import urllib.parse

from keel_harness import FakeOpenAi, KeelServer, KeelTestCase


class PoisonRunTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.fake = FakeOpenAi()
        cls.port = cls.fake.port
        cls.server = KeelServer(env=dict(cls.fake.env, KEEL_LEASE_MS="1000"))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.fake.stop()

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

    def hang_until_stopped(self, stops, stop):
        """A run of a model that never answers, the server stopped `stops` times while it waits
        (each time with `stop`) and started again; returns the run's id and its message."""
        s = self.server
        hanging = s.create_agent(model="openai/hang")
        session = s.create_session(hanging["id"])
        message = "poison %f" % time.time()
        run_id = s.post_message(session["id"], message)[1]["run"]["id"]
        for attempt in range(1, stops + 1):
            self.wait_model_calls(message, attempt)
            stop()
            s.start()
        return run_id, message, session

    def crash(self):
        s = self.server
        s.proc.send_signal(signal.SIGABRT)
        self.assertEqual(s.proc.wait(timeout=30), -signal.SIGABRT)

    def assert_poison_and_server_fine(self, run_id, message, session, tries, says):
        s = self.server
        run = s.wait_run(run_id, timeout=30)
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "poison_run", run)
        self.assertIn(says, run["error"]["message"])
        # Tried once per stop (resumed after each but the last), never once more.
        time.sleep(0.5)
        self.assertEqual(self.model_calls(message), tries)
        # Failed by the claim that found it poison, in that claim's unit: no try is started
        # for it, so that a kill before its ending cannot add one.
        events = [e for e in s.all_events() if e["run_id"] == run_id and
                  e["type"] in ("run.started@v1", "run.failed@v1")]
        self.assertEqual([e["type"] for e in events],
                         ["run.started@v1"] * tries + ["run.failed@v1"], events)
        self.assertEqual(events[-2]["payload"]["attempt"], tries)
        # The session is usable again and other agents were never held up.
        other = s.create_session(s.create_agent()["id"])
        self.assertEqual(s.send(other["id"], "still alive")["run"]["status"], "done")
        self.assertEqual(s.get_run(run_id)["status"], "failed")
        st, session_now, _ = s.request("GET", "/v1/sessions/" + session["id"])
        self.assertEqual(session_now["status"], "idle", session_now)

    def test_a_run_that_crashes_the_server_three_times_is_failed(self):
        s = self.server
        run_id, message, session = self.hang_until_stopped(3, self.crash)
        self.assert_poison_and_server_fine(run_id, message, session, 3,
                                           "crashed 3 times in a row")
        crashed = [e for e in s.all_events() if e["run_id"] == run_id and
                   e["type"] == "run.crashed@v1"]
        self.assertEqual([(e["payload"]["attempt"], e["payload"]["signal"]) for e in crashed],
                         [(1, signal.SIGABRT), (2, signal.SIGABRT), (3, signal.SIGABRT)])
        # Each note was taken in and removed at the restart, and said so.
        self.assertFalse(os.path.exists(os.path.join(s.home, "crash.note")))
        with open(s.stderr_path) as f:
            self.assertIn("the last process stopped on signal 6 with 1 run(s) executing",
                          f.read())

    def test_a_run_killed_nine_times_goes_on_and_the_tenth_fails_it(self):
        s = self.server
        run_id, message, session = self.hang_until_stopped(9, s.kill9)
        self.wait_model_calls(message, 10)  # resumed after nine kills with no cause known
        self.assertEqual(s.get_run(run_id)["status"], "running")
        s.kill9()
        s.start()
        self.assert_poison_and_server_fine(run_id, message, session, 10,
                                           "stopped (or held the run past its lease) 10 times")
        self.assertEqual([e for e in s.all_events() if e["run_id"] == run_id and
                          e["type"] == "run.crashed@v1"], [])

    def test_progress_between_kills_resets_the_count(self):
        s = self.server
        agent = s.create_agent(model="openai/hang-twice-per-step", tools=["time.now"])
        session = s.create_session(agent["id"])
        message = "progress %f" % time.time()
        run_id = s.post_message(session["id"], message)[1]["run"]["id"]
        # Crashed twice in the first model call, which then asks for time.now (a recorded
        # step), then twice in the second: never three times in a row at one point.
        for calls in (1, 2, 4, 5):
            self.wait_model_calls(message, calls)
            self.crash()
            s.start()
        run = s.wait_run(run_id, timeout=30)
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(self.model_calls(message), 6)
        kinds = [step["kind"] for step in s.steps(run_id)]
        self.assertIn("tool", kinds)


if __name__ == "__main__":
    unittest.main()

"""The io thread watchdog (DESIGN.md invariant 13: nothing may freeze the server).

Lua plugin handlers run on the io thread, each bounded by its budget (at most 2 s of wall time);
an agent with several of them on one event holds the io thread for all of them in a row. The
watchdog logs the run and the hook holding the io thread once it has not turned over for
`io_stall_warn_ms`; held `io_stall_limit_ms`, it records the run as poison and aborts the
process. The next start fails that run with `poison_run` at once (not after four tries), and
the server goes on with everything else."""

import json
import signal
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, Tenant

# Each iteration is a few instructions and a long C call, so the wall-time budget (2 s), not the
# instruction budget, ends the handler.
SPIN = ('ctx.bus.on("model.before@v1", function(p)\n'
        '  while true do local s = string.rep("x", 1000000) end\n'
        'end)\n')


def spinning_plugin(plugin_id):
    """A Lua plugin whose model.before handler spins until its budget stops it (skipped)."""
    return {"manifest": {"id": plugin_id, "name": plugin_id, "version": "1.0.0", "kind": "lua",
                         "events": ["model.before@v1"], "failure_mode": "skip",
                         "limits": {"instructions": 100000000, "wall_ms": 2000}},
            "source": SPIN}


class WatchdogTest(KeelTestCase):
    def tearDown(self):
        self.server.stop()

    def spinning_agent(self, tenant, plugins):
        s = self.server
        agent = s.create_agent(token=tenant.token)
        for i in range(plugins):
            pid = "spin-%d" % i
            tenant.ok("POST", "/v1/plugins", spinning_plugin(pid), expect=201)
            tenant.ok("POST", "/v1/plugins/%s/enable" % pid, {"agent_id": agent["id"]})
        return agent

    def wait_log(self, text, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.server.stderr_path) as f:
                if text in f.read():
                    return
            time.sleep(0.05)
        self.fail("%r not in the server's log\n%s" % (text, self.server.log_tail()))

    def test_a_run_that_freezes_the_io_thread_is_poison_and_the_server_restarts(self):
        self.server = KeelServer(env={"KEEL_IO_STALL_WARN_MS": "300",
                                      "KEEL_IO_STALL_LIMIT_MS": "1000"})
        s = self.server
        tenant = Tenant(s)
        frozen = self.spinning_agent(tenant, 4)  # 8 s of hooks in a row
        session = s.create_session(frozen["id"], token=tenant.token)
        status, body, _ = s.post_message(session["id"], "hello", token=tenant.token)
        self.assertEqual(status, 202, body)
        run_id = body["run"]["id"]
        # The watchdog aborts the process rather than leave it frozen.
        s.proc.wait(timeout=60)
        self.assertEqual(s.proc.returncode, -signal.SIGABRT, s.log_tail())
        with open(s.stderr_path) as f:
            log = f.read()
        self.assertIn("io watchdog: the io thread was held for", log)
        self.assertIn("plugin hook model.before of agent %s of run %s" % (frozen["id"], run_id),
                      log)
        # One start is enough: the run is failed at its claim, before any hook runs again.
        s.start()
        run = s.wait_run(run_id, token=tenant.token)
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "poison_run", run)
        self.assertIn("io thread", run["error"]["message"])
        self.assertIn("plugin hook model.before", run["error"]["message"])
        types = [e["type"] for e in s.all_events(token=tenant.token) if e["run_id"] == run_id]
        self.assertIn("run.stalled@v1", types)
        # Its abort left a crash note, recorded at the restart: the run is poison all the same.
        self.assertEqual(types.index("run.crashed@v1"), types.index("run.stalled@v1") + 1, types)
        # The try that froze, and no other: the claim that found it poison failed it in its own
        # unit, without starting a try.
        self.assertEqual(types.count("run.started@v1"), 1, types)
        self.assertEqual(types[-1], "run.failed@v1", types)
        # Everything else goes on: another tenant's turn, on the same server process.
        other = Tenant(s)
        agent = s.create_agent(token=other.token)
        healthy = s.create_session(agent["id"], token=other.token)
        body = s.send(healthy["id"], "hello", token=other.token)
        self.assertEqual(s.wait_run(body["run"]["id"], token=other.token)["status"], "done")
        self.assertHealthy()

    def test_a_short_stall_is_logged_with_its_run_and_the_run_goes_on(self):
        self.server = KeelServer(env={"KEEL_IO_STALL_WARN_MS": "300",
                                      "KEEL_IO_STALL_LIMIT_MS": "60000"})
        s = self.server
        tenant = Tenant(s)
        agent = self.spinning_agent(tenant, 1)
        session = s.create_session(agent["id"], token=tenant.token)
        status, body, _ = s.post_message(session["id"], "hello", token=tenant.token)
        self.assertEqual(status, 202, body)
        run_id = body["run"]["id"]
        self.wait_log("io watchdog: the io thread has not turned over for")
        run = s.wait_run(run_id, token=tenant.token)
        self.assertEqual(run["status"], "done", run)
        with open(s.stderr_path) as f:
            log = f.read()
        self.assertIn("held by plugin hook model.before of agent %s of run %s" % (agent["id"],
                                                                                 run_id), log)
        self.assertNotIn("aborting", log)
        self.assertTrue(s.alive())

    def test_the_warning_must_be_below_the_limit(self):
        self.server = KeelServer(env={"KEEL_IO_STALL_WARN_MS": "5000",
                                      "KEEL_IO_STALL_LIMIT_MS": "5000"}, start=False)
        with self.assertRaises(Exception) as refused:
            self.server.start()
        self.assertIn("io_stall_warn_ms (5000) must be below io_stall_limit_ms (5000)",
                      str(refused.exception))


if __name__ == "__main__":
    unittest.main()

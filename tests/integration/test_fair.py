"""Noisy neighbours (DESIGN.md invariant 13): one tenant's slow runs and slow tools cannot take
every run slot or every tool thread of a node from the others.

A tenant executes at most `tenant_max_running` runs at once on a node (its further runs stay
queued while other tenants' are claimed), and its blocking tool calls use at most
`tenant_tool_threads` of the node's `tool_threads` (its further calls wait in its own queue).
The noisy tenant here runs `exec sleep` commands in the sandbox, with its owner's and its
user's tokens alike (the share is the tenant's, whoever posts); the quiet tenant's turn, whose
own exec command must run, still completes while all of the noisy tenant's share is busy.

The sleeps are found by their exact command line in /proc and killed at the end, so that the
noisy tenant's queued runs are seen to run afterwards."""

import json
import os
import shutil
import signal
import threading
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, ServerDied, Tenant

HAVE_BWRAP = shutil.which("bwrap") is not None


def sleeping(seconds):
    """Pids of the `sleep SECONDS` processes (exact argv) on this machine."""
    pids = []
    want = ["sleep", seconds]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")[:-1]
        except OSError:
            continue
        if [a.decode(errors="replace") for a in argv] == want:
            pids.append(int(entry))
    return pids


@unittest.skipUnless(HAVE_BWRAP, "the exec sandbox needs bubblewrap")
class FairShareTest(KeelTestCase):
    def tearDown(self):
        self.kill_sleeps()
        self.server.stop()

    def start(self, env):
        self.server = KeelServer(env=env)
        self.noisy = Tenant(self.server)
        self.quiet = Tenant(self.server)
        # A duration no other test uses, so that its processes are this test's.
        self.seconds = "%d.%03d" % (90 + os.getpid() % 50, threading.get_ident() % 1000)

    def kill_sleeps(self):
        for pid in sleeping(getattr(self, "seconds", "-")):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def exec_agent(self, tenant):
        return self.server.create_agent(tools=["exec"], config={"exec_backend": "sandbox"},
                                        token=tenant.token)

    def post_noisy(self, count):
        """Posts `count` runs of the noisy tenant, each sleeping, from threads at once (half with
        its owner's token, half with its user's); returns their run ids."""
        s = self.server
        user, _ = self.noisy.new_token("user")
        agent = self.exec_agent(self.noisy)
        command = "/call exec %s" % json.dumps({"command": "sleep " + self.seconds,
                                                "timeout_s": 300})
        sessions = []
        for i in range(count):
            token = self.noisy.token if i % 2 == 0 else user
            sessions.append((s.create_session(agent["id"], token=token)["id"], token))
        runs, errors = [], []

        def post(session_id, token):
            status, body, _ = s.post_message(session_id, command, token=token)
            (runs if status == 202 else errors).append(body["run"]["id"] if status == 202
                                                       else (status, body))

        threads = [threading.Thread(target=post, args=x) for x in sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(runs), count)
        return runs

    def wait_sleeping(self, n, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(sleeping(self.seconds)) >= n:
                return
            time.sleep(0.05)
        self.fail("%d sleeps did not start within %ss (%d did)\n%s"
                  % (n, timeout, len(sleeping(self.seconds)), self.server.log_tail()))

    def statuses(self, runs):
        return sorted(self.server.get_run(r, token=self.noisy.token)["status"] for r in runs)

    def quiet_turn(self):
        """The quiet tenant's turn, whose exec command must run; returns its tool step."""
        s = self.server
        agent = self.exec_agent(self.quiet)
        session = s.create_session(agent["id"], token=self.quiet.token)
        command = "/call exec %s" % json.dumps({"command": "echo quiet-ran"})
        status, body, _ = s.post_message(session["id"], command, token=self.quiet.token)
        self.assertEqual(status, 202, body)
        # Long before any of the noisy tenant's sleeps could end on its own.
        run = s.wait_run(body["run"]["id"], timeout=45, token=self.quiet.token)
        self.assertEqual(run["status"], "done", run)
        tools = [x for x in s.steps(run["id"], token=self.quiet.token) if x["kind"] == "tool"]
        self.assertEqual(len(tools), 1, tools)
        self.assertEqual(tools[0]["status"], "succeeded", tools[0])
        self.assertIn("quiet-ran", json.dumps(tools[0]["output"]))
        return tools[0]

    def finish_noisy(self, runs):
        """Kills the sleeps until every noisy run ended: the queued ones run after the others."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.kill_sleeps()
            if all(st in ("done", "failed") for st in self.statuses(runs)):
                return
            time.sleep(0.1)
        self.fail("the noisy tenant's runs did not end: %s" % self.statuses(runs))

    def test_a_tenants_slow_runs_hold_only_its_share_of_the_run_slots(self):
        # Four run slots on the node, two for any one tenant; threads to spare for tools.
        self.start({"KEEL_MAX_CONCURRENT_RUNS": "4", "KEEL_TENANT_MAX_RUNNING": "2",
                    "KEEL_TOOL_THREADS": "8", "KEEL_TENANT_TOOL_THREADS": "8"})
        runs = self.post_noisy(4)
        self.wait_sleeping(2)
        self.quiet_turn()
        # The noisy tenant's extra runs were queued, not claimed: two sleep, two wait.
        self.assertEqual(len(sleeping(self.seconds)), 2)
        self.assertEqual(self.statuses(runs), ["queued", "queued", "running", "running"])
        self.finish_noisy(runs)
        self.assertHealthy()

    def test_a_tenants_slow_tools_hold_only_its_share_of_the_tool_threads(self):
        # Four tool threads, two for any one tenant; run slots to spare.
        self.start({"KEEL_MAX_CONCURRENT_RUNS": "16", "KEEL_TENANT_MAX_RUNNING": "8",
                    "KEEL_TOOL_THREADS": "4", "KEEL_TENANT_TOOL_THREADS": "2"})
        runs = self.post_noisy(4)
        self.wait_sleeping(2)
        # All four runs execute, but only two of their commands have a thread.
        deadline = time.monotonic() + 30
        while self.statuses(runs) != ["running"] * 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.statuses(runs), ["running"] * 4)
        self.quiet_turn()
        self.assertEqual(len(sleeping(self.seconds)), 2)
        self.finish_noisy(runs)
        self.assertHealthy()

    def test_a_share_larger_than_the_node_is_refused_at_start(self):
        self.server = KeelServer(env={"KEEL_MAX_CONCURRENT_RUNS": "4",
                                      "KEEL_TENANT_MAX_RUNNING": "5"}, start=False)
        with self.assertRaises(ServerDied) as refused:
            self.server.start()
        self.assertIn("tenant_max_running (5) must not exceed max_concurrent_runs (4)",
                      str(refused.exception))


if __name__ == "__main__":
    unittest.main()

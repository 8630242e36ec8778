"""The chaos test: three `keel serve` nodes on one PostgreSQL database (sharing the workspace
root) under a load of at least 1,000 turns that call notes.append, while a random node other than
the first is killed with SIGKILL every few seconds and restarted, sometimes at once and sometimes
after its leases have run out (so that the other nodes resume its runs). Clients post each turn
to a random node that is up and retry it, with the same Idempotency-Key, on any node until one
acknowledges it. An SSE client stays connected to the first node (never killed) for the whole
load.

At the end the invariants of turn_load.check_outcome hold across the cluster (one `done` run per
acknowledged message, no step or non-idempotent effect twice, each origin's sequence gapless),
and the SSE client saw every event of its filter exactly once, in position order.

Runs only with KEEL_TEST_STORE=postgres (ctest integration_pg.test_chaos).
Environment: KEEL_CHAOS_TURNS (default 1000), KEEL_CHAOS_SEED (default: random; printed).
"""

import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, SseClient, pick_up, sse_url
from turn_load import check_outcome, plan_turns, post_turns

ON_PG = os.environ.get("KEEL_TEST_STORE") == "postgres"
TURNS = int(os.environ.get("KEEL_CHAOS_TURNS", "1000"))
SEED = int(os.environ.get("KEEL_CHAOS_SEED", str(random.randrange(1 << 30))))
LEASE_MS = 2000
AGENTS = 4
SESSIONS_PER_AGENT = 4
# The local model waits this long per answer, so that kills find runs in flight.
MODEL_LATENCY_MS = 100
CLIENT_DEADLINE_S = 240
MIN_KILLS = 3


@unittest.skipUnless(ON_PG, "several nodes need a shared store: runs only with "
                            "KEEL_TEST_STORE=postgres (ctest integration_pg.test_chaos)")
class ChaosTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.workspaces = tempfile.mkdtemp(prefix="keel-chaos-ws-")
        env = {"KEEL_LEASE_MS": str(LEASE_MS), "KEEL_WORKSPACES": cls.workspaces}
        cls.nodes = [KeelServer(env=env)]
        for _ in range(2):
            cls.nodes.append(KeelServer(env=env, store_url=cls.nodes[0].store_url,
                                        token=cls.nodes[0].token))

    @classmethod
    def tearDownClass(cls):
        for n in reversed(cls.nodes):
            n.stop()  # the first node drops the database, last
        if not os.environ.get("KEEL_TEST_KEEP"):
            shutil.rmtree(cls.workspaces, ignore_errors=True)

    def servers(self):
        return list(getattr(self, "nodes", []))

    def killer(self, state):
        rng = random.Random(SEED)
        victims = self.nodes[1:]
        try:
            while not state["clients_done"]:
                # The first MIN_KILLS come quickly, so that a short load (KEEL_CHAOS_TURNS=300
                # under the sanitizers) still sees them all; later ones at a calmer pace.
                early = state["kills"] < MIN_KILLS
                time.sleep(rng.uniform(0.3, 0.9) if early else rng.uniform(0.8, 2.5))
                if state["clients_done"]:
                    break
                victim = rng.choice(victims)
                victim.kill9()
                state["kills"] += 1
                # Often back at once (it resumes its own runs at start); sometimes only after
                # its leases ran out, so another node must take its runs over.
                time.sleep(rng.choice([0, 0, rng.uniform(0.1, 1.0), rng.uniform(2.0, 3.5)])
                           if not early else rng.choice([0, rng.uniform(0.1, 0.5)]))
                victim.start()
        except Exception as e:  # noqa: BLE001 - reported by the test
            state["killer_error"] = "%s: %s" % (type(e).__name__, e)

    def test_a_paused_node_writes_nothing_for_the_runs_taken_over(self):
        # One node stopped with SIGSTOP past its leases (a stalled process, a paused VM) while
        # it runs turns, then resumed with SIGCONT while the others run them: each of its
        # executions finds at its next write that it no longer holds its run (runs::Held
        # checks the lease and the attempt in every transition) and writes no step, journal
        # entry or event for it, so that no step is written by two nodes and every once-effect
        # happens once. Then it serves turns as before.
        paused, other = self.nodes[1], self.nodes[0]
        with open(os.path.join(paused.home, "origin")) as f:
            paused_origin = f.read().strip()
        agent = paused.create_agent(name="pause-agent", tools=["notes.append"],
                                    config={"local_latency_ms": 1500})
        runs = []
        for k in range(4):
            session = paused.create_session(agent["id"])
            status, body, _ = paused.post_message(
                session["id"], '/call notes.append {"line": "paused-%d"}' % k)
            self.assertEqual(status, 202, body)
            runs.append(body["run"]["id"])
        for run_id in runs:  # claimed at intake: running on the node about to be paused
            self.assertEqual(other.get_run(run_id)["status"], "running")
        os.kill(paused.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and \
                    any(other.get_run(r)["attempt"] < 2 for r in runs):
                time.sleep(0.1)
        finally:
            # Resumed as soon as the others took its runs over, while they still run them.
            os.kill(paused.proc.pid, signal.SIGCONT)
        ended = [other.wait_run(r, timeout=30) for r in runs]
        self.assertEqual([r["status"] for r in ended], ["done"] * len(runs), ended)
        time.sleep(1.0)  # what the woken node would write, it has tried by now

        events = [e for e in other.all_events() if e["run_id"] in runs]
        for run_id in runs:
            mine = [e for e in events if e["run_id"] == run_id]
            taken = next(e["position"] for e in mine if e["type"] == "run.started@v1" and
                         e["origin"] != paused_origin)
            late = [(e["type"], e["position"]) for e in mine
                    if e["origin"] == paused_origin and e["position"] > taken]
            self.assertEqual(late, [], "the paused node wrote for run %s after it was taken "
                                       "over at position %d" % (run_id, taken))
            seqs = [step["seq"] for step in other.steps(run_id)]
            self.assertEqual(len(seqs), len(set(seqs)), "a step written twice: %s" % seqs)
        with open(os.path.join(self.workspaces, agent["id"], "notes.txt")) as f:
            self.assertEqual(sorted(f.read().splitlines()),
                             ["paused-%d" % k for k in range(len(runs))])
        # The woken node did try, and said why it stopped.
        with open(paused.stderr_path) as f:
            log = f.read()
        self.assertTrue(any("run %s: this node's execution (attempt 1) no longer holds it"
                            % r in log for r in runs), paused.log_tail())
        # The woken node goes on serving.
        session = paused.create_session(agent["id"])
        self.assertEqual(paused.send(session["id"], "awake?", wait=20)["run"]["status"], "done")

    def test_three_nodes_under_kill9(self):
        first = self.nodes[0]
        sys.stderr.write("\nchaos test: TURNS=%d KEEL_CHAOS_SEED=%d homes=%s\n"
                         % (TURNS, SEED, [n.home for n in self.nodes]))
        agents, sessions, per_session, all_turns = plan_turns(
            first, TURNS, AGENTS, SESSIONS_PER_AGENT, name="chaos-agent",
            agent_config={"local_latency_ms": MODEL_LATENCY_MS})

        # The stream: one agent's events, from just after everything so far.
        watched = agents[0]["id"]
        before = first.all_events()
        p0 = before[-1]["position"] if before else 0
        sse = SseClient(sse_url(first, agent_id=watched), first.token, last_event_id=p0,
                        timeout=CLIENT_DEADLINE_S + 120)
        self.addCleanup(sse.close)
        self.assertEqual(sse.status, 200)

        state = {"kills": 0, "clients_done": False, "killer_error": None,
                 "acks_since_restart": 0, "lock": threading.Lock(),
                 "deadline": time.monotonic() + CLIENT_DEADLINE_S}
        nodes = self.nodes

        def pick_node(rng):
            return pick_up(nodes, rng)

        started = time.monotonic()
        clients = [threading.Thread(target=post_turns, name="client-%d" % k, daemon=True,
                                    args=(per_session[k], state, pick_node, SEED + k))
                   for k in sorted(per_session)]
        killer = threading.Thread(target=self.killer, args=(state,), name="killer", daemon=True)
        for t in clients:
            t.start()
        killer.start()
        for t in clients:
            t.join(timeout=CLIENT_DEADLINE_S + 30)
        state["clients_done"] = True
        killer.join(timeout=60)
        load_s = time.monotonic() - started

        self.assertIsNone(state["killer_error"], "kill/restart failed: %s" % state["killer_error"])
        self.assertGreaterEqual(state["kills"], MIN_KILLS, "too few kills during the load")
        for n in nodes:
            self.assertTrue(n.alive(), "node %s is not running after the load" % n.home)
        summary = check_outcome(self, first, agents, sessions, per_session, all_turns,
                                lambda aid: os.path.join(self.workspaces, aid))
        self.assertGreater(summary["resumed"], 0,
                           "no run was resumed: the kills never hit a run in flight")
        self.assertGreaterEqual(len(summary["origins"]), 3, "events of every node's origin")

        # ---- the stream: every stored event of the watched agent after p0, once, in order
        expected = [e["position"] for e in summary["events"]
                    if e["agent_id"] == watched and e["position"] > p0]
        self.assertTrue(expected)
        seen = []
        deadline = time.monotonic() + 30
        while (not seen or seen[-1] < expected[-1]) and time.monotonic() < deadline:
            ev = sse.next(timeout=max(0.1, deadline - time.monotonic()))
            if ev is None:
                break
            self.assertFalse(ev.get("closed"), "the stream on the first node closed: %r" % ev)
            if ev.get("event") == "message.delta":
                continue
            self.assertEqual(ev["id"], str(ev["data"]["position"]))
            self.assertEqual(ev["data"]["agent_id"], watched)
            seen.append(ev["data"]["position"])
        missing = sorted(set(expected) - set(seen))
        self.assertFalse(missing, "the stream missed %d events, e.g. %s"
                         % (len(missing), missing[:10]))
        self.assertEqual(seen, expected, "the stream is not the log's events once, in order")

        sys.stderr.write(
            "chaos test: %d turns on 3 nodes, %d kills, %.1fs of load, %d attempts, %d runs "
            "resumed (attempt > 1), calls %s, %d events, origins %s, %d streamed\n"
            % (TURNS, state["kills"], load_s, summary["attempts"], summary["resumed"],
               summary["calls"], len(summary["events"]), summary["origins"], len(seen)))


if __name__ == "__main__":
    unittest.main()

"""The crash test: a few hundred turns calling notes.append from several client threads across
several agents and sessions, while the server is killed with SIGKILL at random moments and
restarted on the same KEEL_HOME. Clients retry unacknowledged posts with the same
Idempotency-Key. At the end:

  - every acknowledged message has exactly one run, and it ended `done`;
  - no step was executed twice (step seq unique and contiguous; each call in one tool step;
    one tool.call.started event per call; one run.completed per run);
  - each agent's notes.txt holds exactly the lines of the succeeded calls, plus possibly lines of
    calls resolved `unknown`, and no line twice;
  - each origin's origin_seq in the event log is gapless from 1.

Environment: KEEL_CRASH_TURNS (default 300), KEEL_CRASH_KILLS (default 20),
KEEL_CRASH_SEED (default: random; printed so a failure can be replayed).
"""

import collections
import http.client
import os
import random
import sys
import threading
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, TERMINAL_RUN_STATES, http_request

TURNS = int(os.environ.get("KEEL_CRASH_TURNS", "300"))
KILLS = int(os.environ.get("KEEL_CRASH_KILLS", "20"))
SEED = int(os.environ.get("KEEL_CRASH_SEED", str(random.randrange(1 << 30))))
AGENTS = 3
SESSIONS_PER_AGENT = 2
CLIENT_DEADLINE_S = 150
SETTLE_TIMEOUT_S = 90


class Turn:
    def __init__(self, session_index, session_id, agent_id, i):
        self.session_index = session_index
        self.session_id = session_id
        self.agent_id = agent_id
        self.i = i
        self.line = "m-%d-%d" % (session_index, i)
        self.content = '/call notes.append {"line": "%s"}' % self.line
        self.key = "crash-%d-%d" % (session_index, i)
        self.acks = []  # (message_id, run_id) of every 2xx answer
        self.attempts = 0
        self.error = None


class CrashTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    # ------------------------------------------------------------------ clients and killer

    def client(self, turns, state):
        """Posts its turns in order; retries each with the same key until acknowledged."""
        s = self.server
        rng = random.Random(SEED + turns[0].session_index)
        n = len(turns)
        for j, turn in enumerate(turns):
            # Spread the work over the kill schedule: do not run far ahead of the killer.
            while not state["killer_done"] and j >= (state["kills"] + 2) * n // max(KILLS, 1):
                if time.monotonic() > state["deadline"]:
                    break
                time.sleep(0.01)
            while True:
                if time.monotonic() > state["deadline"]:
                    turn.error = "not acknowledged before the deadline (%d attempts)" % \
                        turn.attempts
                    return
                addr = s.addr
                if addr is None:
                    time.sleep(0.02)
                    continue
                turn.attempts += 1
                try:
                    status, body, hdrs = http_request(
                        addr, "POST", "/v1/sessions/%s/messages?wait=3" % turn.session_id,
                        body={"content": turn.content}, token=s.token,
                        headers={"Idempotency-Key": turn.key}, timeout=15)
                except (OSError, http.client.HTTPException):
                    time.sleep(rng.uniform(0.01, 0.08))
                    continue
                if status in (200, 202):
                    turn.acks.append((body["message"]["id"], body["run"]["id"]))
                    with state["lock"]:
                        state["acks_since_restart"] += 1
                    break
                if status in (429, 503) or status >= 500:
                    time.sleep(rng.uniform(0.02, 0.1))
                    continue
                turn.error = "HTTP %s: %r" % (status, body)
                break
            time.sleep(rng.uniform(0, 0.01))

    def killer(self, state):
        s = self.server
        rng = random.Random(SEED)
        try:
            for k in range(KILLS):
                if rng.random() < 0.15:
                    # kill during start-up recovery or right after it
                    time.sleep(rng.uniform(0, 0.05))
                else:
                    # wait for some progress since the last restart, then a random moment
                    t0 = time.monotonic()
                    while state["acks_since_restart"] < 1 and time.monotonic() - t0 < 10:
                        time.sleep(0.005)
                    time.sleep(rng.uniform(0, 0.4))
                s.kill9()
                with state["lock"]:
                    state["acks_since_restart"] = 0
                state["kill_times"].append(time.monotonic())
                s.start()
                state["kills"] = k + 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            state["killer_error"] = "%s: %s" % (type(e).__name__, e)
        finally:
            state["killer_done"] = True

    # ------------------------------------------------------------------ the test

    def test_kill9_during_notes_append_turns(self):
        s = self.server
        sys.stderr.write("\ncrash test: TURNS=%d KILLS=%d KEEL_CRASH_SEED=%d home=%s\n"
                         % (TURNS, KILLS, SEED, s.home))
        agents = [s.create_agent(name="crash-agent-%d" % a) for a in range(AGENTS)]
        sessions = []  # (agent_id, session_id)
        for a in agents:
            for _ in range(SESSIONS_PER_AGENT):
                sessions.append((a["id"], s.create_session(a["id"])["id"]))
        per_session = collections.defaultdict(list)
        for i in range(TURNS):
            k = i % len(sessions)
            agent_id, session_id = sessions[k]
            per_session[k].append(Turn(k, session_id, agent_id, i))
        all_turns = [t for k in sorted(per_session) for t in per_session[k]]

        state = {"kills": 0, "killer_done": KILLS == 0, "killer_error": None,
                 "acks_since_restart": 0, "lock": threading.Lock(), "kill_times": [],
                 "deadline": time.monotonic() + CLIENT_DEADLINE_S}
        started = time.monotonic()
        clients = [threading.Thread(target=self.client, args=(per_session[k], state),
                                    name="client-%d" % k, daemon=True)
                   for k in sorted(per_session)]
        killer = threading.Thread(target=self.killer, args=(state,), name="killer", daemon=True)
        for t in clients:
            t.start()
        if KILLS:
            killer.start()
        for t in clients:
            t.join(timeout=CLIENT_DEADLINE_S + 30)
        if KILLS:
            killer.join(timeout=120)
        load_s = time.monotonic() - started

        self.assertIsNone(state["killer_error"], "kill/restart failed: %s" % state["killer_error"])
        self.assertEqual(state["kills"], KILLS, "not every kill happened")
        self.assertTrue(s.alive(), "the server is not running after the last restart")
        errors = [(t.key, t.error) for t in all_turns if t.error]
        self.assertFalse(errors, "turns that failed: %s" % errors[:20])

        # every acknowledgement of a key names the same message and run
        for t in all_turns:
            self.assertTrue(t.acks, "turn %s was never acknowledged" % t.key)
            self.assertEqual(len(set(t.acks)), 1,
                             "one Idempotency-Key, several messages/runs: %s %s" % (t.key, t.acks))

        # ---- settle: every run of every session reaches a terminal state
        run_ids = {t.acks[0][1] for t in all_turns}
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        runs = {}
        while True:
            pending = []
            for sess_index, (agent_id, session_id) in enumerate(sessions):
                for r in s.list_all("/v1/sessions/%s/runs" % session_id, limit=500):
                    runs[r["id"]] = r
            pending = [r for r in runs.values() if r["status"] not in TERMINAL_RUN_STATES]
            if not pending:
                break
            if time.monotonic() > deadline:
                self.fail("runs did not settle within %ss: %s" % (
                    SETTLE_TIMEOUT_S, [(r["id"], r["status"], r["attempt"]) for r in pending][:20]))
            time.sleep(0.2)

        # ---- exactly one run per acknowledged message, ended done
        for sess_index, (agent_id, session_id) in enumerate(sessions):
            expected = {t.content: t for t in per_session[sess_index]}
            msgs = s.list_all("/v1/sessions/%s/messages" % session_id, limit=500)
            users = [m for m in msgs if m["role"] == "user"]
            contents = collections.Counter(m["content"] for m in users)
            dup = {c: n for c, n in contents.items() if n > 1}
            self.assertFalse(dup, "a retried message was taken twice: %s" % dup)
            self.assertEqual(set(contents), set(expected),
                             "session %d: user messages differ from the turns posted" % sess_index)
            for m in users:
                t = expected[m["content"]]
                self.assertEqual(m["id"], t.acks[0][0], "message id of %s" % t.key)
                self.assertEqual(m["run_id"], t.acks[0][1], "run of %s" % t.key)
            sess_runs = [r for r in runs.values() if r["session_id"] == session_id]
            self.assertEqual(sorted(r["id"] for r in sess_runs),
                             sorted(t.acks[0][1] for t in per_session[sess_index]),
                             "session %d: runs are not one per message" % sess_index)
        self.assertEqual(set(runs), run_ids)
        not_done = [(r["id"], r["status"], r["error"]) for r in runs.values()
                    if r["status"] != "done"]
        self.assertFalse(not_done, "runs that did not end done: %s" % not_done[:20])

        # ---- steps: nothing executed twice
        calls = []  # (agent_id, run_id, call_id, line, status)
        by_run = {t.acks[0][1]: t for t in all_turns}
        resumed = 0
        for rid, t in by_run.items():
            steps = s.steps(rid)
            seqs = [x.get("seq") for x in steps]
            self.assertNotIn(None, seqs, "steps without seq in run %s" % rid)
            self.assertEqual(len(seqs), len(set(seqs)), "run %s: duplicate step seq %s"
                             % (rid, seqs))
            self.assertEqual(sorted(seqs), list(range(min(seqs), min(seqs) + len(seqs))),
                             "run %s: step seq not contiguous: %s" % (rid, seqs))
            kinds = collections.Counter(x["kind"] for x in steps)
            self.assertEqual(kinds["model"], 2, "run %s (%s): model steps %s" % (rid, t.key,
                                                                                 steps))
            tools = [x for x in steps if x["kind"] == "tool"]
            self.assertEqual(len(tools), 1, "run %s (%s): the call was made %d times: %s"
                             % (rid, t.key, len(tools), tools))
            call = tools[0]
            self.assertEqual(call["input"].get("tool"), "notes.append")
            self.assertEqual(call["input"].get("arguments"), {"line": t.line})
            self.assertIn(call["status"], ("succeeded", "unknown"),
                          "run %s: tool call status %r" % (rid, call))
            calls.append((t.agent_id, rid, call["input"].get("call_id"), t.line, call["status"]))
            if runs[rid]["attempt"] > 1:
                resumed += 1

        # ---- effects: notes.txt equals the succeeded calls (plus possibly unknown ones)
        statuses = collections.Counter(c[4] for c in calls)
        for agent in agents:
            aid = agent["id"]
            path = os.path.join(s.home, "workspaces", aid, "notes.txt")
            mine = [c for c in calls if c[0] == aid]
            succeeded = {c[3] for c in mine if c[4] == "succeeded"}
            unknown = {c[3] for c in mine if c[4] == "unknown"}
            data = ""
            if os.path.exists(path):
                with open(path) as f:
                    data = f.read()
            self.assertTrue(data == "" or data.endswith("\n"), "%s ends in a partial line" % path)
            lines = data.split("\n")[:-1] if data else []
            counts = collections.Counter(lines)
            dups = {k: v for k, v in counts.items() if v > 1}
            self.assertFalse(dups, "agent %s: notes.append effects repeated: %s" % (aid, dups))
            missing = succeeded - set(counts)
            self.assertFalse(missing, "agent %s: succeeded calls without their line: %s"
                             % (aid, sorted(missing)[:20]))
            extra = set(counts) - succeeded
            self.assertFalse(extra - unknown, "agent %s: lines no succeeded or unknown call "
                             "explains: %s" % (aid, sorted(extra - unknown)[:20]))

        # ---- the event log
        events = s.all_events()
        positions = [e["position"] for e in events]
        self.assertEqual(positions, sorted(set(positions)), "positions not strictly increasing")
        by_origin = collections.defaultdict(list)
        for e in events:
            by_origin[e["origin"]].append(e["origin_seq"])
        for origin, seqs in by_origin.items():
            self.assertEqual(seqs, list(range(1, len(seqs) + 1)),
                             "origin %s: origin_seq not gapless from 1 in position order "
                             "(first differences: %s)" % (origin, [
                                 (i + 1, q) for i, q in enumerate(seqs) if q != i + 1][:10]))
        per_run = collections.defaultdict(collections.Counter)
        started_calls = collections.Counter()
        unknown_events = 0
        for e in events:
            if e["run_id"]:
                per_run[e["run_id"]][e["type"]] += 1
            if e["type"] == "tool.call.started@v1":
                started_calls[(e["run_id"], e["payload"].get("call_id"))] += 1
            if e["type"] == "tool.call.unknown@v1":
                unknown_events += 1
        for rid in run_ids:
            c = per_run[rid]
            self.assertEqual(c["run.completed@v1"], 1, "run %s: %s" % (rid, dict(c)))
            self.assertEqual(c["run.failed@v1"], 0, "run %s: %s" % (rid, dict(c)))
            self.assertGreaterEqual(c["run.queued@v1"], 1, "run %s: %s" % (rid, dict(c)))
            self.assertEqual(c["tool.call.started@v1"], 1, "run %s: %s" % (rid, dict(c)))
        twice = {k: n for k, n in started_calls.items() if n > 1}
        self.assertFalse(twice, "tool calls started twice: %s" % twice)
        self.assertEqual(unknown_events, statuses["unknown"],
                         "tool.call.unknown events vs unknown calls")

        sys.stderr.write(
            "crash test: %d turns, %d kills, %.1fs of load, %d attempts, %d runs resumed "
            "(attempt > 1), calls %s, %d events, origins %s\n"
            % (TURNS, state["kills"], load_s, sum(t.attempts for t in all_turns), resumed,
               dict(statuses), len(events), {o: len(v) for o, v in by_origin.items()}))


if __name__ == "__main__":
    unittest.main()

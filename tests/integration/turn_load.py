"""Turns under fire: the load and the checks shared by the crash test (one node, SQLite or
PostgreSQL) and the chaos test (three nodes on one PostgreSQL database).

Each turn posts one call with a non-idempotent effect to its session, with an Idempotency-Key, and
is retried with the same key, on whichever node is up, until some node acknowledges it. The call
is `notes.append {"line": ...}` (appends to notes.txt), or, with `exec_every`, every n-th turn is
`exec {"command": "echo LINE >> exec.txt"}` in the sandbox. After the load, `check_outcome`
asserts what must hold however often nodes were killed:

  - every acknowledged message has exactly one run, and it ended `done`;
  - no step was executed twice (step seq unique and contiguous; each call in one tool step;
    one tool.call.started event per call; one run.completed per run);
  - each agent's notes.txt and exec.txt hold exactly the lines of the succeeded calls, plus
    possibly lines of calls resolved `unknown`, and no line twice;
  - each origin's origin_seq in the event log is gapless from 1, in position order.
"""

import collections
import http.client
import json
import os
import random
import time

from keel_harness import TERMINAL_RUN_STATES, http_request


class Turn:
    def __init__(self, session_index, session_id, agent_id, i, use_exec=False):
        self.session_index = session_index
        self.session_id = session_id
        self.agent_id = agent_id
        self.i = i
        self.line = "m-%d-%d" % (session_index, i)
        if use_exec:
            self.tool, self.effect_file = "exec", "exec.txt"
            self.arguments = {"command": "echo %s >> exec.txt" % self.line}
        else:
            self.tool, self.effect_file = "notes.append", "notes.txt"
            self.arguments = {"line": self.line}
        self.content = "/call %s %s" % (self.tool, json.dumps(self.arguments))
        self.key = "turn-%d-%d" % (session_index, i)
        self.acks = []  # (message_id, run_id) of every 2xx answer
        self.attempts = 0
        self.error = None


def plan_turns(server, count, agents, sessions_per_agent, agent_config=None, name="load-agent",
               exec_every=0):
    """Creates the agents and sessions and spreads `count` turns over the sessions round-robin;
    with exec_every=n, every n-th turn calls exec instead of notes.append.
    Returns (agents, sessions [(agent_id, session_id)], per_session {index: [Turn]}, all_turns).
    """
    agent_list = [server.create_agent(name="%s-%d" % (name, a), config=agent_config,
                                      tools=["notes.append", "exec"])
                  for a in range(agents)]
    sessions = []
    for a in agent_list:
        for _ in range(sessions_per_agent):
            sessions.append((a["id"], server.create_session(a["id"])["id"]))
    per_session = collections.defaultdict(list)
    for i in range(count):
        k = i % len(sessions)
        agent_id, session_id = sessions[k]
        per_session[k].append(Turn(k, session_id, agent_id, i,
                                   use_exec=bool(exec_every) and i % exec_every == exec_every - 1))
    all_turns = [t for k in sorted(per_session) for t in per_session[k]]
    return agent_list, sessions, per_session, all_turns


def post_turns(turns, state, pick_node, seed, pace=None):
    """Client thread body: posts `turns` in order, each retried with its key until acknowledged.

    pick_node(rng) -> (addr, token), or None while no node is up. pace(j), when given, blocks
    before turn j (used to spread the turns over a kill schedule). state: a dict with "deadline"
    (monotonic), "lock" and a counter "acks_since_restart" that this function increments."""
    rng = random.Random(seed)
    for j, turn in enumerate(turns):
        if pace:
            pace(j)
        post_one(turn, state, pick_node, rng)
        if turn.error and turn.error.startswith("not acknowledged before the deadline"):
            return
        time.sleep(rng.uniform(0, 0.01))


def post_one(turn, state, pick_node, rng):
    """Posts one turn, retried with its Idempotency-Key on whichever node is up, until a node
    acknowledges it (recorded in turn.acks), a 4xx other than 429 refuses it, or state's
    deadline passes (both recorded in turn.error)."""
    while True:
        if time.monotonic() > state["deadline"]:
            turn.error = "not acknowledged before the deadline (%d attempts)" % turn.attempts
            return
        node = pick_node(rng)
        if node is None:
            time.sleep(0.02)
            continue
        addr, token = node
        turn.attempts += 1
        try:
            status, body, _ = http_request(
                addr, "POST", "/v1/sessions/%s/messages?wait=3" % turn.session_id,
                body={"content": turn.content}, token=token,
                headers={"Idempotency-Key": turn.key}, timeout=15)
        except (OSError, http.client.HTTPException):
            time.sleep(rng.uniform(0.01, 0.08))
            continue
        if status in (200, 202):
            turn.acks.append((body["message"]["id"], body["run"]["id"]))
            with state["lock"]:
                state["acks_since_restart"] += 1
            return
        if status in (429, 503) or status >= 500:
            time.sleep(rng.uniform(0.02, 0.1))
            continue
        turn.error = "HTTP %s: %r" % (status, body)
        return


def check_outcome(test, api, agents, sessions, per_session, all_turns, workspace_of,
                  settle_timeout=90):
    """Asserts the invariants listed in the module docstring. `api`: a live KeelServer to read
    through; workspace_of(agent_id) -> that agent's workspace directory. Returns a summary."""
    errors = [(t.key, t.error) for t in all_turns if t.error]
    test.assertFalse(errors, "turns that failed: %s" % errors[:20])

    # every acknowledgement of a key names the same message and run
    for t in all_turns:
        test.assertTrue(t.acks, "turn %s was never acknowledged" % t.key)
        test.assertEqual(len(set(t.acks)), 1,
                         "one Idempotency-Key, several messages/runs: %s %s" % (t.key, t.acks))

    # ---- settle: every run of every session reaches a terminal state
    run_ids = {t.acks[0][1] for t in all_turns}
    deadline = time.monotonic() + settle_timeout
    runs = {}
    while True:
        for agent_id, session_id in sessions:
            for r in api.list_all("/v1/sessions/%s/runs" % session_id, limit=500):
                runs[r["id"]] = r
        pending = [r for r in runs.values() if r["status"] not in TERMINAL_RUN_STATES]
        if not pending:
            break
        if time.monotonic() > deadline:
            test.fail("runs did not settle within %ss: %s" % (
                settle_timeout, [(r["id"], r["status"], r["attempt"]) for r in pending][:20]))
        time.sleep(0.2)

    # ---- exactly one run per acknowledged message, ended done
    for sess_index, (agent_id, session_id) in enumerate(sessions):
        expected = {t.content: t for t in per_session[sess_index]}
        msgs = api.list_all("/v1/sessions/%s/messages" % session_id, limit=500)
        users = [m for m in msgs if m["role"] == "user"]
        contents = collections.Counter(m["content"] for m in users)
        dup = {c: n for c, n in contents.items() if n > 1}
        test.assertFalse(dup, "a retried message was taken twice: %s" % dup)
        test.assertEqual(set(contents), set(expected),
                         "session %d: user messages differ from the turns posted" % sess_index)
        for m in users:
            t = expected[m["content"]]
            test.assertEqual(m["id"], t.acks[0][0], "message id of %s" % t.key)
            test.assertEqual(m["run_id"], t.acks[0][1], "run of %s" % t.key)
        sess_runs = [r for r in runs.values() if r["session_id"] == session_id]
        test.assertEqual(sorted(r["id"] for r in sess_runs),
                         sorted(t.acks[0][1] for t in per_session[sess_index]),
                         "session %d: runs are not one per message" % sess_index)
    test.assertEqual(set(runs), run_ids)
    not_done = [(r["id"], r["status"], r["error"]) for r in runs.values() if r["status"] != "done"]
    test.assertFalse(not_done, "runs that did not end done: %s" % not_done[:20])

    # ---- steps: nothing executed twice
    calls = []  # (agent_id, run_id, call_id, line, status, effect_file)
    by_run = {t.acks[0][1]: t for t in all_turns}
    resumed = 0
    for rid, t in by_run.items():
        steps = api.steps(rid)
        seqs = [x.get("seq") for x in steps]
        test.assertNotIn(None, seqs, "steps without seq in run %s" % rid)
        test.assertEqual(len(seqs), len(set(seqs)), "run %s: duplicate step seq %s" % (rid, seqs))
        test.assertEqual(sorted(seqs), list(range(min(seqs), min(seqs) + len(seqs))),
                         "run %s: step seq not contiguous: %s" % (rid, seqs))
        kinds = collections.Counter(x["kind"] for x in steps)
        test.assertEqual(kinds["model"], 2, "run %s (%s): model steps %s" % (rid, t.key, steps))
        tools = [x for x in steps if x["kind"] == "tool"]
        test.assertEqual(len(tools), 1, "run %s (%s): the call was made %d times: %s"
                         % (rid, t.key, len(tools), tools))
        call = tools[0]
        test.assertEqual(call["input"].get("tool"), t.tool)
        test.assertEqual(call["input"].get("arguments"), t.arguments)
        test.assertIn(call["status"], ("succeeded", "unknown"),
                      "run %s: tool call status %r" % (rid, call))
        calls.append((t.agent_id, rid, call["input"].get("call_id"), t.line, call["status"],
                      t.effect_file))
        if runs[rid]["attempt"] > 1:
            resumed += 1

    # ---- effects: each effect file equals the succeeded calls (plus possibly unknown ones)
    statuses = collections.Counter(c[4] for c in calls)
    for agent, effect_file in [(a, f) for a in agents for f in ("notes.txt", "exec.txt")]:
        aid = agent["id"]
        path = os.path.join(workspace_of(aid), effect_file)
        mine = [c for c in calls if c[0] == aid and c[5] == effect_file]
        succeeded = {c[3] for c in mine if c[4] == "succeeded"}
        unknown = {c[3] for c in mine if c[4] == "unknown"}
        data = ""
        if os.path.exists(path):
            with open(path) as f:
                data = f.read()
        test.assertTrue(data == "" or data.endswith("\n"), "%s ends in a partial line" % path)
        lines = data.split("\n")[:-1] if data else []
        counts = collections.Counter(lines)
        dups = {k: v for k, v in counts.items() if v > 1}
        test.assertFalse(dups, "agent %s: %s effects repeated: %s" % (aid, effect_file, dups))
        missing = succeeded - set(counts)
        test.assertFalse(missing, "agent %s: succeeded calls without their line: %s"
                         % (aid, sorted(missing)[:20]))
        extra = set(counts) - succeeded
        test.assertFalse(extra - unknown, "agent %s: lines no succeeded or unknown call "
                         "explains: %s" % (aid, sorted(extra - unknown)[:20]))

    # ---- the event log
    events = api.all_events()
    positions = [e["position"] for e in events]
    test.assertEqual(positions, sorted(set(positions)), "positions not strictly increasing")
    by_origin = collections.defaultdict(list)
    for e in events:
        by_origin[e["origin"]].append(e["origin_seq"])
    for origin, seqs in by_origin.items():
        test.assertEqual(seqs, list(range(1, len(seqs) + 1)),
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
        if e["type"] == "tool.call.unknown@v1" and e["run_id"] in run_ids:
            unknown_events += 1
    for rid in run_ids:
        c = per_run[rid]
        test.assertEqual(c["run.completed@v1"], 1, "run %s: %s" % (rid, dict(c)))
        test.assertEqual(c["run.failed@v1"], 0, "run %s: %s" % (rid, dict(c)))
        test.assertGreaterEqual(c["run.queued@v1"], 1, "run %s: %s" % (rid, dict(c)))
        test.assertEqual(c["tool.call.started@v1"], 1, "run %s: %s" % (rid, dict(c)))
    twice = {k: n for k, n in started_calls.items() if n > 1}
    test.assertFalse(twice, "tool calls started twice: %s" % twice)
    test.assertEqual(unknown_events, statuses["unknown"],
                     "tool.call.unknown events vs unknown calls")
    return {"resumed": resumed, "calls": dict(statuses),
            "tools": dict(collections.Counter(c[5] for c in calls)), "events": events,
            "origins": {o: len(v) for o, v in by_origin.items()},
            "attempts": sum(t.attempts for t in all_turns)}

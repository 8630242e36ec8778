"""The soak: kill -9 at random, many times, under a mixed load, and count what was lost.

One node on SQLite (killed and restarted on the same KEEL_HOME), or three nodes on one
PostgreSQL database (any of them killed, never all at once, restarted at once or after their
run leases ran out). Meanwhile:

  - clients post turns that call notes.append (every third one exec in the sandbox), each with
    an Idempotency-Key, retried on whichever node is up until one acknowledges it;
  - clients post turns to an agent whose policy asks approval for notes.append, and an approver
    approves whatever is pending, on whichever node is up;
  - a scheduler creates one-shot schedules due a second later (missed: catch_up_one, so a slot
    that came due while no node fired still fires once).

When the kills are done, every run is let settle and the outcome is counted:

  lost                    an acknowledged turn without exactly one run that ended done, or an
                          acknowledged schedule that never fired
  duplicated once-effects a line twice in an agent's notes.txt or exec.txt, a tool call started
                          twice, a schedule fired twice
  unknown outcomes        tool calls whose outcome a crash left unknown, surfaced as such
                          (status unknown, tool.call.unknown@v1) rather than run again

and printed as one line,

  N kills, M turns acknowledged, 0 lost, 0 duplicated once-effects, K unknown outcomes surfaced

then the stricter invariants of turn_load.check_outcome are checked on the notes.append and exec
turns (steps never repeated, gapless origins, ...). Exit status 1 on any loss, duplicate or
failed invariant.

    python3 tests/integration/soak.py --backend sqlite|postgres --kills N [--seed S]

scripts/soak.sh runs it on both backends (PostgreSQL under scripts/with-pg.sh); test_soak.py
runs a short form of it in the test suite. KEEL_BIN names the binary (keel_harness).
"""

import argparse
import collections
import datetime
import http.client
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import unittest

from keel_harness import TERMINAL_RUN_STATES, KeelServer, http_request, pick_up
from turn_load import Turn, check_outcome, post_one

LEASE_MS = 2000
MODEL_LATENCY_MS = 60  # so that kills find runs in flight
EFFECT_AGENTS = 3
SESSIONS_PER_AGENT = 2
APPROVAL_SESSIONS = 2
SETTLE_S = 180


class Soak:
    def __init__(self, backend, kills, seed, log=sys.stderr):
        self.backend = backend
        self.kills_wanted = kills
        self.seed = seed
        self.log = log
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.kills = 0
        self.errors = []  # of the load's threads
        self.workspaces = tempfile.mkdtemp(prefix="keel-soak-ws-")
        self.nodes = []

    # ------------------------------------------------------------------ the cluster

    def start(self):
        if self.backend == "postgres":
            os.environ["KEEL_TEST_STORE"] = "postgres"
        else:
            os.environ.pop("KEEL_TEST_STORE", None)
        env = {"KEEL_LEASE_MS": str(LEASE_MS), "KEEL_WORKSPACES": self.workspaces}
        self.nodes = [KeelServer(env=env)]
        if self.backend == "postgres":
            for _ in range(2):
                self.nodes.append(KeelServer(env=env, store_url=self.nodes[0].store_url,
                                             token=self.nodes[0].token))
        self.api = self.nodes[0]

    def close(self, keep=False):
        for n in reversed(self.nodes):
            n.stop()  # the first node drops the PostgreSQL database, last
        if not keep:
            shutil.rmtree(self.workspaces, ignore_errors=True)

    def pick_node(self, rng):
        return pick_up(self.nodes, rng)

    def live(self):
        """A node that is up, waiting for one (the only one may be restarting)."""
        while True:
            for n in self.nodes:
                if n.addr and n.alive():
                    return n
            time.sleep(0.02)

    def call(self, method, path, body=None, ok=(200, 201, 204), rng=None, tries=200):
        """One request on whichever node is up, retried while no node answers; returns
        (status, body) of the first answer, or (None, None) when none came."""
        rng = rng or random.Random()
        for _ in range(tries):
            node = self.pick_node(rng)
            if node is None:
                time.sleep(0.02)
                continue
            try:
                status, body_out, _ = http_request(node[0], method, path, body=body,
                                                   token=node[1], timeout=15)
            except (OSError, http.client.HTTPException):
                time.sleep(0.02)
                continue
            if status in (429, 503) or status >= 500:
                time.sleep(0.05)
                continue
            return status, body_out
        return None, None

    # ------------------------------------------------------------------ the load

    def plan(self):
        api = self.api
        self.effect_agents = [api.create_agent(name="soak-%d" % a, tools=["notes.append", "exec"],
                                               config={"local_latency_ms": MODEL_LATENCY_MS})
                              for a in range(EFFECT_AGENTS)]
        self.effect_sessions = [(a["id"], api.create_session(a["id"])["id"])
                                for a in self.effect_agents for _ in range(SESSIONS_PER_AGENT)]
        self.approval_agent = api.create_agent(name="soak-approvals", tools=["notes.append"],
                                               config={"local_latency_ms": MODEL_LATENCY_MS})
        api.ok("PUT", "/v1/agents/%s/policy" % self.approval_agent["id"],
               {"rules": [{"tool": "notes.append", "rights": ["write"], "approval": "always"}]})
        self.approval_sessions = [(self.approval_agent["id"],
                                   api.create_session(self.approval_agent["id"])["id"])
                                  for _ in range(APPROVAL_SESSIONS)]
        self.schedule_agent = api.create_agent(name="soak-schedules",
                                               config={"local_latency_ms": MODEL_LATENCY_MS})
        self.schedule_session = api.create_session(self.schedule_agent["id"])["id"]
        self.turns = collections.defaultdict(list)  # session index -> [Turn]
        self.approval_turns = collections.defaultdict(list)
        self.schedules = {}  # id -> prompt, acknowledged
        self.approved = 0

    def client(self, k, agent_id, session_id, turns, key_prefix, exec_every):
        rng = random.Random(self.seed * 1000 + (500 if key_prefix == "approval" else 0) + k)
        i = 0
        try:
            while not self.stop.is_set():
                turn = Turn(k, session_id, agent_id, i,
                            use_exec=bool(exec_every) and i % exec_every == exec_every - 1)
                turn.key = turn.line = "%s-%d-%d" % (key_prefix, k, i)
                turn.arguments = ({"command": "echo %s >> exec.txt" % turn.line}
                                  if turn.tool == "exec" else {"line": turn.line})
                turn.content = "/call %s %s" % (turn.tool, json.dumps(turn.arguments))
                turns.append(turn)
                # Retried until acknowledged; once the kills are over, for a minute more.
                give_up = None
                while not turn.acks and not turn.error:
                    if self.stop.is_set() and give_up is None:
                        give_up = time.monotonic() + 60
                    end = time.monotonic() + 5
                    state = {"deadline": min(end, give_up) if give_up else end,
                             "lock": self.lock, "acks_since_restart": 0}
                    post_one(turn, state, self.pick_node, rng)
                    if turn.error and turn.error.startswith("not acknowledged before") and \
                            (give_up is None or time.monotonic() < give_up):
                        turn.error = None
                i += 1
                time.sleep(rng.uniform(0, 0.15))
        except Exception as e:  # noqa: BLE001 - reported at the end
            self.errors.append("client %s-%d: %s: %s" % (key_prefix, k, type(e).__name__, e))

    def approver(self):
        rng = random.Random(self.seed + 7)
        try:
            while not self.approvals_done.is_set():
                status, body = self.call("GET", "/v1/approvals?status=pending&limit=100",
                                         ok=(200,), rng=rng, tries=50)
                for a in (body or {}).get("items", []) if status == 200 else []:
                    s, _ = self.call("POST", "/v1/approvals/%s/approve" % a["id"],
                                     body={"reason": "soak"}, rng=rng, tries=50)
                    if s == 200:
                        self.approved += 1
                time.sleep(rng.uniform(0.02, 0.2))
        except Exception as e:  # noqa: BLE001
            self.errors.append("approver: %s: %s" % (type(e).__name__, e))

    def scheduler(self):
        rng = random.Random(self.seed + 11)
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                prompt = "scheduled %d" % n
                at = (datetime.datetime.now(datetime.timezone.utc) +
                      datetime.timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
                # Not retried: an attempt whose answer was lost may or may not exist, and only
                # acknowledged ones are counted (each attempt has a prompt of its own).
                node = self.pick_node(rng)
                if node is not None:
                    try:
                        status, body, _ = http_request(
                            node[0], "POST", "/v1/schedules",
                            body={"agent_id": self.schedule_agent["id"], "at": at,
                                  "prompt": prompt, "session_id": self.schedule_session,
                                  "missed": "catch_up_one"},
                            token=node[1], timeout=15)
                        if status == 201:
                            self.schedules[body["id"]] = prompt
                    except (OSError, http.client.HTTPException):
                        pass
                time.sleep(rng.uniform(0.3, 0.9))
        except Exception as e:  # noqa: BLE001
            self.errors.append("scheduler: %s: %s" % (type(e).__name__, e))

    def killer(self):
        rng = random.Random(self.seed + 13)
        started = time.monotonic()
        try:
            while self.kills < self.kills_wanted:
                # Time to go on between kills: a run that kills find at the same point ten
                # times in a row is stopped as poison (run_state.cc), which is right for a run
                # that gets the server killed and wrong for one the kills keep interrupting
                # before its step can end (its turn would count as lost here).
                time.sleep(rng.uniform(0.5, 2.0))
                up = [n for n in self.nodes if n.alive()]
                if len(up) < len(self.nodes):  # one at a time
                    continue
                victim = rng.choice(self.nodes)
                victim.kill9()
                self.kills += 1
                # Mostly back at once (it resumes its own runs); sometimes after its leases ran
                # out, so that (on PostgreSQL) another node takes its runs over.
                time.sleep(rng.choice([0, 0, 0, rng.uniform(0.05, 0.5),
                                       rng.uniform(LEASE_MS / 1000, LEASE_MS / 1000 + 1)]))
                victim.start()
                if self.kills % 50 == 0:
                    self.log.write("soak: %d/%d kills, %.0f s\n"
                                   % (self.kills, self.kills_wanted, time.monotonic() - started))
                    self.log.flush()
        except Exception as e:  # noqa: BLE001
            self.errors.append("killer: %s: %s" % (type(e).__name__, e))
        finally:
            self.stop.set()

    def run_load(self):
        self.approvals_done = threading.Event()
        threads = []
        for k, (agent_id, session_id) in enumerate(self.effect_sessions):
            threads.append(threading.Thread(
                target=self.client, daemon=True, name="client-%d" % k,
                args=(k, agent_id, session_id, self.turns[k], "turn", 3)))
        for k, (agent_id, session_id) in enumerate(self.approval_sessions):
            threads.append(threading.Thread(
                target=self.client, daemon=True, name="approval-client-%d" % k,
                args=(k, agent_id, session_id, self.approval_turns[k], "approval", 0)))
        threads.append(threading.Thread(target=self.scheduler, daemon=True, name="scheduler"))
        approver = threading.Thread(target=self.approver, daemon=True, name="approver")
        killer = threading.Thread(target=self.killer, daemon=True, name="killer")
        for t in threads + [approver, killer]:
            t.start()
        killer.join()
        for t in threads:
            t.join(timeout=120)
            if t.is_alive():
                self.errors.append("thread %s did not finish" % t.name)
        return approver

    # ------------------------------------------------------------------ the outcome

    def settle(self, approver):
        """Waits until every run is over and every acknowledged schedule fired (the approver
        keeps deciding meanwhile)."""
        deadline = time.monotonic() + SETTLE_S
        sessions = self.effect_sessions + self.approval_sessions + [(None, self.schedule_session)]
        while True:
            runs = {}
            for _, session_id in sessions:
                for r in self.live().list_all("/v1/sessions/%s/runs" % session_id, limit=500):
                    runs[r["id"]] = r
            pending = [r for r in runs.values() if r["status"] not in TERMINAL_RUN_STATES]
            schedules = self.live().list_all("/v1/schedules?agent_id=%s"
                                             % self.schedule_agent["id"], limit=500)
            due = [s for s in schedules if s["id"] in self.schedules and s["status"] != "done"]
            if not pending and not due:
                break
            if time.monotonic() > deadline:
                self.errors.append("did not settle within %d s: %d runs pending, %d schedules "
                                   "due" % (SETTLE_S, len(pending), len(due)))
                break
            time.sleep(0.3)
        self.approvals_done.set()
        approver.join(timeout=30)
        return runs

    def count(self, runs):
        api = self.live()
        events = api.all_events()
        lost, duplicated, unknown = [], [], 0
        started = collections.Counter()
        fired = collections.Counter()
        unknown_calls = set()
        for e in events:
            if e["type"] == "tool.call.started@v1":
                started[(e["run_id"], e["payload"].get("call_id"))] += 1
            elif e["type"] == "tool.call.unknown@v1":
                unknown_calls.add((e["run_id"], e["payload"].get("call_id")))
            elif e["type"] == "schedule.fired@v1":
                fired[e["payload"].get("schedule_id")] += 1
        unknown = len(unknown_calls)
        duplicated += ["tool call %s started %d times" % (k, n) for k, n in started.items() if n > 1]
        # Turns: one run per acknowledged message, ended done.
        all_turns = [t for ts in list(self.turns.values()) + list(self.approval_turns.values())
                     for t in ts]
        acked = [t for t in all_turns if t.acks]
        for t in all_turns:
            if t.error:
                self.errors.append("turn %s: %s" % (t.key, t.error))
            if len(set(t.acks)) > 1:
                duplicated.append("turn %s acknowledged as several messages: %s" % (t.key, t.acks))
        for t in acked:
            run = runs.get(t.acks[0][1])
            if not run or run["status"] != "done":
                lost.append("turn %s: run %s" % (t.key, run and (run["id"], run["status"],
                                                                  run.get("error"))))
        # Effects: no line twice in any agent's files; every done call's line there.
        for agent in self.effect_agents + [self.approval_agent]:
            for effect_file in ("notes.txt", "exec.txt"):
                path = os.path.join(self.workspaces, agent["id"], effect_file)
                lines = open(path).read().split("\n")[:-1] if os.path.exists(path) else []
                for line, n in collections.Counter(lines).items():
                    if n > 1:
                        duplicated.append("%s of agent %s: %r %d times"
                                          % (effect_file, agent["name"], line, n))
        for r in runs.values():
            if r["session_id"] == self.schedule_session and r["status"] != "done":
                lost.append("scheduled run %s: %s %s" % (r["id"], r["status"], r.get("error")))
        # Schedules: each acknowledged one fired once.
        for sid, prompt in self.schedules.items():
            if fired[sid] == 0:
                lost.append("schedule %s (%s) never fired" % (sid, prompt))
        duplicated += ["schedule %s fired %d times" % (sid, n) for sid, n in fired.items() if n > 1]
        return acked, lost, duplicated, unknown

    def check_invariants(self):
        """turn_load.check_outcome on the notes.append / exec turns."""
        per_session = {k: [t for t in ts if t.acks] for k, ts in self.turns.items()}
        all_turns = [t for k in sorted(per_session) for t in per_session[k]]

        class _Assert(unittest.TestCase):
            def runTest(self):  # noqa: N802 - unittest's name
                pass

        try:
            check_outcome(_Assert(), self.live(), self.effect_agents, self.effect_sessions,
                          per_session, all_turns,
                          lambda aid: os.path.join(self.workspaces, aid),
                          settle_timeout=SETTLE_S)
        except AssertionError as e:
            return str(e)[:2000]
        return None


def run(backend, kills, seed, log=sys.stderr):
    """Runs one soak; returns (ok, the summary line)."""
    soak = Soak(backend, kills, seed, log)
    log.write("soak: %s, %d kills, seed %d\n" % (backend, kills, seed))
    ok = False
    try:
        soak.start()
        soak.plan()
        started = time.monotonic()
        approver = soak.run_load()
        runs = soak.settle(approver)
        acked, lost, duplicated, unknown = soak.count(runs)
        line = ("%s: %d kills, %d turns acknowledged, %d lost, %d duplicated once-effects, "
                "%d unknown outcomes surfaced (%d schedules fired, %d approvals, %.0f s)"
                % (backend, soak.kills, len(acked), len(lost), len(duplicated), unknown,
                   len(soak.schedules), soak.approved, time.monotonic() - started))
        for what, items in (("lost", lost), ("duplicated", duplicated), ("error", soak.errors)):
            for item in items[:20]:
                log.write("soak: %s: %s\n" % (what, item))
        broken = soak.check_invariants()
        if broken:
            log.write("soak: an invariant failed: %s\n" % broken)
        ok = not lost and not duplicated and not soak.errors and not broken and \
            soak.kills >= kills
        return ok, line
    finally:
        soak.close(keep=not ok and bool(os.environ.get("KEEL_TEST_KEEP")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sqlite", "postgres"], required=True)
    ap.add_argument("--kills", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    args = ap.parse_args()
    ok, line = run(args.backend, args.kills, args.seed)
    print(line)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""The runtime: per-session serial, cross-session concurrent, idempotency, busy policy, tenant
run cap, cancel, step limit, and resuming a run after kill -9."""

import collections
import os
import threading
import time
import unittest

from keel_harness import (TERMINAL_RUN_STATES, KeelServer, KeelTestCase, parse_time,
                          unique_name)


def slow_message(n, tool="time.now", args="{}"):
    """A message whose run makes n tool calls (each a durable journal write and result write),
    which keeps the run busy for a while."""
    return "\n".join("/call %s %s" % (tool, args) for _ in range(n))


def wait_all(server, run_ids, timeout=60):
    deadline = time.monotonic() + timeout
    runs = {}
    while time.monotonic() < deadline:
        for rid in run_ids:
            if rid not in runs or runs[rid]["status"] not in TERMINAL_RUN_STATES:
                runs[rid] = server.get_run(rid)
        if all(r["status"] in TERMINAL_RUN_STATES for r in runs.values()) and \
                len(runs) == len(run_ids):
            return [runs[r] for r in run_ids]
        time.sleep(0.05)
    raise AssertionError("runs did not end within %ss: %s\n%s" % (
        timeout, {k: v["status"] for k, v in runs.items()}, server.log_tail(30)))


def check_steps_contiguous(tc, steps, what=""):
    for s in steps:
        tc.assertIn("seq", s, "%s: a step has no seq: %r" % (what, s))
    seqs = [s["seq"] for s in steps]
    tc.assertEqual(len(seqs), len(set(seqs)), "%s: duplicate step seq %s" % (what, seqs))
    if seqs:
        lo = min(seqs)
        tc.assertIn(lo, (0, 1), "%s: steps start at %s" % (what, lo))
        tc.assertEqual(sorted(seqs), list(range(lo, lo + len(seqs))),
                       "%s: step seq not contiguous: %s" % (what, seqs))
        tc.assertEqual(seqs, sorted(seqs), "%s: steps not listed in order" % what)


class RuntimeTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def new_session(self, **agent_kw):
        agent_kw.setdefault("tools", ["time.now", "notes.append"])  # the tools these turns call
        agent = self.server.create_agent(**agent_kw)
        return agent, self.server.create_session(agent["id"])

    # ------------------------------------------------------------------ per-session serial

    def test_per_session_serial(self):
        s = self.server
        _, sess = self.new_session()
        posted = []
        for i in range(5):
            st, body, _ = s.post_message(sess["id"], "serial-%d\n/call time.now {}\n"
                                         "/call time.now {}" % i)
            self.assertEqual(st, 202, body)
            posted.append(body)
        run_ids = [b["run"]["id"] for b in posted]
        self.assertEqual(len(set(run_ids)), 5)
        runs = wait_all(s, run_ids)
        for r in runs:
            self.assertEqual(r["status"], "done", r)
        for prev, cur in zip(runs, runs[1:]):
            self.assertLessEqual(parse_time(prev["finished_at"]), parse_time(cur["started_at"]),
                                 "runs of one session overlap: %s [%s..%s] and %s [%s..%s]" % (
                                     prev["id"], prev["started_at"], prev["finished_at"],
                                     cur["id"], cur["started_at"], cur["finished_at"]))
        # the event log agrees: run i+1 starts after run i completed
        evs = [e for e in s.all_events() if e["run_id"] in run_ids and
               e["type"] in ("run.started@v1", "run.completed@v1")]
        order = [(e["type"], run_ids.index(e["run_id"])) for e in evs]
        expected = []
        for i in range(5):
            expected += [("run.started@v1", i), ("run.completed@v1", i)]
        self.assertEqual(order, expected, "start/complete events of one session interleave")
        # messages: the users' in posting order, each run's answers after its own message and
        # before the next run's answers
        msgs = s.list_all("/v1/sessions/%s/messages" % sess["id"])
        users = [m for m in msgs if m["role"] == "user"]
        self.assertEqual([m["id"] for m in users], [b["message"]["id"] for b in posted])
        answer_runs = [run_ids.index(m["run_id"]) for m in msgs if m["role"] != "user"]
        self.assertEqual(answer_runs, sorted(answer_runs), "answers out of order: %s" % answer_runs)
        for r in runs:
            last = [m for m in msgs if m["run_id"] == r["id"] and m["role"] == "assistant"][-1]
            self.assertEqual(last["content"], r["output"])

    # ------------------------------------------------------------------ cross-session concurrent

    def test_cross_session_concurrent(self):
        s = self.server
        _, a = self.new_session()
        _, b = self.new_session()
        _, c = self.new_session()
        ids = []
        for sess in (a, b, c):
            st, body, _ = s.post_message(sess["id"], slow_message(60))
            self.assertEqual(st, 202, body)
            ids.append(body["run"]["id"])
        runs = wait_all(s, ids, timeout=120)
        for r in runs:
            self.assertEqual(r["status"], "done", r)
        spans = [(parse_time(r["started_at"]), parse_time(r["finished_at"])) for r in runs]
        overlapping = [(i, j) for i in range(3) for j in range(i + 1, 3)
                       if spans[i][0] < spans[j][1] and spans[j][0] < spans[i][1]]
        self.assertTrue(overlapping, "runs of different sessions never ran at the same time: %s"
                        % [(r["started_at"], r["finished_at"]) for r in runs])
        # the tool calls of the runs interleave in the event log
        seq = [e["run_id"] for e in s.all_events() if e["run_id"] in ids and
               e["type"] == "tool.call.started@v1"]
        switches = sum(1 for x, y in zip(seq, seq[1:]) if x != y)
        self.assertGreater(switches, len(ids) - 1, "tool calls of different sessions never "
                           "interleaved (switches=%d)" % switches)

    # ------------------------------------------------------------------ idempotency

    def test_idempotency_key(self):
        s = self.server
        _, sess = self.new_session()
        _, other = self.new_session()
        key = unique_name("idem")
        st1, b1, _ = s.post_message(sess["id"], "once only", idempotency_key=key)
        self.assertEqual(st1, 202, b1)
        st2, b2, _ = s.post_message(sess["id"], "once only", idempotency_key=key)
        self.assertIn(st2, (200, 202), b2)
        self.assertEqual(b2["message"]["id"], b1["message"]["id"])
        self.assertEqual(b2["run"]["id"], b1["run"]["id"])
        # with ?wait the replay answers when the run has ended
        st3, b3, _ = s.post_message(sess["id"], "once only", idempotency_key=key, wait=10)
        self.assertEqual(st3, 200, b3)
        self.assertEqual(b3["run"]["id"], b1["run"]["id"])
        self.assertEqual(b3["run"]["status"], "done")
        runs = s.list_all("/v1/sessions/%s/runs" % sess["id"])
        self.assertEqual([r["id"] for r in runs], [b1["run"]["id"]], "only one run")
        users = [m for m in s.list_all("/v1/sessions/%s/messages" % sess["id"])
                 if m["role"] == "user"]
        self.assertEqual(len(users), 1)
        # the same key in another session is another message
        st4, b4, _ = s.post_message(other["id"], "once only", idempotency_key=key, wait=10)
        self.assertEqual(st4, 200, b4)
        self.assertNotEqual(b4["message"]["id"], b1["message"]["id"])
        self.assertNotEqual(b4["run"]["id"], b1["run"]["id"])
        # a new key in the first session is a new message
        b5 = s.send(sess["id"], "again", idempotency_key=unique_name("idem"))
        self.assertNotEqual(b5["run"]["id"], b1["run"]["id"])
        self.assertEqual(len(s.list_all("/v1/sessions/%s/runs" % sess["id"])), 2)

    def test_idempotency_key_concurrent(self):
        s = self.server
        _, sess = self.new_session()
        key = unique_name("race")
        results = []
        lock = threading.Lock()

        def post():
            r = s.post_message(sess["id"], "racing", idempotency_key=key)
            with lock:
                results.append(r)

        threads = [threading.Thread(target=post) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = [r[0] for r in results]
        self.assertTrue(all(st in (200, 202) for st in statuses),
                        "concurrent posts with one key: %s" % [(r[0], r[1]) for r in results])
        self.assertEqual(len({r[1]["message"]["id"] for r in results}), 1)
        self.assertEqual(len({r[1]["run"]["id"] for r in results}), 1)
        s.wait_run(results[0][1]["run"]["id"])
        self.assertEqual(len(s.list_all("/v1/sessions/%s/runs" % sess["id"])), 1)

    # ------------------------------------------------------------------ busy policy

    def test_busy_reject(self):
        s = self.server
        _, sess = self.new_session(config={"busy": "reject"})
        st, first, _ = s.post_message(sess["id"], slow_message(100))
        self.assertEqual(st, 202, first)
        resp = s.post_message(sess["id"], "while busy")
        self.assertEqual(s.get_run(first["run"]["id"])["status"] in TERMINAL_RUN_STATES, False,
                         "the slow run ended too fast for this test to mean anything")
        self.assertError(resp, 409, "conflict", "message to a busy session of a rejecting agent")
        run = s.wait_run(first["run"]["id"], timeout=120)
        self.assertEqual(run["status"], "done")
        after = s.send(sess["id"], "now idle")
        self.assertEqual(after["run"]["status"], "done")
        users = [m["content"] for m in s.list_all("/v1/sessions/%s/messages" % sess["id"])
                 if m["role"] == "user"]
        self.assertNotIn("while busy", users, "a rejected message was written")
        self.assertEqual(len(users), 2)

    def test_busy_queue_default(self):
        s = self.server
        _, sess = self.new_session()
        st, first, _ = s.post_message(sess["id"], slow_message(20))
        self.assertEqual(st, 202, first)
        st, second, _ = s.post_message(sess["id"], "queued behind")
        self.assertEqual(st, 202, second)
        runs = wait_all(s, [first["run"]["id"], second["run"]["id"]], timeout=120)
        self.assertEqual([r["status"] for r in runs], ["done", "done"])

    def test_concurrent_posts_to_an_idle_session_run_one_at_a_time(self):
        # Intake reads the session before its unit and claims without reading it again, with an
        # update that checks the session is still idle. Eight messages posted at once all read
        # it idle; one claim may take it, the others must find it taken and be queued (their
        # units run again, reading first), and the runs then run one at a time. (A later claim
        # at intake is right when the run before it has already ended.)
        s = self.server
        _, sess = self.new_session()
        results, lock = [], threading.Lock()
        barrier = threading.Barrier(8)

        def post(i):
            barrier.wait()
            r = s.post_message(sess["id"], slow_message(5) if i == 0 else "message %d" % i)
            with lock:
                results.append(r)

        threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([r[0] for r in results], [202] * 8, [r[1] for r in results])
        runs = wait_all(s, [r[1]["run"]["id"] for r in results], timeout=120)
        self.assertEqual([r["status"] for r in runs], ["done"] * 8)
        spans = sorted((parse_time(r["started_at"]), parse_time(r["finished_at"])) for r in runs)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            self.assertLessEqual(end, start, "two runs of one session ran at once: %s" % spans)

    # ------------------------------------------------------------------ cancel

    def test_cancel_queued_and_done(self):
        s = self.server
        _, sess = self.new_session()
        st, first, _ = s.post_message(sess["id"], slow_message(100))
        self.assertEqual(st, 202, first)
        st, second, _ = s.post_message(sess["id"], "never runs")
        self.assertEqual(st, 202, second)
        self.assertEqual(second["run"]["status"], "queued")
        rid = second["run"]["id"]
        st, body, _ = s.request("POST", "/v1/runs/%s/cancel" % rid)
        self.assertIn(st, (200, 202), body)
        run = s.wait_run(rid, timeout=10)
        self.assertEqual(run["status"], "cancelled", run)
        self.assertIsNone(run["started_at"], "a cancelled queued run never started")
        self.assertEqual(s.steps(rid), [])
        self.assertError(s.request("POST", "/v1/runs/%s/cancel" % rid), 409, "conflict",
                         "cancel a cancelled run")
        done = s.wait_run(first["run"]["id"], timeout=120)
        self.assertEqual(done["status"], "done")
        self.assertError(s.request("POST", "/v1/runs/%s/cancel" % done["id"]), 409, "conflict",
                         "cancel a done run")
        types = [e["type"] for e in s.all_events() if e["run_id"] == rid]
        self.assertIn("run.cancelled@v1", types)
        self.assertNotIn("run.started@v1", types)

    def test_cancel_running(self):
        s = self.server
        _, sess = self.new_session()
        # A bigger run when a fast disk lets the first one end before the cancel arrives.
        for n in (300, 1200, 4800):
            st, body, _ = s.post_message(sess["id"], slow_message(n))
            self.assertEqual(st, 202, body)
            rid = body["run"]["id"]
            s.wait_run(rid, states=("running",) + TERMINAL_RUN_STATES, timeout=30)
            st, resp, _ = s.request("POST", "/v1/runs/%s/cancel" % rid)
            if st == 409 and s.get_run(rid)["status"] == "done":
                continue
            break
        self.assertIn(st, (200, 202), resp)
        run = s.wait_run(rid, timeout=120)
        self.assertEqual(run["status"], "cancelled", run)
        self.assertEqual((run["error"] or {}).get("code"), "cancelled", run)
        tools = [x for x in s.steps(rid) if x["kind"] == "tool"]
        self.assertLess(len(tools), n, "the run made all its %d tool calls despite the cancel "
                        "(a cancel should take effect at the next step boundary)" % n)
        # the session is usable again
        after = s.send(sess["id"], "after cancel")
        self.assertEqual(after["run"]["status"], "done")

    # ------------------------------------------------------------------ step limit

    def test_step_limit(self):
        s = self.server
        _, sess = self.new_session(config={"max_steps": 1})
        run = s.send(sess["id"], "/call time.now {}")["run"]
        self.assertEqual(run["status"], "failed", run)
        self.assertIsInstance(run["error"], dict)
        self.assertEqual(run["error"].get("code"), "step_limit", run)
        self.assertIsInstance(run["error"].get("message"), str)
        types = [e["type"] for e in s.all_events() if e["run_id"] == run["id"]]
        self.assertIn("run.failed@v1", types)
        self.assertNotIn("run.completed@v1", types)
        # a plain reply fits in one step
        ok = s.send(sess["id"], "just talk")["run"]
        self.assertEqual(ok["status"], "done", ok)


class TenantRunCapTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_TENANT_RUN_CAP": "2"})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_cap_429_with_retry_after(self):
        s = self.server
        agent = s.create_agent()
        sessions = [s.create_session(agent["id"])["id"] for _ in range(8)]
        results = [None] * len(sessions)
        barrier = threading.Barrier(len(sessions))

        def post(i):
            barrier.wait()
            results[i] = s.post_message(sessions[i], slow_message(200))

        threads = [threading.Thread(target=post, args=(i,)) for i in range(len(sessions))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        accepted = [r for r in results if r[0] == 202]
        limited = [r for r in results if r[0] == 429]
        self.assertEqual(len(accepted) + len(limited), len(results),
                         "unexpected answers: %s" % [(r[0], r[1]) for r in results])
        self.assertGreaterEqual(len(accepted), 1)
        self.assertTrue(limited, "no 429 with 8 concurrent runs and a cap of 2")
        for st, body, hdrs in limited:
            self.assertEqual(body["error"]["code"], "rate_limited", body)
            self.assertIn("retry-after", hdrs, "429 without Retry-After: %s" % hdrs)
            self.assertRegex(hdrs["retry-after"], r"^\d+$")
        # rejected posts wrote nothing
        for i, r in enumerate(results):
            if r[0] == 429:
                msgs = s.list_all("/v1/sessions/%s/messages" % sessions[i])
                self.assertEqual(msgs, [], "a 429 wrote a message")
        ended = wait_all(s, [r[1]["run"]["id"] for r in accepted], timeout=120)
        # at no moment were more than 2 runs of the tenant in flight (queued or running)
        marks = []
        for r in ended:
            marks.append((parse_time(r["created_at"]), 1))
            marks.append((parse_time(r["finished_at"]), -1))
        in_flight = peak = 0
        for _, d in sorted(marks, key=lambda m: (m[0], m[1])):  # ends before starts at a tie
            in_flight += d
            peak = max(peak, in_flight)
        self.assertLessEqual(peak, 2, "more than 2 runs in flight under a cap of 2: %s"
                             % [(r["created_at"], r["finished_at"]) for r in ended])
        # capacity is back
        body = s.send(sessions[0], "room again")
        self.assertEqual(body["run"]["status"], "done")


class ResumeAfterKillTest(KeelTestCase):
    """A run left running by a dead process resumes from its last recorded step."""

    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def kill_mid_run(self, make_message, sizes=(150, 600, 2400), min_tool_steps=5):
        """Posts make_message(n), kills the server with SIGKILL once the run has recorded a few
        tool steps, restarts it and waits for the run. Retries with a bigger n when the run ended
        before the kill landed (a fast disk). Returns (agent, session, run, n)."""
        s = self.server
        for n in sizes:
            agent = s.create_agent(tools=["time.now", "notes.append"])
            sess = s.create_session(agent["id"])
            st, body, _ = s.post_message(sess["id"], make_message(n))
            self.assertEqual(st, 202, body)
            rid = body["run"]["id"]
            deadline = time.monotonic() + 60
            ended = False
            while time.monotonic() < deadline:
                steps = s.steps(rid)
                if len([x for x in steps if x["kind"] == "tool"]) >= min_tool_steps:
                    break
                if s.get_run(rid)["status"] in TERMINAL_RUN_STATES:
                    ended = True
                    break
                time.sleep(0.005)
            if ended:
                continue
            s.kill9()
            s.start()
            run = s.wait_run(rid, timeout=120)
            if run["attempt"] < 2 and run["status"] == "done":
                continue  # it had finished before the kill landed
            return agent, sess, run, n
        self.fail("every run ended before it could be killed (sizes %s)" % (sizes,))

    def test_resume_pure_calls(self):
        s = self.server
        agent, sess, run, n = self.kill_mid_run(slow_message)
        self.assertEqual(run["status"], "done", run)
        self.assertGreaterEqual(run["attempt"], 2, "the run was not resumed after kill -9")
        steps = s.steps(run["id"])
        check_steps_contiguous(self, steps, "resumed run")
        kinds = collections.Counter(x["kind"] for x in steps)
        self.assertEqual(kinds["tool"], n, "every call recorded once: %s" % kinds)
        self.assertEqual(kinds["model"], 2, "the model step was repeated: %s" % kinds)
        calls = [x["input"]["call_id"] for x in steps if x["kind"] == "tool"]
        self.assertEqual(len(calls), len(set(calls)))
        self.assertTrue(all(x["status"] == "succeeded" for x in steps if x["kind"] == "tool"),
                        "a pure call is re-run, never unknown: %s"
                        % collections.Counter(x["status"] for x in steps))

    def test_resume_once_calls(self):
        s = self.server
        agent, sess, run, n = self.kill_mid_run(
            lambda n: "\n".join('/call notes.append {"line": "once-%d"}' % i for i in range(n)),
            sizes=(120, 480, 1920))
        self.assertEqual(run["status"], "done", run)
        steps = s.steps(run["id"])
        check_steps_contiguous(self, steps, "resumed run")
        tools = [x for x in steps if x["kind"] == "tool"]
        self.assertEqual(len(tools), n)
        statuses = collections.Counter(x["status"] for x in tools)
        self.assertLessEqual(set(statuses), {"succeeded", "unknown"}, statuses)
        with open(os.path.join(s.home, "workspaces", agent["id"], "notes.txt")) as f:
            lines = f.read().split("\n")
        self.assertEqual(lines[-1], "", "notes.txt ends in a partial line")
        lines = lines[:-1]
        counts = collections.Counter(lines)
        dups = {k: v for k, v in counts.items() if v > 1}
        self.assertFalse(dups, "a once call was repeated: %s" % dups)
        for x in tools:
            line = x["input"]["arguments"]["line"]
            if x["status"] == "succeeded":
                self.assertIn(line, counts, "succeeded call without its effect: %s" % line)
        known = {x["input"]["arguments"]["line"] for x in tools}
        self.assertLessEqual(set(lines), known)
        unknown_lines = {x["input"]["arguments"]["line"] for x in tools if x["status"] == "unknown"}
        succeeded_lines = {x["input"]["arguments"]["line"] for x in tools
                           if x["status"] == "succeeded"}
        self.assertLessEqual(set(lines) - succeeded_lines, unknown_lines)
        types = collections.Counter(e["type"] for e in s.all_events() if e["run_id"] == run["id"])
        self.assertEqual(types["tool.call.started@v1"], n, types)
        self.assertEqual(types["tool.call.unknown@v1"], statuses["unknown"], types)
        self.assertEqual(types["run.completed@v1"], 1, types)


if __name__ == "__main__":
    unittest.main()

"""PostgreSQL "bad input" for `keel serve`: a store that cannot be reached at start, and a store
lost while serving and then back.

  - At start: nothing listening on the store's port, a database that does not exist, a role that
    does not exist: `keel serve` exits non-zero within seconds (no hang, no crash) and says why,
    naming the server (host:port), the database or the role.
  - While serving: the test runs its own PostgreSQL cluster (scripts/pg-test-cluster.sh), does a
    few turns, then stops the cluster at once (`pause`: pg_ctl stop -m immediate, a crash). While
    it is down, every request that needs the store answers promptly `503` with the error code
    `unavailable`, /readyz is 503, /healthz stays 200 and the process stays alive. The cluster
    then comes back on the same data directory and port (`resume`): within seconds requests
    succeed again without restarting keel, every acknowledged message, run, step and event is
    still there as it was, nothing of the refused requests was written (a refused post retried
    with its Idempotency-Key is a first post), and new turns complete.
  - A run in flight when the database goes away (the local model with local_latency_ms) ends
    while the store is away; once it is back the run is claimed again after its lease
    (KEEL_LEASE_MS=2000) and completes once (attempt 2, one run.completed@v1, one answer). A live
    stream opened before the outage may end during it; resumed with Last-Event-ID it delivers
    every event of the session once, in log order.

Runs only with KEEL_TEST_STORE=postgres (ctest integration_pg.test_pg_outage). The clusters are
the test's own, not the server of KEEL_TEST_PG_ADMIN_URL: stopping that one would break the tests
running next to it."""

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, SseClient, keel_bin, sse_url, unique_name

ON_PG = os.environ.get("KEEL_TEST_STORE") == "postgres"
SKIP_REASON = ("stops and restarts a PostgreSQL cluster under keel: runs only with "
               "KEEL_TEST_STORE=postgres (ctest integration_pg.test_pg_outage)")
HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER_SCRIPT = os.path.normpath(os.path.join(HERE, "..", "..", "scripts", "pg-test-cluster.sh"))

START_FAIL_LIMIT_S = 15.0  # keel serve must give up on an unusable store within this
OUTAGE_ANSWER_LIMIT_S = 10.0  # each request during the outage must be answered within this
RECOVERY_LIMIT_S = 20.0  # after the database is back, requests must succeed within this


# stop() of every cluster and server started here, called again at exit: an interrupted run
# (SIGINT, or SIGTERM from scripts/with-pg.sh) skips the class cleanups, and a PostgreSQL left
# running would outlive it. Both stop()s are idempotent.
_TO_STOP = []


@atexit.register
def _stop_leftovers():
    while _TO_STOP:
        stop = _TO_STOP.pop()
        try:
            stop()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            sys.stderr.write("test_pg_outage: cleanup at exit failed: %s\n" % e)


def _interrupt(signum, frame):
    raise KeyboardInterrupt("signal %d" % signum)


if ON_PG and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _interrupt)


def free_port():
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


class PgCluster:
    """A private PostgreSQL cluster (scripts/pg-test-cluster.sh) with the runtime role `keel`
    and the owner role `keel_owner`."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="keel-pgoutage.")
        _TO_STOP.append(self.stop)
        try:
            self._script("start")
        except Exception:
            self.stop()
            raise
        self.url = self._read("url")  # postgres://keel@127.0.0.1:PORT/keel
        self.admin_url = self._read("admin-url")
        self.port = int(self._read("port"))

    def _read(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return f.read().strip()

    def _script(self, cmd):
        proc = subprocess.run(["bash", CLUSTER_SCRIPT, cmd, self.dir], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=120)
        if proc.returncode != 0:
            raise RuntimeError("pg-test-cluster.sh %s %s failed (%s): %s"
                               % (cmd, self.dir, proc.returncode, proc.stderr.strip()))

    def pause(self):
        """Stops the server at once (a crash), keeping the data."""
        self._script("pause")

    def resume(self):
        """Starts it again on the same data directory and port."""
        self._script("resume")

    def stop(self):
        """Stops it and removes everything; idempotent."""
        if os.path.exists(self.dir):
            self._script("stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def store_url(self, db, user="keel"):
        return "postgres://%s@127.0.0.1:%d/%s" % (user, self.port, db)

    def create_database(self, owner="keel_owner"):
        name = "keel_outage_" + unique_name("db").split("-", 1)[1]
        proc = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", self.admin_url, "-c",
                               'CREATE DATABASE %s OWNER "%s"' % (name, owner)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError("CREATE DATABASE failed: %s" % proc.stderr.strip())
        return name


def hermetic_env(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["KEEL_HOME"] = home
    return env


@unittest.skipUnless(ON_PG, SKIP_REASON)
class StartWithUnusableStoreTest(unittest.TestCase):
    """`keel serve` on a store it cannot use exits at once with a clear message."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = PgCluster()
        cls.addClassCleanup(cls.cluster.stop)

    def serve(self, store_url):
        """Runs keel serve on store_url; returns (exit status, stderr, seconds, description)."""
        home = tempfile.mkdtemp(prefix="keel-it-")
        cmd = [keel_bin(), "serve", "--home", home, "--listen", "127.0.0.1:0",
               "--store", store_url]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=hermetic_env(home), cwd=home)
        try:
            try:
                out, err = proc.communicate(timeout=START_FAIL_LIMIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                self.fail("keel serve --store %s still running after %.0fs (a hang instead of "
                          "an error)\nstdout: %s\nstderr: %s"
                          % (store_url, START_FAIL_LIMIT_S, out.decode(errors="replace"),
                             err.decode(errors="replace")))
            took = time.monotonic() - t0
            listened = os.path.exists(os.path.join(home, "listen.addr"))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            shutil.rmtree(home, ignore_errors=True)
        err = err.decode(errors="replace")
        what = "keel serve --store %s -> status %s after %.1fs, stderr %r" % (
            store_url, proc.returncode, took, err)
        self.assertGreater(proc.returncode, 0, "expected a non-zero exit (not a signal): " + what)
        self.assertFalse(listened, "it listened anyway: " + what)
        return proc.returncode, err, took, what

    def test_nothing_listening(self):
        port = free_port()  # closed again: nothing listens there
        _, err, took, what = self.serve("postgres://keel@127.0.0.1:%d/nope" % port)
        self.assertIn("cannot connect to PostgreSQL", err, what)
        self.assertIn("127.0.0.1:%d" % port, err, what)
        self.assertLess(took, 10.0, what)

    def test_database_does_not_exist(self):
        db = "keel_missing_" + unique_name("db").split("-", 1)[1]
        _, err, _, what = self.serve(self.cluster.store_url(db))
        self.assertIn("cannot connect to PostgreSQL", err, what)
        self.assertIn("127.0.0.1:%d" % self.cluster.port, err, what)
        self.assertIn('database "%s" does not exist' % db, err, what)

    def test_owner_role_is_refused_as_the_store_role(self):
        # The schema's owner could switch row-level security off: keel does not run as it.
        db = self.cluster.create_database()
        owner_url = self.cluster.store_url(db, user="keel_owner")
        proc = subprocess.run([keel_bin(), "store", "migrate", "--store",
                               self.cluster.store_url(db), "--owner-url", owner_url],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=60,
                              env=hermetic_env(tempfile.mkdtemp(prefix="keel-it-")))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        _, err, _, what = self.serve(owner_url)
        self.assertIn("PostgreSQL role 'keel_owner' owns", err, what)
        self.assertIn("row-level security", err, what)

    def test_unmigrated_database_is_refused_without_the_owner(self):
        db = self.cluster.create_database()
        _, err, _, what = self.serve(self.cluster.store_url(db))
        self.assertIn("has no keel schema yet", err, what)
        self.assertIn("KEEL_STORE_OWNER", err, what)

    def test_role_does_not_exist(self):
        role = "nobody_" + unique_name("r").split("-", 1)[1]
        _, err, _, what = self.serve(self.cluster.store_url("keel", user=role))
        self.assertIn("cannot connect to PostgreSQL", err, what)
        self.assertIn('role "%s" does not exist' % role, err, what)


@unittest.skipUnless(ON_PG, SKIP_REASON)
class StoreOutageTest(KeelTestCase):
    """The database goes away under a running keel, and comes back."""

    @classmethod
    def setUpClass(cls):
        # Class cleanups run after KeelTestCase has printed the log of a failed test, and in
        # reverse order: keel stops before its database does, also when setUpClass fails.
        cls.cluster = PgCluster()
        cls.addClassCleanup(cls.cluster.stop)
        db = cls.cluster.create_database()
        # A short lease: a run cut off by the outage is claimed again soon after it ends.
        cls.server = KeelServer(store_url=cls.cluster.store_url(db), env={"KEEL_LEASE_MS": "2000"},
                                start=False)
        _TO_STOP.append(cls.server.stop)
        cls.addClassCleanup(cls.server.stop)
        cls.server.start()

    def go_down(self):
        self.addCleanup(self.cluster.resume)  # a failing test leaves the cluster up for the next
        self.cluster.pause()

    def come_back(self):
        """Starts the cluster again and waits until keel serves store requests again; returns
        the seconds that took."""
        s = self.server
        self.cluster.resume()
        t0 = time.monotonic()
        last = None
        while True:
            try:
                ready = s.request("GET", "/readyz", token=None, timeout=5)
                agents = s.request("GET", "/v1/agents", timeout=5)
                last = (ready[:2], agents[:2])
                if ready[0] == 200 and agents[0] == 200:
                    break
            except Exception as e:  # noqa: BLE001 - reported below if it lasts
                last = repr(e)
            if time.monotonic() - t0 > RECOVERY_LIMIT_S:
                self.fail("keel did not recover within %.0fs of the database coming back; "
                          "last: %r" % (RECOVERY_LIMIT_S, last))
            time.sleep(0.2)
        self.assertTrue(s.alive(), "keel exited")
        self.assertEqual(s.starts, 1, "keel was restarted")
        return time.monotonic() - t0

    def timed_request(self, method, path, body=None, token="default", headers=None):
        """One request during the outage: must be answered within OUTAGE_ANSWER_LIMIT_S."""
        kw = {} if token == "default" else {"token": token}
        t0 = time.monotonic()
        try:
            resp = self.server.request(method, path, body=body, headers=headers,
                                       timeout=OUTAGE_ANSWER_LIMIT_S + 5, **kw)
        except Exception as e:  # noqa: BLE001 - a timeout or a reset is the failure
            self.fail("%s %s while the database is down: no answer after %.1fs (%r)"
                      % (method, path, time.monotonic() - t0, e))
        took = time.monotonic() - t0
        self.assertLess(took, OUTAGE_ANSWER_LIMIT_S, "%s %s while the database is down took "
                        "%.1fs: %r" % (method, path, took, resp[:2]))
        return resp

    def snapshot(self, session_id):
        s = self.server
        return {
            "messages": s.list_all("/v1/sessions/%s/messages" % session_id),
            "runs": s.list_all("/v1/sessions/%s/runs" % session_id),
            "agents": s.list_all("/v1/agents"),
            "events": s.all_events(),
        }

    def assert_origin_seq_gapless(self):
        events = self.server.all_events()
        origins = {e["origin"] for e in events}
        self.assertEqual(len(origins), 1, "one node, one origin: %s" % origins)
        seqs = [e["origin_seq"] for e in events]
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)), "origin_seq is not gapless")

    def test_requests_answer_503_while_down_and_succeed_once_back(self):
        s = self.server
        agent = s.create_agent(tools=["time.now"])
        session = s.create_session(agent["id"])
        acked = []  # (message, run) of each acknowledged turn
        for content in ("hello", "/call time.now {}", "hello again"):
            body = s.send(session["id"], content)
            self.assertEqual(body["run"]["status"], "done", "turn %r: %r" % (content, body))
            acked.append((body["message"], body["run"]))
        steps_before = {run["id"]: s.steps(run["id"]) for _, run in acked}
        before = self.snapshot(session["id"])
        self.assertEqual(len(before["messages"]), 2 * len(acked), "user + assistant messages")

        # ---- the database goes away
        self.go_down()
        retry_key = unique_name("outage-key")
        down = [
            ("GET", "/v1/agents", None, None),
            ("GET", "/v1/agents/%s" % agent["id"], None, None),
            ("POST", "/v1/agents", {"name": unique_name("agent"), "model": "local",
                                    "instructions": "x", "tools": [], "config": {}}, None),
            ("GET", "/v1/sessions/%s/messages" % session["id"], None, None),
            ("POST", "/v1/sessions/%s/messages" % session["id"], {"content": "lost"}, None),
            ("POST", "/v1/sessions/%s/messages?wait=5" % session["id"], {"content": "retried"},
             {"Idempotency-Key": retry_key}),
            ("GET", "/v1/runs/%s" % acked[0][1]["id"], None, None),
            ("GET", "/v1/runs/%s/steps" % acked[1][1]["id"], None, None),
            ("GET", "/v1/events", None, None),
            ("GET", "/v1/stream?session_id=%s" % session["id"], None, None),
        ]
        for rnd in range(2):  # twice: also once the pooled connections are known to be gone
            for method, path, body, headers in down:
                resp = self.timed_request(method, path, body, headers=headers)
                self.assertError(resp, 503, "unavailable",
                                 "round %d: %s %s while the database is down" % (rnd, method, path))
            resp = self.timed_request("GET", "/readyz", token=None)
            self.assertError(resp, 503, "unavailable", "GET /readyz while the database is down")
            self.assertIn("store not ready", resp[1]["error"]["message"])
            status, body, _ = self.timed_request("GET", "/healthz", token=None)
            self.assertEqual(status, 200, "/healthz while the database is down: %r" % body)
            self.assertTrue(s.alive(), "keel exited while the database was down\n" + s.log_tail())
        time.sleep(1.5)  # a few rounds of the dispatcher and lease keeper against a dead store
        self.assertTrue(s.alive(), "keel exited while the database was down\n" + s.log_tail())

        # ---- the database comes back
        recovered_s = self.come_back()
        self.assertLess(recovered_s, RECOVERY_LIMIT_S)

        # Everything acknowledged is there as it was; nothing refused was written.
        after = self.snapshot(session["id"])
        self.assertEqual(after["messages"], before["messages"], "the session's messages changed")
        self.assertEqual(after["runs"], before["runs"], "the session's runs changed")
        self.assertEqual(after["agents"], before["agents"], "the agents changed")
        self.assertEqual(after["events"], before["events"], "the event log changed")
        for message, run in acked:
            got = s.get_run(run["id"])
            self.assertEqual(got["status"], "done")
            self.assertEqual(got["output"], run["output"])
            self.assertEqual(got["message_id"], message["id"])
            self.assertEqual(s.steps(run["id"]), steps_before[run["id"]], "steps of " + run["id"])

        # The client retries the refused post with its Idempotency-Key: a first, real post.
        status, body, _ = s.post_message(session["id"], "retried", wait=10,
                                         idempotency_key=retry_key)
        self.assertEqual(status, 200, body)
        self.assertFalse(body.get("replayed"), "the refused post was written after all: %r" % body)
        self.assertEqual(body["run"]["status"], "done", body)
        again = s.send(session["id"], "retried", idempotency_key=retry_key)
        self.assertTrue(again.get("replayed"), again)
        self.assertEqual(again["run"]["id"], body["run"]["id"])
        # New turns complete, on the same session and on a new one.
        for content in ("back again", "/call time.now {}"):
            body = s.send(session["id"], content)
            self.assertEqual(body["run"]["status"], "done", "turn %r after recovery: %r"
                             % (content, body))
        other = s.create_session(agent["id"])
        self.assertEqual(s.send(other["id"], "new session")["run"]["status"], "done")
        final = s.list_all("/v1/sessions/%s/messages" % session["id"])
        self.assertEqual(final[:len(before["messages"])], before["messages"])
        self.assertEqual([m["content"] for m in final[len(before["messages"]):]
                          if m["role"] == "user"], ["retried", "back again", "/call time.now {}"])
        events = s.all_events()
        self.assertEqual(events[:len(before["events"])], before["events"])
        self.assert_origin_seq_gapless()

    def test_a_stuck_store_read_does_not_stall_the_server(self):
        """Store reads run off the event loop: while an operator holds a lock that blocks every
        read of `runs`, requests that do not need the store still answer at once."""
        s = self.server
        db_url = self.cluster.admin_url.rsplit("/", 1)[0] + "/" + s.store_url.rsplit("/", 1)[1]
        locker = subprocess.Popen(
            ["psql", "-X", "-q", db_url, "-c",
             "BEGIN; LOCK TABLE runs IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4); COMMIT;"],
            stdout=subprocess.DEVNULL)
        self.addCleanup(locker.wait)
        time.sleep(1.0)  # the lock is held, and the run dispatcher's poll is stuck behind it
        for _ in range(3):
            t0 = time.monotonic()
            status, body, _ = s.request("GET", "/healthz", token=None, timeout=10)
            took = time.monotonic() - t0
            self.assertEqual(status, 200, body)
            self.assertLess(took, 0.5, "/healthz took %.1fs while a store read waited" % took)
        locker.wait(timeout=30)
        status, _, _ = s.request("GET", "/v1/agents", timeout=10)
        self.assertEqual(status, 200)

    def test_run_in_flight_resumes_after_the_database_is_back(self):
        s = self.server
        latency_ms = 1000
        agent = s.create_agent(config={"local_latency_ms": latency_ms})
        session = s.create_session(agent["id"])
        start = s.all_events()
        cursor = start[-1]["position"] if start else 0
        sse = SseClient(sse_url(s, session_id=session["id"], after=cursor), s.token)
        self.addCleanup(sse.close)
        self.assertEqual(sse.status, 200)

        status, body, _ = s.post_message(session["id"], "slow turn")
        self.assertEqual(status, 202, body)
        run_id = body["run"]["id"]
        self.assertIn(body["run"]["status"], ("queued", "running"), body)
        # Down at once, for longer than the model takes (the run ends while the store is away,
        # so its end cannot be recorded) and longer than the lease (nobody renews it).
        self.go_down()
        down_at = time.monotonic()
        time.sleep(0.5)
        self.assertError(self.timed_request("GET", "/v1/runs/%s" % run_id), 503, "unavailable",
                         "GET the run while the database is down")
        time.sleep(max(0.0, 4.0 - (time.monotonic() - down_at)))
        self.assertTrue(s.alive(), "keel exited while the database was down\n" + s.log_tail())
        self.come_back()

        # Claimed again once its lease had run out, and completed: once.
        run = s.wait_run(run_id, timeout=30)
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["attempt"], 2, "the first attempt ended while the database was "
                         "down, so a second one should have completed the run: %r" % run)
        steps = s.steps(run_id)
        self.assertEqual([x["seq"] for x in steps], [1], "one model step: %r" % steps)
        messages = s.list_all("/v1/sessions/%s/messages" % session["id"])
        self.assertEqual([(m["role"], m["run_id"]) for m in messages],
                         [("user", run_id), ("assistant", run_id)], messages)
        self.assertEqual(messages[1]["content"], run["output"])
        log = [e for e in s.all_events(after=cursor) if e.get("session_id") == session["id"]]
        types = [e["type"] for e in log if e.get("run_id") == run_id]
        self.assertEqual(types.count("run.completed@v1"), 1, types)
        self.assertEqual([e["payload"] for e in log if e["type"] == "run.started@v1"],
                         [{"attempt": 1, "resumed": False}, {"attempt": 2, "resumed": True}])

        # The live stream: it may end while the store is away (a read fails); a client that
        # comes back with the last id it saw gets every event once, in order.
        seen = []

        def done(ev):
            return ev.get("event") == "run.completed@v1" and ev["data"].get("run_id") == run_id

        while not seen or not done(seen[-1]):
            ev = sse.next(timeout=10)
            self.assertIsNotNone(ev, "the stream went quiet without the run's end; got %s"
                                 % [e["id"] for e in seen])
            if ev.get("closed"):
                sse.close()
                last = seen[-1]["id"] if seen else str(cursor)
                sse = SseClient(sse_url(s, session_id=session["id"]), s.token,
                                last_event_id=last)
                self.addCleanup(sse.close)
                self.assertEqual(sse.status, 200, "reconnecting the stream after the outage")
                continue
            if ev.get("id") is not None:
                seen.append(ev)
        self.assertEqual([int(e["id"]) for e in seen], [e["position"] for e in log],
                         "the stream across the outage differs from the log")
        self.assertEqual(s.send(session["id"], "and after")["run"]["status"], "done")
        self.assert_origin_seq_gapless()


if __name__ == "__main__":
    unittest.main()

"""Resume time on PostgreSQL: two nodes on one database; node A takes N runs whose model steps
are slow (config.local_latency_ms), is killed with SIGKILL while they run, and node B resumes
them once their leases have expired. Measured from the kill to each `run.started@v1` with
`resumed: true` seen on B's event stream; the target is the lease time plus one second.

Run by scripts/bench-pg.sh (which provides the PostgreSQL server):
    KEEL_TEST_PG_ADMIN_URL=... KEEL_BIN=build/keel python3 bench/resume_bench.py
Environment: RESUME_RUNS (default 20), RESUME_LEASE_MS (default 2000).
"""

import os
import statistics
import sys
import time

os.environ["KEEL_TEST_STORE"] = "postgres"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from keel_harness import KeelServer, SseClient, sse_url  # noqa: E402

RUNS = int(os.environ.get("RESUME_RUNS", "20"))
LEASE_MS = int(os.environ.get("RESUME_LEASE_MS", "2000"))
LATENCY_MS = 3000


def main():
    env = {"KEEL_LEASE_MS": str(LEASE_MS)}
    a = KeelServer(env=env)
    b = KeelServer(env=env, store_url=a.store_url, token=a.token)
    try:
        agent = a.create_agent(config={"local_latency_ms": LATENCY_MS})
        sessions = [a.create_session(agent["id"])["id"] for _ in range(RUNS)]
        runs = [a.post_message(s, "hello")[1]["run"]["id"] for s in sessions]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if all(a.get_run(r)["status"] == "running" for r in runs):
                break
            time.sleep(0.02)
        else:
            sys.exit("resume_bench: A did not start every run within 10s")
        sse = SseClient(sse_url(b, agent_id=agent["id"]), b.token)
        time.sleep(0.3)  # B's stream is live
        a.kill9()
        killed = time.monotonic()
        resumed = {}
        while len(resumed) < RUNS and time.monotonic() - killed < LEASE_MS / 1000 + 30:
            ev = sse.next(timeout=1)
            if ev is None or ev.get("event") != "run.started@v1":
                continue
            if ev["data"]["payload"].get("resumed"):
                resumed.setdefault(ev["data"]["run_id"], time.monotonic() - killed)
        sse.close()
        if len(resumed) < RUNS:
            sys.exit("resume_bench: B resumed only %d of %d runs" % (len(resumed), RUNS))
        done = [b.wait_run(r, timeout=30)["status"] for r in runs]
        times = sorted(resumed.values())
        target = LEASE_MS / 1000 + 1
        print("  %d runs killed with node A; lease %.1f s. Resumed on B after: median %.2f s, "
              "max %.2f s (target <= lease + 1 s = %.1f s: %s); all done: %s"
              % (RUNS, LEASE_MS / 1000, statistics.median(times), times[-1], target,
                 "pass" if times[-1] <= target else "FAIL", all(s == "done" for s in done)))
    finally:
        b.stop()
        a.stop()


if __name__ == "__main__":
    main()

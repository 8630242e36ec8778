"""Noisy neighbours: tenant B's turn latency while tenant A saturates the node, against B's own
latency on an idle node. Target: B's p99 under load < 3x its idle p99.

B's turn calls one blocking tool (`memory.search`, on the tool pool) and answers. A, meanwhile:
  - posts FAIR_SLOW_RUNS runs whose model step is slow (local model, config.local_latency_ms),
    each in its own session, to fill run slots;
  - posts FAIR_SLOW_TOOLS runs that each run `exec sleep` in the sandbox, to fill tool threads;
  - holds FAIR_CONNECTIONS open connections (SSE streams) from 127.0.0.2, a source address of
    its own, as connections are bounded per client address.
The figures are B's turns measured one after another (POST ...?wait=), FAIR_TURNS each phase.

    KEEL_BIN=build/keel python3 bench/fair_bench.py          (scripts/bench.sh: BENCH_ONLY=fair)
Environment: FAIR_TURNS (default 200), FAIR_SLOW_RUNS (default 300), FAIR_SLOW_TOOLS (default
40), FAIR_CONNECTIONS (default 200), KEEL_TEST_STORE as for the integration tests. Needs
bubblewrap for the sandboxed sleeps. Prints one line per figure: NAME VALUE.
"""

import json
import os
import signal
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from keel_harness import KeelServer, Tenant  # noqa: E402

TURNS = int(os.environ.get("FAIR_TURNS", "200"))
SLOW_RUNS = int(os.environ.get("FAIR_SLOW_RUNS", "300"))
SLOW_TOOLS = int(os.environ.get("FAIR_SLOW_TOOLS", "40"))
CONNECTIONS = int(os.environ.get("FAIR_CONNECTIONS", "200"))
SLEEP = "%d.%03d" % (300 + os.getpid() % 100, os.getpid() % 1000)  # this bench's sleeps only
TURN_TIMEOUT_S = 30


def sleeping():
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")[:-1]
        except OSError:
            continue
        if argv == [b"sleep", SLEEP.encode()]:
            pids.append(int(entry))
    return pids


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


def turns(server, tenant, session_id, count):
    """Latencies (s) of `count` turns of B; a turn not done within TURN_TIMEOUT_S counts as that."""
    out = []
    command = "/call memory.search %s" % json.dumps({"query": "weather"})
    for _ in range(count):
        started = time.monotonic()
        status, body, _ = server.post_message(session_id, command, wait=TURN_TIMEOUT_S,
                                              token=tenant.token, timeout=TURN_TIMEOUT_S + 10)
        elapsed = time.monotonic() - started
        if status not in (200, 202) or body["run"]["status"] != "done":
            # Queued or still running after the wait: B was starved.
            elapsed = max(elapsed, TURN_TIMEOUT_S)
            server.ok("POST", "/v1/runs/%s/cancel" % body["run"]["id"], token=tenant.token,
                      expect=(200, 202, 409))
            time.sleep(1)  # let the cancel land before the session's next turn
        out.append(elapsed)
    return out


def hold_connections(server, tenant, count, stop):
    """Opens `count` SSE streams from 127.0.0.2 and keeps them until `stop` is set."""
    host, port = server.addr.rsplit(":", 1)
    socks = []
    for _ in range(count):
        try:
            s = socket.create_connection((host, int(port)), timeout=5,
                                         source_address=("127.0.0.2", 0))
            s.sendall(("GET /v1/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                       "Accept: text/event-stream\r\n\r\n" % tenant.token).encode())
            socks.append(s)
        except OSError:
            break
    stop.wait()
    for s in socks:
        s.close()
    return len(socks)


def main():
    server = KeelServer()
    noisy = Tenant(server)
    quiet = Tenant(server)
    try:
        agent_b = server.create_agent(tools=["memory.search"], token=quiet.token)
        session_b = server.create_session(agent_b["id"], token=quiet.token)["id"]
        turns(server, quiet, session_b, 10)  # warm-up
        idle = turns(server, quiet, session_b, TURNS)

        slow_model = server.create_agent(config={"local_latency_ms": 60000}, token=noisy.token)
        slow_tool = server.create_agent(tools=["exec"], config={"exec_backend": "sandbox"},
                                        token=noisy.token)
        command = "/call exec %s" % json.dumps({"command": "sleep " + SLEEP, "timeout_s": 300})
        posted = {"queued": 0, "refused": 0}
        for agent, content, count in ((slow_tool, command, SLOW_TOOLS),
                                      (slow_model, "hello", SLOW_RUNS)):
            for _ in range(count):
                sid = server.create_session(agent["id"], token=noisy.token)["id"]
                status, _, _ = server.post_message(sid, content, token=noisy.token)
                posted["queued" if status == 202 else "refused"] += 1
        stop = threading.Event()
        held = {}
        holder = threading.Thread(
            target=lambda: held.setdefault("n", hold_connections(server, noisy, CONNECTIONS, stop)))
        holder.start()
        deadline = time.monotonic() + 30
        while len(sleeping()) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # A's runs are claimed and its commands started
        metrics = server.ok("GET", "/metrics")
        busy = len(sleeping())
        loaded = turns(server, quiet, session_b, TURNS)
        stop.set()
        holder.join()

        p99_idle, p99_loaded = percentile(idle, 99), percentile(loaded, 99)
        print("fair_idle_p50_ms %.1f" % (statistics.median(idle) * 1000))
        print("fair_idle_p99_ms %.1f" % (p99_idle * 1000))
        print("fair_loaded_p50_ms %.1f" % (statistics.median(loaded) * 1000))
        print("fair_loaded_p99_ms %.1f" % (p99_loaded * 1000))
        print("fair_p99_ratio %.2f" % (p99_loaded / p99_idle))
        print("fair_starved_turns %d" % sum(1 for x in loaded if x >= TURN_TIMEOUT_S))
        print("fair_noisy_runs_posted %d" % posted["queued"])
        print("fair_noisy_sleeps_running %d" % busy)
        print("fair_noisy_connections %d" % held.get("n", 0))
        running = [line for line in str(metrics).splitlines()
                   if line.startswith("keel_runs_executing")]
        print("fair_runs_executing %s" % (running[0].split()[-1] if running else "?"))
    finally:
        for pid in sleeping():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        server.kill9()
        server.stop()


if __name__ == "__main__":
    main()

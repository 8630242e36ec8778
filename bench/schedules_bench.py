#!/usr/bin/env python3
"""Schedules at scale against a real `keel serve`: N active one-shot schedules (default 100,000)
created through the API, the slots of all of them (or of --due of them; the others stay active
with a slot a day later) spread evenly over a window that starts after a quiet period. Reports

  * the server's CPU while idle between slots: utime+stime from /proc/PID/stat over the quiet
    period (--idle seconds, default 30), with all N schedules active;
  * the lateness of firing, p50/p99/max: when a slot's prompt was posted (its schedule.fired@v1
    event, written in the unit of work that records the slot) minus the slot;
  * how many slots fired, and how many fired more than once (must be 0).

Each firing posts into a new session, so every slot is a real turn on the local model (message,
run, steps) competing with the firing for the store.

    python3 bench/schedules_bench.py --keel build/keel [--count 100000] [--window 200]
        [--idle 30] [--store postgres://...]

Prints a RESULT line (key=value) last. Stdlib only; the server gets a temporary KEEL_HOME.
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone


def rfc3339(ms):
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (ms % 1000)


def parse_ms(text):
    dt = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    return int(round(dt.timestamp() * 1000))


class Api:
    """One keep-alive connection; reconnects once when the server closed an idle one."""

    def __init__(self, addr, token):
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        self.token = token

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": "Bearer " + self.token}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                text = resp.read()
                return resp.status, (json.loads(text) if text else None)
            except (http.client.RemoteDisconnected, ConnectionError, BrokenPipeError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
                if attempt:
                    raise


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(p / 100 * (len(sorted_values) - 1)))))
    return sorted_values[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", default="build/keel")
    ap.add_argument("--count", type=int, default=100000)
    ap.add_argument("--window", type=float, default=200.0, help="seconds the slots spread over")
    ap.add_argument("--due", type=int, default=0,
                    help="how many of the schedules have their slot in the window (default: "
                         "all); the others stay active with a slot a day later")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle CPU measurement")
    ap.add_argument("--rate", type=float, default=800.0,
                    help="assumed creation rate (schedules/s) to place the first slot")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--store", default="", help="store URL (default: SQLite in KEEL_HOME)")
    ap.add_argument("--cpus", default="", help="taskset CPU list for the server")
    args = ap.parse_args()

    home = tempfile.mkdtemp(prefix="keel-sched-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update({"KEEL_HOME": home, "KEEL_TENANT_RUN_CAP": "1000000"})
    cmd = [args.keel, "serve", "--home", home, "--listen", "127.0.0.1:0"]
    if args.store:
        cmd += ["--store", args.store]
    if args.cpus:
        cmd = ["taskset", "-c", args.cpus] + cmd
    log = open(os.path.join(home, "serve.log"), "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        addr_file = os.path.join(home, "listen.addr")
        for _ in range(300):
            if os.path.exists(addr_file) and open(addr_file).read().strip().split(":")[-1] not in ("", "0"):
                break
            time.sleep(0.1)
        addr = open(addr_file).read().strip()
        token = open(os.path.join(home, "owner.token")).read().strip()
        api = Api(addr, token)
        for _ in range(100):
            try:
                if api.call("GET", "/readyz")[0] == 200:
                    break
            except OSError:
                api = Api(addr, token)
            time.sleep(0.1)
        status, agent = api.call("POST", "/v1/agents", {"name": "bench", "model": "local"})
        assert status == 201, agent

        # Slots: evenly over [first, first + window), first placed after creation and the quiet
        # period (creation at --rate per second is assumed; a slower one eats into the quiet).
        t0 = int(time.time() * 1000)
        first = t0 + int((args.count / args.rate + args.idle + 5) * 1000)
        due = args.due or args.count
        step = args.window * 1000 / due
        errors = []

        def create(part):
            a = Api(addr, token)
            for i in range(part, args.count, args.threads):
                at = first + int(i * step) if i < due else first + 86_400_000 + i
                body = {"agent_id": agent["id"], "at": rfc3339(at),
                        "prompt": "slot %d" % i, "missed": "catch_up_one"}
                st, b = a.call("POST", "/v1/schedules", body)
                if st != 201:
                    errors.append((st, b))
                    return

        threads = [threading.Thread(target=create, args=(p,)) for p in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            sys.exit("creating schedules failed: %r" % (errors[:3],))
        created_s = time.time() - t0 / 1000
        print("created %d schedules in %.1f s (%.0f/s)" % (args.count, created_s,
                                                            args.count / created_s), flush=True)

        # Idle: every schedule active, none due yet.
        quiet = (first - int(time.time() * 1000)) / 1000 - 2
        idle = max(0.0, min(args.idle, quiet))
        if idle < args.idle:
            print("quiet period shortened to %.1f s (creation was slower than --rate)" % idle)
        hz = os.sysconf("SC_CLK_TCK")
        c0, w0 = cpu_ticks(proc.pid), time.time()
        time.sleep(idle)
        c1, w1 = cpu_ticks(proc.pid), time.time()
        idle_pct = 100.0 * (c1 - c0) / hz / max(w1 - w0, 1e-9)
        print("idle CPU over %.1f s: %.2f%% of one core" % (w1 - w0, idle_pct), flush=True)

        # Firing: wait for the window to pass, then until every slot is recorded.
        end = first + int(args.window * 1000)
        c2 = cpu_ticks(proc.pid)
        while time.time() * 1000 < end + 2000:
            time.sleep(1)
        # Read the log: schedule.fired@v1 events (slot in the payload, posted at occurred_at).
        late = []
        seen = {}
        after = 0
        deadline = time.time() + 600
        while time.time() < deadline:
            st, page = api.call("GET", "/v1/events?after=%d&limit=500" % after)
            assert st == 200, page
            items = page["items"]
            for e in items:
                if e["type"] == "schedule.fired@v1":
                    sid = e["payload"]["schedule_id"]
                    seen[sid] = seen.get(sid, 0) + 1
                    late.append(parse_ms(e["occurred_at"]) - parse_ms(e["payload"]["slot"]))
            if items:
                after = items[-1]["position"]
            if not items or len(items) < 500:
                if len(seen) >= due:
                    break
                time.sleep(1)
        c3 = cpu_ticks(proc.pid)
        late.sort()
        twice = sum(1 for n in seen.values() if n > 1)
        busy_cpu = (c3 - c2) / hz
        print("fired %d of %d slots (%d more than once); lateness p50 %d ms, p99 %d ms, "
              "max %d ms; CPU while firing %.1f s" % (len(seen), due, twice,
                                                      percentile(late, 50), percentile(late, 99),
                                                      late[-1] if late else -1, busy_cpu))
        print("RESULT schedules=%d due=%d created_per_s=%.0f idle_s=%.1f idle_cpu_pct=%.2f "
              "fired=%d fired_twice=%d lateness_p50_ms=%d lateness_p99_ms=%d lateness_max_ms=%d "
              "window_s=%.0f" % (args.count, due, args.count / created_s, w1 - w0, idle_pct,
                                 len(seen), twice, percentile(late, 50), percentile(late, 99),
                                 late[-1] if late else -1, args.window))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if not os.environ.get("KEEL_BENCH_KEEP"):
            shutil.rmtree(home, ignore_errors=True)
        else:
            print("kept", home)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""make bench-quick: the kernel's guard figures in under a minute, against bench/baseline.json.

    python3 bench/quick.py [BUILD_DIR] [--update] [--seconds N] [--keel OTHER_BINARY]

Measures, in one run on this machine:
  - raw SQLite (keel_bench BM_RawSqliteAppend, one producer): fsync'd one-row commits per
    second, and rows per second and CPU per row at 100 rows a commit: the yardsticks the other
    figures are divided by (latency by the commit time; throughput and CPU by the row's);
  - the event-append ratio: Keel's store vs raw SQLite, 64 producers (keel_bench);
  - end-to-end turns over HTTP on the local model (keel_loadgen against `keel serve`, server and
    load generator pinned to different CPUs when there are two): concurrency 1 (p50), concurrency
    64 with the response cache on and distinct prompts (every call misses), with the cache off,
    with the built-in audit-log and redaction plugins on every agent (against the same load without
    them, measured just before on the same store), and through the OpenAI
    provider against keel_fake_openai (pinned with the load generator; it answers at once);
    server CPU per turn (user + system time of all its threads);
  - one session's turn 1,000 against its turn 10 (medians of its last twenty turns and of its
    turns 6-25), with history_limit raised so nothing is cut.

Each figure is printed with its ratio to the raw SQLite yardstick of the same run, next to the
ratio in bench/baseline.json, and flagged FLAG when it is more than 15 % worse; the exit status is
1 when any is. Ratios travel between machines where absolute figures do not. `--update` writes this
run's ratios as the new baseline: do it only with a sentence in the commit saying why.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "bench", "baseline.json")
TOLERANCE = 0.15

PLUGINS = [
    {"manifest": {"id": "audit", "name": "Audit", "version": "1", "kind": "builtin",
                  "builtin": "audit-log",
                  "events": ["session.opened@v1", "model.after@v1", "tool.after@v2",
                             "agent.started@v1"]}},
    {"manifest": {"id": "redact", "name": "Redact", "version": "1", "kind": "builtin",
                  "builtin": "redaction", "events": ["model.before@v1"]},
     "config": {"patterns": ["[0-9]{4}-[0-9]{4}-[0-9]{4}-[0-9]{4}", "sk-[A-Za-z0-9]{20,}"]}},
]


def enable_plugins(url, token_file):
    """Registers PLUGINS and enables them on every agent of the server at `url`."""
    token = open(token_file).read().split()[0]
    for p in PLUGINS:
        for path, body in (("/v1/plugins", p),
                           (f"/v1/plugins/{p['manifest']['id']}/enable", {"agent_id": "*"})):
            req = urllib.request.Request(url + path, method="POST", data=json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()


def pins():
    """taskset prefixes for the server and the load generator (different CPUs when possible)."""
    n = os.cpu_count() or 1
    if n < 2 or not shutil.which("taskset"):
        return [], []
    server = "0" if n == 2 else f"0-{n - 2}"
    return ["taskset", "-c", server], ["taskset", "-c", str(n - 1)]


class Server:
    def __init__(self, keel, home, pin, config="", env=None):
        os.makedirs(home, exist_ok=True)
        if config:
            with open(os.path.join(home, "keel.toml"), "w") as f:
                f.write(config)
        self.home = home
        self.log = open(os.path.join(home, "serve.log"), "w")
        self.proc = subprocess.Popen(pin + [keel, "serve", "--home", home, "--listen", "127.0.0.1:0"],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        addr_file = os.path.join(home, "listen.addr")
        for _ in range(300):
            if os.path.exists(addr_file) and os.path.getsize(addr_file) > 0:
                break
            if self.proc.poll() is not None:
                sys.exit("bench-quick: keel serve exited:\n" + open(self.log.name).read())
            time.sleep(0.05)
        self.addr = open(addr_file).read().split()[0]
        self.url = f"http://{self.addr}"
        self.token_file = os.path.join(home, "owner.token")
        for _ in range(200):
            try:
                urllib.request.urlopen(self.url + "/readyz", timeout=1)
                return
            except OSError:
                time.sleep(0.05)
        sys.exit(f"bench-quick: keel serve at {self.addr} never became ready")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def loadgen(build, pin, server, *args):
    cmd = pin + [os.path.join(build, "bench", "keel_loadgen"), "--url", server.url,
                 "--token-file", server.token_file, "--server-pid", str(server.proc.pid)] + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
    if out.returncode != 0 or not line:
        sys.exit("bench-quick: keel_loadgen failed: " + " ".join(cmd) + "\n" + out.stdout + out.stderr)
    return {k: float(v) for k, v in (f.split("=", 1) for f in line.split()[1:])}


def event_bench(build, work):
    """The yardsticks: raw SQLite's fsync'd one-row commits per second (what a turn's latency
    waits for) and its rows per second and CPU per row at 100 rows a transaction (the CPU of an
    insert, which a turn's throughput and CPU are made of); and Keel/raw at 64 producers."""
    out = os.path.join(work, "events.json")
    cmd = [os.path.join(build, "bench", "keel_bench"),
           "--benchmark_filter=^BM_(KeelAppend|RawSqliteAppend)/1/.*threads:(1|64)$|"
           "^BM_RawSqliteAppend/100/.*threads:1$",
           "--benchmark_min_time=0.4", f"--benchmark_out={out}", "--benchmark_out_format=json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TMPDIR=work))
    if r.returncode != 0:
        sys.exit("bench-quick: keel_bench failed\n" + r.stdout + r.stderr)
    got = {}
    for b in json.load(open(out))["benchmarks"]:
        m = re.match(r"BM_(KeelAppend|RawSqliteAppend)/(\d+)/.*threads:(\d+)", b["name"])
        if m and not b.get("error_occurred"):
            got[(m.group(1), int(m.group(2)), int(m.group(3)))] = b
    raw100 = got[("RawSqliteAppend", 100, 1)]
    # Process CPU per iteration (MeasureProcessCPUTime), one transaction of 100 rows.
    cpu_us = raw100["cpu_time"] * {"ns": 1e-3, "us": 1, "ms": 1e3, "s": 1e6}[raw100["time_unit"]]
    return {
        "raw_commits_per_s": got[("RawSqliteAppend", 1, 1)]["events_per_s"],
        "raw_rows_per_s": raw100["events_per_s"],
        "raw_cpu_us": cpu_us / 100,
        "append_ratio_64": got[("KeelAppend", 1, 64)]["events_per_s"] /
                           got[("RawSqliteAppend", 1, 64)]["events_per_s"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--update", action="store_true", help="write this run as bench/baseline.json")
    ap.add_argument("--seconds", type=float, default=5, help="seconds per measured load phase")
    ap.add_argument("--keel", help="the server binary to measure (default BUILD/keel), e.g. an "
                                   "older build's, with this build's load generator")
    a = ap.parse_args()
    build = a.build
    keel = a.keel or os.path.join(build, "keel")
    for b in (keel, os.path.join(build, "bench", "keel_loadgen"),
              os.path.join(build, "bench", "keel_bench"), os.path.join(build, "bench", "keel_fake_openai")):
        if not os.access(b, os.X_OK):
            sys.exit(f"bench-quick: {b} is missing; build first (make build)")
    server_pin, load_pin = pins()
    started = time.time()
    work = tempfile.mkdtemp(prefix="keel-bench-quick.")
    secs = str(a.seconds)
    try:
        print(f"bench-quick: build {build}; server {' '.join(server_pin) or 'unpinned'}, "
              f"load {' '.join(load_pin) or 'unpinned'}; data in {work}", flush=True)
        ev = event_bench(build, work)
        raw_cps, raw_rps, raw_cpu = ev["raw_commits_per_s"], ev["raw_rows_per_s"], ev["raw_cpu_us"]
        print(f"  raw SQLite: {raw_cps:,.0f} fsync'd one-row commits/s; {raw_rps:,.0f} rows/s and "
              f"{raw_cpu:.1f} us CPU a row at 100 rows a commit; Keel/raw event appends at 64 "
              f"producers {ev['append_ratio_64']:.2f}", flush=True)

        fake = subprocess.Popen(load_pin + [os.path.join(build, "bench", "keel_fake_openai")],
                                stdout=subprocess.PIPE, text=True)
        fake_port = int(fake.stdout.readline())
        s = Server(keel, os.path.join(work, "e2e"), server_pin,
                   env={"OPENAI_BASE_URL": f"http://127.0.0.1:{fake_port}/v1",
                        "OPENAI_API_KEY": "bench"})
        try:
            c1 = loadgen(build, load_pin, s, "--concurrency", "1", "--warmup", "1", "--duration", secs,
                         "--unique-messages")
            print(f"  c=1: p50 {c1['p50_ms']:.2f} ms", flush=True)
            c64 = loadgen(build, load_pin, s, "--concurrency", "64", "--warmup", "1", "--duration", secs,
                          "--unique-messages")
            print(f"  c=64, cache on (misses): {c64['turns_per_s']:,.0f} turns/s, CPU "
                  f"{c64['cpu_main_us'] + c64['cpu_other_us']:.0f} us/turn", flush=True)
            off = loadgen(build, load_pin, s, "--concurrency", "64", "--warmup", "1", "--duration", secs,
                          "--agent-config", '{"cache":false}')
            print(f"  c=64, cache off: {off['turns_per_s']:,.0f} turns/s", flush=True)
            oai = loadgen(build, load_pin, s, "--concurrency", "64", "--warmup", "1", "--duration", secs,
                          "--unique-messages", "--model", "openai/bench")
            print(f"  c=64, OpenAI provider against keel_fake_openai: {oai['turns_per_s']:,.0f} "
                  f"turns/s, CPU {oai['cpu_main_us'] + oai['cpu_other_us']:.0f} us/turn", flush=True)
            # Plugins on against off measured back to back, on the store as the phases above
            # left it (a later phase runs on a larger store, which alone costs turns/s).
            bare = loadgen(build, load_pin, s, "--concurrency", "64", "--warmup", "1", "--duration",
                           secs, "--unique-messages")
            enable_plugins(s.url, s.token_file)
            plug = loadgen(build, load_pin, s, "--concurrency", "64", "--warmup", "1", "--duration",
                           secs, "--unique-messages")
            print(f"  c=64, audit-log + redaction on every agent: {plug['turns_per_s']:,.0f} turns/s "
                  f"(without them just before: {bare['turns_per_s']:,.0f})", flush=True)
        finally:
            s.stop()
            fake.kill()
            fake.wait()
        s = Server(keel, os.path.join(work, "long"), server_pin, "history_limit = 2100\n")
        try:
            # Another session's turns first, so that the measured session's early turns are not
            # also the server's first (its caches and heap still cold).
            loadgen(build, load_pin, s, "--concurrency", "1", "--warmup", "0", "--turns", "200",
                    "--duration", "60", "--unique-messages")
            long = loadgen(build, load_pin, s, "--concurrency", "1", "--warmup", "0", "--turns", "1000",
                           "--duration", "120", "--unique-messages",
                           "--agent-config", '{"context_tokens":10000000}')
            print(f"  one session: turn 10 {long['early_ms']:.2f} ms, turn 1000 {long['late_ms']:.2f} ms",
                  flush=True)
        finally:
            s.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    commit_ms = 1000.0 / raw_cps
    # name -> (figure shown, ratio to the yardstick, "higher" or "lower" is better)
    rows = {
        "turns/s c=64 (cache misses) x 1000 / raw rows/s":
            (f"{c64['turns_per_s']:,.0f} turns/s", 1000 * c64["turns_per_s"] / raw_rps, "higher"),
        "turns/s c=64 (cache off) x 1000 / raw rows/s":
            (f"{off['turns_per_s']:,.0f} turns/s", 1000 * off["turns_per_s"] / raw_rps, "higher"),
        "p50 c=1 / raw commit time":
            (f"{c1['p50_ms']:.2f} ms", c1["p50_ms"] / commit_ms, "lower"),
        "server CPU per turn c=64 / raw CPU per row":
            (f"{c64['cpu_main_us']:.0f} + {c64['cpu_other_us']:.0f} us",
             (c64["cpu_main_us"] + c64["cpu_other_us"]) / raw_cpu, "lower"),
        "server CPU per turn c=64, OpenAI provider / raw CPU per row":
            (f"{oai['cpu_main_us']:.0f} + {oai['cpu_other_us']:.0f} us",
             (oai["cpu_main_us"] + oai["cpu_other_us"]) / raw_cpu, "lower"),
        "plugins on / off, turns/s c=64":
            (f"{plug['turns_per_s']:,.0f} vs {bare['turns_per_s']:,.0f}",
             plug["turns_per_s"] / bare["turns_per_s"], "higher"),
        "turn 1000 / turn 10 of one session":
            (f"{long['late_ms']:.2f} vs {long['early_ms']:.2f} ms",
             long["late_ms"] / long["early_ms"] if long["early_ms"] else 0, "lower"),
        "event appends Keel / raw, 64 producers":
            (f"{ev['append_ratio_64']:.2f}", ev["append_ratio_64"], "higher"),
    }
    base = {}
    if os.path.exists(BASELINE):
        base = json.load(open(BASELINE)).get("ratios", {})
    flagged = []
    print(f"\n{'figure':62} {'this run':>22} {'ratio':>9} {'baseline':>9} {'change':>8}")
    for name, (shown, ratio, better) in rows.items():
        b = base.get(name)
        change, flag = "", ""
        if b:
            worse = (b - ratio) / b if better == "higher" else (ratio - b) / b
            change = f"{-worse * 100:+.0f}%"
            if worse > TOLERANCE:
                flag = "FLAG"
                flagged.append(name)
        print(f"{name:62} {shown:>22} {ratio:9.4g} {b if b else '-':>9.4g} {change:>8} {flag}"
              if b else f"{name:62} {shown:>22} {ratio:9.4g} {'-':>9} {change:>8}")
    print(f"\nyardsticks: raw SQLite {raw_cps:,.0f} one-row commits/s ({commit_ms:.2f} ms each); "
          f"{raw_rps:,.0f} rows/s, {raw_cpu:.1f} us CPU a row at 100 rows a commit; "
          f"{time.time() - started:.0f} s in all")
    print("(change: + is better; FLAG: more than 15 % worse than bench/baseline.json)")
    if a.update:
        json.dump({"note": "ratios to raw SQLite of the same run (bench/quick.py); update only "
                           "with a sentence in the commit saying why",
                   "ratios": {n: round(r, 4) for n, (_, r, _) in rows.items()}},
                  open(BASELINE, "w"), indent=2)
        open(BASELINE, "a").write("\n")
        print(f"wrote {BASELINE}")
    if flagged:
        print("bench-quick: worse than the baseline: " + "; ".join(flagged))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

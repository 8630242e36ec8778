#!/usr/bin/env python3
"""A Telegram channel end to end, against a real `keel serve` and the Bot API fake
(tests/fakes/fake_telegram.py), local model, fsync on. Measures, in one run:

  * one chat: an update queued at the fake to its answer arriving there (sendMessage), one
    message at a time: p50 / p99;
  * 100 chats at once: 100 updates queued together, each to its answer: p50 / p99 over the rounds;
  * the same conversation without the channel ("direct"): the message posted through the API
    (?wait=) and its answer sent to the fake by this script, one at a time: p50; and the ratio of
    the channel's p50 to it (what polling, the delivery record and the outbox cost over a direct
    send);
  * the outbox alone: from the run's end (its finished_at) to the answer's arrival at the fake,
    through the outbox (the reply claimed in a unit of its own, then sent) and sent directly by
    this script once ?wait= returned, and their ratio (means: finished_at has ms resolution).

Times are the fake's receipt of sendMessage minus this script's clock when it queued the update
(one machine, one clock). Prints a RESULT line (key=value) last.

    python3 bench/telegram_bench.py --keel build/keel [--messages 200] [--rounds 5]
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
TOKEN = "7000001:benchTOKENbenchTOKENbench"


def call(port, method, path, body=None, token=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status >= 300:
        raise RuntimeError("%s %s -> %d %s" % (method, path, resp.status, data[:300]))
    return json.loads(data) if data else None


def parse_ms(text):
    dt = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    return dt.timestamp() * 1000


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def wait_messages(fake, n, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        sent = call(fake, "GET", "/_sent")["messages"]
        if len(sent) >= n:
            return sent
        time.sleep(0.002)
    raise RuntimeError("only %d of %d answers arrived" % (len(sent), n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", default=os.path.join(ROOT, "build", "keel"))
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chats", type=int, default=100)
    args = ap.parse_args()

    home = tempfile.mkdtemp(prefix="keel-tg-bench-")
    fake_proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "fakes", "fake_telegram.py"), "--token",
         TOKEN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    fake = int(fake_proc.stdout.readline())
    env = dict(os.environ, KEEL_SECRET_KEK=KEK, KEEL_OUTBOUND_ALLOW="127.0.0.1/32")
    log = open(os.path.join(home, "server.log"), "w")
    server = subprocess.Popen([args.keel, "serve", "--home", home, "--listen", "127.0.0.1:0"],
                              env=env, stdout=log, stderr=log)
    try:
        addr_file = os.path.join(home, "listen.addr")
        for _ in range(300):
            if os.path.exists(addr_file) and open(addr_file).read().strip():
                break
            time.sleep(0.05)
        port = int(open(addr_file).read().strip().rsplit(":", 1)[1])
        owner = open(os.path.join(home, "owner.token")).read().strip()
        agent = call(port, "POST", "/v1/agents", {"name": "bench", "model": "local"}, owner)
        call(port, "PUT", "/v1/secrets/BOT", {"value": TOKEN}, owner)
        call(port, "POST", "/v1/agents/%s/channels" % agent["id"],
             {"kind": "telegram", "name": "tg",
              "settings": {"bot_token": "BOT", "api_base": "http://127.0.0.1:%d" % fake}},
             owner)
        # The senders are the agent's users (members, so no guest's rate limit holds them back;
        # a private chat's id is its person's).
        for chat in [1] + [10000 + c for c in range(args.chats)]:
            user = call(port, "POST", "/v1/users", {"name": "chat %d" % chat, "identities": [
                {"platform": "telegram", "platform_user_id": str(chat)}]}, owner)
            call(port, "PUT", "/v1/agents/%s/members/%s" % (agent["id"], user["id"]),
                 {"role": "user"}, owner)

        channel = call(port, "GET", "/v1/agents/%s/channels" % agent["id"], None,
                       owner)["items"][0]["id"]

        def finished_ms(run_id):
            run = call(port, "GET", "/v1/runs/" + run_id, None, owner)
            return parse_ms(run["finished_at"])

        def one_chat(n, chat, after_run=None):
            lat = []
            for i in range(n):
                call(fake, "POST", "/_reset")
                t0 = time.time()
                update = call(fake, "POST", "/_message",
                              {"chat_id": chat, "text": "message %d" % i})["update_id"]
                [m] = wait_messages(fake, 1)
                lat.append((m["_at"] - t0) * 1000)
                if after_run is not None:
                    replies, cursor = [], ""
                    while True:
                        page = call(port, "GET", "/v1/channels/%s/replies?limit=200%s" %
                                    (channel, "&cursor=" + cursor if cursor else ""), None, owner)
                        replies += page["items"]
                        cursor = page.get("next_cursor")
                        if not cursor:
                            break
                    run = [r for r in replies if r["delivery_id"] == str(update)]
                    if run:
                        after_run.append(m["_at"] * 1000 - finished_ms(run[0]["run_id"]))
            return lat

        one_chat(20, 1)  # warm up: the chat's session, the poller, the connections
        outbox = []  # the run's end to its answer at the fake, through the outbox
        single = one_chat(args.messages, 1, outbox)

        many = []
        for r in range(args.rounds):
            call(fake, "POST", "/_reset")
            queued = {}
            for c in range(args.chats):
                chat = 10000 + c
                queued[chat] = time.time()
                call(fake, "POST", "/_message", {"chat_id": chat, "text": "round %d" % r})
            for m in wait_messages(fake, args.chats):
                many.append((m["_at"] - queued[m["chat_id"]]) * 1000)

        session = call(port, "POST", "/v1/agents/%s/sessions" % agent["id"],
                       {"title": "direct"}, owner)
        direct = []
        direct_after_run = []  # the run's end to the answer at the fake, sent by this script
        for i in range(args.messages + 20):
            call(fake, "POST", "/_reset")
            t0 = time.time()
            posted = call(port, "POST", "/v1/sessions/%s/messages?wait=30" % session["id"],
                          {"content": "message %d" % i}, owner)
            call(fake, "POST", "/bot%s/sendMessage" % TOKEN,
                 {"chat_id": 1, "text": posted["run"]["output"], "parse_mode": "HTML"})
            [m] = wait_messages(fake, 1)
            if i >= 20:
                direct.append((m["_at"] - t0) * 1000)
                direct_after_run.append(m["_at"] * 1000 - parse_ms(posted["run"]["finished_at"]))

        result = {
            "one_chat_p50_ms": round(pct(single, 50), 2),
            "one_chat_p99_ms": round(pct(single, 99), 2),
            "chats_%d_p50_ms" % args.chats: round(pct(many, 50), 2),
            "chats_%d_p99_ms" % args.chats: round(pct(many, 99), 2),
            "direct_p50_ms": round(pct(direct, 50), 2),
            "channel_over_direct": round(pct(single, 50) / pct(direct, 50), 2),
            "outbox_send_ms": round(sum(outbox) / len(outbox), 2),
            "direct_send_ms": round(sum(direct_after_run) / len(direct_after_run), 2),
            "outbox_over_direct_send": round(sum(outbox) / len(outbox) /
                                             (sum(direct_after_run) / len(direct_after_run)), 2),
        }
        print("one chat: p50 %.2f ms, p99 %.2f ms (%d messages)" %
              (result["one_chat_p50_ms"], result["one_chat_p99_ms"], len(single)))
        print("%d chats at once: p50 %.2f ms, p99 %.2f ms (%d rounds)" %
              (args.chats, pct(many, 50), pct(many, 99), args.rounds))
        print("direct (API ?wait=, then sendMessage): p50 %.2f ms; channel / direct %.2f" %
              (result["direct_p50_ms"], result["channel_over_direct"]))
        print("from the run's end to the answer at the fake (means, ms resolution): outbox %.2f ms, "
              "direct send %.2f ms; outbox / direct %.2f" %
              (result["outbox_send_ms"], result["direct_send_ms"],
               result["outbox_over_direct_send"]))
        print("RESULT " + " ".join("%s=%s" % kv for kv in result.items()))
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        fake_proc.stdin.close()
        fake_proc.wait(10)
        if os.environ.get("KEEL_BENCH_KEEP"):
            print("home: " + home)
        else:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

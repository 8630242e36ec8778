#!/usr/bin/env python3
"""A small MCP server on the stdio transport, for the client tests (tests/unit/mcp_client_test.cc).

It speaks the wire format of the real servers (newline-delimited JSON-RPC 2.0, the 2025-06-18
lifecycle) and misbehaves on request, for what the reference servers cannot show. Flags change
the whole session; tools misbehave per call.

Flags:
  --version V          answer initialize with protocol version V (default: the client's)
  --hang-init          read initialize and never answer
  --exit-at-start N    write an error to stderr and exit with status N before reading anything
  --error-init         answer initialize with a JSON-RPC error
  --garbage-at-start N print N lines that are not JSON-RPC before anything else
  --no-tools           declare no tools capability
  --stubborn           ignore the end of stdin and SIGTERM (only SIGKILL ends it)
  --grandchild         start a `sleep` in the same process group (tool grandchild_pid tells it)

Tools (tools/list pages them two at a time):
  echo {text}          -> text
  crash {code}         -> writes to stderr, exits with `code` without answering
  answer_then_exit     -> answers, then exits with status 0
  slow {seconds}       -> sleeps (blocking the whole server), then answers
  cancellations        -> the requestIds of every notifications/cancelled received so far
  change               -> sends notifications/tools/list_changed, then answers
  ping_client          -> sends the client a ping and a roots/list request; answers with the
                          client's two replies
  rpc_error            -> a JSON-RPC error (-32602) instead of a result
  tool_error           -> a result with isError: true
  garbage {n}          -> n non-JSON lines, then the answer
  huge {bytes}         -> a single line of about `bytes` bytes, then the answer
  deep {levels}        -> an answer nested `levels` arrays deep
  env                  -> the server's environment, as JSON text
  cwd                  -> the server's working directory
  grandchild_pid       -> the pid of the --grandchild sleep
  pid                  -> the server's own pid
  instance             -> a random id chosen when the server started (tells restarts apart where
                          pids do not: in a sandbox's own pid namespace)
  probe {paths, connect} -> what the server can reach: its uid, for each path its first bytes or
                          the error, and whether a TCP connection to `connect` ("host:port")
                          opens
  stderr {text}        -> writes text to stderr, answers "ok"
  close_stdout         -> closes its stdout (so never answers) and lives on
  close_stdin          -> closes its stdin, answers, and lives on
  env_var {name, how}  -> the value of one environment variable: how "text" (default) as the
                          result, "error" as a result with isError, "base64" base64-encoded,
                          "exit" written to stderr before exiting with status 9 unanswered
"""

import base64
import json
import os
import signal
import subprocess
import sys
import time

TOOLS = [
    "echo", "crash", "answer_then_exit", "slow", "cancellations", "change", "ping_client",
    "rpc_error", "tool_error", "garbage", "huge", "deep", "env", "cwd", "grandchild_pid", "pid",
    "stderr", "close_stdout", "close_stdin", "env_var", "instance", "probe",
]
INSTANCE = os.urandom(8).hex()
PAGE = 2

flags = sys.argv[1:]
stdin = sys.stdin.buffer
stdout = sys.stdout.buffer
cancelled = []
grandchild = None


def flag_value(name, default=None):
    if name in flags:
        return flags[flags.index(name) + 1]
    return default


def send(message):
    stdout.write(json.dumps(message).encode() + b"\n")
    stdout.flush()


def log(text):
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def text_result(text, is_error=False):
    result = {"content": [{"type": "text", "text": text}]}
    if is_error:
        result["isError"] = True
    return result


def read_message():
    """The next message from the client, or None at the end of stdin."""
    while True:
        line = stdin.readline()
        if not line:
            return None
        if line.strip():
            return json.loads(line)


def wait_forever():
    while True:
        time.sleep(3600)


def call_tool(name, args, request_id):
    """The result for tools/call, or None when the tool answers by itself."""
    if name == "echo":
        return text_result(str(args.get("text", "")))
    if name == "crash":
        log("fake_mcp_stdio: crashing on purpose (tool crash)")
        os._exit(int(args.get("code", 3)))
    if name == "answer_then_exit":
        send({"jsonrpc": "2.0", "id": request_id, "result": text_result("last words")})
        log("fake_mcp_stdio: exiting after the answer")
        os._exit(0)
    if name == "slow":
        time.sleep(float(args.get("seconds", 1)))
        return text_result("slept")
    if name == "cancellations":
        return text_result(json.dumps(cancelled))
    if name == "change":
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return text_result("changed")
    if name == "ping_client":
        send({"jsonrpc": "2.0", "id": "srv-ping", "method": "ping"})
        send({"jsonrpc": "2.0", "id": 99, "method": "roots/list"})
        replies = {}
        while len(replies) < 2:
            m = read_message()
            if m is None:
                sys.exit(0)
            if "method" not in m and m.get("id") in ("srv-ping", 99):
                replies[str(m["id"])] = m
        return text_result(json.dumps(replies))
    if name == "rpc_error":
        send({"jsonrpc": "2.0", "id": request_id,
              "error": {"code": -32602, "message": "bad params for rpc_error",
                        "data": {"hint": 1}}})
        return None
    if name == "tool_error":
        return text_result("the tool failed", is_error=True)
    if name == "garbage":
        for i in range(int(args.get("n", 1))):
            stdout.write(b"this is not JSON, line %d\n" % i)
        stdout.flush()
        return text_result("after garbage")
    if name == "huge":
        send({"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": "info", "data": "x" * int(args.get("bytes", 1 << 20))}})
        return text_result("after huge")
    if name == "deep":
        levels = int(args.get("levels", 1000))
        stdout.write(b'{"jsonrpc":"2.0","id":%d,"result":{"content":[],"structuredContent":{"a":'
                     % request_id + b"[" * levels + b"]" * levels + b"}}}\n")
        stdout.flush()
        return None
    if name == "env":
        return text_result(json.dumps(dict(os.environ)))
    if name == "env_var":
        value = os.environ.get(str(args.get("name", "")), "")
        how = args.get("how", "text")
        if how == "exit":
            log("fake_mcp_stdio: giving up, the variable is " + value)
            os._exit(9)
        if how == "base64":
            return text_result(base64.b64encode(value.encode()).decode())
        return text_result(value, is_error=how == "error")
    if name == "cwd":
        return text_result(os.getcwd())
    if name == "grandchild_pid":
        return text_result(str(grandchild.pid if grandchild else 0))
    if name == "pid":
        return text_result(str(os.getpid()))
    if name == "instance":
        return text_result(INSTANCE)
    if name == "probe":
        reads = {}
        for path in args.get("paths", []):
            try:
                with open(path, "rb") as f:
                    reads[path] = "read: " + f.read(64).decode("utf-8", "replace")
            except OSError as e:
                reads[path] = "error: " + e.strerror
        net = None
        if args.get("connect"):
            import socket
            host, port = args["connect"].rsplit(":", 1)
            try:
                socket.create_connection((host, int(port)), 2).close()
                net = "connected"
            except OSError as e:
                net = "error: " + str(e)
        return text_result(json.dumps({"uid": os.getuid(), "reads": reads, "net": net}))
    if name == "stderr":
        log(str(args.get("text", "")))
        return text_result("ok")
    if name == "close_stdout":
        log("fake_mcp_stdio: closing stdout")
        os.close(1)
        wait_forever()
    if name == "close_stdin":
        os.close(0)  # before the answer, so that the client's next write finds no reader
        send({"jsonrpc": "2.0", "id": request_id, "result": text_result("closed stdin")})
        wait_forever()
    raise KeyError(name)


def main():
    global grandchild
    if "--exit-at-start" in flags:
        log("fake_mcp_stdio: cannot start: missing configuration file /nonexistent.toml")
        sys.exit(int(flag_value("--exit-at-start")))
    if "--stubborn" in flags:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--grandchild" in flags:
        grandchild = subprocess.Popen(["sleep", "300"])
    for i in range(int(flag_value("--garbage-at-start", 0))):
        stdout.write(b"garbage before the first message %d\n" % i)
    stdout.flush()
    log("fake_mcp_stdio: started with %s" % " ".join(flags))

    while True:
        m = read_message()
        if m is None:
            break
        method = m.get("method")
        request_id = m.get("id")
        if method == "initialize":
            if "--hang-init" in flags:
                log("fake_mcp_stdio: hanging in initialize")
                wait_forever()
            if "--error-init" in flags:
                send({"jsonrpc": "2.0", "id": request_id,
                      "error": {"code": -32602, "message": "Unsupported protocol version"}})
                continue
            capabilities = {} if "--no-tools" in flags else {"tools": {"listChanged": True}}
            send({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocolVersion": flag_value("--version", m["params"]["protocolVersion"]),
                "capabilities": capabilities,
                "serverInfo": {"name": "fake-mcp-stdio", "version": "1.0"}}})
        elif method == "notifications/cancelled":
            cancelled.append(m["params"]["requestId"])
        elif method == "tools/list":
            start = int((m.get("params") or {}).get("cursor", "0"))
            page = [{"name": t, "description": "fake tool " + t,
                     "inputSchema": {"type": "object"}} for t in TOOLS[start:start + PAGE]]
            result = {"tools": page}
            if start + PAGE < len(TOOLS):
                result["nextCursor"] = str(start + PAGE)
            send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "tools/call":
            params = m.get("params") or {}
            try:
                result = call_tool(params.get("name"), params.get("arguments") or {}, request_id)
            except KeyError:
                send({"jsonrpc": "2.0", "id": request_id,
                      "error": {"code": -32602,
                                "message": "Unknown tool: %s" % params.get("name")}})
                continue
            if result is not None:
                send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif request_id is not None and method is not None:
            send({"jsonrpc": "2.0", "id": request_id,
                  "error": {"code": -32601, "message": "Method not found"}})
        # Notifications (initialized, ...) and stray responses need no answer.

    log("fake_mcp_stdio: end of stdin")
    if "--stubborn" in flags:
        wait_forever()


if __name__ == "__main__":
    main()

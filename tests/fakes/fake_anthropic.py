#!/usr/bin/env python3
"""A fake Anthropic Messages API server for Keel's tests, speaking the real wire format.

Usage: fake_anthropic.py [--key KEY]. It listens on 127.0.0.1 on a free port, prints the port on
the first line of stdout, and serves until stdin closes (so it dies with the test that started
it) or it is sent SIGTERM.

POST /v1/messages checks the request as the real API does, as far as Keel's use goes: the
x-api-key and anthropic-version headers, a JSON body with model, max_tokens, an optional string
system prompt, messages whose roles alternate starting with user, content blocks (non-empty text,
tool_use with ids and names of the API's patterns, tool_result answering every tool_use of the
assistant turn just before it), tools as {name, description, input_schema}, and "stream": true. A
problem is answered 400 {"type":"error","error":{"type":"invalid_request_error",...}}.

The model name picks a scripted scenario (see SCENARIOS). Scenarios that behave differently on
retries count requests per (model, last user text), so each test uses its own message.
GET /_count?user=TEXT answers {"count": N}: the requests seen whose last user text is TEXT.

Streams are sent with chunked transfer encoding, cut into pieces of odd sizes with short pauses,
so events, lines and JSON arrive split at arbitrary byte boundaries.
"""

import json
import re
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_KEY = "test-key"
VERSION = "2023-06-01"
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")

_lock = threading.Lock()
_counts = {}  # (model, user text) -> requests seen
_user_counts = {}  # user text -> requests seen


def blocks_of(message):
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else None


def check_request(body):
    """Returns a description of the first problem with a request body, or None."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: must be a non-empty string"
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        return "max_tokens: must be a positive integer"
    if "system" in body and not isinstance(body["system"], str):
        return "system: must be a string"
    if body.get("stream") is not True:
        return "stream: Keel always streams"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: must be a non-empty array"
    open_calls = set()  # tool_use ids of the previous assistant turn, not answered yet
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: must be user or assistant"
        expected = "user" if i % 2 == 0 else "assistant"
        if m["role"] != expected:
            return f"messages.{i}: roles must alternate, starting with user"
        blocks = blocks_of(m)
        if not blocks:
            return f"messages.{i}.content: must be a non-empty string or array of blocks"
        calls = set()
        for j, b in enumerate(blocks):
            where = f"messages.{i}.content.{j}"
            t = b.get("type") if isinstance(b, dict) else None
            if t == "text":
                if not isinstance(b.get("text"), str) or not b["text"]:
                    return f"{where}: text content blocks must be non-empty"
            elif t == "tool_use":
                if m["role"] != "assistant":
                    return f"{where}: tool_use blocks belong to assistant messages"
                if not TOOL_ID.match(str(b.get("id", ""))):
                    return f"{where}.id: does not match ^[a-zA-Z0-9_-]+$"
                if not TOOL_NAME.match(str(b.get("name", ""))):
                    return f"{where}.name: does not match ^[a-zA-Z0-9_-]{{1,64}}$"
                if not isinstance(b.get("input"), dict):
                    return f"{where}.input: must be an object"
                calls.add(b["id"])
            elif t == "tool_result":
                if m["role"] != "user":
                    return f"{where}: tool_result blocks belong to user messages"
                if b.get("tool_use_id") not in open_calls:
                    return f"{where}: tool_use_id does not answer a tool_use of the previous turn"
                open_calls.discard(b["tool_use_id"])
                if "content" in b and not isinstance(b["content"], (str, list)):
                    return f"{where}.content: must be a string or an array"
            else:
                return f"{where}.type: unexpected block type {t!r}"
        if m["role"] == "user" and open_calls:
            return f"messages.{i}: tool_use ids {sorted(open_calls)} have no tool_result"
        open_calls = calls if m["role"] == "assistant" else set()
    if messages[-1]["role"] != "user":
        return "messages: the last message must be the user's"
    tools = body.get("tools", [])
    if not isinstance(tools, list):
        return "tools: must be an array"
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not TOOL_NAME.match(str(t.get("name", ""))):
            return f"tools.{i}.name: does not match ^[a-zA-Z0-9_-]{{1,64}}$"
        schema = t.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return f"tools.{i}.input_schema: must be an object schema"
    return None


def last_user_text(body):
    for m in reversed(body["messages"]):
        if m["role"] == "user":
            return "".join(b.get("text", "") for b in blocks_of(m) if b.get("type") == "text")
    return ""


def tool_results(body):
    """The tool_result blocks of the last user message."""
    return [b for b in blocks_of(body["messages"][-1]) if b.get("type") == "tool_result"]


def event(kind, **fields):
    return "event: %s\ndata: %s\n\n" % (kind, json.dumps(dict(type=kind, **fields)))


def message_start(input_tokens):
    return event("message_start", message={
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1}})


def text_block(index, pieces):
    out = [event("content_block_start", index=index, content_block={"type": "text", "text": ""})]
    for p in pieces:
        out.append(event("content_block_delta", index=index,
                         delta={"type": "text_delta", "text": p}))
    out.append(event("content_block_stop", index=index))
    return out


def tool_block(index, call_id, name, json_pieces):
    out = [event("content_block_start", index=index,
                 content_block={"type": "tool_use", "id": call_id, "name": name, "input": {}})]
    for p in json_pieces:
        out.append(event("content_block_delta", index=index,
                         delta={"type": "input_json_delta", "partial_json": p}))
    out.append(event("content_block_stop", index=index))
    return out


def message_end(stop_reason, output_tokens):
    return [event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": None},
                  usage={"output_tokens": output_tokens}),
            event("message_stop")]


def text_events():
    return ([message_start(12), event("ping")] + text_block(0, ["Hel", "lo, ", "world"]) +
            message_end("end_turn", 5))


def tool_names(body):
    names = [t["name"] for t in body.get("tools", [])]
    return (names[0], names[-1]) if names else ("missing", "missing")


def split3(text):
    a, b = len(text) // 3, 2 * len(text) // 3
    return [text[:a], text[a:b], text[b:]]


def tool_events(body):
    first, last = tool_names(body)
    return ([message_start(42)] + text_block(0, ["Let me ", "check."]) +
            tool_block(1, "toolu_a", first, ["", "{\"te", "xt\": \"h", "i\"}"]) +
            tool_block(2, "toolu_b", last, ["{\"path\": ", "\"/tmp/x\"}"]) +
            message_end("tool_use", 17))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def send_json(self, status, obj, extra_headers=()):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra_headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status, error_type, message, extra_headers=()):
        self.send_json(status, {"type": "error", "error": {"type": error_type, "message": message}},
                       extra_headers)

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def write_piece(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def stream(self, events, end=True):
        """Sends events cut at odd byte boundaries, pausing between pieces."""
        self.start_stream()
        data = "".join(events).encode()
        sizes = [1, 7, 3, 64, 13, 2, 29]
        pos = 0
        i = 0
        while pos < len(data):
            n = sizes[i % len(sizes)]
            self.write_piece(data[pos:pos + n])
            pos += n
            i += 1
            time.sleep(0.001)
        if end:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def drop(self):
        """Closes the connection abruptly, whatever was sent so far."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path != "/_count":
            return self.send_error_json(404, "not_found_error", "no such path: " + url.path)
        user = urllib.parse.parse_qs(url.query).get("user", [""])[0]
        with _lock:
            n = _user_counts.get(user, 0)
        self.send_json(200, {"count": n})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/messages":
            return self.send_error_json(404, "not_found_error", "no such path: " + self.path)
        if self.headers.get("x-api-key") != API_KEY:
            return self.send_error_json(401, "authentication_error", "invalid x-api-key")
        if self.headers.get("anthropic-version") != VERSION:
            return self.send_error_json(400, "invalid_request_error",
                                        "anthropic-version: expected " + VERSION)
        if not (self.headers.get("Content-Type") or "").startswith("application/json"):
            return self.send_error_json(400, "invalid_request_error",
                                        "Content-Type must be application/json")
        try:
            body = json.loads(raw)
        except ValueError:
            return self.send_error_json(400, "invalid_request_error", "the body is not JSON")
        problem = check_request(body)
        if problem:
            return self.send_error_json(400, "invalid_request_error", problem)

        model = body["model"]
        user = last_user_text(body)
        with _lock:
            n = _counts[(model, user)] = _counts.get((model, user), 0) + 1
            _user_counts[user] = _user_counts.get(user, 0) + 1
        handler = SCENARIOS.get(model)
        if handler is None:
            return self.send_error_json(404, "not_found_error", "model: " + model)
        handler(self, body, n)


def stream_text(h, body, n):
    h.stream(text_events())


def stream_tools(h, body, n):
    h.stream(tool_events(body))


def agent_tools(h, body, n):
    """A turn through the gateway: the first offered tool is called with the user's message
    (a JSON object) as its input, streamed in three pieces; once the results are back, the answer
    quotes them."""
    results = tool_results(body)
    if results:
        said = "; ".join(str(r.get("content", "")) for r in results)
        pieces = ["The tool ", "said: ", said]
        return h.stream([message_start(30)] + text_block(0, pieces) + message_end("end_turn", 9))
    first, _ = tool_names(body)
    h.stream([message_start(25)] + text_block(0, ["Calling it."]) +
             tool_block(1, "toolu_" + str(n), first, split3(last_user_text(body))) +
             message_end("tool_use", 11))


def json_body(h, body, n):
    first, _ = tool_names(body)
    h.send_json(200, {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
        "content": [{"type": "text", "text": "Done in one."},
                    {"type": "tool_use", "id": "toolu_j", "name": first, "input": {"text": "j"}}],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 3},
    })


def server_error_once(h, body, n):
    if n == 1:
        return h.send_error_json(500, "api_error", "Internal server error")
    h.stream(text_events())


def overloaded_once(h, body, n):
    if n == 1:
        return h.send_error_json(529, "overloaded_error", "Overloaded")
    h.stream(text_events())


def overloaded(h, body, n):
    h.send_error_json(529, "overloaded_error", "Overloaded")


def rate_limited_once(h, body, n):
    if n == 1:
        return h.send_error_json(429, "rate_limit_error", "Number of request tokens has exceeded "
                                 "your per-minute rate limit", [("retry-after", "1")])
    h.stream(text_events())


def garbage(h, body, n):
    data = b"<html><body>502 Bad Gateway</body></html>"
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def garbage_stream(h, body, n):
    h.stream([message_start(3), "event: content_block_delta\ndata: {this is not json\n\n"])


def error_event(h, body, n):
    h.stream([message_start(3)] + text_block(0, ["Partial"]) +
             [event("error", error={"type": "overloaded_error", "message": "Overloaded"})])


def cut(h, body, n):
    """Text deltas, then a tool call cut off in the middle of its input: the connection drops."""
    first, _ = tool_names(body)
    events = ([message_start(20)] + text_block(0, ["Partial ", "answer"]) +
              tool_block(1, "toolu_cut", first, ["{\"line\": \"nev"]))
    payload = "".join(events)
    h.stream([payload[:payload.rindex("event: content_block_stop")]], end=False)
    time.sleep(0.02)
    h.drop()


def bad_request(h, body, n):
    h.send_error_json(400, "invalid_request_error", "prompt is too long: 300000 tokens > 200000")


SCENARIOS = {
    "stream-text": stream_text,
    "stream-tools": stream_tools,
    "agent-tools": agent_tools,
    "json-body": json_body,
    "server-error-once": server_error_once,
    "overloaded-once": overloaded_once,
    "overloaded": overloaded,
    "rate-limited-once": rate_limited_once,
    "garbage": garbage,
    "garbage-stream": garbage_stream,
    "error-event": error_event,
    "cut": cut,
    "bad-request": bad_request,
}


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # Clients hang up once they have what they need; only real faults are worth a trace.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def main():
    global API_KEY
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--key":
        API_KEY = args[1]
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sys.stdin.read()  # returns at EOF: the test that started us is gone
    except KeyboardInterrupt:
        pass
    server.shutdown()


if __name__ == "__main__":
    main()

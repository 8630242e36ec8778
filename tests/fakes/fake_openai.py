#!/usr/bin/env python3
"""A fake OpenAI Chat Completions server for Keel's tests, speaking the real wire format.

Usage: fake_openai.py [--key KEY]. It listens on 127.0.0.1 on a free port, prints the port on
the first line of stdout, and serves until stdin closes (so it dies with the test that started
it) or it is sent SIGTERM.

POST /v1/chat/completions checks the request (Authorization: Bearer KEY, JSON body, message and
tool shapes, "stream": true with include_usage) and answers 400 naming the first problem. The
model name picks a scripted scenario (see SCENARIOS; "echo-messages" answers with the messages
it was sent). Scenarios that behave differently on
retries count requests per (model, last user message), so each test uses its own message.
GET /_count?user=MESSAGE answers {"count": N}: the requests seen with that last user message.

Streams are sent with chunked transfer encoding, cut into pieces of odd sizes with short pauses,
so events, lines and JSON arrive split at arbitrary byte boundaries.
"""

import json
import re
import time

from fake_http import FakeHandler, count_request, serve

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ROLES = {"system", "user", "assistant", "tool", "developer"}


def check_request(body):
    """Returns a description of the first problem with a request body, or None."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "'model' must be a non-empty string"
    if body.get("stream") is not True:
        return "'stream' must be true"
    if body.get("stream_options") != {"include_usage": True}:
        return "'stream_options' must be {\"include_usage\": true}"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    call_ids = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return f"messages[{i}] has no valid role"
        role = m["role"]
        if role == "assistant" and "tool_calls" in m:
            if not isinstance(m["tool_calls"], list) or not m["tool_calls"]:
                return f"messages[{i}].tool_calls must be a non-empty array"
            if m.get("content") is not None and not isinstance(m.get("content"), str):
                return f"messages[{i}].content must be a string or null"
            for c in m["tool_calls"]:
                if not isinstance(c, dict) or c.get("type") != "function":
                    return f"messages[{i}] has a tool call whose type is not 'function'"
                if not isinstance(c.get("id"), str) or not c["id"]:
                    return f"messages[{i}] has a tool call without an id"
                fn = c.get("function")
                if not isinstance(fn, dict) or not TOOL_NAME.match(str(fn.get("name", ""))):
                    return f"messages[{i}] has a tool call with an invalid function name"
                if not isinstance(fn.get("arguments"), str):
                    return f"messages[{i}] has tool call arguments that are not a string"
                try:
                    if not isinstance(json.loads(fn["arguments"]), dict):
                        raise ValueError()
                except ValueError:
                    return f"messages[{i}] has tool call arguments that are not a JSON object"
                call_ids.add(c["id"])
        elif role == "tool":
            if m.get("tool_call_id") not in call_ids:
                return f"messages[{i}].tool_call_id does not answer an earlier tool call"
            if not isinstance(m.get("content"), str):
                return f"messages[{i}].content must be a string"
        elif not isinstance(m.get("content"), str):
            return f"messages[{i}].content must be a string"
    tools = body.get("tools", [])
    if not isinstance(tools, list):
        return "'tools' must be an array"
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            return f"tools[{i}].type must be 'function'"
        fn = t.get("function")
        if not isinstance(fn, dict) or not TOOL_NAME.match(str(fn.get("name", ""))):
            return f"tools[{i}].function.name is not a valid OpenAI function name"
        if not isinstance(fn.get("parameters"), dict):
            return f"tools[{i}].function.parameters must be an object"
    return None


def chunk(delta=None, finish_reason=None, usage=None, choices=True):
    obj = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake",
    }
    obj["choices"] = (
        [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}] if choices else []
    )
    if usage is not None:
        obj["usage"] = usage
    return "data: " + json.dumps(obj) + "\n\n"


def usage(prompt, completion):
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def text_events():
    return [
        chunk({"role": "assistant", "content": ""}),
        ": keep-alive\n\n",
        chunk({"content": "Hel"}),
        chunk({"content": "lo, "}),
        chunk({"content": "world"}),
        chunk({}, finish_reason="stop"),
        chunk(usage=usage(12, 5), choices=False),
        "data: [DONE]\n\n",
    ]


def tool_names(body):
    names = [t["function"]["name"] for t in body.get("tools", [])]
    return (names[0], names[-1]) if names else ("missing", "missing")


def tool_events(body):
    first, last = tool_names(body)

    def call(index, **fields):
        return chunk({"tool_calls": [dict(index=index, **fields)]})

    return [
        chunk({"role": "assistant", "content": "Let me "}),
        chunk({"content": "check."}),
        call(0, id="call_a", type="function", function={"name": first, "arguments": ""}),
        call(0, function={"arguments": "{\"te"}),
        call(0, function={"arguments": "xt\": \"h"}),
        call(0, function={"arguments": "i\"}"}),
        call(1, id="call_b", type="function", function={"name": last}),
        call(1, function={"arguments": "{\"path\": "}),
        call(1, function={"arguments": "\"/tmp/x\"}"}),
        chunk({}, finish_reason="tool_calls"),
        chunk(usage=usage(42, 17), choices=False),
        "data: [DONE]\n\n",
    ]


class Handler(FakeHandler):
    def send_error_json(self, status, message, error_type="invalid_request_error",
                        extra_headers=()):
        self.send_json(status, {"error": {"message": message, "type": error_type,
                                          "param": None, "code": None}}, extra_headers)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            return self.send_error_json(404, "no such path: " + self.path)
        try:
            body = json.loads(raw)
        except ValueError:
            return self.send_error_json(400, "the body is not JSON")
        model = body.get("model", "") if isinstance(body, dict) else ""
        auth = self.headers.get("Authorization")
        if model.startswith("no-auth"):
            if auth is not None:
                return self.send_error_json(400, "expected no Authorization header")
        elif auth != "Bearer " + self.api_key:
            return self.send_error_json(401, "Incorrect API key provided.")
        if not (self.headers.get("Content-Type") or "").startswith("application/json"):
            return self.send_error_json(400, "Content-Type must be application/json")
        problem = check_request(body)
        if problem:
            return self.send_error_json(400, "bad request shape: " + problem)

        user = ""
        for m in body["messages"]:
            if m.get("role") == "user":
                user = m.get("content", "")
        n = count_request(model, user)

        handler = SCENARIOS.get(model)
        if handler is None:
            return self.send_error_json(404, f"The model '{model}' does not exist",
                                        "invalid_request_error")
        handler(self, body, n)


def stream_text(h, body, n):
    h.stream(text_events())


def no_auth_ok(h, body, n):
    h.stream(text_events())


def stream_crlf(h, body, n):
    h.stream(text_events(), crlf=True)


def eof_stream(h, body, n):
    h.stream(text_events(), chunked=False)


def stream_tools(h, body, n):
    h.stream(tool_events(body))


def json_body(h, body, n):
    first, _ = tool_names(body)
    h.send_json(200, {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "fake",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Done in one.",
                "tool_calls": [{"id": "call_j", "type": "function",
                                "function": {"name": first, "arguments": "{\"text\": \"j\"}"}}],
            },
            "finish_reason": "tool_calls",
        }],
        "usage": usage(7, 3),
    })


def rate_limited_once(h, body, n):
    if n == 1:
        return h.send_error_json(429, "Rate limit reached for requests", "requests",
                                 [("Retry-After", "1")])
    h.stream(text_events())


def rate_limited_always(h, body, n):
    h.send_error_json(429, "Rate limit reached for requests", "requests", [("Retry-After", "0")])


def server_error_once(h, body, n):
    if n == 1:
        return h.send_error_json(500, "The server had an error while processing your request.",
                                 "server_error")
    h.stream(text_events())


def drop_before_body_once(h, body, n):
    if n == 1:
        return h.drop()
    h.stream(text_events())


def drop(h, body, n):
    h.start_stream()
    h.write_piece(chunk({"role": "assistant", "content": "Partial "}).encode())
    time.sleep(0.02)
    h.write_piece(chunk({"content": "answer"}).encode())
    time.sleep(0.02)
    h.write_piece(b"data: {\"choices\": [{\"ind")
    time.sleep(0.02)
    h.drop()


def slow(h, body, n):
    h.start_stream()
    h.write_piece(chunk({"role": "assistant", "content": "Thinking"}).encode())
    time.sleep(3)
    h.drop()


def slow_words(h, body, n):
    """Streams an answer a word every 0.4 s (a page shows the words as they come)."""
    h.start_stream()
    h.write_piece(chunk({"role": "assistant", "content": ""}).encode())
    for word in ["Streaming ", "one ", "word ", "at ", "a ", "time."]:
        time.sleep(0.4)
        h.write_piece(chunk({"content": word}).encode())
    for piece in (chunk({}, finish_reason="stop"), chunk(usage=usage(8, 6), choices=False),
                  "data: [DONE]\n\n"):
        h.write_piece(piece.encode())
    h.write_piece(b"")


def hang(h, body, n):
    """Starts an answer and never finishes it (the client is expected to die meanwhile)."""
    h.start_stream()
    h.write_piece(chunk({"role": "assistant", "content": "Thinking"}).encode())
    time.sleep(300)
    h.drop()


def hang_twice_per_step(h, body, n):
    """Hangs on the first two tries of each of two steps: a tool call, then a text answer."""
    if n in (1, 2, 4, 5):
        return hang(h, body, n)
    if n == 3:
        first, _ = tool_names(body)
        return h.stream([
            chunk({"role": "assistant", "content": ""}),
            chunk({"tool_calls": [{"index": 0, "id": "call_p", "type": "function",
                                   "function": {"name": first, "arguments": "{}"}}]}),
            chunk({}, finish_reason="tool_calls"),
            chunk(usage=usage(5, 2), choices=False),
            "data: [DONE]\n\n",
        ])
    h.stream(text_events())


def garbage(h, body, n):
    data = b"<html><body>502 Bad Gateway</body></html>"
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def garbage_stream(h, body, n):
    h.stream([chunk({"content": "ok"}), "data: {this is not json\n\n", "data: [DONE]\n\n"])


def bad_args(h, body, n):
    first, _ = tool_names(body)
    h.stream([
        chunk({"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                               "function": {"name": first, "arguments": "{\"text\": "}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "oops"}}]}),
        chunk({}, finish_reason="tool_calls"),
        "data: [DONE]\n\n",
    ])


def unknown_tool(h, body, n):
    h.stream([
        chunk({"tool_calls": [{"index": 0, "id": "call_u", "type": "function",
                               "function": {"name": "no_such_tool", "arguments": "{}"}}]}),
        chunk({}, finish_reason="tool_calls"),
        "data: [DONE]\n\n",
    ])


def echo_messages(h, body, n):
    """Answers with the request's messages as JSON text ([[role, content], ...]), in two
    pieces: a test reads from it what Keel sent."""
    text = json.dumps([[m.get("role"), m.get("content")] for m in body["messages"]])
    half = len(text) // 2
    h.stream([chunk({"role": "assistant", "content": ""}), chunk({"content": text[:half]}),
              chunk({"content": text[half:]}), chunk({}, finish_reason="stop"),
              chunk(usage=usage(7, 3), choices=False), "data: [DONE]\n\n"])


def bad_request(h, body, n):
    h.send_error_json(400, "Invalid 'messages[0].content': string too long.")


SCENARIOS = {
    "stream-text": stream_text,
    "stream-crlf": stream_crlf,
    "eof-stream": eof_stream,
    "no-auth-ok": no_auth_ok,
    "stream-tools": stream_tools,
    "json-body": json_body,
    "rate-limited-once": rate_limited_once,
    "rate-limited-always": rate_limited_always,
    "server-error-once": server_error_once,
    "drop-before-body-once": drop_before_body_once,
    "drop": drop,
    "slow": slow,
    "slow-words": slow_words,
    "hang": hang,
    "hang-twice-per-step": hang_twice_per_step,
    "garbage": garbage,
    "garbage-stream": garbage_stream,
    "bad-args": bad_args,
    "unknown-tool": unknown_tool,
    "bad-request": bad_request,
    "echo-messages": echo_messages,
}


def main():
    serve(Handler)


if __name__ == "__main__":
    main()

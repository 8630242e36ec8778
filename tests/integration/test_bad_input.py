"""Bad input is a clear 4xx with a JSON error, never a crash and never a partial write."""

import json
import select
import socket
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, unique_name


def raw_post(addr, path, token, body_len, content_type="application/json", chunk=64 * 1024,
             timeout=20):
    """POSTs a body of `body_len` bytes with a raw socket, watching for an early answer (a server
    may answer 413 from Content-Length alone and close). Returns (status, body text)."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        head = ("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                "Content-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % (path, addr, token, content_type, body_len)).encode()
        sock.sendall(head)
        # a JSON string body: {"name": "aaaa..."}
        prefix = b'{"name": "'
        suffix = b'"}'
        filler = body_len - len(prefix) - len(suffix)
        sent = 0
        pieces = [prefix]
        remaining = filler
        while remaining > 0:
            n = min(chunk, remaining)
            pieces.append(b"a" * n)
            remaining -= n
        pieces.append(suffix)
        for piece in pieces:
            r, _, _ = select.select([sock], [], [], 0)
            if r:
                break  # the server answered (or closed) before the whole body was sent
            try:
                sock.sendall(piece)
                sent += len(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = sock.recv(65536)
            except ConnectionResetError:
                break
            except socket.timeout:
                break
            if not got:
                break
            data += got
            if b"\r\n\r\n" in data:
                head_part, _, rest = data.partition(b"\r\n\r\n")
                length = None
                for line in head_part.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v.strip())
                if length is not None and len(rest) >= length:
                    break
        if not data:
            return None, "connection closed without an answer (sent %d of %d bytes)" % (
                sent, body_len)
        head_part, _, rest = data.partition(b"\r\n\r\n")
        status = int(head_part.split(b" ", 2)[1])
        return status, rest.decode("utf-8", "replace")
    finally:
        sock.close()


class BadInputTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = s = KeelServer()
        cls.agent = s.create_agent(tools=["notes.append"])
        cls.session = s.create_session(cls.agent["id"])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def tearDown(self):
        self.assertHealthy()

    def agent_count(self):
        return len(self.server.list_all("/v1/agents"))

    def test_malformed_json(self):
        s = self.server
        n = self.agent_count()
        for raw in ('{"name": "x", "model": "local"', "{nope}", "[1, 2", "", "null", "42",
                    '"a string"', "[]", '{"name": "x",}', "\xff\xfe"):
            self.assertError(s.request("POST", "/v1/agents", raw_body=raw), 400,
                             "invalid_argument", "POST /v1/agents with body %r" % raw)
        self.assertEqual(self.agent_count(), n, "a bad request created an agent")
        for path in ("/v1/agents/%s/sessions" % self.agent["id"],
                     "/v1/sessions/%s/messages" % self.session["id"],
                     "/v1/tokens", "/v1/tenants"):
            self.assertError(s.request("POST", path, raw_body="{bad json"), 400,
                             "invalid_argument", "POST %s with malformed JSON" % path)
        self.assertError(s.request("PATCH", "/v1/agents/%s" % self.agent["id"],
                                   raw_body="{bad"), 400, "invalid_argument", "PATCH bad JSON")

    def test_wrong_types(self):
        s = self.server
        n = self.agent_count()
        bad = [
            {"name": 123, "model": "local"},
            {"name": ["x"], "model": "local"},
            {"name": unique_name(), "model": 7},
            {"name": unique_name(), "model": "local", "tools": "time.now"},
            {"name": unique_name(), "model": "local", "tools": [1, 2]},
            {"name": unique_name(), "model": "local", "config": "busy"},
            {"name": unique_name(), "model": "local", "config": [1]},
            {"name": unique_name(), "model": "local", "instructions": {"a": 1}},
            {"name": "", "model": "local"},
        ]
        for body in bad:
            self.assertError(s.request("POST", "/v1/agents", body), 400, "invalid_argument",
                             "POST /v1/agents %r" % body)
        self.assertEqual(self.agent_count(), n, "a bad request created an agent")
        self.assertError(s.request("PATCH", "/v1/agents/%s" % self.agent["id"],
                                   {"tools": "nope"}), 400, "invalid_argument", "PATCH tools")
        self.assertError(s.request("PATCH", "/v1/agents/%s" % self.agent["id"],
                                   {"name": 5}), 400, "invalid_argument", "PATCH name")
        got = s.ok("GET", "/v1/agents/%s" % self.agent["id"], expect=200)
        self.assertEqual(got["name"], self.agent["name"], "a rejected PATCH changed the agent")
        self.assertEqual(got["tools"], self.agent["tools"])
        self.assertError(s.request("POST", "/v1/agents/%s/sessions" % self.agent["id"],
                                   {"title": 5}), 400, "invalid_argument", "session title")
        path = "/v1/sessions/%s/messages" % self.session["id"]
        for body in ({"content": 5}, {"content": None}, {"content": ["a"]}, {"content": {}}):
            self.assertError(s.request("POST", path, body), 400, "invalid_argument",
                             "message %r" % body)
        self.assertError(s.request("POST", "/v1/tokens", {"name": "x", "role": 3}), 400,
                         "invalid_argument", "token role type")

    def test_missing_fields(self):
        s = self.server
        self.assertError(s.request("POST", "/v1/agents", {"model": "local"}), 400,
                         "invalid_argument", "agent without a name")
        self.assertError(s.request("POST", "/v1/agents", {}), 400, "invalid_argument",
                         "empty agent")
        self.assertError(s.request("POST", "/v1/sessions/%s/messages" % self.session["id"], {}),
                         400, "invalid_argument", "message without content")
        self.assertError(s.request("POST", "/v1/tenants", {}), 400, "invalid_argument",
                         "tenant without a name")
        # no message was written by the rejected posts
        msgs = s.list_all("/v1/sessions/%s/messages" % self.session["id"])
        self.assertEqual([m for m in msgs if m["role"] == "user" and
                          not isinstance(m["content"], str)], [])

    def test_unknown_model_rejected(self):
        s = self.server
        st, body, _ = s.request("POST", "/v1/agents", {"name": unique_name(), "model": "nope"})
        self.assertIn(st, (400, 201), body)
        if st == 400:
            self.assertEqual(body["error"]["code"], "invalid_argument")

    def test_unknown_ids(self):
        s = self.server
        missing = "01900000-0000-7000-8000-000000000000"
        cases = [
            ("GET", "/v1/agents/%s" % missing, None),
            ("PATCH", "/v1/agents/%s" % missing, {"instructions": "x"}),
            ("DELETE", "/v1/agents/%s" % missing, None),
            ("GET", "/v1/agents/%s/sessions" % missing, None),
            ("POST", "/v1/agents/%s/sessions" % missing, {"title": "x"}),
            ("GET", "/v1/sessions/%s" % missing, None),
            ("GET", "/v1/sessions/%s/messages" % missing, None),
            ("POST", "/v1/sessions/%s/messages" % missing, {"content": "hello"}),
            ("GET", "/v1/sessions/%s/runs" % missing, None),
            ("GET", "/v1/runs/%s" % missing, None),
            ("GET", "/v1/runs/%s/steps" % missing, None),
            ("POST", "/v1/runs/%s/cancel" % missing, None),
            ("DELETE", "/v1/tokens/%s" % missing, None),
            ("GET", "/v1/agents/not-even-an-id", None),
            ("GET", "/v1/sessions/..%2F..%2Fetc%2Fpasswd", None),
        ]
        for method, path, body in cases:
            self.assertError(s.request(method, path, body), 404, "not_found",
                             "%s %s" % (method, path))

    def test_unknown_route(self):
        s = self.server
        st, body, _ = s.request("GET", "/v1/no-such-thing")
        self.assertEqual(st, 404, body)
        self.assertIsInstance(body, dict)
        self.assertEqual(body["error"]["code"], "not_found")
        st, body, _ = s.request("PUT", "/v1/agents")
        self.assertIn(st, (404, 405), body)
        self.assertIsInstance(body, dict, "a 405 is JSON too")
        self.assertIn("error", body)

    def test_message_to_unknown_session(self):
        s = self.server
        self.assertError(s.post_message("no-such-session", "hi", wait=1), 404, "not_found",
                         "message to an unknown session")

    def test_body_too_large(self):
        s = self.server
        n = self.agent_count()
        status, text = raw_post(s.addr, "/v1/agents", s.token, (1 << 20) + 4096)
        self.assertEqual(status, 413, "a body over 1 MiB: %s %s" % (status, text[:300]))
        body = json.loads(text)
        self.assertEqual(body["error"]["code"], "payload_too_large")
        self.assertEqual(self.agent_count(), n)
        # a message over the limit too
        status, text = raw_post(s.addr, "/v1/sessions/%s/messages" % self.session["id"],
                                s.token, 3 << 20)
        self.assertEqual(status, 413, "a 3 MiB message: %s %s" % (status, text[:300]))
        # a body just under the limit is not 413 (it is a valid request with a long name or a
        # too-long-name 400, but never 413)
        status, text = raw_post(s.addr, "/v1/agents", s.token, (1 << 20) - 1024)
        self.assertNotEqual(status, 413, "a body under 1 MiB was refused as too large")
        self.assertIsNotNone(status, text)

    def test_invalid_limit_and_cursor(self):
        s = self.server
        for q in ("limit=abc", "limit=-1", "limit=1.5", "limit=99999999999999999999"):
            self.assertError(s.request("GET", "/v1/agents?" + q), 400, "invalid_argument",
                             "GET /v1/agents?" + q)
        self.assertError(s.request("GET", "/v1/events?after=abc"), 400, "invalid_argument",
                         "GET /v1/events?after=abc")
        self.assertError(s.request("GET", "/v1/events?limit=xyz"), 400, "invalid_argument",
                         "GET /v1/events?limit=xyz")
        self.assertError(s.request("GET", "/v1/agents?cursor=!!not-a-cursor!!"), 400,
                         "invalid_argument", "a garbage cursor")
        st, body, _ = s.request("GET", "/v1/agents?limit=501")
        self.assertIn(st, (200, 400), body)
        if st == 200:
            self.assertLessEqual(len(body["items"]), 500)

    def test_invalid_wait(self):
        s = self.server
        for w in ("abc", "-3"):
            self.assertError(s.post_message(self.session["id"], "hi", wait=w), 400,
                             "invalid_argument", "?wait=%s" % w)

    def test_bad_local_call_line(self):
        # A malformed /call line is the model's problem, not a crash: the run ends.
        s = self.server
        run = s.send(self.session["id"], "/call notes.append {not json")["run"]
        self.assertIn(run["status"], ("done", "failed"), run)
        run = s.send(self.session["id"], "/call")["run"]
        self.assertIn(run["status"], ("done", "failed"), run)
        run = s.send(self.session["id"], '/call notes.append {"line": 5}')["run"]
        self.assertIn(run["status"], ("done", "failed"), run)

    def test_bad_local_rules_regex(self):
        s = self.server
        st, body, _ = s.request("POST", "/v1/agents", {"name": unique_name(), "model": "local",
                                                       "config": {"local_rules": [
                                                           {"match": "([", "reply": "x"}]}})
        if st == 201:
            sess = s.create_session(body["id"])
            run = s.send(sess["id"], "anything")["run"]
            self.assertEqual(run["status"], "failed", run)
            self.assertIsInstance(run["error"], dict)
        else:
            self.assertEqual(st, 400, body)

    def test_unicode_and_odd_content(self):
        s = self.server
        text = "h\u00e9llo \u2603 \U0001f600 \"quoted\" \\ back\tslash"
        run = s.send(self.session["id"], text)["run"]
        self.assertEqual(run["status"], "done")
        self.assertIn(text, run["output"])
        msgs = s.list_all("/v1/sessions/%s/messages" % self.session["id"])
        self.assertIn(text, [m["content"] for m in msgs])

    def test_wrong_content_type_is_not_a_crash(self):
        s = self.server
        st, body, _ = s.request("POST", "/v1/agents", raw_body="name=x&model=local",
                                headers={"Content-Type": "application/x-www-form-urlencoded"})
        self.assertIn(st, (400, 415), body)


if __name__ == "__main__":
    unittest.main()

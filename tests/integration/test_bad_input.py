"""Bad input is a clear 4xx with a JSON error, never a crash and never a partial write."""

import base64
import json
import select
import socket
import threading
import time
import unittest

from keel_harness import KeelServer, KeelTestCase, Tenant, unique_name


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


def raw_exchange(addr, request, timeout=10):
    """Sends `request` (bytes) as is and reads until the server closes the connection. Returns
    (status or None, body text, closed: whether the server closed within `timeout`)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        data, closed = b"", False
        try:
            while True:
                got = sock.recv(65536)
                if not got:
                    closed = True
                    break
                data += got
        except (socket.timeout, ConnectionResetError):
            pass
    if not data:
        return None, "", closed
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode("utf-8", "replace"), closed


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
            ("GET", "/v1/sessions/..%2E%2E", None),
        ]
        for method, path, body in cases:
            self.assertError(s.request(method, path, body), 404, "not_found",
                             "%s %s" % (method, path))
        # An encoded slash is refused before any route is looked at.
        self.assertError(s.request("GET", "/v1/sessions/..%2F..%2Fetc%2Fpasswd"), 400,
                         "invalid_argument", "encoded slashes")

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
        # A bad position is named by the parameter it came in (a bad cursor was called `after`).
        for path, headers, given in (("/v1/events?after=abc", None, "after"),
                                     ("/v1/events?cursor=abc", None, "cursor"),
                                     ("/v1/stream?after=-1", None, "after"),
                                     ("/v1/stream", {"Last-Event-ID": "x"}, "Last-Event-ID")):
            err = self.assertError(s.request("GET", path, headers=headers), 400,
                                   "invalid_argument", path)
            self.assertEqual(err["message"],
                             given + " must be a non-negative integer event position", path)
        self.assertError(s.request("GET", "/v1/agents?cursor=!!not-a-cursor!!"), 400,
                         "invalid_argument", "a garbage cursor")
        # A session's messages page by seq: a cursor that decodes but names no place in it (an
        # id, a negative or huge number) is refused, and a real one goes on where it stopped.
        session = s.create_session(s.create_agent()["id"])["id"]
        for text in ("one", "two", "three"):
            s.send(session, text)
        first = s.ok("GET", "/v1/sessions/%s/messages?limit=2" % session)
        rest = s.ok("GET", "/v1/sessions/%s/messages?limit=10&cursor=%s" %
                    (session, first["next_cursor"]))
        listed = [m["content"] for m in first["items"] + rest["items"]]
        self.assertEqual(len(listed), 6, listed)
        self.assertEqual(listed[0::2], ["one", "two", "three"], listed)
        for raw in (first["items"][0]["id"], "-1", "99999999999999999999", "1 OR 1=1"):
            cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
            self.assertError(s.request("GET", "/v1/sessions/%s/messages?cursor=%s" %
                                       (session, cursor)), 400, "invalid_argument", raw)
        st, body, _ = s.request("GET", "/v1/agents?limit=501")
        self.assertIn(st, (200, 400), body)
        if st == 200:
            self.assertLessEqual(len(body["items"]), 500)

    def test_malformed_targets_and_doubled_credentials(self):
        s = self.server
        agent = s.create_agent()

        def raw(request):
            host, port = s.addr.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(request.encode())
                answer = b""
                while b"\r\n" not in answer:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            return answer.split(b"\r\n", 1)[0].decode()

        # A bad escape in the query was read as no query at all (the default page).
        self.assertError(s.request("GET", "/v1/agents?limit=%zz"), 400, "invalid_argument",
                         "a bad percent-escape")
        # An encoded slash was routed as a real one.
        self.assertError(s.request("GET", "/v1/agents/%s%%2fsessions" % agent["id"]), 400,
                         "invalid_argument", "an encoded slash")
        self.assertEqual(s.request("GET", "/v1/agents/%s/sessions" % agent["id"])[0], 200)
        # Two Authorization headers: the last one won.
        status = raw("GET /v1/agents HTTP/1.1\r\nHost: keel\r\nAuthorization: Bearer nobody\r\n"
                     "Authorization: Bearer %s\r\nConnection: close\r\n\r\n" % s.token)
        self.assertIn(" 400 ", status + " ")
        status = raw("GET /v1/agents HTTP/1.1\r\nHost: keel\r\nAuthorization: Bearer %s\r\n"
                     "Connection: close\r\n\r\n" % s.token)
        self.assertIn(" 200 ", status + " ")

    def test_bad_chunks_and_transfer_codings(self):
        s = self.server

        def post(transfer_encodings, body):
            head = "POST /v1/agents HTTP/1.1\r\nHost: keel\r\nAuthorization: Bearer %s\r\n" \
                   "Content-Type: application/json\r\nConnection: close\r\n" % s.token
            for te in transfer_encodings:
                head += "Transfer-Encoding: %s\r\n" % te
            return raw_exchange(s.addr, (head + "\r\n").encode() + body)

        before = self.agent_count()
        agent = json.dumps({"name": unique_name(), "model": "local"}).encode()
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(agent), agent)
        # A malformed chunk size closed the connection without an answer.
        status, body, closed = post(["chunked"], b"zz\r\n" + agent + b"\r\n0\r\n\r\n")
        self.assertEqual((status, closed), (400, True), body)
        self.assertEqual(json.loads(body)["error"]["code"], "invalid_argument")
        self.assertIn("malformed HTTP request", body)
        # A coding before chunked was taken as chunked alone: the handler got the body still
        # coded. One in two headers is the same.
        for codings in (["gzip, chunked"], ["gzip", "chunked"], ["identity, chunked"]):
            status, body, closed = post(codings, chunked)
            self.assertEqual((status, closed), (501, True), (codings, body))
            self.assertIn("is not implemented", json.loads(body)["error"]["message"])
        # A list that does not end in chunked leaves the body's length unknown (it was read as
        # no body, and the body as the next request); chunked twice is malformed too.
        for codings in (["gzip"], ["chunked, gzip"], ["chunked", "chunked"], [""]):
            status, body, closed = post(codings, chunked)
            self.assertEqual((status, closed), (400, True), (codings, body))
        self.assertEqual(self.agent_count(), before)
        # chunked alone, in any case, still works.
        for te in ("chunked", "Chunked"):
            agent = json.dumps({"name": unique_name(), "model": "local"}).encode()
            status, body, _ = post([te], b"%x\r\n%s\r\n0\r\n\r\n" % (len(agent), agent))
            self.assertEqual(status, 201, body)
        self.assertEqual(self.agent_count(), before + 2)

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

    def test_local_rule_arguments_that_are_not_an_object(self):
        # They were replaced by {} when the rule fired, and the tool ran with no arguments.
        s = self.server
        for args in (["buy milk"], "buy milk", None):
            st, body, _ = s.request("POST", "/v1/agents", {
                "name": unique_name(), "model": "local", "tools": ["notes.append"],
                "config": {"local_rules": [{"match": "note", "call": {
                    "tool": "notes.append", "arguments": args}}]}})
            self.assertEqual(st, 400, body)
            self.assertEqual(body["error"]["message"],
                             "config.local_rules: a call's 'arguments' must be a JSON object")

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


# ---------------------------------------------------------------------- hostile input
#
# Each attack is sent, then the server must answer /healthz, another tenant must be served, and
# nothing may have been written (the tenant's event log is unchanged).

DEEP = 200000  # levels of nesting in an attack (400 KB of brackets, under the 1 MiB body limit)


def deep_array(levels=DEEP):
    return "[" * levels + "]" * levels


def deep_object(levels=150000):  # 6 bytes a level: 150,000 levels stay under 1 MiB
    return '{"a":' * levels + "1" + "}" * levels


class HostileInputTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = s = KeelServer()
        cls.agent = s.create_agent()
        cls.session = s.create_session(cls.agent["id"])
        cls.other = Tenant(s)
        other_agent = cls.other.ok("POST", "/v1/agents", {"name": unique_name(), "model": "local"},
                                   expect=201)
        cls.other_session = cls.other.ok("POST", "/v1/agents/%s/sessions" % other_agent["id"],
                                         {"title": "other"}, expect=201)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def tearDown(self):
        self.assertHealthy()
        # another tenant is served as before
        run = self.other.ok("POST", "/v1/sessions/%s/messages?wait=10" % self.other_session["id"],
                            {"content": "still there?"}, expect=200)["run"]
        self.assertEqual(run["status"], "done", run)

    def event_count(self):
        return len(self.server.all_events())

    def assertRefused(self, resp, what, why):
        err = self.assertError(resp, 400, "invalid_argument", what)
        self.assertIn(why, err["message"], what)
        return err

    def assertDeepRefused(self, resp, what):
        return self.assertRefused(resp, what, "64 levels")

    def test_deep_json_in_an_mcp_body(self):
        s = self.server
        n = self.event_count()
        for deep in (deep_array(), deep_object()):
            raw = '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": %s}' % deep
            st, body, _ = s.request("POST", "/v1/mcp", raw_body=raw,
                                    headers={"Accept": "application/json, text/event-stream"})
            self.assertEqual(st, 400, "a deep /v1/mcp body: %s %r" % (st, str(body)[:300]))
            self.assertIn("64 levels", body["error"]["message"])
            self.assertHealthy()
        self.assertEqual(self.event_count(), n)

    def test_deep_json_in_message_content(self):
        s = self.server
        path = "/v1/sessions/%s/messages" % self.session["id"]
        before = len(s.list_all(path))
        n = self.event_count()
        for deep in (deep_array(), deep_object()):
            self.assertDeepRefused(s.request("POST", path, raw_body='{"content": %s}' % deep),
                                   "deep message content")
            self.assertHealthy()
        self.assertEqual(len(s.list_all(path)), before, "a refused message was written")
        self.assertEqual(self.event_count(), n)

    def test_deep_json_in_agent_config(self):
        s = self.server
        n = self.event_count()
        agents = len(s.list_all("/v1/agents"))
        for deep in (deep_array(), deep_object()):
            raw = '{"name": "%s", "model": "local", "config": {"x": %s}}' % (unique_name(), deep)
            self.assertDeepRefused(s.request("POST", "/v1/agents", raw_body=raw), "deep config")
            self.assertHealthy()
            raw = '{"config": {"x": %s}}' % deep
            self.assertDeepRefused(s.request("PATCH", "/v1/agents/%s" % self.agent["id"],
                                             raw_body=raw), "deep config in a PATCH")
            self.assertHealthy()
        # 65 levels is refused, 64 is not
        ok = s.request("POST", "/v1/agents", {"name": unique_name(), "model": "local",
                                              "config": {"x": json.loads(deep_array(61))}})
        self.assertEqual(ok[0], 201, ok)
        self.assertDeepRefused(s.request("POST", "/v1/agents", {
            "name": unique_name(), "model": "local", "config": {"x": json.loads(deep_array(63))}}),
            "65 levels")
        self.assertEqual(len(s.list_all("/v1/agents")), agents + 1)
        self.assertEqual(s.ok("GET", "/v1/agents/%s" % self.agent["id"])["config"],
                         self.agent["config"], "a refused PATCH changed the agent")
        self.assertEqual(self.event_count(), n + 1)

    def test_deep_tool_arguments_from_the_model(self):
        # The local model reads `/call TOOL {json}`: model output is untrusted input too.
        s = self.server
        # (a message's JSON string escapes each quote: 100,000 object levels stay under 1 MiB)
        for deep in (deep_array(), deep_object(100000)):
            run = s.send(self.session["id"], '/call time.now {"a": %s}' % deep)["run"]
            self.assertIn(run["status"], ("done", "failed"), run)
            self.assertIn("64 levels", json.dumps(run), "the run does not say why: %s"
                          % json.dumps(run)[:500])
            self.assertHealthy()

    def test_deep_json_in_a_policy_document(self):
        s = self.server
        n = self.event_count()
        before = s.request("GET", "/v1/policy")
        for deep in (deep_array(), deep_object()):
            self.assertDeepRefused(s.request("PUT", "/v1/policy",
                                             raw_body='{"rules": [%s]}' % deep), "deep policy")
            self.assertHealthy()
        after = s.request("GET", "/v1/policy")
        self.assertEqual((after[0], after[1]), (before[0], before[1]), "a refused policy was kept")
        self.assertEqual(self.event_count(), n)

    def test_deep_json_in_a_plugin_config(self):
        s = self.server
        n = self.event_count()
        manifest = {"id": "deep-config", "name": "deep", "version": "1.0.0", "kind": "lua",
                    "events": ["tool.after@v1"]}
        for deep in (deep_array(), deep_object()):
            raw = '{"manifest": %s, "source": "local x = 1", "config": {"x": %s}}' % (
                json.dumps(manifest), deep)
            self.assertDeepRefused(s.request("POST", "/v1/plugins", raw_body=raw),
                                   "deep plugin config")
            self.assertHealthy()
        self.assertEqual(s.ok("GET", "/v1/plugins")["items"], [])
        self.assertEqual(self.event_count(), n)

    def test_a_lua_plugin_returning_a_table_inside_itself(self):
        # A Lua value is a graph: a table holding itself (or one table shared 2^40 ways) must be
        # refused when it is turned into JSON, not walked forever.
        s = self.server
        source = ('ctx.bus.on("prompt.assemble@v1", function(p)\n'
                  '  if string.find(p.messages[#p.messages].content, "self") then\n'
                  '    local t = {} t.me = t p.messages[1].extra = t\n'
                  '  else\n'
                  '    local t = {} for i = 1, 40 do t = {t, t} end p.messages[1].extra = t\n'
                  '  end\n'
                  '  return p\n'
                  'end)\n')
        manifest = {"id": "graph-" + unique_name().lower().replace("_", "-")[:20], "name": "g",
                    "version": "1.0.0", "kind": "lua", "events": ["prompt.assemble@v1"]}
        s.ok("POST", "/v1/plugins", {"manifest": manifest, "source": source}, expect=201)
        agent = s.create_agent()
        s.ok("POST", "/v1/plugins/%s/enable" % manifest["id"], {"agent_id": agent["id"]},
             expect=200)
        session = s.create_session(agent["id"])
        try:
            for content in ("self", "shared"):
                run = s.send(session["id"], content)["run"]
                self.assertIn(run["status"], ("done", "failed"), run)
                self.assertHealthy()
        finally:
            s.ok("DELETE", "/v1/plugins/%s" % manifest["id"], expect=(200, 204))

    def test_hostile_local_rules_patterns(self):
        s = self.server
        # Backtracking patterns are accepted and run in linear time (RE2): the run answers and,
        # meanwhile, another tenant's request is answered too.
        agent = s.create_agent(config={"local_rules": [
            {"match": "^(a+)+$", "reply": "nested"},
            {"match": "(a|b)*c", "reply": "alternation"}]})
        session = s.create_session(agent["id"])
        results = {}

        def hostile():
            results["nested"] = s.send(session["id"], "a" * 40 + "!", wait=60)["run"]
            results["alternation"] = s.send(session["id"], "ab" * 100000, wait=60)["run"]

        t = threading.Thread(target=hostile)
        t.start()
        other = self.other.request("GET", "/v1/agents", timeout=60)
        t.join(120)
        self.assertEqual(other[0], 200, "another tenant was not served while the pattern ran")
        self.assertFalse(t.is_alive(), "the hostile runs did not answer")
        for name in ("nested", "alternation"):
            run = results.get(name)
            self.assertIsNotNone(run, name)
            self.assertEqual(run["status"], "done", run)
            self.assertTrue(run["output"].startswith("You said"), run["output"][:200])
        # What RE2 cannot run, or a pattern over 1 KiB, is refused when the agent is written.
        n = self.event_count()
        agents = len(s.list_all("/v1/agents"))
        for pattern, why in (("(a)\\1", "invalid pattern"), ("(?=a)", "invalid pattern"),
                             ("([", "invalid pattern"), ("a" * 1025, "1024 bytes")):
            body = {"name": unique_name(), "model": "local",
                    "config": {"local_rules": [{"match": pattern, "reply": "x"}]}}
            self.assertRefused(s.request("POST", "/v1/agents", body), "pattern %r" % pattern[:20],
                               why)
            self.assertRefused(s.request("PATCH", "/v1/agents/%s" % agent["id"],
                                         {"config": body["config"]}),
                               "PATCH pattern %r" % pattern[:20], why)
        self.assertEqual(len(s.list_all("/v1/agents")), agents)
        self.assertEqual(self.event_count(), n)

    def test_duplicate_keys(self):
        s = self.server
        n = self.event_count()
        agents = len(s.list_all("/v1/agents"))
        path = "/v1/sessions/%s/messages" % self.session["id"]
        messages = len(s.list_all(path))
        cases = [
            ("POST", "/v1/agents", '{"name": "%s", "name": "%s", "model": "local"}'
             % (unique_name(), unique_name())),
            ("POST", "/v1/agents", '{"name": "%s", "model": "local", "config": '
             '{"busy": "queue", "busy": "reject"}}' % unique_name()),
            ("POST", path, '{"content": "one", "content": "two"}'),
            ("PATCH", "/v1/agents/%s" % self.agent["id"], '{"instructions": "a", "instructions": "b"}'),
            ("PUT", "/v1/policy", '{"deny": ["a"], "deny": ["b"]}'),
        ]
        for method, p, raw in cases:
            self.assertRefused(s.request(method, p, raw_body=raw), "%s %s %s" % (method, p, raw),
                               "appears twice")
        st, body, _ = s.request("POST", "/v1/mcp", raw_body='{"jsonrpc": "2.0", "id": 1, '
                                '"method": "ping", "method": "tools/list"}')
        self.assertEqual(st, 400, body)
        self.assertIn("appears twice", body["error"]["message"])
        self.assertEqual(len(s.list_all("/v1/agents")), agents)
        self.assertEqual(len(s.list_all(path)), messages)
        self.assertEqual(self.event_count(), n)

    def test_unknown_top_level_fields(self):
        s = self.server
        aid = self.agent["id"]
        sid = self.session["id"]
        missing = "01900000-0000-7000-8000-000000000000"
        cases = [
            ("POST", "/v1/tenants", {"name": unique_name()}),
            ("POST", "/v1/tokens", {"name": unique_name(), "role": "user"}),
            ("POST", "/v1/agents", {"name": unique_name(), "model": "local"}),
            ("PATCH", "/v1/agents/%s" % aid, {"instructions": "x"}),
            ("POST", "/v1/agents/%s/sessions" % aid, {"title": "t"}),
            ("PATCH", "/v1/sessions/%s" % sid, {"status": "idle"}),
            ("POST", "/v1/sessions/%s/messages" % sid, {"content": "hello"}),
            ("POST", "/v1/mcp-servers", {"name": "m", "command": ["true"]}),
            ("POST", "/v1/agents/%s/memories" % aid, {"text": "a fact"}),
            ("PUT", "/v1/agents/%s/working-memory" % aid, {"text": "notes"}),
            ("POST", "/v1/plugins", {"manifest": {
                "id": "unknown-field", "name": "u", "version": "1.0.0", "kind": "lua",
                "events": ["tool.after@v1"]}, "source": "local x = 1"}),
            ("POST", "/v1/plugins/none/enable", {"agent_id": aid}),
            ("PUT", "/v1/policy", {"deny": ["x"]}),
            ("PUT", "/v1/emergency-stop", {"reason": "r"}),
            ("POST", "/v1/schedules", {"agent_id": aid, "cron": "@daily", "prompt": "p"}),
            ("POST", "/v1/agents/%s/schedules" % aid, {"cron": "@daily", "prompt": "p"}),
            ("PATCH", "/v1/schedules/%s" % missing, {"enabled": False}),
            ("POST", "/v1/schedules/%s/pause" % missing, {}),
            ("POST", "/v1/schedules/%s/resume" % missing, {}),
            ("PUT", "/v1/secrets/unknown_field", {"value": "v"}),
            ("POST", "/v1/skills", {"files": {"SKILL.md": "---\nname: x\ndescription: y\n---\n"}}),
            ("POST", "/v1/agents/%s/skills" % aid, {"name": "x"}),
            ("PUT", "/v1/budgets", {"scope": "tenant", "period": "month", "limit_usd": 5}),
            ("POST", "/v1/runs/%s/cancel" % missing, {}),
            ("POST", "/v1/approvals/%s/approve" % missing, {"reason": "r"}),
            ("POST", "/v1/approvals/%s/reject" % missing, {"reason": "r"}),
            ("POST", "/v1/plugins/none/deliveries/%s/replay" % missing, {}),
        ]
        n = self.event_count()
        for method, path, body in cases:
            body = dict(body, bogus=1)
            err = self.assertError(s.request(method, path, body), 400, "invalid_argument",
                                   "%s %s with an unknown field" % (method, path))
            self.assertIn("bogus", err["message"], "%s %s" % (method, path))
        self.assertEqual(self.event_count(), n, "a refused body wrote something")
        # open objects are not closed: an agent's config takes any key
        created = s.ok("POST", "/v1/agents", {"name": unique_name(), "model": "local",
                                              "config": {"my_own_setting": {"bogus": 1}}},
                       expect=201)
        self.assertEqual(created["config"]["my_own_setting"], {"bogus": 1})

    def test_nul_and_invalid_utf8(self):
        s = self.server
        n = self.event_count()
        path = "/v1/sessions/%s/messages" % self.session["id"]
        messages = len(s.list_all(path))
        cases = [
            ("POST", "/v1/agents", '{"name": "a\\u0000b", "model": "local"}'),
            ("POST", "/v1/agents", '{"name": "%s", "model": "local", "instructions": "x\\u0000"}'
             % unique_name()),
            ("POST", "/v1/agents", '{"name": "%s", "model": "local", "config": {"k\\u0000": 1}}'
             % unique_name()),
            ("POST", path, '{"content": "hello\\u0000world"}'),
            ("POST", "/v1/agents/%s/sessions" % self.agent["id"], '{"title": "\\u0000"}'),
        ]
        for method, p, raw in cases:
            self.assertRefused(s.request(method, p, raw_body=raw), raw, "NUL")
        for raw in (b'{"content": "\xff\xfe"}', b'{"content": "\xc0\xaf"}',
                    b'{"content": "\xed\xa0\x80"}', b'{"content": "a\x00b"}',
                    b'{"content": "\\ud800"}'):
            self.assertError(s.request("POST", path, raw_body=raw), 400, "invalid_argument",
                             "message %r" % raw)
        self.assertEqual(len(s.list_all(path)), messages)
        self.assertEqual(self.event_count(), n)

    def test_over_long_strings_and_numbers_out_of_range(self):
        s = self.server
        n = self.event_count()
        bad = [
            {"name": "n" * 10000, "model": "local"},
            {"name": unique_name(), "model": "local", "instructions": "i" * (300 * 1024)},
            {"name": unique_name(), "model": "local", "config": {"max_steps": 18446744073709551615}},
            {"name": unique_name(), "model": "local", "config": {"max_steps": -9223372036854775808}},
            {"name": unique_name(), "model": "local", "config": {"local_latency_ms": 1e300}},
            {"name": unique_name(), "model": "local", "config": {"cache_group": "g" * 300}},
        ]
        for body in bad:
            self.assertError(s.request("POST", "/v1/agents", body), 400, "invalid_argument",
                             "agent %s" % json.dumps(body)[:120])
        for raw in ('{"name": "x", "model": "local", "config": {"max_steps": 1e400}}',
                    '{"name": "x", "model": "local", "config": {"max_steps": -1e400}}'):
            self.assertError(s.request("POST", "/v1/agents", raw_body=raw), 400,
                             "invalid_argument", raw)
        self.assertError(s.request("POST", "/v1/agents/%s/sessions" % self.agent["id"],
                                   {"title": "t" * 5000}), 400, "invalid_argument", "long title")
        self.assertError(s.request("POST", "/v1/tokens", {"name": "t" * 5000, "role": "user"}),
                         400, "invalid_argument", "long token name")
        self.assertEqual(self.event_count(), n)


if __name__ == "__main__":
    unittest.main()

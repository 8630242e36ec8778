"""Keel as an MCP server: `/v1/mcp`, the streamable HTTP transport of the Model Context Protocol,
end to end over HTTP against a real `keel serve`.

`initialize` (POST /v1/mcp?agent={id}) opens a Keel session for the agent and answers its id in
the Mcp-Session-Id header; every later request names that session. `tools/list` offers the tools
the agent's `tools` list allows; `tools/call` posts a direct call (a message of role `call`)
whose run passes the one call through the gateway — the policy for the token's role, approvals,
the effect journal — without the model, and answers a CallToolResult, as one JSON body or as an
SSE stream (`Accept: text/event-stream`) that first says which approval the call waits for.
`notifications/cancelled` cancels a waiting call; DELETE /v1/mcp closes the session. Requests
whose Host is not a loopback name, or whose Origin names another host, are refused (DNS
rebinding protection).

Every test works in a tenant of its own (POST /v1/tenants), so a tenant policy set by one test
never reaches another. notes.append appends its line to $KEEL_HOME/workspaces/<agent>/notes.txt.
"""

import http.client
import json
import os
import socket
import threading
import time
import unittest

import keel_harness
from keel_harness import RFC3339_MS, KeelServer, KeelTestCase, unique_name

LATEST = "2025-11-25"
VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")

ACCEPT_JSON = "application/json"
ACCEPT_SSE = "application/json, text/event-stream"

# JSON-RPC error codes
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

# The tenant policy of the approval tests: everything with read and write, no approval, except
# notes.append, which always needs a human.
APPROVAL_FRAME = {"rules": [
    {"tool": "*", "rights": ["read", "write"], "approval": "never"},
    {"tool": "notes.append", "rights": ["write"], "approval": "always"},
]}

NOTE_TOOLS = ["time.now", "notes.append"]
BUILTINS = {"time.now", "notes.append", "files.read", "files.write", "files.list", "exec"}

STREAM_TIMEOUT = 60  # seconds without a byte before a stream read fails the test
UNKNOWN_ID = "01a00000-0000-7000-8000-000000000000"

_SESSION = object()  # default: the client's own session id


def dumps(value):
    return json.dumps(value, separators=(",", ":"))


def parse_sse(text):
    """SSE text -> list of (event name, data text) for each frame with data."""
    frames = []
    event, data = None, []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if line == "":
            if data:
                frames.append((event, "\n".join(data)))
            event, data = None, []
            continue
        if line.startswith(":"):
            continue  # a comment (keep-alive)
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
    if data:
        frames.append((event, "\n".join(data)))
    return frames


class McpReply:
    """One answer of POST /v1/mcp: HTTP status, lower-cased headers, raw text, and the JSON-RPC
    messages it carried (one for a JSON body, each frame's for an SSE stream)."""

    def __init__(self, status, headers, text):
        self.status = status
        self.headers = headers
        self.text = text
        self.content_type = headers.get("content-type", "")
        self.sse = "text/event-stream" in self.content_type
        self.frames = []
        self.messages = []
        if self.sse:
            self.frames = parse_sse(text)
            self.messages = [json.loads(data) for _, data in self.frames]
        elif text:
            try:
                self.messages = [json.loads(text)]
            except ValueError:
                self.messages = []
        self.body = self.messages[0] if (self.messages and not self.sse) else None

    @property
    def response(self):
        """The JSON-RPC response (the last message with an id and a result or an error)."""
        found = [m for m in self.messages
                 if isinstance(m, dict) and ("result" in m or "error" in m)]
        return found[-1] if found else None

    def __repr__(self):
        return "McpReply(%s, %r, %r)" % (self.status, self.content_type, self.text[:2000])


class McpStream:
    """A POST /v1/mcp whose answer is read incrementally: next() gives the JSON-RPC messages of the
    SSE frames as they arrive, so a test can act (approve, cancel) while the stream is open."""

    def __init__(self, addr, headers, body, timeout=STREAM_TIMEOUT):
        host, port = addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        self.conn.request("POST", "/v1/mcp", body=body, headers=headers)
        self.sock = self.conn.sock  # kept: a Connection: close answer detaches it from conn
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}
        self.events = []  # the event names of the frames read so far
        self.ended = False

    def next(self, timeout=STREAM_TIMEOUT):
        """The next JSON-RPC message, or None when the server ended the stream. A stream silent
        for `timeout` seconds fails the test."""
        if self.ended:
            return None
        self.sock.settimeout(timeout)
        event, data = None, []
        while True:
            try:
                line = self.resp.readline()
            except (socket.timeout, TimeoutError):
                raise AssertionError("MCP stream: nothing within %ss (frames so far: %s)"
                                     % (timeout, self.events))
            if not line:
                self.ended = True
                if data:
                    raise AssertionError("MCP stream ended inside a frame: %r" % data)
                return None
            line = line.decode("utf-8").rstrip("\r\n")
            if line == "":
                if data:
                    self.events.append(event)
                    return json.loads("\n".join(data))
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value

    def rest(self, timeout=STREAM_TIMEOUT):
        """Every message until the server ends the stream."""
        out = []
        while True:
            m = self.next(timeout)
            if m is None:
                return out
            out.append(m)

    def close(self):
        try:
            if self.sock is not None:
                self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.resp.close()
        except Exception:  # noqa: BLE001
            pass
        self.conn.close()


class McpClient:
    """A tiny MCP client over http.client: one bearer token, one MCP session at a time."""

    def __init__(self, server, token):
        self.server = server
        self.token = token
        self.session_id = None
        self._ids = 0

    def next_id(self):
        self._ids += 1
        return self._ids

    def headers(self, accept=ACCEPT_JSON, session_id=_SESSION, token=_SESSION, extra=None):
        h = {"Accept": accept}
        token = self.token if token is _SESSION else token
        if token:
            h["Authorization"] = "Bearer " + token
        sid = self.session_id if session_id is _SESSION else session_id
        if sid:
            h["Mcp-Session-Id"] = sid
        if extra:
            h.update(extra)
        return h

    def send(self, method, message=None, raw=None, query="", accept=ACCEPT_JSON,
             session_id=_SESSION, token=_SESSION, headers=None, timeout=120):
        """One HTTP request to /v1/mcp (headers may override Host); returns an McpReply."""
        host, port = self.server.addr.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            hdrs = self.headers(accept, session_id, token, headers)
            body = None
            if raw is not None:
                body = raw.encode() if isinstance(raw, str) else raw
            elif message is not None:
                body = json.dumps(message).encode()
            if body is not None:
                hdrs["Content-Type"] = "application/json"
            conn.request(method, "/v1/mcp" + query, body=body, headers=hdrs)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
            return McpReply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, text)
        finally:
            conn.close()

    def post(self, message=None, **kw):
        return self.send("POST", message, **kw)

    def initialize_reply(self, agent_id, version=LATEST, client_name="keel-it", id=0, **kw):
        params = {"protocolVersion": version, "capabilities": {}}
        if version is None:
            del params["protocolVersion"]
        if client_name is not None:
            params["clientInfo"] = {"name": client_name, "version": "1.0"}
        query = "?agent=" + agent_id if agent_id is not None else ""
        return self.post({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params},
                         query=query, session_id=None, **kw)

    def initialize(self, agent_id, version=LATEST, client_name="keel-it"):
        """initialize + notifications/initialized; returns the result and keeps the session id."""
        reply = self.initialize_reply(agent_id, version, client_name)
        if reply.status != 200 or not reply.body or "result" not in reply.body:
            raise AssertionError("initialize failed: %r\n%s" % (reply, self.server.log_tail(30)))
        self.session_id = reply.headers.get("mcp-session-id")
        if not self.session_id:
            raise AssertionError("initialize answered no Mcp-Session-Id: %r" % reply.headers)
        note = self.notify("notifications/initialized")
        if note.status != 202:
            raise AssertionError("notifications/initialized -> %r" % note)
        return reply.body["result"]

    def request_message(self, method, params=None, id=None):
        m = {"jsonrpc": "2.0", "id": self.next_id() if id is None else id, "method": method}
        if params is not None:
            m["params"] = params
        return m

    def rpc(self, method, params=None, id=None, accept_sse=False, **kw):
        """A JSON-RPC request; returns the McpReply (its .response is the JSON-RPC response)."""
        return self.post(self.request_message(method, params, id),
                         accept=ACCEPT_SSE if accept_sse else ACCEPT_JSON, **kw)

    def result(self, method, params=None, **kw):
        """The result of a request that must succeed."""
        reply = self.rpc(method, params, **kw)
        r = reply.response
        if reply.status != 200 or r is None or "result" not in r:
            raise AssertionError("%s failed: %r\n%s" % (method, reply, self.server.log_tail(30)))
        return r["result"]

    def notify(self, method, params=None, **kw):
        m = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            m["params"] = params
        return self.post(m, **kw)

    def call(self, name, arguments=None, accept_sse=False, **kw):
        """tools/call; returns the CallToolResult."""
        params = {"name": name}
        if arguments is not None:
            params["arguments"] = arguments
        return self.result("tools/call", params, accept_sse=accept_sse, **kw)

    def stream(self, method, params=None, id=None, session_id=_SESSION):
        """A request whose SSE answer is read as it arrives (McpStream)."""
        msg = self.request_message(method, params, id)
        hdrs = self.headers(ACCEPT_SSE, session_id)
        hdrs["Content-Type"] = "application/json"
        return McpStream(self.server.addr, hdrs, json.dumps(msg).encode())

    def delete(self, **kw):
        return self.send("DELETE", **kw)


class Tenant(keel_harness.Tenant):
    """A tenant of its own, with MCP clients and the records these tests look at."""

    def agent(self, tools=None):
        return self.server.create_agent(tools=tools, token=self.token)

    def client(self, token=None):
        return McpClient(self.server, token or self.token)

    def session(self, session_id):
        return self.ok("GET", "/v1/sessions/%s" % session_id)

    def sessions_of(self, agent_id):
        return self.server.list_all("/v1/agents/%s/sessions" % agent_id, token=self.token)

    def messages(self, session_id):
        return self.server.list_all("/v1/sessions/%s/messages" % session_id, token=self.token)

    def runs(self, session_id):
        return self.server.list_all("/v1/runs?session_id=%s" % session_id, token=self.token)

    def run(self, run_id):
        return self.ok("GET", "/v1/runs/%s" % run_id)

    def steps(self, run_id):
        return self.server.steps(run_id, token=self.token)

    def events(self, **filters):
        q = "".join("&%s=%s" % kv for kv in filters.items())
        return self.ok("GET", "/v1/events?limit=500" + q)["items"]

    def approval(self, approval_id):
        return self.ok("GET", "/v1/approvals/%s" % approval_id)

    def decide(self, approval_id, verdict, body=None):
        return self.request("POST", "/v1/approvals/%s/%s" % (approval_id, verdict),
                            body if body is not None else {})

    def wait_pending(self, session_id, timeout=30):
        """The one pending approval of the session, once there is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [a for a in self.server.list_all("/v1/approvals?status=pending",
                                                     token=self.token)
                     if a["session_id"] == session_id]
            if found:
                assert len(found) == 1, found
                return found[0]
            time.sleep(0.05)
        raise AssertionError("no pending approval for session %s within %ss\n%s"
                             % (session_id, timeout, self.server.log_tail(30)))

    def notes(self, agent_id):
        """notes.txt of the agent's workspace as a list of lines, or None when never written."""
        path = os.path.join(self.server.home, "workspaces", agent_id, "notes.txt")
        try:
            with open(path) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return None


class McpTestCase(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def tenant(self, policy=None):
        t = Tenant(self.server)
        if policy is not None:
            t.ok("PUT", "/v1/policy", policy)
        return t

    def port(self):
        return self.server.addr.rsplit(":", 1)[1]

    def assertRpcError(self, reply, http_status, code, id=None, what=""):
        """An answer that is a JSON-RPC error with this HTTP status, code and id."""
        self.assertEqual(reply.status, http_status, "%s: %r" % (what, reply))
        self.assertIn("json", reply.content_type, "%s: %r" % (what, reply))
        body = reply.body
        self.assertIsInstance(body, dict, "%s: %r" % (what, reply))
        self.assertEqual(body.get("jsonrpc"), "2.0", "%s: %r" % (what, body))
        self.assertNotIn("result", body, what)
        self.assertEqual(body.get("id"), id, "%s: %r" % (what, body))
        err = body.get("error")
        self.assertIsInstance(err, dict, "%s: %r" % (what, body))
        self.assertEqual(err.get("code"), code, "%s: %r" % (what, body))
        self.assertIsInstance(err.get("message"), str, what)
        self.assertTrue(err["message"], what)
        return err

    def assertToolText(self, result, is_error, what=""):
        """A CallToolResult with one text item; returns that text."""
        self.assertIsInstance(result, dict, what)
        self.assertIs(result.get("isError"), is_error, "%s: %r" % (what, result))
        content = result.get("content")
        self.assertIsInstance(content, list, "%s: %r" % (what, result))
        self.assertEqual(len(content), 1, "%s: %r" % (what, result))
        self.assertEqual(content[0].get("type"), "text", "%s: %r" % (what, result))
        self.assertIsInstance(content[0].get("text"), str, what)
        return content[0]["text"]

    def the_call_run(self, t, session_id, index=-1):
        """(message, run, tool steps) of a direct call posted into the session."""
        msgs = t.messages(session_id)
        calls = [m for m in msgs if m["role"] == "call"]
        self.assertTrue(calls, "no message of role call in %r" % msgs)
        msg = calls[index]
        run = t.server.wait_run(msg["run_id"], token=t.token)
        return msg, run, t.steps(run["id"])


class McpTransportTest(McpTestCase):
    """initialize, sessions, the JSON-RPC envelope, Host and Origin checks, DELETE."""

    def test_initialize_and_version_negotiation(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        reply = c.initialize_reply(agent["id"], "2025-06-18", client_name="claude-code", id=1)
        self.assertEqual(reply.status, 200, reply)
        self.assertIn("application/json", reply.content_type)
        body = reply.body
        self.assertEqual(body["jsonrpc"], "2.0")
        self.assertEqual(body["id"], 1)
        self.assertNotIn("error", body)
        res = body["result"]
        self.assertEqual(res["protocolVersion"], "2025-06-18", "the asked version is answered")
        self.assertIn("tools", res["capabilities"])
        self.assertIn("logging", res["capabilities"])
        self.assertEqual(res["serverInfo"]["name"], "keel")
        self.assertIsInstance(res["serverInfo"].get("version"), str)
        self.assertIsInstance(res["instructions"], str)
        self.assertIn(agent["name"], res["instructions"])

        sid = reply.headers.get("mcp-session-id")
        self.assertTrue(sid, "no Mcp-Session-Id header: %r" % reply.headers)
        sess = t.session(sid)
        self.assertEqual(sess["id"], sid)
        self.assertEqual(sess["agent_id"], agent["id"])
        self.assertEqual(sess["title"], "MCP: claude-code")
        self.assertEqual(sess["status"], "idle")
        self.assertIn(sid, [s["id"] for s in t.sessions_of(agent["id"])])
        created = [e for e in t.events(session_id=sid) if e["type"] == "session.created@v1"]
        self.assertEqual(len(created), 1, created)
        self.assertEqual(created[0]["payload"].get("via"), "mcp")

        # every supported version is answered as asked; any other gets the newest
        for v in VERSIONS:
            r = c.initialize_reply(agent["id"], v)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.body["result"]["protocolVersion"], v)
        for v in ("2024-11-05", "2099-01-01", ""):
            r = c.initialize_reply(agent["id"], v)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.body["result"]["protocolVersion"], LATEST, "asked %r" % v)
        r = c.initialize_reply(agent["id"], None, client_name=None, id="init-x")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body["id"], "init-x", "a string id is echoed")
        self.assertEqual(r.body["result"]["protocolVersion"], LATEST)
        other = r.headers["mcp-session-id"]
        self.assertNotEqual(other, sid, "every initialize opens a session of its own")
        self.assertEqual(t.session(other)["title"], "MCP: MCP client")

        # the session works: the negotiated version may be sent on later requests
        c.session_id = sid
        self.assertEqual(c.notify("notifications/initialized").status, 202)
        self.assertEqual(c.result("ping", headers={"MCP-Protocol-Version": "2025-06-18"}), {})

    def test_initialize_errors(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        before = len(t.sessions_of(agent["id"]))

        r = c.initialize_reply(None, id=5)
        err = self.assertRpcError(r, 200, INVALID_PARAMS, id=5, what="no ?agent=")
        self.assertIn("agent", err["message"])
        self.assertNotIn("mcp-session-id", r.headers)

        # odd clientInfo and protocolVersion values are tolerated, not a server error
        for bad in (7, None, {"x": 1}):
            r = c.post({"jsonrpc": "2.0", "id": 9, "method": "initialize",
                        "params": {"protocolVersion": bad, "clientInfo": {"name": bad}}},
                       query="?agent=" + agent["id"], session_id=None)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.body["result"]["protocolVersion"], LATEST, r)
            sid = r.headers.get("mcp-session-id")
            self.assertEqual(t.session(sid)["title"], "MCP: MCP client")
        before = len(t.sessions_of(agent["id"]))

        r = c.initialize_reply(UNKNOWN_ID, id=6)
        err = self.assertRpcError(r, 200, INVALID_PARAMS, id=6, what="unknown agent")
        self.assertIn(UNKNOWN_ID, err["message"])
        self.assertNotIn("mcp-session-id", r.headers)

        # another tenant's agent is unknown here, and no session is opened in either tenant
        other = self.tenant()
        r = other.client().initialize_reply(agent["id"], id=7)
        self.assertRpcError(r, 200, INVALID_PARAMS, id=7, what="another tenant's agent")
        self.assertNotIn("mcp-session-id", r.headers)

        # no token, a wrong token: HTTP 401
        r = c.initialize_reply(agent["id"], token=None)
        self.assertEqual(r.status, 401, r)
        self.assertNotIn("mcp-session-id", r.headers)
        r = c.initialize_reply(agent["id"], token="keel_" + "A" * 43)
        self.assertEqual(r.status, 401, r)

        # initialize must be a request (with an id)
        r = c.post({"jsonrpc": "2.0", "method": "initialize",
                    "params": {"protocolVersion": LATEST}}, query="?agent=" + agent["id"],
                   session_id=None)
        self.assertRpcError(r, 400, INVALID_REQUEST, what="initialize without an id")
        self.assertNotIn("mcp-session-id", r.headers)

        self.assertEqual(len(t.sessions_of(agent["id"])), before, "a refused initialize opened "
                                                                  "a session")

    def test_session_id_and_protocol_version_errors(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])

        err = self.assertRpcError(c.rpc("ping", id=1, session_id=None), 400, INVALID_REQUEST,
                                  what="no Mcp-Session-Id")
        self.assertIn("Mcp-Session-Id", err["message"])
        self.assertEqual(c.notify("notifications/initialized", session_id=None).status, 400,
                         "a notification without a session")
        self.assertEqual(c.rpc("tools/list", session_id=None).status, 400)
        self.assertRpcError(c.rpc("ping", id=2, session_id=UNKNOWN_ID), 404, INVALID_REQUEST,
                            what="unknown session")
        self.assertEqual(c.rpc("tools/call", {"name": "time.now"}, session_id=UNKNOWN_ID).status,
                         404)

        # another tenant's MCP session is unknown to this tenant's token, and the other way round
        other = self.tenant()
        oc = other.client()
        oc.initialize(other.agent(tools=NOTE_TOOLS)["id"])
        self.assertRpcError(c.rpc("ping", id=3, session_id=oc.session_id), 404, INVALID_REQUEST,
                            what="another tenant's session")
        self.assertEqual(oc.rpc("tools/list", session_id=c.session_id).status, 404)
        self.assertEqual(oc.result("ping"), {})

        # MCP-Protocol-Version: a supported value is fine, any other is a 400
        for v in VERSIONS:
            self.assertEqual(c.result("ping", headers={"MCP-Protocol-Version": v}), {}, v)
        for v in ("1999-01-01", "2024-11-05", "latest"):
            err = self.assertRpcError(c.rpc("ping", headers={"MCP-Protocol-Version": v}), 400,
                                      INVALID_REQUEST, what="MCP-Protocol-Version %s" % v)
            self.assertIn(v, err["message"])
        self.assertEqual(c.rpc("tools/list", headers={"MCP-Protocol-Version": "1999-01-01"})
                         .status, 400)
        self.assertEqual(c.result("ping"), {}, "the session still works")

    def test_envelope(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])

        # notifications and responses: 202 with no body
        for msg in ({"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "method": "notifications/roots/list_changed",
                     "params": {}},
                    {"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 12345, "reason": "nothing in flight"}},
                    {"jsonrpc": "2.0", "id": 99, "result": {}}):
            r = c.post(msg)
            self.assertEqual(r.status, 202, "%r -> %r" % (msg, r))
            self.assertEqual(r.text, "", "202 has no body: %r" % r)

        for id in (7, "req-a", 0):
            r = c.rpc("ping", id=id)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.body, {"jsonrpc": "2.0", "id": id, "result": {}})
        self.assertEqual(c.result("logging/setLevel", {"level": "debug"}), {})

        err = self.assertRpcError(c.rpc("resources/list", id=8), 200, METHOD_NOT_FOUND, id=8,
                                  what="unknown method")
        self.assertIn("resources/list", err["message"])
        self.assertRpcError(c.rpc("prompts/get", {"name": "x"}, id="p"), 200, METHOD_NOT_FOUND,
                            id="p", what="unknown method")

        # a batch, a body that is no JSON, no JSON-RPC 2.0 message, an id of another type
        self.assertRpcError(c.post([c.request_message("ping", id=9)]), 400, INVALID_REQUEST,
                            what="batch")
        self.assertRpcError(c.post(raw="{not json"), 400, PARSE_ERROR, what="parse error")
        self.assertRpcError(c.post(raw=""), 400, PARSE_ERROR, what="empty body")
        self.assertRpcError(c.post({"jsonrpc": "1.0", "id": 1, "method": "ping"}), 400,
                            INVALID_REQUEST, what="jsonrpc 1.0")
        self.assertRpcError(c.post({"id": 1, "method": "ping"}), 400, INVALID_REQUEST,
                            what="no jsonrpc member")
        self.assertRpcError(c.post("ping"), 400, INVALID_REQUEST, what="a JSON string")
        for bad in (1.5, {"x": 1}, [1], True):
            self.assertRpcError(c.post({"jsonrpc": "2.0", "id": bad, "method": "ping"}), 400,
                                INVALID_REQUEST, what="id %r" % (bad,))
        self.assertEqual(c.result("ping"), {}, "the session still works")

    def test_host_and_origin(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        port = self.port()
        before = len(t.sessions_of(agent["id"]))

        # DNS rebinding: a name other than a loopback one is refused, with or without a port
        for host in ("evil.example:%s" % port, "evil.example", "10.0.0.1:%s" % port,
                     "localhost.evil.example:%s" % port, "127.0.0.1.nip.io:%s" % port):
            r = c.initialize_reply(agent["id"], headers={"Host": host})
            err = self.assertRpcError(r, 403, INVALID_REQUEST, id=None, what="Host %s" % host)
            self.assertNotIn("mcp-session-id", r.headers)
            self.assertIn("Host", err["message"])
        self.assertEqual(len(t.sessions_of(agent["id"])), before,
                         "a request for a foreign Host opened a session")

        # loopback names are served, with any port
        for host in ("localhost:%s" % port, "localhost", "127.0.0.1", "127.0.0.1:1",
                     "[::1]:%s" % port, "[::1]", "LocalHost:%s" % port):
            r = c.initialize_reply(agent["id"], headers={"Host": host})
            self.assertEqual(r.status, 200, "Host %s: %r" % (host, r))
            self.assertTrue(r.headers.get("mcp-session-id"), host)

        c.initialize(agent["id"])
        self.assertRpcError(c.rpc("ping", headers={"Host": "evil.example:%s" % port}), 403,
                            INVALID_REQUEST, what="ping for a foreign Host")
        self.assertEqual(c.result("ping", headers={"Host": "localhost:%s" % port}), {})

        # an Origin must name the host the request was sent to
        for origin in ("http://evil.example", "http://evil.example:%s" % port,
                       "http://localhost:%s" % port, "null"):
            r = c.rpc("ping", headers={"Origin": origin})
            err = self.assertRpcError(r, 403, INVALID_REQUEST, what="Origin %s" % origin)
            self.assertIn("Origin", err["message"])
        r = c.initialize_reply(agent["id"], headers={"Origin": "https://evil.example"})
        self.assertEqual(r.status, 403, r)
        for origin in ("http://127.0.0.1:%s" % port, "http://127.0.0.1"):
            self.assertEqual(c.result("ping", headers={"Origin": origin}), {}, origin)
        self.assertEqual(c.result("ping", headers={"Host": "localhost:%s" % port,
                                                   "Origin": "http://localhost:%s" % port}), {})

        # DELETE is guarded the same way
        r = c.delete(headers={"Host": "evil.example"})
        self.assertEqual(r.status, 403, r)
        r = c.delete(headers={"Origin": "http://evil.example"})
        self.assertEqual(r.status, 403, r)
        self.assertEqual(t.session(c.session_id)["status"], "idle", "a refused DELETE closed it")
        self.assertEqual(c.result("ping"), {})

    def test_delete_closes_the_session(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])
        sid = c.session_id
        keep = t.client()
        keep.initialize(agent["id"])

        r = c.delete(session_id=None)
        self.assertRpcError(r, 400, INVALID_REQUEST, what="DELETE without Mcp-Session-Id")
        self.assertEqual(c.delete(session_id=UNKNOWN_ID).status, 404)
        self.assertEqual(t.session(sid)["status"], "idle")

        r = c.delete(headers={"MCP-Protocol-Version": "1999-01-01"})
        self.assertEqual(r.status, 400, r)
        self.assertEqual(t.session(sid)["status"], "idle", "a DELETE of another version closed it")
        r = c.delete()
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.text, "")
        self.assertEqual(t.session(sid)["status"], "inactive")
        closed = [e for e in t.events(session_id=sid) if e["type"] == "session.closed@v1"]
        self.assertEqual(len(closed), 1, closed)

        # the closed session is gone for MCP: the client must initialize again
        self.assertRpcError(c.rpc("ping", id=1), 404, INVALID_REQUEST, what="ping after DELETE")
        self.assertEqual(c.rpc("tools/list").status, 404)
        self.assertEqual(c.rpc("tools/call", {"name": "time.now", "arguments": {}}).status, 404)
        self.assertEqual(c.notify("notifications/initialized").status, 404)
        self.assertEqual(c.delete().status, 404, "DELETE twice")
        self.assertEqual(t.runs(sid), [], "a call into a closed session started a run")

        # other MCP sessions are untouched; a new initialize works
        self.assertEqual(keep.result("ping"), {})
        c.initialize(agent["id"])
        self.assertNotEqual(c.session_id, sid)
        self.assertEqual(c.result("ping"), {})


class McpToolsTest(McpTestCase):
    """tools/list and tools/call: the gateway's decisions, approvals over SSE, cancellation."""

    def test_tools_list(self):
        t = self.tenant()
        c = t.client()
        c.initialize(t.agent(tools=NOTE_TOOLS)["id"])
        tools = c.result("tools/list")["tools"]
        by_name = {x["name"]: x for x in tools}
        self.assertEqual(sorted(by_name), sorted(NOTE_TOOLS), "exactly the agent's tools")
        self.assertEqual(len(tools), 2, tools)
        for x in tools:
            self.assertIsInstance(x["description"], str)
            self.assertTrue(x["description"], x)
            self.assertEqual(x["inputSchema"].get("type"), "object", x)
            self.assertEqual(set(x["annotations"]),
                             {"readOnlyHint", "idempotentHint", "openWorldHint"}, x)
        note = by_name["notes.append"]
        self.assertIn("line", note["inputSchema"]["properties"])
        self.assertIn("line", note["inputSchema"].get("required", []))
        self.assertEqual(note["annotations"], {"readOnlyHint": False, "idempotentHint": False,
                                               "openWorldHint": False})
        self.assertEqual(by_name["time.now"]["annotations"],
                         {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False})

        # an agent with no list is offered nothing; one with "*" every built-in tool
        c0 = t.client()
        c0.initialize(t.agent(tools=[])["id"])
        self.assertEqual(c0.result("tools/list")["tools"], [])
        c2 = t.client()
        c2.initialize(t.agent(tools=["*"])["id"])
        by_name = {x["name"]: x for x in c2.result("tools/list")["tools"]}
        self.assertTrue(BUILTINS <= set(by_name), sorted(by_name))
        self.assertEqual(by_name["exec"]["annotations"]["idempotentHint"], False)
        self.assertEqual(by_name["exec"]["annotations"]["readOnlyHint"], False)
        self.assertEqual(by_name["files.write"]["annotations"],
                         {"readOnlyHint": False, "idempotentHint": True, "openWorldHint": False})
        self.assertEqual(by_name["files.read"]["annotations"]["readOnlyHint"], True)

        # a prefix glob
        c3 = t.client()
        c3.initialize(t.agent(tools=["files.*"])["id"])
        names = sorted(x["name"] for x in c3.result("tools/list")["tools"])
        self.assertEqual(names, ["files.list", "files.read", "files.write"])

    def test_allowed_call(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])
        sid = c.session_id
        line = unique_name("line")

        reply = c.rpc("tools/call", {"name": "notes.append", "arguments": {"line": line}}, id=41)
        self.assertEqual(reply.status, 200, reply)
        self.assertIn("application/json", reply.content_type)
        self.assertEqual(reply.body["id"], 41)
        res = reply.body["result"]
        text = self.assertToolText(res, False, "notes.append")
        self.assertEqual(json.loads(text), {"appended": line})
        self.assertEqual(res.get("structuredContent"), {"appended": line})
        self.assertEqual(t.notes(agent["id"]), [line], "the line, exactly once")

        # the run is recorded: a message of role call, a run done, one tool step, no model step
        [msg] = t.messages(sid)
        self.assertEqual(msg["role"], "call")
        recorded = json.loads(msg["content"])
        self.assertEqual(recorded["name"], "notes.append")
        self.assertEqual(recorded["arguments"], {"line": line})
        self.assertTrue(recorded["id"].startswith("call_"), recorded)
        run = t.run(msg["run_id"])
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["session_id"], sid)
        self.assertEqual(run["agent_id"], agent["id"])
        self.assertEqual(run["message_id"], msg["id"])
        self.assertEqual(json.loads(run["output"]), {"appended": line})
        self.assertEqual((run["usage"]["input_tokens"], run["usage"]["output_tokens"],
                          run["usage"]["model_calls"]), (0, 0, 0), "no model call")
        steps = t.steps(run["id"])
        self.assertEqual([s["kind"] for s in steps], ["tool"], steps)
        step = steps[0]
        self.assertEqual(step["status"], "succeeded")
        self.assertEqual(step["input"]["tool"], "notes.append")
        self.assertEqual(step["input"]["call_id"], recorded["id"])
        self.assertEqual(step["input"]["arguments"], {"line": line})
        self.assertEqual(step["input"]["decision"]["outcome"], "allow")
        self.assertEqual(step["output"], {"appended": line})
        self.assertEqual(step["tool_call"]["status"], "succeeded")
        self.assertEqual(step["tool_call"]["effect_class"], "once")
        self.assertEqual(step["tool_call"]["effect_key"], "%s:%s" % (run["id"], recorded["id"]))
        types = [e["type"] for e in t.events(run_id=run["id"])]
        self.assertIn("tool.call.started@v1", types)
        self.assertIn("tool.call.completed@v1", types)
        self.assertIn("run.completed@v1", types)
        created = [e for e in t.events(run_id=run["id"]) if e["type"] == "message.created@v1"]
        self.assertEqual([e["payload"]["role"] for e in created], ["call"])
        self.assertEqual(t.session(sid)["status"], "idle")

        # the same over SSE: one frame, the response, then the stream ends
        reply = c.rpc("tools/call", {"name": "time.now", "arguments": {}}, id="t1",
                      accept_sse=True)
        self.assertEqual(reply.status, 200, reply)
        self.assertIn("text/event-stream", reply.content_type)
        self.assertEqual([e for e, _ in reply.frames], ["message"], reply)
        [only] = reply.messages
        self.assertEqual(only["id"], "t1")
        now = self.assertToolText(only["result"], False, "time.now")
        self.assertRegex(now, RFC3339_MS)
        self.assertNotIn("structuredContent", only["result"], "a string result has none")

        # a second append: one more line, one more call message; no assistant message ever
        line2 = unique_name("line")
        res = c.call("notes.append", {"line": line2}, accept_sse=True)
        self.assertEqual(res["structuredContent"], {"appended": line2})
        self.assertEqual(t.notes(agent["id"]), [line, line2])
        msgs = t.messages(sid)
        self.assertEqual([m["role"] for m in msgs], ["call", "call", "call"], msgs)
        self.assertEqual([r["status"] for r in t.runs(sid)], ["done", "done", "done"])

    def test_refused_calls(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])
        sid = c.session_id

        def refused(name, arguments, expect_text, accept_sse=False):
            res = c.call(name, arguments, accept_sse=accept_sse)
            text = self.assertToolText(res, True, name)
            self.assertIn(expect_text, text)
            self.assertTrue(text.startswith("error: "), text)
            self.assertNotIn("structuredContent", res)
            msg, run, steps = self.the_call_run(t, sid)
            self.assertEqual(json.loads(msg["content"])["name"], name)
            self.assertEqual(run["status"], "done", run)
            self.assertEqual([s["kind"] for s in steps], ["tool"], steps)
            self.assertEqual(steps[0]["status"], "denied", steps)
            self.assertEqual(steps[0]["input"]["decision"]["outcome"], "deny")
            self.assertIn(expect_text, steps[0]["input"]["decision"]["reason"])
            self.assertIn(expect_text, steps[0]["output"]["error"])
            types = [e["type"] for e in t.events(run_id=run["id"])]
            self.assertIn("tool.call.denied@v1", types)
            self.assertNotIn("tool.call.started@v1", types)
            return text

        text = refused("notes.append", {"line": 5},
                       "the arguments do not match notes.append's schema")
        self.assertIn("arguments.line", text)
        refused("notes.append", {"line": "x", "extra": 1}, "arguments.extra", accept_sse=True)
        refused("notes.append", {}, "notes.append's schema")
        refused("no.such.tool", {}, "unknown tool: no.such.tool")
        refused("files.read", {"path": "x"}, "the agent may not call files.read",
                accept_sse=True)
        self.assertIsNone(t.notes(agent["id"]), "a refused call wrote")

        # malformed params are JSON-RPC errors and start no run
        runs = len(t.runs(sid))
        self.assertRpcError(c.rpc("tools/call", {}, id=1), 200, INVALID_PARAMS, id=1,
                            what="no name")
        self.assertRpcError(c.rpc("tools/call", {"name": 5}, id=2), 200, INVALID_PARAMS, id=2,
                            what="name not a string")
        self.assertRpcError(c.rpc("tools/call", {"name": ""}, id=5), 200, INVALID_PARAMS, id=5,
                            what="empty name")
        self.assertRpcError(c.rpc("tools/call", {"name": "notes.append", "arguments": "x"},
                                  id=3), 200, INVALID_PARAMS, id=3, what="arguments a string")
        self.assertRpcError(c.rpc("tools/call", {"name": "notes.append", "arguments": [1]},
                                  id=4), 200, INVALID_PARAMS, id=4, what="arguments an array")
        self.assertEqual(len(t.runs(sid)), runs, "a malformed tools/call started a run")
        # arguments may be left out for a tool that takes none
        self.assertRegex(self.assertToolText(c.call("time.now"), False), RFC3339_MS)

    def test_guest_token(self):
        t = self.tenant()
        agent = t.agent(tools=NOTE_TOOLS)
        guest, _ = t.new_token("guest")
        user, _ = t.new_token("user")
        g = t.client(guest)
        g.initialize(agent["id"])
        # the guest sees the agent's tools, but the default policy refuses it writes
        self.assertEqual(sorted(x["name"] for x in g.result("tools/list")["tools"]),
                         sorted(NOTE_TOOLS))
        text = self.assertToolText(g.call("notes.append", {"line": "from a guest"}), True,
                                   "guest notes.append")
        self.assertIn("guests may only use read tools", text)
        msg, run, steps = self.the_call_run(t, g.session_id)
        self.assertEqual(steps[0]["status"], "denied", steps)
        self.assertIn("guests may only use read tools", steps[0]["input"]["decision"]["reason"])
        self.assertIsNone(t.notes(agent["id"]))
        # over SSE too
        res = g.call("notes.append", {"line": "again"}, accept_sse=True)
        self.assertIn("guests may only use read tools", self.assertToolText(res, True))
        self.assertIsNone(t.notes(agent["id"]))
        # read tools are fine for a guest
        self.assertRegex(self.assertToolText(g.call("time.now", {}), False), RFC3339_MS)

        # a user token, on the same agent, may write (no policy is set)
        u = t.client(user)
        u.initialize(agent["id"])
        res = u.call("notes.append", {"line": "from a user"})
        self.assertEqual(res["structuredContent"], {"appended": "from a user"})
        self.assertEqual(t.notes(agent["id"]), ["from a user"])

    def test_approval_over_sse(self):
        t = self.tenant(APPROVAL_FRAME)
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])
        sid = c.session_id
        line = unique_name("approved")

        s = c.stream("tools/call", {"name": "notes.append", "arguments": {"line": line}}, id=7)
        try:
            self.assertEqual(s.status, 200)
            self.assertIn("text/event-stream", s.headers.get("content-type", ""))
            note = s.next()
            self.assertIsNotNone(note, "the stream ended before it said anything")
            self.assertEqual(note.get("method"), "notifications/message", note)
            self.assertNotIn("id", note, "a notification has no id")
            data = note["params"]["data"]
            approval_id, run_id = data["approval_id"], data["run_id"]
            self.assertEqual(s.events, ["message"])

            a = t.approval(approval_id)
            self.assertEqual(a["status"], "pending")
            self.assertEqual(a["tool"], "notes.append")
            self.assertEqual(a["arguments"], {"line": line})
            self.assertEqual((a["run_id"], a["session_id"], a["agent_id"]),
                             (run_id, sid, agent["id"]))
            self.assertEqual(a["requested_by"], t.token_id)
            self.assertEqual(t.run(run_id)["status"], "waiting_for_approval")
            self.assertEqual(t.session(sid)["status"], "awaiting_approval")
            self.assertIsNone(t.notes(agent["id"]), "the tool ran before anyone approved it")
            [msg] = t.messages(sid)
            self.assertEqual((msg["role"], msg["run_id"]), ("call", run_id))
            self.assertEqual(a["call_id"], json.loads(msg["content"])["id"])

            # the session stays open while its call waits; other requests are served meanwhile
            r = c.delete()
            self.assertRpcError(r, 409, INVALID_REQUEST, what="DELETE while a call waits")
            self.assertEqual(t.session(sid)["status"], "awaiting_approval")
            self.assertEqual(c.result("ping"), {})

            st, decided, _ = t.decide(approval_id, "approve", {"reason": "fine"})
            self.assertEqual(st, 200, decided)
            final = s.next()
            self.assertIsNotNone(final, "the stream ended without the result")
            self.assertEqual(final.get("id"), 7, final)
            res = final["result"]
            self.assertEqual(json.loads(self.assertToolText(res, False)), {"appended": line})
            self.assertEqual(res["structuredContent"], {"appended": line})
            self.assertIsNone(s.next(), "the stream goes on after its response")
            self.assertEqual(s.events, ["message", "message"])
        finally:
            s.close()

        self.assertEqual(t.notes(agent["id"]), [line], "the approved line, exactly once")
        run = t.run(run_id)
        self.assertEqual(run["status"], "done", run)
        steps = t.steps(run_id)
        self.assertEqual([x["kind"] for x in steps], ["tool"], steps)
        self.assertEqual(steps[0]["status"], "succeeded")
        self.assertEqual(steps[0]["input"]["decision"]["outcome"], "approval")
        self.assertEqual(steps[0]["input"]["decision"]["approval_id"], approval_id)
        self.assertEqual(t.approval(approval_id)["status"], "approved")
        self.assertEqual(t.session(sid)["status"], "idle")
        # now the session may close
        self.assertEqual(c.delete().status, 204)
        self.assertEqual(t.session(sid)["status"], "inactive")

    def test_a_call_waiting_for_approval_reports_progress_to_a_client_that_asked(self):
        # Clients that reset their timeout on progress (the official SDKs, 60 s by default) keep
        # waiting for the human while notifications/progress arrive, at most 10 s apart.
        t = self.tenant(APPROVAL_FRAME)
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])
        line = unique_name("progress")
        s = c.stream("tools/call", {"name": "notes.append", "arguments": {"line": line},
                                    "_meta": {"progressToken": "tok-1"}}, id=9)
        try:
            note = s.next()
            self.assertEqual(note.get("method"), "notifications/message", note)
            approval_id = note["params"]["data"]["approval_id"]
            first = s.next(timeout=5)
            self.assertEqual(first.get("method"), "notifications/progress", first)
            self.assertEqual(first["params"]["progressToken"], "tok-1")
            self.assertEqual(first["params"]["progress"], 1)
            self.assertIn(approval_id, first["params"]["message"])
            started = time.monotonic()
            second = s.next(timeout=15)
            self.assertEqual(second.get("method"), "notifications/progress", second)
            self.assertEqual(second["params"]["progress"], 2)  # it increases
            self.assertLess(time.monotonic() - started, 12)
            st, decided, _ = t.decide(approval_id, "approve", {"reason": "fine"})
            self.assertEqual(st, 200, decided)
            final = s.next()
            self.assertEqual(final.get("id"), 9, final)
            self.assertEqual(final["result"]["structuredContent"], {"appended": line})
        finally:
            s.close()
        # Without a token: no progress, only the approval's notice and the result.
        s = c.stream("tools/call", {"name": "notes.append", "arguments": {"line": line + "-2"}},
                     id=10)
        try:
            note = s.next()
            self.assertEqual(note.get("method"), "notifications/message", note)
            t.decide(note["params"]["data"]["approval_id"], "approve", {"reason": "fine"})
            final = s.next()
            self.assertEqual(final.get("id"), 10, final)
        finally:
            s.close()

    def test_reject_over_sse(self):
        t = self.tenant(APPROVAL_FRAME)
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])
        s = c.stream("tools/call", {"name": "notes.append", "arguments": {"line": "no"}},
                     id="r-1")
        try:
            note = s.next()
            self.assertEqual(note.get("method"), "notifications/message", note)
            approval_id, run_id = note["params"]["data"]["approval_id"], \
                note["params"]["data"]["run_id"]
            st, decided, _ = t.decide(approval_id, "reject", {"reason": "not today"})
            self.assertEqual(st, 200, decided)
            final = s.next()
            self.assertIsNotNone(final, "the stream ended without the result")
            self.assertEqual(final.get("id"), "r-1")
            text = self.assertToolText(final["result"], True, "rejected")
            self.assertEqual(text, "error: a human rejected this call: not today")
            self.assertIsNone(s.next())
        finally:
            s.close()
        self.assertIsNone(t.notes(agent["id"]))
        run = t.run(run_id)
        self.assertEqual(run["status"], "done", run)
        [step] = t.steps(run_id)
        self.assertEqual(step["status"], "rejected")
        self.assertEqual(step["output"], {"error": "a human rejected this call: not today"})
        self.assertEqual(t.approval(approval_id)["status"], "rejected")
        types = [e["type"] for e in t.events(run_id=run_id)]
        self.assertNotIn("tool.call.started@v1", types)

    def test_approval_with_plain_json(self):
        """A client that accepts only JSON waits on its request until the call is decided."""
        t = self.tenant(APPROVAL_FRAME)
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])
        sid = c.session_id

        def waiting_call(line, id, out):
            try:
                out["reply"] = c.rpc("tools/call", {"name": "notes.append",
                                                    "arguments": {"line": line}}, id=id)
            except Exception as e:  # noqa: BLE001 - reported by the test
                out["error"] = e

        for verdict, line in (("approve", "plain yes"), ("reject", "plain no")):
            out = {}
            th = threading.Thread(target=waiting_call, args=(line, verdict, out), daemon=True)
            th.start()
            a = t.wait_pending(sid)
            self.assertEqual(a["arguments"], {"line": line})
            time.sleep(0.2)
            self.assertTrue(th.is_alive(), "the request answered before a decision: %r" % out)
            self.assertEqual(t.decide(a["id"], verdict)[0], 200)
            th.join(timeout=60)
            self.assertFalse(th.is_alive(), "no answer within 60s of the decision")
            self.assertNotIn("error", out, out)
            reply = out["reply"]
            self.assertEqual(reply.status, 200, reply)
            self.assertIn("application/json", reply.content_type)
            self.assertEqual(reply.body["id"], verdict)
            if verdict == "approve":
                self.assertEqual(reply.body["result"]["structuredContent"], {"appended": line})
                self.assertIs(reply.body["result"]["isError"], False)
            else:
                self.assertEqual(self.assertToolText(reply.body["result"], True),
                                 "error: a human rejected this call")
        self.assertEqual(t.notes(agent["id"]), ["plain yes"])
        self.assertEqual([r["status"] for r in t.runs(sid)], ["done", "done"])

    def test_cancel_while_waiting(self):
        t = self.tenant(APPROVAL_FRAME)
        agent = t.agent(tools=NOTE_TOOLS)
        c = t.client()
        c.initialize(agent["id"])
        sid = c.session_id
        bystander = t.client()
        bystander.initialize(agent["id"])

        s = c.stream("tools/call", {"name": "notes.append", "arguments": {"line": "never"}},
                     id="req-1")
        try:
            note = s.next()
            self.assertEqual(note.get("method"), "notifications/message", note)
            approval_id, run_id = note["params"]["data"]["approval_id"], \
                note["params"]["data"]["run_id"]

            # cancelling another request id, or the same id from another session, does nothing
            for who, rid in ((c, "req-2"), (c, 1), (bystander, "req-1")):
                r = who.notify("notifications/cancelled", {"requestId": rid})
                self.assertEqual(r.status, 202, r)
            time.sleep(0.3)
            self.assertEqual(t.run(run_id)["status"], "waiting_for_approval")
            self.assertEqual(t.approval(approval_id)["status"], "pending")

            r = c.notify("notifications/cancelled", {"requestId": "req-1",
                                                     "reason": "the user changed their mind"})
            self.assertEqual(r.status, 202, r)
            self.assertEqual(r.text, "")
            self.assertEqual(s.rest(timeout=30), [], "the stream answered a cancelled request")
        finally:
            s.close()

        run = t.run(run_id)
        self.assertEqual(run["status"], "cancelled", run)
        self.assertEqual(run["error"]["code"], "cancelled")
        a = t.approval(approval_id)
        self.assertEqual(a["status"], "cancelled")
        self.assertEqual(a["decided_by"], "system")
        self.assertIsNone(t.notes(agent["id"]))
        [step] = t.steps(run_id)
        self.assertEqual(step["status"], "rejected")
        self.assertEqual(t.session(sid)["status"], "idle")
        self.assertError(t.decide(approval_id, "approve"), 409, "conflict",
                         "approving a cancelled call")
        time.sleep(0.3)
        self.assertIsNone(t.notes(agent["id"]))
        # the session goes on: another call works
        res = c.call("time.now", {})
        self.assertRegex(self.assertToolText(res, False), RFC3339_MS)

        # a client that waits on a plain JSON request gets no JSON-RPC response once it
        # cancelled the request: an empty 204
        out = {}

        def waiting_call():
            try:
                out["reply"] = c.rpc("tools/call", {"name": "notes.append",
                                                    "arguments": {"line": "never either"}}, id=11)
            except Exception as e:  # noqa: BLE001 - reported by the test
                out["error"] = e

        th = threading.Thread(target=waiting_call, daemon=True)
        th.start()
        a = t.wait_pending(sid)
        self.assertEqual(c.notify("notifications/cancelled", {"requestId": 11}).status, 202)
        th.join(timeout=60)
        self.assertFalse(th.is_alive(), "the waiting request did not end after the cancel")
        self.assertNotIn("error", out, out)
        self.assertEqual(out["reply"].status, 204, out["reply"])
        self.assertEqual(out["reply"].text, "")
        run = t.run(a["run_id"])
        self.assertEqual(run["status"], "cancelled", run)
        self.assertEqual(t.approval(a["id"])["status"], "cancelled")
        self.assertIsNone(t.notes(agent["id"]))
        # nothing waits any more: the session closes
        self.assertEqual(c.delete().status, 204)
        self.assertEqual(t.session(sid)["status"], "inactive")


if __name__ == "__main__":
    unittest.main()

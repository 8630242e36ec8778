"""Plugins end to end over HTTP: registration and its checks (manifest, events, Lua that does not
compile, fails or runs away while loading, built-in settings, config_schema, webhook secrets,
roles); the event bus on a real turn (priority order and transform chains, tool.before vetoes,
handlers that throw or run out of their budgets and are skipped and reported, or fail the turn
with failure_mode "fail"); tools added by Lua plugins, called through the gateway and its policy;
the built-in audit-log and redaction; session.message.received rewriting the stored message;
enable, disable, replace and delete taking effect on the next turn without a restart; one Lua
state per agent; and webhook plugins against a receiver in this process (signed deliveries,
retries with backoff, dead deliveries and their replay, a restart in between).

Every test works in a tenant of its own (POST /v1/tenants): plugins, secrets and policies of one
test never reach another.

The local model quotes the last user message it is sent (`You said: "<message>"`), so what
prompt.assemble and model.before handlers did to the conversation shows in the run's output; a
line `/call TOOL {json}` makes that tool call and the answer is `The tool TOOL returned: <result>.`
"""

import base64
import hashlib
import hmac
import http.server
import json
import os
import threading
import time
import unittest

import keel_harness
from keel_harness import (TERMINAL_RUN_STATES, KeelServer, KeelTestCase, parse_time,
                          unique_name, wait_for)

KEK = base64.b64encode(bytes(range(32))).decode()  # secrets (webhook signing keys) need one
# The receiver listens on loopback, which webhooks may reach only where the admin allows it.
LOOPBACK = "127.0.0.1/32"
WAIT = 20  # ?wait= seconds


def said(text):
    """The local model's answer to a plain message."""
    return 'You said: "%s"' % text


def call(tool, arguments=None):
    return "/call %s %s" % (tool, json.dumps(arguments if arguments is not None else {}))


def lua_plugin(plugin_id, events, source, config=None, **manifest):
    """A registration body for a Lua plugin."""
    m = {"id": plugin_id, "name": "Plugin " + plugin_id, "version": "1.0.0", "kind": "lua",
         "events": events}
    m.update(manifest)
    body = {"manifest": m, "source": source}
    if config is not None:
        body["config"] = config
    return body


def builtin_plugin(plugin_id, builtin, events, config=None, **manifest):
    m = {"id": plugin_id, "name": "Plugin " + plugin_id, "version": "1.0.0", "kind": "builtin",
         "builtin": builtin, "events": events}
    m.update(manifest)
    body = {"manifest": m}
    if config is not None:
        body["config"] = config
    return body


def webhook_plugin(plugin_id, url, events, secret, **manifest):
    m = {"id": plugin_id, "name": "Plugin " + plugin_id, "version": "1.0.0", "kind": "webhook",
         "url": url, "events": events}
    m.update(manifest)
    return {"manifest": m, "config": {"secret": secret}}


# A prompt.assemble@v1 transform that appends a marker to the last message's content.
def appender(marker, priority=None):
    opts = ", {priority = %d}" % priority if priority is not None else ""
    return ('ctx.bus.on("prompt.assemble@v1", function(p)\n'
            '  local m = p.messages[#p.messages]\n'
            '  m.content = m.content .. "%s"\n'
            '  return p\n'
            'end%s)\n' % (marker, opts))


class Tenant(keel_harness.Tenant):
    """A tenant of its own, with the plugin helpers these tests use."""

    # plugins

    def register(self, body, expect=201):
        return self.ok("POST", "/v1/plugins", body, expect=expect)

    def enable(self, plugin_id, agent_id):
        return self.ok("POST", "/v1/plugins/%s/enable" % plugin_id, {"agent_id": agent_id},
                       expect=200)

    def disable(self, plugin_id, agent_id):
        return self.ok("POST", "/v1/plugins/%s/disable" % plugin_id, {"agent_id": agent_id},
                       expect=200)

    def deliveries(self, plugin_id, status=None):
        path = "/v1/plugins/%s/deliveries?limit=200" % plugin_id
        if status:
            path += "&status=" + status
        return self.ok("GET", path, expect=200)["items"]

    def set_secret(self, name, value):
        self.ok("PUT", "/v1/secrets/" + name, {"value": value})

    # agents and turns

    # What these tests' turns call: built-in tools and the tools of the plugins they enable.
    TOOLS = ["time.now", "notes.append", "plugin__*"]

    def agent(self, tools=None, config=None):
        return self.server.create_agent(tools=self.TOOLS if tools is None else tools,
                                        config=config, token=self.token)

    def session(self, agent_id):
        return self.server.create_session(agent_id, token=self.token)

    def agent_session(self, tools=None):
        a = self.agent(tools=tools)
        return a, self.session(a["id"])

    def post(self, session_id, content, wait=WAIT):
        """Posts a message with ?wait= and returns the whole body {"message", "run"}."""
        status, body, _ = self.server.post_message(session_id, content, wait=wait,
                                                   token=self.token, timeout=wait + 30)
        if status not in (200, 202):
            raise AssertionError("POST message -> %s: %s\n%s"
                                 % (status, body, self.server.log_tail(30)))
        return body

    def turn(self, session_id, content):
        """Posts a message and returns the ended run."""
        run = self.post(session_id, content)["run"]
        if run["status"] not in TERMINAL_RUN_STATES:
            run = self.server.wait_run(run["id"], timeout=WAIT, token=self.token)
        return run

    def steps(self, run_id):
        return self.server.steps(run_id, token=self.token)

    def tool_steps(self, run_id):
        return [s for s in self.steps(run_id) if s["kind"] == "tool"]

    def messages(self, session_id):
        return self.server.list_all("/v1/sessions/%s/messages" % session_id, token=self.token)

    def events(self, **filters):
        q = "&".join("%s=%s" % kv for kv in filters.items())
        return self.server.list_all("/v1/events" + ("?" + q if q else ""), limit=500,
                                    token=self.token)

    def events_of(self, type_, **filters):
        return [e for e in self.events(**filters) if e["type"] == type_]

    def wait_events(self, type_, predicate=lambda e: True, count=1, timeout=10, **filters):
        """Waits until at least `count` events of `type_` match; returns them."""
        def found():
            got = [e for e in self.events_of(type_, **filters) if predicate(e)]
            return got if len(got) >= count else None
        return wait_for(found, timeout, interval=0.1, what="%d event(s) %s" % (count, type_))


# ---------------------------------------------------------------------- webhook receiver


class Receiver:
    """An HTTP server in a thread that records every POST and answers each path with the
    status set for it (default 200)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.received = []  # dicts: path, headers (lower-cased), body (bytes), at (monotonic)
        self.status_for = {}
        self.delay_for = {}  # path -> seconds to wait before answering
        self.once = set()  # paths that answer a repeated Keel-Delivery id with 409
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length", "0")))

            def do_POST(self):
                body = self._body()
                with receiver.lock:
                    receiver.received.append({
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                        "at": time.monotonic()})
                    status = receiver.status_for.get(self.path, 200)
                    if self.path in receiver.once:
                        key = self.headers.get("Keel-Delivery")
                        if sum(1 for r in receiver.received if r["path"] == self.path and
                               r["headers"].get("keel-delivery") == key) > 1:
                            status = 409
                    delay = receiver.delay_for.get(self.path, 0)
                if delay:
                    time.sleep(delay)
                reply = b'{"ok": true}' if 200 <= status < 300 else b'{"ok": false}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(reply)

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 128  # Keel sends up to 16 at once, each on a new connection

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.httpd.server_address[1], path)

    def set_status(self, path, status):
        with self.lock:
            self.status_for[path] = status

    def answer_repeats_with_409(self, path):
        with self.lock:
            self.once.add(path)

    def set_delay(self, path, seconds):
        with self.lock:
            self.delay_for[path] = seconds

    def at(self, path):
        with self.lock:
            return [r for r in self.received if r["path"] == path]

    def distinct(self, path):
        """The requests at `path`, one per delivery id (the first of each)."""
        out, seen = [], set()
        for r in self.at(path):
            key = r["headers"].get("keel-delivery")
            if key not in seen:
                seen.add(key)
                out.append(r)
        return out

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


# ---------------------------------------------------------------------- the tests


class PluginsTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": LOOPBACK})
        cls.receiver = Receiver()

    @classmethod
    def tearDownClass(cls):
        cls.receiver.stop()
        cls.server.stop()

    def tenant(self):
        return Tenant(self.server)

    def audit_lines(self, tenant, agent_id):
        path = os.path.join(self.server.home, "audit", tenant.id, agent_id + ".jsonl")
        try:
            with open(path) as f:
                return [json.loads(line) for line in f.read().splitlines()]
        except FileNotFoundError:
            return []

    def assertSigned(self, request, secret):
        """A webhook delivery's headers and signature are right; returns its parsed body."""
        h = request["headers"]
        for name in ("keel-delivery", "keel-event", "keel-timestamp", "keel-signature"):
            self.assertIn(name, h, "header %s missing from %r" % (name, h))
        ts = h["keel-timestamp"]
        self.assertRegex(ts, r"^\d+$")
        self.assertLess(abs(int(ts) - time.time()), 300, "Keel-Timestamp is not now: %s" % ts)
        expected = "v1=" + hmac.new(secret.encode(), ts.encode() + b"." + request["body"],
                                    hashlib.sha256).hexdigest()
        self.assertEqual(h["keel-signature"], expected, "the signature does not verify")
        # A different secret gives a different signature: the check above means something.
        wrong = "v1=" + hmac.new(b"not-the-secret", ts.encode() + b"." + request["body"],
                                 hashlib.sha256).hexdigest()
        self.assertNotEqual(h["keel-signature"], wrong)
        self.assertTrue(h.get("content-type", "").startswith("application/json"), h)
        body = json.loads(request["body"])
        self.assertEqual(set(body), {"id", "event", "tenant_id", "agent_id", "created_at",
                                     "payload"}, body)
        self.assertEqual(body["id"], h["keel-delivery"])
        self.assertEqual(body["event"], h["keel-event"])
        self.assertTime(body["created_at"], "delivery created_at")
        return body

    # ------------------------------------------------------------------ 1. registration

    def test_registration_errors(self):
        t = self.tenant()
        t.set_secret("hook-key", "s3cret")
        url = self.receiver.url("/never")
        good = lua_plugin("fine", ["tool.before@v1"], "ctx.log.info('loaded')")

        def refused(body, fragment, status=400, code="invalid_argument", what=""):
            t0 = time.monotonic()
            resp = t.request("POST", "/v1/plugins", body)
            elapsed = time.monotonic() - t0
            err = self.assertError(resp, status, code, what or fragment)
            self.assertIn(fragment, err["message"], what)
            return err, elapsed

        bad_manifest = dict(good, manifest=dict(good["manifest"], colour="blue"))
        refused(bad_manifest, "unknown field 'colour'")
        refused(dict(good, extra=1), "unknown field 'extra'")
        refused(lua_plugin("x", ["tool.before@v9"], "return"), "unknown event 'tool.before@v9'")
        refused(lua_plugin("x", ["tool.prepare@v1"], "return"), "unknown event 'tool.prepare@v1'")
        refused(lua_plugin("x", [], "return"), "manifest.events")
        refused(lua_plugin("Bad_Id", ["tool.before@v1"], "return"), "manifest.id")
        refused(lua_plugin("x", ["tool.before@v1"], "return", kind="python"), "manifest.kind")
        refused(lua_plugin("x", ["tool.before@v1"], "return", failure_mode="explode"),
                "failure_mode")
        refused(lua_plugin("x", ["tool.before@v1"], "return", limits={"wall_ms": 60000}),
                "limits.wall_ms")
        refused(lua_plugin("x", ["tool.before@v1"], "return", limits={"cpu": 1}),
                "unknown field 'cpu'")
        refused(lua_plugin("x", ["tool.before@v1"], ""), "needs its source")
        # Webhooks: only events off the hot path, and a signing secret that exists.
        for hot in ("tool.before@v1", "prompt.assemble@v1", "model.before@v1",
                    "session.message.received@v1"):
            refused(webhook_plugin("hook", url, [hot], "hook-key"), "hot path", what=hot)
        no_secret = webhook_plugin("hook", url, ["tool.after@v2"], "hook-key")
        del no_secret["config"]
        refused(no_secret, "config.secret")
        refused(dict(no_secret, config={"secret": 7}), "config.secret")
        refused(webhook_plugin("hook", "ftp://example.com/x", ["tool.after@v2"], "hook-key"),
                "manifest.url")
        refused(webhook_plugin("hook", url, ["tool.after@v2"], "hook-key", failure_mode="fail"),
                "failure_mode")
        refused(webhook_plugin("hook", url, ["tool.after@v2"], "no-such-secret"),
                "secret not found: no-such-secret", status=404, code="not_found")
        # Lua that does not compile, fails while loading, or subscribes beyond its manifest.
        refused(lua_plugin("x", ["tool.before@v1"], "ctx.bus.on("), "does not compile")
        refused(lua_plugin("x", ["tool.before@v1"], "error('boom at load')"), "boom at load")
        refused(lua_plugin("x", ["tool.before@v1"],
                           "ctx.bus.on('tool.after@v2', function() end)"),
                "not among the manifest's events")
        refused(lua_plugin("x", ["tool.before@v1"], "os.execute('true')"),
                "failed while loading")
        refused(lua_plugin("x", ["tool.before@v1"], "require('io')"), "failed while loading")
        # Lua that runs away while loading is stopped by its budget and the request returns
        # promptly: the instruction budget, the wall clock, the memory cap.
        _, elapsed = refused(lua_plugin("x", ["tool.before@v1"], "while true do end"),
                             "exceeded its instruction budget")
        self.assertLess(elapsed, 2.0)
        _, elapsed = refused(lua_plugin("x", ["tool.before@v1"],
                                        "while true do local s = string.rep('ab', 300) end",
                                        limits={"instructions": 100000000, "wall_ms": 100}),
                             "exceeded its time limit")
        self.assertLess(elapsed, 1.0)
        _, elapsed = refused(lua_plugin("x", ["tool.before@v1"],
                                        "while true do pcall(function() while true do end end) "
                                        "end"),
                             "exceeded its instruction budget")
        self.assertLess(elapsed, 2.0)
        _, elapsed = refused(lua_plugin("x", ["tool.before@v1"],
                                        "local t = {} while true do "
                                        "t[#t + 1] = string.rep('x', 4096) .. #t end",
                                        limits={"memory_bytes": 1048576}),
                             "exceeded its memory limit")
        self.assertLess(elapsed, 2.0)
        # Built-ins.
        refused(builtin_plugin("red", "redaction", ["model.before@v1"],
                               {"patterns": ["(unclosed"]}), "'(unclosed' is not a valid")
        refused(builtin_plugin("red", "redaction", ["model.before@v1"],
                               {"patterns": ["(?<=x)y"]}), "regular expression")  # no lookbehind
        refused(builtin_plugin("red", "redaction", ["model.before@v1"], {"patterns": []}),
                "config.patterns")
        refused(builtin_plugin("red", "redaction", ["model.after@v1"], {"patterns": ["x"]}),
                "not a transform event")
        refused(builtin_plugin("aud", "audit-log", ["model.after@v1"], {"x": 1}),
                "audit-log takes no config")
        refused(builtin_plugin("aud", "telemetry", ["model.after@v1"]), "unknown built-in")
        refused(dict(builtin_plugin("aud", "audit-log", ["model.after@v1"]), source="return"),
                "source goes with kind")
        # Config against config_schema.
        schema = {"type": "object", "properties": {"word": {"type": "string"}},
                  "required": ["word"]}
        refused(lua_plugin("cfg", ["tool.before@v1"], "return", config={"word": 5},
                           config_schema=schema), "config_schema")
        refused(lua_plugin("cfg", ["tool.before@v1"], "return", config={},
                           config_schema=schema), "config_schema")
        refused(lua_plugin("cfg", ["tool.before@v1"], "return",
                           config_schema={"properties": {"word": {"maxLength": -1}}}),
                "manifest.config_schema.properties.word.maxLength: must be a non-negative integer")
        refused(dict(good, config=[1]), "config must be an object")
        # Nothing refused was stored.
        self.assertEqual(t.ok("GET", "/v1/plugins")["items"], [])

        # A user may look but not change; a guest may not even look.
        user, _ = t.new_token("user")
        guest, _ = t.new_token("guest")
        status, body, _ = t.request("POST", "/v1/plugins", good, token=user)
        self.assertEqual(status, 403, body)
        self.assertEqual(t.ok("GET", "/v1/plugins")["items"], [])
        created = t.register(good)
        self.assertEqual(created["id"], "fine")
        self.assertEqual(created["enabled_for"], [])
        self.assertEqual(created["source"], good["source"])
        self.assertTime(created["created_at"])
        a = t.agent()
        for method, path, body in (("POST", "/v1/plugins/fine/enable", {"agent_id": a["id"]}),
                                   ("POST", "/v1/plugins/fine/disable", {"agent_id": a["id"]}),
                                   ("DELETE", "/v1/plugins/fine", None),
                                   ("POST", "/v1/plugins", good)):
            status, body, _ = t.request(method, path, body, token=user)
            self.assertEqual(status, 403, "%s %s as user: %s %r" % (method, path, status, body))
        listed = t.ok("GET", "/v1/plugins", token=user)["items"]
        self.assertEqual([p["id"] for p in listed], ["fine"])
        self.assertNotIn("source", listed[0])  # the list leaves the source out
        self.assertEqual(t.ok("GET", "/v1/plugins/fine", token=user)["source"], good["source"])
        status, body, _ = t.request("GET", "/v1/plugins", token=guest)
        self.assertEqual(status, 403, body)
        # Enable checks: an unknown agent, an unknown plugin.
        self.assertError(t.request("POST", "/v1/plugins/fine/enable", {"agent_id": "nope"}),
                         400, "invalid_argument")
        self.assertError(t.request("POST", "/v1/plugins/nope/enable", {"agent_id": a["id"]}),
                         404, "not_found")
        self.assertError(t.request("GET", "/v1/plugins/fine/deliveries?status=lost"), 400,
                         "invalid_argument")
        # Another tenant sees nothing of it and may use the same id.
        other = self.tenant()
        self.assertError(other.request("GET", "/v1/plugins/fine"), 404, "not_found")
        self.assertEqual(other.ok("GET", "/v1/plugins")["items"], [])
        self.assertError(other.request("POST", "/v1/plugins/fine/enable", {"agent_id": "*"}),
                         404, "not_found")
        other.register(lua_plugin("fine", ["tool.after@v2"], "return"))
        self.assertEqual(t.ok("GET", "/v1/plugins/fine")["manifest"]["events"],
                         ["tool.before@v1"])

    # ------------------------------------------------------------------ 2. order and chains

    def test_priority_order_and_transform_chain(self):
        t = self.tenant()
        agent, sess = t.agent_session()
        # Ids in the opposite order of their priorities, registered in yet another order.
        t.register(lua_plugin("aa-late", ["prompt.assemble@v1"], appender("[late]"),
                              priority=50))
        t.register(lua_plugin("zz-early", ["prompt.assemble@v1"], appender("[early]"),
                              priority=-5))
        t.register(lua_plugin("mm-mid", ["prompt.assemble@v1"], appender("[mid]"), priority=10))
        # One plugin, two handlers of the same priority (registration order breaks the tie) and
        # one whose own priority goes before the manifest's.
        twin = (appender("[t1]", 20) + appender("[t2]", 20) + appender("[first]", -100))
        t.register(lua_plugin("twin", ["prompt.assemble@v1"], twin, priority=99))
        # Equal priorities across plugins: by plugin id (registered in the other order).
        t.register(lua_plugin("tie-b", ["prompt.assemble@v1"], appender("[tie-b]"),
                              priority=30))
        t.register(lua_plugin("tie-a", ["prompt.assemble@v1"], appender("[tie-a]"),
                              priority=30))
        for pid in ("aa-late", "zz-early", "tie-b", "mm-mid", "twin", "tie-a"):
            t.enable(pid, agent["id"])
        run = t.turn(sess["id"], "hello")
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"],
                         said("hello[first][early][mid][t1][t2][tie-a][tie-b][late]"))
        # The transform changed what the model got, not what is stored.
        user = [m for m in t.messages(sess["id"]) if m["role"] == "user"]
        self.assertEqual([m["content"] for m in user], ["hello"])
        # Each turn starts from the stored conversation again (no marker piles up).
        run = t.turn(sess["id"], "again")
        self.assertEqual(run["output"],
                         said("again[first][early][mid][t1][t2][tie-a][tie-b][late]"))
        # A handler that breaks the payload's shape leaves the runtime's own messages.
        t.register(lua_plugin("breaker", ["prompt.assemble@v1"],
                              'ctx.bus.on("prompt.assemble@v1", function(p) '
                              'p.messages = "gone"; return p end)', priority=1000))
        t.enable("breaker", agent["id"])
        run = t.turn(sess["id"], "third")
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"], said("third"))

    # ------------------------------------------------------------------ 3. veto

    def test_veto_blocks_a_tool_call(self):
        t = self.tenant()
        agent, sess = t.agent_session()
        source = '''
ctx.bus.on("tool.before@v1", function(p)
  if p.tool == "notes.append" and string.find(p.arguments.line or "", ctx.config.forbidden) then
    local s = ctx.session()
    return {allow = false,
            reason = "no " .. ctx.config.forbidden .. " (" .. p.call_id .. " " ..
                     tostring(p.caller_role) .. " " .. tostring(s.agent_id == p.agent_id) .. ")"}
  end
  return nil
end)
'''
        t.register(lua_plugin("no-secrets", ["tool.before@v1"], source,
                              config={"forbidden": "SECRET"},
                              config_schema={"type": "object",
                                             "properties": {"forbidden": {"type": "string"}},
                                             "required": ["forbidden"]}))
        t.enable("no-secrets", agent["id"])
        run = t.turn(sess["id"], call("notes.append", {"line": "the SECRET plan"}))
        self.assertEqual(run["status"], "done", run)
        reason = "vetoed: plugin no-secrets: no SECRET (call_1 owner true)"
        self.assertEqual(run["output"], "The tool notes.append returned: error: %s." % reason)
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied", step)
        self.assertEqual(step["output"], {"error": reason})
        self.assertEqual(step["input"]["decision"]["outcome"], "deny")
        denied = t.events_of("tool.call.denied@v1", run_id=run["id"])
        self.assertEqual([e["payload"]["reason"] for e in denied], [reason])
        notes_path = os.path.join(self.server.home, "workspaces", agent["id"], "notes.txt")
        self.assertFalse(os.path.exists(notes_path), "the vetoed line was written")

        run = t.turn(sess["id"], call("notes.append", {"line": "a harmless line"}))
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"], 'The tool notes.append returned: {"appended":"a harmless '
                                        'line"}.')
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "succeeded", step)
        with open(notes_path) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines, ["a harmless line"])
        # A veto that answers false denies without a reason; another agent is not vetoed.
        t.register(lua_plugin("no-time", ["tool.before@v1"],
                              'ctx.bus.on("tool.before@v1", function(p) '
                              'return p.tool ~= "time.now" end)'))
        t.enable("no-time", agent["id"])
        run = t.turn(sess["id"], call("time.now"))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied", step)
        self.assertEqual(step["output"], {"error": "vetoed: plugin no-time: no reason given"})
        other, other_sess = t.agent_session()
        run = t.turn(other_sess["id"], call("notes.append", {"line": "SECRET elsewhere"}))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "succeeded", step)

    def test_veto_reason_that_is_not_utf8(self):
        # A Lua string is any bytes. A reason cut inside a UTF-8 character reaches the model as
        # the tool's answer and becomes the run's output and the assistant's message: stored as
        # valid UTF-8 (U+FFFD for the broken bytes), on PostgreSQL too, which refuses the rest.
        t = self.tenant()
        agent, sess = t.agent_session()
        t.register(lua_plugin("bytes", ["tool.before@v1"],
                              'ctx.bus.on("tool.before@v1", function(p) '
                              'return {allow = false, reason = "caf\\xc3 \\xff!"} end)'))
        t.enable("bytes", agent["id"])
        reason = "vetoed: plugin bytes: caf\ufffd \ufffd!"
        run = t.turn(sess["id"], call("time.now"))
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"], "The tool time.now returned: error: %s." % reason)
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["output"], {"error": reason})
        self.assertEqual(t.messages(sess["id"])[-1]["content"], run["output"])

    # ------------------------------------------------------------------ 4. failing handlers

    def test_a_throwing_handler_is_skipped_and_reported(self):
        t = self.tenant()
        t.set_secret("err-key", "error-hook-secret")
        path = "/errors-" + unique_name("p")
        agent, sess = t.agent_session()
        t.register(lua_plugin("thrower", ["prompt.assemble@v1"],
                              'ctx.bus.on("prompt.assemble@v1", function(p) '
                              'error("kaboom from " .. ctx.plugin.id) end)'))
        t.register(lua_plugin("bad-shape", ["model.before@v1"],
                              'ctx.bus.on("model.before@v1", function(p) return "text" end)'))
        t.register(lua_plugin("marker", ["prompt.assemble@v1"], appender("[after]"),
                              priority=200))
        t.register(webhook_plugin("error-hook", self.receiver.url(path), ["plugin.error@v1"],
                                  "err-key"))
        # The agent's own plugin.error@v1 listeners hear of the failures; one that fails itself
        # is reported once, not again and again.
        t.register(lua_plugin("listener", ["plugin.error@v1"], '''
local heard = {}
ctx.bus.on("plugin.error@v1", function(p)
  heard[#heard + 1] = p.plugin_id .. "@" .. p.event
end)
ctx.tools.add{name = "heard", handler = function() return {heard = heard} end}
'''))
        t.register(lua_plugin("grumpy", ["plugin.error@v1"],
                              'ctx.bus.on("plugin.error@v1", function(p) error("grr") end)'))
        for pid in ("thrower", "bad-shape", "marker", "error-hook", "listener", "grumpy"):
            t.enable(pid, agent["id"])
        t0 = time.monotonic()
        run = t.turn(sess["id"], "still answered")
        self.assertEqual(run["status"], "done", run)
        # The failed handlers were skipped; the one after them still ran.
        self.assertEqual(run["output"], said("still answered[after]"))
        errors = t.wait_events("plugin.error@v1", count=4, agent_id=agent["id"])
        time.sleep(0.5)
        errors = t.events_of("plugin.error@v1", agent_id=agent["id"])
        self.assertEqual(sorted((e["payload"]["plugin_id"], e["payload"]["event"])
                                for e in errors),
                         [("bad-shape", "model.before@v1"), ("grumpy", "plugin.error@v1"),
                          ("grumpy", "plugin.error@v1"), ("thrower", "prompt.assemble@v1")],
                         errors)
        by_plugin = {e["payload"]["plugin_id"]: e for e in errors}
        thrown = by_plugin["thrower"]
        self.assertEqual(thrown["agent_id"], agent["id"])
        self.assertEqual(thrown["payload"]["agent_id"], agent["id"])
        self.assertEqual(thrown["payload"]["event"], "prompt.assemble@v1")
        self.assertIn("kaboom from thrower", thrown["payload"]["message"])
        self.assertEqual(by_plugin["bad-shape"]["payload"]["event"], "model.before@v1")
        self.assertIn("a transform must return the payload", by_plugin["bad-shape"]["payload"]
                      ["message"])
        # A webhook subscribed to plugin.error@v1 hears of them.
        got = wait_for(lambda: len(self.receiver.distinct(path)) >= 2 and
                       self.receiver.distinct(path), timeout=15, what="plugin.error deliveries")
        bodies = [self.assertSigned(r, "error-hook-secret") for r in got]
        self.assertEqual(sorted(b["payload"]["plugin_id"] for b in bodies
                                if b["payload"]["plugin_id"] != "grumpy"),
                         ["bad-shape", "thrower"])
        self.assertTrue(all(b["event"] == "plugin.error@v1" for b in bodies), bodies)
        self.assertLess(time.monotonic() - t0, 30)
        t.disable("marker", agent["id"])  # its marker would spoil the /call line
        run = t.turn(sess["id"], call("plugin__listener__heard"))
        [step] = t.tool_steps(run["id"])
        heard = step["output"]["heard"]
        self.assertEqual(heard[:2], ["thrower@prompt.assemble@v1", "bad-shape@model.before@v1"],
                         heard)

        # failure_mode "fail": the run fails with plugin_failed.
        strict_agent, strict_sess = t.agent_session()
        t.register(lua_plugin("strict", ["model.before@v1"],
                              'ctx.bus.on("model.before@v1", function(p) error("no way") end)',
                              failure_mode="fail"))
        t.enable("strict", strict_agent["id"])
        run = t.turn(strict_sess["id"], "hello")
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "plugin_failed", run)
        self.assertIn("strict", run["error"]["message"])
        self.assertIn("no way", run["error"]["message"])
        self.assertEqual([s for s in t.steps(run["id"]) if s["kind"] == "model"], [])
        t.wait_events("plugin.error@v1", lambda e: e["payload"]["plugin_id"] == "strict",
                      agent_id=strict_agent["id"])

        # A veto handler that fails with failure_mode "fail" denies the call and fails the run.
        veto_agent, veto_sess = t.agent_session()
        t.register(lua_plugin("strict-veto", ["tool.before@v1"],
                              'ctx.bus.on("tool.before@v1", function(p) error("cannot decide") '
                              'end)', failure_mode="fail"))
        t.enable("strict-veto", veto_agent["id"])
        run = t.turn(veto_sess["id"], call("notes.append", {"line": "x"}))
        self.assertEqual(run["status"], "failed", run)
        self.assertEqual(run["error"]["code"], "plugin_failed", run)
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied", step)
        self.assertIn("cannot decide", step["output"]["error"])
        notes_path = os.path.join(self.server.home, "workspaces", veto_agent["id"], "notes.txt")
        self.assertFalse(os.path.exists(notes_path))
        # ... and with failure_mode "skip" the same failing veto lets the call through.
        skip_agent, skip_sess = t.agent_session()
        t.register(lua_plugin("lax-veto", ["tool.before@v1"],
                              'ctx.bus.on("tool.before@v1", function(p) error("cannot decide") '
                              'end)'))
        t.enable("lax-veto", skip_agent["id"])
        run = t.turn(skip_sess["id"], call("notes.append", {"line": "x"}))
        self.assertEqual(run["status"], "done", run)
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "succeeded", step)

    # ------------------------------------------------------------------ 5. budgets at run time

    def test_runaway_and_memory_bomb_handlers_are_stopped(self):
        # Two plugins of one source: "hungry" may run 150 ms, so the loops stop on time;
        # "hoarder" may run 2 s (the most a plugin may), so the bombs stop on memory first,
        # however loaded the machine.
        source = '''
ctx.bus.on("model.before@v1", function(p)
  local m = p.messages[#p.messages]
  if string.find(m.content, "spin") then
    while true do local s = string.rep("ab", 300) end
  elseif string.find(m.content, "swallow") then
    while true do pcall(function() while true do local s = string.rep("ab", 300) end end) end
  elseif string.find(m.content, "bomb") then
    local t = {}
    while true do t[#t + 1] = string.rep("x", 4096) .. #t end
  elseif string.find(m.content, "hoard") then
    hoard = hoard or {}
    for i = 1, 100000 do hoard[#hoard + 1] = string.rep("y", 1024) .. i end
  end
  m.content = m.content .. " [ok]"
  return p
end)
'''
        t = self.tenant()
        for plugin_id, wall_ms, cases in (
                ("hungry", 150, (("spin", "exceeded its time limit", 1),
                                 ("swallow", "exceeded its time limit", 2))),
                ("hoarder", 2000, (("bomb", "exceeded its memory limit", 1),
                                    ("hoard", "exceeded its memory limit", 2)))):
            agent, sess = t.agent_session()
            t.register(lua_plugin(plugin_id, ["model.before@v1"], source,
                                  limits={"instructions": 100000000, "wall_ms": wall_ms,
                                          "memory_bytes": 2 * 1024 * 1024}))
            t.enable(plugin_id, agent["id"])
            run = t.turn(sess["id"], "warm up")
            self.assertEqual(run["output"], said("warm up [ok]"))
            for word, fragment, count in cases:
                t0 = time.monotonic()
                run = t.turn(sess["id"], word)
                elapsed = time.monotonic() - t0
                self.assertEqual(run["status"], "done", (word, run))
                self.assertEqual(run["output"], said(word), word)  # the handler's change is skipped
                if plugin_id == "hungry":
                    self.assertLess(elapsed, wall_ms * 10 / 1000.0,
                                    "%s: the turn took %.2fs" % (word, elapsed))
                found = t.wait_events("plugin.error@v1",
                                      lambda e: fragment in e["payload"]["message"] and
                                      e["payload"]["plugin_id"] == plugin_id,
                                      count=count, agent_id=agent["id"])
                self.assertTrue(all(e["payload"]["event"] == "model.before@v1" for e in found))
            # The plugin's state survived being stopped: it still works on the next turn.
            run = t.turn(sess["id"], "calm again")
            self.assertEqual(run["output"], said("calm again [ok]"))
        self.assertHealthy()

    # ------------------------------------------------------------------ 6. Lua tools

    def test_a_lua_tool_goes_through_the_gateway(self):
        t = self.tenant()
        source = '''
ctx.tools.add{
  name = "add",
  description = "adds two integers",
  schema = {type = "object", properties = {a = {type = "integer"}, b = {type = "integer"}},
            required = {"a", "b"}},
  effect = "pure",
  handler = function(args) return {sum = args.a + args.b, by = ctx.config.label} end,
}
ctx.tools.add{
  name = "whoami",
  handler = function(args)
    local s = ctx.session()
    return {session = s.id, agent = s.agent_id, run = s.run_id}
  end,
}
ctx.tools.add{name = "broken", handler = function(args) error("tool broke") end}
'''
        t.register(lua_plugin("calc", ["tool.after@v2"], source, config={"label": "calc"}))
        agent, sess = t.agent_session(tools=["plugin__calc__*", "time.now"])
        t.enable("calc", agent["id"])
        run = t.turn(sess["id"], call("plugin__calc__add", {"a": 2, "b": 40}))
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"],
                         'The tool plugin__calc__add returned: {"by":"calc","sum":42}.')
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "succeeded", step)
        self.assertEqual(step["input"]["tool"], "plugin__calc__add")
        self.assertEqual(step["output"], {"by": "calc", "sum": 42})
        # Journaled like any tool call.
        types = [e["type"] for e in t.events(run_id=run["id"])]
        self.assertIn("tool.call.started@v1", types)
        self.assertIn("tool.call.completed@v1", types)
        self.assertLess(types.index("tool.call.started@v1"),
                        types.index("tool.call.completed@v1"))
        # ctx.session() inside a tool call.
        run = t.turn(sess["id"], call("plugin__calc__whoami"))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["output"], {"session": sess["id"], "agent": agent["id"],
                                          "run": run["id"]})
        # The gateway checks the arguments against the tool's schema.
        run = t.turn(sess["id"], call("plugin__calc__add", {"a": "two", "b": 1}))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied", step)
        self.assertIn("schema", step["output"]["error"])
        # A handler that errs fails the call, not the run.
        run = t.turn(sess["id"], call("plugin__calc__broken"))
        self.assertEqual(run["status"], "done", run)
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "failed", step)
        self.assertIn("tool broke", json.dumps(step["output"]))
        # Unknown plugin tools are denied.
        run = t.turn(sess["id"], call("plugin__calc__nope"))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied", step)
        # An agent whose tool list leaves the plugin out may not call it.
        narrow, narrow_sess = t.agent_session(tools=["time.now"])
        t.enable("calc", narrow["id"])
        run = t.turn(narrow_sess["id"], call("plugin__calc__add", {"a": 1, "b": 1}))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied", step)
        self.assertIn("may not call", step["output"]["error"])
        # An agent that has not enabled the plugin does not have the tool.
        without, without_sess = t.agent_session(tools=["plugin__*"])
        run = t.turn(without_sess["id"], call("plugin__calc__add", {"a": 1, "b": 1}))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied", step)
        self.assertIn("no enabled plugin", step["output"]["error"])
        # The tenant's policy applies: a rule that asks a human parks the call.
        t.ok("PUT", "/v1/policy", {"rules": [
            {"tool": "*", "rights": ["read", "write"], "approval": "never"},
            {"tool": "plugin__calc__*", "rights": ["read"], "approval": "always"}]})
        body = t.post(sess["id"], call("plugin__calc__add", {"a": 5, "b": 5}))
        self.assertEqual(body["run"]["status"], "waiting_for_approval", body)
        pending = t.ok("GET", "/v1/approvals?status=pending")["items"]
        self.assertEqual([(a["tool"], a["arguments"]) for a in pending],
                         [("plugin__calc__add", {"a": 5, "b": 5})])
        t.ok("POST", "/v1/approvals/%s/approve" % pending[0]["id"], {})
        run = self.server.wait_run(body["run"]["id"], token=t.token)
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"],
                         'The tool plugin__calc__add returned: {"by":"calc","sum":10}.')
        # ... and a rule that denies it denies it.
        t.ok("PUT", "/v1/policy", {"rules": [{"tool": "*", "rights": ["read", "write"]}],
                                   "deny": ["plugin__calc__*"]})
        run = t.turn(sess["id"], call("plugin__calc__add", {"a": 1, "b": 2}))
        [step] = t.tool_steps(run["id"])
        self.assertEqual(step["status"], "denied", step)
        self.assertIn("denied by the tenant policy", step["output"]["error"])

    def test_tool_after_versions_side_by_side(self):
        t = self.tenant()
        # tool.after@v1 and @v2 handlers of one plugin record the keys they were given; a tool of
        # the same plugin reports them.
        source = '''
local seen = {}
local function keys(p)
  local out = {}
  for k, _ in pairs(p) do out[#out + 1] = k end
  table.sort(out)
  return table.concat(out, ",")
end
ctx.bus.on("tool.after@v1", function(p) seen.v1 = keys(p); seen.v1_tool = p.tool end)
ctx.bus.on("tool.after@v2", function(p)
  seen.v2 = keys(p); seen.v2_effect = p.effect_class; seen.v2_outcome = p.decision.outcome
end)
ctx.tools.add{name = "seen", handler = function() return seen end}
'''
        t.register(lua_plugin("watcher", ["tool.after@v1", "tool.after@v2"], source))
        agent, sess = t.agent_session()
        t.enable("watcher", agent["id"])
        run = t.turn(sess["id"], call("time.now"))
        self.assertEqual(run["status"], "done", run)
        run = t.turn(sess["id"], call("plugin__watcher__seen"))
        [step] = t.tool_steps(run["id"])
        seen = step["output"]
        self.assertEqual(seen.get("v1_tool"), "time.now", seen)
        v1 = seen["v1"].split(",")
        v2 = seen["v2"].split(",")
        for k in ("agent_id", "session_id", "run_id", "call_id", "tool", "arguments", "status",
                  "result"):
            self.assertIn(k, v1, seen)
            self.assertIn(k, v2, seen)
        for k in ("duration_ms", "effect_class", "decision"):
            self.assertNotIn(k, v1, seen)
            self.assertIn(k, v2, seen)
        self.assertTrue(seen.get("v2_effect"), seen)
        self.assertTrue(seen.get("v2_outcome"), seen)

    # ------------------------------------------------------------------ 7. built-ins

    def test_builtin_audit_log(self):
        t = self.tenant()
        events = ["agent.started@v1", "session.opened@v1", "session.message.received@v1",
                  "prompt.assemble@v1", "model.before@v1", "model.after@v1", "tool.before@v1",
                  "tool.after@v1", "tool.after@v2", "session.closed@v1", "agent.stopped@v1"]
        t.register(builtin_plugin("audit", "audit-log", events))
        agent = t.agent()
        quiet = t.agent()  # not enabled: no audit file
        t.enable("audit", agent["id"])
        sess = t.session(agent["id"])
        run = t.turn(sess["id"], call("time.now"))
        self.assertEqual(run["status"], "done", run)
        self.assertTrue(run["output"].startswith("The tool time.now returned: "), run)
        # The audit-log changed nothing: the tool went through and the model saw the message.
        run2 = t.turn(sess["id"], "plain words")
        self.assertEqual(run2["output"], said("plain words"))
        t.ok("PATCH", "/v1/sessions/%s" % sess["id"], {"status": "inactive"})
        lines = self.audit_lines(t, agent["id"])
        seen = [line["event"] for line in lines]
        for line in lines:
            self.assertEqual(set(line), {"at", "event", "payload"}, line)
            self.assertTime(line["at"], "audit at")
        expected_order = ["session.opened@v1", "session.message.received@v1",
                          "prompt.assemble@v1", "model.before@v1", "model.after@v1",
                          "tool.before@v1", "tool.after@v1", "tool.after@v2",
                          "model.before@v1", "model.after@v1",
                          "session.message.received@v1", "prompt.assemble@v1",
                          "model.before@v1", "model.after@v1", "session.closed@v1"]
        pos = -1
        for e in expected_order:
            try:
                pos = seen.index(e, pos + 1)
            except ValueError:
                self.fail("%s missing (in order) from the audit log: %s" % (e, seen))
        self.assertEqual(seen.count("tool.before@v1"), 1, seen)
        self.assertEqual(seen.count("model.after@v1"), 3, seen)
        self.assertIn("agent.started@v1", seen)
        self.assertLess(seen.index("agent.started@v1"), seen.index("session.opened@v1"))
        by_event = {}
        for line in lines:
            by_event.setdefault(line["event"], []).append(line["payload"])
        before = by_event["tool.before@v1"][0]
        self.assertEqual((before["tool"], before["arguments"], before["agent_id"],
                          before["session_id"], before["run_id"]),
                         ("time.now", {}, agent["id"], sess["id"], run["id"]))
        v1, v2 = by_event["tool.after@v1"][0], by_event["tool.after@v2"][0]
        self.assertEqual(v1["tool"], "time.now")
        self.assertNotIn("duration_ms", v1)
        self.assertIn("duration_ms", v2)
        self.assertIn("effect_class", v2)
        self.assertEqual(by_event["session.message.received@v1"][1]["content"], "plain words")
        self.assertEqual(by_event["model.after@v1"][-1]["text"], said("plain words"))
        self.assertEqual(by_event["session.closed@v1"][0]["session_id"], sess["id"])
        # Deleting the agent stops its plugins: agent.stopped@v1.
        t.ok("DELETE", "/v1/agents/%s" % agent["id"], expect=(200, 204))
        wait_for(lambda: "agent.stopped@v1" in [x["event"] for x in
                                                self.audit_lines(t, agent["id"])],
                 timeout=10, what="agent.stopped@v1 in the audit log")
        self.assertEqual(self.audit_lines(t, quiet["id"]), [])
        # The audit file is outside the agent's workspace.
        ws = os.path.join(self.server.home, "workspaces", agent["id"])
        self.assertFalse(os.path.abspath(os.path.join(self.server.home, "audit")).startswith(
            os.path.abspath(ws)))

    def test_builtin_redaction(self):
        t = self.tenant()
        t.register(builtin_plugin("redact", "redaction", ["model.before@v1"],
                                  {"patterns": [r"\b\d{3}-\d{4}\b", "hunter2"],
                                   "mask": "[MASKED]"}))
        agent, sess = t.agent_session()
        t.enable("redact", agent["id"])
        body = t.post(sess["id"], "call 555-1234, password hunter2, ok")
        run = body["run"]
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"], said("call [MASKED], password [MASKED], ok"))
        # The stored user message is unchanged; only what the model saw was masked.
        self.assertEqual(body["message"]["content"], "call 555-1234, password hunter2, ok")
        user = [m for m in t.messages(sess["id"]) if m["role"] == "user"]
        self.assertEqual([m["content"] for m in user], ["call 555-1234, password hunter2, ok"])
        # The default mask, and an agent without the plugin sees everything.
        t.register(builtin_plugin("redact", "redaction", ["model.before@v1"],
                                  {"patterns": ["hunter2"]}), expect=200)
        run = t.turn(sess["id"], "again hunter2")
        self.assertEqual(run["output"], said("again [REDACTED]"))
        other, other_sess = t.agent_session()
        run = t.turn(other_sess["id"], "again hunter2")
        self.assertEqual(run["output"], said("again hunter2"))
        # On session.message.received@v1 the stored message is redacted.
        t.register(builtin_plugin("redact-in", "redaction", ["session.message.received@v1"],
                                  {"patterns": ["hunter2"]}))
        t.enable("redact-in", other["id"])
        body = t.post(other_sess["id"], "my hunter2 again")
        self.assertEqual(body["message"]["content"], "my [REDACTED] again")
        self.assertEqual(body["run"]["output"], said("my [REDACTED] again"))
        # The mask is inserted as it is ("\\1" is no group), and a pattern that backtracks
        # without end elsewhere takes linear time here.
        t.register(builtin_plugin("redact", "redaction", ["model.before@v1"],
                                  {"patterns": ["(x+x+)+y", "(t)(o)(k)"], "mask": "<\\1>"}),
                   expect=200)
        t0 = time.monotonic()
        run = t.turn(sess["id"], "x" * 20000 + " tok")
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(run["output"], said("x" * 20000 + " <\\1>"))

    # ------------------------------------------------------------------ 8. message received

    def test_message_received_rewrites_the_stored_message(self):
        t = self.tenant()
        source = '''
ctx.bus.on("session.message.received@v1", function(p)
  if p.role ~= "user" then error("unexpected role " .. tostring(p.role)) end
  if string.find(p.content, "blank") then p.content = ""; return p end
  if string.find(p.content, "keep") then return nil end
  p.content = string.upper(p.content) .. " (" .. tostring(p.session_id == ctx.session().id) .. ")"
  return p
end)
'''
        t.register(lua_plugin("shout", ["session.message.received@v1"], source))
        agent, sess = t.agent_session()
        t.enable("shout", agent["id"])
        body = t.post(sess["id"], "make me loud")
        self.assertEqual(body["message"]["content"], "MAKE ME LOUD (true)")
        self.assertEqual(body["run"]["output"], said("MAKE ME LOUD (true)"))
        stored = t.ok("GET", "/v1/sessions/%s/messages" % sess["id"])["items"]
        self.assertEqual([m["content"] for m in stored if m["role"] == "user"],
                         ["MAKE ME LOUD (true)"])
        # nil keeps the message; an empty content is not taken.
        body = t.post(sess["id"], "please keep me")
        self.assertEqual(body["message"]["content"], "please keep me")
        body = t.post(sess["id"], "a blank one")
        self.assertEqual(body["message"]["content"], "a blank one")
        # With failure_mode "fail" a failing handler refuses the message: nothing is stored.
        strict, strict_sess = t.agent_session()
        t.register(lua_plugin("gate", ["session.message.received@v1"],
                              'ctx.bus.on("session.message.received@v1", function(p) '
                              'error("closed today") end)', failure_mode="fail"))
        t.enable("gate", strict["id"])
        status, resp, _ = self.server.post_message(strict_sess["id"], "let me in", wait=5,
                                                   token=t.token)
        self.assertEqual(status, 400, resp)
        self.assertIn("closed today", resp["error"]["message"])
        self.assertEqual(t.ok("GET", "/v1/sessions/%s/messages" % strict_sess["id"])["items"],
                         [])
        # A rewrite does not grow a message past what a client may send (one that made 40 MB
        # of two bytes stored it, and a reply as long, each turn): refused, nothing stored.
        big, big_sess = t.agent_session()
        t.register(lua_plugin("inflate", ["session.message.received@v1"],
                              'ctx.bus.on("session.message.received@v1", function(p) '
                              'p.content = string.rep("Z", 2 * 1024 * 1024) return p end)',
                              limits={"memory_bytes": 64 * 1024 * 1024, "wall_ms": 2000}))
        t.enable("inflate", big["id"])
        status, resp, _ = self.server.post_message(big_sess["id"], "hi", wait=5, token=t.token)
        self.assertEqual(status, 400, resp)
        self.assertIn("at most 1048576 bytes", resp["error"]["message"])
        self.assertEqual(t.ok("GET", "/v1/sessions/%s/messages" % big_sess["id"])["items"], [])

    # ------------------------------------------------------------------ 9. lifecycle

    def test_enable_disable_replace_delete_take_effect_next_turn(self):
        t = self.tenant()
        agent, sess = t.agent_session()
        created = t.register(lua_plugin("life", ["prompt.assemble@v1"], appender("[v1]")))
        self.assertEqual(created["version"], "1.0.0")
        run = t.turn(sess["id"], "a")
        self.assertEqual(run["output"], said("a"))  # registered, not enabled
        shown = t.enable("life", agent["id"])
        self.assertEqual(shown["enabled_for"], [agent["id"]])
        t.enable("life", agent["id"])  # enabling twice is fine
        self.assertEqual(t.ok("GET", "/v1/plugins/life")["enabled_for"], [agent["id"]])
        run = t.turn(sess["id"], "b")
        self.assertEqual(run["output"], said("b[v1]"))
        # Register again (replace): 200, enablements kept, new code on the next turn.
        replaced = t.register(lua_plugin("life", ["prompt.assemble@v1"], appender("[v2]"),
                                         version="2.0.0"), expect=200)
        self.assertEqual(replaced["version"], "2.0.0")
        self.assertEqual(replaced["enabled_for"], [agent["id"]])
        self.assertEqual(replaced["created_at"], created["created_at"])
        self.assertGreaterEqual(parse_time(replaced["updated_at"]),
                                parse_time(created["updated_at"]))
        run = t.turn(sess["id"], "c")
        self.assertEqual(run["output"], said("c[v2]"))
        # Disable: gone on the next turn.
        shown = t.disable("life", agent["id"])
        self.assertEqual(shown["enabled_for"], [])
        run = t.turn(sess["id"], "d")
        self.assertEqual(run["output"], said("d"))
        self.assertError(t.request("POST", "/v1/plugins/life/disable",
                                   {"agent_id": agent["id"]}), 404, "not_found")
        # Enabled for every agent ("*"): this agent and a new one.
        shown = t.enable("life", "*")
        self.assertEqual(shown["enabled_for"], ["*"])
        run = t.turn(sess["id"], "e")
        self.assertEqual(run["output"], said("e[v2]"))
        later, later_sess = t.agent_session()
        run = t.turn(later_sess["id"], "f")
        self.assertEqual(run["output"], said("f[v2]"))
        # Delete: gone everywhere, with its enablements.
        t.ok("DELETE", "/v1/plugins/life", expect=204)
        self.assertError(t.request("GET", "/v1/plugins/life"), 404, "not_found")
        self.assertError(t.request("DELETE", "/v1/plugins/life"), 404, "not_found")
        run = t.turn(sess["id"], "g")
        self.assertEqual(run["output"], said("g"))
        run = t.turn(later_sess["id"], "h")
        self.assertEqual(run["output"], said("h"))
        # Registered again under the same id: not enabled anywhere.
        again = t.register(lua_plugin("life", ["prompt.assemble@v1"], appender("[v3]")))
        self.assertEqual(again["enabled_for"], [])
        run = t.turn(sess["id"], "i")
        self.assertEqual(run["output"], said("i"))
        # The changes are in the event log.
        types = [e["type"] for e in t.events()]
        for e in ("plugin.registered@v1", "plugin.enabled@v1", "plugin.disabled@v1",
                  "plugin.deleted@v1"):
            self.assertIn(e, types)
        registered = [e["payload"] for e in t.events_of("plugin.registered@v1")]
        self.assertEqual([p["replaced"] for p in registered], [False, True, False])

    # ------------------------------------------------------------------ 10. per-agent state

    def test_each_agent_has_its_own_plugin_state(self):
        t = self.tenant()
        counter = '''
local n = 0
ctx.tools.add{name = "next", effect = "once", handler = function()
  n = n + 1
  return {n = n, agent = ctx.session().agent_id}
end}
'''
        t.register(lua_plugin("counter", ["agent.started@v1"], counter))
        t.enable("counter", "*")
        a, a_sess = t.agent_session(tools=["plugin__*"])
        b, b_sess = t.agent_session(tools=["plugin__*"])

        def count(session_id, agent_id, times=1):
            run = t.turn(session_id, "\n".join([call("plugin__counter__next")] * times))
            self.assertEqual(run["status"], "done", run)
            outs = [s["output"] for s in t.tool_steps(run["id"])]
            self.assertTrue(all(o["agent"] == agent_id for o in outs), outs)
            return [o["n"] for o in outs]

        self.assertEqual(count(a_sess["id"], a["id"]), [1])
        self.assertEqual(count(a_sess["id"], a["id"], times=2), [2, 3])
        self.assertEqual(count(b_sess["id"], b["id"]), [1])
        self.assertEqual(count(a_sess["id"], a["id"]), [4])
        # A second session of the same agent shares the agent's state.
        a_sess2 = t.session(a["id"])
        self.assertEqual(count(a_sess2["id"], a["id"]), [5])
        self.assertEqual(count(b_sess["id"], b["id"]), [2])
        # A plugin enabled for A alone does not touch B.
        t.register(lua_plugin("only-a", ["prompt.assemble@v1"], appender("[A]")))
        t.enable("only-a", a["id"])
        self.assertEqual(t.turn(a_sess["id"], "hi")["output"], said("hi[A]"))
        self.assertEqual(t.turn(b_sess["id"], "hi")["output"], said("hi"))
        # B's state was not rebuilt by A's change.
        self.assertEqual(count(b_sess["id"], b["id"]), [3])

    # ------------------------------------------------------------------ 11. webhooks

    def test_webhook_deliveries_are_signed(self):
        t = self.tenant()
        secret_value = "whsec-" + unique_name("v")
        t.set_secret("hook-key", secret_value)
        path = "/ok-" + unique_name("p")
        t.register(webhook_plugin("observer", self.receiver.url(path),
                                  ["session.opened@v1", "model.after@v1", "tool.after@v1"],
                                  "hook-key", timeout_ms=3000))
        agent = t.agent()
        t.enable("observer", agent["id"])
        sess = t.session(agent["id"])
        run = t.turn(sess["id"], call("time.now"))
        self.assertEqual(run["status"], "done", run)
        # session.opened, model.after twice (the call, the answer), tool.after.
        # (Counted by delivery id: a delivery sent twice is the bug of
        # test_webhook_delivers_each_event_once.)
        wait_for(lambda: len(self.receiver.distinct(path)) >= 4, timeout=20,
                 what="4 webhook deliveries")
        time.sleep(1.5)
        got = self.receiver.distinct(path)
        bodies = [self.assertSigned(r, secret_value) for r in got]
        self.assertEqual(sorted(b["event"] for b in bodies),
                         ["model.after@v1", "model.after@v1", "session.opened@v1",
                          "tool.after@v1"])
        for b in bodies:
            self.assertEqual(b["tenant_id"], t.id)
            self.assertEqual(b["agent_id"], agent["id"])
        self.assertEqual(len({b["id"] for b in bodies}), 4, "delivery ids repeat")
        opened = [b for b in bodies if b["event"] == "session.opened@v1"][0]
        self.assertEqual(opened["payload"]["session_id"], sess["id"])
        after = [b for b in bodies if b["event"] == "tool.after@v1"][0]["payload"]
        self.assertEqual((after["tool"], after["run_id"], after["session_id"]),
                         ("time.now", run["id"], sess["id"]))
        # The v1 payload, converted down from v2.
        for k in ("duration_ms", "effect_class", "decision"):
            self.assertNotIn(k, after)
        texts = [b["payload"]["text"] for b in bodies if b["event"] == "model.after@v1"]
        self.assertIn(run["output"], texts)
        # The deliveries list: all delivered, once each.
        listed = t.deliveries("observer")
        self.assertEqual(sorted(d["id"] for d in listed), sorted(b["id"] for b in bodies))
        for d in listed:
            self.assertEqual(d["status"], "delivered", d)
            self.assertEqual(d["attempts"], 1, d)
            self.assertEqual(d["last_status"], 200, d)
            self.assertTime(d["delivered_at"])
            self.assertIsNone(d["next_attempt_at"])
            self.assertEqual(d["plugin_id"], "observer")
        self.assertEqual(len(t.deliveries("observer", "delivered")), 4)
        paged = self.server.list_all("/v1/plugins/observer/deliveries", limit=1,
                                     token=t.token)
        self.assertEqual([d["id"] for d in paged], [d["id"] for d in listed])
        self.assertEqual(t.deliveries("observer", "pending"), [])
        self.assertEqual(t.deliveries("observer", "dead"), [])
        # An agent without the plugin sends nothing.
        other, other_sess = t.agent_session()
        t.turn(other_sess["id"], "quiet")
        time.sleep(1.5)
        self.assertEqual(len(self.receiver.distinct(path)), 4)

    def test_webhook_retries_dies_and_is_replayed(self):
        t = self.tenant()
        secret_value = "whsec-" + unique_name("v")
        t.set_secret("hook-key", secret_value)
        path = "/flaky-" + unique_name("p")
        self.receiver.set_status(path, 500)
        t.register(webhook_plugin("flaky", self.receiver.url(path), ["session.opened@v1"],
                                  "hook-key", max_attempts=2, timeout_ms=2000))
        agent = t.agent()
        t.enable("flaky", agent["id"])
        sess = t.session(agent["id"])
        # The first attempt fails: pending, attempts 1, the receiver's status kept, retried later.
        first = wait_for(lambda: self.receiver.at(path), timeout=15, what="the first attempt")
        self.assertSigned(first[0], secret_value)
        pending = wait_for(lambda: [d for d in t.deliveries("flaky")
                                    if d["attempts"] >= 1], timeout=10, what="attempt recorded")
        self.assertEqual(len(pending), 1, pending)
        d = pending[0]
        delivery_id = d["id"]
        self.assertEqual(d["event"], "session.opened@v1")
        self.assertEqual(d["payload"]["session_id"], sess["id"])
        if d["status"] == "pending":  # not yet retried
            self.assertEqual(d["attempts"], 1, d)
            self.assertEqual(d["last_status"], 500, d)
            self.assertIn("500", d["last_error"])
            self.assertTime(d["next_attempt_at"])
            self.assertIsNone(d["delivered_at"])
        # The second attempt, about a second later, is the last: dead.
        dead = wait_for(lambda: t.deliveries("flaky", "dead"), timeout=20, what="dead delivery")
        self.assertEqual([x["id"] for x in dead], [delivery_id])
        self.assertEqual(dead[0]["attempts"], 2, dead)
        self.assertEqual(dead[0]["last_status"], 500, dead)
        self.assertIn("500", dead[0]["last_error"])
        self.assertIsNone(dead[0]["next_attempt_at"])
        tries = self.receiver.at(path)
        self.assertEqual(len(tries), 2, tries)
        self.assertEqual({r["headers"]["keel-delivery"] for r in tries}, {delivery_id})
        self.assertGreaterEqual(tries[1]["at"] - tries[0]["at"], 0.9, "no backoff")
        self.assertEqual(t.deliveries("flaky", "pending"), [])
        events = t.wait_events("plugin.delivery_dead@v1")
        self.assertEqual(len(events), 1, events)
        p = events[0]["payload"]
        self.assertEqual((p["plugin_id"], p["delivery_id"], p["event"], p["attempts"]),
                         ("flaky", delivery_id, "session.opened@v1", 2))
        self.assertEqual(events[0]["agent_id"], agent["id"])
        # No more attempts once dead.
        time.sleep(2.5)
        self.assertEqual(len(self.receiver.at(path)), 2)

        # Replay: refused to a user, to another plugin's path and for an unknown delivery.
        user, _ = t.new_token("user")
        status, body, _ = t.request("POST", "/v1/plugins/flaky/deliveries/%s/replay"
                                    % delivery_id, {}, token=user)
        self.assertEqual(status, 403, body)
        t.register(lua_plugin("bystander", ["tool.after@v2"], "return"))
        self.assertError(t.request("POST", "/v1/plugins/bystander/deliveries/%s/replay"
                                   % delivery_id, {}), 404, "not_found")
        self.assertError(t.request("POST", "/v1/plugins/flaky/deliveries/%s/replay"
                                   % "01a00000-0000-7000-8000-000000000000", {}), 404,
                         "not_found")
        # A delivery still pending (another plugin, failing, with many attempts left): 409.
        stuck_path = path + "-stuck"
        self.receiver.set_status(stuck_path, 503)
        t.register(webhook_plugin("stuck", self.receiver.url(stuck_path), ["session.opened@v1"],
                                  "hook-key", max_attempts=20))
        other = t.agent()  # not the flaky plugin's agent: no new delivery of that one
        t.enable("stuck", other["id"])
        t.session(other["id"])
        [stuck] = wait_for(lambda: t.deliveries("stuck"), timeout=10, what="a stuck delivery")
        self.assertEqual(stuck["status"], "pending")
        self.assertError(t.request("POST", "/v1/plugins/stuck/deliveries/%s/replay"
                                   % stuck["id"], {}), 409, "conflict")
        t.ok("DELETE", "/v1/plugins/stuck", expect=204)
        # The receiver is fixed; the replay delivers it.
        self.receiver.set_status(path, 200)
        replayed = t.ok("POST", "/v1/plugins/flaky/deliveries/%s/replay" % delivery_id, {},
                        expect=200)
        self.assertEqual(replayed["id"], delivery_id)
        self.assertEqual(replayed["status"], "pending")
        self.assertEqual(replayed["attempts"], 0)
        delivered = wait_for(lambda: t.deliveries("flaky", "delivered"), timeout=15,
                             what="the replayed delivery delivered")
        self.assertEqual([x["id"] for x in delivered], [delivery_id])
        self.assertEqual(delivered[0]["attempts"], 1, delivered)
        self.assertEqual(delivered[0]["last_status"], 200, delivered)
        self.assertTime(delivered[0]["delivered_at"])
        self.assertEqual(t.deliveries("flaky", "dead"), [])
        tries = self.receiver.at(path)
        self.assertEqual(len(tries), 3, tries)
        body = self.assertSigned(tries[2], secret_value)
        self.assertEqual(body["id"], delivery_id)
        self.assertEqual(body["payload"]["session_id"], sess["id"])
        self.assertEqual(len(t.events_of("plugin.delivery_replayed@v1")), 1)
        # Deleting the plugin takes its deliveries with it.
        t.ok("DELETE", "/v1/plugins/flaky", expect=204)
        self.assertError(t.request("GET", "/v1/plugins/flaky/deliveries"), 404, "not_found")

    def test_a_pending_delivery_survives_a_restart(self):
        # A server of its own: restarting the shared one would cost every later test its port.
        server = KeelServer(env={"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": LOOPBACK})
        try:
            t = Tenant(server)
            t.set_secret("hook-key", "restart-secret")
            path = "/restart-" + unique_name("p")
            self.receiver.set_status(path, 503)
            t.register(webhook_plugin("durable", self.receiver.url(path), ["session.opened@v1"],
                                      "hook-key", max_attempts=10))
            t.register(lua_plugin("mark", ["prompt.assemble@v1"], appender("[m]")))
            agent = t.agent()
            t.enable("durable", agent["id"])
            t.enable("mark", agent["id"])
            sess = t.session(agent["id"])
            wait_for(lambda: [d for d in t.deliveries("durable") if d["attempts"] >= 1],
                     timeout=15, what="a failed attempt")
            server.restart()
            self.receiver.set_status(path, 200)
            # After the restart the delivery is still pending and is sent (backoff at most 2 s
            # after the second failure, 4 s after a third).
            delivered = wait_for(lambda: t.deliveries("durable", "delivered"), timeout=20,
                                 what="delivered after the restart")
            self.assertEqual(len(delivered), 1, delivered)
            self.assertGreaterEqual(delivered[0]["attempts"], 2, delivered)
            last = self.receiver.at(path)[-1]
            body = self.assertSigned(last, "restart-secret")
            self.assertEqual(body["payload"]["session_id"], sess["id"])
            # The plugins are still registered and enabled, and work on the next turn.
            run = t.turn(sess["id"], "after restart")
            self.assertEqual(run["output"], said("after restart[m]"))
        finally:
            server.stop()

    # ------------------------------------------------------------------ hard cases

    def test_webhook_delivers_each_event_once(self):
        # Under load, with deliveries in flight while the loop reads the due ones again, each
        # delivery is claimed before it is sent: one answered 2xx is never sent again (a
        # receiver answering a repeated Keel-Delivery with 409 would turn it dead otherwise).
        t = self.tenant()
        t.set_secret("hook-key", "once-secret")
        path = "/once-" + unique_name("p")
        self.receiver.set_delay(path, 0.02)
        self.receiver.answer_repeats_with_409(path)
        lock = threading.Lock()
        t.register(webhook_plugin("once", self.receiver.url(path),
                                  ["tool.after@v2", "model.after@v1"], "hook-key",
                                  max_attempts=2))
        t.enable("once", "*")
        sessions = [t.agent_session()[1] for _ in range(6)]
        stop_at = time.monotonic() + 6
        produced, failures = [], []

        def drive(sess):
            n = 0
            try:
                # Turns until a repeated delivery shows up, at most 6 s and 100 turns (each turn
                # adds three deliveries the loop must settle below, however fast turns are).
                while (time.monotonic() < stop_at and n < 300
                       and not self._repeated(path)):
                    run = t.turn(sess["id"], call("time.now"))
                    assert run["status"] == "done", run
                    n += 3  # model.after twice, tool.after once
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(e)
            with lock:
                produced.append(n)

        threads = [threading.Thread(target=drive, args=(x,)) for x in sessions]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if failures:
            raise RuntimeError("a turn failed: %r" % failures[0])  # an error, not the bug
        total = sum(produced)

        def settled():
            listed = self.server.list_all("/v1/plugins/once/deliveries", limit=500,
                                          token=t.token)
            if len(listed) < total or any(d["status"] == "pending" for d in listed):
                return None
            return listed
        listed = wait_for(settled, timeout=60, interval=0.5, what="every delivery settled")
        counts = {}
        for r in self.receiver.at(path):
            key = r["headers"]["keel-delivery"]
            counts[key] = counts.get(key, 0) + 1
        repeated = {k: v for k, v in counts.items() if v > 1}
        # Every delivery was answered 200 at its first attempt: all must stay delivered.
        self.assertEqual({d["id"]: d["status"] for d in listed if d["status"] != "delivered"},
                         {}, "answered 2xx, yet not delivered (sent %s times)" % repeated)
        self.assertEqual(t.events_of("plugin.delivery_dead@v1"), [])
        self.assertEqual(repeated, {}, "deliveries sent more than once (of %d)" % len(counts))

    def _repeated(self, path):
        seen = set()
        for r in self.receiver.at(path):
            key = r["headers"].get("keel-delivery")
            if key in seen:
                return True
            seen.add(key)
        return False

    def test_the_wall_limit_holds_inside_a_long_library_call_at_load(self):
        # Budgets are checked between VM instructions, so a library call that loops in C must
        # be bounded itself: table.move over a huge empty range (no allocation, no instruction)
        # is refused at once instead of blocking the event loop, here at registration time.
        t = self.tenant()
        latency = []

        def probe():
            t1 = time.monotonic()
            self.server.request("GET", "/healthz", token=None, timeout=120)
            latency.append(time.monotonic() - t1)

        probe_thread = threading.Timer(0.2, probe)
        probe_thread.start()
        t0 = time.monotonic()
        status, body, _ = t.request("POST", "/v1/plugins",
                                    lua_plugin("mover", ["tool.before@v1"],
                                               "table.move({}, 1, 2e8, 2, {})",
                                               limits={"wall_ms": 50}), timeout=300)
        elapsed = time.monotonic() - t0
        probe_thread.join()
        self.assertLess(elapsed, 1.0, "loading ran %.1fs under wall_ms 50 (HTTP %s)"
                        % (elapsed, status))
        self.assertLess(latency[0], 1.0, "/healthz waited %.1fs meanwhile" % latency[0])
        self.assertEqual(status, 400, body)

    def test_the_wall_limit_holds_inside_a_long_library_call_at_run_time(self):
        # The same at run time with the sandbox's plain string.find: a worst case for a naive
        # search (quadratic, one C call) must stay fast (the search is linear).
        t = self.tenant()
        source = '''
ctx.tools.add{name = "find", handler = function(a)
  local hay = string.rep("a", a.n)
  local needle = string.rep("a", a.m) .. "b"
  return {at = string.find(hay, needle) or 0}
end}
'''
        t.register(lua_plugin("finder", ["tool.before@v1"], source, limits={"wall_ms": 50}))
        agent, sess = t.agent_session()
        t.enable("finder", agent["id"])
        run = t.turn(sess["id"], call("plugin__finder__find", {"n": 1000, "m": 500}))
        self.assertEqual(run["output"], 'The tool plugin__finder__find returned: {"at":0}.')
        latency = []

        def probe():
            t1 = time.monotonic()
            self.server.request("GET", "/healthz", token=None, timeout=120)
            latency.append(time.monotonic() - t1)

        probe_thread = threading.Timer(0.2, probe)
        probe_thread.start()
        t0 = time.monotonic()
        run = t.turn(sess["id"], call("plugin__finder__find", {"n": 800000, "m": 400000}))
        elapsed = time.monotonic() - t0
        probe_thread.join()
        self.assertLess(elapsed, 1.0, "the call ran %.1fs under wall_ms 50" % elapsed)
        self.assertLess(latency[0], 1.0, "/healthz waited %.1fs meanwhile" % latency[0])

    def test_a_deleted_agents_enablement_can_be_removed(self):
        # Deleting an agent removes its enablements, and disabling for an agent that no longer
        # exists still works.
        t = self.tenant()
        t.register(lua_plugin("sticky", ["tool.before@v1"], "return"))
        agent = t.agent()
        t.enable("sticky", agent["id"])
        t.ok("DELETE", "/v1/agents/%s" % agent["id"], expect=(200, 204))
        enabled_for = t.ok("GET", "/v1/plugins/sticky")["enabled_for"]
        if agent["id"] in enabled_for:  # not cleaned up: disabling it must at least work
            status, body, _ = t.request("POST", "/v1/plugins/sticky/disable",
                                        {"agent_id": agent["id"]})
            self.assertEqual(status, 200, body)
        self.assertNotIn(agent["id"], t.ok("GET", "/v1/plugins/sticky")["enabled_for"])

    def test_a_transform_returning_invalid_utf8_at_intake(self):
        # Lua strings are bytes: a transform's strings leave the sandbox as valid UTF-8 (an
        # invalid byte becomes U+FFFD), so the message is taken on both stores.
        t = self.tenant()
        t.register(lua_plugin("bytes", ["session.message.received@v1"],
                              'ctx.bus.on("session.message.received@v1", function(p) '
                              'p.content = p.content .. " \\255"; return p end)'))
        agent, sess = t.agent_session()
        t.enable("bytes", agent["id"])
        status, body, _ = self.server.post_message(sess["id"], "valid text", wait=10,
                                                   token=t.token)
        self.assertIn(status, (200, 202), body)
        self.assertIn(body["message"]["content"], ("valid text \ufffd", "valid text"))
        self.assertEqual(body["run"]["status"], "done", body)

    def test_a_transform_returning_invalid_utf8_to_the_model(self):
        # The same towards the model: prompt.assemble adding "\255" to the conversation still
        # lets the run end (PostgreSQL refuses invalid UTF-8; Keel never sends it any).
        t = self.tenant()
        t.register(lua_plugin("bytes2", ["prompt.assemble@v1"], appender(" \\255")))
        agent, sess = t.agent_session()
        t.enable("bytes2", agent["id"])
        status, body, _ = self.server.post_message(sess["id"], "hi", wait=8, token=t.token,
                                                   timeout=40)
        self.assertIn(status, (200, 202), body)
        self.assertIn(body["run"]["status"], TERMINAL_RUN_STATES, body["run"])
        # And the session takes the next message.
        t.disable("bytes2", agent["id"])
        run = t.turn(sess["id"], "next")
        self.assertEqual(run["output"], said("next"))


if __name__ == "__main__":
    unittest.main()

"""Calls Keel makes to URLs tenants chose, attacked: an MCP server over HTTP or a webhook
receiver at a loopback, private, link-local or otherwise internal address (or at a name that
resolves to one) is refused unless the platform admin's outbound_allow opens it, and nothing is
sent there; an MCP server's HTTP error never carries its body into what Keel shows; and the
secrets an MCP server is given by reference are named, never shown, in everything that comes
back from it: the run, its steps, the session's messages, the event log, an export and the
store's bytes."""

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import keel_harness
from keel_harness import KeelServer, KeelTestCase, keel_bin, unique_name, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_STDIO = os.path.normpath(os.path.join(HERE, "..", "fakes", "fake_mcp_stdio.py"))
KEK = base64.b64encode(bytes(range(32))).decode()
SECRET_BODY = "SECRET-BODY-of-an-internal-service"


class FakeMcpHttp:
    """An MCP server on the streamable HTTP transport, in this process, that counts what reaches
    it. mode "ok" serves one tool (echo); "fail_init" answers everything with 500 and a body;
    "fail_call" and "junk_call" answer initialize and tools/list, then tools/call with a 500
    and a body, or with a 200 whose body is not JSON-RPC."""

    def __init__(self, mode="ok", host="127.0.0.1"):
        fake = self
        self.mode = mode
        self.requests = 0
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def answer(self, status, body, content_type="application/json", headers=()):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_DELETE(self):
                with fake.lock:
                    fake.requests += 1
                self.answer(405, "")

            def do_POST(self):
                with fake.lock:
                    fake.requests += 1
                n = int(self.headers.get("Content-Length") or 0)
                msg = json.loads(self.rfile.read(n) or b"{}")
                method = msg.get("method", "")
                if fake.mode == "fail_init" or (fake.mode == "fail_call" and
                                                method == "tools/call"):
                    self.answer(500, SECRET_BODY, "text/plain")
                    return
                if fake.mode == "junk_call" and method == "tools/call":
                    self.answer(200, SECRET_BODY, "application/json")
                    return
                if "id" not in msg:
                    self.answer(202, "")
                    return
                if method == "initialize":
                    result = {"protocolVersion": msg["params"]["protocolVersion"],
                              "capabilities": {"tools": {}},
                              "serverInfo": {"name": "fake-http", "version": "1"}}
                elif method == "tools/list":
                    result = {"tools": [{"name": "echo", "description": "echoes",
                                         "inputSchema": {"type": "object"}}]}
                elif method == "tools/call":
                    args = msg["params"].get("arguments") or {}
                    # {"header": NAME} echoes a request header (a secret sent by reference).
                    text = (str(self.headers.get(args["header"], "")) if "header" in args
                            else str(args.get("text", "")))
                    result = {"content": [{"type": "text", "text": text}]}
                else:
                    result = {}
                self.answer(200, json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}),
                            headers=[("Mcp-Session-Id", "s1")])

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self.httpd = Server((host, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def count(self):
        with self.lock:
            return self.requests

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Receiver:
    """A webhook receiver that records every request that reaches it."""

    def __init__(self):
        receiver = self
        self.hits = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                receiver.hits.append(self.rfile.read(n))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/hook" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class OutboundTest(KeelTestCase):
    """One server with the default guard (nothing internal allowed), one whose keel.toml allows
    loopback."""

    @classmethod
    def setUpClass(cls):
        cls.fake = FakeMcpHttp()
        cls.fake6 = FakeMcpHttp(host="::1")
        cls.server = KeelServer(env={"KEEL_SECRET_KEK": KEK})
        cls.config_dir = tempfile.mkdtemp(prefix="keel-outbound-")
        config = os.path.join(cls.config_dir, "keel.toml")
        with open(config, "w") as f:
            f.write('outbound_allow = ["127.0.0.1/32", "::1"]\n')
        cls.allowed = KeelServer(env={"KEEL_SECRET_KEK": KEK}, args=["--config", config])

    @classmethod
    def tearDownClass(cls):
        cls.allowed.stop()
        cls.server.stop()
        cls.fake.stop()
        cls.fake6.stop()

    @classmethod
    def servers(cls):
        return [cls.server, cls.allowed]

    def register_http(self, server, url, token=None, name=None, expect=201):
        status, out, _ = server.request("POST", "/v1/mcp-servers",
                                        {"name": name or unique_name("h"), "transport": "http",
                                         "url": url}, token=token or server.token)
        self.assertEqual(status, expect, out)
        return out

    def turn(self, server, agent, text, token=None):
        token = token or server.token
        session = server.create_session(agent["id"], token=token)
        body = server.send(session["id"], text, wait=20, token=token)
        return body["run"], server.steps(body["run"]["id"], token=token), session

    def internal_urls(self):
        port = self.fake.port
        return ["http://127.0.0.1:%d/mcp" % port,
                "http://localhost:%d/mcp" % port,
                "http://[::1]:%d/mcp" % self.fake6.port,
                "http://[::ffff:127.0.0.1]:%d/mcp" % port,
                "http://0.0.0.0:%d/mcp" % port,
                "http://127.1.2.3:%d/mcp" % port,
                "http://169.254.169.254/latest/meta-data/",
                "http://10.0.0.1/mcp",
                "http://192.168.0.1/mcp",
                "http://[fd00::1]/mcp"]

    # ------------------------------------------------------------------ the guard

    def test_internal_mcp_servers_are_refused_by_default(self):
        t = keel_harness.Tenant(self.server)
        before = (self.fake.count(), self.fake6.count())
        for url in self.internal_urls():
            with self.subTest(url=url):
                srv = self.register_http(self.server, url, token=t.token)
                self.assertEqual(srv["status"], "error", srv)
                self.assertIn("refused", srv["error"])
                self.assertIn("outbound_allow", srv["error"])
                self.assertEqual(srv["tools"], [])
                # Listing shows the same reason; a call is denied with it.
                listed = [x for x in t.ok("GET", "/v1/mcp-servers")["items"]
                          if x["id"] == srv["id"]][0]
                self.assertEqual(listed["status"], "error", listed)
                self.assertIn("refused", listed["error"])
                agent = self.server.create_agent(tools=["mcp__%s__*" % srv["name"]],
                                                 token=t.token)
                run, steps, _ = self.turn(self.server, agent,
                                          '/call mcp__%s__echo {"text": "x"}' % srv["name"],
                                          token=t.token)
                tool = [x for x in steps if x["kind"] == "tool"][0]
                self.assertEqual(tool["status"], "denied", tool)
                self.assertIn("refused", tool["output"]["error"])
        self.assertEqual((self.fake.count(), self.fake6.count()), before,
                         "a refused server was sent a request")

    def test_the_admins_allow_list_opens_exactly_its_ranges(self):
        s = self.allowed
        for url in ("http://127.0.0.1:%d/mcp" % self.fake.port,
                    "http://localhost:%d/mcp" % self.fake.port,
                    "http://[::1]:%d/mcp" % self.fake6.port):
            with self.subTest(url=url):
                srv = self.register_http(s, url)
                self.assertEqual(srv["status"], "ready", srv)
                agent = s.create_agent(tools=["mcp__%s__*" % srv["name"]])
                run, steps, _ = self.turn(s, agent,
                                          '/call mcp__%s__echo {"text": "allowed"}' % srv["name"])
                self.assertEqual(run["status"], "done", run)
                self.assertIn("allowed", run["output"])
        # What the list does not name stays refused.
        for url in ("http://127.0.0.2:%d/mcp" % self.fake.port,
                    "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/mcp"):
            with self.subTest(url=url):
                srv = self.register_http(s, url)
                self.assertEqual(srv["status"], "error", srv)
                self.assertIn("refused", srv["error"])

    def test_a_bad_allow_list_stops_the_server_at_start(self):
        for env in ({"KEEL_OUTBOUND_ALLOW": "127.0.0.1/33"},
                    {"KEEL_OUTBOUND_ALLOW": "localhost"}):
            with self.subTest(env=env):
                with self.assertRaises(keel_harness.ServerDied) as caught:
                    KeelServer(env=env, ready_timeout=15)
                self.assertIn("KEEL_OUTBOUND_ALLOW", str(caught.exception))

    def test_a_webhook_to_an_internal_address_is_refused(self):
        receiver = Receiver()
        self.addCleanup(receiver.stop)
        t = keel_harness.Tenant(self.server)
        t.ok("PUT", "/v1/secrets/hook-key", {"value": "whsec-" + unique_name("v")})
        t.ok("POST", "/v1/plugins", {
            "manifest": {"id": "inside", "name": "Inside", "version": "1.0.0", "kind": "webhook",
                         "url": receiver.url, "events": ["session.opened@v1"],
                         "max_attempts": 1, "timeout_ms": 2000},
            "config": {"secret": "hook-key"}}, expect=201)
        agent = self.server.create_agent(token=t.token)
        t.ok("POST", "/v1/plugins/inside/enable", {"agent_id": agent["id"]}, expect=200)
        self.server.create_session(agent["id"], token=t.token)
        dead = wait_for(lambda: t.ok("GET", "/v1/plugins/inside/deliveries?status=dead")["items"],
                        20, "a dead delivery")
        self.assertEqual(len(dead), 1, dead)
        self.assertIn("refused", dead[0]["last_error"])
        self.assertIn("127.0.0.1 is a loopback address", dead[0]["last_error"])
        self.assertEqual(dead[0]["last_status"], 0, dead)
        self.assertEqual(receiver.hits, [], "the refused receiver was sent the delivery")

    # ------------------------------------------------------------------ bodies stay out

    def test_an_mcp_servers_error_body_never_reaches_an_answer(self):
        s = self.allowed
        for mode in ("fail_init", "fail_call", "junk_call"):
            with self.subTest(mode=mode):
                fake = FakeMcpHttp(mode)
                self.addCleanup(fake.stop)
                srv = self.register_http(s, "http://127.0.0.1:%d/mcp" % fake.port)
                seen = [json.dumps(srv), json.dumps(s.ok("GET", "/v1/mcp-servers"))]
                if mode == "fail_init":
                    self.assertEqual(srv["status"], "error", srv)
                    self.assertIn("HTTP 500", srv["error"])
                else:
                    self.assertEqual(srv["status"], "ready", srv)
                    agent = s.create_agent(tools=["mcp__%s__*" % srv["name"]])
                    run, steps, session = self.turn(
                        s, agent, '/call mcp__%s__echo {"text": "x"}' % srv["name"])
                    self.assertEqual(run["status"], "done", run)
                    tool = [x for x in steps if x["kind"] == "tool"][0]
                    self.assertEqual(tool["status"], "failed", tool)
                    if mode == "fail_call":
                        self.assertIn("HTTP 500", tool["output"]["error"])
                    seen += [json.dumps(run), json.dumps(steps),
                             json.dumps(s.ok("GET", "/v1/sessions/%s/messages" % session["id"]))]
                self.assertGreater(fake.count(), 0)
                seen.append(json.dumps(s.all_events()))
                for text in seen:
                    self.assertNotIn("SECRET-BODY", text)
                    self.assertNotIn("internal-service", text)

    # ------------------------------------------------------------------ secrets by reference

    def test_secrets_given_to_an_mcp_server_never_come_back(self):
        s = self.server
        t = keel_harness.Tenant(s)
        value = "vault-value-" + unique_name("x")
        t.ok("PUT", "/v1/secrets/mcp_token", {"value": value})
        srv = t.ok("POST", "/v1/mcp-servers", {
            "name": "leaky", "command": [sys.executable, FAKE_STDIO],
            "env": {"LEAKY_TOKEN": {"secret": "mcp_token"}}}, expect=201)
        self.assertEqual(srv["status"], "ready", srv)
        agent = s.create_agent(tools=["mcp__leaky__*"], token=t.token)
        sessions, runs = [], []
        for args, status in (({"name": "LEAKY_TOKEN"}, "succeeded"),
                             ({"name": "LEAKY_TOKEN", "how": "base64"}, "succeeded"),
                             ({"name": "LEAKY_TOKEN", "how": "error"}, "failed"),
                             ({"name": "LEAKY_TOKEN", "how": "exit"}, "failed")):
            with self.subTest(args=args):
                run, steps, session = self.turn(
                    s, agent, "/call mcp__leaky__env_var " + json.dumps(args), token=t.token)
                self.assertEqual(run["status"], "done", run)
                tool = [x for x in steps if x["kind"] == "tool"][0]
                self.assertEqual(tool["status"], status, tool)
                self.assertIn("[secret:mcp_token]", json.dumps(tool["output"]))
                self.assertIn("[secret:mcp_token]", run["output"])
                sessions.append(session["id"])
                runs.append(run["id"])
        # The whole environment, as JSON: the value named inside it.
        run, _, session = self.turn(s, agent, "/call mcp__leaky__env {}", token=t.token)
        self.assertIn('"LEAKY_TOKEN": "[secret:mcp_token]"', run["output"])
        sessions.append(session["id"])
        runs.append(run["id"])

        forms = [value.encode(), base64.b64encode(value.encode()).rstrip(b"=")]
        seen = [("events", json.dumps(s.all_events(token=t.token)).encode())]
        for run_id in runs:
            seen.append(("run", json.dumps(s.get_run(run_id, token=t.token)).encode()))
            seen.append(("steps", json.dumps(s.steps(run_id, token=t.token)).encode()))
        for session_id in sessions:
            messages = t.ok("GET", "/v1/sessions/%s/messages" % session_id)
            self.assertIn("[secret:mcp_token]", json.dumps(messages))
            seen.append(("messages", json.dumps(messages).encode()))
        seen.append(("server status", json.dumps(t.ok("GET", "/v1/mcp-servers")).encode()))
        seen += s.store_contents()
        with tempfile.TemporaryDirectory() as d:
            archive = os.path.join(d, "export.tar.zst")
            proc = subprocess.run([keel_bin(), "export", "--home", s.home, "--store",
                                   s.store_url or "sqlite://" + os.path.join(s.home, "keel.db"),
                                   archive], capture_output=True, text=True, timeout=120)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            tar = subprocess.run(["tar", "--zstd", "-xOf", archive], capture_output=True,
                                 timeout=60)
            self.assertEqual(tar.returncode, 0, tar.stderr)
            self.assertIn(b"[secret:mcp_token]", tar.stdout)
            seen.append(("export", tar.stdout))
        for label, data in seen:
            for form in forms:
                self.assertNotIn(form, data, "%s shows the secret (%r)" % (label, form))

    def test_a_secret_header_echoed_by_an_http_server_is_named(self):
        s = self.allowed
        value = "header-value-" + unique_name("x")
        s.ok("PUT", "/v1/secrets/hdr_key", {"value": value})
        srv = s.ok("POST", "/v1/mcp-servers", {
            "name": unique_name("hdr"), "transport": "http",
            "url": "http://127.0.0.1:%d/mcp" % self.fake.port,
            "headers": {"X-Api-Key": {"secret": "hdr_key"}}}, expect=201)
        self.assertEqual(srv["status"], "ready", srv)
        agent = s.create_agent(tools=["mcp__%s__*" % srv["name"]])
        run, steps, session = self.turn(
            s, agent, '/call mcp__%s__echo {"header": "X-Api-Key"}' % srv["name"])
        self.assertEqual(run["status"], "done", run)
        self.assertIn("[secret:hdr_key]", run["output"])
        shown = json.dumps([run, steps, s.ok("GET", "/v1/sessions/%s/messages" % session["id"]),
                            s.all_events()])
        self.assertNotIn(value, shown)
        for label, data in s.store_contents():
            self.assertNotIn(value.encode(), data, label)

    def test_a_secret_too_short_to_hide_is_not_given_to_a_server(self):
        t = keel_harness.Tenant(self.server)
        t.ok("PUT", "/v1/secrets/pin", {"value": "1234567"})
        srv = t.ok("POST", "/v1/mcp-servers", {
            "name": "shorty", "command": [sys.executable, FAKE_STDIO],
            "env": {"PIN": {"secret": "pin"}}}, expect=201)
        self.assertEqual(srv["status"], "error", srv)
        self.assertIn("secret pin is shorter than 8 bytes", srv["error"])
        self.assertNotIn("1234567", json.dumps(srv))


if __name__ == "__main__":
    unittest.main()

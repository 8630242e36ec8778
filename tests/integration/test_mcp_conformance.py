"""Keel against the official MCP conformance suite (@modelcontextprotocol/conformance).

As a server (/v1/mcp, driven by the suite's reference TypeScript SDK client): the scenarios that
apply to a tools-only server: the initialize handshake, ping, logging/setLevel, tools/list and
DNS rebinding protection. The suite cannot send a bearer token, so it talks to Keel through a
small proxy that adds one and passes everything else (Host and Origin included) unchanged.

As a client (Keel's streamable HTTP MCP client): the suite starts a scenario server and runs a
command with its URL; the command (this file with `drive URL`) registers that URL as an MCP
server of a running Keel and has an agent call the scenario's tool, so the suite sees Keel's
initialize handshake and tools/call.
`make test` installs the suite (scripts/install-mcp-test-servers.sh) and sets KEEL_TEST_MCP_DIR.
"""

import http.client
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import unittest
import urllib.request

from keel_harness import KeelServer, KeelTestCase

MCP_DIR = os.environ.get("KEEL_TEST_MCP_DIR", "")
# The scenario servers listen on localhost, which only the admin's outbound_allow opens.
LOOPBACK = "127.0.0.1/32,::1/128"
SUITE = os.path.join(MCP_DIR, "node_modules", "@modelcontextprotocol", "conformance", "dist",
                     "index.js")
CLIENT_SCENARIOS = {"initialize": None, "tools_call": ("add_numbers", {"a": 2, "b": 3})}
SCENARIOS = ["server-initialize", "ping", "logging-set-level", "tools-list",
             "dns-rebinding-protection"]


def auth_proxy(upstream_port, token):
    """A proxy on 127.0.0.1 that adds `Authorization: Bearer token` to every request."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            conn.putrequest(self.command, self.path, skip_host=True,
                            skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in ("authorization", "connection", "content-length"):
                    conn.putheader(name, value)
            conn.putheader("Authorization", "Bearer " + token)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            self.send_response(resp.status)
            for name, value in resp.getheaders():
                if name.lower() not in ("connection", "content-length", "transfer-encoding"):
                    self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            while True:  # stream (SSE answers arrive in pieces)
                chunk = resp.read1(65536)
                if not chunk:
                    break
                self.wfile.write(chunk)
                self.wfile.flush()
            conn.close()

        do_GET = do_POST = do_DELETE = _forward

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@unittest.skipUnless(os.path.exists(SUITE),
                     "the MCP conformance suite is not installed (make test installs it with "
                     "scripts/install-mcp-test-servers.sh and sets KEEL_TEST_MCP_DIR)")
class McpConformanceTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_OUTBOUND_ALLOW": LOOPBACK})
        cls.proxy = auth_proxy(int(cls.server.addr.rsplit(":", 1)[1]), cls.server.token)

    @classmethod
    def tearDownClass(cls):
        cls.proxy.shutdown()
        cls.server.stop()

    def suite(self, *args, env=None):
        proc = subprocess.run(["node", SUITE] + list(args), capture_output=True, text=True,
                              timeout=120, env=env)
        if os.environ.get("KEEL_TEST_VERBOSE"):
            print(proc.stdout + proc.stderr)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out)
        passed = re.search(r"Passed:\s*(\d+)/(\d+)", out)
        self.assertIsNotNone(passed, out)
        self.assertEqual(passed.group(1), passed.group(2), out)
        self.assertGreater(int(passed.group(2)), 0, out)

    def test_client_scenarios(self):
        env = dict(os.environ, KEEL_CONF_BASE=self.server.base_url, KEEL_CONF_TOKEN=self.server.token)
        command = "%s %s drive" % (sys.executable, os.path.abspath(__file__))
        for scenario in CLIENT_SCENARIOS:
            with self.subTest(scenario=scenario):
                self.suite("client", "--command", command, "--scenario", scenario, env=env)

    def test_server_scenarios(self):
        agent = self.server.create_agent(tools=["time.now", "notes.append", "files.read"])
        url = "http://127.0.0.1:%d/v1/mcp?agent=%s" % (self.proxy.server_address[1], agent["id"])
        for scenario in SCENARIOS:
            with self.subTest(scenario=scenario):
                self.suite("server", "--url", url, "--scenario", scenario)


def drive(url):
    """The client command of the suite: Keel (at KEEL_CONF_BASE) connects to the scenario's
    server at `url` and, when the scenario has a tool to call, an agent calls it."""
    base, token = os.environ["KEEL_CONF_BASE"], os.environ["KEEL_CONF_TOKEN"]

    def call(method, path, body=None):
        req = urllib.request.Request(base + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": "Bearer " + token,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read()
            return json.loads(text) if text else None

    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    name = "conf" + str(os.getpid())
    server = call("POST", "/v1/mcp-servers", {"name": name, "transport": "http", "url": url})
    try:
        if server.get("status") != "ready":
            sys.exit("the scenario's server did not come up in Keel: %r" % server)
        tool = CLIENT_SCENARIOS.get(scenario)
        if tool:
            agent = call("POST", "/v1/agents", {"name": name, "model": "local",
                                                "tools": ["mcp__%s__*" % name]})
            session = call("POST", "/v1/agents/%s/sessions" % agent["id"], {})
            content = "/call mcp__%s__%s %s" % (name, tool[0], json.dumps(tool[1]))
            posted = call("POST", "/v1/sessions/%s/messages?wait=60" % session["id"],
                          {"content": content})
            if posted["run"]["status"] != "done":
                sys.exit("the call's run did not finish: %r" % posted["run"])
            print(posted["run"]["output"])
    finally:
        call("DELETE", "/v1/mcp-servers/" + server["id"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "drive":
        drive(sys.argv[2])
        sys.exit(0)
    unittest.main()


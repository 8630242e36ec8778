"""MCP servers as tool providers, end to end: a server registered over HTTP is started, its tools
become mcp__{server}__{tool} for agents that name them, and every call passes the same gateway
(policy, approvals) as the built-in tools. Secrets reach the server's environment by reference.
A server that crashes is started again on the next call. Uses tests/fakes/fake_mcp_stdio.py (a
stdio server speaking MCP's wire format) and, when KEEL_TEST_MCP_DIR holds it (make test
installs it), the reference @modelcontextprotocol/server-everything."""

import base64
import os
import socket
import subprocess
import sys
import time
import unittest

from keel_harness import KeelServer, KeelTestCase

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.normpath(os.path.join(HERE, "..", "fakes", "fake_mcp_stdio.py"))
KEK = base64.b64encode(bytes(range(32))).decode()
# The HTTP servers listen on loopback, which only the admin's outbound_allow opens.
LOOPBACK = "127.0.0.1/32,::1/128"
MCP_DIR = os.environ.get("KEEL_TEST_MCP_DIR", "")
EVERYTHING = os.path.join(MCP_DIR, "node_modules", "@modelcontextprotocol", "server-everything",
                          "dist", "index.js")


class McpTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": LOOPBACK})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def register(self, body, expect=201):
        status, out, _ = self.server.request("POST", "/v1/mcp-servers", body)
        self.assertEqual(status, expect, out)
        return out

    def turn(self, agent, text):
        s = self.server
        session = s.create_session(agent["id"])
        body = s.send(session["id"], text, wait=20)
        return body["run"], s.steps(body["run"]["id"])

    def test_a_registered_server_serves_tools_through_the_gateway(self):
        s = self.server
        s.ok("PUT", "/v1/secrets/fake_token", {"value": "tok-from-the-vault"})
        srv = self.register({"name": "fake", "command": [sys.executable, FAKE],
                             "env": {"FAKE_TOKEN": {"secret": "fake_token"}, "MODE": "test"}})
        self.assertEqual(srv["status"], "ready", srv)
        names = [t["name"] for t in srv["tools"]]
        self.assertIn("mcp__fake__echo", names)
        self.assertEqual(srv["env"]["FAKE_TOKEN"], {"secret": "fake_token"})  # never the value
        listed = s.ok("GET", "/v1/mcp-servers")["items"]
        self.assertEqual([x["name"] for x in listed if x["name"] == "fake"], ["fake"])

        agent = s.create_agent(tools=["mcp__fake__*"])
        run, steps = self.turn(agent, '/call mcp__fake__echo {"text": "hello over mcp"}')
        self.assertEqual(run["status"], "done", run)
        self.assertIn("hello over mcp", run["output"])
        tool = [x for x in steps if x["kind"] == "tool"][0]
        self.assertEqual(tool["status"], "succeeded")
        # The secret reached the server's environment, by reference; what the server sends back
        # names it instead of showing it.
        run, _ = self.turn(agent, "/call mcp__fake__env {}")
        self.assertIn('"FAKE_TOKEN": "[secret:fake_token]"', run["output"])
        self.assertNotIn("tok-from-the-vault", run["output"])
        self.assertIn('"MODE": "test"', run["output"])
        self.assertNotIn("KEEL_SECRET_KEK", run["output"])
        # An agent whose list does not name the server cannot call it.
        other = s.create_agent(tools=["time.now"])
        run, steps = self.turn(other, '/call mcp__fake__echo {"text": "x"}')
        self.assertEqual([x["status"] for x in steps if x["kind"] == "tool"], ["denied"])

    def test_policy_and_approval_apply_to_mcp_tools(self):
        s = self.server
        tenant = s.ok("POST", "/v1/tenants", {"name": "mcp-policy"})
        token = tenant["owner_token"]
        s.ok("POST", "/v1/mcp-servers", {"name": "gated", "command": [sys.executable, FAKE]},
             token=token, expect=201)
        s.ok("PUT", "/v1/policy", {"rules": [
            {"tool": "*", "rights": ["read", "write", "send"]},
            {"tool": "mcp__gated__*", "rights": ["write", "send"], "approval": "always"}]},
            token=token)
        agent = s.create_agent(tools=["mcp__gated__*"], token=token)
        session = s.create_session(agent["id"], token=token)
        body = s.send(session["id"], '/call mcp__gated__echo {"text": "after approval"}', wait=10,
                      token=token)
        self.assertEqual(body["run"]["status"], "waiting_for_approval", body)
        pending = s.ok("GET", "/v1/approvals?status=pending", token=token)["items"]
        self.assertEqual([a["tool"] for a in pending], ["mcp__gated__echo"])
        s.ok("POST", "/v1/approvals/%s/approve" % pending[0]["id"], {}, token=token)
        run = s.wait_run(body["run"]["id"], token=token)
        self.assertEqual(run["status"], "done", run)
        self.assertIn("after approval", run["output"])

    def test_a_crashed_server_is_started_again(self):
        s = self.server
        self.register({"name": "crashy", "command": [sys.executable, FAKE]})
        agent = s.create_agent(tools=["mcp__crashy__*"])
        run, steps = self.turn(agent, '/call mcp__crashy__instance {}')
        first = run["output"]
        run, steps = self.turn(agent, '/call mcp__crashy__crash {"code": 7}')
        self.assertEqual(run["status"], "done", run)
        tool = [x for x in steps if x["kind"] == "tool"][0]
        self.assertEqual(tool["status"], "failed")
        self.assertIn("exit", tool["output"]["error"])
        run, steps = self.turn(agent, '/call mcp__crashy__instance {}')
        self.assertEqual(run["status"], "done", run)
        self.assertNotEqual(run["output"], first, "the server was not started again")

    def test_bad_registrations(self):
        s = self.server
        for body, fragment in [
            ({"name": "Bad", "command": ["x"]}, "lowercase"),
            ({"name": "a__b", "command": ["x"]}, "'__'"),
            ({"name": "h", "transport": "http"}, "url"),
            ({"name": "h", "transport": "http", "url": "ftp://x/mcp"}, "http://"),
            ({"name": "h", "transport": "http", "url": "http://x/mcp", "command": ["x"]},
             "command and env go with transport"),
            ({"name": "c_", "command": ["x"]}, "may not start or end"),
            ({"name": "c", "command": []}, "command"),
            ({"name": "c", "command": ["x"], "env": {"K": 5}}, "env.K"),
            ({"name": "c", "command": ["x"], "extra": 1}, "unknown field"),
        ]:
            status, out, _ = s.request("POST", "/v1/mcp-servers", body)
            self.assertEqual(status, 400, out)
            self.assertIn(fragment, out["error"]["message"])
        self.register({"name": "dup", "command": [sys.executable, FAKE]})
        status, out, _ = s.request("POST", "/v1/mcp-servers",
                                   {"name": "dup", "command": [sys.executable, FAKE]})
        self.assertEqual(status, 409, out)
        # A command that does not exist: registered, reported as an error, calls refused.
        broken = self.register({"name": "broken", "command": ["/no/such/server"]})
        self.assertEqual(broken["status"], "error")
        self.assertIn("/no/such/server", broken["error"])
        agent = s.create_agent(tools=["mcp__broken__*"])
        run, steps = self.turn(agent, "/call mcp__broken__echo {}")
        tool = [x for x in steps if x["kind"] == "tool"][0]
        self.assertEqual(tool["status"], "denied")
        self.assertIn("not available", tool["output"]["error"])
        # Deleting a server removes its tools.
        s.ok("DELETE", "/v1/mcp-servers/%s" % broken["id"], expect=204)
        self.assertEqual(s.request("GET", "/v1/mcp-servers/%s" % broken["id"])[0], 404)

    @unittest.skipUnless(os.path.exists(EVERYTHING),
                         "the reference MCP servers are not installed (make test installs them "
                         "with scripts/install-mcp-test-servers.sh and sets KEEL_TEST_MCP_DIR)")
    def test_the_reference_server_everything(self):
        s = self.server
        srv = self.register({"name": "everything", "command": ["node", EVERYTHING, "stdio"]})
        self.assertEqual(srv["status"], "ready", srv)
        names = [t["name"] for t in srv["tools"]]
        self.assertIn("mcp__everything__echo", names)
        agent = s.create_agent(tools=["mcp__everything__*"])
        run, steps = self.turn(agent, '/call mcp__everything__echo {"message": "from keel"}')
        self.assertEqual(run["status"], "done", run)
        self.assertIn("from keel", run["output"])
        add = "mcp__everything__get-sum" if "mcp__everything__get-sum" in names else \
            "mcp__everything__add"
        run, _ = self.turn(agent, '/call %s {"a": 2, "b": 40}' % add)
        self.assertIn("42", run["output"])

    @unittest.skipUnless(os.path.exists(EVERYTHING),
                         "the reference MCP servers are not installed (make test installs them)")
    def test_streamable_http_transport(self):
        s = self.server
        # A free port, then the server on it; another process may take the port in between
        # (the server then exits), so up to three ports are tried, each for up to 60 s.
        proc, port = None, None
        for _ in range(3):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            sock.close()
            env = dict(os.environ, PORT=str(port))
            proc = subprocess.Popen(["node", EVERYTHING, "streamableHttp"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.addCleanup(proc.wait)
            self.addCleanup(proc.terminate)
            deadline = time.monotonic() + 60
            up = False
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    up = True
                    break
                except OSError:
                    time.sleep(0.1)
            if up:
                break
            proc.terminate()
        self.assertIsNone(proc.poll(), "the reference MCP server did not start")
        s.ok("PUT", "/v1/secrets/web_key", {"value": "key-12345678"})
        srv = self.register({"name": "web", "transport": "http",
                             "url": "http://127.0.0.1:%d/mcp" % port,
                             "headers": {"X-Api-Key": {"secret": "web_key"}}})
        self.assertEqual(srv["status"], "ready", srv)
        self.assertEqual(srv["headers"], {"X-Api-Key": {"secret": "web_key"}})
        self.assertIn("mcp__web__echo", [t["name"] for t in srv["tools"]])
        agent = s.create_agent(tools=["mcp__web__*"])
        run, steps = self.turn(agent, '/call mcp__web__echo {"message": "over http"}')
        self.assertEqual(run["status"], "done", run)
        self.assertIn("over http", run["output"])
        # The server goes away: calls fail as tool errors, the run goes on.
        proc.terminate()
        proc.wait()
        run, steps = self.turn(agent, '/call mcp__web__echo {"message": "gone"}')
        self.assertEqual(run["status"], "done", run)
        self.assertIn([x["status"] for x in steps if x["kind"] == "tool"],
                      (["failed"], ["denied"]))


if __name__ == "__main__":
    unittest.main()

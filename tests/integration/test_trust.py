"""Trust has levels, and each is enforced where it is granted (DESIGN.md invariant 12). A tenant's
owner may not reach the host: host execution and stdio MCP servers outside the sandbox are the
platform admin's to grant, per tenant, and even granted they run as an unprivileged user, never
as Keel's own. Keel's key-encryption key is not in its environment once it started, and no
other process of its user may read its memory. Sandboxed commands and stdio servers see neither
KEEL_HOME nor another agent's workspace.

The machine runs these as root with bubblewrap installed; cases that need either say so."""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from keel_harness import KeelServer, KeelTestCase, Tenant, unique_name

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.normpath(os.path.join(HERE, "..", "fakes", "fake_mcp_stdio.py"))
KEK = base64.b64encode(bytes(range(32))).decode()
EXEC_UID = 65534
IS_ROOT = os.geteuid() == 0
HAVE_BWRAP = shutil.which("bwrap") is not None


def keel_pid(server):
    return server.proc.pid


def as_user(uid, argv):
    """Runs argv as `uid` (from root); returns (exit code, stdout + stderr)."""
    def drop():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    p = subprocess.run(argv, preexec_fn=drop, capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


class TrustTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_SECRET_KEK": KEK})
        cls.other = Tenant(cls.server)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def turn(self, agent, text, token):
        s = self.server
        session = s.create_session(agent["id"], token=token)
        body = s.send(session["id"], text, wait=30, token=token)
        run = s.wait_run(body["run"]["id"], token=token)
        tools = [x for x in s.steps(run["id"], token=token) if x["kind"] == "tool"]
        return run, tools

    def exec_as(self, token, command, backend="sandbox"):
        """An agent of the token's tenant runs `command` with exec; returns its tool step."""
        agent = self.server.create_agent(tools=["exec"], config={"exec_backend": backend},
                                         token=token)
        _, tools = self.turn(agent, "/call exec %s" % json.dumps({"command": command}), token)
        self.assertEqual(len(tools), 1, tools)
        return tools[0]

    def settings(self, tenant_id, body, token=None, expect=200):
        s = self.server
        status, out, _ = s.request("PATCH", "/v1/tenants/%s" % tenant_id, body,
                                   **({} if token is None else {"token": token}))
        self.assertEqual(status, expect, out)
        return out

    # ---------------------------------------------------------------- who may grant

    def test_a_tenant_owner_cannot_create_a_host_exec_agent(self):
        for who, token in (("another tenant's owner", self.other.token),
                           ("the platform admin's own tenant", self.server.token)):
            body = {"name": unique_name("host"), "tools": ["exec"],
                    "config": {"exec_backend": "host"}}
            err = self.assertError(self.server.request("POST", "/v1/agents", body, token=token),
                                   403, "permission_denied", who)
            self.assertIn("platform admin", err["message"])
            # Nor by turning an agent it has into one.
            agent = self.server.create_agent(tools=["exec"], token=token)
            self.assertError(self.server.request("PATCH", "/v1/agents/%s" % agent["id"],
                                                 {"config": {"exec_backend": "host"}},
                                                 token=token), 403, "permission_denied", who)

    def test_only_the_platform_admin_changes_a_tenants_settings(self):
        s = self.server
        user, _ = self.other.new_token("user")
        guest, _ = self.other.new_token("guest")
        admin_tenant = s.ok("GET", "/v1/tenants")["items"][0]["id"]  # the oldest
        for who, token, target in (("the tenant's owner", self.other.token, self.other.id),
                                   ("its user", user, self.other.id),
                                   ("its guest", guest, self.other.id),
                                   ("another tenant's owner", self.other.token, admin_tenant)):
            self.assertError(s.request("PATCH", "/v1/tenants/%s" % target,
                                       {"allow_host_exec": True}, token=token),
                             403, "permission_denied", who)
        listed = {t["id"]: t for t in s.ok("GET", "/v1/tenants")["items"]}
        self.assertEqual(listed[self.other.id]["settings"],
                         {"allow_host_exec": False, "allow_stdio_mcp": False})
        self.assertEqual(listed[admin_tenant]["settings"],
                         {"allow_host_exec": False, "allow_stdio_mcp": False})
        for body, what in (({"allow_host_exec": "yes"}, "true or false"),
                           ({"allow_everything": True}, "unknown field"),
                           ({}, "allow_host_exec")):
            err = self.assertError(s.request("PATCH", "/v1/tenants/%s" % self.other.id, body),
                                   400, "invalid_argument", what)
            self.assertIn(what, err["message"])
        self.assertError(s.request("PATCH", "/v1/tenants/00000000-0000-7000-8000-000000000000",
                                   {"allow_host_exec": True}), 404, "not_found")

    # ---------------------------------------------------------------- host execution granted

    @unittest.skipUnless(IS_ROOT, "switching to the exec user needs root")
    def test_granted_host_exec_runs_as_the_unprivileged_exec_user(self):
        s = self.server
        tenant = Tenant(s)
        self.settings(tenant.id, {"allow_host_exec": True})
        step = self.exec_as(
            tenant.token,
            "id -u; cat /proc/%d/environ >/dev/null 2>&1 && echo ENVIRON-READ; "
            "cat %s/owner.token 2>&1 || true; cat %s/keel.db >/dev/null 2>&1 && echo DB-READ; true"
            % (keel_pid(s), s.home, s.home), backend="host")
        self.assertEqual(step["status"], "succeeded", step)
        out = step["output"]["stdout"]
        self.assertEqual(out.splitlines()[0], str(EXEC_UID), out)
        self.assertNotIn("ENVIRON-READ", out)
        self.assertNotIn("DB-READ", out)
        self.assertNotIn(s.token, out)
        self.assertIn("Permission denied", out)
        # Withdrawn, the next command is refused even though the agent still says "host".
        self.settings(tenant.id, {"allow_host_exec": False})
        agents = s.ok("GET", "/v1/agents", token=tenant.token)["items"]
        host = [a for a in agents if a["config"].get("exec_backend") == "host"][0]
        _, tools = self.turn(host, '/call exec {"command": "id -u"}', tenant.token)
        self.assertEqual(tools[0]["status"], "failed", tools)
        self.assertIn("host execution is not allowed", tools[0]["output"]["error"])
        # The grant was one tenant's: the others still may not.
        self.assertError(s.request("POST", "/v1/agents",
                                   {"name": unique_name("h"), "config": {"exec_backend": "host"}},
                                   token=self.other.token), 403, "permission_denied")

    # ---------------------------------------------------------------- what a sandbox sees

    @unittest.skipUnless(HAVE_BWRAP, "the sandbox needs bubblewrap")
    def test_a_sandboxed_exec_reads_nothing_of_keel_nor_other_agents(self):
        s = self.server
        neighbour = s.create_agent(tools=["files.write"], token=self.other.token)
        _, tools = self.turn(neighbour, '/call files.write {"path": "mine.txt", '
                                        '"content": "neighbour-secret"}', self.other.token)
        self.assertEqual(tools[0]["status"], "succeeded", tools)
        neighbour_ws = os.path.join(s.home, "workspaces", neighbour["id"])
        self.assertTrue(os.path.exists(os.path.join(neighbour_ws, "mine.txt")))
        paths = [os.path.join(s.home, "owner.token"), os.path.join(s.home, "keel.db"),
                 os.path.join(neighbour_ws, "mine.txt"), "/proc/%d/environ" % keel_pid(s)]
        step = self.exec_as(self.other.token,
                            "".join("cat %s 2>/dev/null && echo READ:%s; " % (p, p) for p in paths)
                            + "ls /workspace >/dev/null && echo OWN-WORKSPACE")
        self.assertEqual(step["status"], "succeeded", step)
        out = step["output"]["stdout"]
        self.assertIn("OWN-WORKSPACE", out)
        self.assertNotIn("READ:", out)
        self.assertNotIn("neighbour-secret", out)
        self.assertNotIn(s.token, out)
        self.assertNotIn(KEK, out)

    # ---------------------------------------------------------------- stdio MCP servers

    def register(self, token, name, command, expect=201):
        status, out, _ = self.server.request("POST", "/v1/mcp-servers",
                                             {"name": name, "command": command}, token=token)
        self.assertEqual(status, expect, out)
        return out

    def probe(self, tenant_token, server, paths, connect=None):
        agent = self.server.create_agent(tools=["mcp__%s__probe" % server], token=tenant_token)
        args = {"paths": paths}
        if connect:
            args["connect"] = connect
        run, tools = self.turn(agent, "/call mcp__%s__probe %s" % (server, json.dumps(args)),
                               tenant_token)
        self.assertEqual(tools[0]["status"], "succeeded", tools)
        return json.loads(tools[0]["output"])  # the tool's text: JSON

    @unittest.skipUnless(HAVE_BWRAP, "the sandbox needs bubblewrap")
    def test_a_tenants_stdio_server_runs_in_the_sandbox(self):
        """Registering is allowed (design: sandboxed, not refused); the server sees its own
        files, but neither Keel's home, nor Keel's environment, nor the network."""
        s = self.server
        srv = self.register(self.other.token, "probe", [sys.executable, FAKE])
        self.assertEqual(srv["status"], "ready", srv)
        out = self.probe(self.other.token, "probe",
                         [os.path.join(s.home, "owner.token"), os.path.join(s.home, "keel.db"),
                          "/proc/%d/environ" % keel_pid(s), FAKE],
                         connect=s.addr)
        reads = out["reads"]
        self.assertTrue(reads[FAKE].startswith("read: "), reads)
        for path in (os.path.join(s.home, "owner.token"), os.path.join(s.home, "keel.db"),
                     "/proc/%d/environ" % keel_pid(s)):
            self.assertTrue(reads[path].startswith("error: "), (path, reads[path]))
        self.assertTrue(out["net"].startswith("error"), out)

    @unittest.skipUnless(HAVE_BWRAP, "the sandbox needs bubblewrap")
    def test_the_sandbox_hides_keel_home_inside_a_directory_it_binds(self):
        """KEEL_HOME below the server's own directory (which the sandbox binds read-only) is
        covered: the server cannot read owner.token there."""
        root = tempfile.mkdtemp(prefix="keel-trust-")
        self.addCleanup(shutil.rmtree, root, True)
        shutil.copy(FAKE, os.path.join(root, "server.py"))
        server = KeelServer(home=os.path.join(root, "home"), env={"KEEL_SECRET_KEK": KEK})
        self.addCleanup(server.stop)
        srv = server.ok("POST", "/v1/mcp-servers",
                        {"name": "near", "command": [sys.executable,
                                                     os.path.join(root, "server.py")]},
                        expect=201)
        self.assertEqual(srv["status"], "ready", srv)
        agent = server.create_agent(tools=["mcp__near__probe"])
        session = server.create_session(agent["id"])
        token_path = os.path.join(server.home, "owner.token")
        body = server.send(session["id"], "/call mcp__near__probe %s" % json.dumps(
            {"paths": [token_path, os.path.join(root, "server.py")]}), wait=30)
        server.wait_run(body["run"]["id"])
        tool = [x for x in server.steps(body["run"]["id"]) if x["kind"] == "tool"][0]
        self.assertEqual(tool["status"], "succeeded", tool)
        out = json.loads(tool["output"])
        self.assertTrue(out["reads"][os.path.join(root, "server.py")].startswith("read: "), out)
        self.assertTrue(out["reads"][token_path].startswith("error: "), out)

    @unittest.skipUnless(IS_ROOT, "switching to the exec user needs root")
    def test_unsandboxed_stdio_servers_are_granted_and_run_as_the_exec_user(self):
        s = self.server
        tenant = Tenant(s)
        # Python's own directories must be the exec user's to read (they may be below /root).
        probe_py = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
        root = tempfile.mkdtemp(prefix="keel-trust-")
        os.chmod(root, 0o755)
        self.addCleanup(shutil.rmtree, root, True)
        shutil.copy(FAKE, os.path.join(root, "server.py"))
        os.chmod(os.path.join(root, "server.py"), 0o644)
        self.settings(tenant.id, {"allow_stdio_mcp": True})
        srv = self.register(tenant.token, "free", [probe_py, os.path.join(root, "server.py")])
        self.assertEqual(srv["status"], "ready", srv)
        out = self.probe(tenant.token, "free",
                         [os.path.join(s.home, "owner.token"), "/proc/%d/environ" % keel_pid(s)])
        self.assertEqual(out["uid"], EXEC_UID, out)
        for path, result in out["reads"].items():
            self.assertTrue(result.startswith("error: "), (path, result))

    # ---------------------------------------------------------------- Keel's own process

    def test_the_kek_is_not_in_keels_environment(self):
        with open("/proc/%d/environ" % keel_pid(self.server), "rb") as f:
            environ = f.read()
        self.assertNotIn(KEK.encode(), environ)
        self.assertNotIn(b"KEEL_SECRET_KEK=", environ)
        self.assertIn(b"KEEL_HOME=", environ)  # the rest is as it was
        # The key still works: secrets seal and open.
        self.server.ok("PUT", "/v1/secrets/trust_probe", {"value": "v"})


@unittest.skipUnless(IS_ROOT, "starting Keel as an unprivileged user needs root")
class UnprivilegedKeelTest(KeelTestCase):
    """Keel run as an ordinary user cannot switch to the exec user: granted host execution and
    unsandboxed stdio servers are refused with a clear error, never run as Keel's own user. And
    a process of Keel's own user cannot read Keel's environment (Keel is not dumpable)."""

    @classmethod
    def setUpClass(cls):
        if os.environ.get("KEEL_TEST_STORE"):
            raise unittest.SkipTest("runs on its own SQLite store")
        cls.dir = tempfile.mkdtemp(prefix="keel-unpriv-")
        os.chmod(cls.dir, 0o755)
        home = os.path.join(cls.dir, "home")
        os.makedirs(home)
        os.chown(home, EXEC_UID, EXEC_UID)
        server = KeelServer(home=home, env={"KEEL_SECRET_KEK": KEK, "KEEL_EXEC_UID": "1234",
                                            "KEEL_EXEC_GID": "1234"}, start=False)
        command = server._command

        def unprivileged(listen):
            return ["setpriv", "--reuid", str(EXEC_UID), "--regid", str(EXEC_UID),
                    "--clear-groups", "--"] + command(listen)
        server._command = unprivileged
        # The logs are written by the harness (root); Keel's own files by Keel.
        server.start()
        cls.server = server

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir, True)

    def test_granted_host_exec_is_refused_not_run_as_keel(self):
        s = self.server
        admin = s.ok("GET", "/v1/tenants")["items"][0]["id"]
        s.ok("PATCH", "/v1/tenants/%s" % admin, {"allow_host_exec": True})
        agent = s.create_agent(tools=["exec"], config={"exec_backend": "host"})
        session = s.create_session(agent["id"])
        body = s.send(session["id"], '/call exec {"command": "id -u"}', wait=30)
        s.wait_run(body["run"]["id"])
        tool = [x for x in s.steps(body["run"]["id"]) if x["kind"] == "tool"][0]
        self.assertEqual(tool["status"], "failed", tool)
        self.assertIn("CAP_SETUID", tool["output"]["error"])

    def test_granted_unsandboxed_stdio_is_refused_not_run_as_keel(self):
        s = self.server
        admin = s.ok("GET", "/v1/tenants")["items"][0]["id"]
        s.ok("PATCH", "/v1/tenants/%s" % admin, {"allow_stdio_mcp": True})
        srv = s.ok("POST", "/v1/mcp-servers", {"name": "refused", "command": ["/bin/cat"]},
                   expect=201)
        self.assertEqual(srv["status"], "error", srv)
        self.assertIn("CAP_SETUID", srv["error"])

    def test_keels_own_user_cannot_read_its_environment(self):
        code, out = as_user(EXEC_UID, ["cat", "/proc/%d/environ" % self.server.proc.pid])
        self.assertNotEqual(code, 0, out)
        self.assertNotIn(KEK, out)


if __name__ == "__main__":
    unittest.main()

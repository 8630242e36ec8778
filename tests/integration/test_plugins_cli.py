"""`keel plugins`: the CLI against a real server. A Lua veto plugin is registered from a
directory, enabled for all agents (a tool call is then vetoed), listed, shown, disabled and
deleted; registrations that cannot be read say which file is wrong."""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

from keel_harness import KeelServer, KeelTestCase, keel_bin, unique_name

MANIFEST = {
    "id": "no-time",
    "name": "No time",
    "version": "1.0.0",
    "kind": "lua",
    "events": ["tool.before@v1"],
    "failure_mode": "fail",
    "config_schema": {"type": "object",
                      "properties": {"tools": {"type": "array", "items": {"type": "string"}}}},
}

SOURCE = """
local denied = {}
for _, name in ipairs(ctx.config.tools or {}) do denied[name] = true end
ctx.bus.on("tool.before@v1", function(call)
  if denied[call.tool] then
    return {allow = false, reason = call.tool .. " is not allowed here"}
  end
  return {allow = true}
end)
"""


class PluginsCliTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="keel-plugin-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def keel(self, *args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update({"KEEL_URL": self.server.base_url, "KEEL_TOKEN": self.server.token})
        return subprocess.run([keel_bin(), *args], capture_output=True, text=True, env=env,
                              timeout=60, stdin=subprocess.DEVNULL)

    def ok(self, *args):
        proc = self.keel(*args)
        self.assertEqual(proc.returncode, 0, "keel %s: %s" % (" ".join(args), proc.stderr))
        return proc.stdout

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text if isinstance(text, str) else json.dumps(text))
        return path

    def test_register_enable_list_disable_delete(self):
        s = self.server
        agent = s.create_agent(name=unique_name("plugcli"), tools=["time.now"])
        self.write("manifest.json", MANIFEST)
        self.write("plugin.lua", SOURCE)
        self.write("config.json", {"tools": ["time.now"]})

        out = self.ok("plugins", "register", self.dir)
        self.assertIn("registered plugin no-time (lua, version 1.0.0): tool.before@v1", out)
        self.assertIn("keel plugins enable no-time", out)
        stored = s.ok("GET", "/v1/plugins/no-time", expect=200)
        self.assertEqual(stored["config"], {"tools": ["time.now"]}, "config.json was sent")
        self.assertEqual(stored["source"], SOURCE)
        # Again: a replacement.
        self.assertIn("replaced plugin no-time", self.ok("plugins", "register", self.dir))

        out = self.ok("plugins", "enable", "no-time", "--all")
        self.assertIn("enabled plugin no-time for all agents", out)
        self.assertEqual(s.ok("GET", "/v1/plugins/no-time", expect=200)["enabled_for"], ["*"])

        listed = self.ok("plugins", "list").splitlines()
        self.assertTrue(listed[0].startswith("ID"), listed)
        row = [ln for ln in listed if ln.startswith("no-time ")]
        self.assertEqual(len(row), 1, listed)
        self.assertIn("tool.before@v1", row[0])
        self.assertIn("all agents", row[0])
        raw = json.loads(self.ok("plugins", "list", "--json"))
        self.assertIn("no-time", [p["id"] for p in raw["items"]])

        shown = self.ok("plugins", "show", "no-time")
        self.assertIn("failure mode: fail", shown)
        self.assertIn("enabled for:  all agents", shown)
        self.assertIn('ctx.bus.on("tool.before@v1"', shown)

        # The plugin is in force: the call is vetoed.
        session = s.create_session(agent["id"])
        run = s.send(session["id"], "/call time.now {}")["run"]
        self.assertEqual(run["status"], "done", run)
        self.assertIn("vetoed: plugin no-time: time.now is not allowed here", run["output"])

        # Per agent, by name: enabled, then disabled again.
        out = self.ok("plugins", "enable", "no-time", "--agent", agent["name"])
        self.assertIn("enabled plugin no-time for agent %s (%s)" % (agent["name"], agent["id"]), out)
        self.ok("plugins", "disable", "no-time", "--agent", agent["id"])
        out = self.ok("plugins", "disable", "no-time", "--all")
        self.assertIn("disabled plugin no-time for all agents", out)
        self.assertIn("enabled for: no agent", out)
        self.assertEqual(s.ok("GET", "/v1/plugins/no-time", expect=200)["enabled_for"], [])
        run = s.send(session["id"], "/call time.now {}")["run"]
        self.assertNotIn("vetoed", run["output"], "disabled: the call goes through")

        # Disabling what is not enabled is the server's 404, reported.
        again = self.keel("plugins", "disable", "no-time", "--all")
        self.assertEqual(again.returncode, 1)
        self.assertIn("not_found", again.stderr)

        self.assertEqual(self.ok("plugins", "deliveries", "no-time").splitlines()[0].split()[0],
                         "ID")
        self.assertIn("deleted plugin no-time", self.ok("plugins", "delete", "no-time"))
        gone = self.keel("plugins", "show", "no-time")
        self.assertEqual(gone.returncode, 1)
        self.assertIn("plugin not found: no-time", gone.stderr)

    def test_enable_needs_agent_or_all(self):
        proc = self.keel("plugins", "enable", "x")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--agent AGENT or --all", proc.stderr)
        proc = self.keel("plugins", "enable", "x", "--all", "--agent", "a")
        self.assertEqual(proc.returncode, 2)

    def test_register_errors_name_the_file(self):
        missing = os.path.join(self.dir, "nope")
        proc = self.keel("plugins", "register", missing)
        self.assertEqual(proc.returncode, 2)
        self.assertIn(missing + " is not a directory", proc.stderr)

        proc = self.keel("plugins", "register", self.dir)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("cannot read " + os.path.join(self.dir, "manifest.json"), proc.stderr)

        manifest = self.write("manifest.json", '{"id": "broken",')
        proc = self.keel("plugins", "register", self.dir)
        self.assertEqual(proc.returncode, 2)
        self.assertIn(manifest + " is not valid JSON: parse error at line", proc.stderr)

        self.write("manifest.json", dict(MANIFEST, id="no-source"))
        proc = self.keel("plugins", "register", self.dir)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("cannot read " + os.path.join(self.dir, "plugin.lua"), proc.stderr)

        self.write("plugin.lua", SOURCE)
        config = self.write("other.json", "[1, 2]")
        proc = self.keel("plugins", "register", self.dir, "--config", config)
        self.assertEqual(proc.returncode, 2)
        self.assertIn(config + " must hold a JSON object", proc.stderr)

        # What the server refuses is reported with its code and message; nothing is stored.
        self.write("plugin.lua", 'ctx.bus.on("tool.after@v1", function() end)')
        proc = self.keel("plugins", "register", self.dir)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("invalid_argument", proc.stderr)
        self.assertIn("'tool.after@v1' is not among the manifest's events", proc.stderr)
        self.assertError(self.server.request("GET", "/v1/plugins/no-source"), 404, "not_found")


if __name__ == "__main__":
    unittest.main()

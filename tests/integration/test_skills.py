"""Skills end to end over HTTP: registration and its checks (front matter, paths, sizes, counts;
a refused skill writes nothing), replacement, listing, deletion and roles; assignment to agents;
the index in the system prompt, the skills.read tool (assigned skills only) and the copies in
the agent's workspace (written when changed, removed when unassigned); and `keel skills`.

Every test works in a tenant of its own. The local model's rule {"echo": "system"} answers with
the system prompt it was sent, so the test sees the index the prompt carries; a rule with a
`call` makes the run call skills.read, and its answer quotes the tool's result.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import keel_harness
from keel_harness import KeelServer, KeelTestCase, keel_bin, unique_name

WAIT = 20
BINARY = bytes([0, 1, 2, 255, 254])


def skill_md(name, description, body="Steps:\n1. Do it.\n"):
    return "---\nname: %s\ndescription: %s\n---\n%s" % (name, description, body)


def pdf_files(body="Steps:\n1. Fill the form.\n"):
    return {"SKILL.md": skill_md("pdf-forms", "Fill PDF forms. Use for any PDF form.", body),
            "scripts/fill.py": "print('filling')\n",
            "assets/logo.bin": {"base64": base64.b64encode(BINARY).decode()}}


class Tenant(keel_harness.Tenant):
    def register(self, files, expect=201):
        return self.ok("POST", "/v1/skills", {"files": files}, expect=expect)

    def assign(self, agent_id, name, expect=200):
        return self.ok("POST", "/v1/agents/%s/skills" % agent_id, {"name": name}, expect=expect)

    def turn(self, session_id, content):
        status, body, _ = self.server.post_message(session_id, content, wait=WAIT,
                                                   token=self.token, timeout=WAIT + 30)
        assert status in (200, 202), (status, body)
        run = body["run"]
        if run["status"] not in keel_harness.TERMINAL_RUN_STATES:
            run = self.server.wait_run(run["id"], timeout=WAIT, token=self.token)
        assert run["status"] == "done", run
        return run

    def events_of(self, type_):
        return [e for e in self.server.list_all("/v1/events", limit=500, token=self.token)
                if e["type"] == type_]


class SkillsApiTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        # Room for a skill near its 8 MiB limit in one request.
        cls.server = KeelServer(env={"KEEL_MAX_BODY_BYTES": str(16 << 20)})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.t = Tenant(self.server)

    def test_register_list_show_replace_and_delete(self):
        t = self.t
        created = t.register(pdf_files())
        self.assertEqual(created["name"], "pdf-forms")
        self.assertEqual(created["description"], "Fill PDF forms. Use for any PDF form.")
        self.assertRegex(created["hash"], r"^[0-9a-f]{64}$")
        self.assertEqual([f["path"] for f in created["manifest"]],
                         ["SKILL.md", "assets/logo.bin", "scripts/fill.py"])
        self.assertEqual(created["manifest"][1], {"path": "assets/logo.bin", "bytes": 5,
                                                  "binary": True})
        self.assertEqual(created["assigned_to"], [])
        self.assertNotIn("files", created)
        self.assertTime(created["created_at"])

        listed = t.ok("GET", "/v1/skills", expect=200)
        self.assertEqual([k["name"] for k in listed["items"]], ["pdf-forms"])
        self.assertNotIn("files", listed["items"][0])
        shown = t.ok("GET", "/v1/skills/pdf-forms", expect=200)
        self.assertEqual(shown["files"], pdf_files(), "what was registered comes back")

        # Registering the same name again replaces it: new content and hash, same creation time.
        replaced = t.register(pdf_files("Steps:\n1. Fill it better.\n"), expect=200)
        self.assertNotEqual(replaced["hash"], created["hash"])
        self.assertEqual(replaced["created_at"], created["created_at"])
        shown = t.ok("GET", "/v1/skills/pdf-forms", expect=200)
        self.assertIn("Fill it better", shown["files"]["SKILL.md"])
        registered = t.events_of("skill.registered@v1")
        self.assertEqual([e["payload"]["replaced"] for e in registered], [False, True])
        self.assertEqual(registered[1]["payload"]["hash"], replaced["hash"])
        self.assertEqual(registered[1]["payload"]["files"], 3)

        t.ok("DELETE", "/v1/skills/pdf-forms", expect=204)
        self.assertError(t.request("GET", "/v1/skills/pdf-forms"), 404, "not_found")
        self.assertError(t.request("DELETE", "/v1/skills/pdf-forms"), 404, "not_found")
        self.assertEqual(t.ok("GET", "/v1/skills", expect=200)["items"], [])
        self.assertEqual(len(t.events_of("skill.deleted@v1")), 1)

    def test_the_name_description_body_form_registers_the_same_skill(self):
        t = self.t
        # The form of the core contract: SKILL.md written from name, description and body.
        tricky = 'Fill "PDF" forms \\ name: evil. Use: always'
        created = t.ok("POST", "/v1/skills",
                       {"name": "pdf-forms", "description": tricky,
                        "body": "Steps:\n1. Fill the form.\n",
                        "files": {"scripts/fill.py": "print('filling')\n"}}, expect=201)
        self.assertEqual(created["name"], "pdf-forms")
        self.assertEqual(created["description"], tricky)
        self.assertEqual([f["path"] for f in created["manifest"]], ["SKILL.md", "scripts/fill.py"])
        shown = t.ok("GET", "/v1/skills/pdf-forms", expect=200)
        self.assertTrue(shown["files"]["SKILL.md"].endswith("---\nSteps:\n1. Fill the form.\n"))
        # A whole SKILL.md as the body, without name and description: as if it were in files.
        again = t.ok("POST", "/v1/skills",
                     {"body": skill_md("pdf-forms", "Plain.", "Steps.\n")}, expect=200)
        self.assertEqual(again["description"], "Plain.")
        # A description cannot smuggle front matter in, and SKILL.md is given once.
        for bad, said in (
                ({"name": "x", "description": "a\nname: evil", "body": ""}, "control"),
                ({"name": "x", "body": "b"}, "both are needed"),
                ({"name": "x", "description": "d"}, "go with 'body'"),
                ({"name": "Bad Name", "description": "d", "body": ""}, "a-z"),
                ({"body": 5}, "'body' must be a string"),
                ({"body": skill_md("y", "d", ""), "files": {"SKILL.md": "x"}}, "twice"),
                ({}, "is required")):
            with self.subTest(body=bad):
                err = self.assertError(t.request("POST", "/v1/skills", bad), 400,
                                       "invalid_argument", said)
                self.assertIn(said, err["message"])
        self.assertEqual([k["name"] for k in t.ok("GET", "/v1/skills")["items"]], ["pdf-forms"])

    def test_bad_skills_are_400_naming_the_problem_and_write_nothing(self):
        t = self.t
        md = skill_md("ok-name", "A description.")
        cases = [
            ({"files": {"SKILL.md": "# no front matter\n"}}, "no front matter"),
            ({"files": {"SKILL.md": "---\nname: x\ndescription: d\n"}}, "no closing"),
            ({"files": {"SKILL.md": "---\ndescription: d\n---\n"}}, "no 'name'"),
            ({"files": {"SKILL.md": "---\nname: x\n---\n"}}, "no 'description'"),
            ({"files": {"SKILL.md": skill_md("Bad Name", "d")}}, "a-z, 0-9"),
            ({"files": {"README.md": "hi"}}, "needs a file SKILL.md"),
            ({"files": {"SKILL.md": md, "../escape.txt": "x"}}, "contains '..'"),
            ({"files": {"SKILL.md": md, "/etc/passwd": "x"}}, "is absolute"),
            ({"files": {"SKILL.md": md, "a//b": "x"}}, "empty component"),
            ({"files": {"SKILL.md": md, "big.txt": "x" * ((1 << 20) + 1)}}, "larger than 1 MiB"),
            ({"files": dict({"SKILL.md": md},
                            **{"f%d" % i: "x" * (1 << 20) for i in range(8)})},
             "larger than 8 MiB"),
            ({"files": dict({"SKILL.md": md}, **{"f%d" % i: "x" for i in range(200)})},
             "at most 200 files"),
            ({"files": {"SKILL.md": md, "x.bin": {"base64": "not base64!"}}}, "base64"),
            ({"files": {"SKILL.md": md, "x": 7}}, "must be text"),
            ({"files": ["SKILL.md"]}, "'files' must be an object"),
            ({}, "'files' (or 'body') is required"),
            ({"files": {"SKILL.md": md}, "name": "x"}, "go with 'body'"),
            ({"files": {"SKILL.md": md}, "title": "x"}, "unknown field 'title'"),
        ]
        for body, says in cases:
            with self.subTest(says=says):
                err = self.assertError(t.request("POST", "/v1/skills", body), 400,
                                       "invalid_argument", says)
                self.assertIn(says, err["message"])
        self.assertEqual(t.ok("GET", "/v1/skills", expect=200)["items"], [])
        self.assertEqual(t.events_of("skill.registered@v1"), [])

    def test_roles_and_tenants(self):
        t = self.t
        t.register(pdf_files())
        user, _ = t.new_token("user")
        guest, _ = t.new_token("guest")
        self.assertError(t.request("POST", "/v1/skills", {"files": pdf_files()}, token=user),
                         403, "permission_denied")
        self.assertError(t.request("DELETE", "/v1/skills/pdf-forms", token=user), 403,
                         "permission_denied")
        self.assertEqual(len(t.ok("GET", "/v1/skills", token=user, expect=200)["items"]), 1)
        self.assertError(t.request("GET", "/v1/skills", token=guest), 403, "permission_denied")
        other = Tenant(self.server)
        self.assertError(other.request("GET", "/v1/skills/pdf-forms"), 404, "not_found")
        self.assertEqual(other.ok("GET", "/v1/skills", expect=200)["items"], [])

    def test_assignment(self):
        t = self.t
        t.register(pdf_files())
        t.register({"SKILL.md": skill_md("csv", "Read CSV files.")})
        agent = self.server.create_agent(token=t.token)
        listed = t.assign(agent["id"], "pdf-forms")
        self.assertEqual([k["name"] for k in listed["items"]], ["pdf-forms"])
        t.assign(agent["id"], "pdf-forms")  # again: no change
        t.assign(agent["id"], "csv")
        mine = t.ok("GET", "/v1/agents/%s/skills" % agent["id"], expect=200)
        self.assertEqual([k["name"] for k in mine["items"]], ["csv", "pdf-forms"])
        self.assertEqual(t.ok("GET", "/v1/skills/csv", expect=200)["assigned_to"], [agent["id"]])
        assigned = t.events_of("skill.assigned@v1")
        self.assertEqual(len(assigned), 3)
        self.assertEqual(assigned[0]["agent_id"], agent["id"])

        err = self.assertError(t.request("POST", "/v1/agents/%s/skills" % agent["id"],
                                         {"name": "nope"}), 400, "invalid_argument")
        self.assertIn("no skill named 'nope'", err["message"])
        self.assertError(t.request("POST", "/v1/agents/%s/skills" % keel_harness.unique_name("x"),
                                   {"name": "csv"}), 404, "not_found")
        self.assertError(t.request("POST", "/v1/agents/%s/skills" % agent["id"], {}), 400,
                         "invalid_argument")
        user, _ = t.new_token("user")
        self.assertError(t.request("POST", "/v1/agents/%s/skills" % agent["id"],
                                   {"name": "csv"}, token=user), 403, "permission_denied")

        t.ok("DELETE", "/v1/agents/%s/skills/csv" % agent["id"], expect=204)
        self.assertError(t.request("DELETE", "/v1/agents/%s/skills/csv" % agent["id"]), 404,
                         "not_found")
        self.assertEqual(len(t.events_of("skill.unassigned@v1")), 1)
        # A deleted skill is no longer assigned; nor are a deleted agent's skills.
        t.ok("DELETE", "/v1/skills/pdf-forms", expect=204)
        self.assertEqual(t.ok("GET", "/v1/agents/%s/skills" % agent["id"],
                              expect=200)["items"], [])
        t.assign(agent["id"], "csv")
        t.ok("DELETE", "/v1/agents/%s" % agent["id"], expect=204)
        self.assertEqual(t.ok("GET", "/v1/skills/csv", expect=200)["assigned_to"], [])


class SkillsRuntimeTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def workspace(self, agent_id, *parts):
        return os.path.join(self.server.home, "workspaces", agent_id, *parts)

    def read_call(self, name, file=None):
        args = {"name": name}
        if file:
            args["file"] = file
        return {"tool": "skills.read", "arguments": args}

    def test_index_skills_read_and_workspace_copies(self):
        t = Tenant(self.server)
        t.register(pdf_files())
        t.register({"SKILL.md": skill_md("csv", "Read CSV files.")})
        rules = [{"match": "^system", "echo": "system"},
                 {"match": "^read pdf$", "call": self.read_call("pdf-forms")},
                 {"match": "^read script", "call": self.read_call("pdf-forms", "scripts/fill.py")},
                 {"match": "^read logo", "call": self.read_call("pdf-forms", "assets/logo.bin")},
                 {"match": "^read missing", "call": self.read_call("pdf-forms", "nope.txt")},
                 {"match": "^read csv", "call": self.read_call("csv")}]
        agent = self.server.create_agent(instructions="Be brief.", tools=["skills.read"],
                                         config={"local_rules": rules}, token=t.token)
        session = self.server.create_session(agent["id"], token=t.token)
        sid = session["id"]

        # No skills: the system prompt is the instructions alone, and no skills/ directory.
        self.assertEqual(t.turn(sid, "system")["output"], "Be brief.")
        self.assertFalse(os.path.exists(self.workspace(agent["id"], "skills")))

        t.assign(agent["id"], "pdf-forms")
        system = t.turn(sid, "system")["output"]
        self.assertTrue(system.startswith("Be brief.\n\n"), system)
        self.assertIn("- pdf-forms: Fill PDF forms. Use for any PDF form.", system)
        self.assertIn("skills.read", system)
        self.assertNotIn("csv", system)
        # The copy in the workspace, binary file included.
        with open(self.workspace(agent["id"], "skills", "pdf-forms", "SKILL.md")) as f:
            self.assertEqual(f.read(), pdf_files()["SKILL.md"])
        with open(self.workspace(agent["id"], "skills", "pdf-forms", "scripts", "fill.py")) as f:
            self.assertEqual(f.read(), "print('filling')\n")
        with open(self.workspace(agent["id"], "skills", "pdf-forms", "assets", "logo.bin"),
                  "rb") as f:
            self.assertEqual(f.read(), BINARY)
        copy = os.stat(self.workspace(agent["id"], "skills", "pdf-forms"))

        # skills.read: SKILL.md and the list of the other files; one file; a binary one.
        out = t.turn(sid, "read pdf")["output"]
        self.assertTrue(out.startswith("The tool skills.read returned: "), out)
        result = json.loads(out[len("The tool skills.read returned: "):-1])
        self.assertEqual(result["content"], pdf_files()["SKILL.md"])
        self.assertEqual(result["files"], ["assets/logo.bin", "scripts/fill.py"])
        self.assertEqual(result["description"], "Fill PDF forms. Use for any PDF form.")
        out = t.turn(sid, "read script")["output"]
        self.assertIn('"content":"print(\'filling\')\\n"', out)
        out = t.turn(sid, "read logo")["output"]
        self.assertIn('"base64":"%s"' % base64.b64encode(BINARY).decode(), out)
        run = t.turn(sid, "read missing")
        self.assertIn("skill pdf-forms has no file 'nope.txt'", run["output"])
        # Only assigned skills can be read.
        run = t.turn(sid, "read csv")
        self.assertIn("no skill 'csv' is assigned to this agent", run["output"])
        steps = self.server.steps(run["id"], token=t.token)
        self.assertEqual([s["status"] for s in steps if s["kind"] == "tool"], ["failed"])

        # Unchanged skills are not copied again.
        again = os.stat(self.workspace(agent["id"], "skills", "pdf-forms"))
        self.assertEqual(again.st_ino, copy.st_ino)

        # A replaced skill is copied again; an unassigned one leaves the workspace.
        t.register(pdf_files("Steps:\n1. Version two.\n"), expect=200)
        t.assign(agent["id"], "csv")
        system = t.turn(sid, "system")["output"]
        self.assertIn("- csv: Read CSV files.\n- pdf-forms:", system)
        with open(self.workspace(agent["id"], "skills", "pdf-forms", "SKILL.md")) as f:
            self.assertIn("Version two", f.read())
        self.assertTrue(os.path.isfile(self.workspace(agent["id"], "skills", "csv", "SKILL.md")))
        t.ok("DELETE", "/v1/agents/%s/skills/pdf-forms" % agent["id"], expect=204)
        system = t.turn(sid, "system")["output"]
        self.assertNotIn("pdf-forms", system)
        self.assertEqual(sorted(os.listdir(self.workspace(agent["id"], "skills"))), ["csv"])
        run = t.turn(sid, "read pdf")
        self.assertIn("no skill 'pdf-forms' is assigned to this agent", run["output"])

    def test_an_agent_whose_tools_list_leaves_out_skills_read_cannot_call_it(self):
        t = Tenant(self.server)
        t.register(pdf_files())
        agent = self.server.create_agent(tools=["time.now"], token=t.token, config={
            "local_rules": [{"match": "^read", "call": self.read_call("pdf-forms")}]})
        t.assign(agent["id"], "pdf-forms")
        session = self.server.create_session(agent["id"], token=t.token)
        run = t.turn(session["id"], "read")
        steps = self.server.steps(run["id"], token=t.token)
        self.assertEqual([s["status"] for s in steps if s["kind"] == "tool"], ["denied"])


class SkillsCliTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="keel-skill-")
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

    def write(self, rel, data):
        path = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)

    def test_register_list_show_assign_unassign_remove(self):
        s = self.server
        name = unique_name("cli")
        self.write("SKILL.md", skill_md(name, "Does things from the CLI."))
        self.write("scripts/run.sh", "echo hi\n")
        self.write("data/blob.bin", BINARY)
        out = self.ok("skills", "register", self.dir)
        self.assertIn("registered skill %s (3 files" % name, out)
        stored = s.ok("GET", "/v1/skills/" + name, expect=200)
        self.assertEqual(stored["files"]["scripts/run.sh"], "echo hi\n")
        self.assertEqual(base64.b64decode(stored["files"]["data/blob.bin"]["base64"]), BINARY)
        self.assertIn("replaced skill %s" % name, self.ok("skills", "register", self.dir))

        listed = self.ok("skills", "list")
        self.assertIn(name, listed)
        self.assertIn("Does things from the CLI.", listed)
        shown = self.ok("skills", "show", name)
        self.assertIn("data/blob.bin (5 bytes, binary)", shown)
        self.assertIn("SKILL.md:\n---\nname: " + name, shown)
        self.assertEqual(json.loads(self.ok("--json", "skills", "show", name))["name"], name)

        agent = s.create_agent(name=unique_name("skillcli"))
        self.assertIn("assigned skill %s to agent %s" % (name, agent["name"]),
                      self.ok("skills", "assign", agent["name"], name))
        self.assertEqual(s.ok("GET", "/v1/skills/" + name, expect=200)["assigned_to"],
                         [agent["id"]])
        self.ok("skills", "unassign", agent["name"], name)
        self.assertEqual(s.ok("GET", "/v1/skills/" + name, expect=200)["assigned_to"], [])
        self.assertIn("deleted skill " + name, self.ok("skills", "rm", name))
        proc = self.keel("skills", "rm", name)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("not_found", proc.stderr)

    def test_refuses_links_and_reports_the_servers_reason(self):
        self.write("SKILL.md", skill_md("linked", "d"))
        os.symlink("/etc/hostname", os.path.join(self.dir, "host"))
        proc = self.keel("skills", "register", self.dir)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("host is a symbolic link", proc.stderr)
        os.unlink(os.path.join(self.dir, "host"))
        self.write("SKILL.md", "no front matter\n")
        proc = self.keel("skills", "register", self.dir)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("invalid_argument: SKILL.md has no front matter", proc.stderr)
        proc = self.keel("skills", "register", os.path.join(self.dir, "missing"))
        self.assertEqual(proc.returncode, 2)


if __name__ == "__main__":
    unittest.main()

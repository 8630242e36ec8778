"""The keel CLI as a newcomer meets it: a mistyped command names the nearest ones, `keel send`
names the run it started and continues a session without the agent, `keel chat` resumes a
session by its id alone (showing where it stands, with commands of its own), lists show the newest first and how to see more, and a server started on a port another one holds stops before it
writes anything."""

import os
import subprocess
import unittest

from keel_harness import KeelServer, KeelTestCase, keel_bin


class CliTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(args=["--demo"])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def keel(self, *args, stdin=""):
        env = dict(os.environ, KEEL_HOME=self.server.home, KEEL_URL="http://" + self.server.addr,
                   KEEL_TOKEN=self.server.token, NO_COLOR="1")
        return subprocess.run([keel_bin()] + list(args), input=stdin, capture_output=True,
                              text=True, env=env, timeout=60)

    def test_a_mistyped_command_names_the_nearest_ones(self):
        for args, path, word, near in ((["agent", "lst"], "keel agent", "lst", "'list'"),
                                       (["tenantz", "list"], "keel", "tenantz", "'tenants'"),
                                       (["--json", "runs", "shwo", "x"], "keel runs", "shwo",
                                        "'show'"),
                                       (["schedules"], "keel", "schedules", "'schedule'")):
            out = self.keel(*args)
            self.assertEqual(out.returncode, 2, out)
            self.assertIn("%s: unknown command '%s'; did you mean %s?" % (path, word, near),
                          out.stderr)
            self.assertIn("The commands of %s:" % path, out.stderr)
        out = self.keel("agent", "zzzzzzzz")
        self.assertEqual(out.returncode, 2, out)
        self.assertNotIn("did you mean", out.stderr)
        self.assertIn("The commands of keel agent: create update list show delete", out.stderr)
        # A command given right is not taken for a mistyped one.
        out = self.keel("agent", "list")
        self.assertEqual(out.returncode, 0, out)

    def test_send_names_its_run_and_continues_a_session_without_the_agent(self):
        out = self.keel("send", "demo", "hello cli")
        self.assertEqual(out.returncode, 0, out)
        self.assertEqual(out.stdout, 'You said: "hello cli"\n')
        run_line = [l for l in out.stderr.splitlines() if l.startswith("run ")]
        self.assertEqual(len(run_line), 1, out.stderr)
        run_id = run_line[0].split()[1]
        self.assertIn("keel runs show %s" % run_id, run_line[0])
        shown = self.keel("runs", "show", run_id)
        self.assertEqual(shown.returncode, 0, shown)
        session = self.server.get_run(run_id)["session_id"]
        again = self.keel("send", "--session", session, "and again")
        self.assertEqual(again.returncode, 0, again)
        self.assertEqual(again.stdout, 'You said: "and again"\n')
        self.assertEqual(self.server.get_run(again.stderr.split("run ")[1].split()[0])["session_id"],
                         session)
        for args in (["send", "no agent"], ["send"]):
            out = self.keel(*args)
            self.assertEqual(out.returncode, 2, out)
            self.assertIn("keel send --session ID TEXT", out.stderr)

    def test_chat_resumes_a_session_by_its_id(self):
        out = self.keel("send", "demo", "first")
        session = self.server.get_run(out.stderr.split("run ")[1].split()[0])["session_id"]
        chat = self.keel("chat", "--session", session, stdin="/help\n/session\nsecond\n/exit\n")
        self.assertEqual(chat.returncode, 0, chat)
        lines = chat.stdout.splitlines()
        # Resumed: the conversation so far first, then the chat's own commands, then the turn.
        self.assertEqual(lines[:2], ["you> first", 'You said: "first"'], chat.stdout)
        self.assertIn("/exit     end the chat (also /quit, or Ctrl-D)", lines)
        self.assertIn(session, lines)
        self.assertEqual(lines[-1], 'You said: "second"')
        contents = [m["content"] for m in
                    self.server.list_all("/v1/sessions/%s/messages" % session)]
        self.assertEqual(contents, ["first", 'You said: "first"', "second", 'You said: "second"'],
                         "a chat command went to the agent")
        out = self.keel("chat")
        self.assertEqual(out.returncode, 2, out)
        self.assertIn("keel chat --session ID", out.stderr)

    def test_lists_show_the_newest_first_and_say_how_to_see_more(self):
        agent = self.server.create_agent()
        session = self.server.create_session(agent["id"])
        runs = [self.server.send(session["id"], "turn %d" % i)["run"]["id"] for i in range(5)]
        sessions = [session["id"]] + [self.server.create_session(agent["id"])["id"]
                                      for _ in range(3)]
        # The API: ?order=desc, its cursor going on to older ones.
        page = self.server.ok("GET", "/v1/sessions/%s/runs?order=desc&limit=2" % session["id"])
        self.assertEqual([r["id"] for r in page["items"]], runs[::-1][:2])
        more = self.server.ok("GET", "/v1/sessions/%s/runs?order=desc&limit=2&cursor=%s" % (
            session["id"], page["next_cursor"]))
        self.assertEqual([r["id"] for r in more["items"]], runs[::-1][2:4])
        page = self.server.ok("GET", "/v1/agents/%s/sessions?order=desc&limit=3" % agent["id"])
        self.assertEqual([x["id"] for x in page["items"]], sessions[::-1][:3])
        asc = self.server.ok("GET", "/v1/agents/%s/sessions?limit=3" % agent["id"])
        self.assertEqual([x["id"] for x in asc["items"]], sessions[:3])  # the default stays
        st, body, _ = self.server.request("GET", "/v1/runs?order=newest")
        self.assertEqual(st, 400, body)
        # The CLI: newest first, a hint with the cursor, --cursor and --all.
        out = self.keel("runs", "list", "--session", session["id"], "--limit", "2")
        self.assertEqual(out.returncode, 0, out)
        self.assertEqual([l.split()[0] for l in out.stdout.splitlines()[1:]], runs[::-1][:2])
        self.assertIn("the newest 2 runs; more with keel runs list --session %s --cursor "
                      % session["id"], out.stderr)
        cursor = out.stderr.split("--cursor ")[1].split(",")[0]
        out = self.keel("runs", "list", "--session", session["id"], "--limit", "2",
                        "--cursor", cursor)
        self.assertEqual([l.split()[0] for l in out.stdout.splitlines()[1:]], runs[::-1][2:4])
        out = self.keel("sessions", "list", agent["name"], "--all")
        self.assertEqual([l.split()[0] for l in out.stdout.splitlines()[1:]], sessions[::-1])
        self.assertNotIn("--cursor", out.stderr)
        out = self.keel("sessions", "list", agent["name"], "--field", "items.0.id")
        self.assertEqual(out.stdout.strip(), sessions[-1])

    def test_runs_are_listed_by_agent_and_status(self):
        a = self.server.create_agent(tools=["notes.append"])
        b = self.server.create_agent()
        sa = self.server.create_session(a["id"])["id"]
        sb = self.server.create_session(b["id"])["id"]
        done_a = [self.server.send(sa, "a %d" % i)["run"]["id"] for i in range(3)]
        done_b = self.server.send(sb, "b")["run"]["id"]
        # The API: ?agent_id= and ?status=, alone and together, with a session or not.
        def ids(query):
            return [r["id"] for r in self.server.list_all("/v1/runs?" + query)]
        self.assertEqual(ids("agent_id=" + a["id"]), done_a)
        self.assertEqual(ids("agent_id=" + b["id"]), [done_b])
        self.assertEqual(ids("agent_id=%s&status=failed" % a["id"]), [])
        self.assertEqual(ids("agent_id=%s&status=done" % a["id"]), done_a)
        self.assertEqual(ids("agent_id=%s&session_id=%s" % (b["id"], sa)), [])
        self.assertEqual(ids("agent_id=01a00000-0000-7000-8000-000000000000"), [])
        page = self.server.ok("GET", "/v1/runs?agent_id=%s&order=desc&limit=2" % a["id"])
        self.assertEqual([r["id"] for r in page["items"]], done_a[::-1][:2])
        for bad in ("nope", "DONE", "done'--"):
            st, body, _ = self.server.request("GET", "/v1/runs?status=" + bad)
            self.assertEqual(st, 400, body)
        # The CLI: --agent by name, --status, and the hint repeats both.
        out = self.keel("runs", "list", "--agent", a["name"], "--status", "done", "--limit", "2")
        self.assertEqual(out.returncode, 0, out)
        self.assertEqual([l.split()[0] for l in out.stdout.splitlines()[1:]], done_a[::-1][:2])
        self.assertIn("keel runs list --agent %s --status done --cursor" % a["name"], out.stderr)
        out = self.keel("runs", "list", "--agent", "no-such-agent")
        self.assertNotEqual(out.returncode, 0, out)
        self.assertIn("no-such-agent", out.stderr)

    def test_agent_update_changes_only_what_it_is_given(self):
        agent = self.server.create_agent(instructions="before", tools=["time.now"],
                                         config={"busy": "queue"})
        out = self.keel("agent", "update", agent["name"], "--instructions", "after")
        self.assertEqual(out.returncode, 0, out)
        self.assertEqual(out.stdout, "updated agent %s (instructions)\n" % agent["name"])
        now = self.server.ok("GET", "/v1/agents/%s" % agent["id"])
        self.assertEqual((now["instructions"], now["tools"], now["config"]),
                         ("after", ["time.now"], {"busy": "queue"}))
        out = self.keel("agent", "update", agent["id"], "--no-tools", "--config", '{"busy":"reject"}')
        self.assertEqual(out.returncode, 0, out)
        now = self.server.ok("GET", "/v1/agents/%s" % agent["id"])
        self.assertEqual((now["tools"], now["config"]), ([], {"busy": "reject"}))
        for args in (["agent", "update", agent["name"]],
                     ["agent", "update", agent["name"], "--config", "[1]"],
                     ["agent", "update", agent["name"], "--no-tools", "--tool", "time.now"]):
            out = self.keel(*args)
            self.assertEqual(out.returncode, 2, (args, out))
        out = self.keel("agent", "update", "no-such-agent", "--name", "x")
        self.assertNotEqual(out.returncode, 0, out)
        self.assertIn("no agent named no-such-agent", out.stderr)

    def test_store_commands_take_a_tenants_name(self):
        name = "named-" + os.urandom(4).hex()
        tenant = self.server.ok("POST", "/v1/tenants", {"name": name}, expect=201)["tenant"]
        store = ["--home", self.server.home] + (
            ["--store", self.server.store_url] if self.server.store_url else [])
        by_name = os.path.join(self.server.home, "by-name.tar.zst")
        out = self.keel("export", *store, "--tenant", name, by_name)
        self.assertEqual(out.returncode, 0, out)
        self.assertTrue(os.path.getsize(by_name) > 0)
        out = self.keel("audit", "verify", *store, "--tenant", name, "--json")
        self.assertIn(tenant["id"], out.stdout + out.stderr)
        out = self.keel("export", *store, "--tenant", "no-such-tenant",
                        os.path.join(self.server.home, "none.tar.zst"))
        self.assertNotEqual(out.returncode, 0, out)
        self.assertIn("no tenant has the id or name 'no-such-tenant'", out.stderr)

    def test_a_second_server_on_a_taken_port_stops_before_it_writes_anything(self):
        home = os.path.join(self.server.home, "second")
        out = subprocess.run([keel_bin(), "serve", "--demo", "--home", home, "--listen",
                              self.server.addr], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(out.returncode, 0, out)
        self.assertIn("cannot listen on %s" % self.server.addr, out.stderr)
        self.assertIn("already running", out.stderr)
        self.assertNotIn("owner token", out.stdout + out.stderr)
        self.assertFalse(os.path.exists(home), "it created its home")


if __name__ == "__main__":
    unittest.main()

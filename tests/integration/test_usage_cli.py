"""`keel usage` and `keel budget`: the CLI against a real server whose price table makes each
local token cost one dollar. Usage is printed as a table (the same figures as GET /v1/usage, or
that JSON with --json), budgets are set, listed and removed (scope `tenant` or `agent:ID|NAME`),
and bad scopes, periods and limits say what is wrong."""

import json
import os
import subprocess
import tempfile
import unittest

from keel_harness import KeelServer, KeelTestCase, Tenant, keel_bin, unique_name

PRICED = '[prices.local]\ninput_per_mtok = 1000000\noutput_per_mtok = 1000000\n'


class UsageCliTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        fd, cls.config = tempfile.mkstemp(prefix="keel-usage-cli-", suffix=".toml")
        with os.fdopen(fd, "w") as f:
            f.write(PRICED)
        cls.server = KeelServer(env={"KEEL_CONFIG": cls.config})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        os.unlink(cls.config)

    def setUp(self):
        self.t = Tenant(self.server)  # a tenant of its own: its usage and budgets only

    def keel(self, *args, token=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update({"KEEL_URL": self.server.base_url, "KEEL_TOKEN": token or self.t.token})
        return subprocess.run([keel_bin(), *args], capture_output=True, text=True, env=env,
                              timeout=60, stdin=subprocess.DEVNULL)

    def ok(self, *args):
        proc = self.keel(*args)
        self.assertEqual(proc.returncode, 0, "keel %s: %s" % (" ".join(args), proc.stderr))
        return proc.stdout

    def fails(self, code, words, *args, token=None):
        proc = self.keel(*args, token=token)
        self.assertEqual(proc.returncode, code, (args, proc.stdout, proc.stderr))
        self.assertIn(words, proc.stderr, args)

    def turn(self, agent, content):
        s = self.server
        session = s.create_session(agent["id"], token=self.t.token)
        run = s.send(session["id"], content, wait=20, token=self.t.token)["run"]
        run = s.wait_run(run["id"], token=self.t.token)
        self.assertEqual(run["status"], "done", run)
        return run

    @staticmethod
    def rows(out):
        """The table's rows as lists of cells, by their first cell."""
        lines = [l.split() for l in out.splitlines() if l.strip()]
        return {cells[0]: cells for cells in lines}

    def test_usage_prints_the_tenants_and_each_agents_figures(self):
        s = self.server
        name = unique_name("usagecli")
        agent = s.create_agent(name=name, token=self.t.token)
        other = s.create_agent(name=unique_name("other"), token=self.t.token)
        a = self.turn(agent, "how much was that?")
        b = self.turn(other, "and that?")

        rows = self.rows(self.ok("usage"))
        self.assertEqual(rows["AGENT"][:4], ["AGENT", "NAME", "CALLS", "CACHED"])
        mine = rows[agent["id"]]
        u = a["usage"]
        self.assertEqual(mine[1:6], [name, "1", "0", str(u["input_tokens"]),
                                     str(u["output_tokens"])])
        self.assertAlmostEqual(float(mine[6]), u["cost_usd"])
        tenant = rows["tenant"]
        self.assertEqual(tenant[3], "2", tenant)  # after "(all agents)": 2 calls
        self.assertAlmostEqual(float(tenant[7]), u["cost_usd"] + b["usage"]["cost_usd"])

        # One agent by name, for the month: the same as the API's answer, with --json.
        api = self.t.ok("GET", "/v1/usage?period=month&agent_id=" + agent["id"])
        self.assertEqual(json.loads(self.ok("--json", "usage", "--agent", name, "--period",
                                            "month")), api)
        rows = self.rows(self.ok("usage", "--agent", name, "--period", "month"))
        self.assertIn(agent["id"], rows)
        self.assertNotIn(other["id"], rows)
        self.assertNotIn("tenant", rows, "one agent's usage has no tenant total")

        self.fails(2, "--period", "usage", "--period", "week")
        self.fails(1, "no agent named nobody", "usage", "--agent", "nobody")
        guest, _ = self.t.new_token("guest")
        self.fails(1, "permission_denied", "usage", token=guest)

    def test_usage_history_lists_every_period_for_plots(self):
        s = self.server
        agent = s.create_agent(name=unique_name("hist"), token=self.t.token)
        other = s.create_agent(name=unique_name("hist"), token=self.t.token)
        a = self.turn(agent, "one")
        b = self.turn(other, "two")
        c = self.turn(agent, "three")
        days = self.t.ok("GET", "/v1/usage/history?count=7")
        self.assertEqual(days["period"], "day")
        self.assertEqual(len(days["items"]), 7)
        starts = [i["period_start"] for i in days["items"]]
        self.assertEqual(starts, sorted(starts))
        for earlier in days["items"][:-1]:  # nothing was used before today in this tenant
            self.assertEqual(earlier["agents"], [])
            self.assertEqual(earlier["tenant"]["model_calls"], 0)
        today = days["items"][-1]
        self.assertEqual(today["tenant"], self.t.ok("GET", "/v1/usage")["tenant"])
        by_agent = {x["agent_id"]: x for x in today["agents"]}
        self.assertEqual(set(by_agent), {agent["id"], other["id"]})
        self.assertEqual(by_agent[agent["id"]]["model_calls"], 2)
        self.assertAlmostEqual(by_agent[agent["id"]]["cost_usd"],
                               a["usage"]["cost_usd"] + c["usage"]["cost_usd"])
        self.assertAlmostEqual(by_agent[other["id"]]["cost_usd"], b["usage"]["cost_usd"])
        one = self.t.ok("GET", "/v1/usage/history?count=2&agent_id=" + agent["id"])["items"][-1]
        self.assertEqual([x["agent_id"] for x in one["agents"]], [agent["id"]])
        self.assertEqual(one["agents"][0], by_agent[agent["id"]])
        self.assertEqual(one["tenant"], today["tenant"])
        st, _, _ = self.t.request("GET", "/v1/usage/history?agent_id=01a00000-0000-7000-8000-000000000000")
        self.assertEqual(st, 404)
        months = self.t.ok("GET", "/v1/usage/history?period=month")
        self.assertEqual(len(months["items"]), 12)
        self.assertEqual(months["items"][-1]["tenant"],
                         self.t.ok("GET", "/v1/usage?period=month")["tenant"])
        # Another tenant's history holds none of this tenant's usage.
        other_tenant = Tenant(s)
        for item in other_tenant.ok("GET", "/v1/usage/history?count=2")["items"]:
            self.assertEqual((item["agents"], item["tenant"]["model_calls"]), ([], 0))
        for bad in ("count=0", "count=367", "count=x", "period=week", "period=month&count=121",
                    "count=99999999999"):
            st, body, _ = self.t.request("GET", "/v1/usage/history?" + bad)
            self.assertEqual(st, 400, (bad, body))
        guest, _ = self.t.new_token("guest")
        st, _, _ = self.t.request("GET", "/v1/usage/history", token=guest)
        self.assertEqual(st, 403)

    def test_budgets_are_set_listed_and_removed(self):
        s = self.server
        name = unique_name("budgetcli")
        agent = s.create_agent(name=name, token=self.t.token)
        out = self.ok("budget", "set", "--scope", "tenant", "--period", "day", "--limit-usd", "5")
        self.assertIn("budget tenant per day: 5 USD; spent 0 USD since", out)
        out = self.ok("budget", "set", "--scope", "agent:" + name, "--period", "month",
                      "--limit-usd", "0.25")
        self.assertIn("budget agent:%s per month: 0.25 USD" % agent["id"], out)
        # Again: the limit is replaced.
        self.ok("budget", "set", "--scope", "agent:" + agent["id"], "--period", "month",
                "--limit-usd", "0.5")
        stored = {(b["scope"], b["period"]): b["limit_usd"]
                  for b in self.t.ok("GET", "/v1/budgets")["items"]}
        self.assertEqual(stored, {("tenant", "day"): 5, (agent["id"], "month"): 0.5})

        rows = self.rows(self.ok("budget", "list"))
        self.assertEqual(rows["tenant"][1:4], ["day", "5", "0"])
        self.assertEqual(rows["agent:" + agent["id"]][1:4], ["month", "0.5", "0"])
        listed = json.loads(self.ok("--json", "budget", "list"))
        self.assertEqual(len(listed["items"]), 2)

        # A budget stops the agent's runs (its first call would cost more than 0.5 USD).
        session = s.create_session(agent["id"], token=self.t.token)
        run = s.send(session["id"], "spend", wait=20, token=self.t.token)["run"]
        run = s.wait_run(run["id"], token=self.t.token)
        self.assertEqual(run["error"]["code"], "budget_exceeded", run)

        out = self.ok("budget", "rm", "--scope", "agent:" + name, "--period", "month")
        self.assertIn("deleted budget agent:%s per month" % agent["id"], out)
        self.ok("budget", "rm", "--scope", "tenant", "--period", "day")
        self.assertEqual(self.t.ok("GET", "/v1/budgets")["items"], [])
        self.fails(1, "not_found", "budget", "rm", "--scope", "tenant", "--period", "day")

    def test_bad_budget_commands_say_what_is_wrong(self):
        self.fails(2, "--scope takes tenant or agent:ID", "budget", "set", "--scope", "everyone",
                   "--period", "day", "--limit-usd", "1")
        self.fails(2, "--scope takes tenant or agent:ID", "budget", "rm", "--scope", "agent:",
                   "--period", "day")
        self.fails(1, "no agent named nobody", "budget", "set", "--scope", "agent:nobody",
                   "--period", "day", "--limit-usd", "1")
        self.fails(2, "--period", "budget", "set", "--scope", "tenant", "--period", "week",
                   "--limit-usd", "1")
        self.fails(2, "--limit-usd", "budget", "set", "--scope", "tenant", "--period", "day",
                   "--limit-usd", "-1")
        self.fails(2, "--limit-usd", "budget", "set", "--scope", "tenant", "--period", "day",
                   "--limit-usd", "lots")
        self.fails(2, "--limit-usd", "budget", "set", "--scope", "tenant", "--period", "day")
        # The server's own checks reach the user too (a limit above its maximum).
        self.fails(1, "limit_usd", "budget", "set", "--scope", "tenant", "--period", "day",
                   "--limit-usd", "1e12")
        # Only owners see and change budgets.
        user, _ = self.t.new_token("user")
        self.fails(1, "permission_denied", "budget", "list", token=user)
        self.fails(2, "A subcommand is required", "budget")


if __name__ == "__main__":
    unittest.main()

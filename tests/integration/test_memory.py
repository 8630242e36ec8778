"""Memory end to end over HTTP: an agent's memories written, searched (the query language, tag
filter, ranking), listed, read and deleted through the API; clear 400s for bad queries and bad
memories, with nothing written; guests may read but not write, through the API and through the
memory tools; the local model calling memory.upsert / memory.search / memory.delete; the plugin
event memory.upsert@v1 reaching a Lua listener and a webhook, from the API and from a tool; Lua
plugins reading their agent's memories (ctx.memory); the working memory in the model's prompt;
two agents' (and two tenants') memories kept apart; and `keel memory`.

Every test works in a tenant of its own (POST /v1/tenants).
"""

import hashlib
import hmac
import json
import os
import subprocess
import time
import unittest
import urllib.parse

from keel_harness import KeelServer, KeelTestCase, keel_bin
from test_plugins import KEK, LOOPBACK, Receiver, Tenant, call, lua_plugin, wait_for, webhook_plugin


class MemoryTenant(Tenant):
    def memories(self, agent_id):
        return "/v1/agents/%s/memories" % agent_id

    def add(self, agent_id, text, expect=201, token=None, **fields):
        body = dict(fields, text=text)
        return self.ok("POST", self.memories(agent_id), body, expect=expect, token=token)

    def search(self, agent_id, q, token=None, **params):
        query = urllib.parse.urlencode(dict(params, q=q))
        return self.ok("GET", self.memories(agent_id) + "?" + query, expect=200,
                       token=token)["items"]

    def search_ids(self, agent_id, q, **params):
        return [m["id"] for m in self.search(agent_id, q, **params)]

    def listed(self, agent_id, tag=None):
        path = self.memories(agent_id) + ("?tag=" + urllib.parse.quote(tag) if tag else "")
        return self.server.list_all(path, token=self.token)


class MemoryTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_SECRET_KEK": KEK, "KEEL_OUTBOUND_ALLOW": LOOPBACK})
        cls.receiver = Receiver()

    @classmethod
    def tearDownClass(cls):
        cls.receiver.stop()
        cls.server.stop()

    def tenant(self):
        return MemoryTenant(self.server)

    # ------------------------------------------------------------------ the API

    def test_add_search_list_show_delete(self):
        t = self.tenant()
        a = t.agent()
        first = t.add(a["id"], "The kafka broker kafka-1 runs on host alpha", tags=["ops", "infra"])
        self.assertEqual(first["agent_id"], a["id"])
        self.assertEqual(first["source"], "api")
        self.assertEqual(first["tags"], ["ops", "infra"])
        self.assertTime(first["created_at"])
        second = t.add(a["id"], "kafka kafka consumer lag alert", tags=["ops"], source="import")
        third = t.add(a["id"], "Lunch with Sam on Friday at the kafka cafe", id="lunch-1")
        self.assertEqual(third["id"], "lunch-1")

        hits = t.search(a["id"], "kafka")
        self.assertEqual([h["id"] for h in hits], [second["id"], first["id"], "lunch-1"])
        self.assertTrue(all(isinstance(h["score"], float) for h in hits))
        self.assertGreater(hits[0]["score"], hits[1]["score"])
        self.assertEqual(t.search_ids(a["id"], "kafka", limit=1), [second["id"]])
        # The query language: phrases, OR, exclusion, prefixes; case does not matter.
        self.assertEqual(t.search_ids(a["id"], '"consumer lag"'), [second["id"]])
        self.assertEqual(t.search_ids(a["id"], '"lag consumer"'), [])
        self.assertEqual(sorted(t.search_ids(a["id"], "alpha OR friday")),
                         sorted([first["id"], "lunch-1"]))
        self.assertEqual(t.search_ids(a["id"], "kafka -lunch -alert"), [first["id"]])
        self.assertEqual(t.search_ids(a["id"], "KAF* SAM"), ["lunch-1"])
        self.assertEqual(t.search_ids(a["id"], "kafka-1"), [first["id"]])
        # The tag filter, for a search and for the list.
        self.assertEqual(t.search_ids(a["id"], "kafka", tag="ops"), [second["id"], first["id"]])
        self.assertEqual(t.search_ids(a["id"], "kafka", tag="infra"), [first["id"]])
        self.assertEqual(t.search_ids(a["id"], "kafka", tag="nope"), [])
        self.assertEqual([m["id"] for m in t.listed(a["id"], tag="ops")],
                         [second["id"], first["id"]])

        # The list: newest first, paged.
        listed = t.listed(a["id"])
        self.assertEqual([m["id"] for m in listed], ["lunch-1", second["id"], first["id"]])
        page = t.ok("GET", t.memories(a["id"]) + "?limit=2", expect=200)
        self.assertEqual(len(page["items"]), 2)
        self.assertIsNotNone(page["next_cursor"])

        # Replacing by id keeps created_at, answers 200 and is found by its new words.
        time.sleep(0.01)
        replaced = t.add(a["id"], "Dinner with Sam on Saturday", id="lunch-1", expect=200)
        self.assertEqual(replaced["created_at"], third["created_at"])
        self.assertNotEqual(replaced["updated_at"], third["updated_at"])
        self.assertEqual(t.search_ids(a["id"], "lunch"), [])
        self.assertEqual(t.search_ids(a["id"], "dinner"), ["lunch-1"])
        shown = t.ok("GET", t.memories(a["id"]) + "/lunch-1", expect=200)
        self.assertEqual(shown["text"], "Dinner with Sam on Saturday")

        t.ok("DELETE", t.memories(a["id"]) + "/lunch-1", expect=204)
        self.assertError(t.request("GET", t.memories(a["id"]) + "/lunch-1"), 404, "not_found")
        self.assertError(t.request("DELETE", t.memories(a["id"]) + "/lunch-1"), 404, "not_found")
        self.assertEqual(t.search_ids(a["id"], "dinner"), [])

        # Each write is in the event log, scoped to the agent.
        upserted = t.events_of("memory.upserted@v1", agent_id=a["id"])
        self.assertEqual([e["payload"]["memory_id"] for e in upserted],
                         [first["id"], second["id"], "lunch-1", "lunch-1"])
        self.assertEqual([e["payload"]["replaced"] for e in upserted], [False, False, False, True])
        self.assertEqual(upserted[1]["payload"]["source"], "import")
        deleted = t.events_of("memory.deleted@v1", agent_id=a["id"])
        self.assertEqual([e["payload"] for e in deleted], [{"memory_id": "lunch-1"}])

    def test_bad_queries_and_bad_memories_are_400_and_write_nothing(self):
        t = self.tenant()
        a = t.agent()
        t.add(a["id"], "one memory")
        before = len(t.events())
        path = t.memories(a["id"])
        for q, message in [
                ('disk "full', "unbalanced quote: the '\"' at position 6 is not closed"),
                ("disk OR", "OR at position 6 has no term after it"),
                ("OR disk", "OR at position 1 has no term before it"),
                ("-disk", "the query has only excluded terms"),
                ("", "the query is empty"),
                ("x" * 600, "longer than 512 bytes")]:
            err = self.assertError(t.request("GET", path + "?q=" + urllib.parse.quote(q)), 400,
                                   "invalid_argument", q)
            self.assertIn(message, err["message"])
            # The check answers with the same message, as an answer rather than a failure.
            checked = t.ok("GET", "/v1/memory-query?q=" + urllib.parse.quote(q), expect=200)
            self.assertEqual((checked["valid"], checked["error"]), (False, err["message"]))
        for q in ("disk full", '"disk full" OR cpu -noise', "x" * 512):
            self.assertEqual(t.ok("GET", "/v1/memory-query?q=" + urllib.parse.quote(q)),
                             {"valid": True, "error": None})
        for params, message in [("q=x&limit=0", "limit must be between 1 and 100"),
                                ("q=x&limit=101", "limit must be between 1 and 100"),
                                ("q=x&limit=ten", "limit must be an integer"),
                                ("q=x&tag=" + "t" * 65, "a tag is 1 to 64 bytes")]:
            err = self.assertError(t.request("GET", path + "?" + params), 400, "invalid_argument")
            self.assertIn(message, err["message"])
        for body, message in [
                ({}, "text"),
                ({"text": "   "}, "text must not be only white space"),
                ({"text": "x" * 16385}, "text is longer than 16384 bytes"),
                ({"text": "x", "tags": "ops"}, "tags must be an array of strings"),
                ({"text": "x", "tags": ["ok", ""]}, "tags: a tag is 1 to 64 bytes"),
                ({"text": "x", "tags": ["t%d" % i for i in range(21)]}, "at most 20 tags"),
                ({"text": "x", "id": "has space"}, "id must be 1 to 128"),
                ({"text": "x", "source": "API"}, "source must be 1 to 32"),
                ({"text": "x", "agent_id": "other"}, "unknown field 'agent_id'")]:
            err = self.assertError(t.request("POST", path, body), 400, "invalid_argument",
                                   json.dumps(body)[:80])
            self.assertIn(message, err["message"])
        self.assertError(t.request("PUT", "/v1/agents/%s/working-memory" % a["id"],
                                   {"text": "w" * 16385}), 400, "invalid_argument")
        # Nothing was written: one memory, no new event.
        self.assertEqual(len(t.listed(a["id"])), 1)
        self.assertEqual(len(t.events()), before)
        # An unknown agent is 404, for reads and writes alike.
        missing = "/v1/agents/01a00000-0000-7000-8000-000000000000/memories"
        self.assertError(t.request("GET", missing + "?q=x"), 404, "not_found")
        self.assertError(t.request("POST", missing, {"text": "x"}), 404, "not_found")

    def test_guests_may_read_but_not_write(self):
        t = self.tenant()
        a = t.agent(tools=["memory.*"])
        t.add(a["id"], "the wifi password is in the blue binder", id="wifi")
        guest, _ = t.new_token("guest")
        path = t.memories(a["id"])
        self.assertEqual([m["id"] for m in t.search(a["id"], "wifi", token=guest)], ["wifi"])
        self.assertEqual(t.ok("GET", path + "/wifi", expect=200, token=guest)["id"], "wifi")
        self.assertError(t.request("POST", path, {"text": "x"}, token=guest), 403,
                         "permission_denied")
        self.assertError(t.request("DELETE", path + "/wifi", token=guest), 403,
                         "permission_denied")
        self.assertError(t.request("DELETE", "/v1/memories/wifi", token=guest), 403,
                         "permission_denied")
        self.assertEqual(t.ok("GET", "/v1/memories/wifi", expect=200, token=guest)["id"], "wifi")
        self.assertError(t.request("PUT", "/v1/agents/%s/working-memory" % a["id"],
                                   {"text": "x"}, token=guest), 403, "permission_denied")
        # A user may write.
        user, _ = t.new_token("user")
        t.ok("POST", path, {"text": "a user's note"}, expect=201, token=user)

        # Through the tools: a run a guest started (in a session it opened) may search, but not
        # write or delete.
        s = self.server.create_session(a["id"], token=guest)
        search = call("memory.search", {"query": "wifi"})
        status, body, _ = self.server.post_message(s["id"], search, wait=20, token=guest)
        self.assertIn(status, (200, 202), body)
        run = self.server.wait_run(body["run"]["id"], token=t.token)
        self.assertEqual(run["status"], "done", run)
        self.assertIn("blue binder", run["output"])
        for tool, args in [("memory.upsert", {"text": "guest was here"}),
                           ("memory.delete", {"id": "wifi"})]:
            status, body, _ = self.server.post_message(s["id"], call(tool, args), wait=20,
                                                       token=guest)
            run = self.server.wait_run(body["run"]["id"], token=t.token)
            steps = t.tool_steps(run["id"])
            self.assertEqual(steps[0]["status"], "denied", steps)
            self.assertIn("guests may only use read tools; %s needs write" % tool,
                          steps[0]["output"]["error"])
        self.assertEqual(sorted(m["text"] for m in t.listed(a["id"])),
                         ["a user's note", "the wifi password is in the blue binder"])

    def test_two_agents_and_two_tenants_are_kept_apart(self):
        t, other = self.tenant(), self.tenant()
        a, b = t.agent(), t.agent()
        foreign = other.agent()
        t.add(a["id"], "alpha secret plan", id="plan")
        # Ids are unique in a tenant: another agent cannot take (or overwrite) this one.
        taken = t.request("POST", t.memories(b["id"]), {"text": "beta overwrites", "id": "plan"})
        err = self.assertError(taken, 409, "conflict")
        self.assertEqual(err["message"], "memory plan belongs to another agent")
        t.add(b["id"], "beta secret plan", id="plan-b")
        other.add(foreign["id"], "gamma secret plan", id="plan")  # another tenant may
        self.assertEqual([m["text"] for m in t.search(a["id"], "secret plan")],
                         ["alpha secret plan"])
        self.assertEqual([m["text"] for m in t.search(b["id"], "secret plan")],
                         ["beta secret plan"])
        self.assertEqual(t.ok("GET", t.memories(a["id"]) + "/plan", expect=200)["text"],
                         "alpha secret plan")
        # Under the wrong agent it is not found; by id alone it is, with its agent.
        self.assertError(t.request("GET", t.memories(b["id"]) + "/plan"), 404, "not_found")
        self.assertError(t.request("DELETE", t.memories(b["id"]) + "/plan"), 404, "not_found")
        by_id = t.ok("GET", "/v1/memories/plan", expect=200)
        self.assertEqual((by_id["agent_id"], by_id["text"]), (a["id"], "alpha secret plan"))
        self.assertEqual(other.ok("GET", "/v1/memories/plan", expect=200)["text"],
                         "gamma secret plan")
        t.ok("DELETE", "/v1/memories/plan", expect=204)
        self.assertError(t.request("GET", "/v1/memories/plan"), 404, "not_found")
        self.assertError(t.request("DELETE", "/v1/memories/plan"), 404, "not_found")
        self.assertEqual(t.search_ids(b["id"], "plan"), ["plan-b"])
        self.assertEqual(t.search_ids(a["id"], "plan"), [])
        # Another tenant's agent does not exist for this tenant.
        self.assertError(t.request("GET", t.memories(foreign["id"]) + "?q=plan"), 404, "not_found")
        self.assertError(t.request("GET", t.memories(foreign["id"]) + "/plan"), 404, "not_found")
        self.assertError(t.request("POST", t.memories(foreign["id"]), {"text": "x"}), 404,
                         "not_found")
        self.assertEqual(other.search_ids(foreign["id"], "plan"), ["plan"])

    # ------------------------------------------------------------------ the tools

    def test_the_local_model_writes_searches_and_deletes_with_the_tools(self):
        t = self.tenant()
        rules = [
            {"match": "^remember", "call": {"tool": "memory.upsert", "arguments": {
                "text": "The user drinks green tea without sugar", "tags": ["prefs"]}}},
            {"match": "^what do I drink", "call": {"tool": "memory.search", "arguments": {
                "query": "tea -coffee", "tag": "prefs"}}},
            {"match": "^bad search", "call": {"tool": "memory.search", "arguments": {
                "query": "tea OR"}}},
        ]
        a = t.agent(tools=["memory.*"], config={"local_rules": rules})
        s = t.session(a["id"])
        run = t.turn(s["id"], "remember that I like tea")
        self.assertEqual(run["status"], "done", run)
        memories = t.listed(a["id"])
        self.assertEqual(len(memories), 1)
        m = memories[0]
        self.assertEqual((m["text"], m["tags"], m["source"]),
                         ("The user drinks green tea without sugar", ["prefs"], "tool"))
        self.assertIn(m["id"], run["output"])
        written = t.tool_steps(run["id"])[0]["output"]  # the memory without the text it sent
        self.assertEqual((written["id"], written["replaced"], written["source"]),
                         (m["id"], False, "tool"))
        self.assertNotIn("text", written)
        upserted = t.events_of("memory.upserted@v1", agent_id=a["id"])
        self.assertEqual(len(upserted), 1)
        self.assertEqual(upserted[0]["run_id"], run["id"])
        self.assertEqual(upserted[0]["session_id"], s["id"])

        run = t.turn(s["id"], "what do I drink?")
        self.assertEqual(run["status"], "done", run)
        step = t.tool_steps(run["id"])[0]
        self.assertEqual(step["status"], "succeeded")
        self.assertEqual([r["id"] for r in step["output"]["results"]], [m["id"]])

        # A bad query: the tool fails with the parser's message, the run goes on.
        run = t.turn(s["id"], "bad search")
        self.assertEqual(run["status"], "done", run)
        step = t.tool_steps(run["id"])[0]
        self.assertEqual(step["status"], "failed")
        self.assertEqual(step["output"]["error"], "OR at position 5 has no term after it")

        # /call works as well; deleting twice is no error the second time.
        for deleted in (True, False):
            run = t.turn(s["id"], call("memory.delete", {"id": m["id"]}))
            step = t.tool_steps(run["id"])[0]
            self.assertEqual(step["status"], "succeeded", step)
            self.assertEqual(step["output"], {"id": m["id"], "deleted": deleted})
        self.assertEqual(t.listed(a["id"]), [])
        # An agent whose tools list lacks them cannot call them.
        plain = t.agent(tools=["time.now"])
        run = t.turn(t.session(plain["id"])["id"], call("memory.search", {"query": "tea"}))
        self.assertEqual(t.tool_steps(run["id"])[0]["status"], "denied")

    # ------------------------------------------------------------------ plugins

    def test_memory_upsert_reaches_a_lua_listener_and_a_webhook(self):
        t = self.tenant()
        t.set_secret("hook-key", "s3cret")
        a = t.agent(tools=["memory.*", "plugin__*"])
        # The listener keeps what it heard; its tool tells.
        t.register(lua_plugin("heard", ["memory.upsert@v1"], """
local heard = {}
ctx.bus.on("memory.upsert@v1", function(e)
  heard[#heard + 1] = {id = e.memory_id, text = e.text, source = e.source,
                       replaced = e.replaced, run = e.run_id or "none"}
end)
ctx.tools.add{name = "heard", handler = function() return {heard = heard} end}
"""))
        t.enable("heard", a["id"])
        t.register(webhook_plugin("hook", self.receiver.url("/memory-" + t.id),
                                  ["memory.upsert@v1"], "hook-key"))
        t.enable("hook", a["id"])
        s = t.session(a["id"])
        t.turn(s["id"], "hello")  # builds the agent's plugins on this node

        t.add(a["id"], "written through the API", id="m-api")
        tool_run = t.turn(s["id"], call("memory.upsert", {"text": "written by a tool"}))
        by_tool = t.tool_steps(tool_run["id"])[0]["output"]
        again = t.add(a["id"], "written again", id="m-api", expect=200)
        self.assertEqual(again["id"], "m-api")

        run = t.turn(s["id"], call("plugin__heard__heard"))
        heard = t.tool_steps(run["id"])[0]["output"]["heard"]
        self.assertEqual(heard, [
            {"id": "m-api", "text": "written through the API", "source": "api",
             "replaced": False, "run": "none"},
            {"id": by_tool["id"], "text": "written by a tool", "source": "tool",
             "replaced": False, "run": tool_run["id"]},
            {"id": "m-api", "text": "written again", "source": "api", "replaced": True,
             "run": "none"}])

        path = "/memory-" + t.id
        got = wait_for(lambda: len(self.receiver.distinct(path)) >= 3
                       and self.receiver.distinct(path), 15, what="3 webhook deliveries")
        for r in got:
            ts = r["headers"]["keel-timestamp"].encode()
            mac = hmac.new(b"s3cret", ts + b"." + r["body"], hashlib.sha256).hexdigest()
            self.assertEqual(r["headers"]["keel-signature"], "v1=" + mac)
        bodies = sorted((json.loads(r["body"]) for r in got), key=lambda b: b["created_at"])
        self.assertEqual([b["event"] for b in bodies], ["memory.upsert@v1"] * 3)
        payloads = [b["payload"] for b in bodies]
        self.assertEqual(sorted(p["memory_id"] for p in payloads),
                         sorted(["m-api", by_tool["id"], "m-api"]))
        tool_payload = [p for p in payloads if p["memory_id"] == by_tool["id"]][0]
        self.assertEqual(tool_payload["source"], "tool")
        self.assertEqual(tool_payload["session_id"], s["id"])
        self.assertEqual(tool_payload["agent_id"], a["id"])
        api_payload = [p for p in payloads if p["memory_id"] == "m-api" and not p["replaced"]][0]
        self.assertIsNone(api_payload["session_id"])
        self.assertEqual(api_payload["text"], "written through the API")

    def test_lua_plugins_read_their_agents_memories(self):
        t = self.tenant()
        a, b = t.agent(tools=["plugin__*"]), t.agent(tools=["plugin__*"])
        t.add(a["id"], "the launch code is 1234", id="code", tags=["secret"])
        t.add(b["id"], "b's launch code is 9999", id="code-b")
        t.register(lua_plugin("recall", ["tool.after@v1"], """
ctx.tools.add{name = "recall", schema = {type = "object"}, handler = function(args)
  local ok, hits = pcall(ctx.memory.search, args.q, {limit = 3, tag = args.tag})
  if not ok then return {error = hits} end
  local texts = {}
  for _, m in ipairs(hits) do texts[#texts + 1] = m.text end
  local one = ctx.memory.get(args.id or "code")
  return {texts = texts, one = one and one.text or "none"}
end}
"""))
        t.enable("recall", "*")
        for agent, mine, own_id in ((a, "the launch code is 1234", "code"),
                                    (b, "b's launch code is 9999", "code-b")):
            s = t.session(agent["id"])
            args = {"q": "launch code", "id": own_id}
            run = t.turn(s["id"], call("plugin__recall__recall", args))
            out = t.tool_steps(run["id"])[0]["output"]
            self.assertEqual(out, {"texts": [mine], "one": mine})
        # b's copy of the plugin asking for a's memory by its id: not there.
        run = t.turn(t.session(b["id"])["id"],
                     call("plugin__recall__recall", {"q": "x", "id": "code"}))
        # (An empty Lua table reads as an object: PLUGINS.md, section 6.)
        self.assertEqual(t.tool_steps(run["id"])[0]["output"], {"texts": {}, "one": "none"})
        s = t.session(a["id"])
        run = t.turn(s["id"], call("plugin__recall__recall", {"q": "launch", "tag": "secret",
                                                              "id": "nope"}))
        self.assertEqual(t.tool_steps(run["id"])[0]["output"],
                         {"texts": ["the launch code is 1234"], "one": "none"})
        run = t.turn(s["id"], call("plugin__recall__recall", {"q": "launch OR"}))
        self.assertIn("OR at position 8 has no term after it",
                      t.tool_steps(run["id"])[0]["output"]["error"])

    def test_the_working_memory_is_in_the_prompt(self):
        t = self.tenant()
        a = t.agent()
        t.register({"manifest": {"id": "audit", "name": "Audit", "version": "1", "kind": "builtin",
                                 "builtin": "audit-log", "events": ["model.before@v1"]}})
        t.enable("audit", a["id"])
        wm = "/v1/agents/%s/working-memory" % a["id"]
        empty = t.ok("GET", wm, expect=200)
        self.assertEqual(empty, {"agent_id": a["id"], "text": "", "updated_at": None})
        s = t.session(a["id"])
        t.turn(s["id"], "first")
        put = t.ok("PUT", wm, {"text": "Project: Apollo.\nDeadline: Friday."}, expect=200)
        self.assertEqual(put["text"], "Project: Apollo.\nDeadline: Friday.")
        self.assertTime(put["updated_at"])
        self.assertEqual(t.ok("GET", wm, expect=200)["text"], put["text"])
        t.turn(s["id"], "second")
        t.ok("PUT", wm, {"text": ""}, expect=200)
        t.turn(s["id"], "third")

        path = os.path.join(self.server.home, "audit", t.id, a["id"] + ".jsonl")
        with open(path) as f:
            lines = [json.loads(x) for x in f.read().splitlines()]
        self.assertEqual(len(lines), 3)
        systems = [[m["content"] for m in line["payload"]["messages"] if m["role"] == "system"]
                   for line in lines]
        self.assertEqual(systems[0], ["You are a test agent."])
        self.assertEqual(systems[1], ["You are a test agent.",
                                      "Working memory (your notes, kept between conversations):"
                                      "\nProject: Apollo.\nDeadline: Friday."])
        self.assertEqual(systems[2], ["You are a test agent."])
        updates = t.events_of("working_memory.updated@v1", agent_id=a["id"])
        self.assertEqual([e["payload"]["bytes"] for e in updates], [34, 0])

    # ------------------------------------------------------------------ the CLI

    def keel(self, t, *args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update({"KEEL_URL": self.server.base_url, "KEEL_TOKEN": t.token})
        return subprocess.run([keel_bin(), *args], capture_output=True, text=True, env=env,
                              timeout=60, stdin=subprocess.DEVNULL)

    def test_the_cli(self):
        t = self.tenant()
        name = "cli-" + t.id[-8:]
        a = self.server.create_agent(name=name, token=t.token)
        out = self.keel(t, "memory", "add", name, "The staging database is pg-2",
                        "--tag", "ops", "--tag", "db", "--source", "cli")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"^added memory \S+\n$")
        mid = out.stdout.split()[-1]
        out = self.keel(t, "memory", "add", a["id"], "Backups run at 02:00")
        self.assertEqual(out.returncode, 0, out.stderr)

        out = self.keel(t, "memory", "search", name, "staging database", "--tag", "ops")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(mid, out.stdout)
        self.assertIn("ops,db", out.stdout)
        self.assertIn("The staging database is pg-2", out.stdout)
        out = self.keel(t, "--json", "memory", "search", name, "backups", "--limit", "5")
        self.assertEqual([m["text"] for m in json.loads(out.stdout)["items"]],
                         ["Backups run at 02:00"])
        out = self.keel(t, "memory", "search", name, "nothing here")
        self.assertEqual((out.returncode, out.stdout), (0, "no memory matches\n"))

        out = self.keel(t, "memory", "search", name, '"unbalanced')
        self.assertEqual(out.returncode, 1)
        self.assertIn("invalid_argument: unbalanced quote", out.stderr)

        out = self.keel(t, "memory", "list", name)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertTrue(lines[0].startswith("ID"), lines)
        self.assertIn("Backups run at 02:00", lines[1])
        self.assertIn("cli", lines[2])

        out = self.keel(t, "memory", "rm", name, mid)
        self.assertEqual((out.returncode, out.stdout), (0, "deleted memory %s\n" % mid))
        out = self.keel(t, "memory", "rm", name, mid)
        self.assertEqual(out.returncode, 1)
        self.assertIn("not_found", out.stderr)
        self.assertEqual([m["text"] for m in t.listed(a["id"])], ["Backups run at 02:00"])


if __name__ == "__main__":
    unittest.main()

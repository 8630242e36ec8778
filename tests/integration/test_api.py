"""The core v1 API over HTTP: agents, sessions, messages, the local model, runs and steps,
pagination, the event log, health, metrics and the OpenAPI document."""

import json
import os
import re
import unittest

from keel_harness import (EVENT_TYPE, KeelServer, KeelTestCase, Tenant, parse_time,
                          unique_name)

AGENT_FIELDS = {"id", "name", "model", "instructions", "tools", "config", "status", "created_at",
                "updated_at"}
SESSION_FIELDS = {"id", "agent_id", "status", "title", "created_at", "updated_at"}
MESSAGE_FIELDS = {"id", "session_id", "role", "content", "run_id", "created_at"}
RUN_FIELDS = {"id", "session_id", "agent_id", "status", "attempt", "output", "error", "usage",
              "created_at", "started_at", "finished_at"}
EVENT_FIELDS = {"position", "id", "type", "origin", "origin_seq", "agent_id", "session_id",
                "run_id", "payload", "occurred_at"}


def tool_steps(steps):
    return [s for s in steps if s["kind"] == "tool"]


def model_steps(steps):
    return [s for s in steps if s["kind"] == "model"]


class ApiTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def new_session(self, **agent_kw):
        agent = self.server.create_agent(**agent_kw)
        session = self.server.create_session(agent["id"])
        return agent, session

    # ------------------------------------------------------------------ agents

    def test_agent_crud(self):
        s = self.server
        name = unique_name("crud")
        body = {"name": name, "model": "local", "instructions": "Be brief.",
                "tools": ["time.now"], "config": {"busy": "queue", "x": 1}}
        st, agent, _ = s.request("POST", "/v1/agents", body)
        self.assertEqual(st, 201, agent)
        self.assertTrue(AGENT_FIELDS <= set(agent), "agent fields missing: %s"
                        % (AGENT_FIELDS - set(agent)))
        self.assertIsInstance(agent["id"], str)
        self.assertEqual(agent["name"], name)
        self.assertEqual(agent["model"], "local")
        self.assertEqual(agent["instructions"], "Be brief.")
        self.assertEqual(agent["tools"], ["time.now"])
        self.assertEqual(agent["config"].get("x"), 1)
        self.assertEqual(agent["config"].get("busy"), "queue")
        self.assertIsInstance(agent["status"], str)
        self.assertTime(agent["created_at"], "agent.created_at")
        self.assertTime(agent["updated_at"], "agent.updated_at")

        # GET returns the same agent
        got = s.ok("GET", "/v1/agents/%s" % agent["id"], expect=200)
        for k in ("id", "name", "model", "instructions", "tools", "config", "created_at"):
            self.assertEqual(got[k], agent[k], "GET agent field %s" % k)

        # listed
        ids = [a["id"] for a in s.list_all("/v1/agents")]
        self.assertIn(agent["id"], ids)

        # duplicate name: 409 conflict
        self.assertError(s.request("POST", "/v1/agents", body), 409, "conflict", "duplicate name")

        # PATCH is partial
        st, patched, _ = s.request("PATCH", "/v1/agents/%s" % agent["id"],
                                   {"instructions": "Be verbose."})
        self.assertEqual(st, 200, patched)
        self.assertEqual(patched["instructions"], "Be verbose.")
        self.assertEqual(patched["name"], name)
        self.assertEqual(patched["model"], "local")
        self.assertEqual(patched["tools"], ["time.now"])
        self.assertEqual(patched["config"].get("x"), 1)
        self.assertGreaterEqual(parse_time(patched["updated_at"]), parse_time(agent["updated_at"]))
        got = s.ok("GET", "/v1/agents/%s" % agent["id"], expect=200)
        self.assertEqual(got["instructions"], "Be verbose.")
        self.assertEqual(got["tools"], ["time.now"])

        # DELETE, then 404
        st, _, _ = s.request("DELETE", "/v1/agents/%s" % agent["id"])
        self.assertIn(st, (200, 204))
        self.assertError(s.request("GET", "/v1/agents/%s" % agent["id"]), 404, "not_found",
                         "GET deleted agent")
        ids = [a["id"] for a in s.list_all("/v1/agents")]
        self.assertNotIn(agent["id"], ids, "a deleted agent is still listed")

    def test_an_agents_tools_with_their_schemas(self):
        s = self.server
        agent = s.create_agent(tools=["time.now", "notes.append", "files.*", "introspection.*"])
        items = s.ok("GET", "/v1/agents/%s/tools" % agent["id"])["items"]
        by_name = {t["name"]: t for t in items}
        self.assertEqual(sorted(by_name), ["files.list", "files.read", "files.write",
                                           "notes.append", "time.now"])
        notes = by_name["notes.append"]
        self.assertEqual(notes["parameters"]["type"], "object")
        self.assertIn("line", notes["parameters"]["properties"])
        self.assertEqual(notes["rights"], ["write"])
        self.assertEqual(notes["effect_class"], "once")
        self.assertTrue(notes["description"])
        bare = s.create_agent(tools=[])
        self.assertEqual(s.ok("GET", "/v1/agents/%s/tools" % bare["id"])["items"], [])
        guest = s.ok("POST", "/v1/tokens", {"name": unique_name("g"), "role": "guest"})["token"]
        self.assertError(s.request("GET", "/v1/agents/%s/tools" % agent["id"], token=guest),
                         403, "permission_denied")
        self.assertError(s.request("GET", "/v1/agents/nope/tools"), 404, "not_found")

    def test_agent_event_emitted(self):
        s = self.server
        before = s.all_events()
        after = before[-1]["position"] if before else 0
        agent = s.create_agent()
        events = s.all_events(after=after)
        types = [(e["type"], e["agent_id"]) for e in events]
        self.assertIn(("agent.created@v1", agent["id"]), types)

    # ------------------------------------------------------------------ sessions and messages

    def test_sessions(self):
        s = self.server
        agent = s.create_agent()
        st, sess, _ = s.request("POST", "/v1/agents/%s/sessions" % agent["id"], {"title": "hello"})
        self.assertEqual(st, 201, sess)
        self.assertTrue(SESSION_FIELDS <= set(sess), "session fields missing: %s"
                        % (SESSION_FIELDS - set(sess)))
        self.assertEqual(sess["agent_id"], agent["id"])
        self.assertEqual(sess["title"], "hello")
        self.assertEqual(sess["status"], "idle")
        self.assertTime(sess["created_at"])
        self.assertTime(sess["updated_at"])
        got = s.ok("GET", "/v1/sessions/%s" % sess["id"], expect=200)
        self.assertEqual(got["id"], sess["id"])
        self.assertEqual(got["title"], "hello")
        sess2 = s.create_session(agent["id"], title="second")
        listed = s.list_all("/v1/agents/%s/sessions" % agent["id"])
        self.assertEqual(sorted(x["id"] for x in listed), sorted([sess["id"], sess2["id"]]))
        # a session.created@v1 event names the session
        evs = [e for e in s.all_events() if e["session_id"] == sess["id"]]
        self.assertIn("session.created@v1", [e["type"] for e in evs])

    def test_message_async_then_done(self):
        s = self.server
        _, sess = self.new_session()
        st, body, _ = s.post_message(sess["id"], "hello there")
        self.assertEqual(st, 202, body)
        self.assertEqual(set(body), {"message", "run"}, body)
        msg, run = body["message"], body["run"]
        self.assertTrue(MESSAGE_FIELDS <= set(msg), "message fields missing: %s"
                        % (MESSAGE_FIELDS - set(msg)))
        self.assertEqual(msg["role"], "user")
        self.assertEqual(msg["content"], "hello there")
        self.assertEqual(msg["session_id"], sess["id"])
        self.assertEqual(msg["run_id"], run["id"])
        self.assertTrue(RUN_FIELDS <= set(run), "run fields missing: %s" % (RUN_FIELDS - set(run)))
        self.assertEqual(run["session_id"], sess["id"])
        self.assertIn(run["status"], ("queued", "running", "done"))
        run = s.wait_run(run["id"])
        self.assertEqual(run["status"], "done", run)
        self.assertIn("hello there", run["output"])

    def test_message_wait(self):
        s = self.server
        agent, sess = self.new_session()
        st, body, _ = s.post_message(sess["id"], "how are you", wait=5)
        self.assertEqual(st, 200, body)
        run = body["run"]
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["agent_id"], agent["id"])
        self.assertIsNone(run["error"])
        self.assertIsInstance(run["attempt"], int)
        self.assertGreaterEqual(run["attempt"], 1)
        self.assertIn("input_tokens", run["usage"])
        self.assertIn("output_tokens", run["usage"])
        self.assertGreater(run["usage"]["output_tokens"], 0)
        self.assertTime(run["created_at"])
        self.assertTime(run["started_at"])
        self.assertTime(run["finished_at"])
        self.assertLessEqual(parse_time(run["started_at"]), parse_time(run["finished_at"]))
        got = s.get_run(run["id"])
        self.assertEqual(got["status"], "done")
        self.assertEqual(got["output"], run["output"])
        runs = s.list_all("/v1/sessions/%s/runs" % sess["id"])
        self.assertEqual([r["id"] for r in runs], [run["id"]])

        msgs = s.list_all("/v1/sessions/%s/messages" % sess["id"])
        self.assertEqual([m["role"] for m in msgs], ["user", "assistant"], msgs)
        self.assertEqual(msgs[0]["content"], "how are you")
        self.assertEqual(msgs[1]["content"], run["output"])
        for m in msgs:
            self.assertTrue(MESSAGE_FIELDS <= set(m))
            self.assertEqual(m["run_id"], run["id"])
            self.assertTime(m["created_at"])

    def test_messages_in_order(self):
        s = self.server
        _, sess = self.new_session()
        for i in range(3):
            s.send(sess["id"], "turn %d" % i)
        msgs = s.list_all("/v1/sessions/%s/messages" % sess["id"])
        self.assertEqual([m["role"] for m in msgs], ["user", "assistant"] * 3)
        for i in range(3):
            self.assertEqual(msgs[2 * i]["content"], "turn %d" % i)
            self.assertIn("turn %d" % i, msgs[2 * i + 1]["content"])
        # paginated messages give the same order
        paged = s.list_all("/v1/sessions/%s/messages" % sess["id"], limit=1)
        self.assertEqual([m["id"] for m in paged], [m["id"] for m in msgs])

    # ------------------------------------------------------------------ the local model

    def test_local_plain_text_quotes(self):
        s = self.server
        _, sess = self.new_session()
        run = s.send(sess["id"], "the quick brown fox")["run"]
        self.assertEqual(run["status"], "done", run)
        self.assertIn("the quick brown fox", run["output"])
        steps = s.steps(run["id"])
        self.assertEqual([x["kind"] for x in steps], ["model"], steps)

    def test_local_call_time_now(self):
        s = self.server
        _, sess = self.new_session(tools=["time.now"])
        run = s.send(sess["id"], "/call time.now {}")["run"]
        self.assertEqual(run["status"], "done", run)
        steps = s.steps(run["id"])
        self.assertEqual([x["kind"] for x in steps], ["model", "tool", "model"], steps)
        tool = steps[1]
        self.assertEqual(tool["status"], "succeeded", tool)
        self.assertEqual(tool["input"].get("tool"), "time.now", tool)
        self.assertEqual(tool["input"].get("arguments"), {}, tool)
        result = tool["output"]
        self.assertIsInstance(result, str, "time.now returns an RFC 3339 string: %r" % result)
        self.assertRegex(result, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
        self.assertIn(result, run["output"], "the answer includes the tool's result")
        for x in steps:
            for k in ("kind", "status", "input", "output"):
                self.assertIn(k, x, "step lacks %s: %r" % (k, x))
        # the events of the run, in order
        evs = [e["type"] for e in s.all_events() if e["run_id"] == run["id"]]
        for t in ("run.queued@v1", "run.started@v1", "run.step@v1", "tool.call.started@v1",
                  "tool.call.completed@v1", "run.completed@v1"):
            self.assertIn(t, evs, "run events: %s" % evs)
        self.assertEqual(evs[-1], "run.completed@v1", evs)
        self.assertLess(evs.index("tool.call.started@v1"), evs.index("tool.call.completed@v1"))
        self.assertLess(evs.index("run.queued@v1"), evs.index("run.started@v1"))

    def test_local_two_calls_one_step(self):
        s = self.server
        _, sess = self.new_session(tools=["time.now"])
        run = s.send(sess["id"], "/call time.now {}\n/call time.now {}")["run"]
        self.assertEqual(run["status"], "done", run)
        steps = s.steps(run["id"])
        self.assertEqual([x["kind"] for x in steps], ["model", "tool", "tool", "model"],
                         "two /call lines are two tool calls of one model step: %s" % steps)
        calls = [x["input"].get("call_id") for x in tool_steps(steps)]
        self.assertEqual(len(set(calls)), 2, "call ids differ: %s" % calls)
        self.assertTrue(all(x["status"] == "succeeded" for x in tool_steps(steps)))

    def test_local_rules_reply(self):
        s = self.server
        _, sess = self.new_session(tools=["time.now"], config={"local_rules": [
            {"match": "^ping", "reply": "pong!"},
            {"match": "clock", "call": {"tool": "time.now", "arguments": {}}}]})
        run = s.send(sess["id"], "ping please")["run"]
        self.assertEqual(run["status"], "done", run)
        self.assertEqual(run["output"], "pong!")
        run = s.send(sess["id"], "what does the clock say")["run"]
        self.assertEqual(run["status"], "done", run)
        steps = s.steps(run["id"])
        self.assertEqual([x["kind"] for x in steps], ["model", "tool", "model"], steps)
        self.assertEqual(steps[1]["input"].get("tool"), "time.now")
        # no rule matches: the default quoting reply
        run = s.send(sess["id"], "something else")["run"]
        self.assertIn("something else", run["output"])

    def test_notes_append_writes_workspace(self):
        s = self.server
        agent, sess = self.new_session(tools=["notes.append"])
        run = s.send(sess["id"], '/call notes.append {"line": "first note"}')["run"]
        self.assertEqual(run["status"], "done", run)
        run = s.send(sess["id"], '/call notes.append {"line": "second note"}')["run"]
        self.assertEqual(run["status"], "done", run)
        steps = s.steps(run["id"])
        self.assertEqual(tool_steps(steps)[0]["status"], "succeeded", steps)
        path = os.path.join(s.home, "workspaces", agent["id"], "notes.txt")
        self.assertTrue(os.path.exists(path), "no %s" % path)
        with open(path) as f:
            self.assertEqual(f.read(), "first note\nsecond note\n")

    def test_unknown_tool_denied(self):
        s = self.server
        _, sess = self.new_session()
        run = s.send(sess["id"], "/call no.such.tool {}")["run"]
        self.assertIn(run["status"], ("done", "failed"), run)
        steps = s.steps(run["id"])
        tools = tool_steps(steps)
        self.assertEqual(len(tools), 1, steps)
        self.assertEqual(tools[0]["status"], "denied", tools)

    def test_tool_not_on_agent_list_denied(self):
        s = self.server
        agent, sess = self.new_session(tools=["time.now"])
        run = s.send(sess["id"], '/call notes.append {"line": "nope"}')["run"]
        tools = tool_steps(s.steps(run["id"]))
        self.assertEqual(len(tools), 1)
        self.assertEqual(tools[0]["status"], "denied", tools)
        self.assertFalse(os.path.exists(os.path.join(s.home, "workspaces", agent["id"],
                                                     "notes.txt")))

    # ------------------------------------------------------------------ steps

    def test_steps_shape(self):
        s = self.server
        _, sess = self.new_session(tools=["notes.append"])
        run = s.send(sess["id"], '/call notes.append {"line": "x"}')["run"]
        steps = s.steps(run["id"])
        self.assertGreaterEqual(len(steps), 3)
        seqs = [x.get("seq") for x in steps if "seq" in x]
        if seqs:
            self.assertEqual(seqs, sorted(seqs), "steps in order")
            self.assertEqual(len(set(seqs)), len(seqs), "seq unique")
        for x in steps:
            self.assertIn(x["kind"], ("model", "tool"))
            self.assertIsInstance(x["status"], str)
        t = tool_steps(steps)[0]
        self.assertEqual(t["input"].get("tool"), "notes.append")
        self.assertEqual(t["input"].get("arguments"), {"line": "x"})
        self.assertEqual(t["status"], "succeeded")
        self.assertError(s.request("GET", "/v1/runs/%s/steps" % "nope-no-such-run"), 404,
                         "not_found")

    # ------------------------------------------------------------------ pagination

    def test_pagination_agents(self):
        s = self.server
        created = {s.create_agent(name=unique_name("page"))["id"] for _ in range(7)}
        seen = []
        cursor = None
        pages = 0
        while True:
            path = "/v1/agents?limit=3" + ("&cursor=" + cursor if cursor else "")
            data = s.ok("GET", path, expect=200)
            self.assertIn("next_cursor", data)
            self.assertLessEqual(len(data["items"]), 3)
            seen.extend(a["id"] for a in data["items"])
            pages += 1
            cursor = data["next_cursor"]
            if cursor is None:
                break
            self.assertIsInstance(cursor, str)
            self.assertLess(pages, 100)
        self.assertEqual(len(seen), len(set(seen)), "duplicates across pages")
        self.assertTrue(created <= set(seen), "missing: %s" % (created - set(seen)))
        self.assertGreaterEqual(pages, 3)
        everything = s.ok("GET", "/v1/agents?limit=500", expect=200)["items"]
        self.assertEqual([a["id"] for a in everything], seen, "paging gives the same order")
        # default limit is 50, max 500
        data = s.ok("GET", "/v1/agents", expect=200)
        self.assertLessEqual(len(data["items"]), 50)

    def test_pagination_runs_and_sessions(self):
        s = self.server
        agent = s.create_agent()
        sessions = [s.create_session(agent["id"], title="p%d" % i)["id"] for i in range(5)]
        listed = s.list_all("/v1/agents/%s/sessions" % agent["id"], limit=2)
        self.assertEqual(sorted(x["id"] for x in listed), sorted(sessions))
        self.assertEqual(len(listed), len(set(x["id"] for x in listed)))
        runs = [s.send(sessions[0], "r%d" % i)["run"]["id"] for i in range(4)]
        listed = s.list_all("/v1/sessions/%s/runs" % sessions[0], limit=3)
        self.assertEqual([r["id"] for r in listed], runs)

    # ------------------------------------------------------------------ events

    def test_events_shape_and_order(self):
        s = self.server
        _, sess = self.new_session(tools=["time.now"])
        s.send(sess["id"], "/call time.now {}")
        doomed = s.create_agent()  # so that agent.updated and agent.deleted events are covered
        s.ok("PATCH", "/v1/agents/%s" % doomed["id"], {"instructions": "soon gone"})
        s.ok("DELETE", "/v1/agents/%s" % doomed["id"])
        events = s.all_events()
        self.assertTrue(events)
        positions = [e["position"] for e in events]
        # The tenant's positions: 1, 2, 3, ... without gaps.
        self.assertEqual(positions, list(range(1, len(positions) + 1)))
        for e in events:
            self.assertTrue(EVENT_FIELDS <= set(e), "event fields missing: %s in %r"
                            % (EVENT_FIELDS - set(e), e))
            what = "event %r" % e
            self.assertIsInstance(e["position"], int, what)
            self.assertIsInstance(e["origin_seq"], int, what)
            self.assertIsInstance(e["origin"], str, what)
            self.assertTrue(e["origin"], what)
            self.assertRegex(e["type"], EVENT_TYPE, what)
            self.assertIsInstance(e["payload"], dict, "payload is not a JSON object: " + what)
            self.assertTime(e["occurred_at"], what)
        # pages of `after` + `limit` cover the log exactly
        paged = s.all_events(limit=4)
        self.assertEqual([e["position"] for e in paged], positions[:len(paged)])
        self.assertGreaterEqual(len(paged), len(positions))
        mid = positions[len(positions) // 2]
        later = s.ok("GET", "/v1/events?after=%d&limit=500" % mid, expect=200)["items"]
        self.assertTrue(all(e["position"] > mid for e in later))
        self.assertEqual([e["position"] for e in later][:len(positions) - len(positions) // 2 - 1],
                         positions[len(positions) // 2 + 1:])
        limited = s.ok("GET", "/v1/events?after=0&limit=2", expect=200)["items"]
        self.assertEqual(len(limited), 2)

    def test_events_newest_first(self):
        s = self.server
        agent, sess = self.new_session()
        s.send(sess["id"], "one")
        s.send(sess["id"], "two")
        every = s.list_all("/v1/events")
        newest = s.ok("GET", "/v1/events?order=desc&limit=3")
        self.assertEqual([e["position"] for e in newest["items"]],
                         [e["position"] for e in every[::-1][:3]])
        older = s.ok("GET", "/v1/events?order=desc&limit=3&cursor=" + newest["next_cursor"])
        self.assertEqual([e["position"] for e in older["items"]],
                         [e["position"] for e in every[::-1][3:6]])
        # Filters hold, and the cursor walks back to the session's first event.
        mine = [e["position"] for e in every if e["session_id"] == sess["id"]]
        got, cursor = [], None
        while True:
            page = s.ok("GET", "/v1/events?order=desc&limit=4&session_id=%s%s" % (
                sess["id"], "&cursor=" + cursor if cursor else ""))
            got += [e["position"] for e in page["items"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
        self.assertEqual(got, mine[::-1])
        for bad in ("order=newest", "order=desc&after=3", "order=desc&cursor=x"):
            st, body, _ = s.request("GET", "/v1/events?" + bad)
            self.assertEqual(st, 400, (bad, body))

    def test_events_origin_seq_gapless(self):
        # origin_seq counts the tenant's events of each origin: gapless from 1 in its log.
        s = self.server
        _, sess = self.new_session(tools=["time.now"])
        s.send(sess["id"], "/call time.now {}")
        by_origin = {}
        for e in s.all_events():
            by_origin.setdefault(e["origin"], []).append(e["origin_seq"])
        self.assertTrue(by_origin)
        for origin, seqs in by_origin.items():
            self.assertEqual(sorted(seqs), list(range(1, len(seqs) + 1)),
                             "origin %s: origin_seq not gapless from 1" % origin)
            self.assertEqual(seqs, sorted(seqs), "origin %s: seq not increasing with position"
                             % origin)

    # ------------------------------------------------------------------ health, metrics, openapi

    def test_health_without_token(self):
        s = self.server
        for path in ("/healthz", "/readyz"):
            st, body, _ = s.request("GET", path, token=None)
            self.assertEqual(st, 200, "%s -> %s %r" % (path, st, body))

    def test_metrics(self):
        s = self.server
        _, sess = self.new_session()
        s.send(sess["id"], "count me")
        st, body, hdrs = s.request("GET", "/metrics")
        self.assertEqual(st, 200, body)
        self.assertIn("text/plain", hdrs.get("content-type", ""))
        self.assertIsInstance(body, str)
        samples = [ln for ln in body.splitlines() if ln and not ln.startswith("#")]
        self.assertTrue(samples, "no samples in /metrics")
        metric_line = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? [-+0-9.eEInfNa]+( \d+)?$')
        for ln in samples:
            self.assertRegex(ln, metric_line, "not Prometheus text format")
        self.assertTrue(any(ln.startswith("# TYPE") for ln in body.splitlines()))

    def test_metrics_only_for_the_platform_admin(self):
        s = self.server
        st, body, _ = s.request("GET", "/metrics", token=None)
        self.assertEqual(st, 401, body)
        for role in ("user", "guest"):
            token = s.ok("POST", "/v1/tokens", {"name": unique_name(role), "role": role})["token"]
            st, body, _ = s.request("GET", "/metrics", token=token)
            self.assertEqual(st, 403, "%s token: %s %r" % (role, st, body))
        other = Tenant(s)
        st, body, _ = s.request("GET", "/metrics", token=other.token)
        self.assertEqual(st, 403, "another tenant's owner: %s %r" % (st, body))
        self.assertNotIn("keel_", json.dumps(body))

    def test_openapi(self):
        s = self.server
        st, doc, _ = s.request("GET", "/v1/openapi.json")
        self.assertEqual(st, 200)
        if isinstance(doc, str):
            doc = json.loads(doc)
        self.assertIn("openapi", doc)
        self.assertIn("paths", doc)
        self.assertIn("/v1/agents", doc["paths"])
        self.assertIn("/v1/sessions/{id}/messages", doc["paths"])

    def test_sigterm_and_restart_keeps_data(self):
        # A separate server: SIGTERM drains and stops cleanly; the data is there after restart.
        srv = KeelServer()
        try:
            agent = srv.create_agent()
            sess = srv.create_session(agent["id"])
            run = srv.send(sess["id"], "persist me")["run"]
            token = srv.token
            rc = srv.terminate()
            self.assertEqual(rc, 0, "exit status after SIGTERM\n" + srv.log_tail())
            srv.start()
            self.assertEqual(srv.token, token)
            got = srv.get_run(run["id"])
            self.assertEqual(got["status"], "done")
            self.assertEqual(got["output"], run["output"])
            run2 = srv.send(sess["id"], "and again")["run"]
            self.assertEqual(run2["status"], "done")
        finally:
            srv.stop()


if __name__ == "__main__":
    unittest.main()

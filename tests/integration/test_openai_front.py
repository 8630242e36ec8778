"""The OpenAI-compatible front door (docs/API.md section 23) on a real server: POST
/v1/chat/completions answering as a Chat Completions model, streamed and not, a conversation
resent whole or continued by session header, a run parked for approval, the options it refuses,
errors in OpenAI's shape, and the callers it refuses; GET /v1/models.

The official `openai` npm package against the same routes: openai_sdk_check.mjs (run by
test_the_official_sdk when the package is installed, scripts/install-mcp-test-servers.sh)."""

import http.client
import json
import os
import shutil
import subprocess
import time
import unittest

import keel_harness
from keel_harness import FakeOpenAi, KeelServer, KeelTestCase, unique_name

HERE = os.path.dirname(os.path.abspath(__file__))

APPROVAL_FRAME = {"rules": [
    {"tool": "*", "rights": ["read", "write"], "approval": "never"},
    {"tool": "notes.append", "rights": ["write"], "approval": "always"},
]}


def chat_body(model, *messages, **options):
    body = {"model": model, "messages": [{"role": r, "content": c} for r, c in messages]}
    body.update(options)
    return body


class Stream:
    """A streamed POST /v1/chat/completions, read line by line as it arrives."""

    def __init__(self, server, body, token, headers=None):
        host, port = server.addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        h = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
        h.update(headers or {})
        self.conn.request("POST", "/v1/chat/completions", json.dumps(body), h)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}
        self.comments, self.chunks, self.done, self.error = [], [], False, None

    def read_until(self, predicate):
        """Reads events until predicate(self) holds or the stream ends; returns whether it holds."""
        while not predicate(self):
            line = self.response.fp.readline()
            if not line:
                return False
            line = line.decode().rstrip("\r\n")
            if line.startswith(":"):
                self.comments.append(line)
            elif line == "data: [DONE]":
                self.done = True
            elif line.startswith("data: "):
                obj = json.loads(line[6:])
                if "error" in obj:
                    self.error = obj["error"]
                else:
                    self.chunks.append(obj)
        return True

    def read_all(self):
        self.read_until(lambda s: False)
        self.conn.close()
        return self

    def text(self):
        return "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in self.chunks if c["choices"])


class FrontDoorTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.fake = FakeOpenAi()
        cls.server = KeelServer(env=cls.fake.env)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.fake.stop()

    def chat(self, body, token=keel_harness._DEFAULT, headers=None, timeout=60):
        return self.server.request("POST", "/v1/chat/completions", body, token=token,
                                   headers=headers, timeout=timeout)

    def agent(self, t=None, **kw):
        t = t or keel_harness.Tenant(self.server)
        kw.setdefault("name", unique_name("front"))
        return t, self.server.create_agent(token=t.token, **kw)

    def assertOpenAiError(self, status, body, expected_status, code=None, param=None):
        self.assertEqual(status, expected_status, body)
        self.assertIsInstance(body, dict, body)
        err = body.get("error")
        self.assertIsInstance(err, dict, body)
        for field in ("message", "type", "param", "code"):
            self.assertIn(field, err, body)
        self.assertTrue(err["message"], body)
        if code is not None:
            self.assertEqual(err["code"], code, body)
        if param is not None:
            self.assertEqual(err["param"], param, body)

    def events_of(self, t):
        return [e["type"] for e in self.server.list_all("/v1/events", token=t.token)]

    # ------------------------------------------------------------------ answers

    def test_a_conversation_resent_whole_seeds_a_new_session(self):
        t, agent = self.agent()
        st, body, hdrs = self.chat(chat_body(
            "agent:" + agent["name"], ("system", "Answer briefly."), ("developer", "No emoji."),
            ("user", "first question"), ("assistant", "first answer"),
            ("user", [{"type": "text", "text": "second"}, {"type": "text", "text": "question"}])),
            token=t.token)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["object"], "chat.completion")
        self.assertEqual(body["model"], "agent:" + agent["name"])
        self.assertEqual(body["id"], "chatcmpl-" + hdrs["x-keel-run"])
        choice = body["choices"][0]
        self.assertEqual(choice["finish_reason"], "stop")
        self.assertEqual(choice["message"]["role"], "assistant")
        self.assertEqual(choice["message"]["content"], 'You said: "second\nquestion"')
        run = self.server.get_run(hdrs["x-keel-run"], token=t.token)
        self.assertEqual(body["usage"]["prompt_tokens"], run["usage"]["input_tokens"])
        self.assertEqual(body["usage"]["completion_tokens"], run["usage"]["output_tokens"])
        self.assertEqual(body["usage"]["total_tokens"],
                         run["usage"]["input_tokens"] + run["usage"]["output_tokens"])
        session = t.ok("GET", "/v1/sessions/%s" % hdrs["x-keel-session"])
        self.assertEqual(session["agent_id"], agent["id"])
        self.assertEqual(session["instructions"], "Answer briefly.\n\nNo emoji.")
        self.assertEqual(session["title"], "first question")
        self.assertEqual(run["session_id"], session["id"])
        messages = self.server.list_all("/v1/sessions/%s/messages" % session["id"], token=t.token)
        self.assertEqual(sorted((m["role"], m["content"]) for m in messages), sorted([
            ("user", "first question"), ("assistant", "first answer"),
            ("user", "second\nquestion"), ("assistant", 'You said: "second\nquestion"')]))
        types = self.events_of(t)
        self.assertEqual(types.count("session.created@v1"), 1, types)
        self.assertEqual(types.count("message.created@v1"), 4, types)

    def test_the_session_header_continues_with_the_last_message_only(self):
        t, agent = self.agent()
        st, first, hdrs = self.chat(chat_body(agent["name"], ("user", "one")), token=t.token)
        self.assertEqual(st, 200, first)
        session = hdrs["x-keel-session"]
        resent = chat_body(agent["id"], ("system", "ignored: the session has its own"),
                           ("user", "one"), ("assistant", "whatever the client kept"),
                           ("user", "two"))
        st, second, hdrs2 = self.chat(resent, token=t.token, headers={"X-Keel-Session": session})
        self.assertEqual(st, 200, second)
        self.assertEqual(hdrs2["x-keel-session"], session)
        self.assertEqual(second["choices"][0]["message"]["content"], 'You said: "two"')
        messages = self.server.list_all("/v1/sessions/%s/messages" % session, token=t.token)
        self.assertEqual([m["content"] for m in messages if m["role"] == "user"], ["one", "two"])
        self.assertEqual(t.ok("GET", "/v1/sessions/%s" % session)["instructions"], "")
        # The same Idempotency-Key: the same run, not a second turn.
        key = {"X-Keel-Session": session, "Idempotency-Key": unique_name("key")}
        st, a, ha = self.chat(chat_body(agent["name"], ("user", "three")), token=t.token, headers=key)
        st2, b, hb = self.chat(chat_body(agent["name"], ("user", "three")), token=t.token, headers=key)
        self.assertEqual((st, st2), (200, 200), (a, b))
        self.assertEqual(ha["x-keel-run"], hb["x-keel-run"])
        messages = self.server.list_all("/v1/sessions/%s/messages" % session, token=t.token)
        self.assertEqual([m["content"] for m in messages if m["role"] == "user"],
                         ["one", "two", "three"])

    def test_a_stream_sends_the_answer_as_chunks_then_done(self):
        t, agent = self.agent()
        s = Stream(self.server, chat_body(agent["name"], ("user", "stream me please"), stream=True,
                                          stream_options={"include_usage": True}),
                   t.token).read_all()
        self.assertEqual(s.status, 200)
        self.assertIn("text/event-stream", s.headers["content-type"])
        self.assertIsNone(s.error)
        self.assertTrue(s.done)
        first = s.chunks[0]
        self.assertEqual(first["object"], "chat.completion.chunk")
        self.assertEqual(first["choices"][0]["delta"], {"role": "assistant", "content": ""})
        self.assertGreater(len(s.chunks), 3, s.chunks)  # the local model streams word by word
        run = self.server.get_run(s.headers["x-keel-run"], token=t.token)
        self.assertEqual(s.text(), run["output"])
        self.assertEqual(s.text(), 'You said: "stream me please"')
        finish = [c for c in s.chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        self.assertEqual([c["choices"][0]["finish_reason"] for c in finish], ["stop"])
        usage = s.chunks[-1]
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"]["completion_tokens"], run["usage"]["output_tokens"])
        self.assertEqual({c["id"] for c in s.chunks}, {"chatcmpl-" + run["id"]})

    def test_the_model_gets_the_sessions_instructions_after_the_agents(self):
        t, agent = self.agent(model="openai/echo-messages", instructions="AGENT RULES")
        st, body, hdrs = self.chat(chat_body(agent["name"], ("system", "CLIENT RULES"),
                                             ("user", "u1"), ("assistant", "a1"), ("user", "u2")),
                                   token=t.token)
        self.assertEqual(st, 200, body)
        sent = json.loads(body["choices"][0]["message"]["content"])
        self.assertEqual(sent, [["system", "AGENT RULES\n\nCLIENT RULES"], ["user", "u1"],
                                ["assistant", "a1"], ["user", "u2"]])
        # And in the session's next turn, posted through the native API.
        more = self.server.send(hdrs["x-keel-session"], "u3", token=t.token, wait=30)
        sent = json.loads(more["run"]["output"])
        self.assertEqual(sent[0], ["system", "AGENT RULES\n\nCLIENT RULES"])
        self.assertEqual(sent[-1], ["user", "u3"])

    def test_a_failed_run_is_an_error_and_not_retried(self):
        t, agent = self.agent(model="openai/garbage")
        st, body, hdrs = self.chat(chat_body(agent["name"], ("user", "garbage please")),
                                   token=t.token)
        self.assertOpenAiError(st, body, 500, code="model_error")
        self.assertEqual(hdrs.get("x-should-retry"), "false")
        self.assertIn(hdrs["x-keel-run"], body["error"]["message"])
        s = Stream(self.server, chat_body(agent["name"], ("user", "garbage streamed"), stream=True),
                   t.token).read_all()
        self.assertEqual(s.status, 200)
        self.assertFalse(s.done)
        self.assertEqual(s.error["code"], "model_error", s.error)

    # ------------------------------------------------------------------ approvals

    def test_a_run_parked_for_approval_answers_once_decided(self):
        t, agent = self.agent(tools=["notes.append"])
        t.ok("PUT", "/v1/policy", APPROVAL_FRAME)
        call = "/call notes.append " + json.dumps({"line": "from the front door"})
        s = Stream(self.server, chat_body(agent["name"], ("user", call), stream=True), t.token)
        self.assertEqual(s.status, 200)
        self.assertTrue(s.read_until(lambda x: any("waiting for an approval" in c
                                                   for c in x.comments)), s.chunks)
        pending = [a for a in self.server.list_all("/v1/approvals?status=pending", token=t.token)
                   if a["run_id"] == s.headers["x-keel-run"]]
        self.assertEqual(len(pending), 1)
        t.ok("POST", "/v1/approvals/%s/approve" % pending[0]["id"], {})
        s.read_all()
        self.assertIsNone(s.error, s.error)
        self.assertTrue(s.done)
        self.assertEqual(s.text(), 'The tool notes.append returned: {"appended":"from the front door"}.')
        # Not streamed, with a wait shorter than the decision: 504, and no retry.
        call2 = "/call notes.append " + json.dumps({"line": "later"})
        st, body, hdrs = self.chat(chat_body(agent["name"], ("user", call2)), token=t.token,
                                   headers={"X-Keel-Wait": "1"})
        self.assertOpenAiError(st, body, 504, code="approval_pending")
        self.assertEqual(hdrs.get("x-should-retry"), "false")
        run = self.server.get_run(hdrs["x-keel-run"], token=t.token)
        self.assertEqual(run["status"], "waiting_for_approval")

    # ------------------------------------------------------------------ refusals

    def test_options_an_agent_cannot_honour_are_refused_and_nothing_is_written(self):
        t, agent = self.agent()
        before = len(self.events_of(t))
        name = agent["name"]
        cases = [
            (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
            (dict(functions=[{"name": "f"}]), "functions"),
            (dict(tool_choice="required"), "tool_choice"),
            (dict(n=2), "n"),
            (dict(response_format={"type": "json_object"}), "response_format"),
            (dict(logprobs=True), "logprobs"),
            (dict(stop=["\n"]), "stop"),
            (dict(modalities=["text", "audio"]), "modalities"),
            (dict(stream="yes"), "stream"),
        ]
        for options, param in cases:
            st, body, _ = self.chat(chat_body(name, ("user", "x"), **options), token=t.token)
            self.assertOpenAiError(st, body, 400, param=param)
        bad_messages = [
            ([{"role": "tool", "content": "x", "tool_call_id": "c"}, {"role": "user", "content": "x"}],
             "messages[0].role"),
            ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
             "messages[0].content"),
            ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
              {"role": "user", "content": "x"}], "messages[0].tool_calls"),
            ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "messages"),
            ([{"role": "user", "content": ""}], "messages"),
            ([], "messages"),
            ([{"content": "no role"}], "messages[0]"),
        ]
        for messages, param in bad_messages:
            st, body, _ = self.chat({"model": name, "messages": messages}, token=t.token)
            self.assertOpenAiError(st, body, 400, param=param)
        # Sampling hints and unknown fields are the agent's to decide: ignored.
        st, body, _ = self.chat(chat_body(name, ("user", "hints"), temperature=0.2, top_p=0.9,
                                          max_tokens=5, seed=1, user="u", stop=None, n=1,
                                          tool_choice="auto", tools=[], whatever={"x": 1}),
                                token=t.token)
        self.assertEqual(st, 200, body)
        self.assertEqual(len(self.events_of(t)) - before, 7)  # the one turn that went in

    def test_errors_are_in_openais_shape(self):
        t, agent = self.agent()
        st, body, _ = self.chat(chat_body("no-such-agent", ("user", "x")), token=t.token)
        self.assertOpenAiError(st, body, 404, code="model_not_found", param="model")
        st, body, hdrs = self.chat(chat_body(agent["name"], ("user", "x")), token=None)
        self.assertOpenAiError(st, body, 401)
        self.assertEqual(hdrs.get("www-authenticate"), "Bearer")
        secret, token_id = t.new_token("user")
        t.ok("DELETE", "/v1/tokens/%s" % token_id)
        st, body, _ = self.chat(chat_body(agent["name"], ("user", "x")), token=secret)
        self.assertOpenAiError(st, body, 401)
        st, body, _ = self.server.request("GET", "/v1/models", token=secret)
        self.assertOpenAiError(st, body, 401)
        for raw in ("{", "[]", "null", '{"model": "a", "model": "b"}',
                    "[" * 200000 + "]" * 200000, '{"model": "%s", "messages": %s}' % (
                        agent["name"], "[" * 100 + "]" * 100)):
            st, body, _ = self.server.request("POST", "/v1/chat/completions", token=t.token,
                                              raw_body=raw)
            self.assertOpenAiError(st, body, 400)
        st, body, _ = self.chat(chat_body(agent["name"], ("user", "x")), token=t.token,
                                headers={"X-Keel-Wait": "-1"})
        self.assertOpenAiError(st, body, 400)
        self.assertTrue(self.server.alive())

    def test_nobody_continues_another_callers_session(self):
        t, agent = self.agent()
        st, body, hdrs = self.chat(chat_body(agent["name"], ("user", "mine")), token=t.token)
        self.assertEqual(st, 200, body)
        session = {"X-Keel-Session": hdrs["x-keel-session"]}
        user, _ = t.new_token("user")
        guest, _ = t.new_token("guest")
        _, second = self.agent(t=t)
        other, _ = self.agent(name=agent["name"])
        before = len(self.events_of(t))
        for token in (user, guest):
            st, body, _ = self.chat(chat_body(agent["name"], ("user", "yours?")), token=token,
                                    headers=session)
            self.assertOpenAiError(st, body, 404, code="session_not_found")
        # Another tenant's owner: its own agent of the same name, the first tenant's session.
        st, body, _ = self.chat(chat_body(agent["name"], ("user", "yours?")), token=other.token,
                                headers=session)
        self.assertOpenAiError(st, body, 404, code="session_not_found")
        self.assertNotIn(agent["id"], json.dumps(body))
        # The session of another agent of the same tenant.
        st, body, _ = self.chat(chat_body(second["name"], ("user", "x")), token=t.token,
                                headers=session)
        self.assertOpenAiError(st, body, 404, code="session_not_found")
        self.assertEqual(len(self.events_of(t)), before)
        # A guest talks to the agent in sessions of its own.
        st, body, hdrs = self.chat(chat_body(agent["name"], ("user", "hello")), token=guest)
        self.assertEqual(st, 200, body)
        st, body, _ = self.chat(chat_body(agent["name"], ("user", "again")), token=guest,
                                headers={"X-Keel-Session": hdrs["x-keel-session"]})
        self.assertEqual(st, 200, body)

    def test_models_lists_the_tenants_agents_by_name(self):
        t, a = self.agent()
        _, b = self.agent(t=t)
        other, c = self.agent()
        guest, _ = t.new_token("guest")
        for token in (t.token, guest):
            st, body, _ = self.server.request("GET", "/v1/models", token=token)
            self.assertEqual(st, 200, body)
            self.assertEqual(body["object"], "list")
            self.assertEqual(sorted(m["id"] for m in body["data"]), sorted([a["name"], b["name"]]))
            for m in body["data"]:
                self.assertEqual(m["object"], "model")
                self.assertEqual(m["owned_by"], "keel")
        t.ok("DELETE", "/v1/agents/%s" % b["id"])
        body = self.server.ok("GET", "/v1/models", token=t.token)
        self.assertEqual([m["id"] for m in body["data"]], [a["name"]])
        st, body, _ = self.chat(chat_body(b["name"], ("user", "x")), token=t.token)
        self.assertOpenAiError(st, body, 404, code="model_not_found")

    # ------------------------------------------------------------------ the official SDK

    def test_the_official_sdk(self):
        modules = os.environ.get("KEEL_TEST_MCP_DIR",
                                 os.path.expanduser("~/.cache/keel-mcp-servers"))
        if not os.path.exists(os.path.join(modules, "node_modules", "openai", "package.json")):
            self.skipTest("the openai npm package is not installed "
                          "(bash scripts/install-mcp-test-servers.sh)")
        node = shutil.which("node")
        if not node:
            self.skipTest("no node")
        t, agent = self.agent()
        env = dict(os.environ, KEEL_MODULES=os.path.join(modules, "node_modules"),
                   KEEL_URL="http://%s/v1" % self.server.addr, KEEL_TOKEN=t.token,
                   KEEL_AGENT=agent["name"])
        out = subprocess.run([node, os.path.join(HERE, "openai_sdk_check.mjs")], env=env,
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("openai sdk: all checks passed", out.stdout)


if __name__ == "__main__":
    unittest.main()

"""Schedules end to end (docs/SCHEDULES.md): create, list, show, pause, resume, delete; bad
input refused with nothing written; a one-shot that fires exactly once into its session (a run
and a message appear, schedule.fired@v1 is recorded); exactly once across kill -9 around the
slots; the missed-slot policies across downtime (skip vs catch_up_one); an agent scheduling its
own follow-up through schedule.create (a guest's run is refused); the `keel schedule` CLI.

Cron expressions, zones and DST are covered by the unit tests (tests/unit/cron_test.cc); here
one-shots a second or two ahead keep the tests fast, and one cron schedule waits for its first
slot at the next minute. Runs on SQLite and, with KEEL_TEST_STORE=postgres, on PostgreSQL."""

import os
import subprocess
import time
import unittest
import urllib.parse
from datetime import datetime, timedelta, timezone

from keel_harness import (KeelServer, KeelTestCase, Tenant, keel_bin, parse_time,
                          unique_name)

TOOLS = ["schedule.create", "schedule.list", "schedule.cancel", "time.now"]


def rfc3339(dt):
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + \
        "%03dZ" % (dt.microsecond // 1000)


def in_seconds(s):
    return rfc3339(datetime.now(timezone.utc) + timedelta(seconds=s))


class ScheduleClient:
    """Helpers over one server (and token)."""

    def __init__(self, server, token=None):
        self.server = server
        self.token = token or server.token

    def create(self, expect=201, **body):
        return self.server.ok("POST", "/v1/schedules", body, expect=expect, token=self.token)

    def get(self, sid):
        return self.server.ok("GET", "/v1/schedules/" + sid, expect=200, token=self.token)

    def wait(self, sid, pred, timeout=15, what="the schedule"):
        deadline = time.monotonic() + timeout
        s = None
        while time.monotonic() < deadline:
            s = self.get(sid)
            if pred(s):
                return s
            time.sleep(0.1)
        raise AssertionError("%s did not get there within %ss: %r" % (what, timeout, s))

    def messages(self, session_id):
        return self.server.list_all("/v1/sessions/%s/messages" % session_id, token=self.token)

    def fired_events(self, sid):
        return [e for e in self.server.all_events(token=self.token)
                if e["type"] == "schedule.fired@v1" and e["payload"]["schedule_id"] == sid]


class SchedulesTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer()
        cls.c = ScheduleClient(cls.server)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def agent(self, **kw):
        return self.server.create_agent(**kw)

    def test_cron_preview_uses_the_firing_code(self):
        s = self.server
        p = s.ok("GET", "/v1/cron/preview?cron=%s&timezone=Europe/Berlin&count=3"
                 % urllib.parse.quote("0 9 * * MON-FRI"))
        self.assertEqual((p["cron"], p["timezone"], p["error"]),
                         ("0 9 * * MON-FRI", "Europe/Berlin", None))
        self.assertEqual(len(p["slots"]), 3)
        for slot in p["slots"]:  # 09:00 in Berlin is 08:00 or 07:00 UTC, on a weekday
            t = datetime.strptime(slot, "%Y-%m-%dT%H:%M:%S.000Z").replace(tzinfo=timezone.utc)
            self.assertIn(t.hour, (7, 8))
            self.assertEqual(t.minute, 0)
            self.assertLess(t.weekday(), 5)
        self.assertEqual(p["slots"], sorted(p["slots"]))
        # The slots are the ones a schedule made of it fires at.
        agent = self.agent()
        made = s.ok("POST", "/v1/schedules", {"agent_id": agent["id"], "prompt": "p",
                                              "cron": "0 9 * * MON-FRI",
                                              "timezone": "Europe/Berlin"}, expect=201)
        self.assertEqual(made["next_fire_at"], p["slots"][0])
        s.ok("DELETE", "/v1/schedules/" + made["id"], expect=204)
        # What a schedule would be refused for is an answer, with the parser's words.
        for cron, zone, words in (("61 * * * *", "UTC", "61"), ("0 0 30 2 *", "UTC", "never"),
                                  ("* * *", "UTC", ""), ("", "UTC", "empty"),
                                  ("@daily", "Mars/Olympus", "Mars/Olympus")):
            p = s.ok("GET", "/v1/cron/preview?cron=%s&timezone=%s" % (
                urllib.parse.quote(cron), urllib.parse.quote(zone)), expect=200)
            self.assertEqual(p["slots"], [], cron)
            self.assertIsInstance(p["error"], str)
            self.assertIn(words, p["error"])
        for bad in ("cron=@daily&count=0", "cron=@daily&count=51", "cron=@daily&count=x",
                    "cron=" + "1" * 300):
            st, body, _ = s.request("GET", "/v1/cron/preview?" + bad)
            self.assertEqual(st, 400, (bad, body))
        guest = s.ok("POST", "/v1/tokens", {"name": unique_name("g"), "role": "guest"})["token"]
        st, _, _ = s.request("GET", "/v1/cron/preview?cron=@daily", token=guest)
        self.assertEqual(st, 403)

    def test_create_list_show_pause_resume_delete(self):
        s = self.server
        a = self.agent()
        created = self.c.create(agent_id=a["id"], name="weekday mornings", cron="0 9 * * MON-FRI",
                                timezone="Europe/Berlin", prompt="good morning",
                                missed="catch_up_one")
        self.assertEqual(created["kind"], "cron")
        self.assertEqual(created["status"], "active")
        self.assertEqual(created["cron"], "0 9 * * MON-FRI")
        self.assertIsNone(created["session_id"])
        nxt = parse_time(created["next_fire_at"])
        self.assertGreater(nxt, datetime.now(timezone.utc))
        # 09:00 in Berlin is 07:00Z or 08:00Z, on a weekday.
        self.assertIn(nxt.hour, (7, 8))
        self.assertLess(nxt.weekday(), 5)
        # The core contract's form, under the agent.
        other = s.ok("POST", "/v1/agents/%s/schedules" % a["id"],
                     {"at": in_seconds(3600), "prompt": "later"}, expect=201)
        self.assertEqual(other["kind"], "once")
        ids = [x["id"] for x in s.list_all("/v1/schedules?agent_id=" + a["id"])]
        self.assertEqual(ids, sorted([created["id"], other["id"]]))
        self.assertEqual([x["id"] for x in s.list_all("/v1/agents/%s/schedules" % a["id"])], ids)
        shown = self.c.get(created["id"])
        self.assertEqual(shown["recent_fires"], [])
        self.assertEqual(shown["next_fire_at"], created["next_fire_at"])

        paused = s.ok("POST", "/v1/schedules/%s/pause" % created["id"], expect=200)
        self.assertEqual(paused["status"], "paused")
        again = s.ok("PATCH", "/v1/schedules/" + created["id"], {"enabled": False}, expect=200)
        self.assertEqual(again["status"], "paused")
        resumed = s.ok("POST", "/v1/schedules/%s/resume" % created["id"], expect=200)
        self.assertEqual(resumed["status"], "active")
        self.assertEqual(resumed["next_fire_at"], created["next_fire_at"])
        types = [e["type"] for e in s.all_events() if e.get("agent_id") == a["id"]]
        self.assertEqual(types.count("schedule.created@v1"), 2)
        self.assertEqual(types.count("schedule.paused@v1"), 1)  # the second pause changed nothing
        self.assertEqual(types.count("schedule.resumed@v1"), 1)

        s.ok("DELETE", "/v1/schedules/" + created["id"], expect=204)
        self.assertError(s.request("GET", "/v1/schedules/" + created["id"]), 404, "not_found")
        self.assertError(s.request("DELETE", "/v1/schedules/" + created["id"]), 404, "not_found")
        self.assertEqual([x["id"] for x in s.list_all("/v1/schedules?agent_id=" + a["id"])],
                         [other["id"]])

    def test_bad_input_is_refused_and_nothing_is_written(self):
        s = self.server
        a = self.agent()
        other = self.agent()
        foreign = s.create_session(other["id"])
        before = len(s.all_events())
        cases = [
            ({"cron": "0 24 * * *"}, "field 'hour' value '24' is out of range 0-23"),
            ({"cron": "0 0 30 2 *"}, "never fires"),
            ({"cron": "* * * *"}, "it has 4 fields"),
            ({"cron": "@reboot"}, "unknown macro"),
            ({"cron": "* * * * *", "timezone": "Mars/Olympus"},
             "unknown time zone: \"Mars/Olympus\""),
            ({"at": "tomorrow"}, "field 'at' must be an RFC 3339 time"),
            ({"at": "2030-01-01T00:00:00+25:00"}, "field 'at' must be an RFC 3339 time"),
            ({"at": "2030-01-01T00:00:00-00:60"}, "field 'at' must be an RFC 3339 time"),
            ({"at": in_seconds(60), "cron": "@daily"}, "not both"),
            ({}, "one of 'cron' and 'at' is required"),
            ({"cron": "@daily", "missed": "always"}, "field 'missed'"),
            ({"cron": "@daily", "session_id": foreign["id"]}, "is not a session of agent"),
            ({"cron": "@daily", "colour": "red"}, "unknown field 'colour'"),
            ({"cron": "@daily", "agent_id": "no-such-agent"}, "no agent no-such-agent"),
            ({"cron": "@daily", "prompt": ""}, "'prompt'"),
        ]
        for extra, message in cases:
            body = {"agent_id": a["id"], "prompt": "p"}
            body.update(extra)
            status, err, _ = s.request("POST", "/v1/schedules", body)
            self.assertEqual(status, 400, "%r -> %s %r" % (extra, status, err))
            self.assertEqual(err["error"]["code"], "invalid_argument")
            self.assertIn(message, err["error"]["message"], extra)
        self.assertError(s.request("POST", "/v1/schedules", raw_body="{not json"), 400,
                         "invalid_argument")
        self.assertEqual(s.list_all("/v1/schedules?agent_id=" + a["id"]), [])
        self.assertEqual(len(s.all_events()), before, "a refused schedule wrote events")

    def test_guests_are_refused_and_tenants_do_not_see_each_other(self):
        t = Tenant(self.server)
        a = t.ok("POST", "/v1/agents", {"name": unique_name("a"), "model": "local"}, expect=201)
        guest, _ = t.new_token("guest")
        user, _ = t.new_token("user")
        body = {"agent_id": a["id"], "cron": "@daily", "prompt": "p"}
        self.assertError(t.request("POST", "/v1/schedules", body, token=guest), 403,
                         "permission_denied")
        self.assertError(t.request("GET", "/v1/schedules", token=guest), 403, "permission_denied")
        mine = t.ok("POST", "/v1/schedules", body, token=user, expect=201)
        self.assertError(self.server.request("GET", "/v1/schedules/" + mine["id"]), 404,
                         "not_found")
        self.assertEqual([x["id"] for x in self.server.list_all("/v1/schedules")
                          if x["id"] == mine["id"]], [])

    def test_one_shot_fires_exactly_once_into_its_session(self):
        s = self.server
        a = self.agent()
        session = s.create_session(a["id"])
        created = self.c.create(agent_id=a["id"], at=in_seconds(1), prompt="ping from the clock",
                                session_id=session["id"])
        done = self.c.wait(created["id"], lambda x: x["status"] == "done", what="the one-shot")
        self.assertEqual(len(done["recent_fires"]), 1)
        fire = done["recent_fires"][0]
        self.assertEqual(fire["outcome"], "posted")
        self.assertEqual(fire["slot"], created["at"])
        self.assertEqual(fire["session_id"], session["id"])
        lateness = parse_time(fire["fired_at"]) - parse_time(fire["slot"])
        self.assertLess(lateness.total_seconds(), 1.5)
        self.assertIsNone(done["next_fire_at"])
        self.assertEqual(done["last_fired_at"], created["at"])
        run = s.wait_run(fire["run_id"])
        self.assertEqual(run["status"], "done")
        self.assertEqual(run["session_id"], session["id"])
        time.sleep(1.2)  # a second firing would come within the loop's second
        msgs = self.c.messages(session["id"])
        self.assertEqual([m["content"] for m in msgs if m["role"] == "user"],
                         ["ping from the clock"])
        self.assertEqual(len([m for m in msgs if m["role"] == "assistant"]), 1)
        self.assertEqual(len(s.list_all("/v1/sessions/%s/runs" % session["id"])), 1)
        fired = self.c.fired_events(created["id"])
        self.assertEqual(len(fired), 1)
        self.assertEqual(fired[0]["run_id"], fire["run_id"])
        self.assertEqual(fired[0]["session_id"], session["id"])
        queued = [e for e in s.all_events() if e["type"] == "run.queued@v1"
                  and e["run_id"] == fire["run_id"]]
        self.assertEqual(queued[0]["payload"]["trigger"]["schedule_id"], created["id"])

    def test_a_runs_trigger_names_its_schedule_and_slot(self):
        s = self.server
        a = self.agent()
        session = s.create_session(a["id"])
        created = self.c.create(agent_id=a["id"], at=in_seconds(0.5), prompt="triggered",
                                session_id=session["id"])
        done = self.c.wait(created["id"], lambda x: x["status"] == "done", what="the one-shot")
        run_id = done["recent_fires"][0]["run_id"]
        s.wait_run(run_id)
        run = s.get_run(run_id)
        self.assertEqual(run["trigger"], {"schedule_id": created["id"], "slot": created["at"]})
        queued = [e for e in s.all_events() if e["type"] == "run.queued@v1"
                  and e["run_id"] == run_id]
        self.assertEqual(run["trigger"], queued[0]["payload"]["trigger"], "as in run.queued")
        # A run posted by hand in the same session has none; nor does another tenant see the run.
        by_hand = s.send(session["id"], "by hand", wait=10)["run"]
        self.assertIn("trigger", s.get_run(by_hand["id"]))
        self.assertIsNone(s.get_run(by_hand["id"])["trigger"])
        other = Tenant(s)
        status, _, _ = other.request("GET", "/v1/runs/" + run_id)
        self.assertEqual(status, 404)
        # The fires go with a deleted schedule, and so does the run's trigger.
        s.ok("DELETE", "/v1/schedules/" + created["id"], expect=204)
        self.assertIsNone(s.get_run(run_id)["trigger"])

    def test_without_a_session_each_firing_gets_a_new_one(self):
        a = self.agent()
        created = self.c.create(agent_id=a["id"], at=in_seconds(0.5), prompt="fresh start",
                                name="fresh")
        done = self.c.wait(created["id"], lambda x: x["status"] == "done")
        sid = done["recent_fires"][0]["session_id"]
        session = self.server.ok("GET", "/v1/sessions/" + sid, expect=200)
        self.assertEqual(session["agent_id"], a["id"])
        self.assertEqual(session["title"], "fresh")
        self.assertEqual([m["content"] for m in self.c.messages(sid) if m["role"] == "user"],
                         ["fresh start"])

    def test_slots_due_together_fire_once_each_and_a_refused_one_holds_back_none(self):
        # Slots due in the same round are posted together (one unit of work); intake refusing
        # one of them (its session is closed) must neither stop nor duplicate the others.
        s = self.server
        a = self.agent()
        at = in_seconds(2)
        fresh = [self.c.create(agent_id=a["id"], at=at, prompt="fresh %d" % i, name="f%d" % i)
                 for i in range(6)]
        into = []
        for i in range(5):
            session = s.create_session(a["id"])
            into.append((self.c.create(agent_id=a["id"], at=at, prompt="into %d" % i,
                                       session_id=session["id"]), session))
        closed = s.create_session(a["id"])
        refused = self.c.create(agent_id=a["id"], at=at, prompt="to a closed session",
                                session_id=closed["id"])
        s.ok("PATCH", "/v1/sessions/" + closed["id"], {"status": "inactive"}, expect=200)
        for created in fresh:
            done = self.c.wait(created["id"], lambda x: x["status"] == "done")
            self.assertEqual([f["outcome"] for f in done["recent_fires"]], ["posted"])
            sid = done["recent_fires"][0]["session_id"]
            self.assertEqual([m["content"] for m in self.c.messages(sid) if m["role"] == "user"],
                             [created["prompt"]])
        for created, session in into:
            done = self.c.wait(created["id"], lambda x: x["status"] == "done")
            self.assertEqual([f["outcome"] for f in done["recent_fires"]], ["posted"])
            self.assertEqual([m["content"] for m in self.c.messages(session["id"])
                              if m["role"] == "user"], [created["prompt"]])
        done = self.c.wait(refused["id"], lambda x: x["status"] == "done")
        self.assertEqual([f["outcome"] for f in done["recent_fires"]], ["refused"])
        self.assertIn("inactive", done["recent_fires"][0]["error"])
        self.assertEqual(self.c.messages(closed["id"]), [])
        events = s.all_events()
        self.assertEqual(len([e for e in events if e["type"] == "schedule.refused@v1"
                              and e["payload"]["schedule_id"] == refused["id"]]), 1)
        for created in fresh + [c for c, _ in into]:
            self.assertEqual(len([e for e in events if e["type"] == "schedule.fired@v1"
                                  and e["payload"]["schedule_id"] == created["id"]]), 1)

    def test_a_schedule_fired_transform_rewrites_the_prompt_or_refuses_the_slot(self):
        t = Tenant(self.server)
        a = t.ok("POST", "/v1/agents", {"name": unique_name("a"), "model": "local"}, expect=201)
        session = t.ok("POST", "/v1/agents/%s/sessions" % a["id"], {"title": "t"}, expect=201)

        def plugin(pid, source, **manifest):
            m = {"id": pid, "name": pid, "version": "1.0.0", "kind": "lua",
                 "events": ["schedule.fired@v1"]}
            m.update(manifest)
            t.ok("POST", "/v1/plugins", {"manifest": m, "source": source}, expect=201)
            t.ok("POST", "/v1/plugins/%s/enable" % pid, {"agent_id": a["id"]}, expect=200)

        plugin("shout", 'ctx.bus.on("schedule.fired@v1", function(p) '
                        'p.prompt = string.upper(p.prompt) .. " [" .. p.schedule_id .. "]" '
                        'return p end)')
        c = ScheduleClient(self.server, t.token)
        created = c.create(agent_id=a["id"], at=in_seconds(0.5), prompt="wake up",
                           session_id=session["id"])
        c.wait(created["id"], lambda x: x["status"] == "done")
        self.assertEqual([m["content"] for m in c.messages(session["id"]) if m["role"] == "user"],
                         ["WAKE UP [%s]" % created["id"]])
        # A handler that fails in "fail" mode refuses the slot: recorded, nothing posted.
        plugin("gate", 'ctx.bus.on("schedule.fired@v1", function(p) error("closed today") end)',
               failure_mode="fail")
        refused = c.create(agent_id=a["id"], at=in_seconds(0.5), prompt="again",
                           session_id=session["id"])
        done = c.wait(refused["id"], lambda x: x["status"] == "done")
        fire = done["recent_fires"][0]
        self.assertEqual(fire["outcome"], "refused")
        self.assertIn("closed today", fire["error"])
        self.assertIsNone(fire["run_id"])
        self.assertEqual(len([m for m in c.messages(session["id"]) if m["role"] == "user"]), 1)
        events = [e for e in self.server.all_events(token=t.token)
                  if e["type"] == "schedule.refused@v1"]
        self.assertEqual([e["payload"]["schedule_id"] for e in events], [refused["id"]])

    def test_resume_follows_the_missed_policy(self):
        a = self.agent()
        results = {}
        for policy in ("skip", "catch_up_one"):
            session = self.server.create_session(a["id"])
            created = self.c.create(agent_id=a["id"], at=in_seconds(1.5), prompt="p-" + policy,
                                    session_id=session["id"], missed=policy)
            self.server.ok("POST", "/v1/schedules/%s/pause" % created["id"], expect=200)
            results[policy] = (created, session)
        time.sleep(2.0)  # both slots pass while paused
        skip, skip_session = results["skip"]
        resumed = self.server.ok("POST", "/v1/schedules/%s/resume" % skip["id"], expect=200)
        self.assertEqual(resumed["status"], "done")  # a passed one-shot with skip: nothing left
        self.assertIsNone(resumed["next_fire_at"])
        catch, catch_session = results["catch_up_one"]
        resumed = self.server.ok("POST", "/v1/schedules/%s/resume" % catch["id"], expect=200)
        self.assertEqual(resumed["next_fire_at"], catch["at"])  # the missed slot, at once
        self.c.wait(catch["id"], lambda x: x["status"] == "done" and x["recent_fires"])
        time.sleep(0.5)
        self.assertEqual([m["content"] for m in self.c.messages(catch_session["id"])
                          if m["role"] == "user"], ["p-catch_up_one"])
        self.assertEqual(self.c.messages(skip_session["id"]), [])
        self.assertError(self.server.request("POST", "/v1/schedules/%s/resume" % skip["id"]),
                         409, "conflict")

    def test_a_cron_schedule_fires_at_its_first_slot(self):
        # Every minute: its first slot is the next minute boundary, at most a minute away.
        now = datetime.now(timezone.utc)
        wait = 60 - now.second - now.microsecond / 1e6
        a = self.agent()
        session = self.server.create_session(a["id"])
        created = self.c.create(agent_id=a["id"], cron="* * * * *", prompt="tick",
                                session_id=session["id"])
        slot = created["next_fire_at"]
        fired = self.c.wait(created["id"], lambda x: x["recent_fires"], timeout=wait + 5)
        self.assertEqual(fired["recent_fires"][0]["slot"], slot)
        self.assertEqual(parse_time(fired["next_fire_at"]) - parse_time(slot),
                         timedelta(minutes=1))
        self.server.ok("DELETE", "/v1/schedules/" + created["id"], expect=204)

    def test_an_agent_schedules_its_own_follow_up(self):
        s = self.server
        t = Tenant(s)
        a = t.ok("POST", "/v1/agents", {"name": unique_name("a"), "model": "local",
                                        "tools": TOOLS}, expect=201)
        session = t.ok("POST", "/v1/agents/%s/sessions" % a["id"], {"title": "t"}, expect=201)
        user, _ = t.new_token("user")
        st, body, _ = s.request("POST", "/v1/sessions/%s/messages?wait=10" % session["id"],
                                {"content": '/call schedule.create {"prompt": "follow up now", '
                                            '"in_seconds": 1}'}, token=user)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["run"]["status"], "done", body)
        steps = s.ok("GET", "/v1/runs/%s/steps" % body["run"]["id"], token=t.token)["items"]
        tool_steps = [x for x in steps if x["kind"] == "tool"]
        self.assertEqual(tool_steps[0]["status"], "succeeded", tool_steps)
        # An offset past 23:59 is a tool error the model reads, and schedules nothing.
        st, body, _ = s.request("POST", "/v1/sessions/%s/messages?wait=10" % session["id"],
                                {"content": '/call schedule.create {"prompt": "x", '
                                            '"at": "2030-01-01T00:00:00+25:00"}'}, token=user)
        self.assertEqual(st, 200, body)
        steps = s.ok("GET", "/v1/runs/%s/steps" % body["run"]["id"], token=t.token)["items"]
        tool_steps = [x for x in steps if x["kind"] == "tool"]
        self.assertEqual(tool_steps[0]["status"], "failed", tool_steps)
        self.assertIn("at must be an RFC 3339 time", tool_steps[0]["output"]["error"])
        mine = s.list_all("/v1/schedules?agent_id=" + a["id"], token=t.token)
        self.assertEqual(len(mine), 1)
        self.assertEqual(mine[0]["session_id"], session["id"])  # the calling session
        c = ScheduleClient(s, t.token)
        c.wait(mine[0]["id"], lambda x: x["status"] == "done")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            contents = [m["content"] for m in c.messages(session["id"]) if m["role"] == "user"]
            if "follow up now" in contents:
                break
            time.sleep(0.1)
        self.assertIn("follow up now", contents)

        # schedule.list and schedule.cancel see only this agent's schedules.
        later = c.create(agent_id=a["id"], cron="@daily", prompt="daily")
        st, body, _ = s.request("POST", "/v1/sessions/%s/messages?wait=10" % session["id"],
                                {"content": "/call schedule.list {}"}, token=user)
        self.assertEqual(body["run"]["status"], "done", body)
        self.assertIn(later["id"], body["run"]["output"])
        st, body, _ = s.request(
            "POST", "/v1/sessions/%s/messages?wait=10" % session["id"],
            {"content": '/call schedule.cancel {"id": "%s"}' % later["id"]}, token=user)
        self.assertEqual(body["run"]["status"], "done", body)
        self.assertError(s.request("GET", "/v1/schedules/" + later["id"], token=t.token), 404,
                         "not_found")

        # A guest's run may not schedule: create is a write tool (the policy refuses it), and
        # list refuses a guest's run itself.
        guest, _ = t.new_token("guest")
        own = t.ok("POST", "/v1/agents/%s/sessions" % a["id"], {"title": "g"}, expect=201,
                   token=guest)  # a guest reaches only the sessions it opened
        for call, status in (('/call schedule.create {"prompt": "x", "in_seconds": 5}', "denied"),
                             ("/call schedule.list {}", "failed")):
            st, body, _ = s.request("POST", "/v1/sessions/%s/messages?wait=10" % own["id"],
                                    {"content": call}, token=guest)
            self.assertEqual(st, 200, body)
            steps = s.ok("GET", "/v1/runs/%s/steps" % body["run"]["id"], token=t.token)["items"]
            tool_steps = [x for x in steps if x["kind"] == "tool"]
            self.assertEqual(tool_steps[0]["status"], status, (call, tool_steps))
        self.assertEqual(len(s.list_all("/v1/schedules?agent_id=" + a["id"], token=t.token)), 1)

    def test_cli(self):
        a = self.agent()

        def keel(*args):
            env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
            env.update({"KEEL_URL": self.server.base_url, "KEEL_TOKEN": self.server.token})
            return subprocess.run([keel_bin(), *args], capture_output=True, text=True, env=env,
                                  timeout=60, stdin=subprocess.DEVNULL)

        proc = keel("schedule", "add", a["name"], "--cron", "30 8 * * *", "--tz",
                    "America/New_York", "--missed", "catch_up_one", "--name", "standup",
                    "time for standup")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("created schedule", proc.stdout)
        sid = proc.stdout.split("created schedule ")[1].split(":")[0]
        listed = keel("schedule", "list", a["name"])
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertIn(sid, listed.stdout)
        self.assertIn("30 8 * * * (America/New_York)", listed.stdout)
        self.assertIn("time for standup", listed.stdout)
        self.assertEqual(keel("schedule", "pause", sid).returncode, 0)
        self.assertEqual(self.c.get(sid)["status"], "paused")
        resumed = keel("schedule", "resume", sid)
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        self.assertIn("is active; next at", resumed.stdout)
        shown = keel("schedule", "show", sid)
        self.assertIn("standup", shown.stdout)
        self.assertEqual(keel("schedule", "rm", sid).returncode, 0)
        self.assertError(self.server.request("GET", "/v1/schedules/" + sid), 404, "not_found")

        once = keel("--json", "schedule", "add", a["id"], "--at", "+1s", "one shot")
        self.assertEqual(once.returncode, 0, once.stderr)
        self.assertIn('"kind": "once"', once.stdout)
        bad = keel("schedule", "add", a["name"], "--cron", "0 0 30 2 *", "never")
        self.assertEqual(bad.returncode, 1)
        self.assertIn("never fires", bad.stderr)
        usage = keel("schedule", "add", a["name"], "p")
        self.assertEqual(usage.returncode, 2)
        self.assertIn("--cron EXPR or --at TIME", usage.stderr)
        zone = keel("schedule", "add", a["name"], "--cron", "@daily", "--tz", "Nowhere/Land", "p")
        self.assertEqual(zone.returncode, 1)
        self.assertIn("unknown time zone", zone.stderr)


class SchedulesAcrossRestartsTest(KeelTestCase):
    """A server of its own per test: these kill it."""

    def setUp(self):
        self.server = KeelServer()
        self.addCleanup(self.server.stop)
        self.c = ScheduleClient(self.server)
        self.agent = self.server.create_agent()

    def one_shots(self, n, first, spacing, missed="catch_up_one"):
        out = []
        for i in range(n):
            session = self.server.create_session(self.agent["id"], title="s%d" % i)
            created = self.c.create(agent_id=self.agent["id"], at=in_seconds(first + i * spacing),
                                    prompt="slot %d" % i, session_id=session["id"],
                                    missed=missed)
            out.append((created, session))
        return out

    def assert_fired_once(self, created, session):
        done = self.c.wait(created["id"], lambda x: x["status"] == "done", timeout=20)
        self.assertEqual(len(done["recent_fires"]), 1, done)
        self.assertEqual(done["recent_fires"][0]["outcome"], "posted")
        user = [m for m in self.c.messages(session["id"]) if m["role"] == "user"]
        self.assertEqual([m["content"] for m in user], [created["prompt"]],
                         "schedule %s posted %d times" % (created["id"], len(user)))
        self.assertEqual(len(self.c.fired_events(created["id"])), 1)
        return done

    def test_exactly_once_across_kill9_around_the_slots(self):
        # 16 one-shots 60 ms apart; SIGKILL lands in the middle of them, twice.
        shots = self.one_shots(16, first=1.5, spacing=0.06)
        time.sleep(1.5 + 8 * 0.06)
        self.server.kill9()
        self.server.start()
        time.sleep(0.3)
        self.server.kill9()
        self.server.start()
        for created, session in shots:
            self.assert_fired_once(created, session)
        time.sleep(1.2)
        for created, session in shots:
            self.assertEqual(len([m for m in self.c.messages(session["id"])
                                  if m["role"] == "user"]), 1)

    def test_missed_slots_during_downtime_follow_the_policy(self):
        (skip, skip_session), = self.one_shots(1, first=1.0, spacing=0, missed="skip")
        (catch, catch_session), = self.one_shots(1, first=1.0, spacing=0, missed="catch_up_one")
        self.server.kill9()
        time.sleep(2.0)  # both slots pass while no node fires
        self.server.start()
        done = self.c.wait(skip["id"], lambda x: x["status"] == "done")
        self.assertEqual(done["recent_fires"], [])
        self.assertEqual(self.c.messages(skip_session["id"]), [])
        skipped = [e for e in self.server.all_events() if e["type"] == "schedule.skipped@v1"
                   and e["payload"]["schedule_id"] == skip["id"]]
        self.assertEqual(len(skipped), 1)
        self.assertEqual(skipped[0]["payload"]["missed_from"], skip["at"])
        self.assert_fired_once(catch, catch_session)
        fired = self.c.fired_events(catch["id"])
        self.assertTrue(fired[0]["payload"]["missed"])


ON_PG = os.environ.get("KEEL_TEST_STORE") == "postgres"


@unittest.skipUnless(ON_PG, "two nodes need a shared store: runs only with "
                            "KEEL_TEST_STORE=postgres")
class SchedulesOnTwoNodesTest(KeelTestCase):
    """Two nodes on one PostgreSQL database: only the leader fires, and every slot fires exactly
    once, also when the leader is killed among the slots and the other node takes over."""

    def setUp(self):
        self.a = KeelServer()
        self.b = KeelServer(store_url=self.a.store_url, token=self.a.token)
        self.addCleanup(self.a.stop)  # drops the database last
        self.addCleanup(self.b.stop)

    def servers(self):
        return [self.a, self.b]

    def leader(self, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in (self.a, self.b):
                if node.alive() and node.ok("GET", "/healthz", expect=200)["leader"]:
                    return node
            time.sleep(0.1)
        raise AssertionError("no node leads")

    def test_every_slot_fires_exactly_once(self):
        agent = self.a.create_agent()
        shots = []
        # 20 one-shots created alternately through both nodes, 100 ms apart.
        for i in range(20):
            node = (self.a, self.b)[i % 2]
            c = ScheduleClient(node)
            session = node.create_session(agent["id"], title="s%d" % i)
            created = c.create(agent_id=agent["id"], at=in_seconds(1.5 + i * 0.1),
                               prompt="slot %d" % i, session_id=session["id"],
                               missed="catch_up_one")
            shots.append((created, session))
        leader = self.leader()
        follower = self.b if leader is self.a else self.a
        time.sleep(1.5 + 10 * 0.1 - 0.5)
        leader.kill9()  # among the slots: the follower takes over
        c = ScheduleClient(follower)
        for created, session in shots:
            done = c.wait(created["id"], lambda x: x["status"] == "done", timeout=20)
            self.assertEqual(len(done["recent_fires"]), 1, done)
        time.sleep(1.5)
        events = follower.all_events()
        for created, session in shots:
            fired = [e for e in events if e["type"] == "schedule.fired@v1"
                     and e["payload"]["schedule_id"] == created["id"]]
            self.assertEqual(len(fired), 1, created["id"])
            user = [m for m in c.messages(session["id"]) if m["role"] == "user"]
            self.assertEqual([m["content"] for m in user], [created["prompt"]])
        self.assertTrue(self.leader() is follower)


if __name__ == "__main__":
    unittest.main()

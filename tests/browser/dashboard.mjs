// The dashboard in a real headless Chromium (Debian's, driven by playwright-core), against a real
// keel serve started by tests/integration/test_dashboard_browser.py, which passes:
//   KEEL_URL          the server's base URL
//   KEEL_TOKEN        the owner token of a tenant of the test's own
//   KEEL_ADMIN_TOKEN  the platform admin's token (the fleet page is theirs)
//   KEEL_PYTHON       the Python that runs tests/fakes/fake_telegram.py (default python3); the
//                     server must allow 127.0.0.1 as an outbound target and hold secrets
//   KEEL_SLOW_MODEL   a model that streams its answer a word at a time (the OpenAI fake)
//   KEEL_WEB_DIR      the build's copy of web/ (its node_modules has playwright-core, axe-core)
//   KEEL_SCREENSHOTS  where to write screenshots of the main pages
//   CHROMIUM          the browser binary (default /usr/bin/chromium)
// Each check prints "ok - NAME"; the first failure prints "not ok - NAME: why" and exits 1.

import { createRequire } from "node:module";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import path from "node:path";
import fs from "node:fs";
import assert from "node:assert/strict";

const require = createRequire(path.resolve(process.env.KEEL_WEB_DIR, "package.json"));
const { chromium } = require("playwright-core");
const axeSource = require("axe-core").source;

const BASE = process.env.KEEL_URL;
const TOKEN = process.env.KEEL_TOKEN;
const SHOTS = process.env.KEEL_SCREENSHOTS;
const WAIT = 15000;

async function api(method, route, body, token = TOKEN) {
  const res = await fetch(BASE + route, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  const json = text ? JSON.parse(text) : null;
  if (res.status >= 300) throw new Error(`${method} ${route} -> ${res.status}: ${text}`);
  return json;
}

// tests/fakes/fake_telegram.py in a process of its own: it prints its port, and stops when its
// stdin closes. `control` drives it (/_message queues a user's message, /_fail a failure).
const FAKE_TELEGRAM = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "fakes",
  "fake_telegram.py");
const fakes = [];
async function startFakeTelegram() {
  const botId = 7000001;
  const token = `${botId}:AA${randomBytes(18).toString("base64url")}`;
  const proc = spawn(process.env.KEEL_PYTHON || "python3",
    [FAKE_TELEGRAM, "--token", token, "--bot-id", String(botId)],
    { stdio: ["pipe", "pipe", "inherit"] });
  fakes.push(proc);
  const port = await new Promise((resolve, reject) => {
    let out = "";
    proc.stdout.on("data", (d) => {
      out += d;
      if (out.includes("\n")) resolve(Number(out.split("\n")[0].trim()));
    });
    proc.on("exit", (code) => reject(new Error(`fake_telegram.py exited with ${code}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  async function control(method, route, body) {
    const res = await fetch(base + route, {
      method, headers: { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    assert.equal(res.status, 200, `fake telegram ${method} ${route}: ${text}`);
    return JSON.parse(text);
  }
  return { token, base, control };
}

const problems = [];  // console errors and page errors, from every page
function watch(page, label) {
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`${label}: console error: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`${label}: page error: ${e.message}`));
  return page;
}

async function axe(page, label) {
  // Through the debugger protocol, which the page's CSP (rightly) does not let a script tag do.
  if (!(await page.evaluate(() => "axe" in window))) await page.evaluate(axeSource);
  const result = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ["violations"] });
    return r.violations
      .filter((v) => v.impact === "serious" || v.impact === "critical")
      .map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
  });
  assert.deepEqual(result, [], `${label}: axe-core findings`);
}

async function shot(page, name) {
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
}

const checks = [];
function check(name, fn) {
  checks.push([name, fn]);
}

const byTest = (page, id) => page.locator(`[data-testid="${id}"]`);

let browser;
let context;
let page;
const state = {};

check("signs in with a token, which the page then forgets", async () => {
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = watch(await context.newPage(), "main");
  await page.goto(BASE + "/");
  await byTest(page, "signin-token").fill(TOKEN);
  await byTest(page, "signin-submit").click();
  await byTest(page, "nav-agents").waitFor({ timeout: WAIT });
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === "keel_session");
  assert.ok(session, "no keel_session cookie");
  assert.equal(session.httpOnly, true);
  assert.equal(session.sameSite, "Strict");
  state.cookie = session.value;
  // Nothing a script can read holds the token or the cookie.
  const stored = await page.evaluate(() => JSON.stringify([
    document.cookie, { ...localStorage }, { ...sessionStorage }, location.href]));
  assert.ok(!stored.includes(TOKEN), "the token is readable by scripts");
  assert.ok(!stored.includes(state.cookie), "the sign-in is readable by scripts");
  assert.equal(await byTest(page, "signin-token").count(), 0);
});

check("creates an agent", async () => {
  await byTest(page, "nav-agents").click();
  state.agentName = `browser-${Date.now()}`;
  await byTest(page, "agent-create-name").fill(state.agentName);
  await byTest(page, "agent-create-model").fill(process.env.KEEL_SLOW_MODEL);
  await byTest(page, "agent-create-instructions").fill("You are the browser test's agent.");
  await byTest(page, "agent-create-submit").click();
  const row = byTest(page, "agent-row").filter({ hasText: state.agentName });
  await row.waitFor({ timeout: WAIT });
  const agents = await api("GET", "/v1/agents?limit=500");
  state.agent = agents.items.find((a) => a.name === state.agentName);
  assert.ok(state.agent, "the agent is not in the API");
  assert.equal(state.agent.model, process.env.KEEL_SLOW_MODEL);
  await axe(page, "agents");
  await shot(page, "agents");
});

check("chats, and the answer streams in word by word", async () => {
  await byTest(page, "agent-row").filter({ hasText: state.agentName }).locator("a").first().click();
  await byTest(page, "new-session").click();
  await byTest(page, "composer-input").waitFor({ timeout: WAIT });
  state.sessionUrl = page.url();
  await byTest(page, "composer-input").fill("Tell me something");
  await byTest(page, "composer-send").click();
  // Part of the answer shows while the model still streams it...
  const live = byTest(page, "delta-live");
  await live.filter({ hasText: "Streaming one" }).waitFor({ timeout: WAIT });
  const partial = await live.innerText();
  assert.ok(!partial.includes("time."), `not partial: ${partial}`);
  // ...then the stored message replaces it.
  await byTest(page, "message").filter({ hasText: "Streaming one word at a time." })
    .waitFor({ timeout: WAIT });
  await page.waitForFunction(
    () => document.querySelectorAll('[data-testid="delta-live"]').length === 0,
    null, { timeout: WAIT });
  assert.equal(await byTest(page, "message").filter({ hasText: "Tell me something" }).count(), 1);
  await axe(page, "session");
  await shot(page, "session");
});

check("a message with markup is shown as text", async () => {
  const evil = `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><b>bold</b>`;
  await byTest(page, "composer-input").fill(evil);
  await byTest(page, "composer-send").click();
  const shown = byTest(page, "message").filter({ hasText: "<script>window.__pwned=2</script>" });
  await shown.first().waitFor({ timeout: WAIT });
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  assert.equal(await page.locator('[data-testid="message"] img, [data-testid="message"] script, [data-testid="message"] b').count(), 0);
  await byTest(page, "message").filter({ hasText: "Streaming one word at a time." }).nth(1)
    .waitFor({ timeout: WAIT });
});

check("a parked call is approved with amended arguments in the inbox; the run finishes", async () => {
  // An agent whose notes.append waits for a human (the policy says so), and a run parked on it.
  await api("PUT", "/v1/policy", { rules: [
    { tool: "*", rights: ["read", "write"], approval: "never" },
    { tool: "notes.append", rights: ["write"], approval: "always" }] });
  const agent = await api("POST", "/v1/agents",
    { name: `approver-${Date.now()}`, model: "local", tools: ["notes.append"] });
  const session = await api("POST", `/v1/agents/${agent.id}/sessions`, {});
  state.approvalSession = session.id;
  state.approvalAgent = agent.id;
  await page.goto(`${BASE}/#/sessions/${session.id}`);
  await byTest(page, "composer-input").fill('/call notes.append {"line": "as proposed"}');
  await byTest(page, "composer-send").click();
  // Shown inline in the session...
  await byTest(page, "approval-row").first().waitFor({ timeout: WAIT });
  // ...and in the inbox, where a second browser watches too.
  const other = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const watcher = watch(await other.newPage(), "second browser");
  await watcher.goto(BASE + "/");
  await byTest(watcher, "signin-token").fill(TOKEN);
  await byTest(watcher, "signin-submit").click();
  await byTest(watcher, "nav-approvals").click();
  const watched = byTest(watcher, "approval-row").filter({ hasText: "as proposed" });
  await watched.waitFor({ timeout: WAIT });

  await byTest(page, "nav-approvals").click();
  const row = byTest(page, "approval-row").filter({ hasText: "as proposed" });
  await row.waitFor({ timeout: WAIT });
  await axe(page, "approvals");
  await shot(page, "approvals");
  const editor = row.locator('[data-testid="approval-amend"]');
  // Not JSON: the approve button refuses.
  await editor.fill('{"line": ');
  assert.equal(await row.locator('[data-testid="approval-approve"]').isDisabled(), true);
  await editor.fill('{"line": "as amended"}');
  await row.locator('[data-testid="approval-approve"]').click();
  // The second browser sees the decision without reloading.
  await watched.filter({ hasText: /approved/i }).waitFor({ timeout: WAIT });
  await other.close();
  // The run finishes with the amended arguments, and the session view shows it.
  await page.goto(`${BASE}/#/sessions/${session.id}`);
  await byTest(page, "message").filter({ hasText: "as amended" }).first().waitFor({ timeout: WAIT });
  const runs = await api("GET", `/v1/sessions/${session.id}/runs`);
  assert.equal(runs.items[0].status, "done");
});

check("the runs page shows a run's steps, and a scheduled run appears live", async () => {
  await byTest(page, "nav-runs").click();
  await byTest(page, "run-row").first().waitFor({ timeout: WAIT });
  const before = await byTest(page, "run-row").count();
  const at = new Date(Date.now() + 2000).toISOString();
  await api("POST", "/v1/schedules",
    { agent_id: state.agent.id, prompt: "scheduled hello", at, name: "browser once" });
  await page.waitForFunction(
    (n) => document.querySelectorAll('[data-testid="run-row"]').length > n, before,
    { timeout: WAIT + 5000 });
  await axe(page, "runs");
  await shot(page, "runs");
  await byTest(page, "run-row").first().locator("a").first().click();
  await byTest(page, "step-row").first().waitFor({ timeout: WAIT });
  await axe(page, "run");
  await shot(page, "run");
});

check("a schedule is written with a preview of its next slots from the server", async () => {
  await byTest(page, "nav-schedules").click();
  await byTest(page, "schedule-create-agent").selectOption(state.agent.id);
  await byTest(page, "schedule-create-name").fill("weekday mornings");
  await byTest(page, "schedule-create-prompt").fill("good morning");
  await byTest(page, "schedule-create-kind").selectOption("cron");
  await byTest(page, "schedule-create-timezone").fill("Europe/Berlin");
  // A field the parser refuses says why, in the parser's words.
  await byTest(page, "schedule-create-cron").fill("61 9 * * MON-FRI");
  await byTest(page, "cron-error").filter({ hasText: "61" }).waitFor({ timeout: WAIT });
  await byTest(page, "schedule-create-cron").fill("0 9 * * MON-FRI");
  const preview = byTest(page, "cron-preview");
  await preview.locator("time").nth(4).waitFor({ timeout: WAIT });
  const shown = await preview.locator("time").evaluateAll((ts) => ts.map((t) => t.dateTime));
  const expected = await api("GET", "/v1/cron/preview?cron=" + encodeURIComponent("0 9 * * MON-FRI") +
    "&timezone=Europe/Berlin&count=5");
  assert.deepEqual(shown, expected.slots);
  await byTest(page, "schedule-create-submit").click();
  const row = byTest(page, "schedule-row").filter({ hasText: "weekday mornings" });
  await row.waitFor({ timeout: WAIT });
  const made = (await api("GET", `/v1/agents/${state.agent.id}/schedules`)).items
    .find((s) => s.name === "weekday mornings");
  assert.equal(made.next_fire_at, expected.slots[0]);
  await axe(page, "schedules");
  await shot(page, "schedules");
});

check("searches an agent's memory", async () => {
  for (const text of ["the deploy key rotates on fridays", "lunch is at noon"]) {
    await api("POST", `/v1/agents/${state.agent.id}/memories`, { text });
  }
  await page.goto(`${BASE}/#/memory?agent_id=${state.agent.id}`);
  await byTest(page, "memory-query").fill("deploy");
  await byTest(page, "memory-search").click();
  await byTest(page, "memory-row").filter({ hasText: "the deploy key rotates" }).waitFor({ timeout: WAIT });
  assert.equal(await byTest(page, "memory-row").filter({ hasText: "lunch" }).count(), 0);
  await axe(page, "memory");
  await shot(page, "memory");
});

check("the events page follows the log", async () => {
  await byTest(page, "nav-events").click();
  await byTest(page, "event-row").first().waitFor({ timeout: WAIT });
  const before = await byTest(page, "event-row").count();
  await api("POST", "/v1/agents", { name: `late-${Date.now()}`, model: "local" });
  await page.waitForFunction(
    (n) => document.querySelectorAll('[data-testid="event-row"]').length > n, before,
    { timeout: WAIT });
  await axe(page, "events");
  await shot(page, "events");
});

check("usage, the fleet, plugins and an agent's tools are shown, with plots", async () => {
  await byTest(page, "nav-usage").click();
  await byTest(page, "usage-plot-tokens").locator("svg").first().waitFor({ timeout: WAIT });
  await byTest(page, "usage-plot-cost").locator("svg").first().waitFor({ timeout: WAIT });
  // The figures are the API's: today's tokens of the agent that chatted show in its row.
  const today = await api("GET", "/v1/usage");
  const mine = today.agents.find((a) => a.agent_id === state.agent.id);
  assert.ok(mine && mine.output_tokens > 0, JSON.stringify(today));
  await byTest(page, "usage-agent-row").filter({ hasText: state.agentName }).waitFor({ timeout: WAIT });
  await axe(page, "usage");
  await shot(page, "usage");
  // The fleet is the platform admin's: not in this tenant owner's nav.
  assert.equal(await byTest(page, "nav-fleet").count(), 0);
  await byTest(page, "nav-plugins").click();
  await page.locator("main h1, main h2").first().waitFor({ timeout: WAIT });
  await axe(page, "plugins");
  await shot(page, "plugins");
  await page.goto(`${BASE}/#/agents/${state.approvalAgent}`);
  await byTest(page, "agent-tool-row").filter({ hasText: "notes.append" }).waitFor({ timeout: WAIT });
  // Its double-text mode and other settings, edited in the page.
  await byTest(page, "agent-edit-busy").selectOption("reject");
  await byTest(page, "agent-edit-config").fill('{"max_steps": 6}');
  await byTest(page, "agent-edit-submit").click();
  await page.waitForFunction(async (id) => {
    const r = await fetch(`/v1/agents/${id}`, { credentials: "same-origin" });
    const a = await r.json();
    return a.config.busy === "reject" && a.config.max_steps === 6;
  }, state.approvalAgent, { timeout: WAIT });
  await axe(page, "agent");
  await shot(page, "agent");
});

check("a channel's dead reply shows on the channels page, live, with its reason", async () => {
  // A Telegram bot (the fake) whose answer Telegram refuses for good: the reply is dead.
  const tg = await startFakeTelegram();
  const secret = `TG_BROWSER_${Date.now()}`;
  await api("PUT", `/v1/secrets/${secret}`, { value: tg.token });
  const agent = await api("POST", "/v1/agents", { name: `telegram-${Date.now()}`, model: "local" });
  await api("PUT", `/v1/agents/${agent.id}/access`, { level: "public" });
  const ch = await api("POST", `/v1/agents/${agent.id}/channels`, { kind: "telegram", name: "tg",
    settings: { bot_token: secret, api_base: tg.base, poll_timeout: 1 } });
  state.channel = ch;
  state.channelAgent = agent;
  await byTest(page, "nav-channels").click();
  const row = page.locator(`[data-testid="channel-row"][data-id="${ch.id}"]`);
  await row.waitFor({ timeout: WAIT });
  assert.equal(await row.getAttribute("data-status"), "ready");
  assert.match(await row.innerText(), /No hook URL/);
  await tg.control("POST", "/_fail", { method: "sendMessage", answers: [
    { status: 403, description: "Forbidden: bot was blocked by the user" }] });
  await tg.control("POST", "/_message", { chat_id: 111, text: "doomed" });
  // Shown without a reload, marked, with Telegram's reason.
  const dead = row.locator('[data-testid="channel-reply"][data-status="dead"]');
  await dead.waitFor({ timeout: 30000 });
  assert.match(await dead.locator('[data-testid="channel-reply-error"]').innerText(),
    /bot was blocked by the user/);
  assert.match(await dead.innerText(), /You said: "doomed"/);
  await row.locator('[data-testid="channel-failed-count"]', { hasText: "1 dead" })
    .waitFor({ timeout: WAIT });
  const replies = (await api("GET", `/v1/channels/${ch.id}/replies`)).items;
  assert.deepEqual(replies.map((r) => r.status), ["dead"]);
  assert.equal(await dead.getAttribute("data-id"), replies[0].id);
  // A sent answer comes after the dead one, which stays first.
  await tg.control("POST", "/_message", { chat_id: 222, text: "fine" });
  await row.locator('[data-testid="channel-reply"][data-status="sent"]').waitFor({ timeout: 30000 });
  assert.equal(await row.locator('[data-testid="channel-reply"]').first().getAttribute("data-status"),
    "dead");
  await axe(page, "channels");
  await shot(page, "channels");
  // Its own page: the whole outbox, dead first; the run's link.
  await row.locator(`a[href="#/channels/${ch.id}"]`).first().click();
  await page.locator("h1", { hasText: "tg" }).waitFor({ timeout: WAIT });
  const first = byTest(page, "channel-reply").first();
  await first.waitFor({ timeout: WAIT });
  assert.equal(await first.getAttribute("data-status"), "dead");
  assert.equal(await first.locator(`a[href="#/runs/${replies[0].run_id}"]`).count(), 1);
  await axe(page, "channel");
  await shot(page, "channel");
  // The owner disables it; the API agrees, and the page shows it live.
  await byTest(page, "channel-disable").click();
  await page.locator(`[data-testid="channel-row"][data-status="disabled"]`).waitFor({ timeout: WAIT });
  assert.equal((await api("GET", `/v1/channels/${ch.id}`)).enabled, false);
  await byTest(page, "channel-enable").waitFor({ timeout: WAIT });
  // The agent's page lists it, linking to it.
  await page.goto(`${BASE}/#/agents/${agent.id}`);
  const listed = byTest(page, "agent-channel-row").filter({ hasText: "tg" });
  await listed.waitFor({ timeout: WAIT });
  assert.equal(await listed.getAttribute("data-status"), "disabled");
});

check("a user reads the channels without changing them; a guest is told they are not theirs", async () => {
  const ch = state.channel;
  for (const role of ["user", "guest"]) {
    const { token } = await api("POST", "/v1/tokens", { name: `browser-${role}-${Date.now()}`, role });
    const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const p = watch(await ctx.newPage(), role);
    await p.goto(BASE + "/");
    await byTest(p, "signin-token").fill(token);
    await byTest(p, "signin-submit").click();
    await byTest(p, "nav-agents").waitFor({ timeout: WAIT });
    if (role === "user") {
      await byTest(p, "nav-channels").click();
      const row = p.locator(`[data-testid="channel-row"][data-id="${ch.id}"]`);
      await row.locator('[data-testid="channel-reply"][data-status="dead"]').waitFor({ timeout: WAIT });
      assert.equal(await p.locator('[data-testid="channel-enable"], [data-testid="channel-disable"]').count(), 0);
    } else {
      // The API refuses a guest the channels (403): not in its navigation, and the page says so.
      assert.equal(await byTest(p, "nav-channels").count(), 0);
      for (const route of ["#/channels", `#/channels/${ch.id}`]) {
        await p.goto(`${BASE}/${route}`);
        await p.locator("h1", { hasText: "Not for guests" }).waitFor({ timeout: WAIT });
      }
      await p.goto(`${BASE}/#/agents/${state.channelAgent.id}`);
      await p.locator("h1", { hasText: state.channelAgent.name }).waitFor({ timeout: WAIT });
      await p.getByText("need an owner or user token").first().waitFor({ timeout: WAIT });
      assert.equal(await byTest(p, "agent-channel-row").count(), 0);
    }
    await axe(p, `channels as a ${role}`);
    await ctx.close();
  }
});

check("the platform admin watches the fleet live, in plots", async () => {
  const admin = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const apage = watch(await admin.newPage(), "platform admin");
  await apage.goto(BASE + "/");
  await byTest(apage, "signin-token").fill(process.env.KEEL_ADMIN_TOKEN);
  await byTest(apage, "signin-submit").click();
  await byTest(apage, "nav-fleet").click();
  await byTest(apage, "fleet-node").first().waitFor({ timeout: WAIT });
  await byTest(apage, "fleet-plot-turns").locator("svg").first().waitFor({ timeout: WAIT });
  await byTest(apage, "fleet-plot-runs").locator("svg").first().waitFor({ timeout: WAIT });
  assert.equal(await byTest(apage, "fleet-node").count(), 1);
  await apage.waitForTimeout(2500);  // a few snapshots of the once-a-second feed
  await axe(apage, "fleet");
  await shot(apage, "fleet");
  await apage.setViewportSize({ width: 390, height: 844 });
  await apage.waitForTimeout(300);
  const overflow = await apage.evaluate(
    () => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 1, `fleet: the page is ${overflow}px wider than the phone`);
  await shot(apage, "phone-fleet");
  await admin.close();
});

check("works at a phone's width", async () => {
  await page.setViewportSize({ width: 390, height: 844 });
  for (const [nav, name] of [["nav-agents", "agents"], ["nav-approvals", "approvals"],
    ["nav-runs", "runs"], ["nav-schedules", "schedules"], ["nav-usage", "usage"],
    ["nav-channels", "channels"], ["nav-events", "events"]]) {
    await byTest(page, nav).click();
    await page.waitForTimeout(300);
    const overflow = await page.evaluate(
      () => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    assert.ok(overflow <= 1, `${name}: the page is ${overflow}px wider than the phone`);
    await shot(page, `phone-${name}`);
  }
  await page.goto(BASE + "/" + new URL(state.sessionUrl).hash);
  await byTest(page, "composer-input").waitFor({ timeout: WAIT });
  await shot(page, "phone-session");
  await page.setViewportSize({ width: 1280, height: 800 });
});

check("signing out ends the sign-in: its cookie no longer works", async () => {
  await byTest(page, "signout").click();
  await byTest(page, "signin-token").waitFor({ timeout: WAIT });
  const res = await fetch(BASE + "/v1/agents", { headers: { Cookie: `keel_session=${state.cookie}` } });
  assert.equal(res.status, 401);
  assert.equal((await context.cookies()).filter((c) => c.name === "keel_session").length, 0);
  await page.reload();
  await byTest(page, "signin-token").waitFor({ timeout: WAIT });
});

check("no console errors on any page", async () => {
  assert.deepEqual(problems, []);
});

browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
let failed = false;
try {
  for (const [name, fn] of checks) {
    try {
      await fn();
      console.log(`ok - ${name}`);
    } catch (e) {
      console.log(`not ok - ${name}: ${e.stack || e}`);
      if (page) await shot(page, "failure").catch(() => {});
      failed = true;
      break;
    }
  }
} finally {
  await browser.close();
  for (const proc of fakes) proc.stdin.end();
}
process.exit(failed ? 1 : 0);

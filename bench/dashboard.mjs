// The dashboard's load and rendering figures, in headless Chromium (playwright-core) against a
// running keel serve (scripts/bench.sh section 10 starts it):
//   - first load: the bytes the browser fetched for the page (compressed, as sent) and the time
//     from navigation until the signed-in agents page is interactive (its nav and list shown);
//   - a transcript of 10,000 messages: the time from navigation to the session until its last
//     message is on screen, and the frame times while it is scrolled from bottom to top.
// Env: KEEL_URL, KEEL_TOKEN, KEEL_WEB_DIR (the build's web/, for playwright-core), CHROMIUM.
// Prints one JSON object.

import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.resolve(process.env.KEEL_WEB_DIR, "package.json"));
const { chromium } = require("playwright-core");

const BASE = process.env.KEEL_URL;
const TOKEN = process.env.KEEL_TOKEN;
const MESSAGES = 10000;

async function api(method, route, body, headers = {}) {
  const res = await fetch(BASE + route, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json", ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (res.status >= 300) throw new Error(`${method} ${route} -> ${res.status}: ${await res.text()}`);
  return { body: await res.json(), headers: res.headers };
}

// A session of 10,000 messages, opened in one request through the OpenAI-compatible front door
// (the conversation before the last message seeds it).
const agent = (await api("POST", "/v1/agents", { name: `bench-${Date.now()}`, model: "local" })).body;
const conversation = [];
for (let i = 0; i < MESSAGES - 1; i++) {
  conversation.push({ role: i % 2 ? "assistant" : "user", content: `message ${i}: ${"lorem ipsum ".repeat(i % 7 + 1)}` });
}
const opened = await api("POST", "/v1/chat/completions", { model: agent.id, messages: conversation });
const sessionId = opened.headers.get("x-keel-session");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
const out = {};
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  // Sign in once (the cookie), then measure a cold load of the signed-in page.
  await page.goto(BASE + "/");
  await page.fill('[data-testid="signin-token"]', TOKEN);
  await page.click('[data-testid="signin-submit"]');
  await page.waitForSelector('[data-testid="nav-agents"]');

  const cold = await context.newPage();
  const cdp = await context.newCDPSession(cold);
  await cdp.send("Network.enable");
  await cdp.send("Network.setCacheDisabled", { cacheDisabled: true });
  let bytes = 0;
  cdp.on("Network.loadingFinished", (e) => { bytes += e.encodedDataLength; });
  const t0 = Date.now();
  await cold.goto(BASE + "/#/agents");
  await cold.waitForSelector('[data-testid="agent-row"]');
  out.first_load_interactive_ms = Date.now() - t0;
  await cold.waitForLoadState("networkidle");
  out.first_load_bytes = bytes;
  await cold.close();

  // The transcript.
  const t1 = Date.now();
  await page.goto(`${BASE}/#/sessions/${sessionId}`);
  await page.waitForFunction(
    (n) => document.querySelectorAll('[data-testid="message"]').length >= n, MESSAGES,
    { timeout: 60000, polling: 16 });
  await page.locator('[data-testid="message"]').last().waitFor({ state: "visible" });
  out.transcript_messages = await page.locator('[data-testid="message"]').count();
  out.transcript_render_ms = Date.now() - t1;
  // Scroll from the bottom to the top in steps of one screen a frame, timing each frame.
  out.transcript_scroll = await page.evaluate(async () => {
    const scroller = (() => {
      let el = document.querySelector('[data-testid="message"]');
      while (el && el !== document.body) {
        const s = getComputedStyle(el);
        if (/(auto|scroll)/.test(s.overflowY) && el.scrollHeight > el.clientHeight) return el;
        el = el.parentElement;
      }
      return document.scrollingElement;
    })();
    scroller.scrollTop = scroller.scrollHeight;
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    const frames = [];
    let last = performance.now();
    while (scroller.scrollTop > 0 && frames.length < 2000) {
      scroller.scrollTop -= scroller.clientHeight;
      await new Promise((r) => requestAnimationFrame(r));
      const now = performance.now();
      frames.push(now - last);
      last = now;
    }
    frames.sort((a, b) => a - b);
    const at = (q) => frames[Math.min(frames.length - 1, Math.floor(q * frames.length))];
    return { frames: frames.length, p50_ms: at(0.5), p95_ms: at(0.95), max_ms: frames[frames.length - 1] };
  });
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));

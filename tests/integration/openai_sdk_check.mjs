// The official `openai` npm package against Keel's OpenAI-compatible front door
// (docs/API.md section 23), run by test_openai_front.py: KEEL_URL (the API's base URL, .../v1),
// KEEL_TOKEN (a token of the tenant), KEEL_AGENT (an agent's name on the local model),
// KEEL_MODULES (the node_modules directory holding openai). Prints
// "openai sdk: all checks passed" or exits non-zero naming the check that failed.
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(process.env.KEEL_MODULES + "/");
const { OpenAI } = require("openai");

const client = new OpenAI({ baseURL: process.env.KEEL_URL, apiKey: process.env.KEEL_TOKEN });
const model = process.env.KEEL_AGENT;

async function check(name, fn) {
  try {
    await fn();
    console.log("ok:", name);
  } catch (e) {
    console.error("FAILED:", name, "\n", e);
    process.exit(1);
  }
}

await check("models.list names the agent", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(model), JSON.stringify(ids));
});

let session;
await check("a completion, not streamed", async () => {
  const { data, response } = await client.chat.completions
    .create({ model: `agent:${model}`, messages: [{ role: "user", content: "hello sdk" }] })
    .withResponse();
  assert.equal(data.object, "chat.completion");
  assert.equal(data.choices[0].message.content, 'You said: "hello sdk"');
  assert.equal(data.choices[0].finish_reason, "stop");
  assert.ok(data.usage.total_tokens > 0);
  session = response.headers.get("x-keel-session");
  assert.ok(session, "no X-Keel-Session header");
});

await check("a completion, streamed", async () => {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "stream to the sdk" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, 'You said: "stream to the sdk"');
  assert.equal(finish, "stop");
  assert.ok(usage && usage.completion_tokens > 0, JSON.stringify(usage));
});

await check("a multi-turn conversation, resent whole", async () => {
  const messages = [
    { role: "system", content: "Be brief." },
    { role: "user", content: "first" },
  ];
  const one = await client.chat.completions.create({ model, messages });
  messages.push(one.choices[0].message, { role: "user", content: "second" });
  const two = await client.chat.completions.create({ model, messages });
  assert.equal(two.choices[0].message.content, 'You said: "second"');
});

await check("a conversation continued with the session header", async () => {
  const next = await client.chat.completions.create(
    { model, messages: [{ role: "user", content: "again" }] },
    { headers: { "X-Keel-Session": session } },
  );
  assert.equal(next.choices[0].message.content, 'You said: "again"');
});

await check("errors arrive as the SDK's error classes", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "no-such-agent", messages: [{ role: "user", content: "x" }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found",
  );
  await assert.rejects(
    client.chat.completions.create({
      model,
      messages: [{ role: "user", content: "x" }],
      tools: [{ type: "function", function: { name: "f", parameters: {} } }],
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "tools",
  );
  const stranger = new OpenAI({ baseURL: process.env.KEEL_URL, apiKey: "not-a-token", maxRetries: 0 });
  await assert.rejects(
    stranger.chat.completions.create({ model, messages: [{ role: "user", content: "x" }] }),
    (e) => e instanceof OpenAI.AuthenticationError,
  );
});

console.log("openai sdk: all checks passed");

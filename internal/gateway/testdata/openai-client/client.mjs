// Compatibility check of the pagewarden gateway against the official
// openai client. Run by node_test.go with PW_BASE_URL and PW_API_KEY set;
// prints one JSON line of results and exits non-zero on any failure.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.PW_BASE_URL, apiKey: process.env.PW_API_KEY, maxRetries: 0 });
const model = process.env.PW_MODEL;
const results = {};

function fail(msg) {
  console.log(JSON.stringify({ ok: false, error: msg, results }));
  process.exit(1);
}

// 1. A chat request.
const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Hi" }], max_tokens: 64,
});
results.chat = { content: chat.choices[0].message.content, finish: chat.choices[0].finish_reason, usage: chat.usage };

// 2. A streamed chat request with usage.
let text = "";
let finish = null;
let usage = null;
const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Hi" }], max_tokens: 64, stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    text += c.delta?.content ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
}
results.stream = { content: text, finish, usage };

// 3. An over-long prompt is a typed BadRequestError.
try {
  await client.completions.create({ model, prompt: "x".repeat(Number(process.env.PW_LONG_CHARS)), max_tokens: 16 });
  fail("over-long prompt was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError)) fail("over-long prompt: not a BadRequestError: " + e);
  results.tooLong = { status: e.status, code: e.code, type: e.type };
}

// 4. A stream that fails after its first bytes must throw, not end quietly.
try {
  const s = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: Number(process.env.PW_FAIL_MAX_TOKENS), stream: true,
  });
  let got = "";
  for await (const chunk of s) got += chunk.choices[0]?.delta?.content ?? "";
  fail("failed stream ended without an error after " + JSON.stringify(got));
} catch (e) {
  if (!(e instanceof OpenAI.APIError)) fail("failed stream: not an APIError: " + e);
  results.failedStream = { message: e.message };
}

console.log(JSON.stringify({ ok: true, results }));

// n > 1 through the official openai client: chat and completions with
// n = 4, streamed (stream_options.include_usage) and not. Each choice i
// must equal the single-choice answer with seed + i, the streamed
// choices the non-streamed ones, and usage must count the prompt once and
// every choice's tokens. Run by internal/node's TestOpenAINodeClientChoices
// with PW_BASE_URL, PW_API_KEY and PW_MODEL set; prints one JSON line and
// exits non-zero on any failure.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.PW_BASE_URL, apiKey: process.env.PW_API_KEY, maxRetries: 0 });
const model = process.env.PW_MODEL;
const results = {};

function fail(msg) {
  console.log(JSON.stringify({ ok: false, error: msg, results }));
  process.exit(1);
}

const n = 4;
const seed = 42;
const endpoints = {
  chat: {
    req: { model, messages: [{ role: "user", content: "Tell me a story." }], max_tokens: 16, temperature: 1 },
    create: (r) => client.chat.completions.create(r),
    text: (c) => c.message.content,
    delta: (c) => c.delta?.content ?? "",
  },
  completions: {
    req: { model, prompt: "Once upon a time", max_tokens: 16, temperature: 1 },
    create: (r) => client.completions.create(r),
    text: (c) => c.text,
    delta: (c) => c.text ?? "",
  },
};

for (const [name, ep] of Object.entries(endpoints)) {
  const all = await ep.create({ ...ep.req, n, seed });
  if (all.choices.length !== n) fail(`${name}: ${all.choices.length} choices`);
  let sum = 0;
  let prompt = null;
  for (let i = 0; i < n; i++) {
    const c = all.choices[i];
    if (c.index !== i) fail(`${name}: choice ${i} has index ${c.index}`);
    const one = await ep.create({ ...ep.req, seed: seed + i });
    if (ep.text(one.choices[0]) !== ep.text(c) || one.choices[0].finish_reason !== c.finish_reason)
      fail(`${name}: choice ${i} ${JSON.stringify(ep.text(c))} != seed ${seed + i}'s ${JSON.stringify(ep.text(one.choices[0]))}`);
    sum += one.usage.completion_tokens;
    prompt = one.usage.prompt_tokens;
  }
  const u = all.usage;
  if (u.prompt_tokens !== prompt || u.completion_tokens !== sum || u.total_tokens !== prompt + sum)
    fail(`${name}: usage ${JSON.stringify(u)}, want prompt ${prompt} and completion ${sum}`);

  const texts = Array(n).fill("");
  const finishes = Array(n).fill(null);
  let usage = null;
  for await (const chunk of await ep.create({ ...ep.req, n, seed, stream: true, stream_options: { include_usage: true } })) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] += ep.delta(c);
      if (c.finish_reason) finishes[c.index] = c.finish_reason;
    }
  }
  for (let i = 0; i < n; i++) {
    if (texts[i] !== ep.text(all.choices[i]) || finishes[i] !== all.choices[i].finish_reason)
      fail(`${name}: streamed choice ${i} ${JSON.stringify(texts[i])} (${finishes[i]}) != ${JSON.stringify(ep.text(all.choices[i]))}`);
  }
  if (!usage || usage.completion_tokens !== sum || usage.prompt_tokens !== prompt) fail(`${name}: streamed usage ${JSON.stringify(usage)}`);
  results[name] = { texts, usage: u, distinct: new Set(texts).size };
}

try {
  await client.completions.create({ model, prompt: "x", n: 129 });
  fail("n = 129 was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError)) fail("n = 129: not a BadRequestError: " + e);
  results.refused = { status: e.status, param: e.param };
}

console.log(JSON.stringify({ ok: true, results }));

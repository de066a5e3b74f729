// Structured output through the official openai client: response_format
// json_schema (strict) and json_object, streamed and not, every finished
// answer validated with Ajv (an independent JSON Schema validator); an
// unsupported keyword must be a typed BadRequestError naming
// response_format. Run by internal/node's TestOpenAINodeClientStructured
// with PW_BASE_URL, PW_API_KEY and PW_MODEL set; prints one JSON line and
// exits non-zero on any failure.
import OpenAI from "openai";
import Ajv from "ajv";

const client = new OpenAI({ baseURL: process.env.PW_BASE_URL, apiKey: process.env.PW_API_KEY, maxRetries: 0 });
const model = process.env.PW_MODEL;
const results = { finished: 0, cut: 0, answers: [] };

function fail(msg) {
  console.log(JSON.stringify({ ok: false, error: msg, results }));
  process.exit(1);
}

const schema = {
  type: "object",
  properties: {
    kind: { enum: ["cat", "dog", 3] },
    ok: { type: "boolean" },
    n: { type: "integer" },
    more: { type: "array", items: { type: ["boolean", "null"] } },
  },
  required: ["kind", "ok", "n", "more"],
  additionalProperties: false,
};
const validate = new Ajv({ strict: true }).compile(schema);
results.schema = JSON.stringify(schema); // the Go side checks cut answers against it
const formats = [
  { type: "json_schema", json_schema: { name: "pet", strict: true, schema } },
  { type: "json_object" },
];

function check(format, content, finish) {
  results.answers.push({ format: format.type, content, finish });
  if (finish === "length") {
    results.cut++;
    return; // cut by max_tokens: a prefix (the Go side checks it)
  }
  if (finish !== "stop") fail(`finish ${finish}`);
  let v;
  try {
    v = JSON.parse(content);
  } catch (e) {
    fail(`not JSON: ${JSON.stringify(content)}: ${e}`);
  }
  if (format.type === "json_schema" && !validate(v)) fail(`invalid: ${content}: ${JSON.stringify(validate.errors)}`);
  if (format.type === "json_object" && (typeof v !== "object" || v === null || Array.isArray(v))) fail(`not an object: ${content}`);
  results.finished++;
}

for (const format of formats) {
  for (const seed of [1, 2, 3, 4, 5]) {
    const req = { model, messages: [{ role: "user", content: "A pet, as JSON." }], max_tokens: 48, temperature: 1, seed, response_format: format };
    const c = await client.chat.completions.create(req);
    check(format, c.choices[0].message.content, c.choices[0].finish_reason);
    let text = "";
    let finish = null;
    for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
      for (const ch of chunk.choices) {
        text += ch.delta?.content ?? "";
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    if (text !== c.choices[0].message.content) fail(`streamed ${JSON.stringify(text)} != ${JSON.stringify(c.choices[0].message.content)}`);
    check(format, text, finish);
  }
}

try {
  await client.chat.completions.create({
    model, messages: [{ role: "user", content: "x" }],
    response_format: { type: "json_schema", json_schema: { name: "bad", schema: { type: "string", pattern: "^a" } } },
  });
  fail("a pattern keyword was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError)) fail("pattern: not a BadRequestError: " + e);
  results.refused = { status: e.status, param: e.param, code: e.code, message: e.message };
}

// Tool calls through the client's own runner: with a named tool_choice,
// runTools parses the tool_calls, calls the function with the parsed
// arguments once and stops. Streamed and not.
const pingParams = { type: "object", properties: { ok: { type: "boolean" }, n: { type: "integer" } }, required: ["ok", "n"], additionalProperties: false };
const validPing = new Ajv({ strict: true }).compile(pingParams);
results.calls = [];
for (const stream of [false, true]) {
  for (const seed of [1, 2, 3]) {
    let got = null;
    const runner = client.beta.chat.completions.runTools({
      model, messages: [{ role: "user", content: "ping" }], max_tokens: 120, temperature: 1, seed, stream,
      tools: [{ type: "function", function: { name: "ping", parameters: pingParams, function: (args) => { got = args; return "pong"; }, parse: JSON.parse } }],
      tool_choice: { type: "function", function: { name: "ping" } },
    });
    try {
      await runner.done();
    } catch (e) {
      fail(`runTools (stream ${stream}, seed ${seed}): ${e}`);
    }
    const calls = (await runner.allChatCompletions()).flatMap((c) => c.choices[0].message.tool_calls ?? []);
    results.calls.push({ stream, seed, args: got, calls: calls.length });
    if (got === null) {
      const finish = (await runner.allChatCompletions())[0]?.choices[0]?.finish_reason;
      if (finish !== "length") fail(`runTools (stream ${stream}, seed ${seed}): the function was not called (finish ${finish})`);
      continue;
    }
    if (!validPing(got)) fail(`ping(${JSON.stringify(got)}): ${JSON.stringify(validPing.errors)}`);
    results.pinged = (results.pinged ?? 0) + 1;
  }
}

console.log(JSON.stringify({ ok: true, results }));

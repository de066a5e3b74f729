// Package gateway is pagewarden's OpenAI-compatible, multi-tenant HTTP API.
//
// It promises invariants I9 and I10 of DESIGN.md at the HTTP boundary:
//
//   - The tenant comes only from the API key (Authorization: Bearer KEY,
//     checked against SHA-256 hashes in constant time); a cache_salt in the
//     body is passed through in request.Params.CacheSalt, under the tenant.
//     Request ids are random 128-bit values, and the backend is asked to
//     abort only (tenant, id) pairs, so a tenant can act only on its own.
//   - A response is 200 only when the backend's terminal Result is a
//     verified success (stop or length) with consistent usage. Errors before
//     the first byte are HTTP errors with an OpenAI-style body
//     {"error":{"message","type","param","code"}}; after it, a stream ends
//     with one SSE event "data: {"error":{...}}" and never with [DONE].
//   - Every token and the Result carry the owner the engine produced them
//     for; the gateway compares it with the connection's owner before
//     writing. A mismatch is never written: it is counted
//     (pagewarden_response_owner_mismatch_total) and the request fails 500.
//   - Over-long requests are refused with 400 context_length_exceeded, with
//     the numbers, before Submit, so no KV page is allocated for them:
//     accepted iff prompt tokens + max_tokens <= Limits.MaxContext.
//   - Error bodies carry only messages written here; internal causes are
//     logged (one slog line per request, without prompt text unless
//     Config.LogPrompts), never sent.
//
// Every known request field is honoured, accepted or refused (fields.go
// holds the tables; TestRequestSchema checks them against OpenAI's chat
// and completion request schemas, field by field). A sampling knob is
// never silently ignored:
//
//	honoured, both endpoints   model, max_tokens, max_completion_tokens,
//	                           temperature, top_p, seed, stop, stream,
//	                           stream_options (include_usage),
//	                           presence_penalty and frequency_penalty
//	                           ([-2, 2], over generated tokens),
//	                           logit_bias (≤ 300 ids in the vocabulary,
//	                           [-100, 100], -100 bans); vLLM's top_k,
//	                           min_p, repetition_penalty, ignore_eos,
//	                           stop_token_ids (≤ 64 ids in the vocabulary;
//	                           finish "stop", the token's text not shown),
//	                           cache_salt, guided_json (a JSON Schema, as
//	                           an object or a string), n (1 to 128
//	                           choices, fanout.go), prompt_logprobs (0 to
//	                           20 alternatives per prompt token, vLLM's
//	                           shape; not streamed; logprobs.go)
//	honoured, chat             logprobs, top_logprobs (0 to 20, with
//	                           logprobs: true; logprobs.go),
//	                           messages (roles system, developer, user,
//	                           assistant with tool_calls, tool),
//	                           add_generation_prompt, response_format
//	                           (text, json_object, json_schema with
//	                           strict), tools (functions, ≤ 128),
//	                           tool_choice ("none", "auto" with a Hermes,
//	                           Llama 3 or Mistral template, "required", a
//	                           named function), parallel_tool_calls (false:
//	                           "auto" keeps the first call)
//	honoured, completions      prompt (text or token ids; a list of either
//	                           is a batch), echo, suffix (fill-in-the-middle
//	                           with the model's FIM tokens, fim.go),
//	                           logprobs (0 to 20 alternatives: vLLM's
//	                           bound, OpenAI's is 5; with echo, the prompt
//	                           tokens' entries first; logprobs.go), best_of
//	                           (n to 128 candidates, the n most likely
//	                           returned; not streamed; fanout.go)
//	accepted (no effect)       user; chat: metadata (≤ 16 pairs),
//	                           prompt_cache_key, prompt_cache_retention,
//	                           safety_identifier
//	refused unless default     chat: functions ([]),
//	                           function_call ("none"), modalities (["text"]),
//	                           audio, prediction, reasoning_effort,
//	                           verbosity, web_search_options, service_tier
//	                           ("auto", "default"), store (false: stored
//	                           completions cannot be read back here);
//	                           completions: top_logprobs (its
//	                           alternatives are counted in logprobs);
//	                           suffix with a model that has no
//	                           fill-in-the-middle tokens (fim.go), or with
//	                           a prompt of token ids
//	refused (vLLM, llama.cpp)  guided_regex, guided_choice,
//	                           guided_grammar, guided_decoding_backend,
//	                           guided_whitespace_pattern, structured_outputs,
//	                           grammar, json_schema, min_tokens (0),
//	                           use_beam_search (false), length_penalty (1),
//	                           allowed_token_ids, bad_words ([]),
//	                           include_stop_str_in_output (false),
//	                           truncate_prompt_tokens;
//	                           chat: echo (false), continue_final_message
//	                           (false), chat_template, chat_template_kwargs,
//	                           documents
//
// A refused field is a 400 unsupported_parameter naming it unless it is
// absent, null or one of the defaults in parentheses (values that ask for
// what the server does anyway). Unknown fields are accepted and ignored,
// as OpenAI's server does.
//
// Structured output (response_format, guided_json) is constrained
// decoding: package grammar compiles the schema into an automaton and the
// engine masks every draw with it, so the output parses and validates (or,
// cut by max_tokens, is a prefix of such output, with finish "length").
// The JSON Schema subset is package grammar's: type, properties, required,
// additionalProperties (false), items, minItems/maxItems, enum, const,
// anyOf/oneOf whose branches begin differently, $ref to $defs; any other
// keyword is a 400 unsupported_parameter naming response_format (or
// guided_json) and the keyword. strict: true needs every property required and
// additionalProperties: false, as OpenAI's does. Properties come in the
// schema's order, with at most one space between tokens. Not with
// ignore_eos (the value ends with the end-of-sequence token).
//
// Tool calls: the tools reach the model through its chat template's tools
// variable; with tool_choice "required" or a named function the output is
// constrained to {"name": NAME, "arguments": ARGS} (a grammar.ToolCall:
// NAME one of the functions, ARGS valid for its parameters, under the
// function's own strict flag) and answered as OpenAI's tool_calls (one
// call, finish "tool_calls"; streamed as an id/type/name delta, then
// argument deltas). "auto", the default with tools, is unconstrained and
// the calls are parsed out of the answer in the syntax the template
// teaches: Hermes' <tool_call>{"name", "arguments"}</tool_call> (Hermes 2
// Pro, Hermes 3, Qwen 2.5), Llama 3's whole-answer {"name",
// "parameters"} objects separated by ";" (Llama 3.1-3.3) or Mistral's
// whole-answer [TOOL_CALLS][{"name", "arguments"}, ...] (Mistral Nemo).
// The text before
// the first call is the content, each well-formed call of an offered
// function a tool_call (finish "tool_calls"), anything else stays text;
// streamed, the content goes out until a call may begin and the calls come
// whole at the end. With a template that teaches none of them, "auto" is
// refused.
// Assistant messages may carry tool_calls (arguments given as a JSON
// string become an object for the template, as vLLM passes them), and
// tool messages need tool_call_id.
//
// Several choices (n > 1, and completions' prompt lists) are a fan-out
// (fanout.go): one child request per choice, each a whole request of the
// authenticated tenant with the prompt, cache salt and max_tokens of the
// request; choice i of a prompt samples with seed + i (uint64, wrapping),
// so it is exactly the single answer to the same request with seed + i,
// and greedy choices are the same text. A prompt's first choice is
// submitted first and its siblings once it delivered its first token: its
// full prompt pages are then in the tenant-scoped prefix cache (same
// tenant and salt: the isolation rules of any hit), and the siblings
// attach them read-only instead of computing them again. Admission charges
// every sequence's worst case (tokens: the prompts + n × max_tokens each;
// pages: n × one sequence's, summed over the prompts), and a request whose
// sequences can never fit the tenant's page budget is a 400
// kv_page_limit_exceeded naming n (prompt for a batch of single choices);
// an omitted max_tokens is shared among them. Choice k*n + i answers
// prompt k; streamed, chunks carry their choice's index and interleave
// (one writer at a time), each choice has its own finish chunk, and one
// usage chunk ends the stream. usage counts each prompt once, every
// choice's tokens, and the cached tokens of each prompt's first choice.
// The answer is whole or an error: a failed choice aborts its siblings
// and fails the response (an SSE error event once streaming began); a
// client that hangs up aborts every choice. Each choice is audited like a
// single answer. best_of (completions) is the same fan-out of best_of
// candidates per prompt (seed + i), the engine computing every token's
// log-probability, and the n of highest cumulative log-probability
// (vLLM's cumulative_logprob: every generated token, end-of-generation
// included; ties to the earlier candidate) returned in that order as
// choices k*n + i; usage counts every candidate's tokens, as all were
// generated.
//
// Log-probabilities (logprobs.go) are the raw model distribution's (a
// log-softmax over the vocabulary of the logits before logit bias,
// penalties, temperature, filters and output constraint, as OpenAI and
// vLLM report them), computed by the engine only for requests that ask
// and carried with each token to the gateway; the prompt's (echo with
// logprobs, prompt_logprobs) come from the prefill that computes the
// prompt, with the first token. echo puts the prompt's text before each
// choice's (the first delta of a streamed choice, which carries the
// prompt tokens' logprobs entries when they are asked).
//
// Chat prompts are rendered with the model's GGUF chat template through
// package chattmpl; when the model has none, or its template cannot be
// parsed or run, the ChatML format of chattmpl.Fallback is used (a
// template's own raise_exception is a 400, not a fallback).
//
// Quotas (tenants package): requests and tokens per minute (token buckets;
// tokens are charged as prompt + max_tokens and the unused part refunded),
// concurrent requests and worst-case KV pages; a refusal is 429 with
// Retry-After. Server-wide, MaxInFlight and draining give 503.
//
// The engine is reached through the narrow Backend interface; package
// gatewaytest has a deterministic fake.
package gateway

// Package probe is a black-box isolation probe for an OpenAI-compatible
// server (pagewarden, vLLM, SGLang, llama.cpp's server). It sees only what a
// client sees: HTTP statuses, headers, bodies and server-sent events, sent
// with two or more API keys. It needs nothing from the server beyond the
// OpenAI API. Where servers differ it reads the ways it knows and skips,
// never passes, what it cannot see: the window from max_model_len
// (/v1/models, /tokenize) or llama.cpp's /props n_ctx; /tokenize in vLLM's
// form or llama.cpp's; cached tokens from usage.prompt_tokens_details or
// llama.cpp's timings.prompt_n; a refusal inside a stream as a data event
// with an error object or llama.cpp's "error:" line. With
// Config.OneTenant (a server with keys but no tenants, or one key) the
// canaries judge isolation between requests and prefix-cache is skipped.
//
// Run performs these checks, each ending in a verdict (pass, fail, or skip
// with the reason) and, on failure, evidence: the request (never a key:
// keys are named by their position), the status and the offending bytes.
//
//   - boundary: prompts at the window −1, 0, +1, +one page, 2× and 10×,
//     streamed and not. Over the window must be a 4xx with no token; inside
//     it a 200 whose usage.prompt_tokens is exactly the length sent, and a
//     text prompt's count must equal the server's own /tokenize count (or,
//     without /tokenize, grow linearly with the text). prompt_tokens=1 for a
//     long prompt is the incident's tell.
//   - canaries: every request carries a fresh random secret in a long
//     copy-task prompt while the other keys run at the same time; no output,
//     error body or header may hold a secret its request did not carry
//     (another key's or another request's), whole or as a 10-character
//     n-gram (after dropping case and everything not a letter or digit, so
//     a secret split by tokenization is still found), nor another key's
//     API key. Each key also reads the side endpoints (/slots, /metrics,
//     /props, /health, /get_server_info) during the load: another key's
//     secret or key there is a leak too.
//   - abort-storm: clients that leave mid-way, mixed into that load, most
//     of them in the middle of a long decode (streamed, or a non-streamed
//     request hung up), so that a server that does not make an abort
//     terminal is exercised.
//     Every answer that was not abandoned must be complete (a stream ends
//     with a finish_reason and [DONE]; finish_reason "length" means
//     max_tokens tokens were made: a shorter one is an abort dressed as a
//     success), and the server must answer as before once the storm ends.
//   - determinism: greedy and seeded requests give the same text alone,
//     inside the concurrent load and after the storm.
//   - prefix-cache: a key's repeated prompt reports cached tokens, and the
//     same prompt from another key reports none. Skipped when the answers
//     carry no cache count, when the server reports no hits, and for one
//     tenant.
//   - errors: malformed requests get a 4xx whose body is OpenAI's JSON error
//     object, without stack traces; every error seen in the run is held to
//     the same shape.
//   - overload: a burst from one key; each answer is a complete 200, or a
//     429/503 with Retry-After and a JSON error, never a 200 with garbage.
//     Skipped when the burst is not refused at all.
//   - server-counters: the server's must-be-zero counters (pagewarden's, see
//     DefaultZeroMetrics, and Config.ZeroMetrics) read from its Prometheus
//     metrics before and after the run: none may rise. Not applicable,
//     never passed, where the server exposes none of them.
//
// The canary trials give the leak rate's one-sided 95% upper bound
// (Clopper-Pearson; 3/n, the rule of three, when no leak was seen).
//
// The probe is bounded: every request has a deadline, every body is read
// no further than maxBody, and the request count is fixed by Config.
package probe

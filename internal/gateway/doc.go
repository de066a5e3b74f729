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

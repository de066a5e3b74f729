// Package admin serves the operator's view of a running pagewarden on its
// own listener: a live page map of every node's KV pool, per-tenant pages,
// queues and running requests, the counters that must stay zero, and the
// recent isolation and audit events.
//
// It promises:
//
//   - Only an admin key opens it. Every path, the page included, needs a key
//     whose SHA-256 is configured (Authorization: Bearer KEY, or HTTP Basic
//     with the key as password so that a browser can log in); a tenant's API
//     key is refused with 403 and the refusal is an audit event.
//   - What it shows is consistent and free of customer text. Each pool's
//     picture is a sched.PageMap, taken by that node's scheduler loop between
//     two steps; it carries owners (tenant and request ids), sequence
//     numbers, epochs and fill counts, never tokens or prompt text. Audit
//     events come from log records, and values under keys that may hold text
//     (prompt, messages, output, ...) are withheld.
//   - Its cost is bounded. Snapshots are shared by every client within one
//     interval, the audit ring keeps a fixed number of events of bounded
//     size, and free pages are not listed (the page map draws them from the
//     pool's size).
//
// The page (/admin/) is plain HTML, CSS and JavaScript embedded in the
// binary, with no build step and nothing loaded from elsewhere. It reads
// /admin/api/pages, /admin/api/tenants and /admin/api/events once, then
// follows /admin/events, a server-sent event stream of "state" events (the
// two first bodies, whenever they change) and "audit" events (one per event,
// its number as the SSE id so that a reconnect resumes where it left off).
package admin

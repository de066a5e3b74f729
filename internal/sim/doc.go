// Package sim is pagewarden's whole-system deterministic simulation
// (layer B of DESIGN.md's testing strategy). It has no production code:
// its tests build a gateway, a prefill node and two decode nodes from the
// real cores — sched.Core over a kvcache.Pool on every node,
// transfer.Sender on the prefill node, transfer.Receiver on each decode
// node, and the gateway's real HTTP handler (gateway.Server) for what a
// client is answered — and drive them synchronously from one goroutine
// with one seeded random source, a fake clock and a faulty transport
// between the nodes (loss, duplication, reordering, delay, torn and short
// handoffs, slow page writes and reads, prefill and decode nodes that
// crash and restart, stalls that expire leases).
// The model is the owner-echo model: each position's KV encodes the
// owner, salt and tokens it was computed from, and each sampled token is a
// hash of everything attention read, so a read of another tenant's,
// unwritten or stale KV changes the output and is seen at once.
//
// # Promises
//
// After every step the simulation checks, and a seed fails on the first
// step that breaks one:
//
//   - every page of every pool is free, cached, quarantined or owned by
//     exactly one live request of that node (the pools' ledgers agree
//     with the cores);
//   - no attention step reads a position that its own request did not
//     write (the owner-echo executor);
//   - no page is released while a writer of the handoff is in flight on
//     it, and no handoff's source while a read of it is;
//   - every request has exactly one terminal state, at the node and at the
//     gateway, and no token after it;
//   - an abort that landed on a live request is never followed by a
//     success, and a request over the window is answered 4xx without
//     reaching a node;
//   - every generated token is the owner-echo model's token over the
//     request's own history, and the HTTP answer is 200 exactly when the
//     cluster finished the request, with all its tokens;
//
// and at the end every pool is back to its baseline and no core holds a
// request. A failing seed prints a command that replays it exactly.
//
// With -tags pw_mutants, TestMutantsCaught re-introduces each bug of the
// incident's class through the owning package's build-tagged hook and
// checks that the simulation catches it within 1,000 seeds, naming the
// seed and the invariant (docs/assurance.md maps each mutant to its
// other layers).
package sim

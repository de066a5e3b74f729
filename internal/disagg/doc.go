// Package disagg runs pagewarden split into prefill and decode nodes: the
// drivers that connect the handoff's protocol cores (package transfer) to
// a node's scheduler (package sched) over a link (package link), and the
// gateway's backend that sends each request through a decode node and a
// prefill node.
//
// One request, as the gateway sees it:
//
//	gateway ──Generate(Reserve+job)──▶ decode   reserve the prompt's pages now, or refuse
//	gateway ◀──────────Grant────────── decode
//	gateway ──Prefill(Grant+job)─────▶ prefill  compute the prompt
//	                      prefill ──Page×n, Manifest, Commit──▶ decode
//	gateway ◀──Result (cached tokens)── prefill
//	gateway ◀────────Committed──────── decode   (and to prefill)
//	gateway ◀───Tokens…, one Result─── decode   decoding, as on one node
//
// Promises, on top of those of transfer (I6, I7) and sched (I4, I5):
//
//   - A request's tokens reach the gateway only from the decode node it
//     reserved on, only after the handoff committed (the exact-match check
//     of transfer.Receiver, then kvcache.CommitImport as a second,
//     independent one), and only tagged with its owner. The gateway checks
//     the sender, the owner and the index of every token, and answers a
//     client with success only on a Result of stop or length. The
//     prefill node's Result (how much of the prompt its prefix cache
//     served) comes on another link, in either order: a successful answer
//     waits for it at most RouterConfig.UsageWait.
//   - Every failure ends the request with an error the client sees: a
//     refused reservation, an aborted or reaped handoff (its reason is
//     kept), a node that goes down (link.Inbound.Down) or leaves the
//     cluster (Router.SetNodes at the gateway, Decode.PeerLeft at a
//     decode node, both from package cluster's membership), a client that
//     leaves. A decode node's handoff leases are bound to its peers'
//     registrations: when a prefill node or a gateway leaves the cluster,
//     every reservation it takes part in that has not committed is
//     aborted at once, not when its heartbeats stop. Pages of a failed handoff are scrubbed, or quarantined when a
//     writer could not be drained.
//   - Each driver runs its core in one goroutine; what the scheduler does
//     runs in the scheduler's own loop. Nothing here reads or writes KV
//     memory except through sched.Node's ImportPage and the Export that
//     SubmitPrefill returns.
//
// `pagewarden serve` runs a gateway, a prefill and a decode node in one
// process over link.Network (the same frames, handshake and policy as on
// the network); the roles run as separate processes over gRPC with mutual
// TLS.
package disagg

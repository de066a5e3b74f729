// Package sched decides what runs on a node: the request lifecycle, the one
// set of limits, admission, and continuous batching across tenants
// (invariants I4 and I5 of DESIGN.md).
//
// Promises:
//
//   - One state, one writer (I4). A request's lifecycle is a single State
//     in one Lifecycle value, changed only by transition methods that check
//     the source state (Received → Admitted → Prefilling → Handoff →
//     Decoding → Finished, Rejected or Aborted from any non-terminal state,
//     and back to Admitted on preemption). Abort is a transition, never a
//     flag; a terminal state and its reason are never overwritten, so an
//     aborted request can never report success. Queues take only Admitted
//     values, which only Limits.Admit constructs, and the request behind one
//     must be in state Admitted holding no pages.
//   - One set of limits (I5). ComputeLimits derives Limits once from the
//     model, the KV pool's layout and size, --max-context and
//     --kv-safety-margin, and refuses to start when the pool cannot hold the
//     window times the margin. Limits.Admit refuses a request whose prompt
//     plus max_tokens exceeds the window before any page is allocated
//     (request.ErrContextLength); a request that fits waits for pages in its
//     tenant's bounded queue (beyond it request.ErrOverloaded) and is never
//     truncated. The core refuses requests admitted under other limits.
//   - Pages run out → preemption, not failure. A running sequence that
//     cannot grow takes pages from the lowest-priority, most recently
//     started sequence (preferring tenants over their fair share), which is
//     recomputed later with the same output. Per-tenant caps (TenantPolicy)
//     hold at all times, and a tenant with nothing running is not starved
//     by one holding more than its share.
//   - One policy at a time. After a tenant configuration reload the driver
//     calls UpdatePolicies (Node does when NodeConfig.PolicyGeneration
//     moves): raised caps and new priorities apply at once, lowered caps
//     from the next step, and a tenant id handed to another customer
//     starts with its own queue and caps while the previous holder's
//     requests drain.
//   - Writers before free. Pages of a request aborted while its batch runs
//     are released only when that batch is advanced.
//   - Quarantine ends only by an explicit action. Pages the pool
//     quarantined after a violation are never reused until they are
//     scrubbed and freed, either by the operator (ScrubQuarantined, between
//     two steps) or by the reaper on Tick once they have been quarantined
//     for Config.QuarantineReapAfter (0: never); Stats counts both. While
//     pages are quarantined, a request that needs more than the rest of
//     the pool ends with ErrPoolDegraded (a retryable overload) instead of
//     waiting at the head of the line for pages that are not coming; with
//     a reaper it waits for them, and other tenants go ahead meanwhile.
//
// Shape: Core is a deterministic state machine (no goroutines, clock or IO;
// time comes in through Tick, effects go out through Ready as data, and
// Advance applies a batch's outcomes), after etcd raft's RawNode. Node runs
// a Core in one goroutine with an Executor (the model) and offers the Go
// API: Submit returns a Stream of owner-tagged tokens ending in exactly one
// request.Result; Abort from any goroutine, and context cancellation,
// become events applied by the loop.
package sched

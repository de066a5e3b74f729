// Package spin holds a SPIN (Promela) model of a disaggregated request's
// life, handoff.pml, and the test that checks it exhaustively in CI
// (DESIGN.md, testing layer C).
//
// The model follows the code, not an idealised protocol: the gateway's
// call (disagg.Router), the prefill node's sender (transfer.Sender and
// disagg.Prefill), the decode node's receiver (transfer.Receiver and
// disagg.Decode), its scheduler's lifecycle (sched.Lifecycle,
// sched.Core.Reserve/ImportPage/CommitImport) and its page pool
// (kvcache.Pool: ledger, epochs, scrub, quarantine), over a network that
// loses, duplicates and reorders messages, with aborts at every step.
//
// What it promises, for every interleaving within its bounds (one
// handed-off request beside a local tenant, or two handed-off requests of
// two tenants sharing the decode pool):
//
//   - attention never reads a page that is not owned by the reading
//     request under its current allocation epoch and fully written by
//     that request under that epoch (I2, I3), and in particular never a
//     position holding another request's bytes;
//   - a committed handoff is exactly the reserved prompt: every reserved
//     page written, each with the positions the prompt implies (I6);
//   - no page is freed or handed out again while a write into it is in
//     flight (I7); a write for a reservation that ended is refused;
//   - a request's scheduler state ends once and the gateway answers
//     success only for a request that committed and finished (I4, I10);
//   - every page of the decode pool is eventually free or quarantined,
//     and with two requests each ends in the scheduler (liveness, with
//     no fairness assumption).
//
// The incident's variant (no page-count check, pages reused unscrubbed)
// must yield a counterexample in which attention reads the other
// request's bytes, and the test requires the trail to show that read.
// The model's variables and transitions are mapped to the Go code in
// docs/spin.md, with the bounds and what they leave out. The test skips,
// loudly, when spin or a C compiler is missing (test.sh installs the
// Debian package spin when it can).
package spin

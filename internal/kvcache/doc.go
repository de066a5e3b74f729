// Package kvcache owns all KV memory of a node and promises that every page
// of it has exactly one owner.
//
// The pool preallocates per-layer K and V arenas cut into fixed-size pages
// and keeps a ledger with, for every page, its state (free, owned, shared or
// quarantined), its owner (tenant, request, epoch) and how many token
// positions its owner actually wrote (filled). A Sequence is a block table:
// for each of its pages the PageID and the epoch it expects to find there.
//
// The promises, from pagewarden's DESIGN.md:
//
//   - I1 One owner per page. A page is free, owned by exactly one live
//     sequence, shared read-only among sequences of one tenant (prefix cache,
//     refcounted), or quarantined. Every allocation takes a fresh epoch, so a
//     stale block-table entry never matches the ledger again.
//   - I2 Attention reads only what its sequence owns. Begin checks every page
//     of the sequence against the ledger before any attention step and hands
//     out a View only when all of them match. A mismatch is never computed
//     on: the sequence's pages are quarantined, the violation is counted and
//     reported through package invariants, and the error wraps ErrViolation.
//   - I3 Reserved is not written. A sequence's length comes from what Commit
//     recorded as written, never from what Reserve set aside, and a View's
//     slices end at the last valid position, so reading past what was
//     written is an index panic rather than a silent stale read.
//   - I8 Scrub on release. Released pages are zeroed (ScrubZero, the
//     default) or filled with NaN (ScrubPoison, for tests); ScrubNone needs
//     an explicit opt-in. Quarantined pages are reused only after an explicit
//     ScrubQuarantined.
//   - I9 Prefix-cache keys are SHA-256 over length-prefixed, typed fields
//     with the tenant first, and a hit is re-checked against the ledger's
//     tenant, so one tenant can neither hit nor probe another's entries.
//
// The Pool is a deterministic data structure driven by one goroutine: no
// goroutines, clock or IO inside (a test enforces that it imports no net, os
// or time). Views may be read concurrently by forward-pass workers, each on
// its own pages, between Begin and Commit.
package kvcache

// Package tenants holds the gateway's tenant configuration, API-key
// authentication and per-tenant quotas.
//
// It promises that a tenant's identity comes only from an API key (I9): keys
// are stored as SHA-256 hashes, compared in constant time over every
// configured hash, and a request body can never name or change its tenant.
// Quotas (requests per minute, tokens per minute, concurrent requests, KV
// pages) are token buckets and counters driven by an explicit clock, so they
// can be tested without sleeping; their state survives a configuration
// reload, which swaps the tenant set atomically without touching requests
// already in flight, for as long as the same customer holds the tenant id.
// An id removed or handed to a customer with none of its keys starts
// afresh: nothing of the previous holder's buckets, in-flight count or
// cache namespace carries over. Generation tells a reader that caches
// tenant limits (the scheduler's policies) when to read them again.
package tenants

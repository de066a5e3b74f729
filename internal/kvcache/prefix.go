package kvcache

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// Prefix-cache keys (I9). A key is SHA-256 over a sequence of typed,
// length-prefixed fields, so that no two different inputs can frame to the
// same bytes (("org_1","2345") and ("org_12345","") differ in the tenant
// field's length):
//
//	field   := tag:uint8 length:uint64be bytes
//	key     := SHA-256( field(0, domain)
//	                    field(1, tenant)
//	                    field(2, model digest, 32 bytes)
//	                    field(3, salt-present:uint8 salt)      salt "" is absent
//	                    field(4, tokens as int64be each)
//	                    field(5, parent-present:uint8 parent) the previous page's key )
//
// The tenant comes first and is never optional: a key cannot be computed
// without one.
const keyDomain = "pagewarden/kvcache/prefix-key/v1"

const (
	tagDomain = iota
	tagTenant
	tagDigest
	tagSalt
	tagTokens
	tagParent
)

func appendHeader(b []byte, tag byte, n int) []byte {
	b = append(b, tag)
	return binary.BigEndian.AppendUint64(b, uint64(n))
}

func appendField(b []byte, tag byte, v string) []byte {
	return append(appendHeader(b, tag, len(v)), v...)
}

// appendKeyInput frames the key's fields into b.
func appendKeyInput(b []byte, tenant request.Tenant, digest *[32]byte, salt string, tokens []int, parent *[32]byte) []byte {
	b = appendField(b, tagDomain, keyDomain)
	if !testHooks.keyOmitsTenant {
		b = appendField(b, tagTenant, string(tenant))
	}
	b = append(appendHeader(b, tagDigest, len(digest)), digest[:]...)
	if salt == "" {
		b = append(appendHeader(b, tagSalt, 1), 0)
	} else {
		b = append(appendHeader(b, tagSalt, 1+len(salt)), 1)
		b = append(b, salt...)
	}
	b = appendHeader(b, tagTokens, 8*len(tokens))
	for _, t := range tokens {
		b = binary.BigEndian.AppendUint64(b, uint64(int64(t)))
	}
	if parent == nil {
		b = append(appendHeader(b, tagParent, 1), 0)
	} else {
		b = append(appendHeader(b, tagParent, 1+len(parent)), 1)
		b = append(b, parent[:]...)
	}
	return b
}

// PrefixKey is the prefix-cache key of one page of tokens for tenant under
// model digest and salt, chained to the previous page's key (nil for the
// first page).
func PrefixKey(tenant request.Tenant, digest [32]byte, salt string, tokens []int, parent *[32]byte) [32]byte {
	return sha256.Sum256(appendKeyInput(nil, tenant, &digest, salt, tokens, parent))
}

func (p *Pool) key(tenant request.Tenant, salt string, tokens []int, parent *[32]byte) [32]byte {
	p.keyBuf = appendKeyInput(p.keyBuf[:0], tenant, &p.digest, salt, tokens, parent)
	return sha256.Sum256(p.keyBuf)
}

// AttachPrefix serves the longest cached prefix of a new sequence's prompt:
// it appends, as shared references, the cached full pages of tokens that
// this tenant published under the same salt, and returns the number of
// positions they hold (also Len() and CachedTokens()). The caller computes
// from there on. At least the last prompt token is always left to compute,
// since its logits are needed. It attaches nothing (0) unless s is live and
// empty. A hit whose page the ledger gives another tenant is a violation:
// it is counted and reported and ends the attach.
func (p *Pool) AttachPrefix(s *Sequence, tokens []int, salt string) (cachedTokens int) {
	if p.usable(s) != nil || len(s.table) != 0 || s.length != 0 || len(tokens) < 2 {
		return 0
	}
	ps := p.layout.PageSize
	pages := (len(tokens) - 1) / ps
	var parent *[32]byte
	var key [32]byte
	for i := range pages {
		key = p.key(s.owner.Tenant, salt, tokens[i*ps:(i+1)*ps], parent)
		id, ok := p.index[key]
		if !ok {
			p.st.prefixMisses += uint64(pages - i)
			break
		}
		pg := &p.ledger[id]
		if pg.state != PageShared || !pg.indexed || pg.key != key || pg.owner.Tenant != s.owner.Tenant || int(pg.filled) != ps {
			p.st.prefixMisses += uint64(pages - i)
			p.violations.Add(1)
			_ = invariants.Failf("kvcache: prefix-cache hit for %v on page %d, which the ledger has %v by tenant %q (indexed %v)",
				s.owner, id, pg.state, pg.owner.Tenant, pg.indexed)
			break
		}
		if pg.refs == 0 {
			p.lruRemove(id)
		}
		pg.refs++
		s.table = append(s.table, entry{id: id, epoch: pg.epoch, shared: true})
		p.st.prefixHits++
		k := key
		parent = &k
	}
	s.length = len(s.table) * ps
	s.cached = s.length
	return s.cached
}

// PublishPrefix makes s's full pages of prompt tokens shareable with later
// requests of the same tenant: each becomes shared (read-only, refcounted)
// and indexed under its key. Pages whose key another page already holds
// stay private. tokens must be what s's first positions hold (the prompt,
// possibly followed by generated tokens); only pages within both tokens and
// Len() are published. s is checked first, like Begin. It returns the
// number of pages newly indexed.
func (p *Pool) PublishPrefix(s *Sequence, tokens []int, salt string) int {
	if p.usable(s) != nil {
		return 0
	}
	if err := p.verify(s, 0); err != nil {
		_ = p.fail(s, "publish", err)
		return 0
	}
	ps := p.layout.PageSize
	full := min(len(tokens), s.length) / ps
	var parent *[32]byte
	n := 0
	for i := range full {
		key := p.key(s.owner.Tenant, salt, tokens[i*ps:(i+1)*ps], parent)
		k := key
		parent = &k
		if i < s.dropped {
			continue // given back behind the window: nothing to publish
		}
		id := s.table[i].id
		pg := &p.ledger[id]
		if pg.indexed {
			if pg.key != key {
				// The page holds other tokens than the caller says:
				// every later key would name the wrong content.
				break
			}
			continue
		}
		if _, taken := p.index[key]; taken {
			continue
		}
		if !s.table[i].shared {
			pg.seq, pg.owner = 0, request.Owner{Tenant: s.owner.Tenant}
			p.setState(pg, PageShared)
			pg.refs = 1
			s.table[i].shared = true
		}
		pg.indexed, pg.key = true, key
		p.index[key] = id
		p.st.published++
		n++
	}
	return n
}

// unindex removes a shared page from the prefix index (and the LRU list
// when it sits there).
func (p *Pool) unindex(id PageID) {
	pg := &p.ledger[id]
	if pg.refs == 0 && pg.state == PageShared {
		p.lruRemove(id)
	}
	delete(p.index, pg.key)
	pg.indexed, pg.key = false, [32]byte{}
}

// evict drops an unreferenced cached page: out of the index, scrubbed,
// free.
func (p *Pool) evict(id PageID) {
	p.unindex(id)
	p.freePage(id)
	p.st.evictions++
}

// EvictCached evicts up to n unreferenced prefix-cache pages, least
// recently used first (n < 0: all of them), and returns how many it
// evicted.
func (p *Pool) EvictCached(n int) int {
	done := 0
	for p.lruLen > 0 && (n < 0 || done < n) {
		p.evict(p.ledger[0].next)
		done++
	}
	return done
}

// The LRU list of unreferenced indexed shared pages is intrusive, linked
// through the ledger, with ledger[0] as its head: next of the head is the
// least recently used page.
func (p *Pool) lruPushBack(id PageID) {
	head := &p.ledger[0]
	last := head.prev
	p.ledger[id].prev, p.ledger[id].next = last, 0
	p.ledger[last].next = id
	head.prev = id
	p.lruLen++
}

func (p *Pool) lruRemove(id PageID) {
	pg := &p.ledger[id]
	p.ledger[pg.prev].next = pg.next
	p.ledger[pg.next].prev = pg.prev
	pg.prev, pg.next = 0, 0
	p.lruLen--
}

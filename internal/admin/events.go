package admin

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Event is one entry of the audit ring: a log record at WARN or above from
// the nodes' loggers (a violation and the quarantine of its pages, an
// owner mismatch, a refused handoff, a failed request), or one the admin
// server itself wrote (a refused tenant key, a scrub).
type Event struct {
	// Seq numbers events from 1 in the order they were recorded; it is
	// the SSE event id, so a reconnecting page asks only for what it
	// missed.
	Seq     uint64            `json:"seq"`
	Time    time.Time         `json:"time"`
	Level   string            `json:"level"`
	Message string            `json:"message"`
	Attrs   map[string]string `json:"attrs,omitempty"`
}

// AuditKey marks a log record as an audit event whatever its level: a
// record with the attribute AuditKey=true goes to the ring even below the
// handler's level (a config reload, a scrub: INFO lines an operator must
// still find). The attribute itself is not kept.
const AuditKey = "audit"

// Bounds on what one event may hold, so the ring's memory is bounded by
// its length whatever the log lines carry.
const (
	maxAttrs     = 32
	maxValueLen  = 1024
	DefaultRing  = 256
	maxRingLen   = 1 << 16
	droppedValue = "[withheld]"
)

// withheld are attribute keys whose values may be customer text. No audit
// line writes them today; this keeps a future one (or --log-prompts) from
// putting prompt text in front of the operator's browser.
var withheld = map[string]bool{
	"prompt": true, "prompts": true, "text": true, "output": true, "messages": true,
	"content": true, "completion": true, "input": true,
}

// Ring keeps the most recent events. It is safe for concurrent use.
type Ring struct {
	mu      sync.Mutex
	buf     []Event // circular once full
	start   int     // index of the oldest event when full
	n       int     // capacity
	seq     uint64  // the last event's Seq
	changed chan struct{}
}

// NewRing returns a ring that keeps the last n events (DefaultRing when n
// is 0 or less; at most 65536).
func NewRing(n int) *Ring {
	if n <= 0 {
		n = DefaultRing
	}
	n = min(n, maxRingLen)
	return &Ring{n: n, changed: make(chan struct{})}
}

// Add records e, numbering it; Seq is overwritten. It wakes every waiter.
func (r *Ring) Add(e Event) uint64 {
	r.mu.Lock()
	r.seq++
	e.Seq = r.seq
	if len(r.buf) < r.n {
		r.buf = append(r.buf, e)
	} else {
		r.buf[r.start] = e
		r.start = (r.start + 1) % r.n
	}
	ch := r.changed
	r.changed = make(chan struct{})
	r.mu.Unlock()
	close(ch)
	return e.Seq
}

// Since returns the events after seq still in the ring, oldest first, and
// a channel that is closed when the next event is added.
func (r *Ring) Since(seq uint64) ([]Event, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for i := range r.buf {
		e := r.buf[(r.start+i)%len(r.buf)]
		if e.Seq > seq {
			out = append(out, e)
		}
	}
	return out, r.changed
}

// Handler returns a slog.Handler that passes every record to next and
// also records those at level or above in the ring: the audit lines
// the scheduler and the handoff drivers write are then one source for both
// the log and the admin page, and cannot disagree. Values of keys that may
// hold customer text are withheld from the ring (the log keeps its own
// rules).
func (r *Ring) Handler(next slog.Handler, level slog.Level) slog.Handler {
	return &teeHandler{ring: r, next: next, min: level}
}

type teeHandler struct {
	ring   *Ring
	next   slog.Handler
	min    slog.Level
	prefix string      // group names joined with dots, ending in a dot
	attrs  []slog.Attr // from WithAttrs, keys already prefixed
}

// Enabled is true for every level the log takes and, since a record
// marked with AuditKey may come at any level, for INFO and above too.
func (h *teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= min(h.min, slog.LevelInfo) || h.next.Enabled(ctx, l)
}

func (h *teeHandler) Handle(ctx context.Context, rec slog.Record) error {
	marked := false
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == AuditKey && a.Value.Kind() == slog.KindBool && a.Value.Bool() {
			marked = true
			return false
		}
		return true
	})
	if rec.Level >= h.min || marked {
		e := Event{Time: rec.Time, Level: rec.Level.String(), Message: clip(rec.Message), Attrs: map[string]string{}}
		for _, a := range h.attrs {
			addAttr(e.Attrs, "", a)
		}
		rec.Attrs(func(a slog.Attr) bool {
			addAttr(e.Attrs, h.prefix, a)
			return len(e.Attrs) < maxAttrs
		})
		if e.Time.IsZero() {
			e.Time = time.Now()
		}
		h.ring.Add(e)
	}
	if h.next.Enabled(ctx, rec.Level) {
		return h.next.Handle(ctx, rec)
	}
	return nil
}

func (h *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(as)
	c.attrs = slices.Clone(h.attrs)
	for _, a := range as {
		a.Key = h.prefix + a.Key
		c.attrs = append(c.attrs, a)
	}
	return &c
}

func (h *teeHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.next = h.next.WithGroup(name)
	c.prefix = h.prefix + name + "."
	return &c
}

// addAttr flattens a (groups become dotted keys) into m as strings.
func addAttr(m map[string]string, prefix string, a slog.Attr) {
	if len(m) >= maxAttrs {
		return
	}
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range v.Group() {
			addAttr(m, p, g)
		}
		return
	}
	if a.Key == "" {
		return
	}
	if a.Key == AuditKey && prefix == "" {
		return
	}
	key := prefix + a.Key
	last := key[strings.LastIndexByte(key, '.')+1:]
	if withheld[strings.ToLower(last)] {
		m[key] = droppedValue
		return
	}
	var s string
	switch v.Kind() {
	case slog.KindDuration:
		s = fmt.Sprintf("%.3fms", float64(v.Duration())/float64(time.Millisecond))
	default:
		s = v.String()
	}
	m[key] = clip(s)
}

func clip(s string) string {
	if len(s) <= maxValueLen {
		return s
	}
	// Cut at a rune boundary so the JSON stays valid UTF-8 text.
	i := maxValueLen
	for i > 0 && s[i]&0xC0 == 0x80 {
		i--
	}
	return s[:i] + "…"
}

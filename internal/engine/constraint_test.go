package engine

import (
	"errors"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestConstraintsReplay: a sequence's mask depends only on its generated
// tokens: the kept matcher, one rebuilt after eviction, and one asked for
// an earlier token (a recompute after preemption) agree; masks are shared
// within a tenant only; a history the constraint never allowed fails.
func TestConstraintsReplay(t *testing.T) {
	m := builtinModel(t, "tiny")
	e, err := New(m, Options{Pages: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONObject})
	if err != nil {
		t.Fatal(err)
	}
	tok := m.Tokenizer
	prompt := tok.Encode("hello", true, false)
	gen := tok.Encode(`{"a": [1, "x"]`, false, false)
	hist := func(n int) []int { return append(slices.Clone(prompt), gen[:n]...) }
	var c constraints
	a := request.Owner{Tenant: "a", ID: request.NewID()}
	var kept [][]uint64
	for i := range gen {
		mask, err := c.mask(e, a, g, i, hist(i))
		if err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		if !grammar.Allowed(mask, gen[i]) {
			t.Fatalf("token %d (%q) masked", i, tok.Piece(gen[i]))
		}
		kept = append(kept, slices.Clone(mask))
	}
	for i := range gen {
		c.forget(a) // evicted: rebuilt by replay
		fresh, err := c.mask(e, a, g, i, hist(i))
		if err != nil || !slices.Equal(fresh, kept[i]) {
			t.Fatalf("token %d: a rebuilt matcher's mask differs (%v)", i, err)
		}
	}
	// Ahead of the draw: asked for token 2 after token 5.
	if _, err := c.mask(e, a, g, 5, hist(5)); err != nil {
		t.Fatal(err)
	}
	if back, err := c.mask(e, a, g, 2, hist(2)); err != nil || !slices.Equal(back, kept[2]) {
		t.Fatalf("a recompute's mask differs (%v)", err)
	}
	// Another tenant with the same schema gets its own bound grammar.
	b := request.Owner{Tenant: "b", ID: request.NewID()}
	if _, err := c.mask(e, b, g, 0, hist(0)); err != nil {
		t.Fatal(err)
	}
	if len(c.bound) != 2 {
		t.Errorf("%d bound grammars for two tenants, want 2", len(c.bound))
	}
	// A history the constraint never allowed.
	bad := append(slices.Clone(prompt), tok.Encode("x", false, false)...)
	if _, err := c.mask(e, request.Owner{Tenant: "a", ID: request.NewID()}, g, 1, bad); !errors.Is(err, grammar.ErrRefused) {
		t.Errorf("refused history: %v", err)
	}
}

package grammar_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/testdata"
	"github.com/pagewarden/pagewarden/internal/tokenizer"
)

// The vocabularies the mask is measured and checked on: llama's SPM
// vocabulary (32,000 real tokens, from shared/testdata) and the builtin
// models' byte-level one (builtin:135m-q8_0 pads it to 32,000 ids, most
// of them unused).
func realVocab(tb testing.TB) *tokenizer.Tokenizer {
	tb.Helper()
	f, err := gguf.Open(testdata.Path(tb, "vocab", "ggml-vocab-llama-spm.gguf"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	t, err := tokenizer.FromGGUF(f)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

func builtinVocab(tb testing.TB) *tokenizer.Tokenizer {
	tb.Helper()
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	defer m.Close()
	return m.Tokenizer
}

func vocabOf(t *tokenizer.Tokenizer) *grammar.Vocab {
	return grammar.NewVocab(t.VocabSize(), t.Piece, t.IsEOG)
}

const benchSchema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"pet":{"enum":["cat","dog",null]},
"ok":{"type":"boolean"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","pet","ok","tags"],"additionalProperties":false}`

const benchDoc = `{"name": "Once upon a time there was a little dog named Max, who loved to run in the park with his friends", "age": 42, "pet": "dog", "ok": true, "tags": ["happy", "small", "brown"]}`

// tokenize splits doc into the longest vocabulary pieces, left to right
// (what a model writing doc token by token would emit).
func tokenize(tb testing.TB, t *tokenizer.Tokenizer, doc string) []int {
	tb.Helper()
	byPiece := map[string]int{}
	longest := 0
	for id := range t.VocabSize() {
		if p := t.Piece(id); len(p) > 0 && !t.IsEOG(id) {
			if _, ok := byPiece[string(p)]; !ok {
				byPiece[string(p)] = id
			}
			longest = max(longest, len(p))
		}
	}
	var ids []int
	for p := 0; p < len(doc); {
		n := min(longest, len(doc)-p)
		for ; n > 0; n-- {
			if id, ok := byPiece[doc[p:p+n]]; ok {
				ids = append(ids, id)
				break
			}
		}
		if n == 0 {
			tb.Fatalf("no token for %q", doc[p:])
		}
		p += n
	}
	return ids
}

// TestMaskRealVocab: on llama's 32,000-token vocabulary, the trie walk
// agrees with feeding every token alone, in states along a real document
// and along constrained random walks, and the document is accepted whole.
func TestMaskRealVocab(t *testing.T) {
	tok := realVocab(t)
	v := vocabOf(tok)
	g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONSchema, Strict: true, Schema: []byte(benchSchema)})
	if err != nil {
		t.Fatal(err)
	}
	b := g.Bind(v)
	check := func(m *grammar.Matcher, st grammar.State, where string) []int {
		mask := m.Mask()
		var allowed []int
		for id := range tok.VocabSize() {
			s := st
			want := false
			if tok.IsEOG(id) {
				want = g.Complete(&s)
			} else if p := tok.Piece(id); len(p) > 0 {
				want = g.Feed(&s, p)
			}
			if grammar.Allowed(mask, id) != want {
				t.Fatalf("%s: token %d %q: mask %v, fed alone %v", where, id, tok.Piece(id), !want, want)
			}
			if want {
				allowed = append(allowed, id)
			}
		}
		return allowed
	}
	doc := tokenize(t, tok, benchDoc)
	m := b.NewMatcher()
	st := g.Start()
	for i, id := range doc {
		if i%5 == 0 {
			check(m, st, fmt.Sprintf("document token %d", i))
		}
		if err := m.Accept(id); err != nil {
			t.Fatalf("document token %d %q: %v", i, tok.Piece(id), err)
		}
		g.Feed(&st, tok.Piece(id))
	}
	if !m.Complete() || !grammar.Allowed(m.Mask(), tok.EOS()) {
		t.Fatal("the document is not complete, or EOS is not allowed after it")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for walk := range 3 {
		m, st := b.NewMatcher(), g.Start()
		for step := range 30 {
			allowed := check(m, st, fmt.Sprintf("walk %d step %d", walk, step))
			id := allowed[rng.IntN(len(allowed))]
			if tok.IsEOG(id) {
				break
			}
			if err := m.Accept(id); err != nil {
				t.Fatal(err)
			}
			g.Feed(&st, tok.Piece(id))
		}
	}
}

// BenchmarkMask measures the mask per token:
//
//   - state=…/cache=cold: one mask computed from scratch (the trie walk)
//     in a state: inside a string (the widest: almost every token
//     continues it), before a key, inside a number, before a json_object
//     value;
//   - doc/…: a whole document, Mask and Accept per token, with a fresh
//     Bound per document (first request with this schema) and with a warm
//     one (the same schema again), as ns/token.
//
// Run: go test ./internal/grammar -run '^$' -bench Mask -benchtime 20x
func BenchmarkMask(b *testing.B) {
	for _, vc := range []struct {
		name string
		tok  func(testing.TB) *tokenizer.Tokenizer
	}{{"llama-spm-32000", realVocab}, {"builtin", builtinVocab}} {
		tok := vc.tok(b)
		v := vocabOf(tok)
		g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONSchema, Strict: true, Schema: []byte(benchSchema)})
		if err != nil {
			b.Fatal(err)
		}
		obj, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONObject})
		if err != nil {
			b.Fatal(err)
		}
		for _, sc := range []struct {
			name   string
			g      *grammar.Grammar
			prefix string
		}{
			{"string", g, `{"name": "Once upon`},
			{"key", g, `{`},
			{"number", g, `{"name": "x", "age": 4`},
			{"any-value", obj, `{"a": `},
		} {
			b.Run(fmt.Sprintf("vocab=%s/state=%s/cache=cold", vc.name, sc.name), func(b *testing.B) {
				st := sc.g.Start()
				if !sc.g.Feed(&st, []byte(sc.prefix)) {
					b.Fatalf("prefix %q refused", sc.prefix)
				}
				n := 0
				for b.Loop() {
					m := sc.g.Bind(v).Mask(&st) // a fresh cache: computed
					n = len(m)
				}
				_ = n
			})
		}
		doc := tokenize(b, tok, benchDoc)
		for _, warm := range []bool{false, true} {
			b.Run(fmt.Sprintf("vocab=%s/doc/warm=%v", vc.name, warm), func(b *testing.B) {
				bound := g.Bind(v)
				for b.Loop() {
					if !warm {
						bound = g.Bind(v)
					}
					m := bound.NewMatcher()
					for _, id := range doc {
						if !grammar.Allowed(m.Mask(), id) {
							b.Fatalf("token %d masked", id)
						}
						if err := m.Accept(id); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(doc)), "ns/token")
				b.ReportMetric(float64(len(doc)), "tokens/doc")
			})
		}
	}
}

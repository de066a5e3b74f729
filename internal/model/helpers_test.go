package model_test

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/request"
)

// builtins caches generated models: generation costs more than the tests
// that use them, and a Model is immutable.
var builtins sync.Map // name -> *model.Model

func builtin(t testing.TB, name string) *model.Model {
	t.Helper()
	if m, ok := builtins.Load(name); ok {
		return m.(*model.Model)
	}
	m, err := model.Builtin(name)
	if err != nil {
		t.Fatalf("builtin %s: %v", name, err)
	}
	actual, _ := builtins.LoadOrStore(name, m)
	return actual.(*model.Model)
}

// newPool makes a poisoned KV pool shaped for m: any read of a position
// that was never written shows up as NaN in the logits.
func newPool(t testing.TB, m *model.Model, dt kvcache.DType, pageSize, pages int) *kvcache.Pool {
	t.Helper()
	c := m.Config
	p, err := kvcache.NewPool(kvcache.Config{
		Layout: kvcache.Layout{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: pageSize, DType: dt},
		Pages:  pages, Scrub: kvcache.ScrubPoison, ModelDigest: m.Digest,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func computePool(t testing.TB, threads int) *kernels.Pool {
	t.Helper()
	p := kernels.NewPool(threads)
	t.Cleanup(p.Close)
	return p
}

// runner drives one model over one KV pool, a step at a time, the way the
// engine does: Reserve, Begin, Forward, Commit.
type runner struct {
	t       testing.TB
	m       *model.Model
	kv      *kvcache.Pool
	compute *kernels.Pool
	scratch model.Scratch
	reuse   bool // step calls ForwardReusing
}

func newRunner(t testing.TB, m *model.Model, dt kvcache.DType, pages int) *runner {
	return &runner{t: t, m: m, kv: newPool(t, m, dt, 16, pages), compute: computePool(t, 2)}
}

func (r *runner) seq(tenant string) *kvcache.Sequence {
	return r.kv.NewSequence(request.Owner{Tenant: request.Tenant(tenant), ID: request.NewID()})
}

// part is one sequence's share of a step.
type part struct {
	seq    *kvcache.Sequence
	tokens []int
	mode   model.LogitsMode
}

// step runs parts together in one Forward and commits them.
func (r *runner) step(parts ...part) [][]float32 {
	r.t.Helper()
	in := make([]model.Input, len(parts))
	for i, p := range parts {
		if err := r.kv.Reserve(p.seq, len(p.tokens)); err != nil {
			r.t.Fatal(err)
		}
		v, err := r.kv.Begin(p.seq, len(p.tokens))
		if err != nil {
			r.t.Fatal(err)
		}
		in[i] = model.Input{Tokens: p.tokens, View: v, Logits: p.mode}
	}
	forward := r.m.Forward
	if r.reuse {
		forward = r.m.ForwardReusing
	}
	out, err := forward(r.compute, in, &r.scratch)
	if err != nil {
		r.t.Fatal(err)
	}
	for i := range in {
		if err := r.kv.Commit(in[i].View); err != nil {
			r.t.Fatal(err)
		}
	}
	for i, o := range out {
		assertFinite(r.t, o, "logits of part %d", i)
	}
	return out
}

func assertFinite(t testing.TB, xs []float32, format string, args ...any) {
	t.Helper()
	for i, x := range xs {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf(format+": element %d is %v (a read of unwritten or poisoned KV?)", append(args, i, x)...)
		}
	}
}

// relDiff is max|a-b| / max|b|: a scale-aware distance between logit rows.
func relDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range a {
		num = math.Max(num, math.Abs(float64(a[i])-float64(b[i])))
		den = math.Max(den, math.Abs(float64(b[i])))
	}
	if den == 0 {
		return num
	}
	return num / den
}

// tokens returns n pseudo-random token ids below vocab, different per seed.
func tokens(seed uint32, n, vocab int) []int {
	out := make([]int, n)
	x := seed*2654435761 + 1
	for i := range out {
		x = x*1664525 + 1013904223
		out[i] = int(x>>8) % vocab
	}
	return out
}

// ggufEdit describes how to derive a (usually broken) GGUF from a good one.
type ggufEdit struct {
	setKV      map[string]any // replaced in place, or appended
	dropKV     []string
	dropTensor []string
	// tensors replaced (same name, same position) or appended
	setTensor map[string]tensorSpec
}

type tensorSpec struct {
	typ  quant.Type
	dims []uint64
	data []byte
}

// rewrite copies f through a gguf.Writer with e applied and returns the
// file image.
func rewrite(t testing.TB, f *gguf.File, e ggufEdit) []byte {
	t.Helper()
	w := gguf.NewWriter()
	drop := map[string]bool{}
	for _, k := range e.dropKV {
		drop[k] = true
	}
	done := map[string]bool{}
	for _, kv := range f.KV {
		if drop[kv.Key] {
			continue
		}
		var v any = kv.Value
		if nv, ok := e.setKV[kv.Key]; ok {
			v, done[kv.Key] = nv, true
		}
		if err := w.SetKV(kv.Key, v); err != nil {
			t.Fatalf("set %s: %v", kv.Key, err)
		}
	}
	for k, v := range e.setKV {
		if !done[k] {
			if err := w.SetKV(k, v); err != nil {
				t.Fatalf("set %s: %v", k, err)
			}
		}
	}
	clear(drop)
	for _, n := range e.dropTensor {
		drop[n] = true
	}
	clear(done)
	for _, ti := range f.Tensors {
		if drop[ti.Name] {
			continue
		}
		spec := tensorSpec{ti.Type, ti.Dims, ti.Data}
		if s, ok := e.setTensor[ti.Name]; ok {
			spec, done[ti.Name] = s, true
		}
		if err := w.AddTensor(ti.Name, spec.typ, spec.dims, spec.data); err != nil {
			t.Fatalf("tensor %s: %v", ti.Name, err)
		}
	}
	for n, s := range e.setTensor {
		if !done[n] {
			if err := w.AddTensor(n, s.typ, s.dims, s.data); err != nil {
				t.Fatalf("tensor %s: %v", n, err)
			}
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// builtinImage is the GGUF image of a builtin model.
func builtinImage(t testing.TB, name string) []byte {
	t.Helper()
	w, err := model.BuiltinGGUF(model.Builtins[name])
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func parse(t testing.TB, data []byte) *gguf.File {
	t.Helper()
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func writeTemp(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

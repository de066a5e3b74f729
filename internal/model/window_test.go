package model_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// refTol is the largest relative difference allowed between Forward and
// refForward: float32 kernels against a float64 reference through four
// layers stay near 1e-5; with an F16 cache a value that lands on the other
// side of an F16 rounding step moves a few 1e-4. A window one position off
// moves the logits by far more (each case checks that, so the tolerance
// cannot hide it).
var refTol = map[kvcache.DType]float64{kvcache.F32: 2e-4, kvcache.F16: 1e-3}

// layoutTol is the largest relative difference allowed between two ways of
// feeding the same prompt (at once, token by token, in chunks). With an
// F32 cache they agree to batchTol; with an F16 cache a prefill chunk's
// attention (tiled) adds in another order than a decode token's, and a
// weight that rounds to the neighbouring F16 value moves a logit by up to
// about 1e-4.
var layoutTol = map[kvcache.DType]float64{kvcache.F32: batchTol, kvcache.F16: 3e-4}

// refForward is a naive forward pass of m over toks, every position at once,
// written from the definitions and sharing no code with Forward: weights are
// dequantised row by row (Matrix.Row), sums are float64, RoPE is ggml's
// running-product formula, and the attention mask is llama.cpp's n_swa rule
// spelled out — the key at position k is seen from the query at q iff k ≤ q
// and, on a windowed layer, q-k < window. f16 rounds the cached keys and
// values, the query and the attention weights to F16 where Forward does with
// an F16 cache. It returns each position's logits.
func refForward(m *model.Model, toks []int, f16 bool) [][]float32 {
	c := &m.Config
	n, dim, hd := len(toks), c.Dim, c.HeadDim
	qdim, kvdim := c.QDim(), c.KVDim()
	// rowsOf dequantises a matrix once per call.
	dq := map[*kernels.Matrix][][]float64{}
	rowsOf := func(mx *kernels.Matrix) [][]float64 {
		if rows, ok := dq[mx]; ok {
			return rows
		}
		buf := make([]float32, mx.Cols())
		rows := make([][]float64, mx.Rows())
		for r := range rows {
			mx.Row(r, buf)
			rows[r] = make([]float64, len(buf))
			for i, x := range buf {
				rows[r][i] = float64(x)
			}
		}
		dq[mx] = rows
		return rows
	}
	rowOf := func(mx *kernels.Matrix, r int) []float64 { return slices.Clone(rowsOf(mx)[r]) }
	// matvec applies matrices whose rows are stacked (a fused projection)
	// to x.
	matvec := func(ms []*kernels.Matrix, x []float64) []float64 {
		var out []float64
		for _, mx := range ms {
			for _, w := range rowsOf(mx) {
				s := 0.0
				for i := range w {
					s += w[i] * x[i]
				}
				out = append(out, s)
			}
		}
		return out
	}
	rmsnorm := func(x []float64, w []float32) []float64 {
		ss := 0.0
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+float64(c.NormEps))
		out := make([]float64, len(x))
		for i := range x {
			out[i] = x[i] * inv * float64(w[i])
		}
		return out
	}
	r16 := func(x float64) float64 {
		if !f16 {
			return x
		}
		return float64(quant.F16ToF32(quant.F32ToF16(float32(x))))
	}
	// rope rotates adjacent pairs of every head (RopeNormal, the builtins'
	// style) by pos·base^(-2i/dims), the angle built as ggml builds it.
	rope := func(x []float64, heads, pos int) {
		scale := float32(math.Pow(float64(c.RopeBase), -2.0/float64(c.RopeDims)))
		for h := range heads {
			theta := float32(pos)
			for i := range c.RopeDims / 2 {
				t := float64(theta * c.RopeFreqScale)
				cs, sn := math.Cos(t), math.Sin(t)
				a, b := x[h*hd+2*i], x[h*hd+2*i+1]
				x[h*hd+2*i], x[h*hd+2*i+1] = a*cs-b*sn, a*sn+b*cs
				theta *= scale
			}
		}
	}
	xs := make([][]float64, n)
	for p, t := range toks {
		xs[p] = rowOf(m.W.Embed, t)
	}
	for l := range c.Layers {
		w := &m.W.Layers[l]
		q := make([][]float64, n)
		k := make([][]float64, n)
		v := make([][]float64, n)
		for p := range n {
			qkv := matvec(w.QKV.Matrices(), rmsnorm(xs[p], w.AttnNorm))
			q[p], k[p], v[p] = qkv[:qdim], qkv[qdim:qdim+kvdim], qkv[qdim+kvdim:]
			rope(q[p], c.Heads, p)
			rope(k[p], c.KVHeads, p)
			for i := range kvdim {
				k[p][i], v[p][i] = r16(k[p][i]), r16(v[p][i])
			}
		}
		win := c.Window(l)
		for p := range n {
			att := make([]float64, qdim)
			for h := range c.Heads {
				kvh := h / (c.Heads / c.KVHeads)
				var keys []int
				scores := []float64{}
				for j := 0; j <= p; j++ {
					if win > 0 && p-j >= win {
						continue // behind the window: masked
					}
					s := 0.0
					for d := range hd {
						s += r16(q[p][h*hd+d]) * k[j][kvh*hd+d]
					}
					s *= float64(c.Scale())
					if cap := float64(c.AttnSoftcap); cap > 0 {
						s = cap * math.Tanh(s/cap)
					}
					keys, scores = append(keys, j), append(scores, s)
				}
				top := math.Inf(-1)
				for _, s := range scores {
					top = math.Max(top, s)
				}
				sum := 0.0
				for i := range scores {
					scores[i] = math.Exp(scores[i] - top)
					sum += scores[i]
				}
				for i, j := range keys {
					a := r16(scores[i] / sum)
					for d := range hd {
						att[h*hd+d] += a * v[j][kvh*hd+d]
					}
				}
			}
			o := matvec([]*kernels.Matrix{w.O}, att)
			for i := range dim {
				xs[p][i] += o[i]
			}
		}
		for p := range n {
			gu := matvec(w.GateUp.Matrices(), rmsnorm(xs[p], w.FFNNorm))
			g, u := gu[:c.FFN], gu[c.FFN:]
			hb := make([]float64, c.FFN)
			for i := range hb {
				hb[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := matvec([]*kernels.Matrix{w.Down}, hb)
			for i := range dim {
				xs[p][i] += d[i]
			}
		}
	}
	out := make([][]float32, n)
	for p := range n {
		lg := matvec([]*kernels.Matrix{m.W.Output}, rmsnorm(xs[p], m.W.OutNorm))
		out[p] = make([]float32, len(lg))
		for i, x := range lg {
			out[p][i] = float32(x)
		}
	}
	return out
}

// windowed returns a copy of m whose layers attend to the last w positions
// (every layer, or those layers says).
func windowed(m *model.Model, w int, layers []bool) *model.Model {
	c := *m
	c.Config.SlidingWindow = w
	c.Config.WindowedLayers = layers
	return &c
}

// runChunks feeds toks to a fresh sequence of a pool with pageSize, chunk
// positions per step (all of them when chunk ≤ 0), and returns every
// position's logits. With drop, after each step the sequence gives back
// the pages its window left behind (kvcache.Pool.DropBefore), as the
// scheduler does for a model windowed on every layer: the view hands out
// nothing of those pages, so equal logits show that attention never looks
// behind the window, and the pages held stay within ceil(window/page)+1
// plus the chunk's.
func runChunks(t *testing.T, m *model.Model, dt kvcache.DType, pageSize, chunk int, toks []int, drop ...bool) [][]float32 {
	t.Helper()
	r := &runner{t: t, m: m, kv: newPool(t, m, dt, pageSize, (len(toks)+pageSize-1)/pageSize+1), compute: computePool(t, 2)}
	s := r.seq("w")
	if chunk <= 0 {
		chunk = len(toks)
	}
	var rows [][]float32
	for lo := 0; lo < len(toks); lo += chunk {
		hi := min(lo+chunk, len(toks))
		out := r.step(part{s, toks[lo:hi], model.LogitsAll})[0]
		for p := range hi - lo {
			rows = append(rows, out[p*m.Config.Vocab:(p+1)*m.Config.Vocab])
		}
		if w := m.Config.SlidingWindow; len(drop) > 0 && drop[0] {
			if _, err := r.kv.DropBefore(s, s.Len()-w+1); err != nil {
				t.Fatal(err)
			}
			if held, most := s.HeldPages(), (w+chunk-1+pageSize-1)/pageSize+1; held > most {
				t.Fatalf("after position %d: %d pages held, at most %d needed", hi, held, most)
			}
		}
	}
	if err := r.kv.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestSlidingWindowMatchesReference checks the attention window against
// refForward: windows of one position, a page minus one, a page, a page
// plus one, and more than the sequence; every layer or alternate layers
// (gemma2's pattern); F32 and F16 caches; the builtins' GQA (4 query heads
// over 2 KV heads); and the prompt fed at once, a token at a time, and in
// chunks that cross pages. Every way must give the reference's logits, and
// the ways must agree with each other to batchTol.
func TestSlidingWindowMatchesReference(t *testing.T) {
	const n = 41 // positions: 2 pages of 16 and a part, 10 of 4 and a part
	base := builtin(t, "tiny")
	toks := tokens(11, n, base.Config.Vocab)
	alternate := make([]bool, base.Config.Layers)
	for l := range alternate {
		alternate[l] = l%2 == 0
	}
	type tc struct {
		window, pageSize int
		layers           []bool
	}
	var cases []tc
	for _, ps := range []int{16, 4} {
		for _, w := range []int{1, ps - 1, ps, ps + 1, 2*ps + 3, n + 5} {
			if w > 0 {
				cases = append(cases, tc{w, ps, nil})
			}
		}
	}
	cases = append(cases, tc{7, 4, alternate}, tc{17, 16, alternate})
	for _, c := range cases {
		m := windowed(base, c.window, c.layers)
		for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
			name := fmt.Sprintf("w%d/page%d/kv-%v/alternate=%v", c.window, c.pageSize, dt, c.layers != nil)
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f16, tol := dt == kvcache.F16, refTol[dt]
				want := refForward(m, toks, f16)
				// The reference must tell this window from its
				// neighbours, or the comparison proves nothing.
				if c.window < n {
					wider := refForward(windowed(base, c.window+1, c.layers), toks, f16)
					if d := worstDiff(wider, want); d < 10*tol {
						t.Fatalf("windows %d and %d differ by only %.3g: the test has no power", c.window, c.window+1, d)
					}
				}
				// Each layout of the steps, against the reference and
				// against the one-shot prefill.
				var oneShot [][]float32
				type layout struct {
					chunk int // 0: the whole prompt in one step
					drop  bool
				}
				ways := []layout{{0, false}, {1, false}, {5, false}, {c.pageSize + 1, false}}
				if c.layers == nil {
					// Giving back the pages behind the window after
					// each step, as the scheduler does, token by
					// token and in chunks (a chunk after a drop
					// takes the prefill path over a view whose
					// first pages are gone).
					ways = append(ways, layout{1, true}, layout{5, true}, layout{c.pageSize + 1, true})
				}
				for _, way := range ways {
					got := runChunks(t, m, dt, c.pageSize, way.chunk, toks, way.drop)
					if d, at := worstAt(got, want); d > tol {
						t.Errorf("chunk %d (drop %v): position %d differs from the reference by %.3g (relative) > %g", way.chunk, way.drop, at, d, tol)
					}
					if oneShot == nil {
						oneShot = got
					} else if d, at := worstAt(got, oneShot); d > layoutTol[dt] {
						t.Errorf("chunk %d (drop %v): position %d differs from one-shot prefill by %.3g > %g", way.chunk, way.drop, at, d, layoutTol[dt])
					}
				}
			})
		}
	}
}

// TestWindowZeroIsFullAttention checks that a window of 0 and a window
// longer than the sequence both leave attention as it was: the existing
// models and their goldens are untouched by the window's code.
func TestWindowZeroIsFullAttention(t *testing.T) {
	base := builtin(t, "tiny")
	toks := tokens(12, 20, base.Config.Vocab)
	full := runChunks(t, base, kvcache.F32, 16, 0, toks)
	long := runChunks(t, windowed(base, 20, nil), kvcache.F32, 16, 0, toks)
	if d, at := worstAt(long, full); d != 0 {
		t.Fatalf("a window as long as the sequence changed position %d by %.3g", at, d)
	}
	short := runChunks(t, windowed(base, 19, nil), kvcache.F32, 16, 0, toks)
	if d, _ := worstAt(short, full); d == 0 {
		t.Fatal("a window one shorter than the sequence changed nothing")
	}
}

func worstAt(got, want [][]float32) (float64, int) {
	if len(got) != len(want) {
		return math.Inf(1), -1
	}
	worst, at := 0.0, 0
	for p := range want {
		if d := relDiff(got[p], want[p]); d > worst || math.IsNaN(d) {
			worst, at = d, p
		}
	}
	return worst, at
}

func worstDiff(a, b [][]float32) float64 { d, _ := worstAt(a, b); return d }

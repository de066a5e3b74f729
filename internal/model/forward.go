package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// Layer holds one transformer block's weights.
type Layer struct {
	AttnNorm            []float32
	Q, K, V, O          *kernels.Matrix
	QBias, KBias, VBias []float32 // qwen2 only
	FFNNorm             []float32
	Gate, Up, Down      *kernels.Matrix
}

// Weights are the tensors of a model, already prepared for the kernels.
type Weights struct {
	Embed   *kernels.Matrix
	Layers  []Layer
	OutNorm []float32
	Output  *kernels.Matrix // == Embed when the output is tied
}

// LogitsMode says which positions of a sequence's step need logits.
type LogitsMode uint8

const (
	LogitsLast LogitsMode = iota // the last new token only (decode, end of prefill)
	LogitsNone                   // none (a prefill chunk that is not the last)
	LogitsAll                    // every new token (teacher forcing, scoring)
)

// Input is one sequence's share of a step: the new tokens and the verified
// window onto its KV pages where they go.
type Input struct {
	Tokens []int
	View   *kvcache.View
	Logits LogitsMode
}

// Errors from Forward.
var (
	ErrBadToken  = errors.New("model: token id out of range")
	ErrBadInput  = errors.New("model: step input does not match its KV view")
	ErrKVLayout  = errors.New("model: KV pool layout does not match the model")
	ErrEmptyStep = errors.New("model: empty step")
)

// Scratch holds the activations of a step, reused across steps to avoid
// allocating on the hot path. It is not safe for concurrent steps.
type Scratch struct {
	x, xb, q, k, v, att, hb, hb2, tmp []float32
	cos, sin                          []float32
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// Forward runs one step over a batch of sequences. For each input it returns
// the logits it asked for: LogitsLast gives one row of Vocab values,
// LogitsAll len(Tokens) rows back to back, LogitsNone nil. The keys and
// values of the new tokens are written through each input's View; the caller
// commits the views afterwards (kvcache.Pool.Commit) so that the positions
// count as filled only once the step succeeded.
func (m *Model) Forward(pool *kernels.Pool, in []Input, s *Scratch) ([][]float32, error) {
	c := &m.Config
	if s == nil {
		s = &Scratch{}
	}
	// Validate the whole batch before computing anything.
	total := 0
	for i := range in {
		it := &in[i]
		if len(it.Tokens) == 0 || it.View == nil || it.View.N() != len(it.Tokens) {
			n := -1
			if it.View != nil {
				n = it.View.N()
			}
			return nil, fmt.Errorf("%w: input %d has %d tokens for a window of %d", ErrBadInput, i, len(it.Tokens), n)
		}
		// A pool shaped for another model would be written out of
		// bounds (or worse, silently read with the wrong stride).
		if l := it.View.Layout(); l.Layers != c.Layers || l.KVHeads != c.KVHeads || l.HeadDim != c.HeadDim {
			return nil, fmt.Errorf("%w: input %d's pool has %d layers of %d kv heads x %d, the model %d of %d x %d",
				ErrKVLayout, i, l.Layers, l.KVHeads, l.HeadDim, c.Layers, c.KVHeads, c.HeadDim)
		}
		if it.View.Start()+len(it.Tokens) > c.ContextLength {
			return nil, fmt.Errorf("%w: input %d reaches position %d beyond the context length %d",
				ErrBadInput, i, it.View.Start()+len(it.Tokens), c.ContextLength)
		}
		for _, t := range it.Tokens {
			if t < 0 || t >= c.Vocab {
				return nil, fmt.Errorf("%w: %d (vocabulary has %d)", ErrBadToken, t, c.Vocab)
			}
		}
		total += len(it.Tokens)
	}
	if total == 0 {
		return nil, ErrEmptyStep
	}
	dim, qdim, kvdim, ffn := c.Dim, c.QDim(), c.KVDim(), c.FFN
	s.x = grow(s.x, total*dim)
	s.xb = grow(s.xb, total*max(dim, qdim))
	s.q = grow(s.q, total*qdim)
	s.k = grow(s.k, total*kvdim)
	s.v = grow(s.v, total*kvdim)
	s.att = grow(s.att, total*qdim)
	s.hb = grow(s.hb, total*ffn)
	s.hb2 = grow(s.hb2, total*ffn)
	s.tmp = grow(s.tmp, total*dim)
	half := c.RopeDims / 2
	s.cos = grow(s.cos, total*half)
	s.sin = grow(s.sin, total*half)

	// Token embeddings and the rotation angles of every new position.
	row := 0
	for i := range in {
		start := in[i].View.Start()
		for j, t := range in[i].Tokens {
			m.W.Embed.Row(t, s.x[row*dim:(row+1)*dim])
			c.ropeAngles(start+j, s.cos[row*half:(row+1)*half], s.sin[row*half:(row+1)*half])
			row++
		}
	}

	for l := range m.W.Layers {
		if err := m.layer(pool, l, in, s, total); err != nil {
			return nil, err
		}
	}

	// Final norm and logits for the rows that want them.
	out := make([][]float32, len(in))
	row = 0
	for i := range in {
		n := len(in[i].Tokens)
		var lo, hi int
		switch in[i].Logits {
		case LogitsNone:
			row += n
			continue
		case LogitsLast:
			lo, hi = row+n-1, row+n
		case LogitsAll:
			lo, hi = row, row+n
		}
		rows := hi - lo
		xs := s.xb[:rows*dim]
		for r := 0; r < rows; r++ {
			kernels.RMSNorm(xs[r*dim:(r+1)*dim], s.x[(lo+r)*dim:(lo+r+1)*dim], m.W.OutNorm, c.NormEps)
		}
		logits := make([]float32, rows*c.Vocab)
		kernels.MatMul(pool, logits, m.W.Output, xs, rows)
		out[i] = logits
		row += n
	}
	return out, nil
}

func (m *Model) layer(pool *kernels.Pool, l int, in []Input, s *Scratch, total int) error {
	c := &m.Config
	w := &m.W.Layers[l]
	dim, qdim, kvdim, ffn := c.Dim, c.QDim(), c.KVDim(), c.FFN
	half := c.RopeDims / 2

	// Attention block.
	for r := 0; r < total; r++ {
		kernels.RMSNorm(s.xb[r*dim:(r+1)*dim], s.x[r*dim:(r+1)*dim], w.AttnNorm, c.NormEps)
	}
	xb := s.xb[:total*dim]
	kernels.MatMul(pool, s.q, w.Q, xb, total)
	kernels.MatMul(pool, s.k, w.K, xb, total)
	kernels.MatMul(pool, s.v, w.V, xb, total)
	if w.QBias != nil {
		for r := 0; r < total; r++ {
			kernels.Add(s.q[r*qdim:(r+1)*qdim], w.QBias)
			kernels.Add(s.k[r*kvdim:(r+1)*kvdim], w.KBias)
			kernels.Add(s.v[r*kvdim:(r+1)*kvdim], w.VBias)
		}
	}
	for r := 0; r < total; r++ {
		cs, sn := s.cos[r*half:(r+1)*half], s.sin[r*half:(r+1)*half]
		c.applyRope(s.q[r*qdim:(r+1)*qdim], c.Heads, cs, sn)
		c.applyRope(s.k[r*kvdim:(r+1)*kvdim], c.KVHeads, cs, sn)
	}

	// A view that went stale (its sequence was released or moved on)
	// yields no pages; refuse here, in the caller's goroutine, rather than
	// index nil inside a worker.
	for i := range in {
		if in[i].View.K(l, 0) == nil && in[i].View.K16(l, 0) == nil {
			return fmt.Errorf("%w: input %d: its KV view yields no pages at layer %d", ErrBadInput, i, l)
		}
	}

	// Store the new keys and values in their pages.
	row := 0
	for i := range in {
		v := in[i].View
		ps := v.PageSize()
		for j := range in[i].Tokens {
			pos := v.Start() + j
			page, off := pos/ps, (pos%ps)*kvdim
			kr, vr := s.k[row*kvdim:(row+1)*kvdim], s.v[row*kvdim:(row+1)*kvdim]
			if kp := v.K(l, page); kp != nil {
				copy(kp[off:off+kvdim], kr)
				copy(v.V(l, page)[off:off+kvdim], vr)
			} else {
				k16, v16 := v.K16(l, page)[off:off+kvdim], v.V16(l, page)[off:off+kvdim]
				for d := range kvdim {
					k16[d] = quant.F32ToF16(kr[d])
					v16[d] = quant.F32ToF16(vr[d])
				}
			}
			row++
		}
	}

	// Attention: one task per (token, head), spread over the pool.
	type rowRef struct{ in, j int }
	refs := make([]rowRef, 0, total)
	for i := range in {
		for j := range in[i].Tokens {
			refs = append(refs, rowRef{i, j})
		}
	}
	heads := c.Heads
	group := c.Heads / c.KVHeads
	hd := c.HeadDim
	scale := float32(1 / math.Sqrt(float64(hd)))
	pool.Run(total*heads, func(lo, hi int) {
		var scores, q16 []float32
		for task := lo; task < hi; task++ {
			r, h := task/heads, task%heads
			ref := refs[r]
			v := in[ref.in].View
			ps := v.PageSize()
			n := v.Start() + ref.j + 1 // positions this token attends to
			if cap(scores) < n {
				scores = make([]float32, n)
			}
			scores = scores[:n]
			q := s.q[r*qdim+h*hd : r*qdim+(h+1)*hd]
			kvo := (h / group) * hd
			f16 := v.K(l, 0) == nil
			if f16 {
				// ggml multiplies an F16 cache by F16-rounded operands:
				// round q (and below the attention weights) the same way so
				// that an F16 cache tracks llama.cpp's.
				if cap(q16) < hd {
					q16 = make([]float32, hd)
				}
				q16 = q16[:hd]
				for d, x := range q {
					q16[d] = roundF16(x)
				}
				q = q16
			}
			for p := 0; p < n; p += ps {
				page := p / ps
				cnt := min(ps, n-p)
				if kp := v.K(l, page); kp != nil {
					for t := 0; t < cnt; t++ {
						scores[p+t] = kernels.Dot(q, kp[t*kvdim+kvo:t*kvdim+kvo+hd]) * scale
					}
				} else {
					kp16 := v.K16(l, page)
					for t := 0; t < cnt; t++ {
						scores[p+t] = kernels.DotF16(q, kp16[t*kvdim+kvo:t*kvdim+kvo+hd]) * scale
					}
				}
			}
			kernels.Softmax(scores)
			if f16 {
				for i, x := range scores {
					scores[i] = roundF16(x)
				}
			}
			out := s.att[r*qdim+h*hd : r*qdim+(h+1)*hd]
			clear(out)
			for p := 0; p < n; p += ps {
				page := p / ps
				cnt := min(ps, n-p)
				if vp := v.V(l, page); vp != nil {
					for t := 0; t < cnt; t++ {
						kernels.Axpy(out, scores[p+t], vp[t*kvdim+kvo:t*kvdim+kvo+hd])
					}
				} else {
					vp16 := v.V16(l, page)
					for t := 0; t < cnt; t++ {
						kernels.AxpyF16(out, scores[p+t], vp16[t*kvdim+kvo:t*kvdim+kvo+hd])
					}
				}
			}
		}
	})

	kernels.MatMul(pool, s.tmp, w.O, s.att[:total*qdim], total)
	kernels.Add(s.x[:total*dim], s.tmp[:total*dim])

	// Feed-forward block (SwiGLU).
	for r := 0; r < total; r++ {
		kernels.RMSNorm(s.xb[r*dim:(r+1)*dim], s.x[r*dim:(r+1)*dim], w.FFNNorm, c.NormEps)
	}
	kernels.MatMul(pool, s.hb, w.Gate, xb, total)
	kernels.MatMul(pool, s.hb2, w.Up, xb, total)
	kernels.SiLUMul(s.hb[:total*ffn], s.hb[:total*ffn], s.hb2[:total*ffn])
	kernels.MatMul(pool, s.tmp, w.Down, s.hb[:total*ffn], total)
	kernels.Add(s.x[:total*dim], s.tmp[:total*dim])
	return nil
}

func roundF16(x float32) float32 { return quant.F16ToF32(quant.F32ToF16(x)) }

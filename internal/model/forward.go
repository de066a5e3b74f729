package model

import (
	"errors"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// Layer holds one transformer block's weights.
type Layer struct {
	AttnNorm            []float32
	QKV                 Proj // query, key and value projections, in that order
	O                   *kernels.Matrix
	QBias, KBias, VBias []float32 // qwen2 only
	FFNNorm             []float32
	GateUp              Proj // feed-forward gate and up projections
	Down                *kernels.Matrix
	// PostAttnNorm and PostFFNNorm normalise the attention and
	// feed-forward outputs before they join the residual (gemma2); nil
	// for the others.
	PostAttnNorm, PostFFNNorm []float32
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
	x, xb, qkv, att, gu, hb, tmp, part []float32
	cos, sin                           []float32
	attn                               attnJob
	logits                             []float32 // ForwardReusing's
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
	return m.forward(pool, in, s, false)
}

// ForwardReusing is Forward with the logits computed into a buffer of s
// instead of a new one: the rows it returns are overwritten by the next
// ForwardReusing with s, so a caller uses it only if it is done with them
// by then (the serving executor samples and scores a step's rows before
// it runs the next). A fresh buffer per step cost a 16-sequence decode
// step of a 49k-token vocabulary 3 MB of page faults and zeroing, a tenth
// of its time. Every row returned is written whole by the step, and each
// is capped at its own length, so nothing of an earlier step can be read
// through them.
func (m *Model) ForwardReusing(pool *kernels.Pool, in []Input, s *Scratch) ([][]float32, error) {
	if s == nil {
		return nil, errors.New("model: ForwardReusing without a Scratch")
	}
	return m.forward(pool, in, s, true)
}

func (m *Model) forward(pool *kernels.Pool, in []Input, s *Scratch, reuse bool) ([][]float32, error) {
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
	s.qkv = grow(s.qkv, total*(qdim+2*kvdim))
	s.att = grow(s.att, total*qdim)
	s.gu = grow(s.gu, total*2*ffn)
	s.hb = grow(s.hb, total*ffn)
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
			if c.EmbedScale != 0 {
				scale(s.x[row*dim:(row+1)*dim], c.EmbedScale)
			}
			c.ropeAngles(start+j, s.cos[row*half:(row+1)*half], s.sin[row*half:(row+1)*half])
			row++
		}
	}

	s.attn.prepare(m, in, s, total)
	defer s.attn.release()
	for l := range m.W.Layers {
		if err := m.layer(pool, l, in, s, total); err != nil {
			return nil, err
		}
	}

	// Final norm and logits for the rows that want them, every input's in
	// one product: the output matrix is the largest of a small model
	// (135M: 49152 x 576), and a product per input would stream it once per
	// sequence of a decode batch. MatMul is batch-invariant, so each row's
	// logits are what a product of its own would give.
	out := make([][]float32, len(in))
	span := make([]int, len(in)) // logit rows of each input
	rows := 0
	row = 0
	for i := range in {
		n := len(in[i].Tokens)
		a, b := 0, 0
		switch in[i].Logits {
		case LogitsLast:
			a, b = row+n-1, row+n
		case LogitsAll:
			a, b = row, row+n
		}
		span[i] = b - a
		for r := a; r < b; r++ {
			kernels.RMSNorm(s.xb[rows*dim:(rows+1)*dim], s.x[r*dim:(r+1)*dim], m.W.OutNorm, c.NormEps)
			rows++
		}
		row += n
	}
	if rows == 0 {
		return out, nil
	}
	var logits []float32
	if reuse {
		s.logits = grow(s.logits, rows*c.Vocab)
		logits = s.logits
	} else {
		logits = make([]float32, rows*c.Vocab)
	}
	kernels.MatMul(pool, logits, m.W.Output, s.xb[:rows*dim], rows)
	if c.FinalSoftcap > 0 {
		softcap(logits, c.FinalSoftcap)
	}
	off := 0
	for i := range in {
		if n := span[i] * c.Vocab; n > 0 {
			out[i] = logits[off : off+n : off+n]
			off += n
		}
	}
	return out, nil
}

func (m *Model) layer(pool *kernels.Pool, l int, in []Input, s *Scratch, total int) error {
	c := &m.Config
	w := &m.W.Layers[l]
	dim, qdim, kvdim, ffn := c.Dim, c.QDim(), c.KVDim(), c.FFN
	half := c.RopeDims / 2
	// Row r of s.qkv is the token's query, key and value side by side.
	stride := qdim + 2*kvdim

	// Attention block.
	for r := 0; r < total; r++ {
		kernels.RMSNorm(s.xb[r*dim:(r+1)*dim], s.x[r*dim:(r+1)*dim], w.AttnNorm, c.NormEps)
	}
	xb := s.xb[:total*dim]
	w.QKV.mul(pool, s.qkv, xb, total, &s.part)
	for r := 0; r < total; r++ {
		row := s.qkv[r*stride : (r+1)*stride]
		q, k, v := row[:qdim], row[qdim:qdim+kvdim], row[qdim+kvdim:]
		if w.QBias != nil {
			kernels.Add(q, w.QBias)
			kernels.Add(k, w.KBias)
			kernels.Add(v, w.VBias)
		}
		cs, sn := s.cos[r*half:(r+1)*half], s.sin[r*half:(r+1)*half]
		c.applyRope(q, c.Heads, cs, sn)
		c.applyRope(k, c.KVHeads, cs, sn)
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
			kv := s.qkv[row*stride+qdim : (row+1)*stride]
			kr, vr := kv[:kvdim], kv[kvdim:]
			if kp := v.K(l, page); kp != nil {
				copy(kp[off:off+kvdim], kr)
				copy(v.V(l, page)[off:off+kvdim], vr)
			} else {
				kernels.F32ToF16s(v.K16(l, page)[off:off+kvdim], kr)
				kernels.F32ToF16s(v.V16(l, page)[off:off+kvdim], vr)
			}
			row++
		}
	}

	s.attn.run(pool, l)

	kernels.MatMul(pool, s.tmp, w.O, s.att[:total*qdim], total)
	postNorm(s.tmp, w.PostAttnNorm, dim, total, c.NormEps)
	kernels.Add(s.x[:total*dim], s.tmp[:total*dim])

	// Feed-forward block (SwiGLU, or GeGLU for gemma2). Row r of s.gu is
	// the token's gate and up projections side by side.
	for r := 0; r < total; r++ {
		kernels.RMSNorm(s.xb[r*dim:(r+1)*dim], s.x[r*dim:(r+1)*dim], w.FFNNorm, c.NormEps)
	}
	w.GateUp.mul(pool, s.gu, xb, total, &s.part)
	for r := 0; r < total; r++ {
		gu := s.gu[r*2*ffn : (r+1)*2*ffn]
		if c.FFNAct == ActGELU {
			geluMul(s.hb[r*ffn:(r+1)*ffn], gu[:ffn], gu[ffn:])
		} else {
			kernels.SiLUMul(s.hb[r*ffn:(r+1)*ffn], gu[:ffn], gu[ffn:])
		}
	}
	kernels.MatMul(pool, s.tmp, w.Down, s.hb[:total*ffn], total)
	postNorm(s.tmp, w.PostFFNNorm, dim, total, c.NormEps)
	kernels.Add(s.x[:total*dim], s.tmp[:total*dim])
	return nil
}

func roundF16(x float32) float32 { return quant.F16ToF32(quant.F32ToF16(x)) }

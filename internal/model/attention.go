package model

import (
	"math"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// attnShareMACs is the least attention work (multiply-adds) worth handing
// to another worker: below it a decode step's attention runs on the caller,
// since waking a worker costs more than the few heads it would take.
const attnShareMACs = 1 << 16

// attnJob is the attention of one step's new tokens: one task per (token,
// head), split into at most one contiguous chunk per worker. It lives in
// Scratch so that a step allocates nothing for it; fn, the method value
// handed to the pool, is made once.
type attnJob struct {
	m      *Model
	s      *Scratch
	rows   []attnRow // one per new token, in step order
	l      int       // the layer being computed
	tasks  int
	chunks int
	bufs   []attnBuf // one per chunk: each chunk runs on one goroutine
	work   int       // multiply-adds of the whole step's attention, per layer
	fn     func(lo, hi int)
	fnOf   *attnJob // the job fn is bound to: a copied Scratch rebinds
}

// attnRow is a new token's window onto its sequence.
type attnRow struct {
	view *kvcache.View
	n    int // positions it attends to, its own included
}

type attnBuf struct{ scores, q16 []float32 }

// prepare records the step's rows; the layers then call run.
func (j *attnJob) prepare(m *Model, in []Input, s *Scratch, total int) {
	j.m, j.s = m, s
	if cap(j.rows) < total {
		j.rows = make([]attnRow, 0, total)
	}
	j.rows = j.rows[:0]
	j.work = 0
	for i := range in {
		v := in[i].View
		for t := range in[i].Tokens {
			n := v.Start() + t + 1
			j.rows = append(j.rows, attnRow{view: v, n: n})
			j.work += 2 * n * m.Config.HeadDim * m.Config.Heads
		}
	}
	j.tasks = total * m.Config.Heads
	if j.fnOf != j {
		j.fn, j.fnOf = j.runChunks, j
	}
}

// release drops the step's views and model so the scratch pins nothing
// between steps.
func (j *attnJob) release() {
	clear(j.rows)
	j.rows = j.rows[:0]
	j.m, j.s = nil, nil
}

// run computes layer l's attention into s.att.
func (j *attnJob) run(pool *kernels.Pool, l int) {
	j.l = l
	j.chunks = max(1, min(pool.Threads(), j.tasks, j.work/attnShareMACs))
	if len(j.bufs) < j.chunks {
		j.bufs = append(j.bufs, make([]attnBuf, j.chunks-len(j.bufs))...)
	}
	if j.chunks == 1 {
		j.runChunks(0, 1)
		return
	}
	pool.Run(j.chunks, j.fn)
}

// runChunks computes the tasks of chunks [lo, hi).
func (j *attnJob) runChunks(lo, hi int) {
	for ch := lo; ch < hi; ch++ {
		b := &j.bufs[ch]
		for task := ch * j.tasks / j.chunks; task < (ch+1)*j.tasks/j.chunks; task++ {
			j.head(task, b)
		}
	}
}

// head computes one (token, head) task: scores over every position the
// token sees, softmax, and the weighted sum of values.
func (j *attnJob) head(task int, b *attnBuf) {
	c := &j.m.Config
	s, l := j.s, j.l
	heads, hd := c.Heads, c.HeadDim
	qdim, kvdim := c.QDim(), c.KVDim()
	stride := qdim + 2*kvdim
	group := c.Heads / c.KVHeads
	scale := c.Scale()
	softcap := c.AttnSoftcap

	r, h := task/heads, task%heads
	v := j.rows[r].view
	n := j.rows[r].n
	// lo is the first position the token sees: all of them, or the last
	// Window(l) under a sliding window (the query is at n-1).
	lo := 0
	if w := c.Window(l); w > 0 && n > w {
		lo = n - w
	}
	ps := v.PageSize()
	b.scores = grow(b.scores, n)
	scores := b.scores
	q := s.qkv[r*stride+h*hd : r*stride+(h+1)*hd]
	kvo := (h / group) * hd
	f16 := v.K(l, 0) == nil
	if f16 {
		// ggml multiplies an F16 cache by F16-rounded operands: round q
		// (and below the attention weights) the same way so that an F16
		// cache tracks llama.cpp's.
		b.q16 = grow(b.q16, hd)
		for d, x := range q {
			b.q16[d] = roundF16(x)
		}
		q = b.q16
	}
	for p := lo - lo%ps; p < n; p += ps {
		page := p / ps
		t0 := max(0, lo-p)
		cnt := min(ps, n-p)
		if kp := v.K(l, page); kp != nil {
			for t := t0; t < cnt; t++ {
				scores[p+t] = kernels.Dot(q, kp[t*kvdim+kvo:t*kvdim+kvo+hd]) * scale
			}
		} else {
			kp16 := v.K16(l, page)
			for t := t0; t < cnt; t++ {
				scores[p+t] = kernels.DotF16(q, kp16[t*kvdim+kvo:t*kvdim+kvo+hd]) * scale
			}
		}
	}
	if softcap > 0 {
		for i := lo; i < n; i++ {
			scores[i] = softcap * float32(math.Tanh(float64(scores[i]/softcap)))
		}
	}
	kernels.Softmax(scores[lo:n])
	if f16 {
		for i := lo; i < n; i++ {
			scores[i] = roundF16(scores[i])
		}
	}
	out := s.att[r*qdim+h*hd : r*qdim+(h+1)*hd]
	clear(out)
	for p := lo - lo%ps; p < n; p += ps {
		page := p / ps
		t0 := max(0, lo-p)
		cnt := min(ps, n-p)
		if vp := v.V(l, page); vp != nil {
			for t := t0; t < cnt; t++ {
				kernels.Axpy(out, scores[p+t], vp[t*kvdim+kvo:t*kvdim+kvo+hd])
			}
		} else {
			vp16 := v.V16(l, page)
			for t := t0; t < cnt; t++ {
				kernels.AxpyF16(out, scores[p+t], vp16[t*kvdim+kvo:t*kvdim+kvo+hd])
			}
		}
	}
}

package model

import (
	"math"
	"sort"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// Attention of a step's new tokens over their sequences' pages, as small
// matrix products (kernels.AttnGemm) rather than a dot product per (token,
// head, position) and an axpy per value.
//
// A prefill chunk (tileMinTokens or more new tokens of one sequence) is
// tiled: per layer its keys and values, read through the View page by
// page, are packed once per KV head as F32 (keys transposed), and then for
// each KV head and block of new tokens the query rows of every head
// sharing that KV head (about tileRows of them) meet all the keys they see
// in one product (queries x keys), each row gets its softmax, and the
// weights meet the values in a second product. A key or value vector is
// loaded once per block of rows instead of once per (token, head), and no
// dot product needs a horizontal sum: this is what keeps a 512-token
// prefill near the rate of a 128-token one.
//
// A decode token takes the same arithmetic page by page, without packing
// (decode): keys x queries for each page, then the weights x each page's
// values, continuing the same sums. Both paths sum each score as one FMA
// chain over the head dimension and each output as one chain over
// positions, so a token's attention has the same bits whichever path
// computes it: a prompt's logits do not depend on how it was chunked
// (TestAttentionSameBitsAnyChunking).
//
// The softmax is exact, not online (flash attention's running max): each
// row's scores over every position it sees are held (tileRows x positions
// floats per worker), get kernels.AttnSoftmax, which for an F16 cache
// rounds the weights to F16 before they meet the values, as ggml's non-flash path
// does (the llama.cpp goldens are recorded with it); an online softmax
// rescales partial sums and cannot round the final weights.

// attnShareMACs is the least attention work (multiply-adds) worth handing
// to another worker: below it a decode step's attention runs on the caller,
// since waking a worker costs more than the few heads it would take.
const attnShareMACs = 1 << 16

// tileMinTokens is the fewest new tokens of one input that take the tiled
// path. Packing costs positions x KV width per layer, which a block of
// tileMinTokens x group query rows repays many times over; a lone decode
// token would pay it for one row.
const tileMinTokens = 4

// tileRows is the number of query rows a tiled block aims for (its tokens
// times the heads sharing a KV head): enough to reuse each key vector
// loaded from cache across several register tiles of AttnGemm (6 rows
// each), few enough that a block's scores (rows x positions) stay in L2.
const tileRows = 32

// tilePackFloats bounds a prefill input's packed keys and values (floats,
// all KV heads: positions x KVDim x 2) and tileScoreFloats a block's scores
// (rows x positions). A longer sequence takes smaller blocks, and one whose
// pack would pass 64 MiB (some 32k positions of a 7B-class model's 1024 KV
// columns) takes the decode path token by token instead: the same bits
// (the two paths' arithmetic is the same), at a slower rate, rather than
// scratch memory that grows with the context without bound.
const (
	tilePackFloats  = 16 << 20
	tileScoreFloats = 1 << 20
)

// attnJob is the attention of one step's new tokens: one task per (token,
// KV head) of a decode input, one per (KV head, block of tokens) of a
// prefill input, split into chunks of about equal work. It lives in
// Scratch so that a step allocates nothing for it once its buffers have
// grown; fn and packFn, the method values handed to the pool, are made
// once.
type attnJob struct {
	m      *Model
	s      *Scratch
	rows   []attnRow  // decode inputs' tokens, in step order
	tiles  []attnTile // prefill inputs
	l      int        // the layer being computed
	tasks  int        // len(rows)*KVHeads, then the tiles' blocks
	cost   []int      // cost[i]: work of tasks [0, i), for chunking
	bounds []int      // chunk ch runs tasks [bounds[ch], bounds[ch+1])
	chunks int
	bufs   []attnBuf // one per chunk: each chunk runs on one goroutine
	work   int       // multiply-adds of the whole step's attention, per layer
	fn     func(lo, hi int)
	packFn func(lo, hi int)
	fnOf   *attnJob // the job fn is bound to: a copied Scratch rebinds
}

// attnRow is a decode token's window onto its sequence.
type attnRow struct {
	view *kvcache.View
	row  int // its row in the step (s.qkv, s.att)
	n    int // positions it attends to, its own included
}

// attnTile is a prefill input: its new tokens, step rows [row0, row0+t),
// sit at positions [start, start+t) of its sequence.
type attnTile struct {
	view           *kvcache.View
	row0, start, t int
	block          int // tokens per block
	blocks         int // blocks per KV head
	task0          int // its first task: (KV head kvh, block b) is task0 + kvh*blocks + b
	plo, npad      int // packed positions start at plo; npad columns per KV head (a multiple of 16)
	kt, vp         []float32
}

// attnBuf is one chunk's working memory.
type attnBuf struct{ scores, q, o, st, k32, v32 []float32 }

// prepare records the step's rows and tiles; the layers then call run.
func (j *attnJob) prepare(m *Model, in []Input, s *Scratch, total int) {
	c := &m.Config
	j.m, j.s = m, s
	j.rows = j.rows[:0]
	j.tiles = j.tiles[:0]
	j.work = 0
	group := c.Heads / c.KVHeads
	row := 0
	for i := range in {
		v := in[i].View
		t := len(in[i].Tokens)
		for k := range t {
			j.work += 2 * (v.Start() + k + 1) * c.HeadDim * c.Heads
		}
		end := v.Start() + t
		if t >= tileMinTokens && end*c.KVDim()*2 <= tilePackFloats {
			block := max(1, min(tileRows, tileScoreFloats/end)/group)
			j.tiles = append(j.tiles, attnTile{view: v, row0: row, start: v.Start(), t: t,
				block: block, blocks: (t + block - 1) / block,
				kt: tileBuf(j.tiles, len(j.tiles), 0), vp: tileBuf(j.tiles, len(j.tiles), 1)})
		} else {
			for k := range t {
				j.rows = append(j.rows, attnRow{view: v, row: row + k, n: v.Start() + k + 1})
			}
		}
		row += t
	}
	// Task costs, for chunks of equal work: a decode task's group of heads
	// sees n positions; a block's rows see about the positions of its
	// last token.
	j.tasks = len(j.rows) * c.KVHeads
	j.cost = append(j.cost[:0], 0)
	for _, r := range j.rows {
		for range c.KVHeads {
			j.cost = append(j.cost, j.cost[len(j.cost)-1]+r.n*group)
		}
	}
	for ti := range j.tiles {
		tl := &j.tiles[ti]
		tl.task0 = j.tasks
		j.tasks += c.KVHeads * tl.blocks
		for range c.KVHeads {
			for b := range tl.blocks {
				last := min(tl.t, (b+1)*tl.block)
				rows := (last - b*tl.block) * group
				j.cost = append(j.cost, j.cost[len(j.cost)-1]+rows*(tl.start+last))
			}
		}
	}
	if j.fnOf != j {
		j.fn, j.packFn, j.fnOf = j.runChunks, j.packChunks, j
	}
}

// tileBuf returns the packing buffer a tile in slot i had in an earlier
// step (which = 0: keys, 1: values), so that steps reuse them.
func tileBuf(tiles []attnTile, i, which int) []float32 {
	if i >= cap(tiles) {
		return nil
	}
	t := tiles[:cap(tiles)][i]
	if which == 0 {
		return t.kt
	}
	return t.vp
}

// release drops the step's views and model so the scratch pins nothing
// between steps (the packing buffers stay, for the next step).
func (j *attnJob) release() {
	clear(j.rows)
	j.rows = j.rows[:0]
	for i := range j.tiles {
		j.tiles[i].view = nil
	}
	j.tiles = j.tiles[:0]
	j.m, j.s = nil, nil
}

// run computes layer l's attention into s.att.
func (j *attnJob) run(pool *kernels.Pool, l int) {
	j.l = l
	if len(j.tiles) > 0 {
		j.packAll(pool)
	}
	chunks := pool.Threads()
	if len(j.tiles) > 0 {
		chunks *= 2 // blocks differ in cost: let a free worker take another
	}
	j.chunks = max(1, min(chunks, j.tasks, j.work/attnShareMACs))
	if len(j.bufs) < j.chunks {
		j.bufs = append(j.bufs, make([]attnBuf, j.chunks-len(j.bufs))...)
	}
	// Cut the tasks where the running cost crosses each chunk's share.
	j.bounds = append(j.bounds[:0], 0)
	total := j.cost[j.tasks]
	for ch := 1; ch < j.chunks; ch++ {
		share := total * ch / j.chunks
		j.bounds = append(j.bounds, max(j.bounds[ch-1], sort.SearchInts(j.cost[:j.tasks+1], share)))
	}
	j.bounds = append(j.bounds, j.tasks)
	if j.chunks == 1 {
		j.runChunks(0, 1)
		return
	}
	pool.Run(j.chunks, j.fn)
}

// runChunks computes the tasks of chunks [lo, hi).
func (j *attnJob) runChunks(lo, hi int) {
	kvHeads := j.m.Config.KVHeads
	for ch := lo; ch < hi; ch++ {
		b := &j.bufs[ch]
		for task := j.bounds[ch]; task < j.bounds[ch+1]; task++ {
			if task < len(j.rows)*kvHeads {
				j.decode(task, b)
				continue
			}
			ti := len(j.tiles) - 1
			for j.tiles[ti].task0 > task {
				ti--
			}
			tl := &j.tiles[ti]
			k := task - tl.task0
			j.tile(tl, k/tl.blocks, k%tl.blocks, b)
		}
	}
}

// windowLo is the first position a token that sees n positions (its own
// at n-1) attends to under window w: all of them for w = 0, else the last w.
func windowLo(n, w int) int {
	if w > 0 && n > w {
		return n - w
	}
	return 0
}

// packAll packs layer j.l's keys and values of every tile, one task per
// (tile, KV head).
func (j *attnJob) packAll(pool *kernels.Pool) {
	c := &j.m.Config
	hd := c.HeadDim
	w := c.Window(j.l)
	for ti := range j.tiles {
		tl := &j.tiles[ti]
		tl.plo = windowLo(tl.start+1, w)
		tl.npad = (tl.start + tl.t - tl.plo + 15) &^ 15
		tl.kt = grow(tl.kt, c.KVHeads*hd*tl.npad)
		tl.vp = grow(tl.vp, c.KVHeads*hd*tl.npad)
	}
	n := len(j.tiles) * c.KVHeads
	if n*hd*(j.tiles[0].npad) < attnShareMACs {
		j.packChunks(0, n)
		return
	}
	pool.Run(n, j.packFn)
}

// packChunks packs (tile, KV head) pairs [lo, hi) (tile-major).
func (j *attnJob) packChunks(lo, hi int) {
	kvh := j.m.Config.KVHeads
	for i := lo; i < hi; i++ {
		j.pack(&j.tiles[i/kvh], i%kvh)
	}
}

// pack copies the keys and values of KV head kvh at positions [plo,
// start+t) of the tile's sequence, read through its View page by page, as
// F32: keys transposed (kt[d*npad + p-plo], so that a block's product
// reads them along rows), values as they are (vp[(p-plo)*hd + d]). The
// columns past the last position are zeroed: the products read them (they
// cover whole vectors) and their weights are zero.
func (j *attnJob) pack(tl *attnTile, kvh int) {
	c := &j.m.Config
	hd, kvdim, l := c.HeadDim, c.KVDim(), j.l
	v := tl.view
	ps := v.PageSize()
	npad, end := tl.npad, tl.start+tl.t
	kt := tl.kt[kvh*hd*npad : (kvh+1)*hd*npad]
	vp := tl.vp[kvh*hd*npad : (kvh+1)*hd*npad]
	kvo := kvh * hd
	for p := tl.plo; p < end; {
		page, off := p/ps, p%ps
		cnt := min(ps-off, end-p)
		c0 := p - tl.plo
		at0 := off*kvdim + kvo
		if kp := v.K(l, page); kp != nil {
			vpg := v.V(l, page)
			for t := range cnt {
				at, col := at0+t*kvdim, c0+t
				for d, x := range kp[at : at+hd] {
					kt[d*npad+col] = x
				}
				copy(vp[col*hd:(col+1)*hd], vpg[at:at+hd])
			}
		} else {
			// F16 keys are converted into the values' slots, spread into
			// their columns, then overwritten by the values.
			rows := vp[c0*hd : (c0+cnt)*hd]
			kernels.F16ToF32Rows(rows, hd, v.K16(l, page)[at0:], kvdim, cnt, hd, nil)
			for t := range cnt {
				for d, x := range rows[t*hd : (t+1)*hd] {
					kt[d*npad+c0+t] = x
				}
			}
			kernels.F16ToF32Rows(rows, hd, v.V16(l, page)[at0:], kvdim, cnt, hd, nil)
		}
		p += cnt
	}
	for col := end - tl.plo; col < npad; col++ {
		for d := range hd {
			kt[d*npad+col] = 0
		}
	}
	clear(vp[(end-tl.plo)*hd:])
}

// tile computes KV head kvh's share of a block of a prefill input's new
// tokens: every head of the group, every token of the block.
func (j *attnJob) tile(tl *attnTile, kvh, blk int, b *attnBuf) {
	c := &j.m.Config
	s, l := j.s, j.l
	hd, group := c.HeadDim, c.Heads/c.KVHeads
	qdim, kvdim := c.QDim(), c.KVDim()
	stride := qdim + 2*kvdim
	w := c.Window(l)
	softcap := c.AttnSoftcap
	f16 := tl.view.K(l, 0) == nil
	tok0 := blk * tl.block
	tok1 := min(tl.t, tok0+tl.block)
	rows, gw := (tok1-tok0)*group, group*hd

	// The block's query rows: token-major, the group's heads side by
	// side as they sit in s.qkv (rounded to F16 for an F16 cache, as
	// decode rounds them).
	b.q = grow(b.q, rows*hd)
	for tk := tok0; tk < tok1; tk++ {
		src := s.qkv[(tl.row0+tk)*stride+kvh*gw : (tl.row0+tk)*stride+(kvh+1)*gw]
		dst := b.q[(tk-tok0)*gw : (tk-tok0+1)*gw]
		copy(dst, src)
	}
	if f16 {
		kernels.RoundF16s(b.q[:rows*hd])
	}

	// Columns [c0, c0+cols) of the pack hold every position a row of the
	// block sees (c0 rounded down to a vector).
	first := tl.start + tok0 + 1 // positions the block's first token sees
	c0 := (windowLo(first, w) - tl.plo) &^ 15
	cols := (tl.start + tok1 - tl.plo - c0 + 15) &^ 15
	b.scores = grow(b.scores, rows*cols)
	npad := tl.npad
	kernels.AttnGemm(b.scores, cols, b.q, hd, tl.kt[kvh*hd*npad+c0:(kvh+1)*hd*npad], npad, rows, cols, hd, c.Scale())

	// Each row's softmax over the positions its token sees; zero weight
	// for the others (later tokens of the block, positions behind the
	// window, the pad).
	for i := range rows {
		n := tl.start + tok0 + i/group + 1
		a, e := windowLo(n, w)-tl.plo-c0, n-tl.plo-c0
		sc := b.scores[i*cols : (i+1)*cols]
		attnWeights(sc[a:e], softcap, f16)
		clear(sc[:a])
		clear(sc[e:])
	}

	b.o = grow(b.o, rows*hd)
	kernels.AttnGemm(b.o, hd, b.scores, cols, tl.vp[(kvh*npad+c0)*hd:(kvh+1)*npad*hd], hd, rows, hd, cols, 1)
	for tk := tok0; tk < tok1; tk++ {
		copy(s.att[(tl.row0+tk)*qdim+kvh*gw:(tl.row0+tk)*qdim+(kvh+1)*gw], b.o[(tk-tok0)*gw:(tk-tok0+1)*gw])
	}
}

// decode computes task's share of a decode token: one KV head and every
// query head sharing it. It is tile's arithmetic, page by page: the scores
// of a page's keys are a product keys x queries (kernels.AttnGemm with the
// keys read in place from the page, the query rows transposed into
// columns padded to whole vectors), which sums each score as the same FMA
// chain over the head dimension as tile's queries x transposed keys; the
// weights meet each page's values in a product that continues the same
// chain over positions (kernels.AttnGemmAcc). So a token's attention has
// the same bits whether its sequence's new tokens arrive one at a time or
// as one prefill.
func (j *attnJob) decode(task int, b *attnBuf) {
	c := &j.m.Config
	s, l := j.s, j.l
	hd, group := c.HeadDim, c.Heads/c.KVHeads
	qdim, kvdim := c.QDim(), c.KVDim()
	stride := qdim + 2*kvdim
	gw := group * hd
	ar, kvh := &j.rows[task/c.KVHeads], task%c.KVHeads
	v, n, r := ar.view, ar.n, ar.row
	lo := windowLo(n, c.Window(l))
	ps := v.PageSize()
	f16 := v.K(l, 0) == nil
	kvo := kvh * hd

	// The group's query rows as columns: qt[d*gp + g], zero past group
	// (padded to the kernels' vector width: 3 query heads per KV head
	// compute 8 columns on AVX2, 16 on AVX-512; each output is its own
	// FMA chain, so the padding never changes a score's bits).
	lanes := kernels.AttnLanes()
	gp := (group + lanes - 1) / lanes * lanes
	b.q = grow(b.q, hd*gp)
	clear(b.q)
	// (b.o holds the rows meanwhile, rounded to F16 for an F16 cache.)
	b.o = grow(b.o, gw)
	q := b.o
	copy(q, s.qkv[r*stride+kvh*gw:r*stride+(kvh+1)*gw])
	if f16 {
		kernels.RoundF16s(q)
	}
	for g := range group {
		for d, x := range q[g*hd : (g+1)*hd] {
			b.q[d*gp+g] = x
		}
	}

	// Scores of positions [lo, n), row g of b.scores for head g.
	seen := n - lo
	b.scores = grow(b.scores, group*seen)
	b.st = grow(b.st, ps*gp)
	for p := lo - lo%ps; p < n; p += ps {
		page := p / ps
		t0 := max(0, lo-p)
		cnt := min(ps, n-p)
		// Prefetched meanwhile: the next page's keys, after the last the
		// first page's values.
		var next []uint16
		if f16 && p+ps < n {
			next = v.K16(l, page+1)[kvo:]
		} else if f16 {
			next = v.V16(l, lo/ps)[kvo:]
		}
		keys, ks := j.pageRows(b, f16, v.K(l, page), v.K16(l, page), next, t0, cnt, kvo, kvdim, hd, 0)
		kernels.AttnGemm(b.st, gp, keys, ks, b.q, gp, cnt-t0, gp, hd, c.Scale())
		for t := t0; t < cnt; t++ {
			col := p + t - lo
			row := b.st[(t-t0)*gp:]
			for g := range group {
				b.scores[g*seen+col] = row[g]
			}
		}
	}
	for g := range group {
		attnWeights(b.scores[g*seen:(g+1)*seen], c.AttnSoftcap, f16)
	}

	b.o = grow(b.o, gw)
	clear(b.o)
	for p := lo - lo%ps; p < n; p += ps {
		page := p / ps
		t0 := max(0, lo-p)
		cnt := min(ps, n-p)
		var next []uint16
		if f16 && p+ps < n {
			next = v.V16(l, page+1)[kvo:]
		}
		vals, vs := j.pageRows(b, f16, v.V(l, page), v.V16(l, page), next, t0, cnt, kvo, kvdim, hd, 1)
		kernels.AttnGemmAcc(b.o, hd, b.scores[p+t0-lo:], seen, vals, vs, group, hd, cnt-t0)
	}
	copy(s.att[r*qdim+kvh*gw:r*qdim+(kvh+1)*gw], b.o)
}

// pageRows returns rows [t0, cnt) of a page's KV head (at column kvo) as
// F32 rows and their stride: the page itself for an F32 cache, else the
// rows converted into one of b's buffers (which: 0 keys, 1 values) while
// next (the page read after this one, from the same column) is prefetched.
func (j *attnJob) pageRows(b *attnBuf, f16 bool, p32 []float32, p16, next []uint16, t0, cnt, kvo, kvdim, hd, which int) ([]float32, int) {
	if !f16 {
		return p32[t0*kvdim+kvo:], kvdim
	}
	buf := &b.k32
	if which == 1 {
		buf = &b.v32
	}
	*buf = grow(*buf, (cnt-t0)*hd)
	kernels.F16ToF32Rows(*buf, hd, p16[t0*kvdim+kvo:], kvdim, cnt-t0, hd, next)
	return *buf, hd
}

// attnWeights turns a row of scores into attention weights in place: the
// soft-cap (gemma2), the softmax, and for an F16 cache the rounding of the
// weights to F16 (ggml multiplies F16 values by F16-rounded weights).
func attnWeights(x []float32, softcap float32, f16 bool) {
	if softcap > 0 {
		for k, v := range x {
			x[k] = softcap * float32(math.Tanh(float64(v/softcap)))
		}
	}
	kernels.AttnSoftmax(x, f16)
}

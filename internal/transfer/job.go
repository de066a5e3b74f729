package transfer

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
)

// The request plane: what the gateway sends a node about a request besides
// the handoff itself, and what comes back. These messages travel in the
// same frames, through the same bounded decoder, as the handoff's.
//
//	job       := maxTokens:int nPrompt:u32 prompt:u32×nPrompt
//	             temperature:f32 topK:int topP:f32 minP:f32 repetition:f32 seed:u64
//	             presence:f32 frequency:f32 nBias:u16 bias×nBias
//	             nStop:u8 stop:u32×nStop ignoreEOS:u8 salt:str16 priority:i32
//	             constraint logprobs:u8 topLogprobs:u8 forced
//	             promptLogprobs:u8 promptTopLogprobs:u8
//	bias      := token:u32 bias:f32                (tokens strictly increasing)
//	constraint := kind:u8                          0: none
//	            | kind:u8 strict:u8 schema:bytes32 1: json_object (no schema),
//	                                               2: json_schema, 3: a tool call
//	                                               (≤ grammar.MaxSchemaBytes)
//	forced    := has:u8 [n:u32 id:u32×n]           (teacher forcing: the replay audit)
//	str16     := len:u16 bytes                     (≤ MaxSaltLen)
//	Generate  := Reserve job                       gateway → decode
//	Prefill   := Grant decode:str job              gateway → prefill
//	Tokens    := ref start:int n:u16 id:u32×n has:u8 logprobs×n   decode → gateway
//	                                               (logprobs.go)
//	Result    := ref reason:u8 code:u8 transferReason:u16
//	             prompt:int completion:int cached:int   decode/prefill → gateway
//
// A job's numbers are checked on decode as the gateway checked them on
// the way in: finite sampling values in their ranges, token ids in int32,
// bounded lists (a logit bias sorted, each token once), a boolean 0 or 1.
// A peer cannot hand a node a NaN temperature or a negative max_tokens.
// An output constraint travels as its spec and is compiled again on
// decode (package grammar's checks, the same as the gateway's), so a peer
// cannot hand a node a schema the gateway would have refused; the decode
// node's automaton replays the first token the prefill node drew under it.

// Bounds of the request plane.
const (
	MaxPromptTokens = 1 << 22 // tokens of one prompt on the wire
	MaxStopTokens   = request.MaxStopTokens
	MaxLogitBias    = request.MaxLogitBias
	MaxSaltLen      = 4096
	MaxTokensPerMsg = 4096
	// MaxForcedTokens bounds a teacher-forced job's tokens (the replay
	// audit's): no more than a context window's worth.
	MaxForcedTokens = MaxPromptTokens
)

// Job is a request's parameters as the gateway admitted them: everything
// a node needs to run it except the owner, which travels in the message.
type Job struct {
	Prompt     []int
	MaxTokens  int
	Sampling   request.Sampling
	StopTokens []int
	IgnoreEOS  bool
	CacheSalt  string
	Priority   int
}

// JobOf and Params convert between a Job and request.Params.
func JobOf(p request.Params) Job {
	return Job{Prompt: p.Prompt, MaxTokens: p.MaxTokens, Sampling: p.Sampling, StopTokens: p.StopTokens, IgnoreEOS: p.IgnoreEOS,
		CacheSalt: p.CacheSalt, Priority: p.Priority}
}

// Params is the request j describes for owner.
func (j Job) Params(owner request.Owner) request.Params {
	return request.Params{Owner: owner, Prompt: j.Prompt, MaxTokens: j.MaxTokens, Sampling: j.Sampling, StopTokens: j.StopTokens,
		IgnoreEOS: j.IgnoreEOS, CacheSalt: j.CacheSalt, Priority: j.Priority}
}

// Generate asks a decode node to take a request: reserve pages for its
// prompt (the Reserve part, answered by Grant) and decode it once Sender's
// handoff commits, streaming Tokens and one Result to the gateway.
type Generate struct {
	Reserve
	Job Job
}

// Prefill asks a prefill node to compute a request's prompt and hand it
// to Decode under the grant.
type Prefill struct {
	Grant  Grant
	Decode Peer
	Job    Job
}

// Tokens are generated tokens Start, Start+1, ... of a request, with
// their log-probabilities (one each) when the request asked for them.
type Tokens struct {
	Ref
	Start    int
	IDs      []int
	Logprobs []*request.Logprobs
	// Prompt are the prompt logprobs (request.Token.Prompt), only in the
	// message that starts at 0, when the request asked for them.
	Prompt []request.Logprobs
}

// ErrorCode classifies why a request failed, for the gateway's answer.
type ErrorCode uint8

const (
	CodeNone          ErrorCode = iota
	CodeAborted                 // request.ErrAborted
	CodeShuttingDown            // request.ErrShuttingDown
	CodeOverloaded              // request.ErrOverloaded
	CodeContextLength           // request.ErrContextLength
	CodeQuota                   // request.ErrQuota
	CodeHandoff                 // the handoff failed (Result.Handoff says why)
	CodeInternal                // anything else
	numCodes
)

// CodeOf classifies err.
func CodeOf(err error) ErrorCode {
	switch {
	case err == nil:
		return CodeNone
	case errors.Is(err, request.ErrAborted):
		return CodeAborted
	case errors.Is(err, request.ErrShuttingDown):
		return CodeShuttingDown
	case errors.Is(err, request.ErrOverloaded):
		return CodeOverloaded
	case errors.Is(err, request.ErrContextLength):
		return CodeContextLength
	case errors.Is(err, request.ErrQuota):
		return CodeQuota
	case errors.Is(err, ErrRefused), errors.Is(err, ErrAborted):
		return CodeHandoff
	}
	return CodeInternal
}

// Err is the sentinel error the code stands for (nil for CodeNone).
func (c ErrorCode) Err() error {
	switch c {
	case CodeNone:
		return nil
	case CodeAborted:
		return request.ErrAborted
	case CodeShuttingDown:
		return request.ErrShuttingDown
	case CodeOverloaded:
		return request.ErrOverloaded
	case CodeContextLength:
		return request.ErrContextLength
	case CodeQuota:
		return request.ErrQuota
	}
	return request.ErrInternal
}

// Result is a request's end as the node that ran it saw it.
type Result struct {
	Ref
	Reason  request.FinishReason
	Code    ErrorCode
	Handoff Reason // with CodeHandoff
	Usage   request.Usage
}

func (*Generate) Type() MsgType { return MsgGenerate }
func (*Prefill) Type() MsgType  { return MsgPrefill }
func (*Tokens) Type() MsgType   { return MsgTokens }
func (*Result) Type() MsgType   { return MsgResult }

func (e *encoder) str16(field, v string, limit int) {
	if len(v) > limit {
		e.fail("%s of %d bytes (limit %d)", field, len(v), limit)
		return
	}
	e.u16(uint16(len(v)))
	e.b = append(e.b, v...)
}

func (e *encoder) ids(field string, v []int, limit int, wide bool) {
	if len(v) > limit {
		e.fail("%s: %d entries (limit %d)", field, len(v), limit)
		return
	}
	switch {
	case wide:
		e.u32(uint32(len(v)))
	case limit <= math.MaxUint8:
		e.u8(uint8(len(v)))
	default:
		e.u16(uint16(len(v)))
	}
	for _, id := range v {
		e.int32(field, id, maxInt32)
	}
}

func (e *encoder) f32(field string, v float32, lo, hi float32) {
	if !(v >= lo && v <= hi) {
		e.fail("%s %v out of range %v..%v", field, v, lo, hi)
		return
	}
	e.u32(math.Float32bits(v))
}

// Sampling ranges on the wire: wider than the API's where that costs
// nothing, never NaN or infinite.
const (
	maxTemperature = 100
	maxPenalty     = 100
)

func (e *encoder) biases(v []request.TokenBias) {
	if len(v) > MaxLogitBias {
		e.fail("logit bias: %d entries (limit %d)", len(v), MaxLogitBias)
		return
	}
	e.u16(uint16(len(v)))
	for i, b := range v {
		if i > 0 && b.Token <= v[i-1].Token {
			e.fail("logit bias: token %d after %d (sorted, each once)", b.Token, v[i-1].Token)
			return
		}
		e.int32("logit bias token", b.Token, maxInt32)
		e.f32("logit bias", b.Bias, -request.MaxBias, request.MaxBias)
	}
}

func (e *encoder) job(j *Job) {
	e.int32("max tokens", j.MaxTokens, maxInt32)
	e.ids("prompt", j.Prompt, MaxPromptTokens, true)
	s := j.Sampling
	e.f32("temperature", s.Temperature, 0, maxTemperature)
	e.int32("top k", s.TopK, maxInt32)
	e.f32("top p", s.TopP, 0, 1)
	e.f32("min p", s.MinP, 0, 1)
	e.f32("repetition penalty", s.RepetitionPenalty, 0, maxPenalty)
	e.u64(s.Seed)
	e.f32("presence penalty", s.PresencePenalty, -maxPenalty, maxPenalty)
	e.f32("frequency penalty", s.FrequencyPenalty, -maxPenalty, maxPenalty)
	e.biases(s.LogitBias)
	e.ids("stop tokens", j.StopTokens, MaxStopTokens, false)
	if j.IgnoreEOS {
		e.u8(1)
	} else {
		e.u8(0)
	}
	e.str16("cache salt", j.CacheSalt, MaxSaltLen)
	if j.Priority < math.MinInt32 || j.Priority > math.MaxInt32 {
		e.fail("priority %d out of int32", j.Priority)
		return
	}
	e.u32(uint32(int32(j.Priority)))
	e.constraint(j.Sampling.Grammar)
	if !e.logprobFlags("top logprobs", "logprobs", s.Logprobs, s.TopLogprobs) {
		return
	}
	e.forced(s.Forced, j.MaxTokens)
	e.logprobFlags("prompt top logprobs", "prompt logprobs", s.PromptLogprobs, s.PromptTopLogprobs)
}

// logprobFlags writes whether logprobs (or prompt logprobs) are asked and
// how many alternatives (topName), refusing a count out of range or given
// without the flag; it reports whether it wrote them.
func (e *encoder) logprobFlags(topName, flagName string, on bool, top int) bool {
	if top < 0 || top > request.MaxTopLogprobs || (top > 0 && !on) {
		e.fail("%s %d (%s %v, limit %d)", topName, top, flagName, on, request.MaxTopLogprobs)
		return false
	}
	if on {
		e.u8(1)
	} else {
		e.u8(0)
	}
	e.u8(uint8(top))
	return true
}

func (e *encoder) constraint(g *grammar.Grammar) {
	if g == nil {
		e.u8(0)
		return
	}
	sp := g.Spec()
	switch {
	case sp.Kind != grammar.JSONObject && sp.Kind != grammar.JSONSchema && sp.Kind != grammar.ToolCall:
		e.fail("constraint of kind %d", sp.Kind)
		return
	case sp.Kind == grammar.JSONObject && (sp.Strict || len(sp.Schema) > 0):
		e.fail("json_object constraint with a schema")
		return
	}
	e.u8(uint8(sp.Kind))
	if sp.Strict {
		e.u8(1)
	} else {
		e.u8(0)
	}
	e.bytes("constraint schema", sp.Schema, grammar.MaxSchemaBytes)
}

func (e *encoder) reserveBody(m *Reserve) {
	e.owner(m.Owner)
	e.u64(m.Epoch)
	e.int32("prompt tokens", m.PromptTokens, maxInt32)
	e.int32("max new tokens", m.MaxNewTokens, maxInt32)
	e.str("sender", string(m.Sender))
}

func (e *encoder) grantBody(m *Grant) {
	e.ref(m.Ref)
	e.int32("page count", m.PageCount, MaxPages)
	e.int32("prompt tokens", m.PromptTokens, maxInt32)
	e.int32("max new tokens", m.MaxNewTokens, maxInt32)
	e.int64("lease", int64(m.LeaseTTL))
}

func (e *encoder) requestPlane(m Message) bool {
	switch m := m.(type) {
	case *Generate:
		e.reserveBody(&m.Reserve)
		e.job(&m.Job)
		if len(m.Job.Prompt) != m.PromptTokens || m.Job.MaxTokens != m.MaxNewTokens {
			e.fail("generate: reserve for %d+%d tokens, job of %d+%d", m.PromptTokens, m.MaxNewTokens, len(m.Job.Prompt), m.Job.MaxTokens)
		}
	case *Prefill:
		e.grantBody(&m.Grant)
		e.str("decode", string(m.Decode))
		e.job(&m.Job)
	case *Tokens:
		e.ref(m.Ref)
		e.int32("start", m.Start, maxInt32)
		e.ids("tokens", m.IDs, MaxTokensPerMsg, false)
		e.tokenLogprobs(m)
		if m.Prompt != nil && m.Start != 0 {
			e.fail("tokens from %d with prompt logprobs", m.Start)
		}
		e.promptLogprobs("prompt logprobs", m.Prompt)
	case *Result:
		e.ref(m.Ref)
		if m.Reason > request.FinishError || m.Code >= numCodes {
			e.fail("result reason %d, code %d", m.Reason, m.Code)
			return true
		}
		e.u8(uint8(m.Reason))
		e.u8(uint8(m.Code))
		e.u16(uint16(m.Handoff))
		e.int32("prompt tokens", m.Usage.PromptTokens, maxInt32)
		e.int32("completion tokens", m.Usage.CompletionTokens, maxInt32)
		e.int32("cached tokens", m.Usage.CachedTokens, maxInt32)
	default:
		return false
	}
	return true
}

func (d *decoder) str16(field string, limit int) string {
	n := int(d.u16())
	if n > limit {
		d.fail("%s of %d bytes (limit %d)", field, n, limit)
		return ""
	}
	return string(d.take(n, field))
}

func (d *decoder) ids(field string, limit int, wide bool) []int {
	var n int
	switch {
	case wide:
		n = int(d.u32())
	case limit <= math.MaxUint8:
		n = int(d.u8())
	default:
		n = int(d.u16())
	}
	if n > limit {
		d.fail("%s: %d entries (limit %d)", field, n, limit)
		return nil
	}
	if d.err != nil || n == 0 {
		return nil
	}
	if 4*n > len(d.b) {
		d.fail("%s: %d entries need %d bytes, %d remain", field, n, 4*n, len(d.b))
		return nil
	}
	v := make([]int, n)
	for i := range v {
		v[i] = d.int32(field, maxInt32)
	}
	return v
}

func (d *decoder) f32(field string, lo, hi float32) float32 {
	v := math.Float32frombits(d.u32())
	if !(v >= lo && v <= hi) {
		d.fail("%s %v out of range %v..%v", field, v, lo, hi)
		return 0
	}
	return v
}

func (d *decoder) biases() []request.TokenBias {
	n := int(d.u16())
	if n > MaxLogitBias {
		d.fail("logit bias: %d entries (limit %d)", n, MaxLogitBias)
		return nil
	}
	if d.err != nil || n == 0 {
		return nil
	}
	if 8*n > len(d.b) {
		d.fail("logit bias: %d entries need %d bytes, %d remain", n, 8*n, len(d.b))
		return nil
	}
	v := make([]request.TokenBias, n)
	for i := range v {
		v[i].Token = d.int32("logit bias token", maxInt32)
		v[i].Bias = d.f32("logit bias", -request.MaxBias, request.MaxBias)
		if d.err == nil && i > 0 && v[i].Token <= v[i-1].Token {
			d.fail("logit bias: token %d after %d (sorted, each once)", v[i].Token, v[i-1].Token)
		}
	}
	if d.err != nil {
		return nil
	}
	return v
}

func (d *decoder) job() Job {
	var j Job
	j.MaxTokens = d.int32("max tokens", maxInt32)
	j.Prompt = d.ids("prompt", MaxPromptTokens, true)
	j.Sampling.Temperature = d.f32("temperature", 0, maxTemperature)
	j.Sampling.TopK = d.int32("top k", maxInt32)
	j.Sampling.TopP = d.f32("top p", 0, 1)
	j.Sampling.MinP = d.f32("min p", 0, 1)
	j.Sampling.RepetitionPenalty = d.f32("repetition penalty", 0, maxPenalty)
	j.Sampling.Seed = d.u64()
	j.Sampling.PresencePenalty = d.f32("presence penalty", -maxPenalty, maxPenalty)
	j.Sampling.FrequencyPenalty = d.f32("frequency penalty", -maxPenalty, maxPenalty)
	j.Sampling.LogitBias = d.biases()
	j.StopTokens = d.ids("stop tokens", MaxStopTokens, false)
	j.IgnoreEOS = d.bool("ignore eos")
	j.CacheSalt = d.str16("cache salt", MaxSaltLen)
	j.Priority = int(int32(d.u32()))
	j.Sampling.Grammar = d.constraint()
	j.Sampling.Logprobs = d.bool("logprobs")
	j.Sampling.TopLogprobs = int(d.u8())
	if d.err == nil && (j.Sampling.TopLogprobs > request.MaxTopLogprobs || (j.Sampling.TopLogprobs > 0 && !j.Sampling.Logprobs)) {
		d.fail("top logprobs %d (logprobs %v, limit %d)", j.Sampling.TopLogprobs, j.Sampling.Logprobs, request.MaxTopLogprobs)
	}
	j.Sampling.Forced = d.forced(j.MaxTokens)
	j.Sampling.PromptLogprobs = d.bool("prompt logprobs")
	j.Sampling.PromptTopLogprobs = int(d.u8())
	if d.err == nil && (j.Sampling.PromptTopLogprobs > request.MaxTopLogprobs || (j.Sampling.PromptTopLogprobs > 0 && !j.Sampling.PromptLogprobs)) {
		d.fail("prompt top logprobs %d (prompt logprobs %v, limit %d)", j.Sampling.PromptTopLogprobs, j.Sampling.PromptLogprobs, request.MaxTopLogprobs)
	}
	return j
}

// constraint decodes and compiles an output constraint: whatever grammar
// refuses is refused here, as the gateway refused it.
func (d *decoder) constraint() *grammar.Grammar {
	k := d.u8()
	if d.err != nil || k == 0 {
		return nil
	}
	sp := grammar.Spec{Kind: grammar.Kind(k), Strict: d.bool("constraint strict")}
	if b := d.bytes("constraint schema", grammar.MaxSchemaBytes); len(b) > 0 {
		sp.Schema = slices.Clone(b) // the grammar keeps it; the frame's buffer is reused
	}
	if d.err != nil {
		return nil
	}
	g, err := grammar.Compile(sp)
	if err != nil {
		d.fail("constraint: %v", err)
		return nil
	}
	return g
}

func (d *decoder) grant() Grant {
	return Grant{Ref: d.ref(), PageCount: d.int32("page count", MaxPages), PromptTokens: d.int32("prompt tokens", maxInt32),
		MaxNewTokens: d.int32("max new tokens", maxInt32), LeaseTTL: Duration(d.int64("lease"))}
}

func (d *decoder) requestPlane(t MsgType) Message {
	switch t {
	case MsgGenerate:
		g := &Generate{Reserve: *d.reserve()}
		g.Job = d.job()
		if d.err == nil && (len(g.Job.Prompt) != g.PromptTokens || g.Job.MaxTokens != g.MaxNewTokens) {
			d.fail("generate: reserve for %d+%d tokens, job of %d+%d", g.PromptTokens, g.MaxNewTokens, len(g.Job.Prompt), g.Job.MaxTokens)
		}
		return g
	case MsgPrefill:
		p := &Prefill{Grant: d.grant()}
		p.Decode = Peer(d.str("decode"))
		p.Job = d.job()
		return p
	case MsgTokens:
		t := &Tokens{Ref: d.ref(), Start: d.int32("start", maxInt32), IDs: d.ids("tokens", MaxTokensPerMsg, false)}
		t.Logprobs = d.tokenLogprobs(len(t.IDs))
		t.Prompt = d.promptLogprobs("prompt logprobs")
		if d.err == nil && t.Prompt != nil && t.Start != 0 {
			d.fail("tokens from %d with prompt logprobs", t.Start)
		}
		return t
	case MsgResult:
		r := &Result{Ref: d.ref()}
		r.Reason = request.FinishReason(d.u8())
		r.Code = ErrorCode(d.u8())
		r.Handoff = Reason(d.u16())
		r.Usage.PromptTokens = d.int32("prompt tokens", maxInt32)
		r.Usage.CompletionTokens = d.int32("completion tokens", maxInt32)
		r.Usage.CachedTokens = d.int32("cached tokens", maxInt32)
		if d.err == nil && (r.Reason > request.FinishError || r.Code >= numCodes) {
			d.fail("result reason %d, code %d", r.Reason, r.Code)
		}
		return r
	}
	d.fail("message type %v", t)
	return nil
}

func (c ErrorCode) String() string {
	names := [...]string{"none", "aborted", "shutting_down", "overloaded", "context_length", "quota", "handoff", "internal"}
	if int(c) < len(names) {
		return names[c]
	}
	return fmt.Sprintf("ErrorCode(%d)", uint8(c))
}

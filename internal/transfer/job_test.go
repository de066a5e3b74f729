package transfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
)

func mustGrammar(kind grammar.Kind, strict bool, schema string) *grammar.Grammar {
	var b []byte
	if schema != "" {
		b = []byte(schema)
	}
	g, err := grammar.Compile(grammar.Spec{Kind: kind, Strict: strict, Schema: b})
	if err != nil {
		panic(err)
	}
	return g
}

const jobSchema = `{"type":"object","properties":{"a":{"enum":["x",1]}},"required":["a"],"additionalProperties":false}`

func sampleJob() Job {
	return Job{
		Prompt: []int{1, 200, 3, 1<<31 - 1}, MaxTokens: 30,
		Sampling: request.Sampling{Temperature: 0.7, TopK: 40, TopP: 0.9, MinP: 0.05, RepetitionPenalty: 1.1, Seed: 1<<64 - 1,
			PresencePenalty: -1.5, FrequencyPenalty: 2,
			LogitBias: []request.TokenBias{{Token: 0, Bias: -request.MaxBias}, {Token: 261, Bias: 0.5}, {Token: 1<<31 - 1, Bias: request.MaxBias}},
			Grammar:   mustGrammar(grammar.JSONSchema, true, jobSchema),
			Logprobs:  true, TopLogprobs: request.MaxTopLogprobs, PromptLogprobs: true, PromptTopLogprobs: 7,
			Forced: []int{0, 9, 1<<31 - 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30}},
		StopTokens: []int{2, 7}, IgnoreEOS: true, CacheSalt: strings.Repeat("n", 300) + "|salt", Priority: -3,
	}
}

// TestJobCarriesEveryParam: every field of request.Params but the owner
// survives JobOf, the wire and Job.Params, so a disaggregated request
// runs with exactly the knobs the gateway admitted. A field added to
// Params (or Sampling) without a place in the job fails here.
func TestJobCarriesEveryParam(t *testing.T) {
	p := sampleJob().Params(owner("org_a", 1))
	p.Sampling.LogitBias = append(p.Sampling.LogitBias[:0:0], request.TokenBias{Token: 3, Bias: -2.25}, request.TokenBias{Token: 4, Bias: 99})
	// Each field non-zero, so that a dropped one shows.
	for _, f := range reflect.VisibleFields(reflect.TypeOf(p)) {
		if reflect.ValueOf(p).FieldByIndex(f.Index).IsZero() {
			t.Errorf("params field %s is zero in the sample", f.Name)
		}
	}
	for _, f := range reflect.VisibleFields(reflect.TypeOf(p.Sampling)) {
		if reflect.ValueOf(p.Sampling).FieldByIndex(f.Index).IsZero() {
			t.Errorf("sampling field %s is zero in the sample", f.Name)
		}
	}
	g := &Generate{Reserve: Reserve{Owner: p.Owner, Epoch: 1, PromptTokens: len(p.Prompt), MaxNewTokens: p.MaxTokens, Sender: "p"}, Job: JobOf(p)}
	b, err := EncodeFrame(g)
	if err != nil {
		t.Fatal(err)
	}
	m, err := DecodeFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p, m.(*Generate).Job.Params(p.Owner)); diff != "" {
		t.Errorf("params after the wire (-sent +received):\n%s", diff)
	}
}

func requestPlaneMessages() []Message {
	j := sampleJob()
	return []Message{
		&Generate{Reserve: Reserve{Owner: owner("org_b", 4), Epoch: 1, PromptTokens: len(j.Prompt), MaxNewTokens: j.MaxTokens, Sender: "prefill-1"}, Job: j},
		&Prefill{Grant: Grant{Ref: sampleRef(), PageCount: 1, PromptTokens: 4, MaxNewTokens: 30, LeaseTTL: Second}, Decode: "decode-2", Job: j},
		&Prefill{Grant: Grant{Ref: sampleRef()}, Decode: "d", Job: Job{Prompt: []int{5}, MaxTokens: 1}},
		&Prefill{Grant: Grant{Ref: sampleRef()}, Decode: "d", Job: Job{Prompt: []int{5}, MaxTokens: 1,
			Sampling: request.Sampling{Grammar: mustGrammar(grammar.JSONObject, false, "")}}},
		&Prefill{Grant: Grant{Ref: sampleRef()}, Decode: "d", Job: Job{Prompt: []int{5}, MaxTokens: 1,
			Sampling: request.Sampling{Grammar: mustGrammar(grammar.ToolCall, false, `[{"name":"f","parameters":{"type":"object"}},{"name":"g"}]`)}}},
		&Tokens{Ref: sampleRef(), Start: 17, IDs: []int{0, 5, 1<<31 - 1}},
		&Tokens{Ref: sampleRef(), Start: 0, IDs: nil},
		&Tokens{Ref: sampleRef(), Start: 3, IDs: []int{7, 8}, Logprobs: []*request.Logprobs{
			{Logprob: -0.5, Top: []request.TokenLogprob{{ID: 7, Logprob: -0.5}, {ID: 1<<31 - 1, Logprob: -1}}},
			{Logprob: -math.MaxFloat32, Top: []request.TokenLogprob{{ID: 2, Logprob: 0}, {ID: 1, Logprob: -3}}},
		}},
		&Tokens{Ref: sampleRef(), Start: 3, IDs: []int{7}, Logprobs: []*request.Logprobs{{Logprob: -2}}},
		&Tokens{Ref: sampleRef(), Start: 0, IDs: []int{7}, Prompt: []request.Logprobs{{Logprob: -2}, {Logprob: -0.125, Top: []request.TokenLogprob{{ID: 4, Logprob: -0.125}}}}},
		&Prefill{Grant: Grant{Ref: sampleRef()}, Decode: "d", Job: Job{Prompt: []int{5, 6}, MaxTokens: 1,
			Sampling: request.Sampling{PromptLogprobs: true, PromptTopLogprobs: request.MaxTopLogprobs}}},
		&Result{Ref: sampleRef(), Reason: request.FinishStop, Usage: request.Usage{PromptTokens: 4, CompletionTokens: 9, CachedTokens: 2}},
		&Result{Ref: sampleRef(), Reason: request.FinishError, Code: CodeHandoff, Handoff: ReasonPageCountMismatch},
	}
}

func TestRequestPlaneRoundTrip(t *testing.T) {
	for _, m := range requestPlaneMessages() {
		b := roundTrip(t, m)
		// Every prefix is refused, never a panic or a shorter message.
		for i := range len(b) {
			if _, err := DecodeFrame(b[:i]); !errors.Is(err, ErrFrame) {
				t.Fatalf("%T: prefix of %d bytes: %v", m, i, err)
			}
		}
	}
}

// TestRequestPlaneRefuses: numbers a gateway would never send are refused
// at both ends, so a buggy or hostile peer cannot hand a node a NaN
// temperature, an inconsistent reservation or an unbounded list.
func TestRequestPlaneRefuses(t *testing.T) {
	gen := func(f func(*Generate)) Message {
		g := requestPlaneMessages()[0].(*Generate)
		f(g)
		return g
	}
	nan := float32(math.NaN())
	for name, m := range map[string]Message{
		"NaN temperature":               gen(func(g *Generate) { g.Job.Sampling.Temperature = nan }),
		"infinite temperature":          gen(func(g *Generate) { g.Job.Sampling.Temperature = float32(math.Inf(1)) }),
		"negative temperature":          gen(func(g *Generate) { g.Job.Sampling.Temperature = -1 }),
		"top p above 1":                 gen(func(g *Generate) { g.Job.Sampling.TopP = 1.5 }),
		"NaN min p":                     gen(func(g *Generate) { g.Job.Sampling.MinP = nan }),
		"negative token":                gen(func(g *Generate) { g.Job.Prompt[1] = -1 }),
		"negative max tokens":           gen(func(g *Generate) { g.Job.MaxTokens, g.MaxNewTokens = -1, -1 }),
		"reserve ≠ job prompt":          gen(func(g *Generate) { g.PromptTokens++ }),
		"reserve ≠ job max":             gen(func(g *Generate) { g.MaxNewTokens = 1 }),
		"too many stop tokens":          gen(func(g *Generate) { g.Job.StopTokens = make([]int, MaxStopTokens+1) }),
		"NaN presence":                  gen(func(g *Generate) { g.Job.Sampling.PresencePenalty = nan }),
		"huge frequency":                gen(func(g *Generate) { g.Job.Sampling.FrequencyPenalty = -1e9 }),
		"bias beyond the cap":           gen(func(g *Generate) { g.Job.Sampling.LogitBias[1].Bias = request.MaxBias + 1 }),
		"NaN bias":                      gen(func(g *Generate) { g.Job.Sampling.LogitBias[1].Bias = nan }),
		"negative bias token":           gen(func(g *Generate) { g.Job.Sampling.LogitBias[0].Token = -1 }),
		"bias tokens unsorted":          gen(func(g *Generate) { g.Job.Sampling.LogitBias[0].Token = 300 }),
		"bias token twice":              gen(func(g *Generate) { g.Job.Sampling.LogitBias[0].Token = 261 }),
		"too many biases":               gen(func(g *Generate) { g.Job.Sampling.LogitBias = make([]request.TokenBias, MaxLogitBias+1) }),
		"salt too long":                 gen(func(g *Generate) { g.Job.CacheSalt = strings.Repeat("x", MaxSaltLen+1) }),
		"priority beyond int32":         gen(func(g *Generate) { g.Job.Priority = math.MaxInt32 + 1 }),
		"too many tokens":               &Tokens{Ref: sampleRef(), IDs: make([]int, MaxTokensPerMsg+1)},
		"top logprobs without logprobs": gen(func(g *Generate) { g.Job.Sampling.Logprobs = false }),
		"too many top logprobs":         gen(func(g *Generate) { g.Job.Sampling.TopLogprobs = request.MaxTopLogprobs + 1 }),
		"fewer forced than max tokens":  gen(func(g *Generate) { g.Job.Sampling.Forced = g.Job.Sampling.Forced[:3] }),
		"negative forced token":         gen(func(g *Generate) { g.Job.Sampling.Forced[0] = -1 }),
		"NaN logprob":                   tokensLP(&request.Logprobs{Logprob: nan}),
		"+Inf logprob":                  tokensLP(&request.Logprobs{Logprob: float32(math.Inf(1))}),
		"-Inf logprob":                  tokensLP(&request.Logprobs{Logprob: float32(math.Inf(-1))}),
		"positive logprob":              tokensLP(&request.Logprobs{Logprob: 0.25}),
		"NaN top logprob":               tokensLP(&request.Logprobs{Logprob: -1, Top: []request.TokenLogprob{{ID: 1, Logprob: nan}}}),
		"top out of order":              tokensLP(&request.Logprobs{Logprob: -1, Top: []request.TokenLogprob{{ID: 1, Logprob: -2}, {ID: 2, Logprob: -1}}}),
		"top token twice":               tokensLP(&request.Logprobs{Logprob: -1, Top: []request.TokenLogprob{{ID: 1, Logprob: -1}, {ID: 1, Logprob: -1}}}),
		"top negative id":               tokensLP(&request.Logprobs{Logprob: -1, Top: []request.TokenLogprob{{ID: -1, Logprob: -1}}}),
		"too many top":                  tokensLP(&request.Logprobs{Logprob: -1, Top: make([]request.TokenLogprob, request.MaxTopLogprobs+1)}),
		"logprobs for fewer tokens":     &Tokens{Ref: sampleRef(), IDs: []int{1, 2}, Logprobs: []*request.Logprobs{{Logprob: -1}}},
		"a token without logprobs":      &Tokens{Ref: sampleRef(), IDs: []int{1, 2}, Logprobs: []*request.Logprobs{{Logprob: -1}, nil}},
		"manifest first logprob NaN":    &Manifest{Ref: sampleRef(), FirstLogprobs: &request.Logprobs{Logprob: nan}},
		"manifest prompt logprob NaN":   &Manifest{Ref: sampleRef(), PromptLogprobs: []request.Logprobs{{Logprob: -1}, {Logprob: nan}}},
		"prompt logprob positive":       &Tokens{Ref: sampleRef(), IDs: []int{1}, Prompt: []request.Logprobs{{Logprob: 0.5}}},
		"prompt logprobs after start 0": &Tokens{Ref: sampleRef(), Start: 1, IDs: []int{1}, Prompt: []request.Logprobs{{Logprob: -1}}},
		"prompt top without prompt":     gen(func(g *Generate) { g.Job.Sampling.PromptLogprobs = false }),
		"too many prompt top logprobs":  gen(func(g *Generate) { g.Job.Sampling.PromptTopLogprobs = request.MaxTopLogprobs + 1 }),
		"unknown reason":                &Result{Ref: sampleRef(), Reason: request.FinishError + 1},
		"unknown code":                  &Result{Ref: sampleRef(), Code: numCodes},
	} {
		if _, err := EncodeFrame(m); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: encoded (%v)", name, err)
		}
	}
	// The decoder refuses the same, from raw bytes a peer made by hand:
	// patch a valid frame's temperature to NaN and re-checksum it.
	g := requestPlaneMessages()[0].(*Generate)
	b, err := EncodeFrame(g)
	if err != nil {
		t.Fatal(err)
	}
	temp := math.Float32bits(g.Job.Sampling.Temperature)
	at := -1
	for i := HeaderSize; i+4 <= len(b)-TrailerSize; i++ {
		if uint32(b[i])<<24|uint32(b[i+1])<<16|uint32(b[i+2])<<8|uint32(b[i+3]) == temp {
			at = i
			break
		}
	}
	if at < 0 {
		t.Fatal("temperature not found in the frame")
	}
	bad := append([]byte(nil), b...)
	bits := math.Float32bits(nan)
	bad[at], bad[at+1], bad[at+2], bad[at+3] = byte(bits>>24), byte(bits>>16), byte(bits>>8), byte(bits)
	bad = reseal(bad)
	if _, err := DecodeFrame(bad); !errors.Is(err, ErrFrame) || !strings.Contains(err.Error(), "temperature") {
		t.Fatalf("NaN temperature decoded: %v", err)
	}
}

func tokensLP(l *request.Logprobs) *Tokens {
	return &Tokens{Ref: sampleRef(), Start: 1, IDs: []int{5}, Logprobs: []*request.Logprobs{l}}
}

// TestLogprobsDecoderRefuses: logprobs a peer made by hand (no encoder of
// ours writes them) are a protocol error: NaN, infinities, positive
// values, more alternatives than the protocol's bound, lists shorter than
// their count.
func TestLogprobsDecoderRefuses(t *testing.T) {
	good := &request.Logprobs{Logprob: -1.5, Top: []request.TokenLogprob{{ID: 3, Logprob: -0.25}, {ID: 9, Logprob: -1.5}}}
	e := &encoder{}
	e.logprobs("lp", good)
	if e.err != nil {
		t.Fatal(e.err)
	}
	if d := (&decoder{b: slices.Clone(e.b)}); !cmp.Equal(d.logprobs("lp"), good) || d.err != nil {
		t.Fatalf("unpatched: %v", d.err)
	}
	f32 := func(at int, v float64) func([]byte) {
		return func(b []byte) { binary.BigEndian.PutUint32(b[at:], math.Float32bits(float32(v))) }
	}
	for _, tc := range []struct {
		name  string
		patch func(b []byte)
	}{
		{"NaN", f32(0, math.NaN())},
		{"+Inf", f32(0, math.Inf(1))},
		{"-Inf", f32(0, math.Inf(-1))},
		{"positive", f32(0, 1)},
		{"top NaN", f32(5+4, math.NaN())},
		{"top +Inf", f32(5+8+4, math.Inf(1))},
		{"top out of order", f32(5+8+4, 0)},
		{"more top than the bound", func(b []byte) { b[4] = request.MaxTopLogprobs + 1 }},
		{"more top than the body", func(b []byte) { b[4] = 3 }},
		{"top id beyond int32", func(b []byte) { binary.BigEndian.PutUint32(b[5:], 1<<31) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := slices.Clone(e.b)
			tc.patch(b)
			d := &decoder{b: b}
			if l := d.logprobs("lp"); !errors.Is(d.err, ErrFrame) || l != nil {
				t.Errorf("decoded %+v: %v", l, d.err)
			}
		})
	}
}

// TestPromptLogprobsDecoderRefuses: a prompt-logprobs list a peer made
// by hand is a protocol error when its count is beyond the bound or the
// bytes left (checked before allocating), when an entry is not valid
// logprobs, or when the flag is not a boolean; the unpatched list decodes
// to what was sent.
func TestPromptLogprobsDecoderRefuses(t *testing.T) {
	good := []request.Logprobs{{Logprob: -1.5, Top: []request.TokenLogprob{{ID: 3, Logprob: -0.25}}}, {Logprob: -2, Top: []request.TokenLogprob{{ID: 4, Logprob: -2}}}}
	e := &encoder{}
	e.promptLogprobs("pl", good)
	if e.err != nil {
		t.Fatal(e.err)
	}
	if d := (&decoder{b: slices.Clone(e.b)}); !cmp.Equal(d.promptLogprobs("pl"), good) || d.err != nil {
		t.Fatalf("unpatched: %v", d.err)
	}
	for _, tc := range []struct {
		name  string
		patch func(b []byte) []byte
	}{
		{"flag 2", func(b []byte) []byte { b[0] = 2; return b }},
		{"count beyond the bound", func(b []byte) []byte { binary.BigEndian.PutUint32(b[1:], MaxPromptTokens+1); return b }},
		{"count beyond the body", func(b []byte) []byte { binary.BigEndian.PutUint32(b[1:], 1<<30); return b }},
		{"one entry short", func(b []byte) []byte { binary.BigEndian.PutUint32(b[1:], 3); return b }},
		{"cut inside an entry", func(b []byte) []byte { return b[:len(b)-3] }},
		{"NaN entry", func(b []byte) []byte {
			binary.BigEndian.PutUint32(b[5:], math.Float32bits(float32(math.NaN())))
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &decoder{b: tc.patch(slices.Clone(e.b))}
			if v := d.promptLogprobs("pl"); !errors.Is(d.err, ErrFrame) || v != nil {
				t.Errorf("decoded %+v: %v", v, d.err)
			}
		})
	}
}

// TestJobDecoderRefuses: the decoder checks the job's new fields itself,
// on bytes no encoder of ours would write.
func TestJobDecoderRefuses(t *testing.T) {
	j := sampleJob()
	e := &encoder{}
	e.job(&j)
	if e.err != nil {
		t.Fatal(e.err)
	}
	if d := (&decoder{b: append([]byte(nil), e.b...)}); !cmp.Equal(d.job(), j) || d.err != nil {
		t.Fatalf("unpatched job: %v", d.err)
	}
	// Offsets in the layout of the package comment.
	bias := 4 + 4 + 4*len(j.Prompt) + 5*4 + 8 + 4 + 4
	ignoreEOS := bias + 2 + 8*len(j.Sampling.LogitBias) + 1 + 4*len(j.StopTokens)
	for _, tc := range []struct {
		name, want string
		patch      func(b []byte)
	}{
		{"ignore eos 2", "ignore eos", func(b []byte) { b[ignoreEOS] = 2 }},
		{"biases unsorted", "logit bias", func(b []byte) { binary.BigEndian.PutUint32(b[bias+2+8:], 0) }},
		{"bias count beyond the cap", "logit bias", func(b []byte) { binary.BigEndian.PutUint16(b[bias:], MaxLogitBias+1) }},
		{"bias count beyond the body", "logit bias", func(b []byte) { binary.BigEndian.PutUint16(b[bias:], MaxLogitBias) }},
		{"bias out of range", "logit bias", func(b []byte) { binary.BigEndian.PutUint32(b[bias+2+4:], math.Float32bits(-101)) }},
		{"presence NaN", "presence", func(b []byte) { binary.BigEndian.PutUint32(b[bias-8:], math.Float32bits(float32(math.NaN()))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := append([]byte(nil), e.b...)
			tc.patch(b)
			d := &decoder{b: b}
			d.job()
			if !errors.Is(d.err, ErrFrame) || !strings.Contains(d.err.Error(), tc.want) {
				t.Errorf("decoded: %v; want an error naming %q", d.err, tc.want)
			}
		})
	}
}

func TestErrorCodes(t *testing.T) {
	for _, err := range []error{request.ErrAborted, request.ErrShuttingDown, request.ErrOverloaded, request.ErrContextLength, request.ErrQuota} {
		c := CodeOf(err)
		if c == CodeInternal || !errors.Is(c.Err(), err) {
			t.Errorf("%v → %v → %v", err, c, c.Err())
		}
	}
	if CodeOf(nil) != CodeNone || CodeOf(errors.New("x")) != CodeInternal || CodeInternal.Err() != request.ErrInternal {
		t.Error("none/internal")
	}
	if c := CodeOf(&Failure{Kind: ErrAborted, Reason: ReasonDigestMismatch}); c != CodeHandoff {
		t.Errorf("handoff failure → %v", c)
	}
}

// reseal recomputes a hand-edited frame's checksum.
func reseal(b []byte) []byte {
	end := len(b) - TrailerSize
	return binary.BigEndian.AppendUint32(b[:end:end], crc32.Checksum(b[:end], castagnoli))
}

// TestJobConstraintRefused: an output constraint is compiled again on
// decode, so bytes a peer made by hand get the gateway's refusals: an
// unknown kind, a non-boolean strict flag, a schema the grammar does not
// enforce, a json_object with a schema, an oversized schema.
func TestJobConstraintRefused(t *testing.T) {
	j := sampleJob()
	j.Sampling.Grammar = nil
	j.Sampling.Logprobs, j.Sampling.TopLogprobs, j.Sampling.Forced = false, 0, nil
	j.Sampling.PromptLogprobs, j.Sampling.PromptTopLogprobs = false, 0
	e := &encoder{}
	e.job(&j)
	// The constraint's kind 0, then logprobs, top logprobs, forced,
	// prompt logprobs and prompt top logprobs, 0.
	if e.err != nil || !bytes.Equal(e.b[len(e.b)-6:], []byte{0, 0, 0, 0, 0, 0}) {
		t.Fatalf("unconstrained job: %v, last bytes %v", e.err, e.b[len(e.b)-6:])
	}
	head := e.b[:len(e.b)-6]
	with := func(kind, strict byte, schema string) []byte {
		b := append(append([]byte(nil), head...), kind, strict)
		b = binary.BigEndian.AppendUint32(b, uint32(len(schema)))
		return append(append(b, schema...), 0, 0, 0, 0, 0)
	}
	for _, tc := range []struct {
		name, want string
		b          []byte
	}{
		{"unknown kind", "constraint", with(4, 0, "")},
		{"tool call without functions", "constraint", with(3, 0, `[]`)},
		{"strict 2", "constraint strict", with(2, 2, `{"type":"object"}`)},
		{"unsupported keyword", "pattern", with(2, 0, `{"type":"string","pattern":"a"}`)},
		{"not JSON", "constraint", with(2, 0, `{"type":`)},
		{"json_object with a schema", "constraint", with(1, 0, `{}`)},
		{"oversized schema", "constraint schema", with(2, 0, strings.Repeat(" ", grammar.MaxSchemaBytes+1))},
		{"cut short", "bytes", with(2, 0, `{"type":"object"}`)[:len(head)+8]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &decoder{b: tc.b}
			got := d.job()
			if !errors.Is(d.err, ErrFrame) || !strings.Contains(d.err.Error(), tc.want) {
				t.Errorf("decoded (%v): %v; want an error naming %q", got.Sampling.Grammar, d.err, tc.want)
			}
		})
	}
	// The positive control: the same bytes with a schema the grammar
	// takes decode to that constraint.
	d := &decoder{b: with(2, 1, jobSchema)}
	if got := d.job(); d.err != nil || !got.Sampling.Grammar.Equal(mustGrammar(grammar.JSONSchema, true, jobSchema)) {
		t.Fatalf("a valid constraint: %v", d.err)
	}
}

package transfer

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

func sampleJob() Job {
	return Job{
		Prompt: []int{1, 200, 3, 1<<31 - 1}, MaxTokens: 30,
		Sampling:   request.Sampling{Temperature: 0.7, TopK: 40, TopP: 0.9, MinP: 0.05, RepetitionPenalty: 1.1, Seed: 1<<64 - 1},
		StopTokens: []int{2, 7}, CacheSalt: strings.Repeat("n", 300) + "|salt", Priority: -3,
	}
}

func requestPlaneMessages() []Message {
	j := sampleJob()
	return []Message{
		&Generate{Reserve: Reserve{Owner: owner("org_b", 4), Epoch: 1, PromptTokens: len(j.Prompt), MaxNewTokens: j.MaxTokens, Sender: "prefill-1"}, Job: j},
		&Prefill{Grant: Grant{Ref: sampleRef(), PageCount: 1, PromptTokens: 4, MaxNewTokens: 30, LeaseTTL: Second}, Decode: "decode-2", Job: j},
		&Prefill{Grant: Grant{Ref: sampleRef()}, Decode: "d", Job: Job{Prompt: []int{5}, MaxTokens: 1}},
		&Tokens{Ref: sampleRef(), Start: 17, IDs: []int{0, 5, 1<<31 - 1}},
		&Tokens{Ref: sampleRef(), Start: 0, IDs: nil},
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
		"NaN temperature":       gen(func(g *Generate) { g.Job.Sampling.Temperature = nan }),
		"infinite temperature":  gen(func(g *Generate) { g.Job.Sampling.Temperature = float32(math.Inf(1)) }),
		"negative temperature":  gen(func(g *Generate) { g.Job.Sampling.Temperature = -1 }),
		"top p above 1":         gen(func(g *Generate) { g.Job.Sampling.TopP = 1.5 }),
		"NaN min p":             gen(func(g *Generate) { g.Job.Sampling.MinP = nan }),
		"negative token":        gen(func(g *Generate) { g.Job.Prompt[1] = -1 }),
		"negative max tokens":   gen(func(g *Generate) { g.Job.MaxTokens, g.MaxNewTokens = -1, -1 }),
		"reserve ≠ job prompt":  gen(func(g *Generate) { g.PromptTokens++ }),
		"reserve ≠ job max":     gen(func(g *Generate) { g.MaxNewTokens = 1 }),
		"too many stop tokens":  gen(func(g *Generate) { g.Job.StopTokens = make([]int, MaxStopTokens+1) }),
		"salt too long":         gen(func(g *Generate) { g.Job.CacheSalt = strings.Repeat("x", MaxSaltLen+1) }),
		"priority beyond int32": gen(func(g *Generate) { g.Job.Priority = math.MaxInt32 + 1 }),
		"too many tokens":       &Tokens{Ref: sampleRef(), IDs: make([]int, MaxTokensPerMsg+1)},
		"unknown reason":        &Result{Ref: sampleRef(), Reason: request.FinishError + 1},
		"unknown code":          &Result{Ref: sampleRef(), Code: numCodes},
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

package sched

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

var testLayout = kvcache.Layout{Layers: 2, KVHeads: 2, HeadDim: 8, PageSize: 16, DType: kvcache.F32}

// TestCapacityTable is the start-up table: a pool holding 0.5, 1, 1.99, 2
// and 4 times the window, at the default margin of 2, starts exactly when
// it holds at least twice the window; a refusal names the numbers and the
// flags.
func TestCapacityTable(t *testing.T) {
	const window = 4096
	for _, tc := range []struct {
		times float64
		ok    bool
	}{{0.5, false}, {1, false}, {1.99, false}, {2, true}, {4, true}} {
		t.Run(fmt.Sprint(tc.times), func(t *testing.T) {
			pages := int(math.Floor(tc.times * window / float64(testLayout.PageSize)))
			l, err := ComputeLimits(ModelShape{ContextLength: window}, testLayout, pages, 0, 0)
			if (err == nil) != tc.ok {
				t.Fatalf("%d pages (%g × window): err %v, want ok=%v", pages, tc.times, err, tc.ok)
			}
			if !tc.ok {
				if !errors.Is(err, ErrCapacity) {
					t.Fatalf("error %v does not wrap ErrCapacity", err)
				}
				for _, want := range []string{"--max-context", "--kv-memory", "--kv-safety-margin", "4096", fmt.Sprint(pages * 16), "8192", fmt.Sprint(pages * 16 / 2)} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("message lacks %q: %v", want, err)
					}
				}
				return
			}
			want := Limits{
				TotalPages: pages, UsablePages: pages, PageSize: 16, PageBytes: testLayout.PageBytes(),
				UsableTokens: pages * 16, ModelContext: window, MaxContext: window, SafetyMargin: 2,
				MaxPromptTokens: window - 1, PagesPerMaxRequest: window / 16,
			}
			if diff := cmp.Diff(want, l); diff != "" {
				t.Errorf("limits (-want +got)\n%s", diff)
			}
		})
	}
}

func TestComputeLimitsErrors(t *testing.T) {
	m := ModelShape{ContextLength: 1024, Vocab: 100}
	for _, tc := range []struct {
		name   string
		m      ModelShape
		layout kvcache.Layout
		pages  int
		maxCtx int
		margin float64
		want   error
	}{
		{"window above the model's", m, testLayout, 1000, 2048, 2, ErrBadLimits},
		{"no model context", ModelShape{}, testLayout, 1000, 0, 2, ErrBadLimits},
		{"margin below 1", m, testLayout, 1000, 0, 0.5, ErrBadLimits},
		{"margin NaN", m, testLayout, 1000, 0, math.NaN(), ErrBadLimits},
		{"bad layout", m, kvcache.Layout{}, 1000, 0, 2, ErrBadLimits},
		{"negative pages", m, testLayout, -1, 0, 2, ErrBadLimits},
		{"tiny window", m, testLayout, 1000, 1, 2, ErrBadLimits},
		{"no pages", m, testLayout, 0, 0, 2, ErrCapacity},
		{"fractional margin short", m, testLayout, 95, 1024, 1.5, ErrCapacity}, // 1520 < 1536
		{"fractional margin fits", m, testLayout, 96, 1024, 1.5, nil},
		{"smaller window fits", m, testLayout, 64, 512, 2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ComputeLimits(tc.m, tc.layout, tc.pages, tc.maxCtx, tc.margin)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func TestLimitsString(t *testing.T) {
	l, err := ComputeLimits(ModelShape{ContextLength: 2048}, testLayout, 512, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := l.String()
	for _, want := range []string{"512 total", "8192", "2048", "2047", "full-window requests that fit at once: 4"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}

// TestAdmitBoundaryTable is DESIGN.md's admission table at the Limits
// level: prompt lengths 0, 1, page−1, page, page+1, W−1, W, W+1, 2W with
// several max_tokens; accepted exactly when 1 ≤ prompt and prompt +
// max_tokens ≤ W (an empty prompt is malformed, not too long).
func TestAdmitBoundaryTable(t *testing.T) {
	const W = 256
	l, err := ComputeLimits(ModelShape{ContextLength: W, Vocab: 1000}, testLayout, 2*W/16, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ps := l.PageSize
	for _, prompt := range []int{0, 1, ps - 1, ps, ps + 1, W - 1, W, W + 1, 2 * W} {
		for _, maxTok := range []int{0, 1, 2, ps, W - prompt, W - prompt + 1, W, math.MaxInt} {
			p := request.Params{Owner: request.Owner{Tenant: "a", ID: request.NewID()}, Prompt: make([]int, prompt), MaxTokens: maxTok}
			a, err := l.Admit(p)
			var want error
			switch {
			case prompt == 0 || maxTok < 1:
				want = ErrInvalidRequest
			case prompt+maxTok > W || maxTok == math.MaxInt:
				want = request.ErrContextLength
			}
			if !errors.Is(err, want) || (want == nil) != (err == nil) {
				t.Errorf("prompt %d max_tokens %d: err %v, want %v", prompt, maxTok, err, want)
			}
			if a.Valid() != (err == nil) {
				t.Errorf("prompt %d max_tokens %d: admitted value valid=%v with err %v", prompt, maxTok, a.Valid(), err)
			}
			if errors.Is(err, request.ErrContextLength) && !strings.Contains(err.Error(), fmt.Sprint(W)) {
				t.Errorf("context-length error does not state the window: %v", err)
			}
		}
	}
}

func TestAdmitRejectsMalformed(t *testing.T) {
	l, err := ComputeLimits(ModelShape{ContextLength: 64, Vocab: 10}, testLayout, 16, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	id := request.NewID()
	for _, tc := range []struct {
		name string
		p    request.Params
	}{
		{"no tenant", request.Params{Owner: request.Owner{ID: id}, Prompt: []int{1}, MaxTokens: 1}},
		{"no id", request.Params{Owner: request.Owner{Tenant: "a"}, Prompt: []int{1}, MaxTokens: 1}},
		{"token above vocab", request.Params{Owner: request.Owner{Tenant: "a", ID: id}, Prompt: []int{1, 10}, MaxTokens: 1}},
		{"negative token", request.Params{Owner: request.Owner{Tenant: "a", ID: id}, Prompt: []int{-1}, MaxTokens: 1}},
		{"stop token above vocab", request.Params{Owner: request.Owner{Tenant: "a", ID: id}, Prompt: []int{1}, MaxTokens: 1, StopTokens: []int{10}}},
		{"too many stop tokens", request.Params{Owner: request.Owner{Tenant: "a", ID: id}, Prompt: []int{1}, MaxTokens: 1, StopTokens: make([]int, request.MaxStopTokens+1)}},
		{"bias token above vocab", request.Params{Owner: request.Owner{Tenant: "a", ID: id}, Prompt: []int{1}, MaxTokens: 1,
			Sampling: request.Sampling{LogitBias: []request.TokenBias{{Token: 10, Bias: 1}}}}},
		{"too many biases", request.Params{Owner: request.Owner{Tenant: "a", ID: id}, Prompt: []int{1}, MaxTokens: 1,
			Sampling: request.Sampling{LogitBias: make([]request.TokenBias, request.MaxLogitBias+1)}}},
	} {
		if _, err := l.Admit(tc.p); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: err %v, want ErrInvalidRequest", tc.name, err)
		}
	}
	if _, err := (Limits{}).Admit(request.Params{}); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("zero limits admit: %v", err)
	}
	// The admitted copy is the caller's no more.
	p := request.Params{Owner: request.Owner{Tenant: "a", ID: id}, Prompt: []int{1, 2}, MaxTokens: 1, StopTokens: []int{3},
		Sampling: request.Sampling{LogitBias: []request.TokenBias{{Token: 4, Bias: 1}}}}
	a, err := l.Admit(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Prompt[0], p.StopTokens[0], p.Sampling.LogitBias[0].Token = 9, 9, 9
	if q := a.a.params; q.Prompt[0] != 1 || q.StopTokens[0] != 3 || q.Sampling.LogitBias[0].Token != 4 {
		t.Error("admitted params alias the caller's slices")
	}
}

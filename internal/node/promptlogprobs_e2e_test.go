package node_test

import (
	"strconv"
	"testing"

	"github.com/pagewarden/pagewarden/internal/node"
)

// TestE2EPromptLogprobs: through the real gateway, scheduler and engine, a
// completion with echo, logprobs and prompt_logprobs shows the prompt's
// log-probabilities twice — OpenAI's echoed entries (the first null) and
// vLLM's prompt_logprobs (the first null, then the token keyed by id) —
// with the same values from the one prefill, one entry per prompt token;
// the prompt came from no prefix-cache page although the same prompt had
// just been cached by a plain request, and a chat's prompt_logprobs has
// one entry per prompt token too.
func TestE2EPromptLogprobs(t *testing.T) {
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}})
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = 10 + (i*7)%50
	}
	var plain completionBody
	s.postOK(e2eKeyA, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2, "temperature": 0}, &plain)
	type entry struct {
		Logprob float32 `json:"logprob"`
		Rank    *int    `json:"rank"`
	}
	var got struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []*float32           `json:"token_logprobs"`
				TopLogprobs   []map[string]float32 `json:"top_logprobs"`
			} `json:"logprobs"`
			PromptLogprobs []map[string]entry `json:"prompt_logprobs"`
		} `json:"choices"`
		Usage *usageBody `json:"usage"`
	}
	s.postOK(e2eKeyA, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
		"echo": true, "logprobs": 2, "prompt_logprobs": 3}, &got)
	if len(got.Choices) != 1 || got.Usage == nil {
		t.Fatalf("malformed %+v", got)
	}
	c := got.Choices[0]
	if got.Usage.cached() != 0 {
		t.Errorf("a prompt scored for its logprobs was served %d cached tokens", got.Usage.cached())
	}
	if len(c.Logprobs.TokenLogprobs) != len(prompt)+6 || len(c.PromptLogprobs) != len(prompt) {
		t.Fatalf("%d logprobs entries and %d prompt_logprobs for a %d-token prompt and 6 tokens", len(c.Logprobs.TokenLogprobs), len(c.PromptLogprobs), len(prompt))
	}
	if c.Logprobs.TokenLogprobs[0] != nil || c.Logprobs.TopLogprobs[0] != nil || c.PromptLogprobs[0] != nil {
		t.Errorf("the first prompt token's entries %v %v %v; want null", c.Logprobs.TokenLogprobs[0], c.Logprobs.TopLogprobs[0], c.PromptLogprobs[0])
	}
	for q := 1; q < len(prompt); q++ {
		e, ok := c.PromptLogprobs[q][strconv.Itoa(prompt[q])]
		echoed := c.Logprobs.TokenLogprobs[q]
		if !ok || echoed == nil || *echoed != e.Logprob || e.Logprob > 0 || len(c.PromptLogprobs[q]) < 3 || len(c.PromptLogprobs[q]) > 4 {
			t.Fatalf("prompt token %d (%d): echoed %v, prompt_logprobs %v", q, prompt[q], echoed, c.PromptLogprobs[q])
		}
	}
	for i := len(prompt); i < len(c.Logprobs.TokenLogprobs); i++ {
		if v := c.Logprobs.TokenLogprobs[i]; v == nil || *v > 0 {
			t.Errorf("answer entry %d: %v", i-len(prompt), v)
		}
	}
	var chat struct {
		PromptLogprobs []map[string]entry `json:"prompt_logprobs"`
		Usage          *usageBody         `json:"usage"`
	}
	s.postOK(e2eKeyA, "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Tell me"}},
		"max_tokens": 2, "prompt_logprobs": 0}, &chat)
	if chat.Usage == nil || len(chat.PromptLogprobs) != chat.Usage.PromptTokens || chat.PromptLogprobs[0] != nil {
		t.Fatalf("chat: %d prompt_logprobs for %+v", len(chat.PromptLogprobs), chat.Usage)
	}
	for q, m := range chat.PromptLogprobs[1:] {
		if len(m) != 1 {
			t.Fatalf("chat prompt token %d: %v (prompt_logprobs 0: the token's only)", q+1, m)
		}
	}
	// The control: the same prompt without prompt logprobs is served
	// from the cache the plain request filled.
	var again completionBody
	s.postOK(e2eKeyA, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2, "temperature": 0}, &again)
	if again.Usage == nil || again.Usage.cached() == 0 {
		t.Errorf("a plain repeat of the prompt was served no cached tokens: %+v", again.Usage)
	}
	s.checkMustBeZero()
	s.waitAllFree()
}

package node_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/node"
)

// End-to-end checks of what the API reports against the real node: usage
// is exact, chat prompts go through the model's ChatML template,
// /tokenize and /detokenize agree with the tokenizer, and the prefix
// cache is scoped to the tenant (and the cache_salt under it).

// TestE2EUsageIsExact checks, for completions streamed and not, that
// usage.prompt_tokens is the /tokenize count, usage.completion_tokens the
// number of tokens the node streamed to the gateway, and the text exactly
// what a private engine generates greedily for the same tokens.
func TestE2EUsageIsExact(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tok := s.node.Model().Tokenizer
	cases := []struct {
		name   string
		prompt string
		max    int
		stop   string // a stop sequence that appears in the greedy output
	}{
		{name: "short", prompt: "Hello", max: 24},
		{name: "one char", prompt: "x", max: 1},
		{name: "unicode", prompt: "héllo wörld ✓ 日本語 🙂", max: 40},
		{name: "long", prompt: strings.Repeat("pagewarden keeps tenants apart. ", 12), max: 16},
		{name: "stop sequence", prompt: "Hello", max: 64, stop: "p"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var tk struct {
				Count  int   `json:"count"`
				Tokens []int `json:"tokens"`
			}
			s.postOK(e2eKeyA, "/tokenize", map[string]any{"prompt": tc.prompt}, &tk)
			if want := tok.Encode(tc.prompt, true, true); !cmp.Equal(want, tk.Tokens) || tk.Count != len(want) {
				t.Fatalf("/tokenize: count %d tokens %v, tokenizer %v", tk.Count, tk.Tokens, want)
			}
			ref := greedy(t, "tiny", tk.Tokens, tc.max)
			wantText, wantTokens, wantFinish := tok.Decode(ref), len(ref), "length"
			if len(ref) < tc.max {
				wantFinish = "stop"
			}
			if tc.stop != "" {
				// The gateway stops at the first token whose text
				// completes the stop sequence and never shows it.
				k := 1
				for ; k <= len(ref) && !strings.Contains(tok.Decode(ref[:k]), tc.stop); k++ {
				}
				if k > len(ref) {
					t.Fatalf("stop %q does not occur in the greedy output %q", tc.stop, wantText)
				}
				wantTokens, wantFinish = k, "stop"
				wantText = wantText[:strings.Index(wantText, tc.stop)]
			}
			body := map[string]any{"prompt": tc.prompt, "max_tokens": tc.max, "temperature": 0}
			if tc.stop != "" {
				body["stop"] = []string{tc.stop}
			}

			var c completionBody
			h := s.postOK(e2eKeyA, "/v1/completions", body, &c)
			if c.Usage == nil || len(c.Choices) != 1 || c.Choices[0].FinishReason == nil {
				t.Fatalf("malformed response %+v", c)
			}
			u := *c.Usage
			if got := c.Choices[0].Text; got != wantText {
				t.Errorf("text %q, greedy reference %q", got, wantText)
			}
			if got := *c.Choices[0].FinishReason; got != wantFinish {
				t.Errorf("finish %q, want %q", got, wantFinish)
			}
			if u.PromptTokens != tk.Count || u.CompletionTokens != wantTokens || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Errorf("usage %+v; want prompt %d (the /tokenize count), completion %d", u, tk.Count, wantTokens)
			}
			if n, ok := s.rec.streamedTokens(h.Get("X-Request-Id")); !ok || (tc.stop == "" && n != u.CompletionTokens) {
				t.Errorf("node streamed %d tokens (submitted %v), usage says %d", n, ok, u.CompletionTokens)
			}

			sbody := map[string]any{"stream_options": map[string]any{"include_usage": true}}
			for k, v := range body {
				sbody[k] = v
			}
			st := s.stream(e2eKeyA, "/v1/completions", sbody)
			if st.status != 200 || !st.done || st.errEv != nil {
				t.Fatalf("stream: status %d, [DONE] %v, error event %+v", st.status, st.done, st.errEv)
			}
			text, finish, su, chunks := completionStream(t, st)
			if text != wantText || finish != wantFinish {
				t.Errorf("stream: text %q finish %q; want %q %q", text, finish, wantText, wantFinish)
			}
			if su == nil {
				t.Fatal("stream: no usage chunk despite include_usage")
			}
			if d := cmp.Diff(u, *su); d != "" {
				t.Errorf("stream usage differs from the non-streamed one (-want +got):\n%s", d)
			}
			n, _ := s.rec.streamedTokens(st.header.Get("X-Request-Id"))
			if tc.stop == "" && n != su.CompletionTokens {
				t.Errorf("stream: node streamed %d tokens, usage says %d", n, su.CompletionTokens)
			}
			// Every token of this model's greedy output is one whole
			// character, so each arrives as its own chunk; a token
			// ending in the middle of a character would be held back.
			if whole := allWholeRunes(s.node, ref[:wantTokens]); whole && chunks != wantTokens-boolInt(tc.stop != "") {
				t.Errorf("stream: %d text chunks for %d tokens", chunks, wantTokens)
			} else if chunks > u.CompletionTokens {
				t.Errorf("stream: %d text chunks for %d tokens", chunks, u.CompletionTokens)
			}
		})
	}
	s.waitAllFree()
	s.checkMustBeZero()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// allWholeRunes reports whether every token's piece is non-empty, valid
// UTF-8 on its own.
func allWholeRunes(n *node.Node, ids []int) bool {
	for _, id := range ids {
		p := n.TokenPiece(id)
		if len(p) == 0 || !utf8.Valid(p) {
			return false
		}
	}
	return true
}

// TestE2EPromptAsTokenIDs checks that a prompt sent as token ids is served
// exactly like the same prompt sent as text.
func TestE2EPromptAsTokenIDs(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	ids := s.node.Model().Tokenizer.Encode("The quick brown fox", true, true)
	var byText, byIDs completionBody
	s.postOK(e2eKeyA, "/v1/completions", map[string]any{"prompt": "The quick brown fox", "max_tokens": 20, "temperature": 0}, &byText)
	s.postOK(e2eKeyB, "/v1/completions", map[string]any{"prompt": ids, "max_tokens": 20, "temperature": 0}, &byIDs)
	if byText.Choices[0].Text != byIDs.Choices[0].Text || !cmp.Equal(byText.Usage, byIDs.Usage) {
		t.Errorf("text prompt: %q %+v; id prompt: %q %+v", byText.Choices[0].Text, *byText.Usage, byIDs.Choices[0].Text, *byIDs.Usage)
	}
	s.waitAllFree()
}

// TestE2EChatCompletionsChatML drives chat completions through the
// builtin model's ChatML template (GGUF tokenizer.chat_template): the
// prompt the node receives is the rendered template, tokenized with the
// ChatML markers as single special tokens, and streamed and non-streamed
// answers agree with the greedy reference and with each other.
func TestE2EChatCompletionsChatML(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tok := s.node.Model().Tokenizer
	if !strings.Contains(s.node.ChatTemplate(), "<|im_start|>") {
		t.Fatalf("builtin model has no ChatML template: %q", s.node.ChatTemplate())
	}
	imStart := tok.Encode("<|im_start|>", false, true)
	if len(imStart) != 1 {
		t.Fatalf("<|im_start|> is %v, want one special token", imStart)
	}
	type msg = map[string]string
	cases := []struct {
		name     string
		messages []msg
		rendered string
	}{
		{"one user turn", []msg{{"role": "user", "content": "Hi"}},
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
		{"system and history", []msg{
			{"role": "system", "content": "Be brief."},
			{"role": "user", "content": "Name a colour."},
			{"role": "assistant", "content": "Blue."},
			{"role": "user", "content": "Another?"},
		}, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n" +
			"<|im_start|>assistant\nBlue.<|im_end|>\n<|im_start|>user\nAnother?<|im_end|>\n<|im_start|>assistant\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := tok.Encode(tc.rendered, true, true)
			var tk struct {
				Count  int   `json:"count"`
				Tokens []int `json:"tokens"`
			}
			s.postOK(e2eKeyA, "/tokenize", map[string]any{"messages": tc.messages}, &tk)
			if d := cmp.Diff(want, tk.Tokens); d != "" {
				t.Fatalf("/tokenize messages differs from the rendered ChatML prompt (-want +got):\n%s", d)
			}
			if strings.Count(tc.rendered, "<|im_start|>") != countID(tk.Tokens, imStart[0]) {
				t.Errorf("<|im_start|> not tokenized as a special token: %v", tk.Tokens)
			}
			ref := greedy(t, "tiny", want, 32)
			wantText := tok.Decode(ref)

			var c chatBody
			body := map[string]any{"messages": tc.messages, "max_tokens": 32, "temperature": 0}
			s.postOK(e2eKeyB, "/v1/chat/completions", body, &c)
			if c.Object != "chat.completion" || len(c.Choices) != 1 || c.Usage == nil {
				t.Fatalf("malformed chat response %+v", c)
			}
			ch := c.Choices[0]
			if ch.Message.Role != "assistant" || ch.Message.Content != wantText || ch.FinishReason == nil || *ch.FinishReason != "length" {
				t.Errorf("chat: role %q content %q finish %v; want assistant %q length", ch.Message.Role, ch.Message.Content, ch.FinishReason, wantText)
			}
			if c.Usage.PromptTokens != len(want) || c.Usage.CompletionTokens != len(ref) {
				t.Errorf("chat usage %+v; want prompt %d completion %d", *c.Usage, len(want), len(ref))
			}

			body["stream_options"] = map[string]any{"include_usage": true}
			st := s.stream(e2eKeyB, "/v1/chat/completions", body)
			if st.status != 200 || !st.done || st.errEv != nil {
				t.Fatalf("chat stream: status %d, [DONE] %v, error %+v", st.status, st.done, st.errEv)
			}
			role, text, finish, su, _ := chatStream(t, st)
			if role != "assistant" || text != wantText || finish != "length" {
				t.Errorf("chat stream: role %q text %q finish %q; want assistant %q length", role, text, finish, wantText)
			}
			if su == nil || !cmp.Equal(su, c.Usage) {
				t.Errorf("chat stream usage %+v, non-streamed %+v", su, *c.Usage)
			}
		})
	}
	s.waitAllFree()
	s.checkMustBeZero()
}

func countID(ids []int, id int) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}

// TestE2ETokenizeDetokenizeRoundTrip checks that /detokenize inverts
// /tokenize, and that both agree with the node's tokenizer.
func TestE2ETokenizeDetokenizeRoundTrip(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tok := s.node.Model().Tokenizer
	for _, text := range []string{
		"Hello",
		"Hello, world! 123",
		"  leading and trailing spaces  ",
		"tabs\tand\nnewlines\r\n",
		"héllo wörld ✓ 日本語 🙂",
		strings.Repeat("ab", 300),
	} {
		var tk struct {
			Count       int   `json:"count"`
			Tokens      []int `json:"tokens"`
			MaxModelLen int   `json:"max_model_len"`
		}
		s.postOK(e2eKeyA, "/tokenize", map[string]any{"prompt": text, "add_special_tokens": false}, &tk)
		if want := tok.Encode(text, false, true); !cmp.Equal(want, tk.Tokens) || tk.Count != len(want) {
			t.Errorf("%q: /tokenize %d %v, tokenizer %v", text, tk.Count, tk.Tokens, want)
		}
		if tk.MaxModelLen != s.node.Limits().MaxContext {
			t.Errorf("max_model_len %d, limits %d", tk.MaxModelLen, s.node.Limits().MaxContext)
		}
		var dt struct {
			Prompt string `json:"prompt"`
		}
		s.postOK(e2eKeyB, "/detokenize", map[string]any{"tokens": tk.Tokens}, &dt)
		if dt.Prompt != text {
			t.Errorf("round trip of %q gave %q (tokens %v)", text, dt.Prompt, tk.Tokens)
		}
	}
	// Control tokens are parsed from text by /tokenize but, like in
	// generated output, not shown by /detokenize.
	var tk struct {
		Tokens []int `json:"tokens"`
	}
	s.postOK(e2eKeyA, "/tokenize", map[string]any{"prompt": "<|im_start|>user\nHi<|im_end|>", "add_special_tokens": false}, &tk)
	if len(tk.Tokens) != 2+len("user\nHi") {
		t.Errorf("ChatML markers not parsed as single tokens: %v", tk.Tokens)
	}
	var dt struct {
		Prompt string `json:"prompt"`
	}
	s.postOK(e2eKeyA, "/detokenize", map[string]any{"tokens": tk.Tokens}, &dt)
	if want := tok.Decode(tk.Tokens); dt.Prompt != want {
		t.Errorf("/detokenize %q, tokenizer %q", dt.Prompt, want)
	}

	// An id outside the vocabulary is the client's error, not ours.
	code, _, body := s.post(e2eKeyA, "/detokenize", map[string]any{"tokens": []int{1, tok.VocabSize()}})
	var e apiErr
	if code != 400 || json.Unmarshal(body, &e) != nil || e.Error.Type != "invalid_request_error" {
		t.Errorf("out-of-vocabulary id: status %d body %s", code, body)
	}
}

// TestE2EPrefixCacheIsTenantScoped sends one long prompt in a fixed order
// from two tenants and two cache salts. A repeat from the same tenant and
// salt is served from the prefix cache (cached_tokens > 0, whole pages);
// the first request of another tenant, or of another salt under the same
// tenant, is not (cached_tokens == 0), and the output never changes.
func TestE2EPrefixCacheIsTenantScoped(t *testing.T) {
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}})
	prompt := strings.Repeat("The same long shared system prompt. ", 8)
	ids := s.node.Model().Tokenizer.Encode(prompt, true, true)
	page := s.node.Limits().PageSize
	if len(ids) < 4*page {
		t.Fatalf("prompt of %d tokens is too short for a %d-token page", len(ids), page)
	}
	wantText := s.node.Model().Tokenizer.Decode(greedy(t, "tiny", ids, 12))
	steps := []struct {
		key, salt string
		hit       bool
	}{
		{e2eKeyA, "", false},
		{e2eKeyA, "", true},
		{e2eKeyB, "", false}, // another tenant never shares a's pages
		{e2eKeyB, "", true},
		{e2eKeyA, "s1", false}, // a salt is a separate cache under the tenant
		{e2eKeyA, "s1", true},
		{e2eKeyB, "s1", false}, // the same salt under another tenant is not a's
		{e2eKeyA, "s2", false},
		{e2eKeyA, "", true},
	}
	for i, st := range steps {
		body := map[string]any{"prompt": prompt, "max_tokens": 12, "temperature": 0}
		if st.salt != "" {
			body["cache_salt"] = st.salt
		}
		var c completionBody
		s.postOK(st.key, "/v1/completions", body, &c)
		cached := c.Usage.cached()
		if st.hit != (cached > 0) || cached < 0 || cached%page != 0 || cached >= len(ids) {
			t.Errorf("step %d (key %s salt %q): cached_tokens %d of %d (page %d), want a hit: %v",
				i, st.key, st.salt, cached, len(ids), page, st.hit)
		}
		if c.Usage.PromptTokens != len(ids) {
			t.Errorf("step %d: prompt_tokens %d, want %d whether cached or not", i, c.Usage.PromptTokens, len(ids))
		}
		if c.Choices[0].Text != wantText {
			t.Errorf("step %d: output %q, want %q (cached pages must give the same result)", i, c.Choices[0].Text, wantText)
		}
		// Sequential steps: the previous request's pages are published
		// once it ends.
		s.waitAllFree()
	}
	s.checkMustBeZero()
}

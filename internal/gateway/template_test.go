package gateway_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
)

// TestChatTemplateApplied: the model's template shapes the prompt, BOS is
// not doubled, and a template's raise_exception is a 400 with its message.
func TestChatTemplateApplied(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("chattmpl", "testdata", "llama2.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	fake := gatewaytest.NewFake()
	fake.Template = string(src)
	h := newHarness(t, fake)
	r := h.post("/v1/chat/completions", keyAlpha, map[string]any{"messages": []any{
		map[string]any{"role": "system", "content": "Be brief."},
		map[string]any{"role": "user", "content": "Hi"},
	}})
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	text, _ := fake.Detokenize(fake.LastParams().Prompt)
	if want := "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"; text != want {
		t.Errorf("prompt %q, want %q", text, want)
	}
	r = h.post("/v1/chat/completions", keyAlpha, map[string]any{"messages": []any{
		map[string]any{"role": "user", "content": "a"}, map[string]any{"role": "user", "content": "b"},
	}})
	if r.status != 400 || !strings.Contains(string(r.body), "Conversation roles must alternate") {
		t.Errorf("raise_exception: %d %s", r.status, r.body)
	}
	// A template that cannot be parsed falls back to ChatML.
	fake2 := gatewaytest.NewFake()
	fake2.Template = "{% include 'x' %}"
	h2 := newHarness(t, fake2)
	if r := h2.post("/v1/chat/completions", keyAlpha, chatBody(nil)); r.status != 200 {
		t.Fatalf("fallback: %d %s", r.status, r.body)
	}
	text, _ = fake2.Detokenize(fake2.LastParams().Prompt)
	if want := "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"; text != want {
		t.Errorf("fallback prompt %q, want %q", text, want)
	}
}

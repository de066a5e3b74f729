package node_test

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// TestVocabServing: a served model name and chat template replace the
// model's own; empty ones keep them.
func TestVocabServing(t *testing.T) {
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v := node.NewVocab(m, sched.Limits{})
	if got := v.Serving(node.Options{}); got.ModelID() != m.Name || got.ChatTemplate() != m.ChatTemplate {
		t.Errorf("no overrides: %q, %q; want the model's %q, %q", got.ModelID(), got.ChatTemplate(), m.Name, m.ChatTemplate)
	}
	got := v.Serving(node.Options{ServedModelName: "acme/chat-1", ChatTemplate: "{{ messages[0].content }}"})
	if got.ModelID() != "acme/chat-1" || got.ChatTemplate() != "{{ messages[0].content }}" {
		t.Errorf("overrides: %q, %q", got.ModelID(), got.ChatTemplate())
	}
	if v.ModelID() != m.Name {
		t.Error("Serving changed the Vocab it was called on")
	}
}

package node

import (
	"fmt"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// Vocab is what a gateway needs of a model without running it: its name,
// tokenizer and chat template, and the limits it is served under. A Node
// embeds one; a gateway in its own process builds one with Plan's limits.
type Vocab struct {
	model  *model.Model
	limits sched.Limits
	// id and template replace the model's name and chat template when
	// not empty (Options.ServedModelName, Options.ChatTemplate).
	id, template string
}

// NewVocab serves m's vocabulary under lim.
func NewVocab(m *model.Model, lim sched.Limits) Vocab { return Vocab{model: m, limits: lim} }

// Serving returns v with the model id and chat template o gives, where it
// gives them: what the API shows and applies instead of the model's own.
func (v Vocab) Serving(o Options) Vocab {
	v.id, v.template = o.ServedModelName, o.ChatTemplate
	return v
}

// ModelID implements gateway.Backend.
func (v Vocab) ModelID() string {
	if v.id != "" {
		return v.id
	}
	return v.model.Name
}

// Limits implements gateway.Backend.
func (v Vocab) Limits() gateway.Limits {
	return gateway.Limits{MaxContext: v.limits.MaxContext, MaxPromptTokens: v.limits.MaxPromptTokens, PageSize: v.limits.PageSize}
}

// Tokenize implements gateway.Backend.
func (v Vocab) Tokenize(text string, addSpecial, parseSpecial bool) ([]int, error) {
	return v.model.Tokenizer.Encode(text, addSpecial, parseSpecial), nil
}

// Detokenize implements gateway.Backend.
func (v Vocab) Detokenize(ids []int) (string, error) {
	n := v.model.Tokenizer.VocabSize()
	for _, id := range ids {
		if id < 0 || id >= n {
			return "", fmt.Errorf("token id %d is outside the vocabulary (0..%d)", id, n-1)
		}
	}
	return v.model.Tokenizer.Decode(ids), nil
}

// TokenPiece implements gateway.Backend.
func (v Vocab) TokenPiece(id int) []byte {
	if id < 0 || id >= v.model.Tokenizer.VocabSize() {
		return nil
	}
	return v.model.Tokenizer.Piece(id)
}

// ChatTemplate implements gateway.Backend.
func (v Vocab) ChatTemplate() string {
	if v.template != "" {
		return v.template
	}
	return v.model.ChatTemplate
}

// BOS implements gateway.Backend.
func (v Vocab) BOS() int { return v.model.Tokenizer.BOS() }

// EOS implements gateway.Backend.
func (v Vocab) EOS() int { return v.model.Tokenizer.EOS() }

// IsEOG implements gateway.Backend.
func (v Vocab) IsEOG(id int) bool { return v.model.Tokenizer.IsEOG(id) }

// FIM returns the model's fill-in-the-middle tokens
// (gateway.FillInTheMiddle).
func (v Vocab) FIM() (pre, suf, mid int, ok bool) {
	f, ok := v.model.Tokenizer.FIM()
	return f.Pre, f.Suf, f.Mid, ok
}

// PlanHandoff is what a node started on m with o would advertise to its
// peers, computed without allocating anything: the KV layout of the
// handoff and the served limits. A gateway in its own process uses it to
// handshake with the nodes (they must match exactly: I5).
func PlanHandoff(m *model.Model, o Options) (transfer.Layout, sched.Limits, error) {
	o = o.withDefaults()
	capa, err := Plan(m, o)
	if err != nil {
		return transfer.Layout{}, sched.Limits{}, err
	}
	c := m.Config
	kv := kvcache.Layout{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: o.PageSize, DType: o.KVType}
	return transfer.LayoutOf(kv, m.Digest, capa.Limits.MaxContext), capa.Limits, nil
}

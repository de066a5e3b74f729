package cli

import "github.com/pagewarden/pagewarden/internal/tokenizer"

// textStream turns generated token ids into printable text, holding back
// incomplete UTF-8 sequences across tokens.
type textStream struct{ d *tokenizer.StreamDecoder }

// newTextStream starts after the prompt ids, so that a leading space after
// BOS is handled as the tokenizer's detokenizer would.
func newTextStream(t *tokenizer.Tokenizer, prompt []int) *textStream {
	prev := -1
	if len(prompt) > 0 {
		prev = prompt[len(prompt)-1]
	}
	return &textStream{tokenizer.NewStreamDecoder(t, prev)}
}

func (s *textStream) add(tok int) string { return s.d.Add(tok) }
func (s *textStream) flush() string      { return s.d.Flush() }

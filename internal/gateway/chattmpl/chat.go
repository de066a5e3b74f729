package chattmpl

import (
	"errors"
	"strings"
)

// Message is one chat message as the template sees it.
type Message struct {
	Role    string
	Content string
}

// Input is what a chat template is rendered with, under the variable
// names Hugging Face's apply_chat_template uses.
type Input struct {
	Messages            []Message
	BOSToken, EOSToken  string
	AddGenerationPrompt bool
}

// RenderChat renders a chat template with in.
func (t *Template) RenderChat(in Input) (string, error) {
	msgs := make([]any, len(in.Messages))
	for i, m := range in.Messages {
		msgs[i] = NewDict("role", m.Role, "content", m.Content)
	}
	return t.Execute(map[string]any{
		"messages":              msgs,
		"bos_token":             in.BOSToken,
		"eos_token":             in.EOSToken,
		"add_generation_prompt": in.AddGenerationPrompt,
	})
}

// Fallback renders in without a template, in ChatML:
//
//	<|im_start|>ROLE\nCONTENT<|im_end|>\n   for each message, then
//	<|im_start|>assistant\n                 when AddGenerationPrompt.
//
// It is used when a model has no chat template or its template cannot be
// parsed. ChatML is chosen because it marks roles unambiguously, and models
// without a template usually saw no chat format at all, so a clear
// delimited format is the least surprising choice.
func Fallback(in Input) string {
	var b strings.Builder
	for _, m := range in.Messages {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString("<|im_end|>\n")
	}
	if in.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

// ErrRaised wraps the message of a template's raise_exception call: the
// template rejected its input (for example roles that do not alternate).
// Its text comes from the model file, not from the server's internals.
var ErrRaised = errors.New("chattmpl: template raised an exception")

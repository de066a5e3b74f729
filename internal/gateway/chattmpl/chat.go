package chattmpl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Message is one chat message as the template sees it. The tool-use
// fields are set in the template's message only when present, as a
// client's JSON message would have them.
type Message struct {
	Role    string
	Content string
	// ContentNull renders content as none (an assistant turn that only
	// calls tools).
	ContentNull bool
	// ToolCalls are an assistant turn's calls, as template values
	// (FromJSON of OpenAI's tool_calls array); nil when absent.
	ToolCalls []any
	// ToolCallID and Name are a tool result's call id and function name.
	ToolCallID string
	Name       string
}

// Input is what a chat template is rendered with, under the variable
// names Hugging Face's apply_chat_template uses.
type Input struct {
	Messages            []Message
	BOSToken, EOSToken  string
	AddGenerationPrompt bool
	// Tools is the tools variable (FromJSON of OpenAI's tools array); nil
	// leaves it undefined, as apply_chat_template does without tools.
	Tools []any
}

// RenderChat renders a chat template with in.
func (t *Template) RenderChat(in Input) (string, error) {
	msgs := make([]any, len(in.Messages))
	for i, m := range in.Messages {
		var content any = m.Content
		if m.ContentNull {
			content = nil
		}
		d := NewDict("role", m.Role, "content", content)
		if m.ToolCalls != nil {
			d.Set("tool_calls", m.ToolCalls)
		}
		if m.ToolCallID != "" {
			d.Set("tool_call_id", m.ToolCallID)
		}
		if m.Name != "" {
			d.Set("name", m.Name)
		}
		msgs[i] = d
	}
	vars := map[string]any{
		"messages":              msgs,
		"bos_token":             in.BOSToken,
		"eos_token":             in.EOSToken,
		"add_generation_prompt": in.AddGenerationPrompt,
	}
	if in.Tools != nil {
		vars["tools"] = in.Tools
	}
	return t.Execute(vars)
}

// FromJSON decodes JSON into template values: objects become *Dict with
// their keys in the document's order (tojson then writes them as the
// client sent them), arrays []any, integers int, other numbers float64.
func FromJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := fromJSON(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("chattmpl: trailing data after the JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds FromJSON's nesting.
const maxJSONDepth = 64

func fromJSON(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, errors.New("chattmpl: JSON nested too deeply")
	}
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := fromJSON(dec, depth+1)
				if err != nil {
					return nil, err
				}
				d.Set(k.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			l := []any{}
			for dec.More() {
				v, err := fromJSON(dec, depth+1)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			_, err := dec.Token()
			return l, err
		}
	case json.Number:
		if i, err := strconv.Atoi(string(t)); err == nil {
			return i, nil
		}
		return t.Float64()
	case string, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("chattmpl: unexpected JSON token %v", t)
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

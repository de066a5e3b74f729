package gateway

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pagewarden/pagewarden/internal/gateway/chattmpl"
	"github.com/pagewarden/pagewarden/internal/grammar"
)

// Tool calls. The tools reach the model through its chat template's tools
// variable (as llama.cpp and vLLM pass them); the call itself is
// constrained decoding: with tool_choice "required" or a named function
// the output is {"name": NAME, "arguments": ARGS}, a grammar.ToolCall, so
// the name is one of the functions and ARGS validates against its
// parameters. The response carries it as OpenAI's tool_calls.
//
// "auto" (the default with tools: the model decides between text and
// calls) is unconstrained, and the calls are parsed out of the text in the
// syntax the model's template teaches: Hermes'
// <tool_call>{"name": ..., "arguments": ...}</tool_call> (Hermes 2 Pro,
// Hermes 3, Qwen 2.5), Llama 3's whole-answer {"name": ..., "parameters":
// ...} (Llama 3.1, 3.2, 3.3) or Mistral's whole-answer [TOOL_CALLS][{"name":
// ..., "arguments": ...}, ...] (Mistral Nemo). For a template that teaches
// none of them, "auto" is refused rather than answered with text that
// never becomes a call.

// maxToolCallID bounds a tool message's tool_call_id.
const maxToolCallID = 256

// parseTools checks tools and tool_choice and sets g's tool fields: the
// template value of the tools, and for a call, the constraint.
func parseTools(rawTools, rawChoice, rawParallel json.RawMessage, g *genParams) *apiError {
	if !isNull(rawParallel) {
		var b bool
		if json.Unmarshal(rawParallel, &b) != nil {
			return badRequest("parallel_tool_calls", "'parallel_tool_calls' must be a boolean.")
		}
		// A constrained call is one call either way; with "auto", false
		// keeps the first of several calls.
		g.oneCall = !b
	}
	var tools []struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string          `json:"name"`
			Description *string         `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		} `json:"function"`
	}
	if !isNull(rawTools) {
		if err := json.Unmarshal(rawTools, &tools); err != nil {
			e := badRequest("tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {...}} objects.")
			e.Code, e.Err = "invalid_type", err
			return e
		}
	}
	if len(tools) > grammar.MaxTools {
		return badRequest("tools", "'tools' may hold at most %d functions.", grammar.MaxTools)
	}
	var defs []grammar.Tool
	for i, t := range tools {
		param := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return unsupported(param+".type", fmt.Sprintf("Tools of type %q (only function)", truncate(t.Type, 40)))
		}
		if t.Function == nil || !schemaNameRe.MatchString(t.Function.Name) {
			return badRequest(param+".function.name", "'%s.function.name' is required: 1 to 64 letters, digits, underscores or dashes.", param)
		}
		for _, d := range defs {
			if d.Name == t.Function.Name {
				return badRequest(param+".function.name", "Two tools are named %q.", d.Name)
			}
		}
		def := grammar.Tool{Name: t.Function.Name, Strict: t.Function.Strict != nil && *t.Function.Strict}
		if !isNull(t.Function.Parameters) {
			var compact bytes.Buffer
			if err := json.Compact(&compact, t.Function.Parameters); err != nil || compact.Bytes()[0] != '{' {
				return badRequest(param+".function.parameters", "'%s.function.parameters' must be a JSON Schema object.", param)
			}
			def.Parameters = compact.Bytes()
		}
		defs = append(defs, def)
	}
	choice, named, e := parseToolChoice(rawChoice, len(tools) > 0)
	if e != nil {
		return e
	}
	if len(tools) > 0 {
		v, err := chattmpl.FromJSON(rawTools)
		if err != nil {
			return internalError(err)
		}
		g.tools = v.([]any)
	}
	switch choice {
	case "none":
		return nil
	case "auto":
		g.toolAuto = make([]string, len(defs))
		for i, d := range defs {
			g.toolAuto[i] = d.Name
		}
		return nil
	case "required":
	case "function":
		i := -1
		for j, d := range defs {
			if d.Name == named {
				i = j
			}
		}
		if i < 0 {
			return badRequest("tool_choice", "'tool_choice' names %q, which is not in 'tools'.", truncate(named, 64))
		}
		defs = defs[i : i+1]
	}
	if g.sampling.Grammar != nil {
		return badRequest("tool_choice", "A tool call cannot be combined with '%s'.", g.constraint)
	}
	gr, err := grammar.Compile(grammar.ToolCallSpec(defs))
	var se *grammar.SchemaError
	switch {
	case errors.As(err, &se):
		e := badRequest("tools", "In 'tools' (function %s) at %q: %s (keyword '%s').", toolOf(defs, se.Path), pathAfterTool(se.Path), truncate(se.Msg, 300), truncate(se.Keyword, 64))
		e.Code, e.Err = "unsupported_parameter", err
		return e
	case err != nil:
		e := badRequest("tools", "'tools' holds a function whose parameters are not a usable JSON Schema: %s", truncate(err.Error(), 200))
		e.Err = err
		return e
	}
	g.sampling.Grammar, g.constraint, g.toolCall = gr, "tool_choice", true
	return nil
}

// toolOf and pathAfterTool split a ToolCall SchemaError's path
// ("/INDEX/parameters/...") into the function's name and the path inside
// its parameters.
func toolOf(defs []grammar.Tool, path string) string {
	var i int
	if _, err := fmt.Sscanf(path, "/%d", &i); err == nil && i >= 0 && i < len(defs) {
		return fmt.Sprintf("%q", defs[i].Name)
	}
	return "?"
}

func pathAfterTool(path string) string {
	if _, rest, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/"); ok {
		return "/" + rest
	}
	return "/"
}

// parseToolChoice returns "none", "auto", "required" or "function" (with
// the name). Absent, it is "none" without tools and "auto" with them, as
// in OpenAI's API.
func parseToolChoice(raw json.RawMessage, haveTools bool) (string, string, *apiError) {
	choice := "none"
	if haveTools {
		choice = "auto"
	}
	var name string
	if !isNull(raw) {
		var s string
		var obj struct {
			Type     string `json:"type"`
			Function *struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		switch {
		case json.Unmarshal(raw, &s) == nil:
			if s != "none" && s != "auto" && s != "required" {
				return "", "", badRequest("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}.")
			}
			choice = s
		case json.Unmarshal(raw, &obj) == nil && obj.Type == "function" && obj.Function != nil:
			choice, name = "function", obj.Function.Name
		default:
			return "", "", badRequest("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}.")
		}
	}
	if choice != "none" && !haveTools {
		return "", "", badRequest("tool_choice", "'tool_choice' %q needs 'tools'.", choice)
	}
	return choice, name, nil
}

// parseToolCalls turns an assistant message's tool_calls into the
// template's value. A call's arguments (a JSON string, as OpenAI sends
// them) become an object when they hold one, as vLLM passes them: the
// templates write them with tojson.
func parseToolCalls(raw json.RawMessage, param string) ([]any, *apiError) {
	var calls []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function *struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	bad := func() *apiError {
		return badRequest(param, "'%s' must be an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}} objects.", param)
	}
	if err := json.Unmarshal(raw, &calls); err != nil {
		return nil, bad()
	}
	out := make([]any, 0, len(calls))
	for _, c := range calls {
		if c.Type != "function" || c.Function == nil || c.Function.Name == "" || len(c.ID) > maxToolCallID {
			return nil, bad()
		}
		var args any = ""
		var s string
		switch {
		case isNull(c.Function.Arguments):
		case json.Unmarshal(c.Function.Arguments, &s) == nil:
			args = s
			if v, err := chattmpl.FromJSON([]byte(s)); err == nil {
				if d, ok := v.(*chattmpl.Dict); ok {
					args = d
				}
			}
		default:
			v, err := chattmpl.FromJSON(c.Function.Arguments)
			if err != nil {
				return nil, bad()
			}
			args = v
		}
		out = append(out, chattmpl.NewDict("id", c.ID, "type", "function",
			"function", chattmpl.NewDict("name", c.Function.Name, "arguments", args)))
	}
	return out, nil
}

// newCallID is a tool call's id: "call_" and 24 random hex digits.
func newCallID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "call_" + hex.EncodeToString(b[:])
}

// toolCallOutput splits a ToolCall output into the function's name and
// its arguments: whole when complete, what was written when cut short. ok
// is false when the output stops before the name is known.
func toolCallOutput(text string, complete bool) (name, args string, ok bool) {
	const lead = `{"name": `
	rest, found := strings.CutPrefix(text, lead)
	if !found {
		return "", "", false
	}
	var quoted json.RawMessage
	dec := json.NewDecoder(strings.NewReader(rest))
	if dec.Decode(&quoted) != nil || json.Unmarshal(quoted, &name) != nil {
		return "", "", false
	}
	args, found = strings.CutPrefix(text, grammar.ToolCallPrefix(name))
	if !found {
		return "", "", false
	}
	if complete {
		args = strings.TrimSuffix(args, "}")
	}
	return name, args, true
}

// hermesOpen and hermesClose delimit a call in Hermes' syntax.
const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
)

// Call syntaxes "auto" parses, by what the chat template teaches.
const (
	syntaxHermes  = "hermes"
	syntaxLlama3  = "llama3"
	syntaxMistral = "mistral"
)

// mistralCalls marks Mistral's calls; it is a control token in Mistral's
// vocabularies (no text), but may come out as text where it is not.
const mistralCalls = "[TOOL_CALLS]"

// callSyntax is the call syntax a chat template teaches, "" if none this
// server parses.
func callSyntax(template string) string {
	switch {
	case strings.Contains(template, hermesOpen) && strings.Contains(template, hermesClose):
		return syntaxHermes
	case strings.Contains(template, `{"name": function name, "parameters": dictionary of argument name and its value}`):
		return syntaxLlama3
	case strings.Contains(template, mistralCalls) && strings.Contains(template, "[AVAILABLE_TOOLS]"):
		return syntaxMistral
	}
	return ""
}

// callOpens is what a whole-answer call syntax's answer opens with (after
// spaces and, for Mistral, its marker).
func callOpens(syntax string) byte {
	if syntax == syntaxMistral {
		return '['
	}
	return '{'
}

// parseCalls parses an "auto" answer in syntax.
func parseCalls(syntax, text string, names []string) (content string, calls []autoCall, ok bool) {
	switch syntax {
	case syntaxLlama3:
		return parseLlama3(text, names)
	case syntaxMistral:
		return parseMistral(text, names)
	}
	return parseHermes(text, names)
}

// parseMistral parses Mistral's call syntax: the whole answer is a JSON
// array of {"name": NAME, "arguments": ARGS} objects (an "id" in them is
// ignored: the calls get ours), after the [TOOL_CALLS] marker when it is
// text; anything else is text.
func parseMistral(text string, names []string) (content string, calls []autoCall, ok bool) {
	rest := strings.TrimSpace(text)
	rest = strings.TrimSpace(strings.TrimPrefix(rest, mistralCalls))
	if !strings.HasPrefix(rest, "[") {
		return text, nil, false
	}
	dec := json.NewDecoder(strings.NewReader(rest))
	var list []struct {
		Name      *string         `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := dec.Decode(&list); err != nil || len(list) == 0 || strings.TrimSpace(rest[dec.InputOffset():]) != "" {
		return text, nil, false
	}
	for _, c := range list {
		if c.Name == nil || !slices.Contains(names, *c.Name) {
			return text, nil, false
		}
		args, good := objectArgs(c.Arguments)
		if !good {
			return text, nil, false
		}
		calls = append(calls, autoCall{name: *c.Name, args: args})
	}
	return "", calls, true
}

// parseLlama3 parses Llama 3's JSON call syntax: the whole answer is one
// or more {"name": NAME, "parameters": ARGS} objects ("arguments" is
// accepted too), separated by semicolons; anything else is text.
func parseLlama3(text string, names []string) (content string, calls []autoCall, ok bool) {
	rest := strings.TrimSpace(text)
	if !strings.HasPrefix(rest, "{") {
		return text, nil, false
	}
	for rest != "" {
		dec := json.NewDecoder(strings.NewReader(rest))
		var call struct {
			Name       *string         `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
			Arguments  json.RawMessage `json:"arguments"`
		}
		if err := dec.Decode(&call); err != nil || call.Name == nil || !slices.Contains(names, *call.Name) {
			return text, nil, false
		}
		raw := call.Parameters
		if isNull(raw) {
			raw = call.Arguments
		}
		args, good := objectArgs(raw)
		if !good {
			return text, nil, false
		}
		calls = append(calls, autoCall{name: *call.Name, args: args})
		rest = strings.TrimSpace(rest[dec.InputOffset():])
		if r, sep := strings.CutPrefix(rest, ";"); sep {
			rest = strings.TrimSpace(r)
		} else if rest != "" {
			return text, nil, false
		}
	}
	return "", calls, true
}

// objectArgs is a call's arguments as compact JSON: an object ({} when
// absent); ok is false for anything else.
func objectArgs(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "{}", true
	}
	var compact bytes.Buffer
	if json.Compact(&compact, raw) != nil || compact.Bytes()[0] != '{' {
		return "", false
	}
	return compact.String(), true
}

// autoCall is one call parsed out of an "auto" answer.
type autoCall struct {
	name, args string
}

// parseHermes splits an "auto" answer into its text before the first
// call and the calls, each <tool_call> holding one JSON object with a
// name among names and object arguments (the closing tag may be missing
// at the very end, where a model stops). Anything else, a call of an
// unknown function or malformed JSON included, leaves the whole answer as
// text (ok false), as vLLM's parser does.
func parseHermes(text string, names []string) (content string, calls []autoCall, ok bool) {
	i := strings.Index(text, hermesOpen)
	if i < 0 {
		return text, nil, false
	}
	content = strings.TrimSpace(text[:i])
	rest := text[i:]
	for rest != "" {
		body, found := strings.CutPrefix(rest, hermesOpen)
		if !found {
			return text, nil, false
		}
		dec := json.NewDecoder(strings.NewReader(body))
		var call struct {
			Name      *string         `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := dec.Decode(&call); err != nil || call.Name == nil || !slices.Contains(names, *call.Name) {
			return text, nil, false
		}
		args, good := objectArgs(call.Arguments)
		if !good {
			return text, nil, false
		}
		calls = append(calls, autoCall{name: *call.Name, args: args})
		after := strings.TrimSpace(body[dec.InputOffset():])
		after, closed := strings.CutPrefix(after, hermesClose)
		rest = strings.TrimSpace(after)
		if !closed && rest != "" {
			return text, nil, false
		}
	}
	return content, calls, true
}

// heldBack is how much of text's end could still become a call's opening
// tag: streamed content stops before it.
func heldBack(text string) int {
	for n := min(len(hermesOpen)-1, len(text)); n > 0; n-- {
		if strings.HasSuffix(text, hermesOpen[:n]) {
			return n
		}
	}
	return 0
}

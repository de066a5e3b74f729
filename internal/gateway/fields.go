package gateway

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// Every request field the server knows is in one of three classes, per
// endpoint (the tables below, and doc.go's summary of them):
//
//   - honoured: implemented with OpenAI's (or, for an extension, vLLM's)
//     meaning; each has a test that shows its effect;
//   - accepted: not a sampling knob (metadata, identifiers, cache hints):
//     accepted, checked for shape, and without effect on the output;
//   - refused: not implemented; present with any value but null or a
//     default (one that asks for what the server does anyway), the
//     request is refused with 400 unsupported_parameter naming the field.
//
// A field no table names is unknown and ignored, as OpenAI's server does.
// A refused field is decoded raw (a json.RawMessage field of the request
// struct with the field's JSON name), so that any value, of any type, is
// compared with its defaults and never half-parsed.

// use is what the server does with a known field.
type use uint8

const (
	honoured use = iota + 1
	accepted
	refused
)

func (u use) String() string {
	switch u {
	case honoured:
		return "honoured"
	case accepted:
		return "accepted"
	case refused:
		return "refused"
	}
	return fmt.Sprintf("use(%d)", uint8(u))
}

// knownField is one known request field of an endpoint.
type knownField struct {
	name string
	use  use
	// what names the missing feature in a refusal's message.
	what string
	// defaults are the JSON values of a refused field that are accepted:
	// they ask for nothing the server lacks. null always is.
	defaults []string
}

func honour(names ...string) []knownField {
	var fs []knownField
	for _, n := range names {
		fs = append(fs, knownField{name: n, use: honoured})
	}
	return fs
}

func accept(names ...string) []knownField {
	var fs []knownField
	for _, n := range names {
		fs = append(fs, knownField{name: n, use: accepted})
	}
	return fs
}

func refuse(name, what string, defaults ...string) knownField {
	return knownField{name: name, use: refused, what: what, defaults: defaults}
}

// sharedFields are known to both endpoints.
var sharedFields = concat(
	honour("model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
		"presence_penalty", "frequency_penalty", "logit_bias",
		// Extensions, with vLLM's meaning.
		"max_completion_tokens", "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "cache_salt",
		// A JSON Schema the output must validate against (package grammar).
		"guided_json",
		// Choices by fan-out on shared prompt pages (fanout.go).
		"n",
		// The prompt tokens' log-probabilities from the prefill
		// (logprobs.go), in vLLM's shape.
		"prompt_logprobs"),
	accept("user"),
	[]knownField{
		// vLLM's extensions this server does not implement.
		refuse("guided_regex", "Guided decoding ('guided_regex')"),
		refuse("guided_choice", "Guided decoding ('guided_choice')"),
		refuse("guided_grammar", "Guided decoding ('guided_grammar')"),
		refuse("guided_decoding_backend", "Guided decoding ('guided_decoding_backend')"),
		refuse("guided_whitespace_pattern", "Guided decoding ('guided_whitespace_pattern')"),
		refuse("structured_outputs", "Structured outputs"),
		refuse("grammar", "Grammar-constrained decoding"),
		refuse("json_schema", "Schema-constrained decoding"),
		refuse("min_tokens", "'min_tokens' other than 0", "0"),
		refuse("use_beam_search", "Beam search", "false"),
		refuse("length_penalty", "'length_penalty' (beam search)", "1"),
		refuse("allowed_token_ids", "'allowed_token_ids'"),
		refuse("bad_words", "'bad_words'", "[]"),
		refuse("include_stop_str_in_output", "'include_stop_str_in_output'", "false"),
		refuse("truncate_prompt_tokens", "'truncate_prompt_tokens'"),
	},
)

// chatFields are /v1/chat/completions' known fields: every field of
// OpenAI's chat completion request, and the extensions above.
var chatFields = concat(sharedFields,
	honour("messages", "add_generation_prompt", "response_format",
		// tools.go; parallel_tool_calls: false keeps the first of several
		// calls an "auto" answer makes (a constrained call is one call).
		"tools", "tool_choice", "parallel_tool_calls",
		// logprobs.go: the raw distribution's log-probabilities.
		"logprobs", "top_logprobs"),
	// Not sampling knobs. metadata and store go with OpenAI's stored
	// completions, which this server does not keep (store: true is
	// refused, since a client would then expect to read them back);
	// prompt_cache_key and prompt_cache_retention are hints for OpenAI's
	// cache routing; safety_identifier replaces user.
	accept("metadata", "prompt_cache_key", "prompt_cache_retention", "safety_identifier"),
	[]knownField{
		refuse("store", "Storing completions ('store': true)", "false"),
		refuse("functions", "Function calling", "[]"),
		refuse("function_call", "Function calling ('function_call' other than \"none\")", `"none"`),
		refuse("modalities", "Output modalities other than text", `["text"]`),
		refuse("audio", "Audio output"),
		refuse("prediction", "Predicted outputs"),
		refuse("reasoning_effort", "'reasoning_effort' (this model does not reason)"),
		refuse("verbosity", "'verbosity'"),
		refuse("web_search_options", "Web search"),
		refuse("service_tier", "'service_tier' other than auto or default", `"auto"`, `"default"`),
		// vLLM's chat extensions this server does not implement.
		refuse("echo", "'echo'", "false"),
		refuse("continue_final_message", "'continue_final_message'", "false"),
		refuse("chat_template", "A chat template from the request"),
		refuse("chat_template_kwargs", "'chat_template_kwargs'"),
		refuse("documents", "'documents'"),
	},
)

// completionFields are /v1/completions' known fields: every field of
// OpenAI's (legacy) completion request, and the extensions above.
var completionFields = concat(sharedFields,
	// A list of prompts is a batch, echo prepends each choice's prompt
	// (both by the fan-out, fanout.go).
	// suffix: fill-in-the-middle, with a model that has the tokens for
	// it (fim.go; refused with one that has not).
	// logprobs: an integer, the legacy shape (logprobs.go); best_of:
	// candidates by fan-out, the n most likely returned (fanout.go).
	honour("prompt", "echo", "suffix", "logprobs", "best_of"),
	[]knownField{
		// The chat endpoint's knob: completions count alternatives in
		// 'logprobs' itself.
		refuse("top_logprobs", "'top_logprobs' on completions (send the number of alternatives as 'logprobs')"),
	},
)

func concat(lists ...[]knownField) []knownField {
	var out []knownField
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// rawFields maps the JSON name of every json.RawMessage field of struct
// type t (embedded structs' included) to its index.
func rawFields(t reflect.Type) map[string][]int {
	m := map[string][]int{}
	rawType := reflect.TypeFor[json.RawMessage]()
	for _, f := range reflect.VisibleFields(t) {
		if f.Type != rawType || !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			m[name] = f.Index
		}
	}
	return m
}

// refusals is an endpoint's refused fields, each with the index of its raw
// field in the request struct and its defaults decoded.
type refusals []refusal

type refusal struct {
	knownField
	index    []int
	defaults []any
}

// newRefusals checks, once at start-up, that every refused field of
// fields has a raw field in the request struct of type t: a refusal that
// could not see its field would let it through.
func newRefusals(t reflect.Type, fields []knownField) refusals {
	raw := rawFields(t)
	var rs refusals
	for _, f := range fields {
		if f.use != refused {
			continue
		}
		idx, ok := raw[f.name]
		if !ok {
			panic(fmt.Sprintf("gateway: refused field %q has no json.RawMessage field in %v", f.name, t))
		}
		r := refusal{knownField: f, index: idx}
		for _, d := range f.defaults {
			var v any
			if err := json.Unmarshal([]byte(d), &v); err != nil {
				panic(fmt.Sprintf("gateway: default %s of %q: %v", d, f.name, err))
			}
			r.defaults = append(r.defaults, v)
		}
		rs = append(rs, r)
	}
	return rs
}

var (
	chatRefusals       = newRefusals(reflect.TypeFor[chatRequest](), chatFields)
	completionRefusals = newRefusals(reflect.TypeFor[completionRequest](), completionFields)
)

// check refuses req (a pointer to the struct the refusals were made for)
// if one of the refused fields is present with a value other than null or
// a default.
func (rs refusals) check(req any) *apiError {
	v := reflect.ValueOf(req).Elem()
	for _, r := range rs {
		raw := json.RawMessage(v.FieldByIndex(r.index).Bytes()) // Bytes, unlike Interface, does not allocate
		if isNull(raw) || r.isDefault(raw) {
			continue
		}
		return unsupported(r.name, r.what)
	}
	return nil
}

// isDefault compares values, not spellings: 1 and 1.0, or {"type":"text"}
// with any spacing, are the same default.
func (r refusal) isDefault(raw json.RawMessage) bool {
	if len(r.defaults) == 0 {
		return false
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	for _, d := range r.defaults {
		if reflect.DeepEqual(v, d) {
			return true
		}
	}
	return false
}

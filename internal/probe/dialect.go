package probe

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// The OpenAI API does not say how to count a prompt's tokens, how long the
// window is, or how much of a prompt came from a cache, so each server
// says it its own way. This file reads the ways the probe knows; a server
// that speaks none of them gets the checks that need them skipped (with
// the reason), never passed.

// tokenizer is the /tokenize dialect a server speaks.
type tokenizer string

const (
	// tokNone: no /tokenize the probe can read.
	tokNone tokenizer = ""
	// tokVLLM: vLLM's and pagewarden's request
	// {"model", "prompt", "add_special_tokens"}, answered with
	// {"count", "tokens", "max_model_len"}.
	tokVLLM tokenizer = "vllm"
	// tokLlama: llama.cpp's request {"content", "add_special"}, answered
	// with {"tokens": [ids]} (or [{"id", "piece"}] with with_pieces).
	// It ignores vLLM's fields and answers them {"tokens": []}, which is
	// why an empty answer for a non-empty text is no tokenizer at all.
	tokLlama tokenizer = "llama.cpp"
)

// tokenizeBody is a /tokenize request for text in dialect t.
func tokenizeBody(t tokenizer, model, text string, addSpecial bool) []byte {
	var v any
	switch t {
	case tokLlama:
		v = map[string]any{"content": text, "add_special": addSpecial}
	default:
		v = map[string]any{"model": model, "prompt": text, "add_special_tokens": addSpecial}
	}
	b, _ := json.Marshal(v)
	return b
}

// tokenizeExchange builds a /tokenize request of text in dialect t.
func tokenizeExchange(t tokenizer, model, text string, addSpecial bool) *exchange {
	return &exchange{key: 0, method: http.MethodPost, path: "/tokenize", body: tokenizeBody(t, model, text, addSpecial), optional: true,
		desc: fmt.Sprintf("POST /tokenize (%s form, %d bytes)", orElse(string(t), string(tokVLLM)), len(text))}
}

// errNoTokens is parseTokenize's answer to a body with neither a count nor
// any token: a server that did not understand the request.
var errNoTokens = errors.New("no count and no tokens")

// parseTokenize reads a /tokenize answer of either dialect: the token ids
// (nil when the server sent only a count), their number, and
// max_model_len (0 when absent). A count that disagrees with the ids sent
// beside it is an error: the probe would not know which to trust.
func parseTokenize(raw []byte) (ids []int, count, maxModelLen int, err error) {
	var v struct {
		Count       *int              `json:"count"`
		Tokens      []json.RawMessage `json:"tokens"`
		MaxModelLen int               `json:"max_model_len"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, 0, 0, fmt.Errorf("not JSON: %w", err)
	}
	for i, t := range v.Tokens {
		var id int
		if err := json.Unmarshal(t, &id); err != nil {
			// llama.cpp's with_pieces form: {"id": 1, "piece": "a"}.
			var p struct {
				ID *int `json:"id"`
			}
			if json.Unmarshal(t, &p) != nil || p.ID == nil {
				return nil, 0, 0, fmt.Errorf("token %d is %s: neither an id nor {\"id\": …}", i, clip(t, 40))
			}
			id = *p.ID
		}
		ids = append(ids, id)
	}
	switch {
	case v.Count != nil && v.Tokens != nil && *v.Count != len(ids):
		return nil, 0, 0, fmt.Errorf("count %d but %d tokens", *v.Count, len(ids))
	case v.Count != nil && *v.Count < 0:
		return nil, 0, 0, fmt.Errorf("count %d", *v.Count)
	case v.Count != nil:
		count = *v.Count
	case len(ids) > 0:
		count = len(ids)
	default:
		return nil, 0, v.MaxModelLen, errNoTokens
	}
	return ids, count, v.MaxModelLen, nil
}

// timings is llama.cpp's per-answer timing object; prompt_n is the number
// of prompt tokens it evaluated, so prompt_tokens − prompt_n came from its
// slot's cache (it re-evaluates at least the last prompt token).
type timings struct {
	PromptN *int `json:"prompt_n"`
}

// cachedTokens is the number of prompt tokens e's server says it took from
// a cache, and where that number came from ("" when the answer does not
// say: no usage.prompt_tokens_details and no llama.cpp timings).
func (e *exchange) cachedTokens() (int, string) {
	switch {
	case e.usage != nil && e.usage.PromptTokensDetails != nil:
		return e.usage.PromptTokensDetails.CachedTokens, "usage.prompt_tokens_details.cached_tokens"
	case e.usage != nil && e.timings != nil && e.timings.PromptN != nil:
		return max(e.usage.PromptTokens-*e.timings.PromptN, 0), "usage.prompt_tokens − timings.prompt_n"
	}
	return 0, ""
}

// serverKind names the server from what /props and /v1/models showed, for
// the report and for the reasons of checks that depend on what the server
// promises; "" when it is not recognized.
func serverKind(props, models []byte) string {
	var p struct {
		Settings  json.RawMessage `json:"default_generation_settings"`
		BuildInfo string          `json:"build_info"`
	}
	if json.Unmarshal(props, &p) == nil && len(p.Settings) > 0 {
		if p.BuildInfo != "" {
			return "llama.cpp server " + p.BuildInfo
		}
		return "llama.cpp server"
	}
	var m struct {
		Data []struct {
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if json.Unmarshal(models, &m) == nil && len(m.Data) > 0 {
		switch m.Data[0].OwnedBy {
		case "llamacpp":
			return "llama.cpp server"
		case "vllm":
			return "vLLM"
		case "sglang":
			return "SGLang"
		case "pagewarden":
			return "pagewarden"
		}
	}
	return ""
}

// orElse is a if it is not empty, else b.
func orElse(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

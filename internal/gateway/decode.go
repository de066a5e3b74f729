package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Bounds on decoded requests. Bodies are already capped by
// Config.MaxBodyBytes; these keep individual fields sane.
const (
	maxStops       = 16
	maxStopBytes   = 256
	maxCacheSalt   = 256
	maxUserBytes   = 256
	maxMessages    = 4096
	maxPromptIDs   = 1 << 20
	maxModelIDSize = 256
	// maxMaxTokens bounds max_tokens where it enters, far above any
	// context window, so that no sum of client numbers downstream
	// (prompt + max_tokens, pages, quota charges) can overflow.
	maxMaxTokens = 1 << 30
)

// commonFields are the generation parameters shared by both endpoints.
// Pointers distinguish "absent or null" from zero. Unknown fields are
// ignored, as OpenAI does. Refused fields (fields.go) are raw, checked
// against their defaults by the endpoint's refusals.
type commonFields struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	RepetitionPenalty   *float64        `json:"repetition_penalty"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	LogitBias           json.RawMessage `json:"logit_bias"`
	Stop                json.RawMessage `json:"stop"`
	StopTokenIDs        []int           `json:"stop_token_ids"`
	IgnoreEOS           *bool           `json:"ignore_eos"`
	Seed                *int64          `json:"seed"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	User      *string `json:"user"`
	CacheSalt *string `json:"cache_salt"`

	N                       json.RawMessage `json:"n"`
	TopLogprobs             json.RawMessage `json:"top_logprobs"`
	GuidedJSON              json.RawMessage `json:"guided_json"`
	GuidedRegex             json.RawMessage `json:"guided_regex"`
	GuidedChoice            json.RawMessage `json:"guided_choice"`
	GuidedGrammar           json.RawMessage `json:"guided_grammar"`
	GuidedDecodingBackend   json.RawMessage `json:"guided_decoding_backend"`
	GuidedWhitespacePattern json.RawMessage `json:"guided_whitespace_pattern"`
	StructuredOutputs       json.RawMessage `json:"structured_outputs"`
	Grammar                 json.RawMessage `json:"grammar"`
	JSONSchema              json.RawMessage `json:"json_schema"`
	MinTokens               json.RawMessage `json:"min_tokens"`
	UseBeamSearch           json.RawMessage `json:"use_beam_search"`
	LengthPenalty           json.RawMessage `json:"length_penalty"`
	AllowedTokenIDs         json.RawMessage `json:"allowed_token_ids"`
	BadWords                json.RawMessage `json:"bad_words"`
	IncludeStopStrInOutput  json.RawMessage `json:"include_stop_str_in_output"`
	PromptLogprobs          json.RawMessage `json:"prompt_logprobs"`
	TruncatePromptTokens    json.RawMessage `json:"truncate_prompt_tokens"`
}

type chatRequest struct {
	commonFields
	Messages            []chatMessage `json:"messages"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt"`
	// Accepted, without effect on the output (fields.go).
	Metadata             map[string]string `json:"metadata"`
	PromptCacheKey       *string           `json:"prompt_cache_key"`
	PromptCacheRetention *string           `json:"prompt_cache_retention"`
	SafetyIdentifier     *string           `json:"safety_identifier"`

	Store                json.RawMessage `json:"store"`
	Logprobs             json.RawMessage `json:"logprobs"`
	Tools                json.RawMessage `json:"tools"`
	ToolChoice           json.RawMessage `json:"tool_choice"`
	ParallelToolCalls    json.RawMessage `json:"parallel_tool_calls"`
	Functions            json.RawMessage `json:"functions"`
	FunctionCall         json.RawMessage `json:"function_call"`
	ResponseFormat       json.RawMessage `json:"response_format"`
	Modalities           json.RawMessage `json:"modalities"`
	Audio                json.RawMessage `json:"audio"`
	Prediction           json.RawMessage `json:"prediction"`
	ReasoningEffort      json.RawMessage `json:"reasoning_effort"`
	Verbosity            json.RawMessage `json:"verbosity"`
	WebSearchOptions     json.RawMessage `json:"web_search_options"`
	ServiceTier          json.RawMessage `json:"service_tier"`
	Echo                 json.RawMessage `json:"echo"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	ChatTemplate         json.RawMessage `json:"chat_template"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	Documents            json.RawMessage `json:"documents"`
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       *string         `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID *string         `json:"tool_call_id"`
}

type completionRequest struct {
	commonFields
	Prompt json.RawMessage `json:"prompt"`

	Logprobs json.RawMessage `json:"logprobs"`
	Echo     json.RawMessage `json:"echo"`
	BestOf   json.RawMessage `json:"best_of"`
	Suffix   json.RawMessage `json:"suffix"`
}

// genParams is a validated request, independent of the endpoint.
type genParams struct {
	model        string
	maxTokens    int    // 0: fill the window; else in [1, maxMaxTokens]
	n            int    // choices per prompt, in [1, maxN]
	echo         bool   // completions: the prompt before each choice's text
	suffix       string // completions: the text after the gap to fill (fim.go)
	maxParam     string // the field maxTokens came from
	sampling     request.Sampling
	stop         []string
	stopTokens   []int // stop_token_ids, each non-negative (the vocabulary is checked at submit)
	ignoreEOS    bool
	stream       bool
	includeUsage bool
	cacheSalt    string
	user         string
	// constraint is the request field the output constraint
	// (sampling.Grammar) came from, "" when there is none.
	constraint string
	// tools is the chat template's tools variable (nil: none given);
	// toolCall says the output is a grammar.ToolCall, answered as
	// tool_calls.
	tools    []any
	toolCall bool
	// toolAuto, for tool_choice "auto", names the functions whose calls
	// are parsed out of the answer (nil otherwise), in toolSyntax.
	toolAuto   []string
	toolSyntax string
	oneCall    bool // parallel_tool_calls: false
	// logprobs: the response shows log-probabilities, each token's and
	// its topLogprobs most likely alternatives' (logprobs.go).
	logprobs    bool
	topLogprobs int
	// echoLogprobs: completions' echo with logprobs, the prompt tokens'
	// entries before the answer's (the first with a null logprob).
	echoLogprobs bool
	// promptLogprobs: vLLM's prompt_logprobs, with promptTop
	// alternatives per prompt token (logprobs.go).
	promptLogprobs bool
	promptTop      int
	// keep, for completions' best_of > n, is the n choices returned of
	// each prompt's n = best_of candidates (fanout.go); 0 otherwise.
	keep int
}

// message is a validated chat message.
type message struct {
	Role    string
	Content string
	// Tool use: an assistant's calls (template values; content may then
	// be null), a tool result's call id and function name.
	ContentNull bool
	ToolCalls   []any
	ToolCallID  string
	Name        string
}

// promptInput is a validated completions prompt: text or token ids.
type promptInput struct {
	text   string
	ids    []int
	hasIDs bool
}

// decodeJSON unmarshals body into v, turning every failure into a 400 that
// names the field and says what was expected, without echoing Go internals.
func decodeJSON(body []byte, v any) *apiError {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("", "The request body is empty; expected a JSON object.")
	}
	if !utf8.Valid(body) {
		e := badRequest("", "The request body is not valid UTF-8.")
		e.Code = "invalid_utf8"
		return e
	}
	if err := json.Unmarshal(body, v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_json",
				Message: fmt.Sprintf("We could not parse the JSON body of your request (at byte %d). Send valid JSON.", se.Offset), Err: err}
		case errors.As(err, &te):
			// Fields of the embedded struct are reported with its Go
			// name in front; the client knows only the JSON path.
			te.Field = strings.TrimPrefix(te.Field, "commonFields.")
			if te.Field == "" {
				return &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_json",
					Message: "The request body must be a JSON object.", Err: err}
			}
			e := badRequest(te.Field, "Invalid type for '%s': expected %s, got %s.", te.Field, jsonKind(te.Type), te.Value)
			e.Code = "invalid_type"
			e.Err = err
			return e
		}
		return &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_json",
			Message: "We could not parse the JSON body of your request. Send valid JSON.", Err: err}
	}
	return nil
}

// jsonKind names a Go type the way a JSON client thinks of it.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// validate checks the shared fields and fills a genParams.
func (f *commonFields) validate() (genParams, *apiError) {
	var g genParams
	if len(f.Model) > maxModelIDSize {
		return g, badRequest("model", "'model' is too long.")
	}
	g.model = f.Model
	mt := f.MaxTokens
	g.maxParam = "max_tokens"
	if f.MaxCompletionTokens != nil {
		mt, g.maxParam = f.MaxCompletionTokens, "max_completion_tokens"
	}
	if mt != nil {
		if *mt < 1 {
			return g, badRequest(g.maxParam, "'%s' must be at least 1, got %d.", g.maxParam, *mt)
		}
		if *mt > maxMaxTokens {
			return g, badRequest(g.maxParam, "'%s' is too large: %d. This server accepts at most %d, and the model's context window bounds it further.", g.maxParam, *mt, maxMaxTokens)
		}
		g.maxTokens = *mt
	}
	if v := f.Temperature; v != nil {
		if *v < 0 || *v > 2 {
			return g, badRequest("temperature", "'temperature' must be between 0 and 2, got %g.", *v)
		}
		g.sampling.Temperature = float32(*v)
	}
	if v := f.TopP; v != nil {
		if *v <= 0 || *v > 1 {
			return g, badRequest("top_p", "'top_p' must be in (0, 1], got %g.", *v)
		}
		g.sampling.TopP = float32(*v)
	}
	if v := f.TopK; v != nil {
		if *v < -1 {
			return g, badRequest("top_k", "'top_k' must be -1 (off), 0 (off) or positive, got %d.", *v)
		}
		if *v > 0 {
			g.sampling.TopK = *v
		}
	}
	if v := f.MinP; v != nil {
		if *v < 0 || *v > 1 {
			return g, badRequest("min_p", "'min_p' must be between 0 and 1, got %g.", *v)
		}
		g.sampling.MinP = float32(*v)
	}
	if v := f.RepetitionPenalty; v != nil {
		if *v <= 0 || *v > 10 {
			return g, badRequest("repetition_penalty", "'repetition_penalty' must be in (0, 10], got %g.", *v)
		}
		g.sampling.RepetitionPenalty = float32(*v)
	}
	if v := f.PresencePenalty; v != nil {
		if *v < -2 || *v > 2 {
			return g, badRequest("presence_penalty", "'presence_penalty' must be between -2 and 2, got %g.", *v)
		}
		g.sampling.PresencePenalty = float32(*v)
	}
	if v := f.FrequencyPenalty; v != nil {
		if *v < -2 || *v > 2 {
			return g, badRequest("frequency_penalty", "'frequency_penalty' must be between -2 and 2, got %g.", *v)
		}
		g.sampling.FrequencyPenalty = float32(*v)
	}
	n, e := parseN(f.N)
	if e != nil {
		return g, e
	}
	g.n = n
	bias, e := parseLogitBias(f.LogitBias)
	if e != nil {
		return g, e
	}
	g.sampling.LogitBias = bias
	if f.Seed != nil {
		g.sampling.Seed = uint64(*f.Seed)
	} else {
		// Without a seed every request must draw differently: a fixed
		// default would give two tenants the same "random" text.
		g.sampling.Seed = request.NewSeed()
	}
	stops, err := parseStop(f.Stop)
	if err != nil {
		return g, err
	}
	g.stop = stops
	if len(f.StopTokenIDs) > request.MaxStopTokens {
		return g, badRequest("stop_token_ids", "'stop_token_ids' may hold at most %d ids.", request.MaxStopTokens)
	}
	for _, id := range f.StopTokenIDs {
		if id < 0 {
			return g, badRequest("stop_token_ids", "'stop_token_ids' holds a negative id: %d.", id)
		}
	}
	if len(f.StopTokenIDs) > 0 {
		g.stopTokens = f.StopTokenIDs
	}
	g.ignoreEOS = f.IgnoreEOS != nil && *f.IgnoreEOS
	if gr, e := parseGuidedJSON(f.GuidedJSON); e != nil {
		return g, e
	} else if gr != nil {
		g.sampling.Grammar, g.constraint = gr, "guided_json"
	}
	g.stream = f.Stream != nil && *f.Stream
	if f.StreamOptions != nil {
		if !g.stream {
			return g, badRequest("stream_options", "'stream_options' is only allowed when 'stream' is true.")
		}
		g.includeUsage = f.StreamOptions.IncludeUsage != nil && *f.StreamOptions.IncludeUsage
	}
	if f.User != nil {
		if len(*f.User) > maxUserBytes {
			return g, badRequest("user", "'user' must be at most %d bytes.", maxUserBytes)
		}
		g.user = *f.User
	}
	if f.CacheSalt != nil {
		if *f.CacheSalt == "" || len(*f.CacheSalt) > maxCacheSalt {
			return g, badRequest("cache_salt", "'cache_salt' must be a non-empty string of at most %d bytes.", maxCacheSalt)
		}
		g.cacheSalt = *f.CacheSalt
	}
	return g, nil
}

// parseN accepts null (1) or an integer in [1, maxN]; an integral number
// such as 2.0 is that integer, as JSON does not tell them apart.
func parseN(raw json.RawMessage) (int, *apiError) {
	if isNull(raw) {
		return 1, nil
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		e := badRequest("n", "Invalid type for 'n': expected an integer.")
		e.Code, e.Err = "invalid_type", err
		return 0, e
	}
	if f != math.Trunc(f) || f < 1 || f > maxN {
		return 0, badRequest("n", "'n' must be an integer between 1 and %d, got %s.", maxN, bytes.TrimSpace(raw))
	}
	return int(f), nil
}

// parseLogitBias accepts null or an object mapping token ids (decimal
// strings, as OpenAI's API has them) to biases in [-100, 100], at most
// request.MaxLogitBias of them. The result is sorted by token, each token
// once, nil when empty; whether the ids are in the vocabulary is checked
// at submit.
func parseLogitBias(raw json.RawMessage) ([]request.TokenBias, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var m map[string]*float64
	if err := json.Unmarshal(raw, &m); err != nil {
		e := badRequest("logit_bias", "'logit_bias' must be an object mapping token ids to numbers between -%d and %d.", request.MaxBias, request.MaxBias)
		e.Code, e.Err = "invalid_type", err
		return nil, e
	}
	if len(m) > request.MaxLogitBias {
		return nil, badRequest("logit_bias", "'logit_bias' may hold at most %d entries, got %d.", request.MaxLogitBias, len(m))
	}
	// In key order, so that a body with several faults always gets the
	// same answer.
	keys := slices.Sorted(maps.Keys(m))
	out := make([]request.TokenBias, 0, len(keys))
	for _, k := range keys {
		id, err := strconv.ParseUint(k, 10, 31)
		if err != nil {
			return nil, badRequest("logit_bias", "'logit_bias' has a key that is not a token id; keys must be non-negative integers written as strings, such as \"50256\".")
		}
		v := m[k]
		if v == nil || *v < -request.MaxBias || *v > request.MaxBias {
			return nil, badRequest("logit_bias", "'logit_bias' values must be numbers between -%d and %d (token %d).", request.MaxBias, request.MaxBias, id)
		}
		out = append(out, request.TokenBias{Token: int(id), Bias: float32(*v)})
	}
	slices.SortFunc(out, func(a, b request.TokenBias) int { return a.Token - b.Token })
	for i := 1; i < len(out); i++ {
		if out[i].Token == out[i-1].Token {
			return nil, badRequest("logit_bias", "'logit_bias' names token %d twice.", out[i].Token)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// parseStop accepts a string, an array of strings, or null.
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var one string
	var many []string
	if err := json.Unmarshal(raw, &one); err == nil {
		many = []string{one}
	} else if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "'stop' must be a string or an array of strings.")
	}
	if len(many) > maxStops {
		return nil, badRequest("stop", "'stop' may hold at most %d sequences.", maxStops)
	}
	for _, s := range many {
		if s == "" || len(s) > maxStopBytes {
			return nil, badRequest("stop", "Each stop sequence must be non-empty and at most %d bytes.", maxStopBytes)
		}
	}
	return many, nil
}

// parseChat decodes and validates a chat completion request.
func parseChat(body []byte) (genParams, []message, bool, *apiError) {
	var req chatRequest
	if e := decodeJSON(body, &req); e != nil {
		return genParams{}, nil, false, e
	}
	if e := chatRefusals.check(&req); e != nil {
		return genParams{}, nil, false, e
	}
	g, e := req.validate()
	if e != nil {
		return g, nil, false, e
	}
	if e := req.checkAccepted(); e != nil {
		return g, nil, false, e
	}
	if gr, e := parseResponseFormat(req.ResponseFormat); e != nil {
		return g, nil, false, e
	} else if gr != nil {
		if g.sampling.Grammar != nil {
			return g, nil, false, badRequest("response_format", "Send either 'response_format' or 'guided_json', not both.")
		}
		g.sampling.Grammar, g.constraint = gr, "response_format"
	}
	if e := parseTools(req.Tools, req.ToolChoice, req.ParallelToolCalls, &g); e != nil {
		return g, nil, false, e
	}
	if e := parseChatLogprobs(req.Logprobs, req.TopLogprobs, &g); e != nil {
		return g, nil, false, e
	}
	if e := parsePromptLogprobs(req.PromptLogprobs, &g); e != nil {
		return g, nil, false, e
	}
	if len(req.Messages) == 0 {
		return g, nil, false, badRequest("messages", "'messages' must be a non-empty array.")
	}
	if len(req.Messages) > maxMessages {
		return g, nil, false, badRequest("messages", "'messages' may hold at most %d messages.", maxMessages)
	}
	msgs := make([]message, len(req.Messages))
	for i, m := range req.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		switch m.Role {
		case "system", "user", "assistant", "tool":
		case "developer":
			m.Role = "system" // OpenAI's newer name for the system role
		case "":
			return g, nil, false, badRequest(param+".role", "'%s.role' is required.", param)
		default:
			return g, nil, false, badRequest(param+".role", "Unsupported role in '%s.role': use system, developer, user, assistant or tool.", param)
		}
		msg := message{Role: m.Role}
		if m.Role == "assistant" && !isNull(m.ToolCalls) {
			calls, e := parseToolCalls(m.ToolCalls, param+".tool_calls")
			if e != nil {
				return g, nil, false, e
			}
			msg.ToolCalls = calls
			msg.ContentNull = isNull(m.Content)
		} else if !isNull(m.ToolCalls) {
			return g, nil, false, badRequest(param+".tool_calls", "Only assistant messages carry 'tool_calls'.")
		}
		if m.Role == "tool" {
			if m.ToolCallID == nil || *m.ToolCallID == "" || len(*m.ToolCallID) > maxToolCallID {
				return g, nil, false, badRequest(param+".tool_call_id", "'%s.tool_call_id' is required for a tool message (at most %d bytes).", param, maxToolCallID)
			}
			msg.ToolCallID = *m.ToolCallID
		}
		if m.Name != nil && len(*m.Name) <= maxUserBytes {
			msg.Name = *m.Name
		}
		text, e := parseContent(m.Content, param+".content", m.Role == "assistant")
		if e != nil {
			return g, nil, false, e
		}
		msg.Content = text
		msgs[i] = msg
	}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	return g, msgs, addGen, nil
}

// Bounds on the accepted metadata fields, as OpenAI states them.
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// checkAccepted checks the shape of the accepted, non-sampling fields: they
// change nothing, but a value OpenAI would refuse is refused here too.
func (r *chatRequest) checkAccepted() *apiError {
	if len(r.Metadata) > maxMetadataPairs {
		return badRequest("metadata", "'metadata' may hold at most %d pairs.", maxMetadataPairs)
	}
	for k, v := range r.Metadata {
		if len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return badRequest("metadata", "'metadata' keys must be at most %d characters and values at most %d.", maxMetadataKey, maxMetadataValue)
		}
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"prompt_cache_key", r.PromptCacheKey}, {"prompt_cache_retention", r.PromptCacheRetention}, {"safety_identifier", r.SafetyIdentifier}} {
		if f.v != nil && len(*f.v) > maxUserBytes {
			return badRequest(f.name, "'%s' must be at most %d bytes.", f.name, maxUserBytes)
		}
	}
	return nil
}

// parseContent accepts a string, an array of text parts, or (for the
// assistant) null.
func parseContent(raw json.RawMessage, param string, nullOK bool) (string, *apiError) {
	if isNull(raw) {
		if nullOK {
			return "", nil
		}
		return "", badRequest(param, "'%s' is required.", param)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(param, "'%s' must be a string or an array of content parts.", param)
	}
	var b bytes.Buffer
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", unsupported(fmt.Sprintf("%s[%d]", param, i), "Content parts other than text")
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// parseCompletion decodes and validates a completions request.
func parseCompletion(body []byte) (genParams, []promptInput, *apiError) {
	var req completionRequest
	if e := decodeJSON(body, &req); e != nil {
		return genParams{}, nil, e
	}
	if e := completionRefusals.check(&req); e != nil {
		return genParams{}, nil, e
	}
	g, e := req.validate()
	if e != nil {
		return g, nil, e
	}
	if !isNull(req.Echo) {
		if err := json.Unmarshal(req.Echo, &g.echo); err != nil {
			e := badRequest("echo", "Invalid type for 'echo': expected a boolean.")
			e.Code, e.Err = "invalid_type", err
			return g, nil, e
		}
	}
	if !isNull(req.Suffix) {
		if err := json.Unmarshal(req.Suffix, &g.suffix); err != nil {
			e := badRequest("suffix", "Invalid type for 'suffix': expected a string or null.")
			e.Code, e.Err = "invalid_type", err
			return g, nil, e
		}
	}
	if e := parseCompletionLogprobs(req.Logprobs, &g); e != nil {
		return g, nil, e
	}
	if e := parsePromptLogprobs(req.PromptLogprobs, &g); e != nil {
		return g, nil, e
	}
	if e := parseBestOf(req.BestOf, &g); e != nil {
		return g, nil, e
	}
	ps, e := parsePrompt(req.Prompt)
	if e == nil && g.keep > 0 && len(ps)*g.n > maxN {
		e = badRequest("best_of", "%d prompts × 'best_of' = %d make %d candidates; at most %d are allowed per request.", len(ps), g.n, len(ps)*g.n, maxN)
	}
	if e == nil && len(ps)*g.n > maxN {
		// Every choice of every prompt is a sequence: the same bound.
		e = badRequest("prompt", "%d prompts × 'n' = %d make %d choices; at most %d are allowed per request.", len(ps), g.n, len(ps)*g.n, maxN)
	}
	return g, ps, e
}

// parsePrompt accepts a string, [int...] (one prompt), or a non-empty
// array of strings or of token-id arrays (a batch: one prompt each).
func parsePrompt(raw json.RawMessage) ([]promptInput, *apiError) {
	if isNull(raw) {
		return nil, badRequest("prompt", "'prompt' is required.")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []promptInput{{text: s}}, nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		p, e := checkIDs(ids)
		return []promptInput{p}, e
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) == 0 || len(ss) > maxN {
			return nil, badRequest("prompt", "'prompt' as a list must hold 1 to %d prompts, got %d.", maxN, len(ss))
		}
		out := make([]promptInput, len(ss))
		for i, t := range ss {
			out[i] = promptInput{text: t}
		}
		return out, nil
	}
	var idss [][]int
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) == 0 || len(idss) > maxN {
			return nil, badRequest("prompt", "'prompt' as a list must hold 1 to %d prompts, got %d.", maxN, len(idss))
		}
		out := make([]promptInput, len(idss))
		total := 0
		for i, ids := range idss {
			if total += len(ids); total > maxPromptIDs {
				return nil, badRequest("prompt", "'prompt' has too many tokens.")
			}
			p, e := checkIDs(ids)
			if e != nil {
				return nil, e
			}
			out[i] = p
		}
		return out, nil
	}
	return nil, badRequest("prompt", "'prompt' must be a string, an array of token ids, or an array of either.")
}

func checkIDs(ids []int) (promptInput, *apiError) {
	if len(ids) > maxPromptIDs {
		return promptInput{}, badRequest("prompt", "'prompt' has too many tokens.")
	}
	for _, id := range ids {
		if id < 0 {
			return promptInput{}, badRequest("prompt", "Token ids must not be negative.")
		}
	}
	return promptInput{ids: ids, hasIDs: true}, nil
}

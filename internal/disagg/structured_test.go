package disagg

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
)

const splitSchema = `{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"},"kind":{"enum":["x","y"]},"ok":{"type":"boolean"}},
"required":["name","n","kind","ok"],"additionalProperties":false}`

// closedSchema has no free string, so that a random model's output
// finishes within a few tokens.
const closedSchema = `{"type":"object","properties":{"kind":{"enum":["x","y",3]},"ok":{"type":"boolean"},"more":{"type":"array","items":{"type":["boolean","null"]}}},
"required":["kind","ok","more"],"additionalProperties":false}`

// TestDisaggregatedStructured: under an output constraint the split gives
// the same tokens, finish and usage as one node. The prefill node draws
// the first token under the constraint (it must be "{"), and the decode
// node's automaton replays it from the job's history: a decode node that
// started its automaton afresh would demand "{" again and differ.
func TestDisaggregatedStructured(t *testing.T) {
	single := startSingle(t)
	l := startLocal(t, LocalConfig{})
	ps := prompts(t, single)
	obj, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONObject})
	if err != nil {
		t.Fatal(err)
	}
	sch, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONSchema, Strict: true, Schema: []byte(splitSchema)})
	if err != nil {
		t.Fatal(err)
	}
	closed, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONSchema, Strict: true, Schema: []byte(closedSchema)})
	if err != nil {
		t.Fatal(err)
	}
	call, err := grammar.Compile(grammar.ToolCallSpec([]grammar.Tool{{Name: "get", Parameters: []byte(closedSchema), Strict: true}, {Name: "ping"}}))
	if err != nil {
		t.Fatal(err)
	}
	for i, cfg := range []request.Sampling{
		{Grammar: call, Temperature: 1, Seed: 3},
		{Grammar: closed},
		{Grammar: closed, Temperature: 1, Seed: 5},
		{Grammar: obj},
		{Grammar: sch},
		{Grammar: sch, Temperature: 1, Seed: 7},
		{Grammar: obj, Temperature: 1.2, Seed: 9, FrequencyPenalty: 1},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			p := params("acme", ps[i%len(ps)], 40)
			p.Sampling = cfg
			want := run(t, single, p)
			p.Owner.ID = request.NewID()
			got := run(t, l, p)
			if !want.res.Reason.Success() || got.res.Reason != want.res.Reason || fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) || got.res.Usage != want.res.Usage {
				t.Fatalf("split: %v %v %+v (%v)\nsingle: %v %v %+v", got.res.Reason, got.tokens, got.res.Usage, got.res.Err, want.res.Reason, want.tokens, want.res.Usage)
			}
			text, _ := single.Detokenize(got.tokens)
			if !strings.HasPrefix(text, "{") {
				t.Fatalf("output %q does not start an object", text)
			}
			st := cfg.Grammar.Start()
			if !cfg.Grammar.Feed(&st, []byte(text)) {
				t.Fatalf("output %q is not a prefix the constraint allows", text)
			}
			if got.res.Reason == request.FinishStop && !json.Valid([]byte(text)) {
				t.Fatalf("finished output %q is not JSON", text)
			}
			t.Logf("%v %q", got.res.Reason, text)
		})
	}
	checkBaseline(t, l)
}

// TestDisaggregatedStructuredHTTP: response_format through the gateway in
// front of the split, streamed and not: the output validates (or, cut by
// max_tokens, is an allowed prefix), and a schema the grammar refuses is
// a 400 before anything reaches a node.
func TestDisaggregatedStructuredHTTP(t *testing.T) {
	l := startLocal(t, LocalConfig{})
	api := apiClient(t, l)
	post := func(body map[string]any) (int, []byte) { return api("/v1/chat/completions", body) }
	g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONSchema, Strict: true, Schema: []byte(closedSchema)})
	if err != nil {
		t.Fatal(err)
	}
	format := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "s", "strict": true, "schema": json.RawMessage(closedSchema)}}
	finished := 0
	for _, seed := range []int{1, 2, 3, 4} {
		var texts [2]string
		for i, stream := range []bool{false, true} {
			code, out := post(map[string]any{"messages": []map[string]any{{"role": "user", "content": "JSON please"}}, "max_tokens": 60,
				"temperature": 1, "seed": seed, "stream": stream, "response_format": format})
			if code != 200 {
				t.Fatalf("status %d: %s", code, out)
			}
			var finish string
			if !stream {
				var c struct {
					Choices []struct {
						Message      struct{ Content string } `json:"message"`
						FinishReason string                   `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(out, &c); err != nil || len(c.Choices) != 1 {
					t.Fatalf("%s: %v", out, err)
				}
				texts[i], finish = c.Choices[0].Message.Content, c.Choices[0].FinishReason
			} else {
				for _, line := range strings.Split(string(out), "\n") {
					data, ok := strings.CutPrefix(line, "data: ")
					if !ok || data == "[DONE]" {
						continue
					}
					var c struct {
						Choices []struct {
							Delta        struct{ Content string } `json:"delta"`
							FinishReason *string                  `json:"finish_reason"`
						} `json:"choices"`
					}
					if err := json.Unmarshal([]byte(data), &c); err != nil {
						t.Fatalf("event %s: %v", data, err)
					}
					for _, ch := range c.Choices {
						texts[i] += ch.Delta.Content
						if ch.FinishReason != nil {
							finish = *ch.FinishReason
						}
					}
				}
			}
			st := g.Start()
			if !g.Feed(&st, []byte(texts[i])) {
				t.Fatalf("seed %d: output %q is not a prefix the schema allows", seed, texts[i])
			}
			if finish == "stop" {
				finished++
				var v map[string]any
				if err := json.Unmarshal([]byte(texts[i]), &v); err != nil || len(v) != 3 {
					t.Fatalf("seed %d: finished output %q: %v", seed, texts[i], err)
				}
			}
		}
		if texts[0] != texts[1] {
			t.Errorf("seed %d: streamed %q, not streamed %q", seed, texts[1], texts[0])
		}
	}
	if finished == 0 {
		t.Error("no output finished: nothing was checked whole")
	}
	bad := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "s", "schema": map[string]any{"type": "string", "format": "uuid"}}}
	if code, out := post(map[string]any{"messages": []map[string]any{{"role": "user", "content": "x"}}, "response_format": bad}); code != 400 || !strings.Contains(string(out), `"param":"response_format"`) {
		t.Errorf("unsupported keyword: %d %s", code, out)
	}
	checkBaseline(t, l)
}

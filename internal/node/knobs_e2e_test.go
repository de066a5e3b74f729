package node_test

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pagewarden/pagewarden/internal/engine"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/tokenizer"
)

// End-to-end effects of the sampling knobs that go beyond temperature and
// the filters: logit_bias, presence_penalty and frequency_penalty,
// ignore_eos and stop_token_ids, through the real gateway, scheduler,
// executor and sampler on builtin:tiny. Its vocabulary is byte-level
// (a byte token for each byte, a token for each printable ASCII
// character, the ChatML markers), so the text shows which tokens came out.

// reference generates with a private engine on builtin:tiny with cfg (it
// stops at an end-of-generation token, which it does not return): what a
// served request with the same knobs must produce.
func reference(t *testing.T, prompt []int, n int, cfg request.Sampling) []int {
	t.Helper()
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := engine.New(m, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var out []int
	_, _, err = e.Generate(context.Background(), request.Owner{Tenant: "reference", ID: request.NewID()}, prompt, n, cfg,
		func(tok int) error {
			out = append(out, tok)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// charToken is the id of the vocabulary's token for the printable ASCII
// character c (not its byte token).
func charToken(t *testing.T, tok *tokenizer.Tokenizer, c byte) int {
	t.Helper()
	for id := range tok.VocabSize() {
		if tok.TokenText(id) == string(c) {
			return id
		}
	}
	t.Fatalf("no token for %q", c)
	return -1
}

// tokensWith are the ids whose text holds c: banning them all keeps c out
// of the output.
func tokensWith(tok *tokenizer.Tokenizer, c byte) []int {
	var ids []int
	for id := range tok.VocabSize() {
		if bytes.IndexByte(tok.Piece(id), c) >= 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// biasOf is a logit_bias body: every id at bias.
func biasOf(bias float64, ids ...int) map[string]any {
	m := map[string]any{}
	for _, id := range ids {
		m[strconv.Itoa(id)] = bias
	}
	return m
}

// complete posts a completion of prompt ids with extra fields and
// returns its text, finish reason and completion tokens.
func (s *e2eServer) complete(prompt []int, maxTokens int, extra map[string]any) (string, string, int) {
	s.t.Helper()
	body := map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 0}
	for k, v := range extra {
		body[k] = v
	}
	var c completionBody
	s.postOK(e2eKeyA, "/v1/completions", body, &c)
	if len(c.Choices) != 1 || c.Choices[0].FinishReason == nil || c.Usage == nil {
		s.t.Fatalf("malformed response %+v", c)
	}
	return c.Choices[0].Text, *c.Choices[0].FinishReason, c.Usage.CompletionTokens
}

// TestE2ELogitBias: a bias of -100 bans a token that greedy decoding
// would produce, greedy or sampled, and the served output is the
// sampler's with that bias; a bias of +100 makes one token the only
// choice.
func TestE2ELogitBias(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tok := s.node.Model().Tokenizer
	prompt := tok.Encode("Once upon a time, there was a dog named Max.", true, true)
	const n = 24
	ref := greedy(t, "tiny", prompt, n)
	plain := tok.Decode(ref)
	if text, _, _ := s.complete(prompt, n, nil); text != plain {
		t.Fatalf("unbiased text %q, greedy reference %q", text, plain)
	}
	// Ban the character greedy decoding writes most (not a space).
	var c byte
	for i := range len(plain) {
		if plain[i] != ' ' && plain[i] < utf8.RuneSelf && strings.Count(plain, plain[i:i+1]) > strings.Count(plain, string(c)) {
			c = plain[i]
		}
	}
	if c == 0 {
		t.Fatalf("no ASCII character in the greedy output %q", plain)
	}
	banned := tokensWith(tok, c)
	t.Logf("greedy output %q; banning %q (tokens %v)", plain, c, banned)
	bias := biasOf(-100, banned...)
	text, _, _ := s.complete(prompt, n, map[string]any{"logit_bias": bias})
	if strings.IndexByte(text, c) >= 0 || text == plain {
		t.Errorf("with %q banned: %q (unbiased %q)", c, text, plain)
	}
	cfg := request.Sampling{}
	for _, id := range banned {
		cfg.LogitBias = append(cfg.LogitBias, request.TokenBias{Token: id, Bias: -request.MaxBias})
	}
	if want := tok.Decode(reference(t, prompt, n, cfg)); text != want {
		t.Errorf("served %q, the sampler's reference %q", text, want)
	}
	for seed := range 4 {
		text, _, _ := s.complete(prompt, n, map[string]any{"logit_bias": bias, "temperature": 1.5, "seed": seed})
		if strings.IndexByte(text, c) >= 0 {
			t.Errorf("seed %d, temperature 1.5: %q holds banned %q", seed, text, c)
		}
	}

	// +100 leaves one choice; with that token banned too, the next one.
	q, r := charToken(t, tok, 'Q'), charToken(t, tok, 'R')
	for _, tc := range []struct {
		name  string
		extra map[string]any
		want  string
	}{
		{"greedy", map[string]any{"logit_bias": biasOf(100, q)}, "QQQQQQQQ"},
		{"sampled", map[string]any{"logit_bias": biasOf(100, q), "temperature": 1, "seed": 5}, "QQQQQQQQ"},
		{"banned", map[string]any{"logit_bias": map[string]any{strconv.Itoa(q): -100, strconv.Itoa(r): 100}}, "RRRRRRRR"},
	} {
		if text, finish, _ := s.complete(prompt, 8, tc.extra); text != tc.want || finish != "length" {
			t.Errorf("%s: %q %s, want %q length", tc.name, text, finish, tc.want)
		}
	}
	s.waitAllFree()
}

// TestE2EPresenceFrequencyPenalty: the penalties reach the sampler with
// OpenAI's formula over generated tokens only.
func TestE2EPresenceFrequencyPenalty(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tok := s.node.Model().Tokenizer
	q, r := charToken(t, tok, 'Q'), charToken(t, tok, 'R')
	prompt := tok.Encode("The sun", true, true)
	// Q is favoured by 10 over R, far above the model's own logits:
	// without a penalty Q wins every step; with frequency_penalty 2, Q's
	// logit drops by 2 each time it is generated, and R wins after about
	// five.
	bias := map[string]any{strconv.Itoa(q): 100, strconv.Itoa(r): 90}
	if text, _, _ := s.complete(prompt, 16, map[string]any{"logit_bias": bias}); text != strings.Repeat("Q", 16) {
		t.Errorf("without a penalty: %q", text)
	}
	text, _, _ := s.complete(prompt, 16, map[string]any{"logit_bias": bias, "frequency_penalty": 2})
	if k := strings.IndexByte(text, 'R'); k < 3 || k > 8 || strings.Trim(text, "QR") != "" {
		t.Errorf("frequency_penalty 2: %q; want Q until its penalty passes R's bias gap", text)
	}

	// On the model's own logits: the served text is the sampler's, and
	// differs from the unpenalised one.
	const n = 48
	plain, _, _ := s.complete(prompt, n, nil)
	for _, tc := range []struct {
		name                string
		presence, frequency float64
	}{
		{"presence", 2, 0}, {"frequency", 0, 1.5}, {"both", 1, 1}, {"negative", -2, -2},
	} {
		text, _, _ := s.complete(prompt, n, map[string]any{"presence_penalty": tc.presence, "frequency_penalty": tc.frequency})
		cfg := request.Sampling{PresencePenalty: float32(tc.presence), FrequencyPenalty: float32(tc.frequency)}
		if want := tok.Decode(reference(t, prompt, n, cfg)); text != want || text == plain {
			t.Errorf("%s: served %q, the sampler's reference %q, unpenalised %q", tc.name, text, want, plain)
		}
	}

	// The prompt does not count: with every token in the prompt, the
	// first generated token is the unpenalised one.
	all := []int{tok.BOS()}
	for id := range tok.VocabSize() {
		if !tok.IsControl(id) {
			all = append(all, id)
		}
	}
	first := greedy(t, "tiny", all, 1)
	if text, _, _ := s.complete(all, 1, map[string]any{"presence_penalty": 2, "frequency_penalty": 2}); text != tok.Decode(first) {
		t.Errorf("first token %q with the penalties, %q without: the prompt was counted", text, tok.Decode(first))
	}
	s.waitAllFree()
}

// TestE2EIgnoreEOS: a request made to draw the end-of-sequence token ends
// on it, unless ignore_eos: then it runs to max_tokens, the end tokens
// counted and not shown, streamed or not; a stop_token_ids entry still
// ends it.
func TestE2EIgnoreEOS(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tok := s.node.Model().Tokenizer
	prompt := tok.Encode("Lily wanted to bake a cake", true, true)
	var eog []int
	for id := range tok.VocabSize() {
		if tok.IsEOG(id) {
			eog = append(eog, id)
		}
	}
	if len(eog) < 2 {
		t.Fatalf("end-of-generation tokens %v: want EOS and <|im_end|>", eog)
	}
	for _, id := range eog {
		name := tok.TokenText(id)
		bias := biasOf(100, id)
		if text, finish, used := s.complete(prompt, 6, map[string]any{"logit_bias": bias}); text != "" || finish != "stop" || used != 1 {
			t.Errorf("%s favoured: %q %s after %d tokens; want it to end the request", name, text, finish, used)
		}
		if text, finish, used := s.complete(prompt, 6, map[string]any{"logit_bias": bias, "ignore_eos": true}); text != "" || finish != "length" || used != 6 {
			t.Errorf("%s favoured, ignore_eos: %q %s after %d tokens; want 6 hidden tokens, length", name, text, finish, used)
		}
		if text, finish, used := s.complete(prompt, 6, map[string]any{"logit_bias": bias, "ignore_eos": true, "stop_token_ids": []int{id}}); text != "" || finish != "stop" || used != 1 {
			t.Errorf("%s favoured, ignore_eos, and a stop token: %q %s after %d tokens", name, text, finish, used)
		}
	}
	st := s.stream(e2eKeyA, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 5, "temperature": 0,
		"logit_bias": biasOf(100, eog[0]), "ignore_eos": true, "stream_options": map[string]any{"include_usage": true}})
	if text, finish, u, _ := completionStream(t, st); !st.done || text != "" || finish != "length" || u == nil || u.CompletionTokens != 5 {
		t.Errorf("stream: done %v text %q finish %q usage %+v", st.done, text, finish, u)
	}
	// Without a bias: the same text as a request that stops at nothing
	// earlier, to max_tokens.
	text, finish, used := s.complete(prompt, 40, map[string]any{"ignore_eos": true})
	if ref := greedy(t, "tiny", prompt, 40); len(ref) == 40 && (text != tok.Decode(ref) || finish != "length" || used != 40) {
		t.Errorf("ignore_eos on a request with no end token: %q %s %d, greedy %q", text, finish, used, tok.Decode(ref))
	}
	s.waitAllFree()
}

// TestE2EStopTokenIDs: generation ends at the first stop token id it
// draws, finish "stop", the token counted and its text not shown (as
// vLLM does), streamed or not.
func TestE2EStopTokenIDs(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tok := s.node.Model().Tokenizer
	prompt := tok.Encode("One day, Tom went to the park with his big red ball.", true, true)
	const n = 32
	ref := greedy(t, "tiny", prompt, n)
	tried := 0
	for k := 2; k < len(ref) && tried < 3; k++ {
		x := ref[k]
		if slices.Index(ref, x) != k || !allWholeRunes(s.node, ref[:k+1]) {
			continue
		}
		tried++
		want := tok.Decode(ref[:k])
		text, finish, used := s.complete(prompt, n, map[string]any{"stop_token_ids": []int{x, tok.EOS()}})
		if text != want || finish != "stop" || used != k+1 {
			t.Errorf("stop at %d (token %d, %q): %q %s after %d tokens; want %q stop after %d", k, x, tok.Piece(x), text, finish, used, want, k+1)
		}
		st := s.stream(e2eKeyA, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": n, "temperature": 0,
			"stop_token_ids": []int{x}, "stream_options": map[string]any{"include_usage": true}})
		if text, finish, u, _ := completionStream(t, st); !st.done || text != want || finish != "stop" || u == nil || u.CompletionTokens != k+1 {
			t.Errorf("stream, stop at %d: done %v %q %s usage %+v", k, st.done, text, finish, u)
		}
	}
	if tried == 0 {
		t.Fatalf("no token of the greedy output %v can serve as a stop token", ref)
	}
	// An id outside the vocabulary is the client's mistake.
	if code, _, body := s.post(e2eKeyA, "/v1/completions", map[string]any{"prompt": prompt, "stop_token_ids": []int{tok.VocabSize()}}); code != 400 ||
		!strings.Contains(string(body), "stop_token_ids") {
		t.Errorf("out-of-vocabulary stop id: %d %s", code, body)
	}
	s.waitAllFree()
}

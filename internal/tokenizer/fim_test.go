package tokenizer

import "testing"

// TestFIM: the file's FIM ids win when all three are in the vocabulary;
// otherwise a family of well-known spellings found whole; otherwise none.
func TestFIM(t *testing.T) {
	ptr := func(i int) *int { return &i }
	base := []string{"<unk>", "<s>", "</s>", "a", "b"}
	tests := []struct {
		name   string
		extra  []string
		pre    *int
		suf    *int
		mid    *int
		want   FIM
		wantOK bool
	}{
		{"none", nil, nil, nil, nil, FIM{}, false},
		{"ids from the file", []string{"x", "y", "z"}, ptr(5), ptr(6), ptr(7), FIM{5, 6, 7}, true},
		{"an id outside the vocabulary: spellings instead", []string{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}, ptr(5), ptr(6), ptr(99), FIM{5, 6, 7}, true},
		{"Qwen spellings", []string{"<|fim_middle|>", "<|fim_prefix|>", "<|fim_suffix|>"}, nil, nil, nil, FIM{6, 7, 5}, true},
		{"StarCoder spellings", []string{"<fim_prefix>", "<fim_middle>", "<fim_suffix>"}, nil, nil, nil, FIM{5, 7, 6}, true},
		{"CodeLlama spellings", []string{"▁<PRE>", "▁<SUF>", "▁<MID>"}, nil, nil, nil, FIM{5, 6, 7}, true},
		{"an incomplete family is none", []string{"<|fim_prefix|>", "<|fim_suffix|>"}, nil, nil, nil, FIM{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := New(Vocab{Model: "llama", Tokens: append(append([]string(nil), base...), tc.extra...), FIMPre: tc.pre, FIMSuf: tc.suf, FIMMid: tc.mid})
			if err != nil {
				t.Fatal(err)
			}
			got, ok := tok.FIM()
			if ok != tc.wantOK || (ok && got != tc.want) {
				t.Fatalf("FIM() = %+v, %v; want %+v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestFIMFromGGUF: the FIM ids are read from the file under llama.cpp's
// current keys and its older ones.
func TestFIMFromGGUF(t *testing.T) {
	toks := []string{"<unk>", "<s>", "</s>", "a", "x", "y", "z"}
	for _, keys := range [][3]string{
		{"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id"},
		{"tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id", "tokenizer.ggml.middle_token_id"},
	} {
		tok, err := FromGGUF(ggufWith(t, "tokenizer.ggml.model", "llama", "tokenizer.ggml.tokens", toks,
			keys[0], uint32(4), keys[1], uint32(5), keys[2], uint32(6)))
		if err != nil {
			t.Fatal(err)
		}
		if f, ok := tok.FIM(); !ok || f != (FIM{4, 5, 6}) {
			t.Errorf("%s...: FIM() = %+v, %v", keys[0], f, ok)
		}
	}
}

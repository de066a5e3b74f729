package tokenizer

import (
	"cmp"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/gguf"
)

// FromGGUF builds the tokenizer stored in a GGUF file's tokenizer.ggml.*
// metadata. A key that is present with the wrong type is an error; an
// absent optional key takes llama.cpp's default.
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	v, err := VocabFromGGUF(f)
	if err != nil {
		return nil, err
	}
	return New(v)
}

// VocabFromGGUF reads the vocabulary data of a GGUF file without building a
// tokenizer.
func VocabFromGGUF(f *gguf.File) (Vocab, error) {
	var v Vocab
	var err error
	str := func(key string, dst *string, required bool) {
		if err != nil {
			return
		}
		if _, ok := f.Lookup(key); !ok {
			if required {
				err = fmt.Errorf("%w: GGUF has no %s", ErrInvalid, key)
			}
			return
		}
		s, ok := f.String(key)
		if !ok {
			err = fmt.Errorf("%w: GGUF %s is not a string", ErrInvalid, key)
			return
		}
		*dst = s
	}
	id := func(key string) *int {
		if err != nil {
			return nil
		}
		if _, ok := f.Lookup(key); !ok {
			return nil
		}
		u, ok := f.Uint(key)
		if !ok {
			err = fmt.Errorf("%w: GGUF %s is not a non-negative integer", ErrInvalid, key)
			return nil
		}
		if u > MaxVocab {
			return nil // outside any vocabulary: ignored, as llama.cpp does
		}
		n := int(u)
		return &n
	}
	flag := func(key string) *bool {
		if err != nil {
			return nil
		}
		if _, ok := f.Lookup(key); !ok {
			return nil
		}
		b, ok := f.Bool(key)
		if !ok {
			err = fmt.Errorf("%w: GGUF %s is not a bool", ErrInvalid, key)
			return nil
		}
		return &b
	}

	str("tokenizer.ggml.model", &v.Model, true)
	str("tokenizer.ggml.pre", &v.Pre, false)
	str("general.name", &v.Name, false)
	if err != nil {
		return v, err
	}
	var ok bool
	if v.Tokens, ok = f.Strings("tokenizer.ggml.tokens"); !ok {
		if _, present := f.Lookup("tokenizer.ggml.tokens"); present {
			return v, fmt.Errorf("%w: GGUF tokenizer.ggml.tokens is not a string array", ErrInvalid)
		}
		return v, fmt.Errorf("%w: GGUF has no tokenizer.ggml.tokens", ErrInvalid)
	}
	if _, present := f.Lookup("tokenizer.ggml.scores"); present {
		if v.Scores, ok = f.Float32s("tokenizer.ggml.scores"); !ok {
			ints, ok := f.Int32s("tokenizer.ggml.scores")
			if !ok {
				return v, fmt.Errorf("%w: GGUF tokenizer.ggml.scores is not a float32 or int32 array", ErrInvalid)
			}
			v.Scores = make([]float32, len(ints))
			for i, x := range ints {
				v.Scores[i] = float32(x)
			}
		}
	}
	if _, present := f.Lookup("tokenizer.ggml.token_type"); present {
		if v.Types, ok = f.Int32s("tokenizer.ggml.token_type"); !ok {
			return v, fmt.Errorf("%w: GGUF tokenizer.ggml.token_type is not an int32 array", ErrInvalid)
		}
	}
	if _, present := f.Lookup("tokenizer.ggml.merges"); present {
		if v.Merges, ok = f.Strings("tokenizer.ggml.merges"); !ok {
			return v, fmt.Errorf("%w: GGUF tokenizer.ggml.merges is not a string array", ErrInvalid)
		}
	} else if v.Model == "gpt2" {
		return v, fmt.Errorf("%w: BPE vocabulary without tokenizer.ggml.merges", ErrInvalid)
	}
	v.BOS = id("tokenizer.ggml.bos_token_id")
	v.EOS = id("tokenizer.ggml.eos_token_id")
	v.UNK = id("tokenizer.ggml.unknown_token_id")
	v.PAD = id("tokenizer.ggml.padding_token_id")
	v.EOT = id("tokenizer.ggml.eot_token_id")
	v.EOM = id("tokenizer.ggml.eom_token_id")
	// The FIM keys, under today's names or llama.cpp's older ones.
	v.FIMPre = cmp.Or(id("tokenizer.ggml.fim_pre_token_id"), id("tokenizer.ggml.prefix_token_id"))
	v.FIMSuf = cmp.Or(id("tokenizer.ggml.fim_suf_token_id"), id("tokenizer.ggml.suffix_token_id"))
	v.FIMMid = cmp.Or(id("tokenizer.ggml.fim_mid_token_id"), id("tokenizer.ggml.middle_token_id"))
	v.AddBOS = flag("tokenizer.ggml.add_bos_token")
	v.AddEOS = flag("tokenizer.ggml.add_eos_token")
	v.AddSpacePrefix = flag("tokenizer.ggml.add_space_prefix")
	return v, err
}

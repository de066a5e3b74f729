package tokenizer

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// vocabCache keeps each parsed vocabulary for the whole test binary: the
// large ones take a noticeable fraction of a second to build.
var vocabCache sync.Map // name → *Tokenizer

// loadVocab builds the tokenizer of shared/testdata/vocab/ggml-vocab-NAME.gguf.
func loadVocab(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	if t, ok := vocabCache.Load(name); ok {
		return t.(*Tokenizer)
	}
	f, err := gguf.Open(testdata.Path(tb, "vocab", "ggml-vocab-"+name+".gguf"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	t, err := FromGGUF(f)
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	vocabCache.Store(name, t)
	return t
}

type vector struct {
	input string
	want  []int
}

// readVectors reads the .inp/.out pair of a vocabulary (format: see
// shared/testdata/vocab/README.md).
func readVectors(tb testing.TB, name string) []vector {
	tb.Helper()
	base := testdata.Path(tb, "vocab", "ggml-vocab-"+name+".gguf")
	inp, err := os.ReadFile(base + ".inp")
	if err != nil {
		tb.Fatal(err)
	}
	outp, err := os.ReadFile(base + ".out")
	if err != nil {
		tb.Fatal(err)
	}
	inputs := strings.Split(string(inp), "\n__ggml_vocab_test__\n")
	if inputs[len(inputs)-1] != "" {
		tb.Fatalf("%s.inp does not end with a separator", name)
	}
	inputs = inputs[:len(inputs)-1]
	lines := strings.Split(strings.TrimSuffix(string(outp), "\n"), "\n")
	if len(lines) != len(inputs) {
		tb.Fatalf("%s: %d inputs but %d output lines", name, len(inputs), len(lines))
	}
	vs := make([]vector, len(inputs))
	for i, in := range inputs {
		want := []int{}
		for _, f := range strings.Fields(lines[i]) {
			id, err := strconv.Atoi(f)
			if err != nil {
				tb.Fatalf("%s.out line %d: %v", name, i+1, err)
			}
			want = append(want, id)
		}
		vs[i] = vector{in, want}
	}
	return vs
}

// vectorVocabs are the vocabularies with llama.cpp test vectors whose type
// this package implements.
var vectorVocabs = []string{
	"llama-spm", "phi-3", // SPM
	"gpt-2", "deepseek-coder", "deepseek-llm", "falcon", "mpt", "refact", "starcoder", // BPE
}

// TestVectors checks every case of llama.cpp's tokenizer test vectors:
// add_special and parse_special off, ids equal exactly.
func TestVectors(t *testing.T) {
	for _, name := range vectorVocabs {
		t.Run(name, func(t *testing.T) {
			tok := loadVocab(t, name)
			for i, v := range readVectors(t, name) {
				got := tok.Encode(v.input, false, false)
				if got == nil {
					got = []int{}
				}
				if diff := cmp.Diff(v.want, got); diff != "" {
					t.Errorf("case %d %q (-want +got):\n%s", i, v.input, diff)
				}
			}
		})
	}
}

// TestVectorsDecode checks that decoding the expected ids gives the input
// back, up to the SPM prefix space (vectors are valid UTF-8 and contain no
// special-token text).
func TestVectorsDecode(t *testing.T) {
	for _, name := range vectorVocabs {
		t.Run(name, func(t *testing.T) {
			tok := loadVocab(t, name)
			for i, v := range readVectors(t, name) {
				want := v.input
				if tok.Model() == "llama" && want != "" {
					want = " " + want
				}
				if got := tok.Decode(v.want); got != want {
					t.Errorf("case %d: Decode = %q, want %q", i, got, want)
				}
			}
		})
	}
}

// TestUnsupportedVocab checks that the WordPiece vocabulary is refused with
// an error that says so.
func TestUnsupportedVocab(t *testing.T) {
	f, err := gguf.Open(testdata.Path(t, "vocab", "ggml-vocab-bert-bge.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = FromGGUF(f)
	if err == nil || !strings.Contains(err.Error(), "WordPiece") {
		t.Fatalf("FromGGUF(bert) = %v, want an error naming WordPiece", err)
	}
}

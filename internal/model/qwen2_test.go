package model

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/request"
)

// toQwen2 rewrites a llama GGUF image as qwen2: keys renamed, the rows of
// each head of attn_q/attn_k permuted from adjacent-pair order to NeoX
// half-split order, and zero attention biases added. RoPE in either order
// gives the same attention scores, so the two models must agree exactly up
// to float rounding; any mistake in the qwen2 path (rope pairing, bias
// loading, key names) breaks that.
func toQwen2(t *testing.T, src *gguf.File, headDim int, bias float32) *gguf.Writer {
	t.Helper()
	w := gguf.NewWriter()
	for _, kv := range src.KV {
		key := kv.Key
		val := kv.Value
		if key == "general.architecture" {
			if err := w.SetKV(key, "qwen2"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if rest, ok := strings.CutPrefix(key, "llama."); ok {
			key = "qwen2." + rest
		}
		if err := w.SetKV(key, val); err != nil {
			t.Fatal(err)
		}
	}
	for i := range src.Tensors {
		ti := &src.Tensors[i]
		data := ti.Data
		if strings.HasSuffix(ti.Name, "attn_q.weight") || strings.HasSuffix(ti.Name, "attn_k.weight") {
			if ti.Type != quant.F32 {
				t.Fatalf("%s: want F32", ti.Name)
			}
			cols, rows := int(ti.Dims[0]), int(ti.Dims[1])
			rowBytes := cols * 4
			out := make([]byte, len(data))
			half := headDim / 2
			for h := 0; h < rows/headDim; h++ {
				for i := 0; i < half; i++ {
					for j, from := range []int{2 * i, 2*i + 1} {
						to := h*headDim + i + j*half
						copy(out[to*rowBytes:(to+1)*rowBytes], data[(h*headDim+from)*rowBytes:(h*headDim+from+1)*rowBytes])
					}
				}
			}
			data = out
		}
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, data); err != nil {
			t.Fatal(err)
		}
		if rest, ok := strings.CutSuffix(ti.Name, "attn_q.weight"); ok {
			for _, b := range []string{"attn_q.bias", "attn_k.bias", "attn_v.bias"} {
				n := ti.Dims[1]
				if b != "attn_q.bias" {
					k, _ := src.Tensor(rest + "attn_k.weight")
					n = k.Dims[1]
				}
				vals := make([]float32, n)
				for i := range vals {
					vals[i] = bias
				}
				raw, _ := quant.Quantize(quant.F32, vals)
				if err := w.AddTensor(rest+b, quant.F32, []uint64{n}, raw); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return w
}

func logitsOf(t *testing.T, m *Model, tokens []int) []float32 {
	t.Helper()
	c := m.Config
	pool, err := kvcache.NewPool(kvcache.Config{Layout: kvcache.Layout{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: 16}, Pages: 8})
	if err != nil {
		t.Fatal(err)
	}
	seq := pool.NewSequence(request.Owner{Tenant: "t", ID: request.NewID()})
	if err := pool.Reserve(seq, len(tokens)); err != nil {
		t.Fatal(err)
	}
	v, err := pool.Begin(seq, len(tokens))
	if err != nil {
		t.Fatal(err)
	}
	kp := kernels.NewPool(1)
	defer kp.Close()
	out, err := m.Forward(kp, []Input{{Tokens: tokens, View: v, Logits: LogitsLast}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func TestQwen2MatchesPermutedLlama(t *testing.T) {
	w, err := BuiltinGGUF(Builtins["tiny"])
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	src, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	llama, err := FromGGUF(src)
	if err != nil {
		t.Fatal(err)
	}
	tokens := llama.Tokenizer.Encode("The qwen2 path rotates halves, not pairs.", true, false)
	want := logitsOf(t, llama, tokens)

	for _, tc := range []struct {
		bias  float32
		equal bool
	}{{0, true}, {0.5, false}} {
		qw, err := fromWriter(toQwen2(t, src, llama.Config.HeadDim, tc.bias), true)
		if err != nil {
			t.Fatal(err)
		}
		if qw.Config.RopeStyle != RopeNeox || qw.W.Layers[0].QBias == nil {
			t.Fatalf("qwen2 file loaded as style %d with bias %v", qw.Config.RopeStyle, qw.W.Layers[0].QBias != nil)
		}
		got := logitsOf(t, qw, tokens)
		worst := 0.0
		for i := range want {
			worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
		}
		if tc.equal && worst > 1e-4 {
			t.Errorf("zero-bias qwen2 differs from the permuted llama by %g", worst)
		}
		if !tc.equal && worst < 1e-3 {
			t.Errorf("a bias of %g changed the logits by only %g: biases are not applied", tc.bias, worst)
		}
	}
}

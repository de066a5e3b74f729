package cli

import (
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/model"
)

// TestRunNamesWhatIsMissing: run, serve and capacity refuse a file they
// cannot compute correctly with a message that names what is missing (an
// architecture and what it would need, an expert count, a RoPE scaling
// type, a malformed window) rather than running with a feature dropped or
// failing on a tensor name; and run takes a llama file with a sliding
// window (how a Mistral GGUF would carry one), which capacity reports.
func TestRunNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	w, err := model.BuiltinGGUF(model.Builtins["tiny-short"])
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(mustRead(t, writeGGUF(t, dir, "base.gguf", w)))
	if err != nil {
		t.Fatal(err)
	}
	// edited is the base file with kv set (replaced or added).
	edited := func(name string, kv map[string]any) string {
		t.Helper()
		e := gguf.NewWriter()
		for _, x := range f.KV {
			v := x.Value.Any()
			if nv, ok := kv[x.Key]; ok {
				v = nv
				delete(kv, x.Key)
			}
			if err := e.SetKV(x.Key, v); err != nil {
				t.Fatal(err)
			}
		}
		for k, v := range kv {
			if err := e.SetKV(k, v); err != nil {
				t.Fatal(err)
			}
		}
		for _, ti := range f.Tensors {
			if err := e.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
				t.Fatal(err)
			}
		}
		return writeGGUF(t, dir, name, e)
	}
	cases := []struct {
		name string
		kv   map[string]any
		msg  []string
	}{
		{"gemma3", map[string]any{"general.architecture": "gemma3"}, []string{"unsupported architecture", `"gemma3"`, "query/key norms"}},
		{"mistral3", map[string]any{"general.architecture": "mistral3"}, []string{"unsupported architecture", `"mistral3"`, "YaRN"}},
		{"unknown architecture", map[string]any{"general.architecture": "rwkv6"}, []string{`"rwkv6"`, "supported: llama, qwen2"}},
		{"mixture of experts", map[string]any{"llama.expert_count": uint32(8)}, []string{"llama.expert_count = 8", "mixture-of-experts"}},
		{"rope scaling yarn", map[string]any{"llama.rope.scaling.type": "yarn"}, []string{`rope scaling "yarn" is not supported`, "linear, llama3"}},
		{"window of the wrong type", map[string]any{"llama.attention.sliding_window": "4096"}, []string{"llama.attention.sliding_window", "not a non-negative integer"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := edited(strings.ReplaceAll(tc.name, " ", "_")+".gguf", tc.kv)
			for _, args := range [][]string{
				{"run", "--model", path, "-t", "1", "-n", "1"},
				{"serve", "--model", path, "--listen", "127.0.0.1:0"},
				{"capacity", "--model", path},
			} {
				r := pw(t, args...)
				if r.code != 1 {
					t.Errorf("%s: exit %d, want 1 (stderr %q)", args[0], r.code, r.stderr)
				}
				for _, s := range tc.msg {
					if !strings.Contains(r.stderr, s) {
						t.Errorf("%s: stderr %q does not mention %q", args[0], r.stderr, s)
					}
				}
			}
		})
	}

	path := edited("window.gguf", map[string]any{"llama.attention.sliding_window": uint32(8)})
	r := pw(t, "run", "--model", path, "-t", "1", "--temperature", "0", "-n", "20", "--prompt", "Hello, window")
	if r.code != 0 || summary.FindStringSubmatch(r.stderr) == nil {
		t.Fatalf("run of a llama file with a window: exit %d, stderr %q", r.code, r.stderr)
	}
	r = pw(t, "capacity", "--model", path)
	if r.code != 0 || !strings.Contains(r.stdout, "attention window 8 positions on every layer") {
		t.Fatalf("capacity of a llama file with a window: exit %d, stdout %q", r.code, r.stdout)
	}
}

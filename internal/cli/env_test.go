package cli

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kernels"
)

// env is a fake environment for MainEnv.
type env map[string]string

func (e env) lookup(name string) (string, bool) { v, ok := e[name]; return v, ok }

func pwEnv(t *testing.T, e env, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := MainEnv(context.Background(), args, &out, &errb, e.lookup)
	return result{code, out.String(), errb.String()}
}

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{"kv-memory": "PAGEWARDEN_KV_MEMORY", "api-key": "PAGEWARDEN_API_KEY", "n": "PAGEWARDEN_N", "max-queued-per-tenant": "PAGEWARDEN_MAX_QUEUED_PER_TENANT"} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}

// TestEnvSetsFlags: PAGEWARDEN_<FLAG> sets any flag the command line does
// not give; the command line wins; a value that does not parse, or that
// the command refuses, is a usage error naming the variable.
func TestEnvSetsFlags(t *testing.T) {
	kvMemory := regexp.MustCompile(`kv memory +(\d+) bytes`)
	for _, tc := range []struct {
		name   string
		env    env
		args   []string
		code   int
		want   string // in stdout (the KV memory in bytes) or, failing, stderr
		reject string // not in stderr
	}{
		{"from env", env{"PAGEWARDEN_KV_MEMORY": "64MiB", "PAGEWARDEN_MODEL": "builtin:tiny"}, nil, 0, "67108864", ""},
		{"flag wins", env{"PAGEWARDEN_KV_MEMORY": "64MiB"}, []string{"--model", "builtin:tiny", "--kv-memory", "32MiB"}, 0, "33554432", ""},
		{"unparsable int", env{"PAGEWARDEN_MAX_RUNNING": "lots"}, []string{"--model", "builtin:tiny"}, 2, "PAGEWARDEN_MAX_RUNNING", ""},
		{"unparsable bool", env{"PAGEWARDEN_PREFIX_CACHE": "maybe"}, []string{"--model", "builtin:tiny"}, 2, "PAGEWARDEN_PREFIX_CACHE", ""},
		{"refused value", env{"PAGEWARDEN_KV_MEMORY": "lots"}, []string{"--model", "builtin:tiny"}, 2, "--kv-memory is set by PAGEWARDEN_KV_MEMORY", ""},
		{"refused flag value not blamed on env", env{"PAGEWARDEN_MAX_QUEUED": "8"}, []string{"--model", "builtin:tiny", "--kv-memory", "lots"}, 2, "--kv-memory", "PAGEWARDEN"},
		{"unrelated variable", env{"PAGEWARDEN_NO_SUCH_FLAG": "x", "OTHER": "y"}, []string{"--model", "builtin:tiny", "--kv-memory", "64MiB"}, 0, "67108864", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := pwEnv(t, tc.env, append([]string{"capacity"}, tc.args...)...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", r.code, tc.code, r.stderr)
			}
			got := r.stderr
			if tc.code == 0 {
				m := kvMemory.FindStringSubmatch(r.stdout)
				if m == nil {
					t.Fatalf("no kv memory line:\n%s", r.stdout)
				}
				got = m[1]
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if tc.reject != "" && strings.Contains(r.stderr, tc.reject) {
				t.Errorf("stderr %q mentions %q", r.stderr, tc.reject)
			}
		})
	}
}

// TestEnvOnEveryCommand: the variables reach every command's flags, the
// roles' included (a log level that does not parse stops each of them).
func TestEnvOnEveryCommand(t *testing.T) {
	for _, cmd := range []string{"serve", "gateway", "prefill", "decode"} {
		r := pwEnv(t, env{"PAGEWARDEN_LOG_LEVEL": "loud"}, cmd, "--model", "builtin:tiny")
		if r.code != 2 || !strings.Contains(r.stderr, "PAGEWARDEN_LOG_LEVEL") {
			t.Errorf("%s: exit %d, stderr %q; want 2 naming PAGEWARDEN_LOG_LEVEL", cmd, r.code, r.stderr)
		}
	}
	// Main reads no environment at all.
	if r := pw(t, "capacity", "--model", "builtin:tiny", "--kv-memory", "64MiB"); r.code != 0 {
		t.Errorf("capacity: exit %d: %s", r.code, r.stderr)
	}
}

func TestNamesFlag(t *testing.T) {
	for _, tc := range []struct {
		msg, flag string
		want      bool
	}{
		{"--max-queued must be", "max-queued", true},
		{"--max-queued-per-tenant must be", "max-queued", false},
		{"--max-queued-per-tenant and --max-queued", "max-queued", true},
		{`--kv-memory "x": bad`, "kv-memory", true},
		{"at the end --n", "n", true},
	} {
		if got := namesFlag(tc.msg, tc.flag); got != tc.want {
			t.Errorf("namesFlag(%q, %q) = %v", tc.msg, tc.flag, got)
		}
	}
}

// TestEnvKernels: PAGEWARDEN_KERNELS forces the kernel tier that version
// (and bench and serve) report, and a tier that is unknown or that the CPU
// cannot run is refused before any command runs, naming the variable.
func TestEnvKernels(t *testing.T) {
	defer kernels.SetTier("auto")
	r := pwEnv(t, env{"PAGEWARDEN_KERNELS": "ref"}, "version")
	if r.code != 0 || !regexp.MustCompile(`(?m)^kernels +ref( \(purego build\))?$`).MatchString(r.stdout) {
		t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	bad := []string{"sse9"}
	for _, tier := range []string{"avxvnni", "avx512vnni"} {
		if !slices.Contains(kernels.Tiers(), tier) {
			bad = append(bad, tier) // beyond this CPU: refused too
		}
	}
	for _, v := range bad {
		r := pwEnv(t, env{"PAGEWARDEN_KERNELS": v}, "version")
		if r.code != 2 || !strings.Contains(r.stderr, "PAGEWARDEN_KERNELS") || !strings.Contains(r.stderr, v) {
			t.Errorf("PAGEWARDEN_KERNELS=%s: exit %d, stderr %q; want 2 and an error naming the variable and the tier", v, r.code, r.stderr)
		}
	}
}

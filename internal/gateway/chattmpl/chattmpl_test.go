package chattmpl

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var conversations = map[string][]Message{
	"sys":    {{Role: "system", Content: "Be brief."}, {Role: "user", Content: " Hi "}, {Role: "assistant", Content: "Hello"}, {Role: "user", Content: "Bye"}},
	"nosys":  {{Role: "user", Content: "Hi"}, {Role: "assistant", Content: " Yo "}},
	"repeat": {{Role: "user", Content: "Hi"}, {Role: "user", Content: "again"}},
}

// TestGoldenTemplates renders the Llama 2, Llama 3, ChatML (Qwen 2) and
// Zephyr templates and compares with outputs recorded from an independent
// Jinja implementation (testdata/golden.txt).
func TestGoldenTemplates(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "golden.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		parts := strings.SplitN(line, "|", 4)
		if len(parts) != 4 {
			t.Fatalf("bad golden line %q", line)
		}
		want, err := strconv.Unquote(parts[3])
		if err != nil {
			t.Fatalf("golden %q: %v", line, err)
		}
		n++
		t.Run(strings.Join(parts[:3], "/"), func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("testdata", parts[0]))
			if err != nil {
				t.Fatal(err)
			}
			tm, err := Parse(string(src))
			if err != nil {
				t.Fatal(err)
			}
			got, err := tm.RenderChat(Input{Messages: conversations[parts[1]], BOSToken: "<s>", EOSToken: "</s>", AddGenerationPrompt: parts[2] == "true"})
			if want == "ERROR" {
				var re *RaisedError
				if !errors.As(err, &re) || !errors.Is(err, ErrRaised) || !strings.Contains(re.Msg, "must alternate") {
					t.Fatalf("err = %v, want raise_exception", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("render (-want +got):\n%s", diff)
			}
		})
	}
	if n != 24 {
		t.Fatalf("golden cases = %d, want 24", n)
	}
}

func TestExpressions(t *testing.T) {
	vars := map[string]any{
		"msgs": []any{NewDict("role", "user", "content", "a"), NewDict("role", "assistant", "content", "b")},
		"s":    "  Hello World  ",
		"n":    7,
		"d":    NewDict("x", 1, "y", "two"),
	}
	for _, tc := range []struct{ src, want string }{
		{`{{ 1 + 2 * 3 }}`, "7"},
		{`{{ (1 + 2) * 3 }}`, "9"},
		{`{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 3 }}`, "3 -4 1 2 3.5 8.0"},
		{`{{ "a" ~ 1 ~ none ~ true }}`, "a1NoneTrue"},
		{`{{ s | trim }}|{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}`, "Hello World|Hello World|Hello World  |  Hello World"},
		{`{{ "x" if n > 5 else "y" }}{{ "x" if n > 50 else "y" }}{{ "z" if false }}`, "xy"},
		{`{{ msgs | length }} {{ msgs[-1].content }} {{ msgs[0]['role'] }} {{ (msgs | first).role }} {{ (msgs|last)['content'] }}`, "2 b user user b"},
		{`{% for m in msgs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}{{ loop.length }};{% endfor %}`, "10TrueFalse22;21FalseTrue12;"},
		{`{% for m in msgs if m.role == "assistant" %}{{ m.content }}{{ loop.length }}{% endfor %}`, "b1"},
		{`{% for m in [] %}x{% else %}empty{% endfor %}`, "empty"},
		{`{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}`, "x=1,y=two,"},
		{`{% for k in d %}{{ k }}{% endfor %}`, "xy"},
		{`{% set ns = namespace(found=false) %}{% for m in msgs %}{% if m.role == "assistant" %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}`, "True"},
		{`{% set x = 1 %}{% for m in msgs %}{% set x = 2 %}{% endfor %}{{ x }}`, "1"},
		{`{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}`, "02"},
		{`{{ range(1, 10, 3) | join(",") }}`, "1,4,7"},
		{`{{ "abc"[1:] }} {{ [1,2,3,4][::2] }} {{ [1,2,3][::-1] }} {{ "hello"[-3:] }}`, "bc [1, 3] [3, 2, 1] llo"},
		{`{{ undefined_thing is defined }} {{ n is defined }} {{ none is none }} {{ s is string }} {{ n is number }} {{ d is mapping }} {{ n is odd }} {{ msgs is not string }}`, "False True True True True True True True"},
		{`{{ "a" in "cat" }} {{ "x" in d }} {{ 3 not in [1,2] }}`, "True True True"},
		{`{{ d | tojson }} {{ msgs[0] | tojson }} {{ "é\"\n" | tojson }} {{ [1, 2.5, none, true] | tojson }}`, `{"x": 1, "y": "two"} {"role": "user", "content": "a"} "é\"\n" [1, 2.5, null, true]`},
		{`{{ d | tojson(indent=2) }}`, "{\n  \"x\": 1,\n  \"y\": \"two\"\n}"},
		{`{{ missing | default("dflt") }} {{ "" | default("e", true) }} {{ s.upper() }} {{ "ab" | upper }} {{ "hello world" | title }} {{ "hELLO" | capitalize }}`, "dflt e   HELLO WORLD   AB Hello World Hello"},
		{`{{ msgs | selectattr("role", "equalto", "user") | map(attribute="content") | join }} {{ msgs | rejectattr("role", "eq", "user") | list | length }}`, "a 1"},
		{`{{ "a,b,c".split(",") }} {{ "a b  c".split() | length }} {{ "x".startswith("x") }} {{ "abc".endswith(("z", "c")) }} {{ "aXbX".replace("X", "-") }}`, "['a', 'b', 'c'] 3 True True a-b-"},
		{`{{ d.get("x") }} {{ d.get("q", 5) }} {{ d.keys() | list }} {{ d.values() | list }}`, "1 5 ['x', 'y'] [1, 'two']"},
		{`{{ "a" + "b" }}{{ [1] + [2] }}{{ "-" * 3 }}`, "ab[1, 2]---"},
		{`{{ not true }} {{ true and "x" }} {{ false or 0 or "y" }}`, "False x y"},
		{`{# a comment #}x{{ 'it''s' }}`, "xits"},
		{"a\n  {%- if true %}\n  b\n  {%- endif %}\n", "a  b"},
		{"  {% if true %}\nyes\n  {% endif %}\nafter", "yes\nafter"},
		{"{%+ if true %}x{% endif %}", "x"},
		{`{{ '\u00e9\x41\t' }}`, "éA\t"},
		{`{% generation %}g{% endgeneration %}`, "g"},
		{`{{ strftime_now("%d %b %Y") }}`, "26 Jul 2024"},
		{`{{ 10 | string ~ "x" }} {{ "42" | int + 1 }} {{ 3 | float }} {{ -4 | abs }}`, "10x 43 3.0 4"},
		{`{{ [3, 1, 3] | unique | list }} {{ [1, 2] | reverse | list }} {{ "<a>" | e }}`, "[3, 1] [2, 1] &lt;a&gt;"},
	} {
		tm, err := Parse(tc.src)
		if err != nil {
			t.Errorf("%q: parse: %v", tc.src, err)
			continue
		}
		tm.Now = func() time.Time { return time.Date(2024, 7, 26, 0, 0, 0, 0, time.UTC) }
		got, err := tm.Execute(vars)
		if err != nil {
			t.Errorf("%q: %v", tc.src, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%q:\n got %q\nwant %q", tc.src, got, tc.want)
		}
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want error
	}{
		{`{% include "/etc/passwd" %}`, ErrUnsupported},
		{`{% extends "base" %}`, ErrUnsupported},
		{`{% call m() %}{% endcall %}`, ErrUnsupported},
		{`{% if x %}`, ErrSyntax},
		{`{{ x `, ErrSyntax},
		{`{{ "unterminated }}`, ErrSyntax},
		{`{% for %}`, ErrSyntax},
		{`{{ 1 + }}`, ErrSyntax},
		{`{{ x | nosuchfilter }}`, ErrUnsupported},
		{`{{ x.__class__() }}`, ErrUnsupported},
		{`{{ missing + 1 }}`, ErrRender},
		{`{{ 1 // 0 }}`, ErrRender},
		{`{% for i in range(10000000) %}{% endfor %}`, ErrLimit},
		{`{% for i in range(5000) %}{% for j in range(5000) %}{% endfor %}{% endfor %}`, ErrLimit},
		{`{{ "x" * 100000000 }}`, ErrLimit},
		{`{% set ns = namespace(s="xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx") %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}`, ErrLimit},
		{strings.Repeat("{{ (", 300) + "1" + strings.Repeat(") }}", 300), ErrLimit},
		{strings.Repeat("{% if true %}", 300) + strings.Repeat("{% endif %}", 300), ErrLimit},
		{`{% break %}`, ErrRender},
		{`{{ raise_exception("no") }}`, ErrRaised},
	} {
		tm, err := Parse(tc.src)
		if err == nil {
			// Smaller than the defaults to keep the test fast under -race;
			// the defaults are the same code with larger numbers.
			tm.Limits = Limits{MaxSteps: 50_000, MaxOutput: 1 << 20, MaxRange: 10_000}
			_, err = tm.Execute(nil)
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%.60q: err = %v, want %v", tc.src, err, tc.want)
		}
	}
}

func TestFallback(t *testing.T) {
	got := Fallback(Input{Messages: []Message{{Role: "system", Content: "S"}, {Role: "user", Content: "U"}}, AddGenerationPrompt: true})
	want := "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("Fallback = %q, want %q", got, want)
	}
}

func FuzzTemplate(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.jinja"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(string(b))
		}
	}
	f.Add(`{% for m in messages %}{{ m.content | tojson }}{% endfor %}`)
	f.Add(`{{ range(3) | join(",") }}{{ "a"[::-1] }}`)
	f.Fuzz(func(t *testing.T, src string) {
		tm, err := Parse(src)
		if err != nil {
			return
		}
		tm.Limits = Limits{MaxSteps: 20000, MaxOutput: 1 << 16, MaxRange: 1000}
		tm.RenderChat(Input{Messages: conversations["sys"], BOSToken: "<s>", EOSToken: "</s>", AddGenerationPrompt: true})
	})
}

func BenchmarkRenderLlama3(b *testing.B) {
	src, err := os.ReadFile(filepath.Join("testdata", "llama3.jinja"))
	if err != nil {
		b.Fatal(err)
	}
	tm, err := Parse(string(src))
	if err != nil {
		b.Fatal(err)
	}
	in := Input{Messages: conversations["sys"], BOSToken: "<s>", EOSToken: "</s>", AddGenerationPrompt: true}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tm.RenderChat(in); err != nil {
			b.Fatal(err)
		}
	}
}

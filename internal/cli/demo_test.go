package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDemo: the demo runs its workload, refuses the injected short
// handoff and ends with every page back and no violation.
func TestDemo(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"demo", "--threads", "1", "--requests-per-tenant", "3"}, &out, &errOut); code != 0 {
		t.Fatalf("demo exited %d:\n%s\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"400 context_length_exceeded", "499 client_closed", "page_count_mismatch", "pages back to baseline: true; isolation violations: 0; the short handoff was refused: true", "PASS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

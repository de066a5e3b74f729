package syncbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWritesAndReads: lines written by many goroutines while
// others read all arrive whole (run under -race, the reads and writes
// must not race).
func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range 100 {
				fmt.Fprintf(&b, "writer %d line %d\n", w, i)
			}
		}()
		go func() {
			defer wg.Done()
			for range 100 {
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines, want 800", len(lines))
	}
	for _, l := range lines {
		var w, i int
		if n, err := fmt.Sscanf(l, "writer %d line %d", &w, &i); n != 2 || err != nil {
			t.Fatalf("torn line %q", l)
		}
	}
	b.Reset()
	if s := b.String(); s != "" {
		t.Fatalf("after Reset: %q", s)
	}
}

package admin

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRingBounded(t *testing.T) {
	r := NewRing(3)
	_, changed := r.Since(0)
	for i := range 5 {
		if seq := r.Add(Event{Message: string(rune('a' + i))}); seq != uint64(i+1) {
			t.Fatalf("seq %d, want %d", seq, i+1)
		}
	}
	select {
	case <-changed:
	default:
		t.Fatal("Add did not wake a waiter")
	}
	got, _ := r.Since(0)
	var msgs []string
	for _, e := range got {
		msgs = append(msgs, e.Message)
	}
	if !cmp.Equal(msgs, []string{"c", "d", "e"}) {
		t.Fatalf("ring holds %v", msgs)
	}
	if got, _ := r.Since(4); len(got) != 1 || got[0].Seq != 5 {
		t.Fatalf("since 4: %+v", got)
	}
	if NewRing(0).n != DefaultRing || NewRing(1<<30).n != maxRingLen {
		t.Fatal("ring size bounds")
	}
}

// TestHandler: WARN and above reach the ring as well as the log, with
// groups flattened, text-bearing keys withheld and long values clipped;
// lower levels reach only the log.
func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	r := NewRing(16)
	log := slog.New(r.Handler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}), slog.LevelWarn))
	log = log.With("node", "decode-0")
	log.Info("serving", "addr", "x")
	log.Debug("dropped everywhere")
	log.WithGroup("req").Error("isolation violation: request aborted, its pages quarantined",
		"tenant", "acme", "prompt", "secret words", slog.Group("pages", "ids", "3,4"), "wait", 1500*time.Microsecond,
		"err", strings.Repeat("é", maxValueLen))
	evs, _ := r.Since(0)
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1 (only the ERROR)", len(evs))
	}
	e := evs[0]
	if e.Level != "ERROR" || e.Time.IsZero() || e.Seq != 1 {
		t.Errorf("event %+v", e)
	}
	want := map[string]string{
		"node":          "decode-0",
		"req.tenant":    "acme",
		"req.prompt":    droppedValue,
		"req.pages.ids": "3,4",
		"req.wait":      "1.500ms",
		"req.err":       e.Attrs["req.err"],
	}
	if diff := cmp.Diff(want, e.Attrs); diff != "" {
		t.Errorf("attrs (-want +got):\n%s", diff)
	}
	if v := e.Attrs["req.err"]; len(v) > maxValueLen+len("…") || !strings.HasSuffix(v, "…") || !strings.HasPrefix(v, "é") {
		t.Errorf("clipped value has %d bytes: %q…", len(v), v[:8])
	}
	for _, line := range []string{"msg=serving", "isolation violation", "secret words"} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("log lost %q:\n%s", line, buf.String())
		}
	}
	if strings.Contains(buf.String(), "dropped everywhere") {
		t.Error("a DEBUG line passed an INFO log")
	}
}

// TestHandlerAuditMark: an INFO record marked with AuditKey reaches the
// ring without the mark; an unmarked one does not.
func TestHandlerAuditMark(t *testing.T) {
	r := NewRing(4)
	log := slog.New(r.Handler(slog.DiscardHandler, slog.LevelWarn))
	log.Info("tenant config reloaded", "changes", "tenant b added", AuditKey, true)
	log.Info("serving", "addr", "x")
	log.Info("not marked", AuditKey, false)
	evs, _ := r.Since(0)
	if len(evs) != 1 || evs[0].Message != "tenant config reloaded" || evs[0].Level != "INFO" {
		t.Fatalf("events %+v", evs)
	}
	if diff := cmp.Diff(map[string]string{"changes": "tenant b added"}, evs[0].Attrs); diff != "" {
		t.Errorf("attrs (-want +got):\n%s", diff)
	}
}

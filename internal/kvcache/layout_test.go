package kvcache_test

import (
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

func TestLayout(t *testing.T) {
	tests := []struct {
		name  string
		l     kvcache.Layout
		ok    bool
		bytes int64
	}{
		// stories15M-like: 6 layers, 6 KV heads of 48, f32: 2*6*16*288*4.
		{"f32", kvcache.Layout{Layers: 6, KVHeads: 6, HeadDim: 48, PageSize: 16}, true, 221184},
		{"f16 default page", kvcache.Layout{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvcache.F16}, true, 2 * 32 * 16 * 1024 * 2},
		{"page size 1", kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 1, PageSize: 1}, true, 8},
		{"no layers", kvcache.Layout{KVHeads: 1, HeadDim: 1}, false, 0},
		{"negative heads", kvcache.Layout{Layers: 1, KVHeads: -1, HeadDim: 1}, false, 0},
		{"huge kv dim", kvcache.Layout{Layers: 1, KVHeads: 1 << 16, HeadDim: 1 << 16}, false, 0},
		{"negative page", kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 1, PageSize: -16}, false, 0},
		{"unknown dtype", kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 1, DType: 7}, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if (err == nil) != tc.ok || err != nil && !errors.Is(err, kvcache.ErrLayout) {
				t.Fatalf("Validate: %v, want ok=%v", err, tc.ok)
			}
			if got := tc.l.PageBytes(); got != tc.bytes {
				t.Fatalf("PageBytes = %d, want %d", got, tc.bytes)
			}
		})
	}
}

func TestPagesForMemory(t *testing.T) {
	l := kvcache.Layout{Layers: 6, KVHeads: 6, HeadDim: 48, PageSize: 16} // 221184 B/page
	tests := []struct {
		bytes int64
		want  int
	}{
		{0, 0}, {-1, 0}, {221183, 0}, {221184, 1}, {512 << 20, 2427}, {math.MaxInt64, 1<<31 - 1},
	}
	for _, tc := range tests {
		if got := kvcache.PagesForMemory(l, tc.bytes); got != tc.want {
			t.Errorf("PagesForMemory(%d) = %d, want %d", tc.bytes, got, tc.want)
		}
	}
	if got := kvcache.PagesForMemory(kvcache.Layout{}, 1<<30); got != 0 {
		t.Errorf("invalid layout: %d pages", got)
	}
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"1048576", 1 << 20, true},
		{"512MiB", 512 << 20, true},
		{"512mib", 512 << 20, true},
		{"512M", 512 << 20, true},
		{"800MB", 800e6, true},
		{" 2 GiB ", 2 << 30, true},
		{"1.5GiB", 3 << 29, true},
		{"1.5", 1, true},
		{"10B", 10, true},
		{"1TiB", 1 << 40, true},
		{"8388607TiB", 8388607 << 40, true},
		{"8388608TiB", 0, false},
		{"9223372036854775807", math.MaxInt64, true},
		{"9223372036854775808", 0, false},
		{"99999999999999999999GiB", 0, false},
		{"1e9", 0, false},
		{"-1", 0, false},
		{"", 0, false},
		{"MiB", 0, false},
		{"1.2.3", 0, false},
		{"12 parsecs", 0, false},
		{"0x10", 0, false},
		{".", 0, false},
	}
	for _, tc := range tests {
		got, err := kvcache.ParseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, kvcache.ErrBytes) {
			t.Errorf("ParseBytes(%q): error %v does not wrap ErrBytes", tc.in, err)
		}
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"512MiB", "1.5GiB", "800MB", "0", "9223372036854775807", "1e9", "..", "1 k"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := kvcache.ParseBytes(s)
		if err != nil {
			if n != 0 || !errors.Is(err, kvcache.ErrBytes) {
				t.Fatalf("ParseBytes(%q) = %d, %v", s, n, err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("ParseBytes(%q) = %d", s, n)
		}
		// A plain integer reads as itself.
		if v, err := strconv.ParseInt(s, 10, 64); err == nil && v >= 0 && v != n && s[0] != '+' {
			t.Fatalf("ParseBytes(%q) = %d, want %d", s, n, v)
		}
	})
}

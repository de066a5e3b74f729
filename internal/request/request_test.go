package request

import (
	"math"
	"testing"
)

func TestMaxKVPages(t *testing.T) {
	for _, tc := range []struct{ prompt, max, page, want int }{
		{1, 1, 16, 1},  // one position written
		{16, 1, 16, 1}, // the only sampled token is never written back
		{15, 2, 16, 1}, // 16 positions
		{16, 2, 16, 2}, // the first sampled token is written: 17 positions
		{2, 63, 16, 4}, // 64 positions
		{2, 64, 16, 5}, // 65 positions
		{0, 0, 16, 0},  // nothing
		{10, 10, 0, 0}, // no paging
		// Sums that would wrap: never zero, never negative.
		{2, math.MaxInt, 16, math.MaxInt},
		{math.MaxInt, math.MaxInt, 16, math.MaxInt},
		{math.MaxInt - 15, 16, 16, math.MaxInt},
		{1, math.MaxInt - 1, 1, math.MaxInt - 1},
		{-5, 3, 16, 1}, // negatives count as zero
	} {
		if got := MaxKVPages(tc.prompt, tc.max, tc.page); got != tc.want {
			t.Errorf("MaxKVPages(%d, %d, %d) = %d, want %d", tc.prompt, tc.max, tc.page, got, tc.want)
		}
	}
}

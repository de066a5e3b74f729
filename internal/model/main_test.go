package model_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kernels"
)

// TestMain installs the kernel tier PAGEWARDEN_KERNELS names, as the
// command line does, so that this package's tests and benchmarks run (and
// compare) the AVX2 path on an AVX-512 machine:
//
//	PAGEWARDEN_KERNELS=avx2 go test ./internal/model -run '^$' -bench Prefill
func TestMain(m *testing.M) {
	if name := os.Getenv("PAGEWARDEN_KERNELS"); name != "" {
		if err := kernels.SetTier(name); err != nil {
			fmt.Fprintln(os.Stderr, "PAGEWARDEN_KERNELS:", err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

//go:build !unix

package model_test

// cpuSeconds is 0 where getrusage is missing: benchmarks then report wall
// time only.
func cpuSeconds() float64 { return 0 }

//go:build race

package sched

// The simulation is single-goroutine: under the race detector it runs fewer
// seeds by default (the full count runs without -race).
func init() { raceEnabled = true }

//go:build race

package model_test

// raceEnabled skips the slowest model generations: the race detector makes
// them take minutes, and they run no concurrent code.
const raceEnabled = true

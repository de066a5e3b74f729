//go:build race

package transfer

func init() { raceEnabled = true }

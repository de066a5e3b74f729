//go:build !linux

package hugemem

// Huge pages are asked for on Linux only; elsewhere the hints are no-ops.
func advise([]byte)   {}
func collapse([]byte) {}

//go:build !linux

package kernels

// Huge pages are asked for on Linux only; elsewhere the hints are no-ops.
func adviseHuge([]byte)   {}
func collapseHuge([]byte) {}

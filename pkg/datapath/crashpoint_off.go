//go:build !crashpoint

package datapath

// crashpoint marks a step of a layout migration where the test build (-tags
// crashpoint) can kill the process; in a normal build it does nothing.
func crashpoint(string) {}

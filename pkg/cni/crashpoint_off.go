//go:build !crashpoint

package cni

// crashpoint marks a step of ADD where the test build (-tags crashpoint) can
// kill the plugin; in a normal build it does nothing.
func crashpoint(string) {}

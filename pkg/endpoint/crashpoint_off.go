//go:build !crashpoint

package endpoint

// Crashpoint marks a step of ADD where the test build (-tags crashpoint) can
// kill the plugin; in a normal build it does nothing.
func Crashpoint(string) {}

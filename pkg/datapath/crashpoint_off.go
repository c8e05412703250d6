//go:build !crashpoint

package datapath

// crashpoint marks a step of a layout migration where the test build (-tags
// crashpoint) can kill the process; in a normal build it does nothing.
func crashpoint(string) {}

// pausepoint marks a step where the test build can hold the process (to
// make a short-lived state, such as pods on two builds, last); in a normal
// build it does nothing.
func pausepoint(string) {}

// holdpoint marks a step where the test build can hold the process until
// the test lets it go; in a normal build it does nothing.
func holdpoint(string) {}

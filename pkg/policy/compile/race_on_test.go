//go:build race

package compile

// raceEnabled shrinks the randomized tests under the race detector, which
// runs them several times slower; TestConcurrentUse is what it is there for.
const raceEnabled = true

//go:build !race

package fairlock_test

// raceEnabled reports whether the tests run with the race detector.
const raceEnabled = false

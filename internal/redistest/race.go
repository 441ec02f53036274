//go:build race

package redistest

// Race reports whether the tests run with the race detector, which slows
// the Go side of the largest scenarios several times over.
const Race = true

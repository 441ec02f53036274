// Package faulttest holds fairlock's process-level fault tests: the test
// binary re-executes itself as worker processes, each one fairlock client,
// and the tests kill, pause and resume them, and restart Redis, while an
// occupancy log that fairlock does not write checks mutual exclusion.
//
// The package has no code outside its tests.
package faulttest

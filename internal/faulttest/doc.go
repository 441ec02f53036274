// Package faulttest holds fairlock's process-level fault tests: the test
// binary starts worker processes, each one fairlock client, and the tests
// kill, pause and resume them, and restart Redis, while an occupancy log
// that fairlock does not write checks mutual exclusion. Workers take turns
// between the Go Redis clients: go-redis (this package's test binary),
// rueidis and valkey-go (their modules' test binaries, whose TestMain runs
// [WorkerMain] through their own Dial when [IsWorker]).
//
// Besides the workers, the package has no code outside its tests.
package faulttest

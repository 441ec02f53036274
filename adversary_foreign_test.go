package fairlock

import (
	"testing"

	"github.com/fairlock/fairlock/internal/redistest"
)

// TestAdversaryForeignKeyReadAfterApply: next_event reads a bound's key
// after apply, through redis.pcall, and takes an error (another program's
// value there) for "nothing there". A pump on a full semaphore whose
// queued waiter is dead (not dropped: nobody can be granted, so the queue
// is not read) neither reads :d before its writes nor refuses: with
// another program's value at :d it answers a next event at the lease's
// expiry where the clean run answers -1 (overdue). The same call machine
// failure: TestForeignKeysCallMachine/miniredis/fast=false,
// -rapid.seed=13152508377985742658.
func TestAdversaryForeignKeyReadAfterApply(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		s := advScen(t, b, 1)
		sem := s.sems[0]
		s.acquire("acquire", s.procs[0], s.sems, 1) // holds for 5 s
		s.acquire("acquire", s.procs[3], s.sems, 1) // queued, 200 ms deadline
		s.must()
		s.now += 250_000 // the waiter is dead
		s.pair.all = true
		s.pair.candidates = func() []fkey { return []fkey{{sem.base + ":d", "zset"}} }
		s.simple("pump", sem)
		s.must()
	})
}

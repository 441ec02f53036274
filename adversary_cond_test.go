package fairlock

// Adversary tests: each fails on the code it was written against, and
// shows one way the scripts break their promise (see each test's
// comment for the class and the reproduction).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/redistest"
)

// advScen returns a scenario of the foreign table's kind on backend b
// (fast paths on), with no key planted: the calls run at the scenario's
// own clock (see replayed), and the replay expires keys by that clock.
func advScen(t *testing.T, b *redistest.Backend, caps ...int64) *fscen {
	t.Helper()
	pair := newForeignPair(t, b.Real(), true, nil)
	ctx := context.Background()
	procs := []*cproc{{"PAID", 5000, 3000}, {"PBID", 5000, 3000}, {"PCID", 5000, 3000}, {"PDID", 300, 200}, {"PEID", 60000, 3000}}
	s := &fscen{t: t, ctx: ctx, pair: pair, now: time.Now().UnixMicro(), procs: procs}
	for i, c := range caps {
		s.sems = append(s.sems, &csem{name: fmt.Sprint("a", i), base: fmt.Sprintf("adv:{a%d}", i), cap: c})
	}
	pair.candidates = func() []fkey { return nil }
	return s
}

// must fails the test with the scenario's first failed check.
func (s *fscen) must() {
	s.t.Helper()
	if s.err != nil {
		s.t.Fatal(s.err)
	}
}

// TestAdversaryCondWaiterOutlivesItsKey: a condition waiter that waits,
// refreshed, longer than the keys had to live when it began to wait is
// lost from its condition's key (that key's TTL is set only by a script
// that writes it, and a refresh now writes the deadline to :d, not to
// the condition's key), while its mark in S, nc and its deadline in :d
// live on: no signal ever wakes it.
func TestAdversaryCondWaiterOutlivesItsKey(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		s := advScen(t, b, 1)
		a, sem := s.procs[0], s.sems[0]
		x := s.acquire("acquire", a, s.sems, 1)
		xw := s.wait(x, "")
		s.must()
		ck := condKeys(keyspace.Keys{Base: sem.base}, "")[0]
		for i := 0; i < 60; i++ {
			s.now += 1_000_000 // a refresh a second, as the client's room does
			res := s.refresh(a, sem, xw)
			s.must()
			if gone, _ := res[1].([]any); len(gone) > 0 {
				t.Fatalf("after %d s the waiter's refresh reports it gone: %v", i+1, gone)
			}
		}
		dump, err := s.pair.clean.Dump(s.ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := blocks(dump)[ck]; !ok {
			t.Errorf("after 60 s of refreshes the live condition waiter %s is no longer in %s (the key expired); the database:\n%s", xw.ticket, ck, dump)
		}
		res := s.exec(call{Keys: append(sem.keys(), ck), Args: []string{"signal", "", "1", "", s.ticket()}})
		s.must()
		if woken, _ := res[0].(int64); woken != 1 {
			t.Errorf("signal woke %v waiters, want 1: the live waiter %s is never woken", res[0], xw.ticket)
		}
	})
}

// TestAdversaryLostCondWaiterStarvesTheQueue: the condition waiter lost
// from its key (TestAdversaryCondWaiterOutlivesItsKey) withdraws (its
// context ended): leave finds no member in the condition's key, clears the
// ticket's mark and leaves its deadline in :d and nc as they were. When
// that deadline passes, purge_waiters finds a member of :d with no
// condition mark and drops it as a queued waiter: nq goes one below the
// queue. The waiter queued then is never granted (head stops at nq 0),
// and every newcomer is granted before it.
func TestAdversaryLostCondWaiterStarvesTheQueue(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		s := advScen(t, b, 1)
		a, pb, pc, sem := s.procs[0], s.procs[1], s.procs[2], s.sems[0]
		x := s.acquire("acquire", a, s.sems, 1)
		xw := s.wait(x, "")
		for i := 0; i < 60; i++ {
			s.now += 1_000_000
			s.refresh(a, sem, xw)
		}
		s.op("leave", xw) // its context ended
		y := s.acquire("acquire", pb, s.sems, 1)
		if y.tokens == nil {
			s.must()
			t.Fatal("y was not granted the free mutex")
		}
		z := s.acquire("acquire", pc, s.sems, 1) // queued behind y
		for i := 0; i < 4; i++ {                 // xw's deadline passes; z is refreshed
			s.now += 1_000_000
			s.refresh(pc, sem, z)
			s.op("renew", y)
		}
		s.op("release", y)
		s.must()
		// z heads the queue of a free mutex: it must be granted now, and a
		// newcomer must queue behind it.
		res := s.refresh(pc, sem, z)
		s.must()
		gone, _ := res[1].([]any)
		w := s.acquire("try", s.procs[4], s.sems, 1)
		s.must()
		dump, _ := s.pair.clean.Dump(s.ctx, "")
		if len(gone) == 0 {
			t.Errorf("z (%s) heads the queue of a free mutex and is not granted; the database:\n%s", z.ticket, dump)
		}
		if w.tokens != nil {
			t.Errorf("a try (%s) was granted while z (%s) was queued ahead of it: FIFO broken", w.ticket, z.ticket)
		}
	})
}

// TestAdversaryStateLostCondWaiterStarvesTheQueue: the same drop of a
// condition waiter's deadline as a queued waiter's, reached by the
// recovery path: the state hash is lost (evicted) while a condition waiter
// and a holder remain. rebuild recounts nh and nq from :h and :q, not nc,
// and the condition waiter's mark is gone with the hash; when its deadline
// passes, purge_waiters takes its member of :d for a queued waiter and
// counts nq down: the waiter queued since is never granted, and newcomers
// are granted before it.
func TestAdversaryStateLostCondWaiterStarvesTheQueue(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		s := advScen(t, b, 1)
		pb, pc, pd, sem := s.procs[1], s.procs[2], s.procs[3], s.sems[0]
		x := s.acquire("acquire", pd, s.sems, 1)
		s.wait(x, "") // a condition waiter with a 200 ms deadline
		y := s.acquire("acquire", pb, s.sems, 1)
		s.must()
		if y.tokens == nil {
			t.Fatal("y was not granted the free mutex")
		}
		// The state hash is lost (evicted alone).
		if err := s.pair.clean.RDB.Del(s.ctx, sem.base+":s").Err(); err != nil {
			t.Fatal(err)
		}
		z := s.acquire("acquire", pc, s.sems, 1) // queued behind y
		for i := 0; i < 3; i++ {                 // the condition waiter's deadline passes
			s.now += 150_000
			s.refresh(pc, sem, z)
		}
		s.op("release", y)
		res := s.refresh(pc, sem, z)
		s.must()
		gone, _ := res[1].([]any)
		w := s.acquire("try", s.procs[4], s.sems, 1)
		s.must()
		dump, _ := s.pair.clean.Dump(s.ctx, "")
		if len(gone) == 0 {
			t.Errorf("z (%s) heads the queue of a free mutex and is not granted; the database:\n%s", z.ticket, dump)
		}
		if w.tokens != nil {
			t.Errorf("a try (%s) was granted while z (%s) was queued ahead of it: FIFO broken", w.ticket, z.ticket)
		}
	})
}

package fairlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A wait for a semaphore that the context's own lease holds fails at once
// with ErrDeadlock, naming the lease, and sends nothing to Redis; the lease
// is not disturbed; a Try call, which never waits, is not checked.
func TestDeadlockLockedAgain(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		cnt := fltest.NewCounter()
		rdb := b.Client(t)
		counted := redistest.AddHook[fairlock.Option](rdb, cnt)
		// A long TTL: no renewal is sent while the test counts commands.
		c := e.ClientOn(rdb, counted, fairlock.WithLeaseTTL(time.Minute))
		mu := newSem(c, "again", 1)
		l, err := mu.Acquire(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		lctx, cancel := fairlock.LeaseContext(fltest.Bounded(t), l)
		defer cancel()

		before := cnt.Total()
		_, err = mu.Acquire(lctx, 1)
		fltest.Deadlocked(t, "Acquire under its own lease", err, "acquire", []string{"again"}, l.Token(), "again")
		_, err = c.AcquireAll(lctx, mu.req(1))
		fltest.Deadlocked(t, "AcquireAll under its own lease", err, "acquire", []string{"again"}, l.Token(), "again")
		if sent := cnt.Total() - before; sent != 0 {
			t.Fatalf("%d commands sent for requests refused as deadlocks", sent)
		}
		t.Logf("%v", err)

		// A Try call never waits: busy, as for anybody.
		_, err = mu.TryAcquire(lctx, 1)
		fltest.IsErr(t, "TryAcquire under its own lease", err, fairlock.ErrNotAcquired)
		if errors.Is(err, fairlock.ErrDeadlock) {
			t.Fatalf("TryAcquire = %v, which matches ErrDeadlock", err)
		}
		if err := l.Err(); err != nil {
			t.Fatalf("the lease after the refused requests: %v", err)
		}
		e.Release(l)
	})
}

type betweenKey struct{}

// Ownership chains through contexts: a lease two LeaseContexts up (with
// other contexts between) counts; one lease carried twice counts once; a
// request beside what the leases hold (n <= capacity - held) proceeds.
func TestDeadlockNestedContexts(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		c := e.Client()
		a, s := newSem(c, "outer", 1), newSem(c, "inner", 3)
		la, err := a.Acquire(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(la)
		ctx1, cancel1 := fairlock.LeaseContext(fltest.Bounded(t), la)
		defer cancel1()
		ctx2, cancel2 := context.WithCancel(context.WithValue(ctx1, betweenKey{}, "between"))
		defer cancel2()
		ls, err := s.Acquire(ctx2, 2)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(ls)
		ctx3, cancel3 := fairlock.LeaseContext(ctx2, ls)
		defer cancel3()
		ctx4, cancel4 := fairlock.LeaseContext(ctx3, ls) // the same lease again
		defer cancel4()

		_, err = a.Acquire(ctx4, 1)
		fltest.Deadlocked(t, "Acquire of a mutex held two contexts up", err, "acquire", []string{"outer"}, la.Token(), "outer")
		_, err = s.Acquire(ctx4, 2)
		fltest.Deadlocked(t, "Acquire of 2 of 3 permits with 2 held", err, "acquire", []string{"inner"}, ls.Token(), "inner")
		// 1 more fits beside the 2 held (counted once, though carried twice).
		l, err := s.Acquire(ctx4, 1)
		if err != nil {
			t.Fatalf("Acquire of the 1 permit left beside the 2 held: %v", err)
		}
		e.Release(l)
	})
}

// A lease counts while it is live: once released, a context that carries
// it without ending with it (context.WithoutCancel) waits, and is granted,
// as any other. (A context from LeaseContext ends with its lease, so a
// wait under it returns the context's error.)
func TestDeadlockReleasedLeaseNoLongerCounts(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		mu := newSem(e.Client(), "released", 1)
		l, err := mu.Acquire(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		lctx, cancel := fairlock.LeaseContext(fltest.Bounded(t), l)
		defer cancel()
		// Carries the lease, does not end with it (bounded, in case it waits).
		kept, cancelKept := context.WithTimeout(context.WithoutCancel(lctx), 10*time.Second)
		defer cancelKept()
		_, err = mu.Acquire(kept, 1)
		fltest.Deadlocked(t, "Acquire under WithoutCancel of the lease's context", err, "acquire", []string{"released"}, l.Token(), "released")

		e.Release(l)
		_, err = mu.Acquire(lctx, 1)
		if !errors.Is(err, context.Canceled) || errors.Is(err, fairlock.ErrDeadlock) {
			t.Fatalf("Acquire under the context of a released lease = %v, want context.Canceled", err)
		}
		next, err := mu.Acquire(kept, 1)
		if err != nil {
			t.Fatalf("Acquire under a context carrying a released lease: %v", err)
		}
		e.Release(next)
	})
}

// What the check cannot see: a context that does not carry the lease, and
// a lease of another go-redis client, even on the same Redis. Such a
// request queues behind the holder like any other (here until its
// deadline). A fairlock client on the same go-redis client with the same
// prefix is the same semaphore, and is seen; another prefix names other
// keys, and is granted.
func TestDeadlockWhatItSees(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		rdb := b.Client(t)
		c := e.ClientOn(rdb)
		mu := newSem(c, "sees", 1)
		l, err := mu.Acquire(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(l)
		lctx, cancel := fairlock.LeaseContext(fltest.Bounded(t), l)
		defer cancel()

		queues := func(what string, ctx context.Context, s sem) {
			t.Helper()
			ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			_, err := s.Acquire(ctx, 1)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s = %v, want it to wait until its deadline", what, err)
			}
		}
		queues("Acquire under a context without the lease", context.Background(), mu)
		queues("Acquire through another go-redis client", lctx, newSem(e.ClientOn(b.Client(t)), "sees", 1))

		_, err = newSem(e.ClientOn(rdb), "sees", 1).Acquire(lctx, 1)
		fltest.Deadlocked(t, "Acquire through another fairlock client on the same go-redis client", err, "acquire", []string{"sees"}, l.Token(), "sees")

		other, err := fairlock.New(rdb, fairlock.WithPrefix(e.Prefix+"other:"))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		l2, err := newSem(other, "sees", 1).Acquire(lctx, 1)
		if err != nil {
			t.Fatalf("Acquire of the same name under another prefix: %v", err)
		}
		e.Release(l2)
	})
}

// A request with another capacity than the held lease's is not a deadlock:
// Redis refuses it with ErrCapacityMismatch, as it would anybody's.
func TestDeadlockCapacityMismatchIsRedisAnswer(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		c := e.Client()
		l, err := newSem(c, "cap", 1).Acquire(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(l)
		lctx, cancel := fairlock.LeaseContext(fltest.Bounded(t), l)
		defer cancel()
		_, err = newSem(c, "cap", 2).Acquire(lctx, 2)
		fltest.IsErr(t, "Acquire with another capacity under the lease", err, fairlock.ErrCapacityMismatch)
	})
}

// A multi-lock that overlaps a part the context holds is refused, naming
// the part; so is a single semaphore held as part of a multi-lock.
func TestDeadlockMultiLockOverlap(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		c := e.Client()
		a, bb, x := newSem(c, "{m}:a", 1), newSem(c, "{m}:b", 1), newSem(c, "{m}:x", 1)
		la, err := a.Acquire(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		lctx, cancel := fairlock.LeaseContext(fltest.Bounded(t), la)
		_, err = c.AcquireAll(lctx, x.req(1), bb.req(1), a.req(1))
		fltest.Deadlocked(t, "AcquireAll over a held part", err, "acquire", []string{"{m}:a", "{m}:b", "{m}:x"}, la.Token(), "{m}:a")
		cancel()
		e.Release(la)

		all, err := c.AcquireAll(context.Background(), a.req(1), bb.req(1))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(all)
		actx, cancel := fairlock.LeaseContext(fltest.Bounded(t), all)
		defer cancel()
		_, err = bb.Acquire(actx, 1)
		fltest.Deadlocked(t, "Acquire of a part of the multi-lock held", err, "acquire", []string{"{m}:b"}, all.Parts()[1].Token, "{m}:b")
		lx, err := x.Acquire(actx, 1)
		if err != nil {
			t.Fatalf("Acquire of a semaphore the multi-lock does not hold: %v", err)
		}
		e.Release(lx)
	})
}

package faulttest

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// pass lets d of Redis's time go by: on miniredis (frozen clock) it moves
// the clock; on a real server it waits until cond holds, cond being what
// that much time brings (it waits for a state, never asserts a duration).
func pass(e *fltest.Env, d time.Duration, what string, cond func() bool) {
	e.T.Helper()
	if !e.B.Real() {
		e.B.Advance(e.T, d)
	}
	e.WaitFor(what, cond)
}

// idle reports whether c's Status shows no live holder and no live waiter
// of name (entries Redis has not dropped yet do not count).
func idle(c *fairlock.Client, name string) func() bool {
	return func() bool {
		st, err := c.Status(context.Background(), name)
		return err == nil && len(st.Holders) == 0 && len(st.Waiters) == 0
	}
}

// The README says an idle semaphore takes the next
// caller's capacity. A semaphore whose only holder (and waiter) crashed is
// idle once their lease and liveness have run out, even though nobody has
// dropped them from Redis yet: a caller with a new capacity must be granted
// then, not refused with ErrCapacityMismatch until the keys expire, and the
// capacity it gave must be the one enforced afterwards.
func TestNewCapacityAfterCrash(t *testing.T) {
	const lease, wait = 300 * time.Millisecond, 200 * time.Millisecond
	cases := []struct {
		name   string
		waiter bool // a waiter queues behind the holder and crashes too
	}{
		{"holder crashed", false},
		{"holder and waiter crashed", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				e := fltest.New(t, b)
				if !b.Real() {
					b.Freeze(t)
				}
				ctx := context.Background()
				const name = "recap"
				old := fairlock.Request{Name: name, Capacity: 1, Permits: 1}
				holder, hf := e.FaultyClient(fairlock.WithLeaseTTL(lease))
				if _, err := holder.Acquire(ctx, old); err != nil {
					t.Fatal(err)
				}
				direct := e.Client()
				if tc.waiter {
					waiter, wf := e.FaultyClient(fairlock.WithWaiterTTL(wait))
					wctx, cancel := context.WithCancel(ctx)
					done := make(chan struct{})
					go func() {
						defer close(done)
						_, _ = waiter.Acquire(wctx, old) // fails once cut off
					}()
					t.Cleanup(func() { cancel(); <-done })
					fltest.WaitWaiters(t, direct, name, 1)
					wf.Down.Store(true) // the waiter's process dies
				}
				hf.Down.Store(true) // the holder's process dies
				pass(e, max(lease, wait)+time.Millisecond, "the crashed lease and waiter to run out", idle(direct, name))

				// Idle: the next caller's capacity is taken.
				newCap := fairlock.Request{Name: name, Capacity: 2, Permits: 1}
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				first, err := e.Client().Acquire(actx, newCap)
				if err != nil {
					t.Fatalf("Acquire with capacity 2 after the capacity-1 holder's lease expired: %v", err)
				}
				// The new capacity is the one enforced: a second permit
				// fits, a third does not, and capacity 1 is refused.
				second, err := e.Client().TryAcquire(ctx, newCap)
				if err != nil {
					t.Fatalf("second permit of capacity 2: %v", err)
				}
				_, err = e.Client().TryAcquire(ctx, newCap)
				fltest.IsErr(t, "third permit of capacity 2", err, fairlock.ErrNotAcquired)
				_, err = e.Client().TryAcquire(ctx, old)
				fltest.IsErr(t, "capacity 1 while capacity 2 is in use", err, fairlock.ErrCapacityMismatch)
				st, err := direct.Status(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if st.Capacity != 2 || st.InUse != 2 || len(st.Holders) != 2 {
					t.Fatalf("status %+v; want capacity 2, 2 permits in use by 2 holders", st)
				}
				e.Release(first)
				e.Release(second)
			})
		})
	}
}

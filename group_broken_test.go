package fairlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A multi-lock waiter missing from the queue of one of its semaphores
// (that semaphore's keys lost: deleted by an operator, evicted) is found
// broken by the grant that reaches it at the head of another, though the
// lost semaphore, which has no capacity now, could not take its part; it
// is dropped there, and the waiter behind it is granted. (Its process
// queues it again, and it is granted in turn.) A grant that stopped at the
// part that does not fit held the other queue until the group's Acquire
// ended.
func TestBrokenGroupDoesNotHoldItsOtherQueues(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		a, bb := fairlock.Request{Name: "ga", Capacity: 1, Permits: 1}, fairlock.Request{Name: "gb", Capacity: 1, Permits: 1}
		holder := e.Client()
		ha, err := holder.Acquire(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		hb, err := holder.Acquire(ctx, bb)
		if err != nil {
			t.Fatal(err)
		}
		gctx, gcancel := context.WithTimeout(ctx, 30*time.Second)
		defer gcancel()
		c := e.Client()
		group := fltest.Async(func() (*fairlock.Lease, error) { return c.AcquireAll(gctx, a, bb) })
		e.WaitQueued("ga", 1)
		e.WaitQueued("gb", 1)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		behind := acquireAsync(wctx, newSem(e.Client(), "ga", 1), 1)
		e.WaitQueued("ga", 2)

		lost, err := e.RDB.Keys(ctx, e.Prefix+"{gb}*").Result()
		if err != nil || len(lost) == 0 {
			t.Fatalf("gb's keys: %v %v", lost, err)
		}
		if err := e.RDB.Del(ctx, lost...).Err(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		e.Release(ha)
		r := e.Receive(behind)
		if r.Err != nil {
			t.Fatalf("the waiter behind the broken group on ga: %v after %v", r.Err, time.Since(start).Round(time.Millisecond))
		}
		e.Release(r.Lease)
		g := e.Receive(group)
		if g.Err != nil {
			t.Fatalf("the group, queued again: %v", g.Err)
		}
		e.Release(g.Lease)
		_ = hb.Release(ctx) // lost with gb's keys
	})
}

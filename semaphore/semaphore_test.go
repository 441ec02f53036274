package semaphore_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// Semantics 1: grants follow arrival order.
func TestFIFOOrder(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		s := newSem(t, e.Client(), "fifo", 1)
		holder, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		// Each waiter is a process of its own, queued after the previous.
		const n = 6
		var order []int
		var mu sync.Mutex
		done := make(chan error, n)
		for i := range n {
			si := newSem(t, e.Client(), "fifo", 1)
			go func() {
				l, err := si.Acquire(ctx, 1)
				if err == nil {
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					err = l.Release(ctx)
				}
				done <- err
			}()
			e.WaitQueued("fifo", int64(i+1))
		}
		e.Release(holder)
		for range n {
			if err := <-done; err != nil {
				t.Fatalf("waiter: %v", err)
			}
		}
		for i, got := range order {
			if got != i {
				t.Fatalf("grant order = %v, want 0..%d in order", order, n-1)
			}
		}
	})
}

// Semantics 1: a head that does not fit blocks later, smaller requests.
func TestNoBarging(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		s := newSem(t, e.Client(), "nb", 4)
		held, err := s.Acquire(ctx, 3)
		if err != nil {
			t.Fatalf("Acquire(3): %v", err)
		}
		big := acquireAsync(ctx, newSem(t, e.Client(), "nb", 4), 2)
		e.WaitQueued("nb", 1)
		small := acquireAsync(ctx, newSem(t, e.Client(), "nb", 4), 1)
		e.WaitQueued("nb", 2)
		// One permit is free, but the head wants two: nobody may pass it.
		if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire(1) with a queue = %v, want ErrNotAcquired", err)
		}
		e.NotYet(small, "the smaller, later Acquire")
		e.Release(held)
		rb, rs := e.Receive(big), e.Receive(small)
		if rb.Err != nil || rs.Err != nil {
			t.Fatalf("Acquire errors: %v, %v", rb.Err, rs.Err)
		}
		if rb.Lease.Token() >= rs.Lease.Token() {
			t.Fatalf("tokens big=%d small=%d: the earlier request must be granted first", rb.Lease.Token(), rs.Lease.Token())
		}
		e.Release(rb.Lease)
		e.Release(rs.Lease)
	})
}

// Semantics 1: a request larger than the capacity fails at once and
// queues nothing.
func TestTooLargeFailsAtOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		s := newSem(t, e.Client(), "big", 3)
		for _, n := range []int64{4, 0, -1} {
			_, err := s.Acquire(context.Background(), n)
			fltest.IsErr(t, "Acquire", err, fairlock.ErrInvalidArgument)
		}
		if ks := e.Keys(); len(ks) != 0 {
			t.Fatalf("keys after rejected requests = %v, want none", ks)
		}
	})
}

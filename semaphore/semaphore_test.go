package semaphore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// Semantics 1: grants follow arrival order.
func TestFIFOOrder(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		s := e.sem(e.Client(), "fifo", 1)
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
			si := e.sem(e.Client(), "fifo", 1)
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
			e.waitQueued("fifo", int64(i+1))
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
		e := newEnv(t, b)
		ctx := context.Background()
		s := e.sem(e.Client(), "nb", 4)
		held, err := s.Acquire(ctx, 3)
		if err != nil {
			t.Fatalf("Acquire(3): %v", err)
		}
		big := acquireAsync(ctx, e.sem(e.Client(), "nb", 4), 2)
		e.waitQueued("nb", 1)
		small := acquireAsync(ctx, e.sem(e.Client(), "nb", 4), 1)
		e.waitQueued("nb", 2)
		// One permit is free, but the head wants two: nobody may pass it.
		if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire(1) with a queue = %v, want ErrNotAcquired", err)
		}
		e.notYet(small, "the smaller, later Acquire")
		e.Release(held)
		rb, rs := e.receive(big), e.receive(small)
		if rb.err != nil || rs.err != nil {
			t.Fatalf("Acquire errors: %v, %v", rb.err, rs.err)
		}
		if rb.lease.Token() >= rs.lease.Token() {
			t.Fatalf("tokens big=%d small=%d: the earlier request must be granted first", rb.lease.Token(), rs.lease.Token())
		}
		e.Release(rb.lease)
		e.Release(rs.lease)
	})
}

// Semantics 1: a request larger than the capacity fails at once and
// queues nothing.
func TestTooLargeFailsAtOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		s := e.sem(e.Client(), "big", 3)
		for _, n := range []int64{4, 0, -1} {
			_, err := s.Acquire(context.Background(), n)
			fltest.IsErr(t, "Acquire", err, fairlock.ErrInvalidArgument)
		}
		if ks := e.keys(); len(ks) != 0 {
			t.Fatalf("keys after rejected requests = %v, want none", ks)
		}
	})
}

// Semantics 2: a release hands the permits to the waiter through its wake
// list. The waiter's liveness refresh is an hour away and Redis's clock is
// frozen, so nothing but the wake-up can deliver the grant.
func TestHandoffWithoutPolling(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		if b.Mini != nil {
			b.Freeze(t)
		}
		e := newEnv(t, b)
		ctx := context.Background()
		s := e.sem(e.Client(), "h", 1)
		held, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		cnt := newCounter()
		wrdb := b.Client(t)
		redistest.AddHook(t, wrdb, cnt)
		waiter := e.sem(e.ClientOn(wrdb, fairlock.WithWaiterTTL(time.Hour)), "h", 1)
		ch := acquireAsync(ctx, waiter, 1)
		e.waitQueued("h", 1)
		e.Release(held)
		r := e.receive(ch)
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got := cnt.get("script:refresh"); got != 0 {
			t.Fatalf("waiter ran %d refreshes; the grant must come by wake-up alone", got)
		}
		e.Release(r.lease)
	})
}

// Semantics 2: waiting costs Redis a few commands per liveness period per
// process, not a stream of retries.
func TestWaitingIsCheap(t *testing.T) {
	b := redistest.RealBackend(t)
	e := newEnv(t, b)
	ctx := context.Background()
	held, err := e.sem(e.Client(), "cheap", 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	cnt := newCounter()
	wrdb := b.Client(t)
	redistest.AddHook(t, wrdb, cnt)
	const waiterTTL = 150 * time.Millisecond
	c := e.ClientOn(wrdb, fairlock.WithWaiterTTL(waiterTTL))
	const waiters = 20
	ctxw, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = e.sem(c, "cheap", 1).Acquire(ctxw, 1)
		}()
	}
	e.waitQueued("cheap", waiters)
	before := cnt.total()
	const periods = 10
	time.Sleep(periods * waiterTTL)
	used := cnt.total() - before
	cancel()
	wg.Wait()
	e.Release(held)
	// Refreshes run every third of the TTL; BLPOP cycles every second.
	if limit := 4 * periods; used > limit {
		t.Fatalf("%d waiters sent %d commands in %d liveness periods, want <= %d", waiters, used, periods, limit)
	}
	if used == 0 {
		t.Fatalf("waiters sent no command in %d liveness periods; they must refresh", periods)
	}
}

// Semantics 3: a process's waiters on one semaphore share one blocking
// connection, so many waiters fit in a small pool.
func TestOneBlockingConnection(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		cnt := newCounter()
		rdb := b.Client(t, func(o *redisOptions) { o.PoolSize = 4 })
		redistest.AddHook(t, rdb, cnt)
		s := e.sem(e.ClientOn(rdb), "pool", 2)
		const n = 200
		errs := make(chan error, n)
		for range n {
			go func() {
				l, err := s.Acquire(ctx, 1)
				if err == nil {
					err = l.Release(ctx)
				}
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("waiter: %v", err)
			}
		}
		cnt.mu.Lock()
		peak := cnt.peak
		cnt.mu.Unlock()
		if peak > 1 {
			t.Fatalf("%d BLPOPs in flight at once, want at most 1", peak)
		}
	})
}

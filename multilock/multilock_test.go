package multilock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/multilock"
	"github.com/redis/go-redis/v9"
)

// A multi-lock never holds one semaphore while it waits for another, and
// its release frees all of them at once.
func TestAllOrNothing(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		held, err := c.Acquire(ctx, one("a"))
		if err != nil {
			t.Fatal(err)
		}
		ch := fltest.Async(func() (*fairlock.Lease, error) { return multilock.Lock(ctx, e.Client(), "b", "a") })
		e.waitQueued("b", 1)
		e.waitQueued("a", 1)
		e.NotYet(ch, "multi-lock of a held semaphore")
		if st := e.status("b"); st.InUse != 0 {
			t.Fatalf("b has %d permits in use while the multi-lock waits for a", st.InUse)
		}
		// FIFO: b is free, but the multi-lock came first.
		_, err = c.TryAcquire(ctx, one("b"))
		fltest.IsErr(t, "TryAcquire of b behind a waiting multi-lock", err, fairlock.ErrNotAcquired)

		e.Release(held)
		l := e.Granted(ch)
		parts := l.Parts()
		if len(parts) != 2 || parts[0].Name != "a" || parts[1].Name != "b" {
			t.Fatalf("Parts() = %+v, want a and b in name order", parts)
		}
		if parts[0].Token <= held.Token() || parts[1].Token <= 0 {
			t.Fatalf("tokens %+v after a's token %d", parts, held.Token())
		}
		for _, name := range []string{"a", "b"} {
			if st := e.status(name); st.InUse != 1 || len(st.Holders) != 1 || len(st.Waiters) != 0 {
				t.Fatalf("%s while the multi-lock holds it: %+v", name, st)
			}
		}
		e.Release(l)
		both, err := multilock.TryAcquire(ctx, c, one("a"), one("b"))
		if err != nil {
			t.Fatalf("TryAcquire of both after the release: %v", err)
		}
		e.Release(both)
	})
}

// Single and multi requests share one first-in first-out order on every
// semaphore: a multi-lock at the head of b's queue blocks later single
// requests for b, even while b is free, until it is granted.
func TestMixedFIFO(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		holdA := e.hold(e.Client(), one("a"))
		holdB := e.hold(e.Client(), one("b"))
		w1 := fltest.Async(func() (*fairlock.Lease, error) { return e.Client().Acquire(ctx, one("a")) })
		e.waitQueued("a", 1)
		w2 := fltest.Async(func() (*fairlock.Lease, error) { return multilock.Lock(ctx, e.Client(), "a", "b") })
		e.waitQueued("a", 2)
		w3 := fltest.Async(func() (*fairlock.Lease, error) { return e.Client().Acquire(ctx, one("b")) })
		e.waitQueued("b", 2)
		w4 := fltest.Async(func() (*fairlock.Lease, error) { return e.Client().Acquire(ctx, one("a")) })
		e.waitQueued("a", 3)

		e.Release(holdA)
		l1 := e.Granted(w1)
		e.Release(holdB)
		// b is free, but its head (w2) still waits for a; w3 must not pass.
		e.WaitFor("b's holder gone", func() bool { return e.status("b").InUse == 0 })
		e.NotYet(w3, "single b behind the multi-lock")
		e.NotYet(w2, "multi-lock while a is held")
		e.Release(l1)
		l2 := e.Granted(w2)
		e.NotYet(w3, "single b while the multi-lock holds b")
		e.NotYet(w4, "single a while the multi-lock holds a")
		e.Release(l2)
		l3, l4 := e.Granted(w3), e.Granted(w4)
		if l3.Token() <= l2.Parts()[1].Token || l4.Token() <= l2.Parts()[0].Token {
			t.Fatalf("tokens did not increase: multi %+v, then b %d and a %d", l2.Parts(), l3.Token(), l4.Token())
		}
		e.Release(l3)
		e.Release(l4)
	})
}

// A multi waiter whose context ends leaves every queue at once.
func TestCancelLeavesAllQueues(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		held := e.hold(e.Client(), one("a"))
		wctx, cancel := context.WithCancel(ctx)
		ch := fltest.Async(func() (*fairlock.Lease, error) { return multilock.Lock(wctx, e.Client(), "a", "b") })
		e.waitQueued("b", 1)
		cancel()
		fltest.IsErr(t, "cancelled multi-lock", e.Receive(ch).Err, context.Canceled)
		for _, name := range []string{"a", "b"} {
			if st := e.status(name); len(st.Waiters) != 0 {
				t.Fatalf("%s still has waiters after the cancel: %+v", name, st.Waiters)
			}
		}
		l, err := e.Client().TryAcquire(ctx, one("b"))
		if err != nil {
			t.Fatalf("TryAcquire of b after the multi waiter left: %v", err)
		}
		e.Release(l)
		e.Release(held)
	})
}

// A grant that reaches a multi waiter as its context ends is handed on,
// on every semaphore.
func TestCancelRacingGrantHandsOn(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		long := []fairlock.Option{fairlock.WithLeaseTTL(time.Hour), fairlock.WithWaiterTTL(time.Hour)}
		held := e.hold(e.Client(long...), one("a"))
		c, f := e.FaultyClient(long...)
		undo := f.Deafen(t) // grants are announced, but not heard
		wctx, cancel := context.WithCancel(ctx)
		ch := fltest.Async(func() (*fairlock.Lease, error) { return multilock.Lock(wctx, c, "a", "b") })
		e.waitQueued("a", 1)
		nextA := fltest.Async(func() (*fairlock.Lease, error) { return e.Client(long...).Acquire(ctx, one("a")) })
		nextB := fltest.Async(func() (*fairlock.Lease, error) { return e.Client(long...).Acquire(ctx, one("b")) })
		e.waitQueued("a", 2)
		e.waitQueued("b", 2)
		e.Release(held)
		e.WaitFor("the grant to the multi-lock", func() bool {
			return len(e.status("a").Holders) == 1 && len(e.status("b").Holders) == 1
		})
		cancel()
		r := <-ch
		fltest.IsErr(t, "multi-lock cancelled as it was granted", r.Err, context.Canceled)
		undo()
		e.Release(e.Granted(nextA))
		e.Release(e.Granted(nextB))
	})
}

// A multi holder that dies frees every semaphore when its lease expires.
func TestHolderCrash(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		holder, f := e.FaultyClient(fairlock.WithLeaseTTL(200 * time.Millisecond))
		l, err := multilock.Lock(ctx, holder, "a", "b")
		if err != nil {
			t.Fatal(err)
		}
		slow := fairlock.WithWaiterTTL(time.Hour)
		wa := fltest.Async(func() (*fairlock.Lease, error) { return e.Client(slow).Acquire(ctx, one("a")) })
		wb := fltest.Async(func() (*fairlock.Lease, error) { return e.Client(slow).Acquire(ctx, one("b")) })
		e.waitQueued("a", 1)
		e.waitQueued("b", 1)
		f.Down.Store(true)
		la, lb := e.Granted(wa), e.Granted(wb)
		if la.Token() <= l.Parts()[0].Token || lb.Token() <= l.Parts()[1].Token {
			t.Fatalf("tokens after the crash %d, %d; crashed holder's %+v", la.Token(), lb.Token(), l.Parts())
		}
		select {
		case <-l.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the crashed holder's lease did not end")
		}
		e.Release(la)
		e.Release(lb)
	})
}

// A multi waiter that dies leaves every queue after the waiter TTL, even
// when only the waiters of its other semaphore are alive to notice.
func TestWaiterCrash(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		held := e.hold(e.Client(), one("a"))
		c, f := e.FaultyClient(fairlock.WithWaiterTTL(200 * time.Millisecond))
		dead := fltest.Async(func() (*fairlock.Lease, error) { return multilock.Lock(ctx, c, "a", "b") })
		e.waitQueued("b", 1)
		wb := fltest.Async(func() (*fairlock.Lease, error) { return e.Client().Acquire(ctx, one("b")) })
		e.waitQueued("b", 2)
		f.Down.Store(true)
		e.Release(e.Granted(wb)) // b is free, so its waiter is granted once the dead one is gone
		if st := e.status("a"); len(st.Waiters) != 0 {
			t.Fatalf("a still queues the dead multi waiter: %+v", st.Waiters)
		}
		e.Release(held)
		select {
		case r := <-dead:
			if r.Err == nil {
				t.Fatal("a multi-lock cut off from Redis was granted")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the cut-off multi-lock did not give up")
		}
	})
}

func TestBadRequests(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		held, err := c.Acquire(ctx, fairlock.Request{Name: "x", Capacity: 2, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		many := make([]string, fairlock.MaxResources+1)
		for i := range many {
			many[i] = fmt.Sprint("r", i)
		}
		for _, tc := range []struct {
			name string
			reqs []fairlock.Request
			want error
		}{
			{"empty", nil, fairlock.ErrInvalidArgument},
			{"duplicate", []fairlock.Request{one("a"), one("b"), one("a")}, fairlock.ErrInvalidArgument},
			{"too many", func() (r []fairlock.Request) {
				for _, n := range many {
					r = append(r, one(n))
				}
				return r
			}(), fairlock.ErrInvalidArgument},
			{"permits above capacity", []fairlock.Request{one("a"), {Name: "b", Capacity: 2, Permits: 3}}, fairlock.ErrInvalidArgument},
			{"zero permits", []fairlock.Request{one("a"), {Name: "b", Capacity: 2}}, fairlock.ErrInvalidArgument},
			{"bad name", []fairlock.Request{one("a"), one("")}, fairlock.ErrInvalidName},
			{"capacity mismatch", []fairlock.Request{one("a"), {Name: "x", Capacity: 3, Permits: 1}}, fairlock.ErrCapacityMismatch},
		} {
			_, err := multilock.Acquire(ctx, c, tc.reqs...)
			fltest.IsErr(t, tc.name, err, tc.want)
			_, err = multilock.TryAcquire(ctx, c, tc.reqs...)
			fltest.IsErr(t, tc.name+" (try)", err, tc.want)
		}
		_, err = multilock.Acquire(ctx, c, one("a"), fairlock.Request{Name: "x", Capacity: 3, Permits: 1})
		if !strings.Contains(fmt.Sprint(err), `capacity of "x" is 2`) {
			t.Fatalf("capacity mismatch error %q does not name the semaphore and its capacity", err)
		}
		if _, err := multilock.Acquire(ctx, nil, one("a")); err == nil {
			t.Fatal("nil client accepted")
		}
		// Nothing was left behind by the failed calls.
		if st := e.status("a"); len(st.Waiters)+len(st.Holders) != 0 {
			t.Fatalf("a after failed requests: %+v", st)
		}
		e.Release(held)
	})
}

// On Redis Cluster, semaphores locked together must share a slot; the
// check runs before anything is sent.
func TestCrossSlot(t *testing.T) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer rdb.Close()
	c, err := fairlock.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = multilock.Lock(context.Background(), c, "acct:1", "acct:2")
	fltest.IsErr(t, "cross-slot multi-lock", err, fairlock.ErrCrossSlot)
	if !strings.Contains(err.Error(), "hash tag") {
		t.Fatalf("error %q does not say how to co-locate", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = multilock.TryAcquire(ctx, c, one("{acct}:1"), one("{acct}:2"))
	if err == nil || strings.Contains(err.Error(), "slot") {
		t.Fatalf("hash-tagged names: %v, want only a connection error", err)
	}
}

// A multi-lock that fits everywhere still waits behind an earlier request
// on any of its semaphores: it does not barge.
func TestNoBarging(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		b2 := func(n int64) fairlock.Request { return fairlock.Request{Name: "b", Capacity: 2, Permits: n} }
		holdA := e.hold(e.Client(), one("a"))
		holdB := e.hold(e.Client(), b2(1))
		big := fltest.Async(func() (*fairlock.Lease, error) { return e.Client().Acquire(ctx, b2(2)) })
		e.waitQueued("b", 1)
		multi := fltest.Async(func() (*fairlock.Lease, error) { return multilock.Acquire(ctx, e.Client(), one("a"), b2(1)) })
		e.waitQueued("b", 2)
		e.Release(holdA) // the multi-lock now fits in a and in b, but b's head is big
		e.WaitFor("a's holder gone", func() bool { return e.status("a").InUse == 0 })
		e.NotYet(multi, "multi-lock behind a larger request for b")
		e.Release(holdB)
		l := e.Granted(big)
		e.NotYet(multi, "multi-lock while b is full")
		e.Release(l)
		e.Release(e.Granted(multi))
	})
}

// The mutex verbs: TryLock locks every mutex or none, DoLock runs f under
// all of them.
func TestLockVerbs(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		held, err := multilock.TryLock(ctx, c, "a")
		if err != nil {
			t.Fatalf("TryLock(a) = %v", err)
		}
		_, err = multilock.TryLock(ctx, e.Client(), "b", "a")
		fltest.IsErr(t, "TryLock(b, a) while a is held", err, fairlock.ErrNotAcquired)
		if st := e.status("b"); st.InUse != 0 || len(st.Waiters) != 0 {
			t.Fatalf("b after a refused TryLock: %+v, want untouched", st)
		}
		e.Release(held)
		ran := false
		err = multilock.DoLock(ctx, c, []string{"b", "a"}, func(ctx context.Context) error {
			ran = true
			for _, name := range []string{"a", "b"} {
				if st := e.status(name); st.InUse != 1 {
					return fmt.Errorf("%s in use %d inside DoLock", name, st.InUse)
				}
			}
			return nil
		})
		if err != nil || !ran {
			t.Fatalf("DoLock = %v (ran %v)", err, ran)
		}
		for _, name := range []string{"a", "b"} {
			if st := e.status(name); st.InUse != 0 {
				t.Fatalf("%s in use %d after DoLock", name, st.InUse)
			}
		}
	})
}

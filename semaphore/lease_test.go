package semaphore_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// waitDone waits for a lease's Done channel.
func (e *env) waitDone(l *fairlock.Lease) {
	e.t.Helper()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		e.t.Fatal("lease Done not closed within 10s")
	}
}

// Semantics 4: a held lease is renewed past its TTL.
func TestLeaseRenewedWhileHeld(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		const ttl = 150 * time.Millisecond
		l, err := e.sem(e.Client(fairlock.WithLeaseTTL(ttl)), "renew", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * ttl)
		if _, err := e.sem(e.Client(), "renew", 1).TryAcquire(ctx, 1); !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire while renewed = %v, want ErrNotAcquired", err)
		}
		if err := l.Err(); err != nil {
			t.Fatalf("Err() of a held lease = %v", err)
		}
		e.Release(l)
		fltest.IsErr(t, "Err() after Release", l.Err(), fairlock.ErrNotHeld)
	})
}

// Semantics 4: a lease that expired by Redis's clock is reported lost by
// Done, Err and Release, and renewal never brings it back.
func TestLeaseExpiredIsLost(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := newEnv(t, b)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	a := e.sem(e.Client(fairlock.WithLeaseTTL(ttl)), "lost", 1)
	l, err := a.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b.Advance(t, ttl) // expiry <= now: gone
	e.waitDone(l)
	fltest.IsErr(t, "Err() after expiry", l.Err(), fairlock.ErrLeaseLost)
	// Nobody holds it now, and the old holder's renewals did not revive it.
	next, err := e.sem(e.Client(), "lost", 1).TryAcquire(ctx, 1)
	if err != nil {
		t.Fatalf("TryAcquire after expiry: %v", err)
	}
	if next.Token() <= l.Token() {
		t.Fatalf("token after takeover %d <= lost holder's %d", next.Token(), l.Token())
	}
	fltest.IsErr(t, "Release of an expired lease", l.Release(ctx), fairlock.ErrLeaseLost)
	fltest.IsErr(t, "second Release", l.Release(ctx), fairlock.ErrNotHeld)
	e.Release(next)
}

// Semantics 4: renewal stops before Release returns.
func TestNoRenewalAfterRelease(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		cnt := newCounter()
		rdb := b.Client(t)
		redistest.AddHook(t, rdb, cnt)
		const ttl = 30 * time.Millisecond
		l, err := e.sem(e.ClientOn(rdb, fairlock.WithLeaseTTL(ttl)), "stop", 1).Acquire(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		e.WaitFor("two renewals", func() bool { return cnt.get("script:renew") >= 2 })
		e.Release(l)
		after := cnt.get("script:renew")
		time.Sleep(5 * ttl)
		if got := cnt.get("script:renew"); got != after {
			t.Fatalf("%d renewals after Release returned", got-after)
		}
	})
}

// Semantics 5: a crashed holder's permits pass to the next waiter when its
// lease expires, with nobody releasing and the waiter not polling (its
// liveness refresh is an hour away).
func TestHolderCrash(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		holder, f := e.FaultyClient(fairlock.WithLeaseTTL(ttl))
		l, err := e.sem(holder, "crash", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		ch := acquireAsync(ctx, e.sem(e.Client(fairlock.WithWaiterTTL(time.Hour)), "crash", 1), 1)
		e.waitQueued("crash", 1)
		f.Down.Store(true) // the holder's process dies
		r := e.receive(ch)
		if r.err != nil {
			t.Fatalf("waiter after holder crash: %v", r.err)
		}
		if r.lease.Token() <= l.Token() {
			t.Fatalf("new token %d <= crashed holder's %d", r.lease.Token(), l.Token())
		}
		e.Release(r.lease)
	})
}

// Semantics 6: a waiter whose context ends leaves the queue at once.
func TestCancelLeavesQueue(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		held, err := e.sem(e.Client(), "cancel", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		s := e.sem(e.Client(), "cancel", 1)
		cctx, cancel := context.WithCancel(ctx)
		ch := acquireAsync(cctx, s, 1)
		e.waitQueued("cancel", 1)
		cancel()
		r := e.receive(ch)
		fltest.IsErr(t, "Acquire after cancel", r.err, context.Canceled)
		if n, _ := e.rdb.ZCard(ctx, e.key("cancel", "q")).Result(); n != 0 {
			t.Fatalf("queue length after cancel = %d, want 0", n)
		}
		dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer dcancel()
		_, err = s.Acquire(dctx, 1)
		fltest.IsErr(t, "Acquire past its deadline", err, context.DeadlineExceeded)
		if n, _ := e.rdb.ZCard(ctx, e.key("cancel", "q")).Result(); n != 0 {
			t.Fatalf("queue length after deadline = %d, want 0", n)
		}
		// A done context fails even where permits are free.
		e.Release(held)
		_, err = s.Acquire(cctx, 1)
		fltest.IsErr(t, "Acquire with a done context", err, context.Canceled)
	})
}

// Semantics 6: a grant that races a cancellation is handed to the next
// waiter. The first waiter's process is held before it reads its wake-up,
// so the grant lands while it still waits; then its context ends.
func TestCancelRacingGrantHandsOn(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		held, err := e.sem(e.Client(), "race", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Hour-long TTLs: only the hand-on can free a grant it never hears of.
		c1, f := e.FaultyClient(fairlock.WithWaiterTTL(time.Hour), fairlock.WithLeaseTTL(time.Hour))
		undo := f.Deafen(t)
		cctx, cancel := context.WithCancel(ctx)
		first := acquireAsync(cctx, e.sem(c1, "race", 1), 1)
		e.waitQueued("race", 1)
		second := acquireAsync(ctx, e.sem(e.Client(), "race", 1), 1)
		e.waitQueued("race", 2)
		e.Release(held)
		e.waitQueued("race", 1) // granted to the first, which has not heard
		cancel()
		r1 := e.receive(first)
		fltest.IsErr(t, "cancelled Acquire", r1.err, context.Canceled)
		r2 := e.receive(second)
		if r2.err != nil {
			t.Fatalf("second waiter: %v", r2.err)
		}
		undo()
		e.Release(r2.lease)
	})
}

// Semantics 6: waiters whose process died are dropped after one waiter
// TTL, all at once: survivors wait one TTL, not one per dead waiter, even
// when the grant reaches a dead waiter first. Redis's clock is frozen and
// moved exactly one waiter TTL, so a per-waiter delay could not pass.
func TestDeadWaitersCostOneTTL(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := newEnv(t, b)
	ctx := context.Background()
	held, err := e.sem(e.Client(), "dead", 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	const wttl = 500 * time.Millisecond
	const dead = 5
	var cut []*redistest.Faults
	for i := range dead {
		c, f := e.FaultyClient(fairlock.WithWaiterTTL(wttl), fairlock.WithLeaseTTL(time.Hour))
		cut = append(cut, f)
		_ = acquireAsync(ctx, e.sem(c, "dead", 1), 1)
		e.waitQueued("dead", int64(i+1))
	}
	live := acquireAsync(ctx, e.sem(e.Client(fairlock.WithWaiterTTL(time.Hour)), "dead", 1), 1)
	e.waitQueued("dead", dead+1)
	for _, f := range cut {
		f.Down.Store(true)
	}
	e.Release(held) // hands the permit to the first dead waiter
	e.notYet(live, "the live waiter, behind dead ones")
	b.Advance(t, wttl)
	r := e.receive(live)
	if r.err != nil {
		t.Fatalf("live waiter: %v", r.err)
	}
	e.Release(r.lease)
}

// Semantics 6: a dead process's announced grant expires after one waiter
// TTL, with real time and no clock moves.
func TestGrantToDeadWaiterExpires(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		held, err := e.sem(e.Client(), "gd", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		c, f := e.FaultyClient(fairlock.WithWaiterTTL(200*time.Millisecond), fairlock.WithLeaseTTL(time.Hour))
		_ = acquireAsync(ctx, e.sem(c, "gd", 1), 1)
		e.waitQueued("gd", 1)
		live := acquireAsync(ctx, e.sem(e.Client(fairlock.WithWaiterTTL(time.Hour)), "gd", 1), 1)
		e.waitQueued("gd", 2)
		f.Down.Store(true)
		e.Release(held)
		r := e.receive(live)
		if r.err != nil {
			t.Fatalf("live waiter: %v", r.err)
		}
		e.Release(r.lease)
	})
}

// slowAcquire is a go-redis hook that holds "acquire" scripts back while
// armed, so that other commands of the same client overtake them.
type slowAcquire struct{ delay atomic.Int64 }

func (s *slowAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *slowAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (s *slowAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if d := s.delay.Load(); d > 0 && slices.Contains(cmd.Args(), any("acquire")) {
			time.Sleep(time.Duration(d))
		}
		return next(ctx, cmd)
	}
}

// Regression: a liveness refresh that reached Redis before a waiter's own
// acquire script reported the new ticket gone. The waiter then queued again
// under another ticket, behind its own ghost, which could later be granted
// and hold the permits for a waiter TTL while nobody used them.
func TestRefreshIgnoresTicketsNotYetQueued(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		held, err := e.sem(e.Client(), "ghost", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		cnt, slow := newCounter(), &slowAcquire{}
		rdb := b.Client(t)
		redistest.AddHook(t, rdb, cnt)
		redistest.AddHook(t, rdb, slow)
		const wttl = 150 * time.Millisecond // refreshes every 50ms
		s := e.sem(e.ClientOn(rdb, fairlock.WithWaiterTTL(wttl)), "ghost", 1)
		first := acquireAsync(ctx, s, 1)
		e.waitQueued("ghost", 1) // the room now refreshes on its own
		slow.delay.Store(int64(wttl))
		second := acquireAsync(ctx, s, 1)
		e.waitQueued("ghost", 2)
		slow.delay.Store(0)
		time.Sleep(wttl) // room for more refreshes, and for a re-queue
		if got := cnt.get("script:acquire"); got != 2 {
			t.Fatalf("two waiters ran %d acquire scripts: one was queued again", got)
		}
		if n, _ := e.rdb.ZCard(ctx, e.key("ghost", "q")).Result(); n != 2 {
			t.Fatalf("queue length %d, want 2", n)
		}
		e.Release(held)
		for _, ch := range []<-chan result{first, second} {
			r := e.receive(ch)
			if r.err != nil {
				t.Fatal(r.err)
			}
			e.Release(r.lease)
		}
	})
}

package fairlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/statecheck"
)

// mutexTTL is the request for the mutex name with lease TTL ttl (0: the
// client's).
func mutexTTL(name string, ttl time.Duration) fairlock.Request {
	return fairlock.Request{Name: name, Capacity: 1, Permits: 1, LeaseTTL: ttl}
}

// grantTTL returns how long after l's grant Redis expires its lease on
// name, by Redis's clock (frozen: the lease was not renewed since, or
// renewed at the grant's instant).
func grantTTL(t *testing.T, e *fltest.Env, name string, token int64) time.Duration {
	t.Helper()
	return time.Duration(expiryMs(t, e, name)-token/1000) * time.Millisecond
}

// ttlRenewals counts a client's LeaseRenewed events.
type ttlRenewals struct{ n atomic.Int64 }

func (r *ttlRenewals) Observe(e fairlock.Event) {
	if e.Kind == fairlock.LeaseRenewed {
		r.n.Add(1)
	}
}

// A request's lease TTL is the one Redis keeps its lease for, on every
// path that grants one: at once (Acquire, TryAcquire, AcquireAll, whose
// lease takes the shortest TTL of its parts) and through the queue (a
// grant announced on a wake-up lasts the shorter of the lease and waiter
// TTLs until its first renewal). Lease.Expiry and Status follow it; and
// when the client is abandoned, each lease lapses at its own TTL by
// Redis's clock, the default-TTL one not before the client's TTL. The
// clock is frozen: exact.
func TestRequestLeaseTTLFrozen(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	c := e.Client() // the default lease TTL, 10s
	const short = time.Second
	if c.LeaseTTL() != fairlock.DefaultLeaseTTL {
		t.Fatalf("client's TTL %v, want the default", c.LeaseTTL())
	}

	s, err := c.Acquire(ctx, mutexTTL("short", short))
	if err != nil {
		t.Fatal(err)
	}
	if got := grantTTL(t, e, "short", s.Token()); got != short {
		t.Errorf("Acquire with LeaseTTL %v: Redis keeps the lease %v", short, got)
	}
	if in := time.Until(s.Expiry()); in > short || in < short/2 {
		t.Errorf("Expiry() in %v, want about %v", in, short)
	}
	st, err := c.Status(ctx, "short")
	if err != nil || len(st.Holders) != 1 {
		t.Fatalf("Status = %+v, %v", st, err)
	}
	if in := st.Holders[0].ExpiresIn; in != short {
		t.Errorf("Status: the lease expires in %v, want %v", in, short)
	}

	long, err := c.TryAcquire(ctx, mutexTTL("long", 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := grantTTL(t, e, "long", long.Token()); got != fairlock.DefaultLeaseTTL {
		t.Errorf("TryAcquire with LeaseTTL 0: Redis keeps the lease %v, want the client's %v", got, fairlock.DefaultLeaseTTL)
	}
	tried, err := c.TryAcquire(ctx, mutexTTL("tried", 2*short))
	if err != nil {
		t.Fatal(err)
	}
	if got := grantTTL(t, e, "tried", tried.Token()); got != 2*short {
		t.Errorf("TryAcquire with LeaseTTL %v: Redis keeps the lease %v", 2*short, got)
	}

	// A lease over several semaphores takes its parts' shortest TTL.
	all, err := c.AcquireAll(ctx, mutexTTL("m1", 0), mutexTTL("m2", 3*short), mutexTTL("m3", 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, pt := range all.Parts() {
		if got := grantTTL(t, e, pt.Name, pt.Token); got != 3*short {
			t.Errorf("AcquireAll part %s: Redis keeps the lease %v, want the shortest part's %v", pt.Name, got, 3*short)
		}
	}

	// Through the queue: granted on a wake-up, for the shorter of the
	// lease TTL (2s) and the waiter TTL (3s), then renewed for 2s.
	h, err := c.Acquire(ctx, mutexTTL("q", 0))
	if err != nil {
		t.Fatal(err)
	}
	waiter := e.Client()
	ch := fltest.Async(func() (*fairlock.Lease, error) { return waiter.Acquire(ctx, mutexTTL("q", 2*short)) })
	e.WaitQueued("q", 1)
	e.Release(h)
	q := e.Granted(ch)
	if got := grantTTL(t, e, "q", q.Token()); got != 2*short {
		t.Errorf("a grant through the queue with LeaseTTL %v: Redis keeps the lease %v", 2*short, got)
	}
	e.Release(q)

	if err := c.Abandon(); err != nil {
		t.Fatal(err)
	}
	other := e.Client()
	busy := func(name string, want bool) {
		t.Helper()
		l, err := other.TryAcquire(ctx, mutexTTL(name, 0))
		switch {
		case want && !errors.Is(err, fairlock.ErrNotAcquired):
			t.Fatalf("TryAcquire(%s) = %v, want ErrNotAcquired: the abandoned lease should still hold it", name, err)
		case !want && err != nil:
			t.Fatalf("TryAcquire(%s) = %v: the abandoned lease should have lapsed", name, err)
		case !want:
			e.Release(l)
		}
	}
	busy("short", true)
	b.Advance(t, short-time.Millisecond)
	busy("short", true)
	b.Advance(t, time.Millisecond)
	busy("short", false)
	busy("tried", true)
	busy("long", true)
	b.Advance(t, short)
	busy("tried", false)
	busy("m1", true)
	b.Advance(t, short)
	busy("m1", false)
	busy("m3", false)
	busy("long", true)
	b.Advance(t, fairlock.DefaultLeaseTTL-3*short-time.Millisecond)
	busy("long", true)
	b.Advance(t, time.Millisecond)
	busy("long", false)
}

// A waiter queued with a lease TTL of its own is refreshed as the member
// it queued as (the member holds the TTL): however long it waits, the
// queue holds it once, its process's liveness deadline moves on (a
// refresh naming another member finds it gone), and its grant has its
// TTL. The clock is frozen: the refreshes run on the local clock, each
// moving the deadline to Redis's now plus the waiter TTL.
func TestRequestLeaseTTLWaiterRefreshed(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	const ttl = 2 * time.Second
	holder := e.Client()
	h, err := holder.Acquire(ctx, mutexTTL("w", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	c := e.Client(fairlock.WithWaiterTTL(300 * time.Millisecond))
	ch := fltest.Async(func() (*fairlock.Lease, error) { return c.Acquire(ctx, mutexTTL("w", ttl)) })
	e.WaitQueued("w", 1)
	deadlines := func() []string {
		t.Helper()
		m, err := e.RDB.ZRange(ctx, e.Key("w", "q"), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	first := deadlines()
	if len(first) != 1 || !strings.Contains(first[0], " 2000 ") {
		t.Fatalf("waiters %q: want one member with lease TTL 2000 ms", first)
	}
	// Its process's liveness deadline (statecheck.WaiterDeadline).
	deadline := func() int64 {
		t.Helper()
		st, err := e.RDB.HGetAll(ctx, e.Key("w", "s")).Result()
		if err != nil {
			t.Fatal(err)
		}
		seq, err := e.RDB.ZScore(ctx, e.Key("w", "q"), first[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		at, _ := statecheck.WaiterDeadline(st, first[0], int64(seq))
		return at
	}
	start := deadline()
	// Several refreshes (every 100ms), Redis's clock moving on between
	// them by less than the waiter TTL each time.
	for i := range 5 {
		b.Advance(t, 200*time.Millisecond)
		e.WaitFor("a refresh to move the waiter's deadline", func() bool { return deadline() > start+int64(200*i) })
	}
	if got := deadlines(); len(got) != 1 || got[0] != first[0] {
		t.Fatalf("after the refreshes the waiters are %q, want %q alone (a refresh naming another member than the one it queued as finds it gone)", got, first)
	}
	e.NotYet(ch, "Acquire while the mutex is held")

	// A second waiter with another TTL of its own, whose wait ends: it
	// leaves the queue at once (its withdrawal names its member).
	wctx, cancel := context.WithCancel(ctx)
	left := fltest.Async(func() (*fairlock.Lease, error) { return c.Acquire(wctx, mutexTTL("w", 5*time.Second)) })
	e.WaitQueued("w", 2)
	cancel()
	if r := e.Receive(left); !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("cancelled Acquire = %v, %v", r.Lease, r.Err)
	}
	if got := deadlines(); len(got) != 1 || got[0] != first[0] {
		t.Fatalf("after the second waiter left, the waiters are %q, want %q alone", got, first)
	}

	e.Release(h)
	l := e.Granted(ch)
	if got := grantTTL(t, e, "w", l.Token()); got != 300*time.Millisecond {
		// (Announced: the shorter of the lease and the waiter TTLs.)
		t.Errorf("announced grant kept %v, want the waiter TTL 300ms", got)
	}
	// Its first renewal (a third of the 300ms left) gives it its own TTL.
	e.WaitFor("the grant's first renewal", func() bool { return grantTTL(t, e, "w", l.Token()) == ttl })
	e.Release(l)
}

// A lease with a short TTL of its own, on a client with the default
// TTL, is renewed on its own cadence (a third of its TTL) and stays held
// for many times its TTL, alone and as part of a lease over several
// semaphores; Status shows it expiring within its TTL.
func TestRequestLeaseTTLRenewed(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const ttl = 600 * time.Millisecond
		renewed := new(ttlRenewals)
		c := e.Client(fairlock.WithObserver(renewed))
		l, err := c.Acquire(ctx, mutexTTL("one", ttl))
		if err != nil {
			t.Fatal(err)
		}
		all, err := c.AcquireAll(ctx, mutexTTL("a", ttl), mutexTTL("b", 0))
		if err != nil {
			t.Fatal(err)
		}
		// Each renews about every 200ms: ten renewals of the two in
		// about a second; with the client's TTL (10s), two in 5s.
		start := time.Now()
		for renewed.n.Load() < 10 && time.Since(start) < 5*time.Second {
			time.Sleep(10 * time.Millisecond)
		}
		held := time.Since(start)
		if n := renewed.n.Load(); n < 10 {
			t.Errorf("%d renewals in %v of two leases with TTL %v, want 10 in about a second", n, held, ttl)
		}
		for _, x := range []*fairlock.Lease{l, all} {
			if err := x.Err(); err != nil {
				t.Fatalf("%s: Err() after %v with LeaseTTL %v = %v", x.Name(), held, ttl, err)
			}
		}
		other := e.Client()
		for _, name := range []string{"one", "a", "b"} {
			if _, err := other.TryAcquire(ctx, mutexTTL(name, 0)); !errors.Is(err, fairlock.ErrNotAcquired) {
				t.Fatalf("TryAcquire(%s) while renewed = %v, want ErrNotAcquired", name, err)
			}
			st, err := other.Status(ctx, name)
			if err != nil || len(st.Holders) != 1 {
				t.Fatalf("Status(%s) = %+v, %v", name, st, err)
			}
			if in := st.Holders[0].ExpiresIn; in > ttl {
				t.Errorf("Status(%s): expires in %v, past the lease's TTL %v", name, in, ttl)
			}
		}
		e.Release(l)
		e.Release(all)
	})
}

// Abandoned, a client's lease with a short TTL of its own lapses at that
// TTL by Redis's clock, while its lease with the client's TTL holds on:
// real time, on both servers.
func TestRequestLeaseTTLAbandonLapses(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const ttl = 300 * time.Millisecond
		c := e.Client() // the default lease TTL, 10s
		s, err := c.Acquire(ctx, mutexTTL("short", ttl))
		if err != nil {
			t.Fatal(err)
		}
		long, err := c.Acquire(ctx, mutexTTL("long", 0))
		if err != nil {
			t.Fatal(err)
		}
		abandoned := time.Now()
		if err := c.Abandon(); err != nil {
			t.Fatal(err)
		}
		for _, l := range []*fairlock.Lease{s, long} {
			fltest.IsErr(t, l.Name()+": Err() after Abandon", l.Err(), fairlock.ErrClosed)
		}
		other := e.Client()
		var freed time.Duration
		for {
			l, err := other.TryAcquire(ctx, mutexTTL("short", 0))
			if err == nil {
				freed = time.Since(abandoned)
				e.Release(l)
				break
			}
			if !errors.Is(err, fairlock.ErrNotAcquired) {
				t.Fatal(err)
			}
			if time.Since(abandoned) > 3*time.Second {
				t.Fatalf("the abandoned lease with LeaseTTL %v still held 3s after Abandon", ttl)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if freed > ttl+time.Second {
			t.Errorf("the abandoned lease with LeaseTTL %v lapsed %v after Abandon", ttl, freed)
		}
		if _, err := other.TryAcquire(ctx, mutexTTL("long", 0)); !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire(long) %v after Abandon = %v, want ErrNotAcquired: the client's TTL is 10s", time.Since(abandoned), err)
		}
		st, err := other.Status(ctx, "long")
		if err != nil || len(st.Holders) != 1 {
			t.Fatalf("Status(long) = %+v, %v", st, err)
		}
		if in := st.Holders[0].ExpiresIn; in < fairlock.DefaultLeaseTTL-3*time.Second {
			t.Errorf("the abandoned lease with the client's TTL expires in %v, want about %v", in, fairlock.DefaultLeaseTTL)
		}
		// (Released, so that the test's clean-up finds the keys idle.)
		_ = long.Release(ctx)
	})
}

// A lease TTL out of range is refused before anything is sent, by every
// acquisition, with ErrInvalidArgument naming Request.LeaseTTL; nothing
// is written.
func TestRequestLeaseTTLRefused(t *testing.T) {
	e := fltest.New(t, redistest.Mini(t))
	ctx := fltest.Bounded(t) // (an accepted bad TTL would leave a lease that blocks the next call)
	c := e.Client()
	for _, d := range []time.Duration{-time.Second, -1, time.Nanosecond, 9 * time.Millisecond, fairlock.MaxTTL + 1} {
		req := mutexTTL("bad", d)
		calls := map[string]func() (*fairlock.Lease, error){
			"Acquire":       func() (*fairlock.Lease, error) { return c.Acquire(ctx, req) },
			"TryAcquire":    func() (*fairlock.Lease, error) { return c.TryAcquire(ctx, req) },
			"AcquireAll":    func() (*fairlock.Lease, error) { return c.AcquireAll(ctx, mutexTTL("ok", 0), req) },
			"TryAcquireAll": func() (*fairlock.Lease, error) { return c.TryAcquireAll(ctx, req, mutexTTL("ok", 0)) },
		}
		for name, call := range calls {
			l, err := call()
			if l != nil || !errors.Is(err, fairlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "Request.LeaseTTL") {
				t.Errorf("%s with LeaseTTL %v = %v, %v; want ErrInvalidArgument naming Request.LeaseTTL", name, d, l, err)
			}
		}
	}
	if keys := e.Keys(); len(keys) != 0 {
		t.Errorf("refused requests wrote %q", keys)
	}
	// The bounds themselves are accepted. A 10 ms lease may be lost
	// before its release on a busy machine (under -race, an acquire
	// answered after 3.3 ms has its first renewal due at once, which must
	// be answered within the 6.7 ms left): lost is an answer here, as
	// released is.
	for _, d := range []time.Duration{10 * time.Millisecond, fairlock.MaxTTL} {
		l, err := c.Acquire(ctx, mutexTTL("edge", d))
		if err != nil {
			t.Fatalf("Acquire with LeaseTTL %v = %v", d, err)
		}
		if err := l.Release(ctx); err != nil && (d == fairlock.MaxTTL || !errors.Is(err, fairlock.ErrLeaseLost)) {
			t.Fatalf("Release of a lease with LeaseTTL %v = %v", d, err)
		}
	}
}

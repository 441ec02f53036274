package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Semantics 3: waiting never delays renewals or
// releases. One process waits on 1,000 semaphores, held by another,
// through a go-redis pool of 10 connections, and then takes a few leases
// with a 3 s TTL through the same pool: every lease must stay alive for
// two TTLs while the waiters wait, and on until every waiter has been
// granted (and released its grant) once the other process lets go. A
// blocking read per semaphore on the caller's pool would take all ten
// connections and starve the renewals for good: each read holds its
// connection for up to a second and queues for one again, so a renewal
// (or the acquire itself) waits behind hundreds of them and the lease ends
// at its first deadline, whatever its TTL. The TTL only sets how long a
// stall of the whole machine the leases ride out: on a busy 2-core machine
// this test's process can go without CPU for over half a second, and
// miniredis, which serves in the test's process, for over a second (the
// pool idle all the while). The waiters' grants last as long as their
// tickets (a minute): when a thousand wake-ups come at once on a busy
// machine, some are heard a second or two after their grant, and a grant
// that lasted no longer would be taken with milliseconds left and lost
// before its release lands, whatever the pool does. The held leases come
// from a second client on the same pool, so that their TTL can differ.
//
// miniredis sorts all its keys on every command, also inside scripts, so
// with 1,000 semaphores (5,000 keys) one script takes it 15-25 ms and the
// server, not the client, misses the renewals' deadlines (profiled). On
// miniredis the process therefore waits on 100 semaphores: still ten times
// the pool. The test also spares both servers load that plays no part in
// the rule: the other process's leases last an hour, the waiters' TTL is
// a minute (one refresh per room per 20 s, none while the test runs), each
// waiter releases its grant at once, and the short-TTL leases are taken
// once the burst of acquire scripts has been served.
func TestWaitingDoesNotStarveRenewals(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	// Scripts as the library runs them, as when this test lived in
	// semaphore/, without the half-run checker the package's TestMain
	// sets: the rule tested is the listener's, and the checker's
	// instrumented scripts only add to the load on Redis that the
	// leases' renewals must get through.
	fairlock.NoTransform(t)
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		const held, leaseTTL, waiterTTL = 3, 3 * time.Second, time.Minute
		waiting := 1000
		if b.Mini != nil {
			// miniredis runs every script on one interpreter, far slower
			// under the race detector.
			waiting = 100
		}
		e := fltest.New(t, b)
		ctx := context.Background()
		name := func(i int) string { return fmt.Sprintf("busy%d", i) }

		other := e.Client(fairlock.WithLeaseTTL(time.Hour))
		start := time.Now()
		blockers := make([]*fairlock.Lease, waiting)
		for i := range blockers {
			l, err := newSem(other, name(i), 1).Acquire(ctx, 1)
			if err != nil {
				t.Fatalf("other process, %s: %v", name(i), err)
			}
			blockers[i] = l
		}
		t.Logf("%s: the other process took %d semaphores in %v", b.Name, waiting, time.Since(start))

		rdb := b.Client(t, func(o *redis.Options) { o.PoolSize = 10 })
		c := e.ClientOn(rdb, fairlock.WithLeaseTTL(waiterTTL), fairlock.WithWaiterTTL(waiterTTL))
		mine := e.ClientOn(rdb, fairlock.WithLeaseTTL(leaseTTL))

		start = time.Now()
		wctx, cancel := context.WithCancel(ctx)
		results := make(chan error, waiting)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }() // on failure, end the waits
		for i := range waiting {
			s := newSem(c, name(i), 1)
			wg.Go(func() {
				l, err := s.Acquire(wctx, 1)
				if err == nil {
					err = l.Release(ctx)
				}
				results <- err
			})
		}
		// One KEYS counts the queues: a command per semaphore would cost
		// miniredis a sort of all its keys each. A queue exists while it
		// has a waiter.
		queued := func() (int, error) {
			ks, err := e.RDB.Keys(ctx, e.Prefix+"{busy*}:q").Result()
			return len(ks), err
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			n, err := queued()
			if err == nil && n == waiting {
				break
			}
			select {
			case err := <-results:
				t.Fatalf("a waiter returned before any release: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d waiters queued within 30s (%v)", n, waiting, err)
			}
		}
		t.Logf("%s: %d waiters queued in %v", b.Name, waiting, time.Since(start))

		leases := make([]*fairlock.Lease, held)
		for i := range leases {
			l, err := newSem(mine, fmt.Sprintf("mine%d", i), 1).Acquire(ctx, 1)
			if err != nil {
				t.Fatalf("held lease %d, taken while %d waiters wait: %v", i, waiting, err)
			}
			leases[i] = l
		}
		alive := func(when string) {
			t.Helper()
			for i, l := range leases {
				select {
				case <-l.Done():
					t.Fatalf("%s: held lease %d ended: %v", when, i, l.Err())
				default:
				}
			}
		}
		// Two lease TTLs with every waiter blocked: a lease whose renewals
		// cannot get through ends at its first deadline.
		for range 2 {
			time.Sleep(leaseTTL)
			alive(fmt.Sprintf("while %d waiters wait", waiting))
		}

		start = time.Now()
		for i, l := range blockers {
			if err := l.Release(ctx); err != nil {
				t.Fatalf("other process, release %s: %v", name(i), err)
			}
		}
		timeout := time.After(60 * time.Second)
		for done := 0; done < waiting; done++ {
			select {
			case err := <-results:
				if err != nil {
					t.Fatalf("waiter %d: %v", done, err)
				}
			case <-timeout:
				t.Fatalf("%d of %d waiters granted and released within 60s of the release", done, waiting)
			}
		}
		t.Logf("%s: %d waiters granted and released in %v after the other process began to release", b.Name, waiting, time.Since(start))
		alive("once every waiter is granted")
		for _, l := range leases {
			e.Release(l)
		}
	})
}

// blpops is a go-redis hook that counts blocking reads (BLPOP, BLMPOP): all, in flight, and timed
// out.
type blpops struct {
	seen, inFlight, timedOut atomic.Int64
	maxKeys                  atomic.Int64 // the most keys one read took
}

// keysOf returns the number of keys a BLPOP or BLMPOP takes.
func keysOf(cmd redis.Cmder) int64 {
	args := cmd.Args()
	if cmd.Name() == "blmpop" {
		n, _ := strconv.ParseInt(fmt.Sprint(args[2]), 10, 64)
		return n
	}
	return int64(len(args) - 2)
}

func (h *blpops) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *blpops) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *blpops) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "blpop" && cmd.Name() != "blmpop" {
			return next(ctx, cmd)
		}
		h.seen.Add(1)
		for n := keysOf(cmd); ; {
			if m := h.maxKeys.Load(); n <= m || h.maxKeys.CompareAndSwap(m, n) {
				break
			}
		}
		h.inFlight.Add(1)
		err := next(ctx, cmd)
		h.inFlight.Add(-1)
		if errors.Is(err, redis.Nil) {
			h.timedOut.Add(1)
		}
		return err
	}
}

// Semantics 3: a process that already blocks on one semaphore's wake list
// and starts waiting on another hears the new one's grant at once, not
// after its blocking read times out: the read is nudged when its keys
// change. Waiter TTLs of an hour leave the wake-up as the only way the
// grant can arrive.
func TestNewWaitJoinsBlockedRead(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		holder := e.Client(fairlock.WithLeaseTTL(time.Hour))
		la, err := newSem(holder, "a", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		lb, err := newSem(holder, "b", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		h := &blpops{}
		rdb := b.Client(t)
		hooked := redistest.AddHook[fairlock.Option](rdb, h)
		c := e.ClientOn(rdb, hooked, fairlock.WithWaiterTTL(time.Hour))
		wa := acquireAsync(ctx, newSem(c, "a", 1), 1)
		e.WaitQueued("a", 1)
		e.WaitFor("a blocking read", func() bool { return h.inFlight.Load() > 0 })
		before := h.timedOut.Load()

		wb := acquireAsync(ctx, newSem(c, "b", 1), 1)
		e.WaitQueued("b", 1)
		e.Release(lb)
		r := e.Receive(wb)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if n := h.timedOut.Load() - before; n != 0 {
			t.Fatalf("the grant of b was heard after %d blocking reads timed out; a new wait must join the blocked read at once", n)
		}
		e.Release(r.Lease)
		e.Release(la)
		r = e.Receive(wa)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		e.Release(r.Lease)
	})
}

// Semantics 3: a process's blocking reads never run on the go-redis client
// it gave fairlock, and one read covers every semaphore: waiting on 600
// semaphores on one node takes one blocking connection, outside the
// caller's pool, whose reads take two keys each (the process's wake list
// and its control list), so a wake-up costs Redis the same whatever the
// number of semaphores waited on.
func TestBlockingReadsOffTheCallersPool(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		n := 600 // more than one read covers on Cluster
		if testing.Short() || b.Mini != nil {
			n = 100
		}
		e := fltest.New(t, b)
		ctx := context.Background()
		holder := e.Client(fairlock.WithLeaseTTL(time.Hour))
		var held []*fairlock.Lease
		for i := range n {
			l, err := newSem(holder, fmt.Sprintf("s%d", i), 1).Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		caller, all, reads := &blpops{}, fltest.NewCounter(), &blpops{}
		rdb := b.Client(t)
		rdb.AddHook(caller)                                     // the caller's client only
		counted := redistest.AddHook[fairlock.Option](rdb, all) // and fairlock's blocking client
		// (Lease and waiter TTLs of an hour: the test counts blocking
		// reads, and the grants made at once wait their turn to be
		// released. A grant announced on a wake list lives a waiter TTL
		// until its process confirms it; on miniredis under the race
		// detector, with the machine's cores busy, the confirmations of
		// a hundred grants fell behind the default TTLs and a lease was
		// lost before its Release.)
		c := e.ClientOn(rdb, counted, redistest.AddHook[fairlock.Option](rdb, reads), fairlock.WithLeaseTTL(time.Hour), fairlock.WithWaiterTTL(time.Hour))
		var chs []<-chan fltest.Result
		for i := range n {
			chs = append(chs, acquireAsync(ctx, newSem(c, fmt.Sprintf("s%d", i), 1), 1))
		}
		for i := range n {
			e.WaitQueued(fmt.Sprintf("s%d", i), 1)
		}
		for _, l := range held {
			e.Release(l)
		}
		for _, ch := range chs {
			r := e.Receive(ch)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			e.Release(r.Lease)
		}
		peak, total := all.Peak(), all.Get("blpop")
		t.Logf("%s: %d BLPOPs for %d waiters, at most %d at once", b.Name, total, n, peak)
		if got := caller.seen.Load(); got != 0 {
			t.Fatalf("%d BLPOPs ran on the caller's client", got)
		}
		if peak != 1 {
			t.Fatalf("%d BLPOPs in flight at once for %d semaphores on one node, want 1", peak, n)
		}
		if k := reads.maxKeys.Load(); k != 2 {
			t.Fatalf("a blocking read took %d keys for %d semaphores on one node, want 2 (the process's wake list and its control list)", k, n)
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
		e := fltest.New(t, b)
		ctx := context.Background()
		s := newSem(e.Client(), "h", 1)
		held, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		cnt := fltest.NewCounter()
		wrdb := b.Client(t)
		counted := redistest.AddHook[fairlock.Option](wrdb, cnt)
		waiter := newSem(e.ClientOn(wrdb, counted, fairlock.WithWaiterTTL(time.Hour)), "h", 1)
		ch := acquireAsync(ctx, waiter, 1)
		e.WaitQueued("h", 1)
		e.Release(held)
		r := e.Receive(ch)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if got := cnt.Get("script:refresh"); got != 0 {
			t.Fatalf("waiter ran %d refreshes; the grant must come by wake-up alone", got)
		}
		e.Release(r.Lease)
	})
}

// Semantics 2: waiting costs Redis a few commands per liveness period per
// process, not a stream of retries.
func TestWaitingIsCheap(t *testing.T) {
	b := redistest.RealBackend(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	held, err := newSem(e.Client(), "cheap", 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	cnt := fltest.NewCounter()
	wrdb := b.Client(t)
	counted := redistest.AddHook[fairlock.Option](wrdb, cnt)
	const waiterTTL = 150 * time.Millisecond
	c := e.ClientOn(wrdb, counted, fairlock.WithWaiterTTL(waiterTTL))
	const waiters = 20
	ctxw, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = newSem(c, "cheap", 1).Acquire(ctxw, 1)
		}()
	}
	e.WaitQueued("cheap", waiters)
	before := cnt.Total()
	const periods = 10
	time.Sleep(periods * waiterTTL)
	used := cnt.Total() - before
	cancel()
	wg.Wait()
	e.Release(held)
	// Refreshes run every third of the TTL (30 commands here); the
	// blocking read's cycles, on the blocking client, count too. A refresh
	// delayed on a loaded machine brings the next one forward (the queue's
	// next event): 30-35 commands measured alone, up to 41 with the CI's
	// packages running beside it. Waiters that refreshed one by one, or
	// polled, would send hundreds.
	if limit := 5 * periods; used > limit {
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
		e := fltest.New(t, b)
		ctx := context.Background()
		cnt := fltest.NewCounter()
		rdb := b.Client(t, func(o *redis.Options) { o.PoolSize = 4 })
		counted := redistest.AddHook[fairlock.Option](rdb, cnt)
		s := newSem(e.ClientOn(rdb, counted), "pool", 2)
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
		if peak := cnt.Peak(); peak != 1 {
			t.Fatalf("%d BLPOPs in flight at once, want 1 (the counter must see the blocking client's)", peak)
		}
	})
}

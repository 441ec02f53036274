package fairlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Semantics 4: a held lease is renewed past its TTL.
func TestLeaseRenewedWhileHeld(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		// Renewed every 200 ms: past two TTLs only by renewals, and lost
		// only if this process cannot run for about 0.4 s (a 150 ms lease
		// was lost on a machine at load 6).
		const ttl = 600 * time.Millisecond
		l, err := newSem(e.Client(fairlock.WithLeaseTTL(ttl)), "renew", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * ttl)
		if _, err := newSem(e.Client(), "renew", 1).TryAcquire(ctx, 1); !errors.Is(err, fairlock.ErrNotAcquired) {
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
	e := fltest.New(t, b)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	a := newSem(e.Client(fairlock.WithLeaseTTL(ttl)), "lost", 1)
	l, err := a.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b.Advance(t, ttl) // expiry <= now: gone
	e.WaitDone(l)
	fltest.IsErr(t, "Err() after expiry", l.Err(), fairlock.ErrLeaseLost)
	// Nobody holds it now, and the old holder's renewals did not revive it.
	next, err := newSem(e.Client(), "lost", 1).TryAcquire(ctx, 1)
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
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		cnt := fltest.NewCounter()
		rdb := b.Client(t)
		hooked := redistest.AddHook[fairlock.Option](rdb, cnt)
		// Renewals come every ttl/3. The lease must outlive a process
		// starved of CPU for a while (a loaded CI machine, the race
		// detector): with a 30 ms TTL, a 100 ms stall ended it by its
		// deadline before any renewal was sent, and the test waited for
		// renewals that a lost lease never sends.
		const ttl = 600 * time.Millisecond
		l, err := newSem(e.ClientOn(rdb, hooked, fairlock.WithLeaseTTL(ttl)), "stop", 1).Acquire(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		e.WaitFor("two renewals", func() bool {
			if err := l.Err(); err != nil {
				t.Fatalf("the lease ended before two renewals: %v", err)
			}
			return renewCount(cnt) >= 2
		})
		e.Release(l)
		after := renewCount(cnt)
		time.Sleep(2 * ttl) // six renewal intervals
		if got := renewCount(cnt); got != after {
			t.Fatalf("%d renewals after Release returned", got-after)
		}
	})
}

// renewals counts the renewal scripts cnt saw: a lone lease's renewal goes
// as a batch of one (renew_batch), a multi-lease's as renew.
func renewCount(cnt *fltest.Counter) int {
	return cnt.Get("script:renew") + cnt.Get("script:renew_batch")
}

// Semantics 5: a crashed holder's permits pass to the next waiter when its
// lease expires, with nobody releasing and the waiter not polling (its
// liveness refresh is an hour away).
func TestHolderCrash(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		holder, f := e.FaultyClient(fairlock.WithLeaseTTL(ttl))
		l, err := newSem(holder, "crash", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		ch := acquireAsync(ctx, newSem(e.Client(fairlock.WithWaiterTTL(time.Hour)), "crash", 1), 1)
		e.WaitQueued("crash", 1)
		f.Down.Store(true) // the holder's process dies
		r := e.Receive(ch)
		if r.Err != nil {
			t.Fatalf("waiter after holder crash: %v", r.Err)
		}
		if r.Lease.Token() <= l.Token() {
			t.Fatalf("new token %d <= crashed holder's %d", r.Lease.Token(), l.Token())
		}
		e.Release(r.Lease)
	})
}

// Semantics 6: a waiter whose context ends leaves the queue at once.
func TestCancelLeavesQueue(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		held, err := newSem(e.Client(), "cancel", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		s := newSem(e.Client(), "cancel", 1)
		cctx, cancel := context.WithCancel(ctx)
		ch := acquireAsync(cctx, s, 1)
		e.WaitQueued("cancel", 1)
		cancel()
		r := e.Receive(ch)
		fltest.IsErr(t, "Acquire after cancel", r.Err, context.Canceled)
		if n, _ := e.RDB.ZCard(ctx, e.Key("cancel", "q")).Result(); n != 0 {
			t.Fatalf("queue length after cancel = %d, want 0", n)
		}
		dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer dcancel()
		_, err = s.Acquire(dctx, 1)
		fltest.IsErr(t, "Acquire past its deadline", err, context.DeadlineExceeded)
		if n, _ := e.RDB.ZCard(ctx, e.Key("cancel", "q")).Result(); n != 0 {
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
		e := fltest.New(t, b)
		ctx := context.Background()
		held, err := newSem(e.Client(), "race", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Hour-long TTLs: only the hand-on can free a grant it never hears of.
		c1, f := e.FaultyClient(fairlock.WithWaiterTTL(time.Hour), fairlock.WithLeaseTTL(time.Hour))
		undo := f.Deafen(t)
		cctx, cancel := context.WithCancel(ctx)
		first := acquireAsync(cctx, newSem(c1, "race", 1), 1)
		e.WaitQueued("race", 1)
		second := acquireAsync(ctx, newSem(e.Client(), "race", 1), 1)
		e.WaitQueued("race", 2)
		e.Release(held)
		e.WaitQueued("race", 1) // granted to the first, which has not heard
		cancel()
		r1 := e.Receive(first)
		fltest.IsErr(t, "cancelled Acquire", r1.Err, context.Canceled)
		r2 := e.Receive(second)
		if r2.Err != nil {
			t.Fatalf("second waiter: %v", r2.Err)
		}
		undo()
		e.Release(r2.Lease)
	})
}

// Semantics 6: waiters whose process died are dropped after one waiter
// TTL, all at once: survivors wait one TTL, not one per dead waiter, even
// when the grant reaches a dead waiter first. Redis's clock is frozen and
// moved exactly one waiter TTL, so a per-waiter delay could not pass. The
// survivor learns of the end of the grant to a dead waiter (an event that
// came after its own acquire's reply) from its refresh, every third of its
// own waiter TTL: here one dead waiter TTL.
func TestDeadWaitersCostOneTTL(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	held, err := newSem(e.Client(), "dead", 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	const wttl = 500 * time.Millisecond
	const dead = 5
	var cut []*redistest.Faults
	for i := range dead {
		c, f := e.FaultyClient(fairlock.WithWaiterTTL(wttl), fairlock.WithLeaseTTL(time.Hour))
		cut = append(cut, f)
		_ = acquireAsync(ctx, newSem(c, "dead", 1), 1)
		e.WaitQueued("dead", int64(i+1))
	}
	live := acquireAsync(ctx, newSem(e.Client(fairlock.WithWaiterTTL(3*wttl)), "dead", 1), 1)
	e.WaitQueued("dead", dead+1)
	for _, f := range cut {
		f.Down.Store(true)
	}
	e.Release(held) // hands the permit to the first dead waiter
	e.NotYet(live, "the live waiter, behind dead ones")
	b.Advance(t, wttl)
	r := e.Receive(live)
	if r.Err != nil {
		t.Fatalf("live waiter: %v", r.Err)
	}
	e.Release(r.Lease)
}

// Semantics 6: a dead process's announced grant expires after one waiter
// TTL, with real time and no clock moves. (The live waiter refreshes every
// third of its own waiter TTL: here one dead waiter TTL.)
func TestGrantToDeadWaiterExpires(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		held, err := newSem(e.Client(), "gd", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		const wttl = 200 * time.Millisecond
		c, f := e.FaultyClient(fairlock.WithWaiterTTL(wttl), fairlock.WithLeaseTTL(time.Hour))
		_ = acquireAsync(ctx, newSem(c, "gd", 1), 1)
		e.WaitQueued("gd", 1)
		live := acquireAsync(ctx, newSem(e.Client(fairlock.WithWaiterTTL(3*wttl)), "gd", 1), 1)
		e.WaitQueued("gd", 2)
		f.Down.Store(true)
		e.Release(held)
		r := e.Receive(live)
		if r.Err != nil {
			t.Fatalf("live waiter: %v", r.Err)
		}
		e.Release(r.Lease)
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

// refreshOrder is a go-redis hook that records every ticket a refresh
// script names before the acquire script that queues it has answered: a
// refresh that may reach Redis before the ticket is queued.
type refreshOrder struct {
	mu       sync.Mutex
	answered map[string]bool // tickets whose acquire script answered
	early    []string
}

func (h *refreshOrder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *refreshOrder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *refreshOrder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		// refresh's ARGV: "refresh", client, lease, waiter TTL, then
		// ticket, permits, group for each waiter.
		if i := slices.Index(args, any("refresh")); i >= 0 {
			h.mu.Lock()
			for j := i + 4; j < len(args); j += 3 {
				if t, _ := args[j].(string); !h.answered[t] {
					h.early = append(h.early, t)
				}
			}
			h.mu.Unlock()
		}
		err := next(ctx, cmd)
		// acquire's ARGV: "acquire", ticket, ...
		if i := slices.Index(args, any("acquire")); i >= 0 && i+1 < len(args) && cmd.Err() == nil {
			t, _ := args[i+1].(string)
			h.mu.Lock()
			h.answered[t] = true
			h.mu.Unlock()
		}
		return err
	}
}

// Regression: a liveness refresh that reached Redis before a waiter's own
// acquire script reported the new ticket gone. The waiter then queued again
// under another ticket, behind its own ghost, which could later be granted
// and hold the permits for a waiter TTL while nobody used them.
//
// Every refresh is checked to name only tickets whose acquire answered,
// on either backend. The count of acquire scripts, the symptom, is exact
// only on miniredis, whose clock is frozen: on a real server a process
// stalled past the waiter TTL (the race detector on a loaded machine) is
// dropped and queues again, as it should.
func TestRefreshIgnoresTicketsNotYetQueued(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		frozen := b.Mini != nil
		if frozen {
			b.Freeze(t) // no waiter outlives its liveness in Redis
		}
		e := fltest.New(t, b)
		ctx := context.Background()
		held, err := newSem(e.Client(), "ghost", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		cnt, slow, order := fltest.NewCounter(), &slowAcquire{}, &refreshOrder{answered: map[string]bool{}}
		rdb := b.Client(t)
		counted := redistest.AddHook[fairlock.Option](rdb, cnt)
		ordered := redistest.AddHook[fairlock.Option](rdb, order)
		slowed := redistest.AddHook[fairlock.Option](rdb, slow)
		// Refreshes every 200ms. The second acquire is held back one
		// TTL, about three refreshes at any TTL: a long one costs only
		// time, and a real server's waiter survives a 400ms stall.
		const wttl = 600 * time.Millisecond
		s := newSem(e.ClientOn(rdb, counted, ordered, slowed, fairlock.WithWaiterTTL(wttl)), "ghost", 1)
		first := acquireAsync(ctx, s, 1)
		e.WaitQueued("ghost", 1) // the room now refreshes on its own
		slow.delay.Store(int64(wttl))
		second := acquireAsync(ctx, s, 1)
		e.WaitQueued("ghost", 2)
		slow.delay.Store(0)
		time.Sleep(wttl) // room for more refreshes, and for a re-queue
		order.mu.Lock()
		early := order.early
		order.mu.Unlock()
		if len(early) > 0 {
			t.Fatalf("refreshes named tickets %q before their acquire scripts answered", early)
		}
		if got := cnt.Get("script:acquire"); frozen && got != 2 {
			t.Fatalf("two waiters ran %d acquire scripts: one was queued again", got)
		}
		if n, _ := e.RDB.ZCard(ctx, e.Key("ghost", "q")).Result(); frozen && n != 2 {
			t.Fatalf("queue length %d, want 2", n)
		}
		e.Release(held)
		// Either may be granted first: a waiter that hears its grant too
		// late (a stalled process) gives it back, and queues again behind
		// the other. Waiting for the first alone while the second held
		// the permit waited for ever.
		results := make(chan fltest.Result, 2)
		for _, ch := range []<-chan fltest.Result{first, second} {
			go func() { results <- <-ch }()
		}
		for range 2 {
			r := e.Receive(results)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			e.Release(r.Lease)
		}
	})
}

// slowRenewals is a go-redis hook that holds every batched renewal script
// for a while, so that renewals falling due meanwhile queue behind it. It
// closes reached once want leases have been renewed.
type slowRenewals struct {
	scripts, leases atomic.Int64
	hold            time.Duration
	want            int64
	reached         chan struct{}
	once            sync.Once
}

func (h *slowRenewals) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowRenewals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowRenewals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if a == "renew_batch" {
				h.scripts.Add(1)
				renewing := int64((len(cmd.Args()) - 6 - 2) / 5) // evalsha sha 5 keys; op client; 5 per lease
				time.Sleep(h.hold)
				err := next(ctx, cmd)
				if h.leases.Add(renewing) >= h.want && h.reached != nil {
					h.once.Do(func() { close(h.reached) })
				}
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// Cost: the renewals of one process's leases on one semaphore that fall
// due while a renewal script is in flight go together in the next one, so
// a burst of leases (thousands granted by one release) does not cost a
// script each, and every lease stays held.
func TestRenewalsGoInBatches(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		// The TTL leaves a renewal more than a second to get through a
		// busy machine; the test waits for the renewals, not for a time.
		const n, ttl = 60, 1500 * time.Millisecond
		h := &slowRenewals{hold: 40 * time.Millisecond, want: 2 * n, reached: make(chan struct{})}
		rdb := b.Client(t)
		rdb.AddHook(h)
		s := newSem(e.ClientOn(rdb, fairlock.WithLeaseTTL(ttl)), "batch", n)
		ls := make([]*fairlock.Lease, n)
		for i := range ls {
			l, err := s.Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			ls[i] = l
		}
		// Every lease renews at least twice (two batches' worth).
		select {
		case <-h.reached:
		case <-time.After(time.Minute):
			t.Fatalf("%d renewals in a minute, want %d", h.leases.Load(), 2*n)
		}
		for i, l := range ls {
			if err := l.Err(); err != nil {
				t.Fatalf("lease %d ended: %v", i, err)
			}
		}
		scripts, leases := h.scripts.Load(), h.leases.Load()
		t.Logf("%s: %d renewals of %d leases in %d scripts", b.Name, leases, n, scripts)
		if leases < 2*n || scripts*4 > leases {
			t.Fatalf("%d renewals in %d scripts: want at least %d renewals, four or more per script", leases, scripts, 2*n)
		}
		for _, l := range ls {
			e.Release(l)
		}
	})
}

// Cost rule: a semaphore's state keeps a bound on its earliest waiter
// deadline, and scripts skip looking for dead waiters until it passes. A
// waiter with a shorter TTL than those queued before it lowers the bound,
// so when it dies it is dropped at its own deadline, not at theirs: the
// live waiter behind it is granted at once when the permits come free.
func TestShortLivedDeadWaiterDroppedOnTime(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const short = 1500 * time.Millisecond
		long := fairlock.WithWaiterTTL(time.Hour)
		holder, err := newSem(e.Client(), "short", 2).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Wants both permits: waits, and heads the queue (long TTL).
		first := acquireAsync(ctx, newSem(e.Client(long), "short", 2), 2)
		e.WaitQueued("short", 1)
		// Short TTL, both permits; its process dies while it waits.
		dying, f := e.FaultyClient(fairlock.WithWaiterTTL(short))
		_ = acquireAsync(ctx, newSem(dying, "short", 2), 2)
		e.WaitQueued("short", 2)
		last := acquireAsync(ctx, newSem(e.Client(long), "short", 2), 1)
		e.WaitQueued("short", 3)
		f.Down.Store(true)
		time.Sleep(short + 200*time.Millisecond)

		e.Release(holder)
		r := e.Receive(first)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		e.Release(r.Lease)
		// The dead waiter is gone: the permits go to the last waiter now,
		// not after the dead one's grant would have expired.
		select {
		case r := <-last:
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			e.Release(r.Lease)
		case <-time.After(short / 2):
			t.Fatalf("the live waiter behind a waiter dead for %v was not granted within %v of the release", 200*time.Millisecond, short/2)
		}
	})
}

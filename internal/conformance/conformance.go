// Package conformance is the behaviour every fairlock Backend must show,
// as one suite that each client's tests run: go-redis's in the root
// package, rueidis's and valkey-go's in their modules. Each test drives
// fairlock's public API through the client under test and checks Redis
// through an admin go-redis client of the same server.
package conformance

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/fairlock/fairlock/latch"
	"github.com/redis/go-redis/v9"
)

// Target is one Redis, reached through the client under test.
type Target struct {
	// Open returns a fairlock Client on the Redis through the client
	// under test, or New's error. The suite closes it.
	Open func(opts ...fairlock.Option) (*fairlock.Client, error)
	// Admin is a go-redis client of the same Redis, for the suite's own
	// reads and writes.
	Admin redis.UniversalClient
	// Cluster: the Redis is a Cluster.
	Cluster bool
	// Mini: the Redis is miniredis (which has no command statistics).
	Mini bool
	// Replicas: the Redis has this many replicas (a Sentinel set's).
	Replicas int
	// Functions: the server has FCALL (Redis 7.0 or later, Valkey), so
	// the client must run the engine's scripts as functions.
	Functions bool
	// OpenAt returns how to open Clients through the client under test
	// on another plain server, at addr (the differential test's replay
	// servers); nil where the suite has no such use.
	OpenAt func(t *testing.T, addr string) func(opts ...fairlock.Option) (*fairlock.Client, error)
	// Skip names tests of the suite to leave out.
	Skip []string
}

// Run runs the suite on tg.
func Run(t *testing.T, tg Target) {
	for _, tc := range []struct {
		name string
		run  func(*testing.T, Target)
	}{
		{"Basics", basics},
		{"FIFO", fifo},
		{"CapacityNeverExceeded", capacity},
		{"CancelledWaitLeaves", cancelled},
		{"WakeUps", wakeUps},
		{"GrantsByWakeUp", grantsByWakeUp},
		{"GrantsKept", grantsKept},
		{"DeadlineDuringCall", deadlineDuringCall},
		{"ScriptErrors", scriptErrors},
		{"ForeignKey", foreignKey},
		{"Renewal", renewal},
		{"AcquireAll", acquireAll},
		{"ManyWaiters", manyWaiters},
		{"CloseHandsOn", closeHandsOn},
		{"ScriptPath", scriptPath},
		{"ReplicaAck", replicaAck},
		{"Election", electionObserved},
		{"Latch", latchWoken},
		{"Barrier", barrierRounds},
		{"ConnectionsKilled", connectionsKilled},
		{"ReleaseCancelled", releaseCancelled},
		{"Batching", batching},
		{"Property", property},
		{"Differential", differentialRuns},
	} {
		if slices.Contains(tg.Skip, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) { tc.run(t, tg) })
	}
}

// name returns a semaphore name of its own for t, under one hash tag (so
// that every name of a test shares a Cluster slot).
func name(t testing.TB, tag string, suffix string) string {
	return "{conf" + tag + "}:" + strings.ReplaceAll(t.Name(), "/", ".") + suffix
}

func newTag() string { return rand.Text()[:10] }

func open(t testing.TB, tg Target, opts ...fairlock.Option) *fairlock.Client {
	t.Helper()
	c, err := tg.Open(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds, failing t after 10 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func queued(t testing.TB, c *fairlock.Client, n string) int64 {
	st, err := c.Status(context.Background(), n)
	if err != nil {
		t.Errorf("Status(%q): %v", n, err)
	}
	return st.Queued
}

// A countdown latch through the client under test: waiters in several
// processes are all woken by the CountDown that opens it, by a push (their
// waiter TTL is a minute: none learns it from a refresh within the
// test's bound) and once each (none is left on the latch); a Wait whose
// context ends returns its context's error and leaves; an open latch
// answers at once.
func latchWoken(t *testing.T, tg Target) {
	ctx := ctxFor(t, 30*time.Second)
	n := name(t, newTag(), "")
	const procs, each = 3, 20
	var ls []*latch.Latch
	for range procs {
		l, err := latch.New(open(t, tg, fairlock.WithWaiterTTL(time.Minute)), n, 2)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	// The waiters' condition key (lua/ops/latch.lua).
	cond := fairlock.DefaultPrefix + n + "\x1fL\x1fc\x1f"
	waiters := func() int64 { return tg.Admin.ZCard(ctx, cond).Val() }
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if err := ls[0].Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait() past its deadline = %v, want context.DeadlineExceeded", err)
	}
	cancel()
	waitFor(t, "the cancelled waiter to leave", func() bool { return waiters() == 0 })
	errs := make(chan error, procs*each)
	for i := range procs * each {
		go func() { errs <- ls[i%procs].Wait(ctx) }()
	}
	waitFor(t, "every waiter", func() bool { return waiters() == procs*each })
	for i := range 2 {
		if err := ls[i].CountDown(ctx); err != nil {
			t.Fatalf("CountDown() = %v", err)
		}
	}
	for range procs * each {
		if err := <-errs; err != nil {
			t.Fatalf("Wait() = %v, want nil", err)
		}
	}
	if w := waiters(); w != 0 {
		t.Fatalf("%d waiters left on the open latch, want 0", w)
	}
	if err := ls[2].Wait(ctx); err != nil {
		t.Fatalf("Wait() on an open latch = %v", err)
	}
	if c, err := ls[1].Count(ctx); err != nil || c != 0 {
		t.Fatalf("Count() = %d, %v; want 0", c, err)
	}
}

// A cyclic barrier through the client under test: parties in several
// processes go through rounds together, every one woken by a push when
// its round's last party arrives (their waiter TTL is a minute: none
// learns it from a refresh within the test's bound), each round's indexes
// 0..parties-1 once each; an Await whose context ends breaks its round
// for the party waiting with it, pushed too; the next round is clean.
func barrierRounds(t *testing.T, tg Target) {
	ctx := ctxFor(t, 30*time.Second)
	n := name(t, newTag(), "")
	const procs, parties, rounds = 3, 12, 3
	var bs []*barrier.Barrier
	for range procs {
		b, err := barrier.New(open(t, tg, fairlock.WithWaiterTTL(time.Minute)), n, parties)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	// The waiters' condition key (lua/ops/barrier.lua).
	cond := fairlock.DefaultPrefix + n + "\x1fB\x1fc\x1f"
	waiters := func() int64 { return tg.Admin.ZCard(ctx, cond).Val() }
	for round := int64(1); round <= rounds; round++ {
		type res struct {
			a   barrier.Arrival
			err error
		}
		got := make(chan res, parties)
		for i := range parties {
			go func() {
				a, err := bs[i%procs].Await(ctx)
				got <- res{a, err}
			}()
		}
		seen := make([]bool, parties)
		for range parties {
			r := <-got
			if r.err != nil || r.a.Round != round || r.a.Index < 0 || r.a.Index >= parties || seen[r.a.Index] {
				t.Fatalf("Await() in round %d = %+v, %v", round, r.a, r.err)
			}
			seen[r.a.Index] = true
		}
	}
	other := make(chan error, 1)
	go func() { _, err := bs[0].Await(ctx); other <- err }()
	waitFor(t, "the first party", func() bool { return waiters() == 1 })
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := bs[1].Await(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Await() past its deadline = %v, want context.DeadlineExceeded", err)
	}
	cancel()
	var be *barrier.BrokenError
	if err := <-other; !errors.As(err, &be) || be.Round != rounds+1 {
		t.Fatalf("Await() when its round broke = %v, want ErrBrokenBarrier naming round %d", err, rounds+1)
	}
	if st, err := bs[2].Status(ctx); err != nil || st.Round != rounds+2 || len(st.Arrived) != 0 {
		t.Fatalf("Status() after the break = %+v, %v; want round %d, nobody", st, err, rounds+2)
	}
}

// Concurrent calls of one client, batched (WithBatching), over names of
// one slot: each lease holds its name alone, a counting semaphore's
// capacity is never exceeded, every call is answered, and calls went in
// batches.
func batching(t *testing.T, tg Target) {
	ctx := ctxFor(t, 60*time.Second)
	c := open(t, tg, fairlock.WithBatching(8))
	tag := newTag()
	const workers, rounds = 24, 25
	var held [4]atomic.Int64
	var over atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				k := (w + r) % len(held)
				req := fairlock.Request{Name: name(t, tag, strconv.Itoa(k)), Capacity: int64(1 + k%2), Permits: 1}
				l, err := c.Acquire(ctx, req)
				if err != nil {
					errs <- fmt.Errorf("acquire %s: %w", req.Name, err)
					return
				}
				if held[k].Add(1) > req.Capacity {
					over.Add(1)
				}
				held[k].Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- fmt.Errorf("release %s: %w", req.Name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := over.Load(); n > 0 {
		t.Fatalf("capacity exceeded %d times", n)
	}
	batches, calls := testhook.Batches(c)
	t.Logf("%d batches held %d calls", batches, calls)
	if batches == 0 {
		t.Fatal("no batch was sent")
	}
}

// A lease is granted, counted, refused to a second taker, released once.
func basics(t *testing.T, tg Target) {
	ctx := ctxFor(t, 20*time.Second)
	c := open(t, tg)
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	l, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= 0 {
		t.Errorf("token %d, want a positive fencing token", l.Token())
	}
	if _, err := c.TryAcquire(ctx, req); !errors.Is(err, fairlock.ErrNotAcquired) {
		t.Errorf("TryAcquire while held = %v, want ErrNotAcquired", err)
	}
	st, err := c.Status(ctx, n)
	if err != nil || st.Held != 1 || st.InUse != 1 || st.Capacity != 1 {
		t.Errorf("Status = %+v, %v; want one lease holding 1 of 1", st, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, fairlock.ErrNotHeld) {
		t.Errorf("second Release = %v, want ErrNotHeld", err)
	}
	l2, err := c.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Errorf("token %d after %d, want it to grow", l2.Token(), l.Token())
	}
	_ = l2.Release(ctx)
}

// Waiters from another process are granted in the order they queued, each
// woken by the release before it.
func fifo(t *testing.T, tg Target) {
	ctx := ctxFor(t, 30*time.Second)
	holder, waiters := open(t, tg), open(t, tg)
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	l, err := holder.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	const k = 8
	order := make(chan int, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := waiters.Acquire(ctx, req)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			_ = w.Release(ctx)
		}()
		waitFor(t, fmt.Sprintf("waiter %d to queue", i), func() bool { return queued(t, holder, n) == int64(i+1) })
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d granted in place %d", got, want)
		}
		want++
	}
	if want != k {
		t.Fatalf("%d of %d waiters granted", want, k)
	}
}

// A release wakes the waiter it grants: a chain of handoffs between two
// processes completes long before any waiter's refresh (every 30 s here),
// which would find a grant whose wake-up was lost.
func wakeUps(t *testing.T, tg Target) {
	const waiterTTL = 90 * time.Second // a waiter refreshes every 30 s
	ctx := ctxFor(t, 10*time.Second)
	a, b := open(t, tg, fairlock.WithWaiterTTL(waiterTTL)), open(t, tg, fairlock.WithWaiterTTL(waiterTTL))
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	held, err := a.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, next := range []*fairlock.Client{b, a, b, a, b, a} {
		got := make(chan *fairlock.Lease, 1)
		go func() {
			l, err := next.Acquire(ctx, req)
			if err != nil {
				t.Errorf("handoff %d: %v (a wait that outlasts the test's 10 s waited for a refresh: its wake-up was lost)", i, err)
			}
			got <- l
		}()
		waitFor(t, "the waiter to queue", func() bool { return queued(t, a, n) == 1 })
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if held = <-got; held == nil {
			return
		}
	}
	_ = held.Release(ctx)
}

// Every grant a release hands on reaches its waiter by its wake-up, not by
// the periodic refresh that would heal a lost one (and hide it, costing
// only time): contended handoffs between several processes, each grant
// counted by how its waiter learned of it.
func grantsByWakeUp(t *testing.T, tg Target) {
	// A waiter refreshes every 10 s, and no lease expires during the test:
	// a refresh runs only when a wake-up failed to arrive for that long.
	const waiterTTL, leaseTTL = 30 * time.Second, time.Minute
	const processes, rounds = 4, 3
	ctx := ctxFor(t, time.Minute)
	cs := make([]*fairlock.Client, processes)
	for i := range cs {
		cs[i] = open(t, tg, fairlock.WithWaiterTTL(waiterTTL), fairlock.WithLeaseTTL(leaseTTL))
	}
	counts := func() (reply, wake, refresh int64) {
		for _, c := range cs {
			r, w, f := testhook.Grants(c)
			reply, wake, refresh = reply+r, wake+w, refresh+f
		}
		return reply, wake, refresh
	}
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	for round := range rounds {
		held, err := cs[0].Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		// The others queue behind it, in order.
		type result struct {
			l   *fairlock.Lease
			err error
		}
		got := make([]chan result, processes-1)
		for i, c := range cs[1:] {
			got[i] = make(chan result, 1)
			go func() {
				l, err := c.Acquire(ctx, req)
				got[i] <- result{l, err}
			}()
			waitFor(t, "the waiter to queue", func() bool { return queued(t, cs[0], n) == int64(i+1) })
		}
		// Each release hands on to the next process in the queue.
		for i, ch := range got {
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-ch
			if r.err != nil {
				t.Fatalf("round %d, process %d: %v", round, i+1, r.err)
			}
			held = r.l
			if reply, wake, refresh := counts(); refresh > 0 {
				t.Fatalf("round %d, handoff %d: a grant was learned by a refresh, not by its wake-up (grants by reply %d, by wake-up %d, by refresh %d)",
					round, i+1, reply, wake, refresh)
			}
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	reply, wake, refresh := counts()
	t.Logf("grants by reply %d, by wake-up %d, by refresh %d", reply, wake, refresh)
	if reply != rounds || wake != rounds*(processes-1) || refresh != 0 {
		t.Fatalf("grants by reply %d, by wake-up %d, by refresh %d; want %d, %d, 0", reply, wake, refresh, rounds, rounds*(processes-1))
	}
}

// A call whose context ends while its script is on its way (deadlines of
// a few hundred microseconds) returns the context's error, not a Redis
// error, whether or not the client stops waiting for the answer itself;
// and what the script may have done is undone: no lease is left behind.
func deadlineDuringCall(t *testing.T, tg Target) {
	c := open(t, tg)
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	ended := 0
	for i := range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%30)*50*time.Microsecond)
		l, err := c.TryAcquire(ctx, req)
		cancel()
		switch {
		case err == nil:
			if rerr := l.Release(context.Background()); rerr != nil {
				t.Fatalf("Release: %v", rerr)
			}
		case errors.Is(err, fairlock.ErrNotAcquired):
			// Held by what an ended call's script did, until undone.
		case errors.Is(err, context.DeadlineExceeded):
			ended++
			if errors.Is(err, fairlock.ErrRedis) {
				t.Fatalf("a call whose deadline passed = %v: it matches ErrRedis", err)
			}
		default:
			t.Fatalf("TryAcquire = %v", err)
		}
	}
	if ended == 0 {
		t.Log("no deadline passed during a call")
	}
	waitFor(t, "what the ended calls left to be undone", func() bool {
		st, err := c.Status(context.Background(), n)
		return err == nil && st.Held == 0 && st.Queued == 0
	})
}

// Never more permits held than the capacity, from three processes.
func capacity(t *testing.T, tg Target) {
	ctx := ctxFor(t, 60*time.Second)
	n := name(t, newTag(), "")
	const capa, workers, rounds = 3, 12, 10
	clients := []*fairlock.Client{open(t, tg), open(t, tg), open(t, tg)}
	var inUse, most atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			for range rounds {
				l, err := c.Acquire(ctx, fairlock.Request{Name: n, Capacity: capa, Permits: 1})
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				now := inUse.Add(1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				time.Sleep(time.Millisecond)
				inUse.Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > capa {
		t.Fatalf("%d permits held at once, capacity %d", m, capa)
	}
}

// A process that does not stall keeps every grant it is given: with many
// goroutines of two processes over many semaphores, none is given back as
// heard too late (testhook.GivenBack), however its grant reached it (a
// grant announced and heard before the waiter's process read its own
// acquire's reply, too).
func grantsKept(t *testing.T, tg Target) {
	ctx := ctxFor(t, 60*time.Second)
	const names, workers, rounds = 24, 16, 25
	clients := []*fairlock.Client{open(t, tg), open(t, tg)}
	var ns []string
	for range names {
		ns = append(ns, name(t, newTag(), ""))
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := clients[w%len(clients)]
			for r := range rounds {
				l, err := c.Acquire(ctx, fairlock.Request{Name: ns[(w*7+r*5)%names], Capacity: 1, Permits: 1})
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	for i, c := range clients {
		if n := testhook.GivenBack(c); n > 0 {
			t.Errorf("process %d gave back %d grants as heard too late, though it never stalled", i, n)
		}
	}
}

// A wait whose context ends returns the context's error and leaves the
// queue, so the next request is granted.
func cancelled(t *testing.T, tg Target) {
	ctx := ctxFor(t, 20*time.Second)
	c := open(t, tg)
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	l, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = c.Acquire(wctx, req)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline = %v, want DeadlineExceeded", err)
	}
	waitFor(t, "the cancelled waiter to leave", func() bool { return queued(t, c, n) == 0 })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := c.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("TryAcquire after the holder left: %v", err)
	}
	_ = l2.Release(ctx)
}

// A script's refusal reaches the caller as fairlock's error.
func scriptErrors(t *testing.T, tg Target) {
	ctx := ctxFor(t, 20*time.Second)
	c := open(t, tg)
	n := name(t, newTag(), "")
	l, err := c.Acquire(ctx, fairlock.Request{Name: n, Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	_, err = c.TryAcquire(ctx, fairlock.Request{Name: n, Capacity: 2, Permits: 1})
	if !errors.Is(err, fairlock.ErrCapacityMismatch) {
		t.Fatalf("TryAcquire with another capacity = %v, want ErrCapacityMismatch", err)
	}
}

// A semaphore key that another program overwrote is reported as such,
// and nothing is granted.
func foreignKey(t *testing.T, tg Target) {
	ctx := ctxFor(t, 20*time.Second)
	c := open(t, tg)
	tag := newTag()
	n := name(t, tag, "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	l, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	keys := keysOf(t, tg, tag)
	if len(keys) == 0 {
		t.Fatal("no key holds the semaphore")
	}
	for _, k := range keys {
		if err := tg.Admin.Set(ctx, k, "another program's", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.TryAcquire(ctx, req)
	if !errors.Is(err, fairlock.ErrForeignKey) {
		t.Fatalf("TryAcquire on overwritten keys %v = %v, want ErrForeignKey", keys, err)
	}
	_ = l.Release(ctx)
	for _, k := range keys {
		_ = tg.Admin.Del(ctx, k).Err()
	}
}

// keysOf returns the keys under hash tag tag.
func keysOf(t testing.TB, tg Target, tag string) []string {
	t.Helper()
	pattern := "*{conf" + tag + "}*"
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, rdb *redis.Client) error {
		got, err := rdb.Keys(ctx, pattern).Result()
		mu.Lock()
		keys = append(keys, got...)
		mu.Unlock()
		return err
	}
	onEachMaster(t, tg, scan)
	return keys
}

// onEachMaster runs do on the admin client of each master: the server,
// or every Cluster master at once.
func onEachMaster(t testing.TB, tg Target, do func(context.Context, *redis.Client) error) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch a := tg.Admin.(type) {
	case *redis.ClusterClient:
		err = a.ForEachMaster(ctx, do)
	case *redis.Client:
		err = do(ctx, a)
	default:
		t.Fatalf("admin client %T", tg.Admin)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// A lease held past several TTLs is kept by its renewals. The TTL leaves
// each renewal two thirds of a second to land: a first renewal that loads
// its script into miniredis, whose Lua compiler runs in this process,
// took 70-90 ms under -race on an idle machine and over 190 ms on a
// loaded one.
//
// Another process's TryAcquire is then refused. Granted before the
// lease's own deadline (Expiry, read just before it was sent) had passed,
// by Redis's clock (a token is at least Redis's clock at its grant, in
// µs; the servers run on this host's clock) or by this process's (the
// answer came before it), or with the lease still reading live, two live
// leases held the one permit: that fails at once. Granted only after that
// deadline, with the lease reading lost, the lease lapsed on the way: as
// it must when this process (or miniredis, which runs in it) is not run
// for the rest of its TTL, which loaded -race runs on two cores do. That
// lapse, and a lease read lost after its three TTLs, count as such a
// stall only when the process was seen not to run (fltest.WatchStalls)
// for half the TTL or more during the attempt: then the attempt is made
// again, three times at most; without one, they fail.
func renewal(t *testing.T, tg Target) {
	for attempt := 1; ; attempt++ {
		lapsed := renewalOnce(t, tg)
		if lapsed == "" || t.Failed() {
			return
		}
		if attempt == 3 {
			t.Fatalf("three times in a row: %s", lapsed)
		}
		t.Logf("attempt %d: %s; trying again", attempt, lapsed)
	}
}

// renewalOnce holds a lease for three TTLs and has another process try to
// take it. It returns "" when the lease held, and why it lapsed when it
// lapsed while the process stalled (see renewal); it fails t otherwise.
func renewalOnce(t *testing.T, tg Target) (lapsed string) {
	ctx := ctxFor(t, 20*time.Second)
	const ttl = time.Second
	var stall atomic.Int64 // the longest stall seen, ns
	watch, stop := context.WithCancel(ctx)
	defer stop()
	fltest.WatchStalls(watch, ttl/2, func(from, till time.Time) {
		if d := int64(till.Sub(from)); d > stall.Load() {
			stall.Store(d)
		}
	})
	// stalled returns why the attempt lapsed (what) if the process was
	// seen stalled, "" if not.
	stalled := func(what string) string {
		if d := time.Duration(stall.Load()); d > 0 {
			return fmt.Sprintf("%s, while this process was not run for %v", what, d.Round(time.Millisecond))
		}
		return ""
	}
	c, other := open(t, tg, fairlock.WithLeaseTTL(ttl)), open(t, tg)
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	l, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3*ttl + ttl/4)
	if err := l.Err(); err != nil {
		if why := stalled(fmt.Sprintf("the lease ended within three TTLs: %v", err)); why != "" {
			return why
		}
		t.Fatalf("lease ended after three TTLs: %v", err)
	}
	deadline := l.Expiry() // (the zero time if the lease has ended since)
	asked := time.Now()
	got, err := other.TryAcquire(ctx, req)
	answered := time.Now()
	switch {
	case err == nil:
		took := answered.Sub(asked).Round(time.Millisecond)
		_ = got.Release(ctx)
		if answered.Before(deadline) {
			t.Fatalf("TryAcquire by another process was granted (in %v) %v before the lease's deadline: two live holders (the lease's Err now: %v)",
				took, deadline.Sub(answered).Round(time.Millisecond), l.Err())
		}
		if granted := time.UnixMicro(got.Token()); granted.Before(deadline) {
			t.Fatalf("TryAcquire by another process was answered %v after the lease's deadline, but granted %v before it by Redis's clock (its token): two live holders",
				answered.Sub(deadline).Round(time.Millisecond), deadline.Sub(granted).Round(time.Millisecond))
		}
		lerr := l.Err()
		if lerr == nil {
			t.Fatalf("TryAcquire by another process was granted (in %v) after the lease's deadline read before it, yet the lease reads live (a renewal moved its deadline to %v from now): two live holders",
				took, time.Until(l.Expiry()).Round(time.Millisecond))
		}
		what := fmt.Sprintf("TryAcquire by another process was granted (in %v, answered %v past the lease's deadline): the lease lapsed on the way: %v",
			took, answered.Sub(deadline).Round(time.Millisecond), lerr)
		if why := stalled(what); why != "" {
			return why
		}
		t.Fatalf("%s; the process was not seen to stall: its renewals did not keep it", what)
	case !errors.Is(err, fairlock.ErrNotAcquired):
		t.Fatalf("TryAcquire by another process = %v, want ErrNotAcquired", err)
	}
	if err := l.Release(ctx); err != nil {
		if errors.Is(err, fairlock.ErrLeaseLost) && !time.Now().Before(deadline) {
			if why := stalled(fmt.Sprintf("TryAcquire was refused, then Release found the lease lapsed: %v", err)); why != "" {
				return why
			}
		}
		t.Fatal(err)
	}
	return ""
}

// AcquireAll takes several semaphores at once, and releases them all.
func acquireAll(t *testing.T, tg Target) {
	ctx := ctxFor(t, 20*time.Second)
	c := open(t, tg)
	tag := newTag()
	a, b := name(t, tag, ".a"), name(t, tag, ".b")
	l, err := c.AcquireAll(ctx, fairlock.Request{Name: a, Capacity: 1, Permits: 1}, fairlock.Request{Name: b, Capacity: 2, Permits: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, fairlock.Request{Name: b, Capacity: 2, Permits: 1}); !errors.Is(err, fairlock.ErrNotAcquired) {
		t.Errorf("TryAcquire of a part = %v, want ErrNotAcquired", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := c.TryAcquireAll(ctx, fairlock.Request{Name: a, Capacity: 1, Permits: 1}, fairlock.Request{Name: b, Capacity: 2, Permits: 2})
	if err != nil {
		t.Fatalf("TryAcquireAll after release: %v", err)
	}
	_ = l2.Release(ctx)
}

// Hundreds of waiters of one process are all granted: their wake-ups
// arrive many at a time.
func manyWaiters(t *testing.T, tg Target) {
	ctx := ctxFor(t, 60*time.Second)
	holder, c := open(t, tg), open(t, tg)
	n := name(t, newTag(), "")
	const k, capa = 300, 100
	req := fairlock.Request{Name: n, Capacity: capa, Permits: capa}
	l, err := holder.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := c.Acquire(ctx, fairlock.Request{Name: n, Capacity: capa, Permits: 1})
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			granted.Add(1)
			<-release
			_ = w.Release(ctx)
		}()
	}
	waitFor(t, "every waiter to queue", func() bool { return queued(t, holder, n) == k })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first hundred grants", func() bool { return granted.Load() == capa })
	close(release)
	wg.Wait()
	if g := granted.Load(); g != k {
		t.Fatalf("%d of %d waiters granted", g, k)
	}
}

// Close releases the leases a client holds: a waiter of another process
// is granted at once.
func closeHandsOn(t *testing.T, tg Target) {
	ctx := ctxFor(t, 20*time.Second)
	c, err := tg.Open()
	if err != nil {
		t.Fatal(err)
	}
	other := open(t, tg)
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	if _, err := c.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := other.Acquire(ctx, req)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, "the waiter to queue", func() bool { return queued(t, other, n) == 1 })
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter after Close: %v", err)
	}
}

// WithReplicaAck waits for the replica on every write: on a Sentinel set
// a lease is granted and released with the replica's acknowledgement. On
// a Cluster New refuses it (a script and its WAIT cannot share a
// connection there).
func replicaAck(t *testing.T, tg Target) {
	ack := fairlock.WithReplicaAck(1, 2*time.Second)
	if tg.Cluster {
		if c, err := tg.Open(ack); !errors.Is(err, fairlock.ErrInvalidArgument) {
			if c != nil {
				_ = c.Close()
			}
			t.Fatalf("New with WithReplicaAck on a Cluster = %v, want ErrInvalidArgument", err)
		}
		return
	}
	if tg.Replicas == 0 {
		t.Skip("no replica")
	}
	ctx := ctxFor(t, 20*time.Second)
	c := open(t, tg, ack)
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	for range 3 {
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatalf("Acquire with replica acks: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release with replica acks: %v", err)
		}
	}
}

// An observer of an election, on one process, hears each leader another
// process's candidates take office as, and the resignation between: the
// Backend's pub/sub carries the changes.
func electionObserved(t *testing.T, tg Target) {
	ctx := ctxFor(t, 30*time.Second)
	watcher, candidates := open(t, tg), open(t, tg)
	n := name(t, newTag(), "")
	watch, err := election.New(watcher, n)
	if err != nil {
		t.Fatal(err)
	}
	run, err := election.New(candidates, n)
	if err != nil {
		t.Fatal(err)
	}
	octx, stop := context.WithCancel(ctx)
	defer stop()
	seen := watch.Observe(octx)
	next := func(what string) election.Info {
		t.Helper()
		select {
		case info, ok := <-seen:
			if !ok {
				t.Fatalf("Observe's channel closed, waiting for %s", what)
			}
			return info
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		}
		return election.Info{}
	}
	for _, value := range []string{"first", "second"} {
		l, err := run.Campaign(ctx, value)
		if err != nil {
			t.Fatal(err)
		}
		// The observer may deliver "no leader" first, if it subscribed
		// before any leader; then the leader.
		info := next("the leader " + value)
		if info.Term == 0 {
			info = next("the leader " + value)
		}
		if info.Value != value || info.Term != l.Term() {
			t.Fatalf("observed %+v, want %q in term %d", info, value, l.Term())
		}
		if err := l.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if info := next("the resignation"); info.Term != 0 {
			t.Fatalf("observed %+v after the resignation, want no leader", info)
		}
	}
}

// When Redis closes the client's connections (a restart, its idle
// timeout, a proxy, CLIENT KILL), the next calls still succeed, as they
// do on go-redis, which sends a command again on a connection closed
// under it; and a call whose context is fine succeeds beside one whose
// deadline ends while both wait for the new connection.
func connectionsKilled(t *testing.T, tg Target) {
	if tg.Mini {
		t.Skip("miniredis has no CLIENT KILL")
	}
	ctx := ctxFor(t, 60*time.Second)
	c := open(t, tg)
	n := name(t, newTag(), "")
	kill := func() {
		do := func(ctx context.Context, rdb *redis.Client) error {
			return rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err()
		}
		onEachMaster(t, tg, do)
	}
	for i := range 20 {
		kill()
		l, err := c.Acquire(ctx, fairlock.Request{Name: n, Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatalf("round %d: Acquire after the connections were closed: %v", i, err)
		}
		kill()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("round %d: Release after the connections were closed: %v", i, err)
		}
	}
	for i := range 300 {
		kill()
		short, cancel := context.WithTimeout(ctx, time.Duration(50+i%50*8)*time.Microsecond)
		var wg sync.WaitGroup
		wg.Go(func() {
			if l, err := c.TryAcquire(short, fairlock.Request{Name: n + ".short", Capacity: 100, Permits: 1}); err == nil {
				_ = l.Release(ctx)
			}
		})
		l, err := c.TryAcquire(ctx, fairlock.Request{Name: n, Capacity: 100, Permits: 1})
		wg.Wait()
		cancel()
		if err != nil {
			t.Fatalf("round %d: TryAcquire beside a call whose deadline ended: %v", i, err)
		}
		_ = l.Release(ctx)
	}
}

// A Release whose context has already ended returns the context's error
// and releases in the background: the permits come back at once, not
// at the lease's TTL.
func releaseCancelled(t *testing.T, tg Target) {
	c := open(t, tg, fairlock.WithLeaseTTL(time.Minute))
	n := name(t, newTag(), "")
	req := fairlock.Request{Name: n, Capacity: 1, Permits: 1}
	for _, end := range []string{"cancelled", "deadline passed"} {
		l, err := c.Acquire(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if end == "deadline passed" {
			ctx, cancel = context.WithDeadline(context.Background(), time.Now())
		}
		cancel()
		if err := l.Release(ctx); !errors.Is(err, ctx.Err()) {
			t.Fatalf("Release under a context %s = %v, want its error", end, err)
		}
		waitFor(t, "the release sent in the background ("+end+")", func() bool {
			st, err := c.Status(context.Background(), n)
			return err == nil && st.Held == 0
		})
	}
}

// Close returns while Redis is stalled (SIGSTOP) and a listener is
// blocked reading from it: within its bound (a waiter TTL, here 2 s,
// plus the time to give up on the commands in flight), whatever the
// client.
func closeWhenStalled(t *testing.T, open func(...fairlock.Option) (*fairlock.Client, error), srv *redisserver.Server) {
	c, err := open(fairlock.WithWaiterTTL(2*time.Second), fairlock.WithLeaseTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	req := fairlock.Request{Name: "stalled", Capacity: 1, Permits: 1}
	if _, err := c.Acquire(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	go func() { _, _ = c.Acquire(wctx, req) }()
	waitFor(t, "the waiter to queue", func() bool { return queued(t, c, "stalled") == 1 })
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Resume() }()
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = srv.Resume()
		<-done
		t.Fatal("Close still blocked 15 s after it was called, Redis stalled")
	}
}

// dialSlack is how long past its context's end a call may take to return
// while its connection is being dialled to a stalled Redis: generous, for
// a loaded machine; a client that waits for the dial instead takes its
// dial timeout (5 s by default in valkey-go and rueidis).
const dialSlack = 1500 * time.Millisecond

// Every call returns by its context's end while the connection it needs
// is being dialled to a Redis that accepts connections but does not
// answer (stalled after its clients' connections were cut, as when a
// master stalls while a proxy or the network drops its connections): the
// dial in the call's own hands, whose handshake a client may bound by a
// deadline only, or another caller's, for which a client may wait
// whatever the waiting call's context says. The calls run side by side
// while one more call, under a 4 s deadline, dials: Acquire, TryAcquire,
// AcquireAll, Status and a lease's Release, each under a context that is
// cancelled and under one with a deadline.
func callsWhileDialling(t *testing.T, open func(...fairlock.Option) (*fairlock.Client, error), srv *redisserver.Server) {
	c, err := open(fairlock.WithWaiterTTL(time.Second), fairlock.WithLeaseTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() // (after Redis resumes: deferred first)
	req := func(name string) fairlock.Request {
		return fairlock.Request{Name: "{dial}:" + name, Capacity: 1, Permits: 1}
	}
	ctx := ctxFor(t, 10*time.Second)
	var leases []*fairlock.Lease
	for i := range 2 {
		l, err := c.Acquire(ctx, req(fmt.Sprintf("held%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if _, err := c.Status(ctx, req("held0").Name); err != nil {
		t.Fatal(err)
	}
	// An election's observer subscribes on a connection of its own, dialled
	// at its first Receive.
	el, err := election.New(c, "{dial}:e")
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	if err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = srv.Resume()
		}
	}
	defer resume()
	dctx, dcancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer dcancel()
	dialling := make(chan struct{})
	go func() {
		defer close(dialling)
		_, _ = c.Status(dctx, req("dialling").Name)
	}()
	time.Sleep(100 * time.Millisecond)
	calls := []struct {
		name string
		run  func(ctx context.Context, deadline bool) error
	}{
		{"Acquire", func(ctx context.Context, _ bool) error { _, err := c.Acquire(ctx, req("a")); return err }},
		{"TryAcquire", func(ctx context.Context, _ bool) error { _, err := c.TryAcquire(ctx, req("t")); return err }},
		{"AcquireAll", func(ctx context.Context, _ bool) error { _, err := c.AcquireAll(ctx, req("x"), req("y")); return err }},
		{"Status", func(ctx context.Context, _ bool) error { _, err := c.Status(ctx, req("s").Name); return err }},
		{"Release", func(ctx context.Context, deadline bool) error {
			if deadline {
				return leases[0].Release(ctx)
			}
			return leases[1].Release(ctx)
		}},
	}
	const within = 300 * time.Millisecond
	var wg sync.WaitGroup
	for _, cl := range calls {
		for _, deadline := range []bool{true, false} {
			wg.Go(func() {
				ctx, cancel := context.WithCancel(context.Background())
				if deadline {
					ctx, cancel = context.WithTimeout(context.Background(), within)
				} else {
					time.AfterFunc(within, cancel)
				}
				defer cancel()
				start := time.Now()
				err := cl.run(ctx, deadline)
				took := time.Since(start)
				t.Logf("%s (deadline %v) returned after %v: %v", cl.name, deadline, took.Round(time.Millisecond), err)
				if err == nil || took > within+dialSlack {
					t.Errorf("%s (deadline %v), its connection being dialled to a stalled Redis, returned after %v with %v; want an error within %v of its context's end",
						cl.name, deadline, took.Round(time.Millisecond), err, dialSlack)
				}
			})
		}
	}
	// Observe's channel closes when its context ends, though its
	// subscription's connection is being dialled then.
	wg.Go(func() {
		octx, ocancel := context.WithCancel(context.Background())
		time.AfterFunc(within, ocancel)
		defer ocancel()
		start := time.Now()
		for range el.Observe(octx) {
		}
		took := time.Since(start)
		t.Logf("Observe's channel closed after %v", took.Round(time.Millisecond))
		if took > within+dialSlack {
			t.Errorf("Observe, its subscription's connection being dialled to a stalled Redis, closed its channel %v after it began; want within %v of its context's end",
				took.Round(time.Millisecond), dialSlack)
		}
	})
	wg.Wait()
	resume()
	<-dialling
}

// promptBound is how soon a call must report a Redis that went away
// (connections refused): a third of the 1.5 s deadline it runs under.
const promptBound = 500 * time.Millisecond

// Once Redis has gone away (killed: every connection closed, every new
// one refused), every call returns an error matching ErrRedis well before
// its 1.5 s deadline, and as soon without a deadline: Acquire, TryAcquire,
// AcquireAll, Status and a lease's Release. Close then returns within its
// bound (a waiter TTL, here 2 s, past the call, for the releases it sends
// in the background), with a margin for a busy machine. What a
// client does with a refused connection (dial again at once, wait,
// report) is its own; the engine must see it as Redis unreachable, not
// wait for the caller's deadline.
func promptWhenDown(t *testing.T, open func(...fairlock.Option) (*fairlock.Client, error), srv *redisserver.Server) {
	const waiterTTL = 2 * time.Second
	c, err := open(fairlock.WithLeaseTTL(time.Minute), fairlock.WithWaiterTTL(waiterTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() }) // (when the test fails first)
	req := fairlock.Request{Name: "{down}:p", Capacity: 1, Permits: 1}
	var leases []*fairlock.Lease
	for i := range 2 {
		l, err := c.Acquire(ctxFor(t, 10*time.Second), fairlock.Request{Name: fmt.Sprintf("{down}:held%d", i), Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	srv.Kill()
	calls := []struct {
		name string
		run  func(ctx context.Context, deadline bool) error
	}{
		{"Acquire", func(ctx context.Context, _ bool) error { _, err := c.Acquire(ctx, req); return err }},
		{"TryAcquire", func(ctx context.Context, _ bool) error { _, err := c.TryAcquire(ctx, req); return err }},
		{"AcquireAll", func(ctx context.Context, _ bool) error {
			_, err := c.AcquireAll(ctx, req, fairlock.Request{Name: "{down}:2", Capacity: 1, Permits: 1})
			return err
		}},
		{"Status", func(ctx context.Context, _ bool) error { _, err := c.Status(ctx, req.Name); return err }},
		{"Release", func(ctx context.Context, deadline bool) error {
			if deadline {
				return leases[0].Release(ctx)
			}
			return leases[1].Release(ctx)
		}},
	}
	for _, cl := range calls {
		for _, deadline := range []bool{true, false} {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if deadline {
				ctx, cancel = context.WithTimeout(ctx, 1500*time.Millisecond)
			}
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- cl.run(ctx, deadline) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s (deadline %v) still running 10 s after Redis went away", cl.name, deadline)
			}
			took := time.Since(start)
			cancel()
			t.Logf("%s (deadline %v) returned after %v: %v", cl.name, deadline, took.Round(time.Millisecond), err)
			if !errors.Is(err, fairlock.ErrRedis) || took > promptBound {
				t.Errorf("%s (deadline %v) returned after %v with %v; want an error matching ErrRedis within %v",
					cl.name, deadline, took.Round(time.Millisecond), err, promptBound)
			}
		}
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case <-done:
		t.Logf("Close returned after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(waiterTTL + 3*time.Second):
		t.Fatalf("Close still blocked %v after it was called, Redis gone", waiterTTL+3*time.Second)
	}
}

// On a server with functions the client runs the engine's scripts as
// functions (FCALL), and through EVALSHA elsewhere.
func scriptPath(t *testing.T, tg Target) {
	if tg.Mini {
		t.Skip("miniredis keeps no command statistics")
	}
	ctx := ctxFor(t, 20*time.Second)
	c := open(t, tg)
	n := name(t, newTag(), "")
	calls := func() map[string]int64 {
		out := map[string]int64{}
		var mu sync.Mutex // ForEachMaster calls add at once on every node
		add := func(ctx context.Context, rdb *redis.Client) error {
			info, err := rdb.Info(ctx, "commandstats").Result()
			mu.Lock()
			defer mu.Unlock()
			for _, line := range strings.Split(info, "\n") {
				var cmd string
				var n int64
				line = strings.TrimSpace(line)
				if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
					cmd, rest, _ = strings.Cut(rest, ":calls=")
					rest, _, _ = strings.Cut(rest, ",")
					_, _ = fmt.Sscan(rest, &n)
					out[cmd] += n
				}
			}
			return err
		}
		onEachMaster(t, tg, add)
		return out
	}
	before := calls()
	for range 3 {
		l, err := c.Acquire(ctx, fairlock.Request{Name: n, Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after := calls()
	cmd := "evalsha"
	if tg.Functions {
		cmd = "fcall"
	}
	if d := after[cmd] - before[cmd]; d < 6 {
		t.Fatalf("%d %s calls for three acquire+release cycles, want at least 6 (%v)", d, cmd, after)
	}
}

// Server is one Redis the suite runs on.
type Server struct {
	Addrs []string // the server's address, a Cluster's nodes', or a Sentinel set's sentinels'
	// MasterName is the master's name for the sentinels; "" but for a
	// Sentinel set.
	MasterName string
	Cluster    bool
	Mini       bool // miniredis
}

// Dial returns how to open fairlock Clients on s through the client under
// test (the suite closes each), or skips t when that client cannot speak
// to s.
type Dial func(t *testing.T, s Server) func(opts ...fairlock.Option) (*fairlock.Client, error)

// RunAll runs the suite through dial on miniredis, on the real server
// (internal/redistest's), on a Sentinel set (a master, a replica, three
// sentinels) and on a three-node Cluster of its build; and, each on a
// server of its own, Close while Redis is stalled ("stalled"), every call
// while its connection is being dialled to a stalled Redis ("dialling")
// and every call once Redis is gone ("down"). The tests named in skip are left out
// of the suite's runs.
func RunAll(t *testing.T, dial Dial, skip ...string) {
	t.Run("miniredis", func(t *testing.T) {
		b := redistest.Mini(t)
		open := dial(t, Server{Addrs: []string{b.Addr}, Mini: true})
		admin := redis.NewClient(&redis.Options{Addr: b.Addr})
		defer admin.Close()
		Run(t, Target{Open: open, Admin: admin, Mini: true, Skip: skip})
	})
	t.Run("redis", func(t *testing.T) {
		b := redistest.RealBackend(t)
		open := dial(t, Server{Addrs: []string{b.Addr}})
		admin := redis.NewClient(&redis.Options{Addr: b.Addr})
		defer admin.Close()
		openAt := func(t *testing.T, addr string) func(...fairlock.Option) (*fairlock.Client, error) {
			return dial(t, Server{Addrs: []string{addr}})
		}
		Run(t, Target{Open: open, Admin: admin, Functions: hasFunctions(), OpenAt: openAt, Skip: skip})
	})
	t.Run("stalled", func(t *testing.T) {
		redistest.RealBackend(t)
		srv, err := redisserver.Start()
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Stop()
		closeWhenStalled(t, dial(t, Server{Addrs: []string{srv.Addr}}), srv)
	})
	t.Run("dialling", func(t *testing.T) {
		redistest.RealBackend(t)
		srv, err := redisserver.Start()
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Stop()
		callsWhileDialling(t, dial(t, Server{Addrs: []string{srv.Addr}}), srv)
	})
	t.Run("down", func(t *testing.T) {
		redistest.RealBackend(t)
		srv, err := redisserver.Start()
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Stop()
		promptWhenDown(t, dial(t, Server{Addrs: []string{srv.Addr}}), srv)
	})
	t.Run("sentinel", func(t *testing.T) {
		redistest.RealBackend(t)
		redistest.Long(t)
		set, err := redisserver.StartSentinel(time.Minute)
		if err != nil {
			t.Fatalf("starting the Sentinel set: %v", err)
		}
		defer set.Stop()
		open := dial(t, Server{Addrs: set.SentinelAddrs(), MasterName: redisserver.MasterName})
		admin := redis.NewClient(&redis.Options{Addr: set.Master.Addr})
		defer admin.Close()
		Run(t, Target{Open: open, Admin: admin, Functions: hasFunctions(), Replicas: 1, Skip: skip})
	})
	t.Run("cluster", func(t *testing.T) {
		redistest.RealBackend(t)
		redistest.Long(t)
		cl, err := redisserver.StartCluster(3)
		if err != nil {
			t.Fatalf("starting the cluster: %v", err)
		}
		defer cl.Stop()
		open := dial(t, Server{Addrs: cl.Addrs(), Cluster: true})
		admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
		defer admin.Close()
		Run(t, Target{Open: open, Admin: admin, Cluster: true, Functions: hasFunctions(), Skip: skip})
	})
}

// hasFunctions reports whether the real server has FCALL: Redis 7.0 or
// later, or Valkey.
func hasFunctions() bool {
	b, ok := redistest.Server()
	if !ok {
		return false
	}
	var major int
	_, _ = fmt.Sscanf(b.Version, "%d", &major)
	return b.Name == "Valkey" || major >= 7
}

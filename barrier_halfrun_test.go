package fairlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/internal/halfrun"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A barrier's scripts never fail after a write (THE RULE in queue.lua),
// checked by halfrun's transform on every script the test's clients run:
// rounds of the most parties completed, a round broken by a cancelled
// Await, one broken by a party whose process died (found by the others'
// refresh), a Status, and every op with another program's value (of a
// type fairlock does not keep there) at each of its keys.
func TestBarrierScriptsNeverHalfRun(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		if !fairlock.HasTestTransform() {
			t.Cleanup(fairlock.SetTestTransform(halfrun.Transform))
		}
		ctx := context.Background()
		rdb := b.Client(t)
		prefix := redistest.Prefix(t)
		halfrun.Check(t, rdb, prefix+"*")
		client := func(opts ...fairlock.Option) *fairlock.Client {
			c, err := fairlock.New(b.Client(t), append([]fairlock.Option{fairlock.WithPrefix(prefix)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		newBarrier := func(c *fairlock.Client, name string, n int) *barrier.Barrier {
			br, err := barrier.New(c, name, n)
			if err != nil {
				t.Fatal(err)
			}
			return br
		}
		waiters := func(name string) int64 {
			return rdb.ZCard(ctx, prefix+"{"+name+"}\x1fB\x1fc\x1f").Val()
		}
		waitFor := func(what string, cond func() bool) {
			t.Helper()
			for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("waited 10 s for %s", what)
				}
			}
		}

		// Two rounds of the most parties. (Their waiter TTL is long: on
		// miniredis under the race detector a script costs 10 to 40 ms of
		// its one lock, and a round's 200 arrivals took 6 to 8 s with the
		// machine's cores busy, more in CI. A refresh waits behind them
		// and times out after a waiter TTL; with the default 3 s no
		// refresh was answered for three TTLs, the first parties failed
		// with ErrRedis ("could not be kept alive"), the round broke, and
		// the last party began a round of its own that no one completes,
		// hence the bound on each round.)
		c := client()
		wide := newBarrier(client(fairlock.WithWaiterTTL(20*time.Second)), "wide", barrier.MaxParties)
		for range 2 {
			var wg sync.WaitGroup
			errs := make(chan error, barrier.MaxParties)
			roundCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			for range barrier.MaxParties {
				wg.Go(func() {
					_, err := wide.Await(roundCtx)
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("Await() = %v", err)
				}
			}
		}

		// A round broken by a cancelled Await, and one by a dead party.
		br := newBarrier(c, "broken", 3)
		other := make(chan error, 1)
		go func() { _, err := br.Await(ctx); other <- err }()
		waitFor("the first party", func() bool { return waiters("broken") == 1 })
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		if _, err := br.Await(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Await() past its deadline = %v", err)
		}
		cancel()
		if err := <-other; !errors.Is(err, barrier.ErrBrokenBarrier) {
			t.Fatalf("Await() = %v, want ErrBrokenBarrier", err)
		}
		faults := &redistest.Faults{}
		drdb := b.Client(t)
		// (A waiter TTL of a second: with 100 ms, on a busy machine the
		// doomed party's refresh came late, it died before the live party
		// arrived, and the live party's arrival broke the round.)
		dc, err := fairlock.New(drdb, fairlock.WithPrefix(prefix), fairlock.WithWaiterTTL(time.Second), redistest.AddHook[fairlock.Option](drdb, faults))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dc.Close() })
		t.Cleanup(faults.Hear)
		dead, cancelDead := context.WithCancel(ctx)
		deadDone := make(chan error, 1)
		go func() { _, err := newBarrier(dc, "broken", 3).Await(dead); deadDone <- err }()
		waitFor("the doomed party", func() bool { return waiters("broken") == 1 })
		live := newBarrier(client(fairlock.WithWaiterTTL(time.Second)), "broken", 3)
		liveDone := make(chan error, 1)
		go func() { _, err := live.Await(ctx); liveDone <- err }()
		waitFor("the live party", func() bool { return waiters("broken") == 2 })
		faults.Down.Store(true) // the doomed party's process dies
		if err := <-liveDone; !errors.Is(err, barrier.ErrBrokenBarrier) {
			t.Fatalf("Await() after a party died = %v, want ErrBrokenBarrier", err)
		}
		faults.Down.Store(false)
		cancelDead()
		<-deadDone
		if _, err := live.Status(ctx); err != nil {
			t.Fatal(err)
		}

		// Another program's value at each key of every op.
		base := prefix + "{fk}\x1fB"
		keys := map[string]string{base + ":s": "hash", base + ":q": "zset", base + ":d": "zset", base + ":h": "zset",
			base + ":t": "zset", base + "\x1fc\x1f": "zset", base: "hash"}
		for key, kept := range keys {
			for _, typ := range []string{"string", "list", "hash", "zset"} {
				if typ == kept {
					continue
				}
				for _, withWaiter := range []bool{false, true} {
					rdb.Del(ctx, base+":s", base+":q", base+":d", base+":h", base+":t", base+"\x1fc\x1f", base)
					wctx, wcancel := context.WithCancel(ctx)
					wdone := make(chan error, 1)
					if withWaiter {
						go func() { _, err := newBarrier(c, "fk", 2).Await(wctx); wdone <- err }()
						waitFor("the waiter", func() bool { return waiters("fk") == 1 })
					} else {
						wdone <- nil
					}
					rdb.Del(ctx, key)
					switch typ {
					case "string":
						rdb.Set(ctx, key, "x", 0)
					case "list":
						rdb.RPush(ctx, key, "x")
					case "hash":
						rdb.HSet(ctx, key, "x", "y")
					case "zset":
						rdb.ZAdd(ctx, key, redisZ("x"))
					}
					fb := newBarrier(c, "fk", 2)
					_, _ = fb.Status(ctx)
					short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
					_, _ = fb.Await(short)
					cancel()
					wcancel()
					<-wdone
				}
			}
		}
	})
}

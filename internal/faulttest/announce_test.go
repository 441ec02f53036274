package faulttest

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A grant the queue announces to a waiter lasts, in
// Redis, one waiter TTL from when Redis made it. Here the waiter's process
// stalls just as the grant reaches it: the reply that carries the grant
// (the wake-up its BLPOP popped, or a liveness refresh reporting it) and
// every reply after it reach it only after the grant has expired and
// another caller holds the permits; its next BLPOPs are held back too. When it resumes, Acquire must not return a lease that Redis no
// longer holds under its token: it may return an error, or wait and be
// granted later, but a lease it returns is live in Redis when it returns.
func TestLateWakeUpIsNotALease(t *testing.T) {
	// The waiter TTL, which the announced grant lasts. The test needs the
	// waiter's ticket alive until the release, and the grant until Status
	// has seen it; on a busy 2-core machine a process can go without CPU
	// for half a second, longer than a 300 ms ticket survives.
	const wait = time.Second
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		if !b.Real() {
			// The client counts an announced grant's lease from Redis's
			// expiry of it, mapped to its own clock through the replies'
			// readings of Redis's clock. A frozen miniredis clock that the
			// test moves by hand jumps ahead of every local clock, which
			// no real Redis does: the real server covers this case.
			t.Skip("needs Redis's clock to move with time")
		}
		e := fltest.New(t, b)
		ctx := context.Background()
		const name = "late"
		mutex := fairlock.Request{Name: name, Capacity: 1, Permits: 1}
		direct := e.Client()
		held, err := direct.Acquire(ctx, mutex)
		if err != nil {
			t.Fatal(err)
		}
		w, f := e.FaultyClient(fairlock.WithWaiterTTL(wait), fairlock.WithLeaseTTL(time.Minute), fairlock.WithOwner("stalled"))
		type result struct {
			lease *fairlock.Lease
			err   error
			live  []int64 // tokens of the live leases when Acquire returned
		}
		got := make(chan result, 1)
		go func() {
			actx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			var r result
			r.lease, r.err = w.Acquire(actx, mutex)
			if r.err == nil {
				st, err := direct.Status(ctx, name)
				if err != nil {
					t.Errorf("status: %v", err)
				}
				for _, h := range st.Holders {
					r.live = append(r.live, h.Token)
				}
			}
			got <- r
		}()
		fltest.WaitWaiters(t, direct, name, 1)
		q, err := e.RDB.ZRange(ctx, e.Prefix+"{"+name+"}:q", 0, -1).Result()
		if err != nil || len(q) != 1 {
			t.Fatalf("queue %q (%v); want the waiter's ticket", q, err)
		}
		ticket := strings.Fields(q[0])[0]

		// The process stalls at the first reply that tells it about its
		// ticket (the wake-up its BLPOP pops, or a refresh that reports
		// the grant), and its next BLPOPs are held back too.
		resume := f.Stall(t, func(reply string) bool { return strings.Contains(reply, ticket) })
		hear := f.Deafen(t)
		e.Release(held) // announces the grant to the stalled waiter
		var tok int64
		st, err := direct.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range st.Holders {
			if h.Owner == "stalled" {
				tok = h.Token
			}
		}
		if tok == 0 {
			t.Fatalf("holders %+v: no grant announced to the waiter; the test proves nothing", st.Holders)
		}
		ts := strconv.FormatInt(tok, 10)
		e.WaitFor("a reply carrying the grant to be held back", func() bool {
			return slices.ContainsFunc(f.Held(), func(s string) bool { return strings.Contains(s, ts) })
		})
		pass(e, wait+time.Millisecond, "the announced grant to expire", idle(direct, name))
		other, err := direct.Acquire(ctx, mutex)
		if err != nil {
			t.Fatalf("Acquire once the announced grant expired: %v", err)
		}
		t.Logf("%d replies held back while stalled", len(f.Held()))

		resume()
		hear()
		var r result
		// Acquire returns now, or waits (queued again) for the permits.
		e.WaitFor("the stalled waiter to return or queue again", func() bool {
			if len(got) > 0 {
				return true
			}
			st, err := direct.Status(ctx, name)
			return err == nil && len(st.Waiters) == 1
		})
		select {
		case r = <-got:
			e.Release(other)
		default:
			e.Release(other)
			select {
			case r = <-got:
			case <-time.After(20 * time.Second):
				t.Fatal("the waiter was not granted after the permits were released")
			}
		}
		if r.err != nil {
			t.Logf("Acquire after the stall: %v (allowed)", r.err)
			return
		}
		defer r.lease.Release(ctx)
		if !slices.Contains(r.live, r.lease.Token()) {
			t.Fatalf("Acquire returned token %d, which Redis no longer holds (live holders %v; the announced grant was %d, the other caller's %d)",
				r.lease.Token(), r.live, tok, other.Token())
		}
	})
}

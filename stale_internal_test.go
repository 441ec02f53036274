package fairlock

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// failStale judges each waiter by the refreshes that covered it. One
// refused in a script of its own fails once a waiter TTL has passed since
// it was last alive; one refused beside others (a multi-lock waiter's
// other semaphore refusing the script they shared, say) is not yet known
// to be at fault, and fails only after three TTLs, while refresh parts
// the waiters of failed scripts until the one at fault is alone. A
// refresh that timed out is Redis being busy (see failStale).
func TestFailStaleJudgesEachWaiter(t *testing.T) {
	const ttl = time.Second
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	c, err := New(rdb, WithWaiterTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	refused := errors.New("refused")
	now := time.Now()
	for _, tc := range []struct {
		name  string
		since time.Duration // since it was last alive
		alone bool
		fails bool
	}{
		{"refused alone, within its TTL", ttl / 2, true, false},
		{"refused alone, past its TTL", ttl + time.Millisecond, true, true},
		{"refused beside others, past its TTL", 2 * ttl, false, false},
		{"refused beside others, past three TTLs", 3*ttl + time.Millisecond, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &waiter{ticket: "T", queued: true, alive: now.Add(-tc.since), failed: refused, alone: tc.alone, ch: make(chan wakeup, 1)}
			r := &room{c: c.waits, waiters: map[string]*waiter{"T": w}, answered: now}
			r.failStale(now)
			select {
			case wk := <-w.ch:
				if !tc.fails {
					t.Fatalf("failed: %v", wk.err)
				}
				if !errors.Is(wk.err, ErrRedis) || !errors.Is(wk.err, refused) {
					t.Fatalf("failed with %v; want ErrRedis and the refresh's error", wk.err)
				}
			default:
				if tc.fails {
					t.Fatal("not failed")
				}
			}
		})
	}
}

// A room's refresh round names each waiter with the lease TTL it queued
// with: one script names one TTL, so waiters of several TTLs (their own,
// Request.LeaseTTL, or the client's) go in scripts of one TTL each, the
// suspects (whose last refresh failed) as the others; every queued waiter
// is in exactly one script, and an empty room still sends one.
func TestRefreshBatchesOneLeaseTTLEach(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &room{c: c.waits, waiters: map[string]*waiter{}}
	c.mu.Lock()
	empty := r.refreshBatchesLocked()
	c.mu.Unlock()
	if len(empty) != 1 || refreshCount(empty[0]) != 0 || empty[0][2] != c.leaseMs {
		t.Fatalf("an empty room's round = %q, want one script of no tickets", empty)
	}
	leases := []string{c.leaseMs, "2000", "150"}
	want := map[string]string{} // ticket -> lease
	for i := range 300 {
		lease := leases[i%len(leases)]
		w := &waiter{ticket: fmt.Sprintf("T%d", i), permits: 1, lease: lease, queued: i%7 != 0, ch: make(chan wakeup, 1)}
		if i%5 == 0 {
			w.failed = errors.New("refused")
		}
		r.waiters[w.ticket] = w
		if w.queued {
			want[w.ticket] = lease
		}
	}
	c.mu.Lock()
	batches := r.refreshBatchesLocked()
	c.mu.Unlock()
	seen := map[string]string{}
	for _, args := range batches {
		lease := args[2]
		if n := refreshCount(args); n == 0 || n > refreshBatch {
			t.Errorf("a script of %d tickets", n)
		}
		for i := range refreshCount(args) {
			tk := refreshedTicket(args, i)
			if _, dup := seen[tk]; dup {
				t.Errorf("%s in two scripts", tk)
			}
			seen[tk] = lease
			if want[tk] != lease {
				t.Errorf("%s (queued %v, lease TTL %q) refreshed with lease TTL %q", tk, r.waiters[tk].queued, want[tk], lease)
			}
		}
	}
	if len(seen) != len(want) {
		t.Errorf("%d waiters refreshed, want the %d queued", len(seen), len(want))
	}
}

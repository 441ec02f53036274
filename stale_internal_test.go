package fairlock

import (
	"errors"
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

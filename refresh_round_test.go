package fairlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A refresh round answered in part keeps the room's waiters. With
// thousands of waiters a round sends many refresh scripts at once; on a
// busy machine those queued behind the other traffic can run out of time
// while the rest are answered. Redis is up then, if busy: the waiters
// whose script failed may lose their tickets, and the next refresh that
// covers them reports them dropped, so they queue again. Counting such a
// round as a failure failed every waiter of the client with ErrRedis
// ("waiters could not be kept alive") while Redis answered (10,000
// waiters on Redis 7.4.1 with the machine's other core busy).
func TestRefreshPartlyAnsweredKeepsWaiters(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		held, err := newSem(e.Client(), "busy", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		hook := &everyOtherRefresh{}
		rdb := b.Client(t)
		redistest.AddHook(t, rdb, hook)
		// Refreshes every third of the waiter TTL; a refresh that fails
		// is tried again a tenth of it later; waiters fail once
		// refreshes have failed for one TTL (three when they time out).
		// (A grant must be confirmed within the waiter TTL too: under the
		// race detector, miniredis needs a second.)
		const wttl = time.Second
		// Two refresh scripts per round (at most 128 tickets each).
		const n = 200
		s := newSem(e.ClientOn(rdb, fairlock.WithWaiterTTL(wttl)), "busy", 1)
		chs := make([]<-chan fltest.Result, n)
		for i := range chs {
			chs[i] = acquireAsync(ctx, s, 1)
		}
		// Armed once a round has refreshed them all (in two scripts):
		// on a busy machine, the first rounds may find only the waiters
		// whose acquire reply was handled.
		hook.whole.Store(n - 128)
		e.WaitFor("a refresh round covering every waiter", hook.seenWhole.Load)
		hook.armed.Store(true)
		time.Sleep(5 * wttl / 2)
		hook.armed.Store(false)
		// Rounds with a refused script for over a TTL: enough to fail
		// the waiters had such rounds counted as failed.
		if span := time.Duration(hook.last.Load() - hook.first.Load()); hook.refused.Load() < 2 || span < wttl {
			t.Fatalf("%d refresh scripts refused over %v; the test needs refusals for over %v", hook.refused.Load(), span, wttl)
		}
		for i, ch := range chs {
			select {
			case r := <-ch:
				t.Fatalf("waiter %d returned while the semaphore was held (%d refresh scripts refused, one in every two): %v", i, hook.refused.Load(), r.Err)
			default:
			}
		}
		// Granted one at a time, each released at once, in queue order
		// (a waiter that queued again is behind the others).
		all := make(chan fltest.Result, n)
		for _, ch := range chs {
			go func() { all <- <-ch }()
		}
		e.Release(held)
		for range n {
			e.Release(e.Granted(all))
		}
	})
}

// everyOtherRefresh, once armed, fails every other refresh script before
// it is sent, as a busy pool or a broken connection would. Before, it
// notes a refresh script of whole tickets (a round's second script when
// every waiter is in it).
type everyOtherRefresh struct {
	whole       atomic.Int64
	seenWhole   atomic.Bool
	armed       atomic.Bool
	calls       atomic.Int64
	refused     atomic.Int64
	first, last atomic.Int64 // when the first and the last were refused, in Unix ns
}

func (h *everyOtherRefresh) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *everyOtherRefresh) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *everyOtherRefresh) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.armed.Load() && refreshTickets(cmd) == h.whole.Load() {
			h.seenWhole.Store(true)
		}
		if h.armed.Load() && refreshTickets(cmd) >= 0 && h.calls.Add(1)%2 == 1 {
			now := time.Now().UnixNano()
			h.first.CompareAndSwap(0, now)
			h.last.Store(now)
			h.refused.Add(1)
			err := errors.New("refresh refused (injected): connection reset by peer")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// refreshTickets returns how many tickets cmd refreshes if it runs the
// engine's refresh op ("refresh", the client's id, two TTLs, then three
// arguments per ticket), or -1.
func refreshTickets(cmd redis.Cmder) int64 {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
		args := cmd.Args()
		for i, a := range args {
			if a == "refresh" {
				return int64(len(args)-i-4) / 3
			}
		}
	}
	return -1
}

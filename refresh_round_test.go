package fairlock_test

import (
	"context"
	"fmt"
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
		// Refreshes every 100 ms; a refresh that fails is tried again
		// 30 ms later; waiters fail once refreshes that time out have
		// failed for three TTLs (900 ms).
		const wttl = 300 * time.Millisecond
		// Two refresh scripts per round (at most 128 tickets each).
		const n = 200
		s := newSem(e.ClientOn(rdb, fairlock.WithWaiterTTL(wttl)), "busy", 1)
		chs := make([]<-chan fltest.Result, n)
		for i := range chs {
			chs[i] = acquireAsync(ctx, s, 1)
		}
		e.WaitQueued("busy", n)
		hook.armed.Store(true)
		time.Sleep(5 * wttl)
		hook.armed.Store(false)
		if got := hook.refused.Load(); got < 10 {
			t.Fatalf("%d refresh scripts timed out; the test needs rounds with one of two failing", got)
		}
		for i, ch := range chs {
			select {
			case r := <-ch:
				t.Fatalf("waiter %d returned while the semaphore was held (%d refresh scripts timed out, one in every two): %v", i, hook.refused.Load(), r.Err)
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

// everyOtherRefresh, once armed, fails every other refresh script with a
// timeout, as if it had waited too long behind other commands.
type everyOtherRefresh struct {
	armed   atomic.Bool
	calls   atomic.Int64
	refused atomic.Int64
}

func (h *everyOtherRefresh) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *everyOtherRefresh) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *everyOtherRefresh) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() && isRefresh(cmd) && h.calls.Add(1)%2 == 1 {
			h.refused.Add(1)
			err := fmt.Errorf("refresh held up behind other traffic: %w", context.DeadlineExceeded)
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// isRefresh reports whether cmd runs the engine's refresh op.
func isRefresh(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
		for _, a := range cmd.Args() {
			if a == "refresh" {
				return true
			}
		}
	}
	return false
}

package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
// ("could not be kept alive") while Redis answered (10,000 waiters on
// Redis 7.4.1 with the machine's other core busy). A waiter fails only
// when every refresh that covered it failed for its liveness
// (TestRefreshFailingForOneWaiterFailsIt).
func TestRefreshPartlyAnsweredKeepsWaiters(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		held, err := newSem(e.Client(), "busy", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		hook := &everyOtherRefresh{}
		rdb := b.Client(t)
		hooked := redistest.AddHook[fairlock.Option](rdb, hook)
		// Refreshes every third of the waiter TTL; a refresh that fails
		// is tried again a tenth of it later; a waiter fails once the
		// refreshes covering it have timed out for three TTLs.
		// (A grant must be confirmed within the waiter TTL too: under the
		// race detector, miniredis needs a second.)
		const wttl = time.Second
		// Two refresh scripts per round (at most 128 tickets each).
		const n = 200
		s := newSem(e.ClientOn(rdb, hooked, fairlock.WithWaiterTTL(wttl)), "busy", 1)
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
		time.Sleep(4 * wttl)
		hook.armed.Store(false)
		// Rounds with a script timed out for over three TTLs: enough
		// to fail the waiters had such rounds counted as failed.
		if span := time.Duration(hook.last.Load() - hook.first.Load()); hook.refused.Load() < 2 || span < 3*wttl {
			t.Fatalf("%d refresh scripts timed out over %v; the test needs them for over %v", hook.refused.Load(), span, 3*wttl)
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
// timeout before it is sent, as a busy pool would. Before, it
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
			err := fmt.Errorf("refresh held up behind other traffic (injected): %w", context.DeadlineExceeded)
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

// A refresh that fails for what it reaches for one waiter fails that
// waiter, not the room. A multi-lock waiter's refresh also reaches its
// other semaphores; there another program's key, say, refuses every
// refresh script that covers it. Its ticket dies: its Acquire must end
// with an error within its liveness rather than wait on in ignorance,
// while the waiters beside it, refreshed in the scripts that were
// answered, keep their places.
func TestRefreshFailingForOneWaiterFailsIt(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		held, err := newSem(e.Client(), "pa", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		hook := &refuseGroups{key: e.Key("pb", "s")}
		rdb := b.Client(t)
		hooked := redistest.AddHook[fairlock.Option](rdb, hook)
		const wttl = time.Second
		c := e.ClientOn(rdb, hooked, fairlock.WithWaiterTTL(wttl))
		s := newSem(c, "pa", 1)
		const n = 150 // with the multi-lock waiter, two refresh scripts per round
		chs := make([]<-chan fltest.Result, n)
		for i := range chs {
			chs[i] = acquireAsync(ctx, s, 1)
		}
		e.WaitQueued("pa", n)
		multi := fltest.Async(func() (*fairlock.Lease, error) {
			return c.AcquireAll(ctx, fairlock.Request{Name: "pa", Capacity: 1, Permits: 1}, fairlock.Request{Name: "pb", Capacity: 1, Permits: 1})
		})
		// Queued once pa holds more than the n tickets (a process stalled
		// past the waiters' liveness, as a loaded race run can be, lets
		// their tickets die and queue again, so the count need not stay
		// n); or failed already, which the check below judges.
		var r fltest.Result
		done := false
		e.WaitFor("the multi-lock waiter queued on pa, or its result", func() bool {
			select {
			case r = <-multi:
				done = true
				return true
			default:
			}
			got, err := e.RDB.ZCard(ctx, e.Key("pa", "q")).Result()
			return err == nil && got > n
		})
		start := time.Now()
		if !done {
			r = e.Receive(multi)
		}
		if !errors.Is(r.Err, fairlock.ErrRedis) || !errors.Is(r.Err, fairlock.ErrForeignKey) || !strings.Contains(r.Err.Error(), hook.key) {
			t.Fatalf("the multi-lock waiter whose refreshes all failed: %v, want an error matching ErrRedis and ErrForeignKey, naming %s", r.Err, hook.key)
		}
		t.Logf("the multi-lock waiter failed %v after it queued, %d refresh scripts refused: %v", time.Since(start).Round(time.Millisecond), hook.refused.Load(), r.Err)
		if hook.refused.Load() < 2 {
			t.Fatalf("%d refresh scripts refused", hook.refused.Load())
		}
		// The others stay, over more than a liveness of refreshes.
		time.Sleep(2 * wttl)
		for i, ch := range chs {
			select {
			case r := <-ch:
				t.Fatalf("waiter %d returned while the semaphore was held: %v", i, r.Err)
			default:
			}
		}
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

// refusal is an error reply of Redis, as go-redis gives it: what a
// script that met another program's key answers.
type refusal string

func (e refusal) Error() string { return string(e) }
func (refusal) RedisError()     {}

// refuseGroups refuses every refresh script that covers a waiter of a
// request over several semaphores (a ticket with a group).
type refuseGroups struct {
	key     string // the other semaphore's key the refusal names
	refused atomic.Int64
}

func (h *refuseGroups) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *refuseGroups) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *refuseGroups) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if refreshTickets(cmd) > 0 {
			args := cmd.Args()
			at := slices.Index(args, any("refresh"))
			for i := at + 4; i+2 < len(args); i += 3 {
				if g, _ := args[i+2].(string); g != "" {
					h.refused.Add(1)
					err := refusal("FAIRLOCK_FOREIGN_KEY string hash " + h.key) // another program's key at the waiter's other semaphore
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}

package fairlock

// Adversarial probes of this session's Close bound (close.go stop: "a
// Backend that returns by its context's end returns by the contexts the
// close bounds" — so the close waits for its work without a give-up).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// opStallBackend returns by its context's end (backend.Info.Deadlines, as
// rueidis and valkey-go do). While armed, a script call of one of the ops
// in stall fails once with io.EOF (a dropped connection: transient) if
// failFirst is set, and after that gets no answer: it returns when its
// context ends, or when the test frees it.
type opStallBackend struct {
	backend.Backend
	armed     atomic.Bool
	failFirst bool
	failed    atomic.Bool
	stall     map[string]bool
	entered   atomic.Int32
	far       atomic.Int32 // of entered: under a deadline more than a minute away
	free      chan struct{}
}

func (s *opStallBackend) Info() backend.Info {
	info := s.Backend.Info()
	info.Deadlines = true
	return info
}

func (s *opStallBackend) Script(ctx context.Context, sc backend.Script) (any, error) {
	if s.armed.Load() && len(sc.Args) > 0 && s.stall[sc.Args[0]] {
		if s.failFirst && s.failed.CompareAndSwap(false, true) {
			return nil, io.EOF
		}
		s.entered.Add(1)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) > time.Minute {
			s.far.Add(1)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.free:
			return nil, errors.New("opStallBackend: freed at the test's end")
		}
	}
	return s.Backend.Script(ctx, sc)
}

// Close's bound through a Backend that returns by its context's end
// (rueidis, valkey-go): one waiter TTL from the close and closeSlack
// (stop's "until"), whatever Redis does. Each row leaves one call of the
// client's on its way to a Redis that no longer answers, then closes:
//
//   - resend: a Release failed on a dropped connection, and its resend
//     (resend.go, under a context whose deadline is the lease's expiry:
//     here a Request.LeaseTTL of an hour) is on its way when Close begins.
//     The resend loop looks at the close only between tries.
//   - release: a Release under a context that cannot end is on its way;
//     it holds the lease's mutex, which Close's releaseAtClose waits for.
//   - condwait: a condition wait under a context that cannot end (no
//     boundByClose for it) is on its way; it holds the lease's mutex too.
//
// In each, stop's wait for its background work has no give-up (answerWait
// is 0 for such a Backend), so Close waits as long as the call does.
func TestAdvCloseBoundCallsNotBoundByTheClose(t *testing.T) {
	const waiterTTL = 200 * time.Millisecond
	const limit = 3 * time.Second // far past waiterTTL + closeSlack
	for _, row := range []struct {
		name      string
		stall     string
		failFirst bool
		leaseTTL  time.Duration
		call      func(c *Client, l *Lease)
	}{
		{"resend", "release", true, time.Hour, func(c *Client, l *Lease) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err := l.Release(ctx)
			t.Logf("Release = %v", err)
		}},
		{"release", "release", false, 0, func(c *Client, l *Lease) {
			go l.Release(context.Background())
		}},
		{"condwait", "wait", false, 0, func(c *Client, l *Lease) {
			go l.condWait(context.Background(), "cv")
		}},
	} {
		t.Run(row.name, func(t *testing.T) {
			b := redistest.Mini(t)
			s := &opStallBackend{Backend: newGoRedis(b.Client(t)), free: make(chan struct{}),
				stall: map[string]bool{row.stall: true}, failFirst: row.failFirst}
			defer close(s.free)
			c, err := NewWithBackend(s, WithPrefix("advbound:"), WithWaiterTTL(waiterTTL))
			if err != nil {
				t.Fatal(err)
			}
			l, err := c.Acquire(context.Background(), Request{Name: "m", Capacity: 1, Permits: 1, LeaseTTL: row.leaseTTL})
			if err != nil {
				t.Fatal(err)
			}
			s.armed.Store(true)
			row.call(c, l)
			if row.failFirst {
				advWaitFor(t, "the resend on its way", func() bool { return s.far.Load() > 0 })
			} else {
				advWaitFor(t, "the call on its way", func() bool { return s.entered.Load() > 0 })
			}
			start := time.Now()
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			select {
			case err := <-closed:
				took := time.Since(start)
				t.Logf("Close took %v: %v", took, err)
				if took > limit {
					t.Errorf("Close took %v, past its bound (%v waiter TTL + %v slack)", took, waiterTTL, closeSlack)
				}
			case <-time.After(limit):
				t.Errorf("Close still waiting %v after it began (bound: %v waiter TTL + %v slack): a call on its way to a Redis that does not answer holds it", limit, waiterTTL, closeSlack)
				s.armed.Store(false)
				// free the stalled calls (deferred) so that Close can end
			}
		})
	}
}

// advCondHook is a go-redis hook: once holdWait is set, the next "wait"
// script runs in Redis and its reply is held back until release closes;
// once failLeave is set, every "leave" script fails with leaveErr.
type advCondHook struct {
	holdWait  atomic.Bool
	held      chan struct{}
	release   chan struct{}
	failLeave atomic.Bool
	leaveErr  error
	leaves    atomic.Int32
	log       func(string)
}

func (h *advCondHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *advCondHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *advCondHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 3 {
			nkeys, _ := args[2].(int)
			if i := 3 + nkeys; i < len(args) {
				if h.log != nil {
					defer func() { h.log(fmt.Sprintf("%v %v -> %v / %v", args[0], args[i], cmd.Err(), cmd.String())) }()
				}
				switch args[i] {
				case "leave":
					if h.failLeave.Load() {
						h.leaves.Add(1)
						cmd.SetErr(h.leaveErr)
						return h.leaveErr
					}
				case "wait":
					if h.holdWait.Load() {
						// The first form that runs (not NOSCRIPT) is held.
						err := next(ctx, cmd)
						if err == nil && h.holdWait.CompareAndSwap(true, false) {
							close(h.held)
							<-h.release
						}
						return err
					}
				}
			}
		}
		return next(ctx, cmd)
	}
}

// A condition wait whose script call is on its way when Close begins
// returns ErrClosed (boundByClose), and its late clean-up withdraws the
// new ticket the script put on the condition. The guide and Close's doc:
// "if some of the blocked Acquire calls (and condition waits) it ended
// could not leave their queues in that time ... the error says how many
// of how many". An Acquire's late clean-up reports to the close
// (acquirePlan: cleanUpReport with closeReport); the condition wait's
// (condWait: c.cleanUp) does not: the withdrawal fails, the ticket stays
// on the condition, and Close returns nil.
func TestAdvCloseReportsConditionWaitOnItsWay(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		h := &advCondHook{held: make(chan struct{}), release: make(chan struct{}),
			leaveErr: errors.New("test: withdrawal refused")}
		// h.log = func(s string) { t.Log(s) } // every script call, for debugging
		var releaseOnce sync.Once
		free := func() { releaseOnce.Do(func() { close(h.release) }) }
		defer free()
		rdb := b.Client(t)
		rdb.AddHook(h)
		prefix := redistest.Prefix(t)
		c, err := New(rdb, WithPrefix(prefix), WithWaiterTTL(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		req := Request{Name: "m", Capacity: 1, Permits: 1}
		l, err := c.Acquire(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background()) // may outlast the close
		defer cancel()
		h.holdWait.Store(true)
		waited := make(chan error, 1)
		go func() {
			_, err := l.condWait(ctx, "cv")
			waited <- err
		}()
		<-h.held // the wait ran in Redis: its new ticket is on the condition
		h.failLeave.Store(true)
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		select {
		case err := <-waited:
			t.Logf("condWait = %v", err)
			if !errors.Is(err, ErrClosed) {
				t.Errorf("condWait on its way at Close = %v, want ErrClosed", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("condWait did not return at the close")
		}
		free() // the reply comes: the late clean-up runs
		var cerr error
		select {
		case cerr = <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return")
		}
		keys, _ := rdb.Keys(context.Background(), prefix+"*").Result()
		for _, k := range keys {
			typ, _ := rdb.Type(context.Background(), k).Result()
			switch typ {
			case "zset":
				z, _ := rdb.ZRangeWithScores(context.Background(), k, 0, -1).Result()
				t.Logf("%q: %v", k, z)
			case "hash":
				h, _ := rdb.HGetAll(context.Background(), k).Result()
				t.Logf("%q: %v", k, h)
			}
		}
		p, _ := c.plan([]Request{req})
		n, _ := rdb.ZCard(context.Background(), condKeys(p.first().k, "cv")[0]).Result()
		t.Logf("Close = %v; withdrawals tried %d; waiters left on the condition: %d", cerr, h.leaves.Load(), n)
		if h.leaves.Load() == 0 {
			t.Fatal("no withdrawal was tried: the probe did not reach its case")
		}
		if cerr == nil || !errors.Is(cerr, ErrRedis) {
			t.Errorf("Close = %v, want an error matching ErrRedis saying a withdrawal it ended did not land (%d waiter(s) left on the condition)", cerr, n)
		}
	})
}

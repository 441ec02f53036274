package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
)

// Close waits for the work it ends: every Acquire blocked when it began
// has returned ErrClosed and left its queue by the time Close returns,
// whether its context can end (its withdrawal then runs on a goroutine of
// the client's) or not.
func TestCloseWaitsForBlockedAcquires(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		const n = 8
		for round := range 5 {
			t.Run(fmt.Sprint(round), func(t *testing.T) {
				e := fltest.New(t, b)
				other, c := e.Client(), e.Client()
				var blocked []<-chan fltest.Result
				for i := range n {
					name := fmt.Sprintf("w%d", i)
					held, err := newSem(other, name, 1).Acquire(context.Background(), 1)
					if err != nil {
						t.Fatal(err)
					}
					defer e.Release(held)
					ctx := context.Background()
					if i%2 == 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithCancel(ctx)
						defer cancel()
					}
					blocked = append(blocked, acquireAsync(ctx, newSem(c, name, 1), 1))
					e.WaitQueued(name, 1)
				}
				if err := c.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				for i, ch := range blocked {
					select {
					case r := <-ch:
						fltest.IsErr(t, "an Acquire blocked at Close", r.Err, fairlock.ErrClosed)
					default:
						t.Fatalf("Acquire %d, blocked at Close, had not returned when Close did", i)
					}
					q, err := e.RDB.ZCard(context.Background(), e.Key(fmt.Sprintf("w%d", i), "q")).Result()
					if err != nil || q != 0 {
						t.Fatalf("queue of w%d when Close returned: %d tickets (%v), want none", i, q, err)
					}
				}
			})
		}
	})
}

// closeBound is Close's documented bound through go-redis with default
// options: one waiter TTL from the call, plus go-redis's ReadTimeout
// (3 s by default) for a command already sent, or a new connection's
// handshake, to a Redis that does not answer.
const closeBound = fairlock.DefaultWaiterTTL + 3*time.Second

// Close returns within its bound, measured from the call, with one lease
// held and one Acquire blocked (its context able to end), whatever became
// of Redis: stalled (SIGSTOP) or refusing connections (killed). Every
// blocked Acquire has returned by then, and once a stalled Redis resumes
// no live waiter of the closed client is left in its queue.
func TestCloseBound(t *testing.T) {
	redistest.Long(t)
	for _, fault := range []string{"stalled", "refusing"} {
		t.Run(fault, func(t *testing.T) {
			srv, err := redisserver.Start()
			if err != nil {
				t.Skipf("no redis-server: %v", err)
			}
			defer srv.Stop()
			e := fltest.New(t, &redistest.Backend{Name: "own", Addr: srv.Addr})
			ctx := context.Background()
			other := e.Client()
			c, err := fairlock.New(e.B.Client(t), fairlock.WithPrefix(e.Prefix)) // go-redis's default options
			if err != nil {
				t.Fatal(err)
			}
			if _, err := newSem(c, "held", 1).Acquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := newSem(other, "busy", 1).Acquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			blocked := acquireAsync(wctx, newSem(c, "busy", 1), 1)
			e.WaitQueued("busy", 1)
			switch fault {
			case "stalled":
				if err := srv.Pause(); err != nil {
					t.Fatal(err)
				}
				defer func() { _ = srv.Resume() }()
			case "refusing":
				srv.Kill()
			}
			start := time.Now()
			err = c.Close()
			took := time.Since(start)
			t.Logf("%s: Close returned in %v (bound %v): %v", fault, took, closeBound, err)
			if err != nil && !errors.Is(err, fairlock.ErrRedis) {
				t.Fatalf("Close with Redis %s = %v, want nil or an error matching ErrRedis", fault, err)
			}
			// A generous margin: the bound is a limit, not a measure.
			if limit := closeBound + 2*time.Second; took > limit {
				t.Fatalf("Close with Redis %s returned in %v, want within its bound %v (limit checked %v)", fault, took, closeBound, limit)
			}
			select {
			case r := <-blocked:
				fltest.IsErr(t, "an Acquire blocked at Close", r.Err, fairlock.ErrClosed)
			default:
				t.Fatal("the Acquire blocked at Close had not returned when Close did")
			}
			if fault == "stalled" {
				if err := srv.Resume(); err != nil {
					t.Fatal(err)
				}
				fltest.WaitWaiters(t, other, "busy", 0)
			}
		})
	}
}

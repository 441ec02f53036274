package fairlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// slowScripts is a go-redis hook that holds every script call back by
// delay (once set) before sending it: a slow network or a busy Redis, as
// the client sees it.
type slowScripts struct{ delay atomic.Int64 }

func (h *slowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch strings.ToLower(cmd.Name()) {
		case "evalsha", "evalsha_ro", "eval", "eval_ro", "fcall", "fcall_ro":
			time.Sleep(time.Duration(h.delay.Load()))
		}
		return next(ctx, cmd)
	}
}

// renewalHeard hears lease renewals.
type renewalHeard chan struct{}

func (r renewalHeard) Observe(e fairlock.Event) {
	if e.Kind == fairlock.LeaseRenewed {
		select {
		case r <- struct{}{}:
		default:
		}
	}
}

// Renewals are timed from when the grant or the last renewal was sent,
// not from its answer: answers that each take a third of the TTL leave
// every renewal two thirds of it to land, and the lease is kept. (Timed
// from the answer, the first renewal went out with a third left, and its
// slow answer came at the deadline: the lease was lost.)
func TestSlowAnswersDoNotShortenRenewals(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const ttl = 900 * time.Millisecond
		slow := &slowScripts{}
		renewed := make(renewalHeard, 16)
		c := clientWith(t, e, slow, fairlock.WithLeaseTTL(ttl), fairlock.WithObserver(renewed))
		req := fairlock.Request{Name: "slow", Capacity: 1, Permits: 1}
		// Once without delay, renewed once: the scripts are loaded (a
		// first call may take two trips, EVALSHA then EVAL), and each call
		// below is one.
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-renewed:
		case <-time.After(10 * time.Second):
			t.Fatalf("lease not renewed within 10s: %v", l.Err())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		slow.delay.Store(int64(ttl / 3))
		l, err = c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Done():
			t.Fatalf("lease lost within four TTLs of slow answers: %v", l.Err())
		case <-time.After(4 * ttl):
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

// slowAnswers is a go-redis hook that holds every script's answer back
// by delay (once set): Redis ran the script at once, and the client hears
// of it late.
type slowAnswers struct{ delay atomic.Int64 }

func (h *slowAnswers) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowAnswers) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowAnswers) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil {
			return err // (NOSCRIPT: the EVAL that follows is the trip)
		}
		switch strings.ToLower(cmd.Name()) {
		case "evalsha", "evalsha_ro", "eval", "eval_ro", "fcall", "fcall_ro":
			time.Sleep(time.Duration(h.delay.Load()))
		}
		return err
	}
}

// A waiter's refreshes are timed from when its acquire or its last round
// of refreshes was sent, not from their answers: answers that each take
// three quarters of the waiter TTL still keep it alive in Redis, and it
// keeps its place ahead of a later waiter. (Timed from the answers, each
// refresh reached Redis after the waiter's deadline there: the waiter
// was dropped and queued again, behind the later one.)
func TestSlowAnswersDoNotShortenWaiterRefreshes(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const wttl = 1200 * time.Millisecond
		req := fairlock.Request{Name: "slowwait", Capacity: 1, Permits: 1}
		holder, err := e.Client().Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		slow := &slowAnswers{}
		first := clientWith(t, e, slow, fairlock.WithWaiterTTL(wttl))
		if _, err := first.TryAcquire(ctx, req); err == nil || !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire while held = %v, want ErrNotAcquired", err) // (loads the scripts)
		}
		slow.delay.Store(int64(wttl * 3 / 4))
		order := make(chan string, 2)
		waitFor := func(who string, c *fairlock.Client) {
			l, err := c.Acquire(ctx, req)
			if err != nil {
				t.Errorf("%s: %v", who, err)
				order <- who
				return
			}
			order <- who
			if err := l.Release(ctx); err != nil {
				t.Errorf("%s: Release: %v", who, err)
			}
		}
		go waitFor("first", first)
		fltest.WaitWaiters(t, e.Client(), "slowwait", 1)
		go waitFor("second", e.Client())
		fltest.WaitWaiters(t, e.Client(), "slowwait", 2)
		time.Sleep(3 * wttl)
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got := <-order; got != "first" {
			t.Fatalf("%s was granted first; the first waiter lost its place", got)
		}
		<-order
	})
}

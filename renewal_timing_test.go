package fairlock_test

import (
	"context"
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

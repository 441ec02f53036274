package faulttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/latch"
	"github.com/fairlock/fairlock/multilock"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// With WithReplicaAck on a master that has no replica, no change is ever
// acknowledged: every call that changes Redis's state must say so
// (ErrNotReplicated), whichever path it takes through its script (a grant,
// a wait, a count down that opens the latch, an arrival that waits and
// one that completes its round), rather than report a success a failover
// could undo.
func TestEveryChangeAwaitsReplicas(t *testing.T) {
	b := redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	rdb := redis.NewClient(&redis.Options{Addr: b.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := fairlock.New(rdb, fairlock.WithPrefix(redistest.Prefix(t)), fairlock.WithReplicaAck(1, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	mutex := func(name string) fairlock.Request { return fairlock.Request{Name: name, Capacity: 1, Permits: 1} }
	lease := func(l *fairlock.Lease, err error) error {
		if l != nil {
			_ = l.Release(context.Background())
		}
		return err
	}
	for _, tc := range []struct {
		what string
		run  func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error { return lease(c.Acquire(ctx, mutex("acq"))) }},
		{"TryAcquire", func(ctx context.Context) error { return lease(c.TryAcquire(ctx, mutex("try"))) }},
		{"multilock.Lock", func(ctx context.Context) error { return lease(multilock.Lock(ctx, c, "ml.a", "ml.b")) }},
		{"RWMutex.RLock", func(ctx context.Context) error {
			rw, err := semaphore.NewRWMutex(c, "rw")
			if err != nil {
				return err
			}
			return lease(rw.RLock(ctx))
		}},
		{"latch CountDown, the count stays above 0", func(ctx context.Context) error {
			l, err := latch.New(c, "down2", 2)
			if err != nil {
				return err
			}
			return l.CountDown(ctx)
		}},
		{"latch CountDown that opens the latch", func(ctx context.Context) error {
			l, err := latch.New(c, "down1", 1)
			if err != nil {
				return err
			}
			return l.CountDown(ctx)
		}},
		{"latch Wait that waits", func(ctx context.Context) error {
			l, err := latch.New(c, "wait", 1)
			if err != nil {
				return err
			}
			return l.Wait(ctx)
		}},
		{"barrier Await that waits", func(ctx context.Context) error {
			br, err := barrier.New(c, "wait", 2)
			if err != nil {
				return err
			}
			_, err = br.Await(ctx)
			return err
		}},
		{"barrier Await that completes its round", func(ctx context.Context) error {
			br, err := barrier.New(c, "last", 1)
			if err != nil {
				return err
			}
			_, err = br.Await(ctx)
			return err
		}},
		{"election Campaign", func(ctx context.Context) error {
			el, err := election.New(c, "el")
			if err != nil {
				return err
			}
			l, err := el.Campaign(ctx, "v")
			if l != nil {
				_ = l.Resign(context.Background())
			}
			return err
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tc.run(ctx); !errors.Is(err, fairlock.ErrNotReplicated) {
				t.Errorf("%s with no replica to acknowledge = %v, want ErrNotReplicated", tc.what, err)
			}
		})
	}
}

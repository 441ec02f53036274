package fairlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
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
				// What Close waits for is done when it returns: every
				// blocked Acquire has left its queue. (Its result reaches
				// this test a moment later: Close sees the Acquire end in
				// its last deferred step, before its caller's goroutine
				// hands the result over, so the result itself is awaited.)
				for i := range blocked {
					q, err := e.RDB.ZCard(context.Background(), e.Key(fmt.Sprintf("w%d", i), "q")).Result()
					if err != nil || q != 0 {
						t.Fatalf("queue of w%d when Close returned: %d tickets (%v), want none", i, q, err)
					}
				}
				for i, ch := range blocked {
					select {
					case r := <-ch:
						fltest.IsErr(t, "an Acquire blocked at Close", r.Err, fairlock.ErrClosed)
					case <-time.After(time.Second):
						t.Fatalf("Acquire %d, blocked at Close, had not returned a second after Close did", i)
					}
				}
			})
		}
	})
}

// Close returns within its bound (one waiter TTL from the call, plus
// go-redis's ReadTimeout, 3 s by default, for a command already sent, or
// a new connection's handshake, to a Redis that does not answer), through
// go-redis with default options, on a single node, a Cluster and a
// Sentinel set (a failover client), Redis stalled or refusing; every
// blocked Acquire has left its queue by then (see fltest.CloseBound).
func TestCloseBound(t *testing.T) {
	fltest.CloseBound(t, fairlock.DefaultWaiterTTL+3*time.Second,
		func(t *testing.T, s fltest.Servers, opts ...fairlock.Option) *fairlock.Client {
			var rdb fairlock.RedisClient
			switch {
			case s.Cluster:
				cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.Addrs})
				t.Cleanup(func() { _ = cc.Close() })
				rdb = cc
			case s.MasterName != "":
				fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.Addrs})
				t.Cleanup(func() { _ = fc.Close() })
				rdb = fc
			default:
				sc := redis.NewClient(&redis.Options{Addr: s.Addrs[0]})
				t.Cleanup(func() { _ = sc.Close() })
				rdb = sc
			}
			c, err := fairlock.New(rdb, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
}

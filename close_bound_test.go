package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
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
// go-redis's ReadTimeout, 5 s by default, for a command already sent, or
// a new connection's handshake, to a Redis that does not answer), through
// go-redis with default options, on a single node, a Cluster and a
// Sentinel set (a failover client), Redis stalled or refusing; every
// blocked Acquire has left its queue by then (see fltest.CloseBound).
func TestCloseBound(t *testing.T) {
	fltest.CloseBound(t, fairlock.DefaultWaiterTTL+defaultReadTimeout(),
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

// defaultReadTimeout returns go-redis's default ReadTimeout.
func defaultReadTimeout() time.Duration {
	rdb := redis.NewClient(&redis.Options{})
	defer func() { _ = rdb.Close() }()
	return rdb.Options().ReadTimeout
}

// A blocking call (an acquisition, a condition wait) whose script call is
// on its way when Redis stalls ends at the close. Through a go-redis
// Cluster client the call, its context able to end but not ending, would
// be tried four times (MaxRedirects), each try waiting out the
// ReadTimeout: 20 s with go-redis's defaults, which Close waited for.
// Close returns within its bound (one waiter TTL plus the ReadTimeout),
// the call with ErrClosed before it.
func TestCloseBoundCallOnItsWay(t *testing.T) {
	redistest.Long(t)
	for _, tc := range []struct {
		name string
		// prepare readies the call on c while Redis answers; call makes
		// it once Redis has stalled.
		prepare func(t *testing.T, ctx context.Context, c *fairlock.Client) (call func(context.Context) (*fairlock.Lease, error))
	}{
		{"acquire", func(t *testing.T, ctx context.Context, c *fairlock.Client) func(context.Context) (*fairlock.Lease, error) {
			return func(ctx context.Context) (*fairlock.Lease, error) {
				return c.Acquire(ctx, fairlock.Request{Name: "stalled", Capacity: 1, Permits: 1})
			}
		}},
		{"condition wait", func(t *testing.T, ctx context.Context, c *fairlock.Client) func(context.Context) (*fairlock.Lease, error) {
			mu, err := semaphore.NewMutex(c, "stalled")
			if err != nil {
				t.Fatal(err)
			}
			l, err := mu.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cond := semaphore.NewCond(mu)
			return func(ctx context.Context) (*fairlock.Lease, error) { return cond.Wait(ctx, l) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // a Cluster of its own, waited on
			cl, err := redisserver.StartCluster(3)
			if err != nil {
				t.Skipf("no Cluster: %v", err)
			}
			defer cl.Stop()
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
			defer func() { _ = cc.Close() }()
			h := &scriptSent{sent: make(chan struct{})}
			cc.AddHook(h)
			c, err := fairlock.New(cc, fairlock.WithPrefix(redistest.Prefix(t)))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			ctx := context.Background()
			// Scripts loaded, the Cluster's slots known.
			l, err := c.Acquire(ctx, fairlock.Request{Name: "warm", Capacity: 1, Permits: 1})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			call := tc.prepare(t, ctx, c)
			for _, n := range cl.Nodes {
				if err := n.Pause(); err != nil {
					t.Fatal(err)
				}
				defer func() { _ = n.Resume() }()
			}
			h.armed.Store(true)
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			returned := fltest.Async(func() (*fairlock.Lease, error) { return call(wctx) })
			select {
			case <-h.sent:
			case <-time.After(10 * time.Second):
				t.Fatal("the call's script was not sent")
			}
			start := time.Now()
			err = c.Close()
			took := time.Since(start)
			bound := fairlock.DefaultWaiterTTL + cc.Options().ReadTimeout
			t.Logf("Close returned in %v (bound %v): %v", took, bound, err)
			if err != nil && !errors.Is(err, fairlock.ErrRedis) {
				t.Fatalf("Close = %v, want nil or an error matching ErrRedis", err)
			}
			// A generous margin: the bound is a limit, not a measure.
			if limit := bound + 2*time.Second; took > limit {
				t.Fatalf("Close returned in %v, want within its bound %v (limit checked %v)", took, bound, limit)
			}
			select {
			case r := <-returned:
				fltest.IsErr(t, "a "+tc.name+" on its way at Close", r.Err, fairlock.ErrClosed)
			default:
				t.Fatalf("the %s on its way at Close had not returned when Close did", tc.name)
			}
		})
	}
}

// scriptSent is a go-redis hook that closes sent when a script command
// goes out once armed, after running before (if set).
type scriptSent struct {
	armed  atomic.Bool
	once   sync.Once
	sent   chan struct{}
	before func()
}

func (h *scriptSent) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptSent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "evalsha", "eval", "fcall":
			if h.armed.Load() {
				h.once.Do(func() {
					if h.before != nil {
						h.before()
					}
					close(h.sent)
				})
			}
		}
		return next(ctx, cmd)
	}
}

func (h *scriptSent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A renewal on its way when Redis stalls ends at the close. A go-redis
// client tries it again while the lease's deadline lasts, each try waiting
// out the ReadTimeout (a Cluster client four times): with a 2 s
// ReadTimeout and the default lease TTL, 8 s of tries for a renewal sent
// 6.7 s before the deadline, which Close waited for.
func TestCloseBoundRenewalOnItsWay(t *testing.T) {
	redistest.Long(t)
	cl, err := redisserver.StartCluster(3)
	if err != nil {
		t.Skipf("no Cluster: %v", err)
	}
	defer cl.Stop()
	const readTimeout = 2 * time.Second
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ReadTimeout: readTimeout})
	defer func() { _ = cc.Close() }()
	h := &scriptSent{sent: make(chan struct{})}
	// The renewal's script meets a stalled Redis.
	h.before = func() {
		for _, n := range cl.Nodes {
			_ = n.Pause()
		}
	}
	defer func() {
		for _, n := range cl.Nodes {
			_ = n.Resume()
		}
	}()
	cc.AddHook(h)
	c, err := fairlock.New(cc, fairlock.WithPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Acquire(context.Background(), fairlock.Request{Name: "held", Capacity: 1, Permits: 1}); err != nil {
		t.Fatal(err)
	}
	h.armed.Store(true)
	select {
	case <-h.sent:
	case <-time.After(fairlock.DefaultLeaseTTL):
		t.Fatal("the lease was not renewed")
	}
	start := time.Now()
	err = c.Close()
	took := time.Since(start)
	bound := fairlock.DefaultWaiterTTL + readTimeout
	t.Logf("Close returned in %v (bound %v): %v", took, bound, err)
	if err != nil && !errors.Is(err, fairlock.ErrRedis) {
		t.Fatalf("Close = %v, want nil or an error matching ErrRedis", err)
	}
	if limit := bound + 2*time.Second; took > limit {
		t.Fatalf("Close returned in %v, want within its bound %v (limit checked %v)", took, bound, limit)
	}
}

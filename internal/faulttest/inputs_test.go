package faulttest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/multilock"
	"github.com/redis/go-redis/v9"
)

// 7. Bad input and Redis faults, on a redis-server of the test's own (with
// a password, so that a wrong one can be tried): each gives its documented
// error, and none panics or hangs.
func TestBadInputAndFaults(t *testing.T) {
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	srv, err := redisserver.Start("--requirepass", "secret")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "secret"})
	defer admin.Close()
	newClient := func(opts ...fairlock.Option) (*fairlock.Client, *redistest.Faults) {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "secret"})
		f := &redistest.Faults{}
		faulty := redistest.AddHook[fairlock.Option](rdb, f)
		c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix("bad:"), faulty}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); rdb.Close() })
		return c, f
	}
	c, _ := newClient()
	mutex := func(name string) fairlock.Request { return fairlock.Request{Name: name, Capacity: 1, Permits: 1} }
	acquire := func(req fairlock.Request) error {
		l, err := c.Acquire(ctx, req)
		if err == nil {
			_ = l.Release(ctx)
		}
		return err
	}

	for _, tc := range []struct {
		what string
		run  func() error
		want error // nil: must succeed
	}{
		{"empty name", func() error { return acquire(mutex("")) }, fairlock.ErrInvalidName},
		{"name of 513 bytes", func() error { return acquire(mutex(strings.Repeat("n", 513))) }, fairlock.ErrInvalidName},
		{"name with a newline", func() error { return acquire(mutex("a\nb")) }, fairlock.ErrInvalidName},
		{"name not UTF-8", func() error { return acquire(mutex("a\xffb")) }, fairlock.ErrInvalidName},
		{"name that is only a hash tag", func() error { return acquire(mutex("{x}")) }, fairlock.ErrInvalidName},
		{"untagged name with a closing brace", func() error { return acquire(mutex("a}b")) }, fairlock.ErrInvalidName},
		{"odd but valid name", func() error { return acquire(mutex("{tag} ünï cödé : * ? [x]")) }, nil},
		{"hash tag not at the start", func() error { return acquire(mutex("ünï cödé {tag} : * ? [x]")) }, fairlock.ErrInvalidName},
		{"capacity 0", func() error { return acquire(fairlock.Request{Name: "a", Capacity: 0, Permits: 1}) }, fairlock.ErrInvalidArgument},
		{"capacity above MaxCapacity", func() error {
			return acquire(fairlock.Request{Name: "a", Capacity: fairlock.MaxCapacity + 1, Permits: 1})
		}, fairlock.ErrInvalidArgument},
		{"negative permits", func() error { return acquire(fairlock.Request{Name: "a", Capacity: 2, Permits: -1}) }, fairlock.ErrInvalidArgument},
		{"permits above capacity", func() error { return acquire(fairlock.Request{Name: "a", Capacity: 2, Permits: 3}) }, fairlock.ErrInvalidArgument},
		{"nil redis client", func() error { _, err := fairlock.New(nil); return err }, fairlock.ErrInvalidArgument},
		{"lease TTL of 1ns", func() error { _, err := fairlock.New(admin, fairlock.WithLeaseTTL(1)); return err }, fairlock.ErrInvalidArgument},
		{"capacity other than the stored one", func() error {
			l, err := c.Acquire(ctx, fairlock.Request{Name: "cap", Capacity: 2, Permits: 1})
			if err != nil {
				return err
			}
			defer l.Release(ctx)
			return acquire(fairlock.Request{Name: "cap", Capacity: 3, Permits: 1})
		}, fairlock.ErrCapacityMismatch},
		{"double release", func() error {
			l, err := c.Acquire(ctx, mutex("double"))
			if err != nil {
				return err
			}
			if err := l.Release(ctx); err != nil {
				return err
			}
			return l.Release(ctx)
		}, fairlock.ErrNotHeld},
		{"release after expiry", func() error {
			fc, f := newClient(fairlock.WithLeaseTTL(100 * time.Millisecond))
			l, err := fc.Acquire(ctx, mutex("expired"))
			if err != nil {
				return err
			}
			f.Down.Store(true) // renewals fail; the lease runs out
			<-l.Done()
			time.Sleep(50 * time.Millisecond)
			f.Down.Store(false)
			return l.Release(ctx)
		}, fairlock.ErrLeaseLost},
		{"SCRIPT FLUSH between calls", func() error {
			if err := acquire(mutex("flush")); err != nil {
				return err
			}
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				return err
			}
			return acquire(mutex("flush"))
		}, nil},
		{"maxmemory reached under noeviction", func() error {
			if err := admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
				return err
			}
			if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				return err
			}
			defer admin.ConfigSet(ctx, "maxmemory", "0")
			return acquire(mutex("oom"))
		}, fairlock.ErrRedis},
		{"wrong password", func() error {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "wrong", MaxRetries: -1})
			defer rdb.Close()
			wc, err := fairlock.New(rdb)
			if err != nil {
				return err
			}
			defer wc.Close()
			_, err = wc.Acquire(ctx, mutex("pw"))
			return err
		}, fairlock.ErrRedis},
		{"a key of the wrong type in the way", func() error {
			if err := admin.Set(ctx, "bad:{wrongtype}:q", "x", time.Minute).Err(); err != nil {
				return err
			}
			// The queue key matters once somebody waits.
			l, err := c.Acquire(ctx, mutex("wrongtype"))
			if err != nil {
				return err
			}
			defer l.Release(ctx)
			_, err = c.TryAcquire(ctx, mutex("wrongtype"))
			if !errors.Is(err, fairlock.ErrNotAcquired) {
				return fmt.Errorf("TryAcquire while held: %w", err)
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err = c.Acquire(wctx, mutex("wrongtype"))
			return err
		}, fairlock.ErrRedis},
		{"multi-lock across cluster slots", func() error {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
			defer rdb.Close()
			cc, _ := fairlock.New(rdb)
			defer cc.Close()
			_, err := multilock.Lock(ctx, cc, "acct:1", "acct:2")
			return err
		}, fairlock.ErrCrossSlot},
		{"a go-redis Ring", func() error {
			rdb := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}})
			defer rdb.Close()
			_, err := fairlock.New(rdb)
			return err
		}, fairlock.ErrInvalidArgument},
		{"WithReplicaAck on a Cluster client", func() error {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
			defer rdb.Close()
			_, err := fairlock.New(rdb, fairlock.WithReplicaAck(1, time.Second))
			return err
		}, fairlock.ErrInvalidArgument},
		{"WithReplicaAck with negative replicas", func() error {
			_, err := fairlock.New(admin, fairlock.WithReplicaAck(-1, time.Second))
			return err
		}, fairlock.ErrInvalidArgument},
		{"WithReplicaAck with no replica", func() error {
			ac, _ := newClient(fairlock.WithReplicaAck(1, 50*time.Millisecond))
			_, err := ac.Acquire(ctx, mutex("noreplica"))
			if !errors.Is(err, fairlock.ErrNotReplicated) {
				return fmt.Errorf("want ErrNotReplicated: %w", err)
			}
			// The grant was given back.
			return acquire(mutex("noreplica"))
		}, nil},
		{"empty multi-lock", func() error { _, err := multilock.Acquire(ctx, c); return err }, fairlock.ErrInvalidArgument},
		{"duplicate names in a multi-lock", func() error { _, err := multilock.Lock(ctx, c, "d", "d"); return err }, fairlock.ErrInvalidArgument},
	} {
		t.Run(tc.what, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				defer func() {
					if p := recover(); p != nil {
						done <- fmt.Errorf("panic: %v", p)
					}
				}()
				done <- tc.run()
			}()
			select {
			case err := <-done:
				switch {
				case tc.want == nil && err != nil:
					t.Errorf("%s: %v, want success", tc.what, err)
				case tc.want != nil && !errors.Is(err, tc.want):
					t.Errorf("%s: %v, want an error matching %v", tc.what, err, tc.want)
				default:
					t.Logf("%s: %v", tc.what, err)
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("%s: no answer in 15s", tc.what)
			}
		})
	}
}

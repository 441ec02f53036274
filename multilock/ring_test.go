package multilock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/multilock"
	"github.com/redis/go-redis/v9"
)

// On a go-redis Ring of three redis-servers, which places each key on a
// shard by its hash tag: a multi-lock runs one script on the shard of its
// first key, so it is safe only when all its names share one hash tag.
// Other multi-locks are refused before anything is sent (else the script
// would create the other names' state on the wrong shard, where single
// locks of those names never look: one mutex held twice). WithReplicaAck
// is refused on a Ring too: its WAIT would cover one shard's connection
// only.
func TestRing(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and no redis-server on PATH")
		}
		t.Skip("no redis-server on PATH")
	}
	addrs := map[string]string{}
	direct := map[string]*redis.Client{} // by address
	for i := range 3 {
		srv, err := redisserver.Start()
		if err != nil {
			t.Fatalf("starting shard %d: %v", i, err)
		}
		t.Cleanup(srv.Stop)
		addrs[fmt.Sprintf("shard%d", i)] = srv.Addr
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		direct[srv.Addr] = rdb
	}
	ctx := context.Background()
	// Each subtest has its own key prefix, so keys one leaves (a released
	// semaphore keeps its :s key for a second) do not count in another.
	const prefix, onePrefix = "rg:d:", "rg:o:"
	newRing := func(t *testing.T) *redis.Ring {
		rdb := redis.NewRing(&redis.RingOptions{Addrs: addrs})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	newClient := func(t *testing.T, prefix string) *fairlock.Client {
		c, err := fairlock.New(newRing(t), fairlock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// shardOf returns the address of the shard holding name's keys (an
	// untagged name's keys carry the tag {name}).
	ring := newRing(t)
	shardOf := func(key string) string {
		c, err := ring.GetShardClientForKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return c.Options().Addr
	}
	// Names whose keys live on different shards, and one more on x's shard
	// under another tag.
	x := "m0"
	var y, z string
	for i := 1; i < 1000 && (y == "" || z == ""); i++ {
		n := fmt.Sprintf("m%d", i)
		switch shardOf(prefix + "{" + n + "}:s") {
		case shardOf(prefix + "{" + x + "}:s"):
			z = cmp(z, n)
		default:
			y = cmp(y, n)
		}
	}
	if y == "" || z == "" {
		t.Fatal("found no names on the shards needed")
	}
	// keysOn returns how many keys under prefix each shard holds.
	keysOn := func(prefix string) map[string]int {
		n := map[string]int{}
		for addr, rdb := range direct {
			ks, err := rdb.Keys(ctx, prefix+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			n[addr] = len(ks)
		}
		return n
	}

	t.Run("WithReplicaAck refused", func(t *testing.T) {
		c, err := fairlock.New(newRing(t), fairlock.WithReplicaAck(1, time.Second))
		if err == nil {
			c.Close()
		}
		fltest.IsErr(t, "New(ring, WithReplicaAck)", err, fairlock.ErrInvalidArgument)
	})

	t.Run("different tags refused", func(t *testing.T) {
		a, b := newClient(t, prefix), newClient(t, prefix)
		for _, pair := range [][2]string{{x, y}, {x, z}, {"{t1}:a", "{t2}:a"}} {
			l, err := multilock.Lock(ctx, a, pair[0], pair[1])
			if err == nil {
				// Today's behaviour: granted. Show what that costs.
				for _, name := range pair {
					single, err := b.TryAcquire(ctx, multilock.Mutex(name))
					if err == nil {
						t.Errorf("mutex %q held twice: by the multi-lock of %q and %q and by a single lock (shards %s, %s)",
							name, pair[0], pair[1], shardOf(prefix+"{"+pair[0]+"}:s"), shardOf(prefix+"{"+pair[1]+"}:s"))
						_ = single.Release(ctx)
					}
				}
				_ = l.Release(ctx)
				t.Fatalf("multi-lock of %q and %q on a Ring granted, want ErrCrossSlot", pair[0], pair[1])
			}
			fltest.IsErr(t, fmt.Sprintf("multi-lock of %q and %q", pair[0], pair[1]), err, fairlock.ErrCrossSlot)
			if !strings.Contains(err.Error(), "hash tag") {
				t.Errorf("error %q does not say how to co-locate", err)
			}
		}
		for addr, n := range keysOn(prefix) {
			if n != 0 {
				t.Errorf("refused requests left %d keys on %s", n, addr)
			}
		}
	})

	t.Run("one tag works", func(t *testing.T) {
		a, b := newClient(t, onePrefix), newClient(t, onePrefix)
		names := []string{"{acct}:1", "{acct}:2", "{acct}:3"}
		l, err := multilock.Lock(ctx, a, names...)
		if err != nil {
			t.Fatalf("multi-lock of %q: %v", names, err)
		}
		for _, name := range names {
			_, err := b.TryAcquire(ctx, multilock.Mutex(name))
			fltest.IsErr(t, "TryAcquire of "+name+" while the multi-lock holds it", err, fairlock.ErrNotAcquired)
		}
		shards := 0
		for _, n := range keysOn(onePrefix) {
			if n > 0 {
				shards++
			}
		}
		if shards != 1 {
			t.Errorf("a multi-lock of one tag has keys on %d shards, want 1", shards)
		}
		// A single waiter is handed the part on the multi-lock's release.
		got := fltest.Async(func() (*fairlock.Lease, error) { return b.Acquire(ctx, multilock.Mutex(names[1])) })
		fltest.WaitWaiters(t, b, names[1], 1)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.Err != nil {
				t.Fatalf("single waiter: %v", r.Err)
			}
			_ = r.Lease.Release(ctx)
		case <-time.After(10 * time.Second):
			t.Fatal("single waiter not granted after the multi-lock's release")
		}
	})

	// Clients on separate Rings loop: some multi-lock {ex}:a and {ex}:b,
	// others lock one of them alone. Occupancy counters of the test's own
	// see every critical section.
	t.Run("mutual exclusion", func(t *testing.T) {
		const rounds = 40
		var inA, inB, violations, grants atomic.Int64
		enter := func(ns ...*atomic.Int64) {
			for _, n := range ns {
				if n.Add(1) != 1 {
					violations.Add(1)
				}
			}
			grants.Add(1)
			time.Sleep(200 * time.Microsecond)
			for _, n := range ns {
				n.Add(-1)
			}
		}
		type worker struct {
			lock func(c *fairlock.Client) (*fairlock.Lease, error)
			in   []*atomic.Int64
		}
		workers := []worker{
			{func(c *fairlock.Client) (*fairlock.Lease, error) { return multilock.Lock(ctx, c, "{ex}:a", "{ex}:b") }, []*atomic.Int64{&inA, &inB}},
			{func(c *fairlock.Client) (*fairlock.Lease, error) { return multilock.Lock(ctx, c, "{ex}:b", "{ex}:a") }, []*atomic.Int64{&inA, &inB}},
			{func(c *fairlock.Client) (*fairlock.Lease, error) { return c.Acquire(ctx, multilock.Mutex("{ex}:a")) }, []*atomic.Int64{&inA}},
			{func(c *fairlock.Client) (*fairlock.Lease, error) { return c.Acquire(ctx, multilock.Mutex("{ex}:a")) }, []*atomic.Int64{&inA}},
			{func(c *fairlock.Client) (*fairlock.Lease, error) { return c.Acquire(ctx, multilock.Mutex("{ex}:b")) }, []*atomic.Int64{&inB}},
			{func(c *fairlock.Client) (*fairlock.Lease, error) { return c.Acquire(ctx, multilock.Mutex("{ex}:b")) }, []*atomic.Int64{&inB}},
		}
		start := time.Now()
		var wg sync.WaitGroup
		for _, w := range workers {
			c := newClient(t, "rg:x:")
			wg.Go(func() {
				for range rounds {
					l, err := w.lock(c)
					if err != nil {
						t.Errorf("lock: %v", err)
						return
					}
					enter(w.in...)
					if err := l.Release(ctx); err != nil && !errors.Is(err, fairlock.ErrLeaseLost) {
						t.Errorf("release: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%d grants in %v, %d violations", grants.Load(), time.Since(start).Round(time.Millisecond), violations.Load())
		if v := violations.Load(); v != 0 {
			t.Fatalf("%d critical sections overlapped", v)
		}
	})
}

// cmp returns s if it is set, else n.
func cmp(s, n string) string {
	if s != "" {
		return s
	}
	return n
}

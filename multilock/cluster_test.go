package multilock_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/multilock"
	"github.com/redis/go-redis/v9"
)

// On a three-master Redis Cluster: semaphores on names spread over every
// node, hand-offs through wake lists, multi-locks on hash-tagged names
// (whose scripts reach the keys of a multi-lock's other semaphores without
// declaring them), and the clear error for names in different slots.
func TestCluster(t *testing.T) {
	if _, err := redisserver.Binary("redis-server"); err != nil {
		if os.Getenv("CI") == "true" || redistest.RealOnly() {
			t.Fatalf("CI=true or %s=1 and no redis-server: %v", redistest.EnvRealOnly, err)
		}
		t.Skip(err)
	}
	cl, err := redisserver.StartCluster(3)
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	defer cl.Stop()
	newClient := func() *fairlock.Client {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
		t.Cleanup(func() { rdb.Close() })
		c, err := fairlock.New(rdb, fairlock.WithPrefix("cl:"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx := context.Background()

	t.Run("names on every node", func(t *testing.T) {
		a, b := newClient(), newClient()
		nodes := map[string]bool{}
		admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
		defer admin.Close()
		var wg sync.WaitGroup
		for i := range 30 {
			name := fmt.Sprintf("job-%d", i)
			held, err := a.Acquire(ctx, fairlock.Request{Name: name, Capacity: 1, Permits: 1})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			node, err := admin.MasterForKey(ctx, "cl:{"+name+"}:s")
			if err != nil {
				t.Fatal(err)
			}
			nodes[node.Options().Addr] = true
			// A waiter in another process is woken through its wake list,
			// which lives in the semaphore's slot.
			wg.Go(func() {
				l, err := b.Acquire(ctx, fairlock.Request{Name: name, Capacity: 1, Permits: 1})
				if err != nil {
					t.Errorf("%s waiter: %v", name, err)
					return
				}
				if l.Token() <= held.Token() {
					t.Errorf("%s: token %d after %d", name, l.Token(), held.Token())
				}
				_ = l.Release(ctx)
			})
			fltest.WaitWaiters(t, a, name, 1)
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
		if len(nodes) != 3 {
			t.Fatalf("30 names landed on %d of 3 nodes", len(nodes))
		}
	})

	t.Run("hash-tagged multi-lock", func(t *testing.T) {
		a, b := newClient(), newClient()
		held, err := a.Acquire(ctx, fairlock.Request{Name: "{acct}:1", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *fairlock.Lease, 1)
		go func() {
			l, err := multilock.Lock(ctx, b, "{acct}:2", "{acct}:1")
			if err != nil {
				t.Errorf("multi-lock: %v", err)
			}
			got <- l
		}()
		fltest.WaitWaiters(t, a, "{acct}:2", 1)
		// This release runs a script on {acct}:1's keys that grants the
		// multi-lock on {acct}:2 as well.
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var l *fairlock.Lease
		select {
		case l = <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("multi-lock not granted")
		}
		if l == nil {
			return
		}
		_, err = a.TryAcquire(ctx, fairlock.Request{Name: "{acct}:2", Capacity: 1, Permits: 1})
		fltest.IsErr(t, "TryAcquire of a part the multi-lock holds", err, fairlock.ErrNotAcquired)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		both, err := multilock.TryAcquire(ctx, a, multilock.Mutex("{acct}:1"), multilock.Mutex("{acct}:2"))
		if err != nil {
			t.Fatalf("TryAcquire after the release: %v", err)
		}
		_ = both.Release(ctx)
	})

	t.Run("resharding", func(t *testing.T) {
		// A semaphore with a holder and no waiters has its slot moved to
		// another node; the holder keeps renewing, and the semaphore works on.
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
		defer rdb.Close()
		a, err := fairlock.New(rdb, fairlock.WithPrefix("cl:"), fairlock.WithLeaseTTL(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		req := fairlock.Request{Name: "moved", Capacity: 1, Permits: 1}
		held, err := a.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		slot, err := rdb.ClusterKeySlot(ctx, "cl:{moved}:s").Result()
		if err != nil {
			t.Fatal(err)
		}
		from, err := cl.NodeOf(ctx, int(slot))
		if err != nil {
			t.Fatal(err)
		}
		to := (from + 1) % len(cl.Nodes)
		if err := cl.MoveSlot(ctx, int(slot), to); err != nil {
			t.Fatalf("moving slot %d: %v", slot, err)
		}
		if now, err := cl.NodeOf(ctx, int(slot)); err != nil || now != to {
			t.Fatalf("slot %d on node %d after the move (%v), want %d", slot, now, err, to)
		}
		time.Sleep(time.Second) // several renewals, on the new node
		if err := held.Err(); err != nil {
			t.Fatalf("lease lost across the resharding: %v", err)
		}
		b := newClient()
		got := make(chan *fairlock.Lease, 1)
		go func() {
			l, err := b.Acquire(ctx, req)
			if err != nil {
				t.Errorf("waiter after the move: %v", err)
			}
			got <- l
		}()
		fltest.WaitWaiters(t, b, "moved", 1)
		if err := held.Release(ctx); err != nil {
			t.Fatalf("release after the move: %v", err)
		}
		select {
		case l := <-got:
			if l != nil {
				if l.Token() <= held.Token() {
					t.Errorf("token %d after %d", l.Token(), held.Token())
				}
				_ = l.Release(ctx)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("waiter not granted after the move")
		}
		t.Logf("slot %d moved from node %d to node %d under a live lease", slot, from, to)
	})

	t.Run("cross-slot multi-lock", func(t *testing.T) {
		_, err := multilock.Lock(ctx, newClient(), "acct:1", "acct:2")
		fltest.IsErr(t, "multi-lock across slots", err, fairlock.ErrCrossSlot)
	})
}

package faulttest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A release refused because its semaphore's slot is being resharded (its
// keys split between two nodes: TRYAGAIN, or ASK and then TRYAGAIN) is
// sent again until it lands, so the next waiter is granted soon after the
// slot settles, not a lease TTL (a minute here) later. The slot is moved
// live, one key per MIGRATE, and the holder releases when the first key
// has moved.
func TestReleaseDuringReshard(t *testing.T) {
	redistest.Long(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and no redis-server on PATH")
		}
		t.Skip("no redis-server on PATH")
	}
	cl, err := redisserver.StartCluster(3)
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	defer cl.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const prefix, name = "rr:", "{rr}:m"
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer admin.Close()
	slot64, err := admin.ClusterKeySlot(ctx, prefix+name+":s").Result()
	if err != nil {
		t.Fatal(err)
	}
	slot := int(slot64)
	client := func() *fairlock.Client {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
		t.Cleanup(func() { rdb.Close() })
		c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	req := fairlock.Request{Name: name, Capacity: 1, Permits: 1}
	holder, waiter := client(), client()
	l, err := holder.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *fairlock.Lease
		err error
		at  time.Time
	}
	granted := make(chan result, 1)
	go func() {
		w, err := waiter.Acquire(ctx, req)
		granted <- result{w, err, time.Now()}
	}()
	// The waiter is queued once the queue key exists.
	for admin.Exists(ctx, prefix+name+":q").Val() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the waiter never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}

	from, err := cl.NodeOf(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	var releaseErr error
	released := false
	var settled time.Time
	err = cl.MigrateSlot(ctx, slot, (from+1)%len(cl.Nodes), redisserver.Migration{
		Batch: 1,
		Pause: 100 * time.Millisecond,
		Hook: func(s redisserver.MigrationStep) {
			switch {
			case s.Phase == "batch" && !released:
				released = true
				releaseErr = l.Release(ctx)
			case s.Phase == "closed":
				settled = time.Now()
			}
		},
	})
	if err != nil {
		t.Fatalf("migrating slot %d: %v", slot, err)
	}
	if !released {
		t.Fatal("the slot had no key to move")
	}
	// The release met the split slot: refused for now, sent again.
	if !errors.Is(releaseErr, fairlock.ErrRedis) {
		t.Fatalf("Release during the reshard = %v; want an error matching ErrRedis (refused mid-reshard, sent again)", releaseErr)
	}
	select {
	case r := <-granted:
		if r.err != nil {
			t.Fatalf("the waiter: %v", r.err)
		}
		defer r.l.Release(ctx)
		after := r.at.Sub(settled)
		t.Logf("release refused mid-reshard: %v; the waiter was granted %v after the slot settled", releaseErr, after.Round(time.Millisecond))
		if after > settledBound {
			t.Errorf("the waiter was granted %v after the slot settled; want within %v (the lease TTL is a minute)", after, settledBound)
		}
	case <-time.After(settledBound + 5*time.Second):
		t.Fatalf("the waiter was not granted within %v of the slot settling (the lease TTL is a minute)", settledBound+5*time.Second)
	}
}

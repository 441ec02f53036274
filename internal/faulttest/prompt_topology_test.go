package faulttest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// promptCalls runs Acquire, TryAcquire and Status of name on c, under a
// deadline and under a context that never ends, and fails t unless each
// returns an error matching ErrRedis within promptBound; then Close,
// which must return as soon.
func promptCalls(t *testing.T, what string, c *fairlock.Client, name string) {
	t.Helper()
	req := fairlock.Request{Name: name, Capacity: 1, Permits: 1}
	calls := []struct {
		name string
		run  func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error { _, err := c.Acquire(ctx, req); return err }},
		{"TryAcquire", func(ctx context.Context) error { _, err := c.TryAcquire(ctx, req); return err }},
		{"Status", func(ctx context.Context) error { _, err := c.Status(ctx, name); return err }},
	}
	for _, deadline := range []bool{true, false} {
		for _, cl := range calls {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if deadline {
				ctx, cancel = context.WithTimeout(ctx, 1500*time.Millisecond)
			}
			start := time.Now()
			err := cl.run(ctx)
			took := time.Since(start)
			cancel()
			t.Logf("%s: %s (deadline %v) returned after %v: %v", what, cl.name, deadline, took.Round(time.Millisecond), err)
			if !errors.Is(err, fairlock.ErrRedis) || took > promptBound {
				t.Errorf("%s: %s (deadline %v) returned after %v with %v; want an error matching ErrRedis within %v", what, cl.name, deadline, took.Round(time.Millisecond), err, promptBound)
			}
		}
	}
	start := time.Now()
	_ = c.Close()
	took := time.Since(start)
	t.Logf("%s: Close took %v", what, took.Round(time.Millisecond))
	if took > promptBound {
		t.Errorf("%s: Close took %v; want at once", what, took.Round(time.Millisecond))
	}
}

// On a Redis Cluster whose master of a name's slot is killed, calls on
// that name report ErrRedis at once, through go-redis's node clients:
// those that existed when New ran (the go-redis client was used before,
// and a fairlock call has reached the Cluster since) and those made later
// (a go-redis client first used by fairlock after the kill: it loads its
// slot map from the nodes still up, one of its seeds refusing).
func TestPromptErrorsCluster(t *testing.T) {
	redistest.Long(t)
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	cl, err := redisserver.StartCluster(3)
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	defer cl.Stop()
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	victim := cl.Nodes[2]
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer admin.Close()
	// A name whose slot the victim serves, and one on another master.
	var down, up string
	for i := 0; down == "" || up == ""; i++ {
		name := fmt.Sprintf("n%d", i)
		node, err := admin.MasterForKey(ctx, prefix+"{"+name+"}:s")
		if err != nil {
			t.Fatal(err)
		}
		if node.Options().Addr == victim.Addr {
			down = name
		} else {
			up = name
		}
	}
	newClient := func(use bool) *fairlock.Client {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
		t.Cleanup(func() { rdb.Close() })
		if use {
			// Its node clients exist before New.
			if err := rdb.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
				t.Fatal(err)
			}
		}
		c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	used, later := newClient(true), newClient(false)
	if _, err := used.Status(ctx, up); err != nil {
		t.Fatal(err)
	}
	victim.Kill()
	promptCalls(t, "nodes made before New", used, down)
	promptCalls(t, "nodes made after New", later, down)
}

// With Sentinel, a failover client whose master is killed (and not yet
// replaced) reports ErrRedis at once.
func TestPromptErrorsSentinel(t *testing.T) {
	redistest.Long(t)
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	// Sentinel fails over only a minute after the master dies: not while
	// the test runs.
	set, err := redisserver.StartSentinel(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Stop()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redisserver.MasterName, SentinelAddrs: set.SentinelAddrs()})
	t.Cleanup(func() { rdb.Close() })
	c, err := fairlock.New(rdb, fairlock.WithPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Status(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	set.Master.Kill()
	promptCalls(t, "master killed", c, "s")
}

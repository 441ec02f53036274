package fairlock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A cluster-enabled node that serves every slot, reached through a plain
// *redis.Client (one server, to the client): the client hears its grants
// on its one wake list, which has a hash tag of its own, so its blocking
// read (that list and its control list) stays in one slot, and the
// scripts, run on the node that holds every slot, push onto it. Waiters on
// several semaphores hear their grants at once, not at their refresh,
// whether a release, a condition wait or a signal hands the permit on.
func TestClusterEnabledNodeThroughPlainClient(t *testing.T) {
	redistest.Long(t) // starts a cluster-enabled server: the full suite
	// The functions, as a program's client calls them (the tests' own
	// transform runs every script as EVAL, which a node in cluster mode
	// does not hold to one slot when it declares no flags).
	noTransform(t)
	ctx := context.Background()
	b := clusterNode(t)
	prefix := WithPrefix(redistest.Prefix(t))
	// A refresh every 5 s: a grant heard sooner came by the wake-up.
	c, err := New(b.Client(t), prefix, WithWaiterTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holder, err := New(b.Client(t), prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	names := []string{"a", "b", "c"}
	if k, _ := c.keys("a"); k.Wake(c.id) == k.OwnWake(c.id) {
		t.Fatalf("client id %q: one wake list per semaphore; want the client's one list on one server", c.id)
	}
	mutex := func(name string) Request { return Request{Name: name, Capacity: 1, Permits: 1} }
	held := make([]*Lease, len(names))
	for i, name := range names {
		if held[i], err = holder.Acquire(ctx, mutex(name)); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan string, len(names))
	for _, name := range names {
		startWait(t, c, mutex(name), got)
	}
	for i, name := range names {
		start := time.Now()
		if i == len(names)-1 {
			// The last one is handed on by a condition wait, which
			// releases the lease as it begins to wait (the wait op).
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go func() { _, _ = held[i].condWait(wctx, "cv") }()
		} else if err := held[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got:
			if g != name {
				t.Fatalf("after %s's release: %s", name, g)
			}
			if took := time.Since(start); took > 2500*time.Millisecond {
				t.Fatalf("%s's waiter heard its grant %v after the release; its refresh comes every 5 s: the blocking read did not hear it", name, took.Round(time.Millisecond))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s's waiter not granted 10 s after the release", name)
		}
	}
	// A condition's waiter, granted by the signal that wakes it (the
	// signal op's script grants the free permit).
	ld, err := c.Acquire(ctx, mutex("d"))
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() {
		l, err := ld.condWait(ctx, "cv")
		if l != nil {
			_ = l.Release(ctx)
		}
		woke <- err
	}()
	var start time.Time
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		start = time.Now()
		n, err := holder.signal(ctx, "d", "cv", false)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("d: no waiter on the condition")
		}
	}
	select {
	case err := <-woke:
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 2500*time.Millisecond {
			t.Fatalf("d's condition waiter heard its grant %v after the signal; its refresh comes every 5 s: the blocking read did not hear it", took.Round(time.Millisecond))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("d's condition waiter not granted 10 s after the signal")
	}
}

// clusterNode starts a redis-server in cluster mode that serves every slot
// (stopped when t ends), or skips t (fails it under CI) without one.
func clusterNode(t testing.TB) *redistest.Backend {
	t.Helper()
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	ctx := context.Background()
	srv, err := redisserver.Start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	b := &redistest.Backend{Name: "cluster-enabled node", Addr: srv.Addr}
	admin := b.Client(t)
	if err := admin.ClusterAddSlotsRange(ctx, 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, err := admin.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's cluster is not ok: %v %s", err, info)
		}
	}
}

// The same node, with another program's value at the client's one wake
// list: the client's rooms move to their semaphores' own lists, each read
// with a control list in its slot, so the node takes the reads and the
// waiters hear their grants by wake-up. Their refresh comes every 20 s
// and the holder's leases last a minute, both after the test's 10 s bound
// on each grant: a grant heard at all came by the wake-up.
func TestClusterEnabledNodeForeignWakeList(t *testing.T) {
	redistest.Long(t) // starts a cluster-enabled server: the full suite
	noTransform(t)
	ctx := context.Background()
	b := clusterNode(t)
	prefix := WithPrefix(redistest.Prefix(t))
	c, err := New(b.Client(t), prefix, WithWaiterTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Leases of a minute: no lease expiry brings a waiter's maintain
	// forward either.
	holder, err := New(b.Client(t), prefix, WithLeaseTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	one := c.waits.ProcessList()
	if one == "" {
		t.Fatalf("client id %q: no one wake list; want one on one server", c.id)
	}
	if err := b.Client(t).Set(ctx, one, "another program's", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	names := []string{"a", "b", "c"}
	mutex := func(name string) Request { return Request{Name: name, Capacity: 1, Permits: 1} }
	held := make([]*Lease, len(names))
	for i, name := range names {
		if held[i], err = holder.Acquire(ctx, mutex(name)); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan string, len(names))
	for _, name := range names {
		startWait(t, c, mutex(name), got)
	}
	for i, name := range names {
		if err := held[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got:
			if g != name {
				t.Fatalf("after %s's release: %s", name, g)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s's waiter not granted 10 s after the release (its refresh comes every 20 s): no blocking read heard its own wake list", name)
		}
	}
}

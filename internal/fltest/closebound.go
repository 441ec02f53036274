package fltest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
)

// Servers says where a Connect's client connects: a single server's
// address, a Cluster's nodes' (Cluster set), or a Sentinel set's
// sentinels' (MasterName set: the client reaches the master through them).
type Servers struct {
	Addrs      []string
	Cluster    bool
	MasterName string
}

// Connect returns a fairlock client through one Redis client library, on
// the servers s, closed when the test ends.
type Connect func(t *testing.T, s Servers, opts ...fairlock.Option) *fairlock.Client

// returnedBy is how long after Close returns a call that Close saw end
// may take to hand its result to its caller: Close sees it end in its
// last deferred step (an acquisition's count, a lease's mutex).
const returnedBy = 100 * time.Millisecond

// CloseBound checks Close's bound through connect's client library, on a
// single node, on a three-node Cluster and on a Sentinel set (a master, a
// replica, three sentinels; the client connected through the sentinels)
// that it starts: with one lease held and Acquire calls blocked (their
// contexts able to end; in 8 hash slots on the Cluster, so that 8
// blocking reads wait), and, Redis stalled, one more Acquire whose script
// call is on its way, Redis stalled (SIGSTOP) or refusing connections
// (killed) (on the Sentinel set, the master; the sentinels and the
// replica keep running, and no failover begins within the row, as in the
// moments after a master stalls or dies), Close returns within bound
// of its call (checked with a generous margin), every blocked Acquire has
// returned ErrClosed by then, and once a stalled Redis resumes no live
// waiter of the closed client is left in any queue. It runs in the full
// suite only (redistest.Long): each row waits out a waiter TTL or more.
func CloseBound(t *testing.T, bound time.Duration, connect Connect) {
	redistest.Long(t)
	for _, topo := range []string{"single", "cluster", "sentinel"} {
		for _, fault := range []string{"stalled", "refusing"} {
			t.Run(topo+"/"+fault, func(t *testing.T) {
				// Each row has servers of its own and spends its time
				// waiting on the fault: the rows run side by side.
				t.Parallel()
				// nodes are the servers the fault is applied to.
				var nodes []*redisserver.Server
				var servers Servers
				cluster := topo == "cluster"
				switch topo {
				case "cluster":
					cl, err := redisserver.StartCluster(3)
					if err != nil {
						t.Skipf("no Cluster: %v", err)
					}
					defer cl.Stop()
					nodes = cl.Nodes
					servers.Cluster = true
					for _, n := range nodes {
						servers.Addrs = append(servers.Addrs, n.Addr)
					}
				case "sentinel":
					// The master is declared down after a minute: longer
					// than the row, so no failover begins.
					set, err := redisserver.StartSentinel(time.Minute)
					if err != nil {
						t.Skipf("no Sentinel set: %v", err)
					}
					defer set.Stop()
					nodes = []*redisserver.Server{set.Master}
					servers = Servers{Addrs: set.SentinelAddrs(), MasterName: redisserver.MasterName}
				default:
					srv, err := redisserver.Start()
					if err != nil {
						t.Skipf("no redis-server: %v", err)
					}
					defer srv.Stop()
					nodes = []*redisserver.Server{srv}
					servers.Addrs = []string{srv.Addr}
				}
				prefix := fairlock.WithPrefix(redistest.Prefix(t))
				ctx := context.Background()
				other := connect(t, servers, prefix)
				c := connect(t, servers, prefix)
				req := func(name string) fairlock.Request { return fairlock.Request{Name: name, Capacity: 1, Permits: 1} }
				if _, err := c.Acquire(ctx, req("held")); err != nil {
					t.Fatal(err)
				}
				waits := 1
				if cluster {
					waits = 8
				}
				wctx, cancel := context.WithCancel(ctx)
				defer cancel()
				var blocked []<-chan Result
				for i := range waits {
					name := fmt.Sprintf("busy%d", i)
					if _, err := other.Acquire(ctx, req(name)); err != nil {
						t.Fatal(err)
					}
					blocked = append(blocked, Async(func() (*fairlock.Lease, error) { return c.Acquire(wctx, req(name)) }))
					WaitWaiters(t, other, name, 1)
				}
				for _, n := range nodes {
					switch fault {
					case "stalled":
						if err := n.Pause(); err != nil {
							t.Fatal(err)
						}
						defer func() { _ = n.Resume() }()
					case "refusing":
						n.Kill()
					}
				}
				if fault == "stalled" {
					// One more Acquire, whose script call is on its way
					// when Close begins (a client's retries of it must not
					// hold Close).
					blocked = append(blocked, Async(func() (*fairlock.Lease, error) { return c.Acquire(wctx, req("late")) }))
					time.Sleep(100 * time.Millisecond)
				}
				start := time.Now()
				err := c.Close()
				took := time.Since(start)
				t.Logf("%s, Redis %s: Close returned in %v (bound %v): %v", topo, fault, took, bound, err)
				if err != nil && !errors.Is(err, fairlock.ErrRedis) {
					t.Fatalf("Close with Redis %s = %v, want nil or an error matching ErrRedis", fault, err)
				}
				// A generous margin: the bound is a limit, not a measure.
				if limit := bound + 2*time.Second; took > limit {
					t.Fatalf("Close with Redis %s returned in %v, want within its bound %v (limit checked %v)", fault, took, bound, limit)
				}
				// Close sees an Acquire end in its last deferred step, a
				// moment before the Acquire hands its result over: that
				// moment is allowed (returnedBy), no more.
				for i, ch := range blocked {
					select {
					case r := <-ch:
						IsErr(t, "an Acquire blocked at Close", r.Err, fairlock.ErrClosed)
					case <-time.After(returnedBy):
						t.Fatalf("Acquire %d, blocked at Close, had not returned when Close did", i)
					}
				}
				if fault == "stalled" {
					for _, n := range nodes {
						if err := n.Resume(); err != nil {
							t.Fatal(err)
						}
					}
					for i := range waits {
						WaitWaiters(t, other, fmt.Sprintf("busy%d", i), 0)
					}
				}
			})
		}
	}
}

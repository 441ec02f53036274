package fairlock

// The function library on a replicated Redis and on a Cluster.

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// WithReplicaAck sends FCALL and WAIT in one pipeline; the library
// replicates, so a promoted replica runs the functions without loading
// them.
func TestFunctionsReplicaAck(t *testing.T) {
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	noTransform(t)
	ctx := context.Background()
	master, err := redisserver.Start("--repl-diskless-sync-delay", "0")
	if err != nil {
		t.Fatal(err)
	}
	defer master.Stop()
	replica, err := redisserver.Start("--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Stop()
	mb := &redistest.Backend{Name: "master", Addr: master.Addr}
	rb := &redistest.Backend{Name: "replica", Addr: replica.Addr}

	rdb := mb.Client(t)
	s, counted := countSent(rdb)
	c := fnClient(t, rdb, false, counted, WithReplicaAck(1, 10*time.Second))
	coreScenarios(t, c)
	// Status, which writes nothing, runs alone.
	if s.get("pipe fcall") == 0 || s.get("pipe wait") != s.get("pipe fcall") || s.get("evalsha") != 0 {
		t.Fatalf("commands sent with WithReplicaAck: %v, want FCALLs each pipelined with a WAIT", s.n)
	}

	radmin := rb.Client(t)
	if err := radmin.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	prdb := rb.Client(t)
	ps, pcounted := countSent(prdb)
	pc := fnClient(t, prdb, false, pcounted)
	coreScenarios(t, pc)
	if ps.get("fcall") == 0 || ps.get("function load") != 0 || ps.get("evalsha") != 0 {
		t.Fatalf("commands sent to the promoted replica: %v, want FCALL without FUNCTION LOAD", ps.n)
	}
}

// On a Cluster the library is loaded on every master, and again where a
// slot moves to a node that lacks it.
func TestFunctionsCluster(t *testing.T) {
	redistest.Long(t)        // starts a Cluster: the full suite
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	noTransform(t)
	cl, err := redisserver.StartCluster(3)
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	defer cl.Stop()
	ctx := context.Background()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer rdb.Close()
	c, err := New(rdb, WithPrefix("fn:"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	coreScenarios(t, c)
	lib := c.calls.Scripts.Lib.Name
	nodeHas := func(i int) bool {
		n := redis.NewClient(&redis.Options{Addr: cl.Nodes[i].Addr})
		defer n.Close()
		libs, err := n.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(libs) == 1
	}
	for i := range cl.Nodes {
		if !nodeHas(i) {
			t.Fatalf("node %d lacks the library after the first calls", i)
		}
	}

	// A slot moves to a node that never saw the library.
	name := "moved"
	slot64, err := rdb.ClusterKeySlot(ctx, "fn:{"+name+"}:s").Result()
	if err != nil {
		t.Fatal(err)
	}
	slot := int(slot64)
	from, err := cl.NodeOf(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	to := (from + 1) % len(cl.Nodes)
	n := redis.NewClient(&redis.Options{Addr: cl.Nodes[to].Addr})
	defer n.Close()
	if err := n.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cl.MoveSlot(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx, Request{Name: name, Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatalf("Acquire after the slot moved: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !nodeHas(to) {
		t.Fatal("the slot's new owner did not get the library")
	}
	if c.calls.Scripts.EvalOnly.Load() {
		t.Fatal("the client fell back to EVAL")
	}
}

package election_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The election's record goes through the engine's call path, and so keeps
// the engine's promises: these tests run on a real server of their own,
// which they pause, fill or watch.

// privateServer starts a redis-server for one test (a failure under
// CI=true when there is none, as for the shared one).
func privateServer(t *testing.T, args ...string) *redisserver.Server {
	t.Helper()
	redistest.RealBackend(t)
	srv, err := redisserver.Start(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Resume()
		srv.Stop()
	})
	return srv
}

// clientOn returns a fairlock client on rdb under prefix (one per test:
// redistest.Prefix gives a new one at each call).
func clientOn(t *testing.T, rdb *redis.Client, prefix string, opts ...fairlock.Option) *fairlock.Client {
	t.Helper()
	c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A leader process paused (SIGSTOP) past its lease, whose successor takes
// office and resigns before it resumes, publishes nothing when it resumes:
// its record timer, overdue, finds the lease lost (by the clock), and the
// record would not take a term that is not the mutex's live lease anyway.
// Every round, an observer started after the resignation sees no leader,
// and Leader says so.
func TestPausedLeaderDoesNotRepublish(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a real server's run for seconds; runs in the full suite (without -short)")
	}
	b := redistest.RealBackend(t)
	e := newEnv(t, b)
	const lease = time.Second
	obs := e.election(e.Client(), "republish")
	for round := range 5 {
		leader := startCandidate(t, b.Addr, e.Prefix, "republish", "old", lease)
		leader.term(10 * time.Second)
		next := startCandidate(t, b.Addr, e.Prefix, "republish", "new", lease)
		fltest.WaitWaiters(t, e.Client(), "republish", 1)
		leader.signal(syscall.SIGSTOP)
		next.term(10 * time.Second)
		_ = next.stdin.Close() // resigns
		if err := next.cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ch := obs.Observe(ctx)
		leader.signal(syscall.SIGCONT)
		leader.expect("lost ", 10*time.Second)
		// Several of the old leader's record periods (a third of the lease).
		deadline := time.After(2 * lease)
	watch:
		for {
			select {
			case info := <-ch:
				if info.Term != 0 {
					t.Fatalf("round %d: an observer started after the resignation saw %+v: the paused leader republished itself", round, info)
				}
			case <-deadline:
				break watch
			}
		}
		cancel()
		if info, err := obs.Leader(context.Background()); !errors.Is(err, election.ErrNoLeader) {
			t.Fatalf("round %d: Leader() = %+v, %v; want ErrNoLeader", round, info, err)
		}
		_ = leader.stdin.Close()
		_ = leader.cmd.Wait()
	}
}

// Leader and Campaign return by their context's end while Redis stalls
// (its process stopped): Leader as it reads the record, Campaign as it
// records itself; a Campaign whose context ended does not return a
// leadership, and gives the mutex back once Redis answers again.
func TestElectionDeadlinesWhileRedisStalls(t *testing.T) {
	srv := privateServer(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	el, err := election.New(clientOn(t, rdb, prefix), "stall")
	if err != nil {
		t.Fatal(err)
	}
	l, err := el.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = el.Leader(lctx)
	took := time.Since(start)
	cancel()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
		t.Errorf("Leader with a 300 ms deadline, Redis stalled: %v after %v; want the deadline within a second", err, took)
	}
	if err := l.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	// Redis stalls just as the next candidate records itself.
	crdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = crdb.Close() })
	var once sync.Once
	crdb.AddHook(stallOn{op: "leader_set", stall: func() { once.Do(func() { _ = srv.Pause() }) }})
	el2, err := election.New(clientOn(t, crdb, prefix), "stall")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	start = time.Now()
	won, err := el2.Campaign(cctx, "b")
	took = time.Since(start)
	cancel()
	time.Sleep(500 * time.Millisecond) // past the context's end, still stalled
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if won != nil || !errors.Is(err, context.DeadlineExceeded) || took > 2500*time.Millisecond {
		t.Fatalf("Campaign with a 1.5 s deadline, Redis stalled as it recorded: %v, %v after %v; want no leadership and the deadline within 2.5 s", won, err, took)
	}
	// The mutex it was granted is given back once Redis answers.
	waitNoHolder(t, clientOn(t, rdb, prefix), "stall")
}

// waitNoHolder waits until the semaphore name has no live holder.
func waitNoHolder(t *testing.T, c *fairlock.Client, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Status(context.Background(), name)
		if err == nil && st.Held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still held 10 s later: %+v, %v", name, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stallOn is a go-redis hook that calls stall before it sends a script
// call carrying op, alone or in a pipeline.
type stallOn struct {
	op    string
	stall func()
}

func (s stallOn) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s stallOn) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if slices.Contains(cmd.Args(), any(s.op)) {
				s.stall()
			}
		}
		return next(ctx, cmds)
	}
}
func (s stallOn) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if slices.Contains(cmd.Args(), any(s.op)) {
			s.stall()
		}
		return next(ctx, cmd)
	}
}

// A full Redis (maxmemory, noeviction) still elects: the leader resigns,
// the queued candidate is granted the mutex and records itself, and
// Leader reports it.
func TestElectionWhileRedisIsFull(t *testing.T) {
	srv := privateServer(t, "--maxmemory-policy", "noeviction")
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	el, err := election.New(clientOn(t, rdb, prefix), "full")
	if err != nil {
		t.Fatal(err)
	}
	first, err := el.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan error, 1)
	var second *election.Leadership
	el2, err := election.New(clientOn(t, rdb, prefix), "full")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		var err error
		second, err = el2.Campaign(ctx, "b")
		queued <- err
	}()
	fltest.WaitWaiters(t, clientOn(t, rdb, prefix), "full", 1)
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "junk", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a write with maxmemory 1 = %v, want OOM", err)
	}
	if err := first.Resign(ctx); err != nil {
		t.Fatalf("Resign on a full Redis: %v", err)
	}
	select {
	case err := <-queued:
		if err != nil {
			t.Fatalf("the queued candidate's Campaign on a full Redis: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queued candidate did not take office on a full Redis")
	}
	if info, err := el.Leader(ctx); err != nil || info.Term != second.Term() || info.Value != "b" {
		t.Fatalf("Leader() on a full Redis = %+v, %v; want b at term %d", info, err, second.Term())
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	_ = second.Resign(ctx)
}

// With WithReplicaAck, the record is acknowledged by the replicas before
// Campaign returns: when the replica stops acknowledging just as the
// candidate records itself, Campaign fails with ErrNotReplicated and gives
// the mutex back, rather than return a leadership a failover could lose.
func TestElectionRecordWaitsForReplicas(t *testing.T) {
	master := privateServer(t, "--repl-diskless-sync-delay", "0")
	replica := privateServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	radmin := redis.NewClient(&redis.Options{Addr: replica.Addr})
	t.Cleanup(func() { _ = radmin.Close() })
	var once sync.Once
	rdb.AddHook(stallOn{op: "leader_set", stall: func() {
		// The replica leaves: nothing acknowledges the record.
		once.Do(func() { _ = radmin.Do(ctx, "REPLICAOF", "NO", "ONE").Err() })
	}})
	el, err := election.New(clientOn(t, rdb, prefix, fairlock.WithReplicaAck(1, 300*time.Millisecond)), "acked")
	if err != nil {
		t.Fatal(err)
	}
	// The mutex's grant is acknowledged (the replica is in sync then).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, _ := radmin.Info(ctx, "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not sync: %s", info)
		}
	}
	l, err := el.Campaign(ctx, "a")
	if l != nil || !errors.Is(err, fairlock.ErrNotReplicated) {
		t.Fatalf("Campaign while the replica stops acknowledging = %v, %v; want ErrNotReplicated", l, err)
	}
	waitNoHolder(t, clientOn(t, rdb, prefix), "acked")
}

package conformance

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/differential"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// Differential is the differential test (internal/differential) on
// histories this client made: the property machine's runs (see Property)
// are recorded as the scripts received them from this client, then
// replayed call by call, with calls sent again and a pause drawn, through
// this client (by EVALSHA and EVAL, as a client with a transform runs its
// scripts) on two servers of their own: one with the fast paths on, one
// with them off; and, on a third, through go-redis with the fast paths on.
// Every reply, and every key after every call, must be equal on all
// three: the two paths are equal on the arguments as this client renders
// them, and this client converts every reply (and reports every error of
// the engine's) as go-redis's Backend does.
//
// It runs on the plain server only (the replay servers are plain ones); the
// root package's differential test replays far more histories (crashes,
// Redis's clock moved, crowds, call machines) through go-redis.
func differentialRuns(t *testing.T, tg Target) {
	if tg.OpenAt == nil || tg.Mini || tg.Cluster || tg.Replicas > 0 {
		t.Skip("the differential test runs on the plain server")
	}
	ctx := context.Background()
	setChecks(t, 30, 12)
	pair := &differential.Pair{Backend: "redis-server through the client under test"}
	fast, general := differential.Transforms(nil)
	// Both servers allow DEBUG (a digest per key), or neither does (a
	// server before 7.0 has no such setting): the dumps compare alike.
	var debugArgs []string
	if srv, err := redisserver.Start("--enable-debug-command", "local"); err == nil {
		srv.Stop()
		debugArgs = []string{"--enable-debug-command", "local"}
	}
	goRedis := func(t *testing.T, addr string) func(...fairlock.Option) (*fairlock.Client, error) {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = rdb.Close() })
		return func(opts ...fairlock.Option) (*fairlock.Client, error) { return fairlock.New(rdb, opts...) }
	}
	for _, side := range []struct {
		r         **differential.Replayer
		name      string
		openAt    func(t *testing.T, addr string) func(...fairlock.Option) (*fairlock.Client, error)
		transform func(string) string
	}{
		{&pair.Fast, "fast paths on", tg.OpenAt, fast},
		{&pair.General, "fast paths off", tg.OpenAt, general},
		{&pair.Mirror, "go-redis, fast paths on", goRedis, fast},
	} {
		srv, err := redisserver.Start(debugArgs...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = rdb.Close() })
		c, err := side.openAt(t, srv.Addr)(testhook.Transform[fairlock.Option](side.transform))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		*side.r = &differential.Replayer{Name: side.name, RDB: rdb, Run: differential.ClientRunner(c), Debug: debugArgs != nil}
	}
	logKey := "fltest:log:" + rand.Text()
	record := []fairlock.Option{testhook.Transform[fairlock.Option](differential.Recording(logKey, nil))}
	var st pStats
	var calls, fastCalls, runs int
	rapid.Check(t, func(rt *rapid.T) {
		seed := rapid.Uint64().Draw(rt, "resend seed")
		pause := rapid.Bool().Draw(rt, "pause")
		tg.Admin.Del(ctx, logKey)
		runModel(rt, tg, record, &st)
		history, err := differential.ReadLog(ctx, tg.Admin, logKey)
		if err != nil {
			rt.Fatal(err)
		}
		if err := pair.Replay(ctx, history, seed, pause); err != nil {
			rt.Fatal(err)
		}
		runs++
		calls += len(history)
		fastCalls += pair.FastCount(ctx)
	})
	steps := 0
	for _, n := range pair.Steps {
		steps += n
	}
	t.Logf("%d histories of %d calls; %d calls replayed on each side (resends included), %d answered by a fast path; by op: %v",
		runs, calls, steps, fastCalls, pair.Steps)
	for _, op := range []string{"acquire", "try", "release", "leave"} {
		if pair.Steps[op] == 0 {
			t.Errorf("no %s call replayed: the replays compare too little", op)
		}
	}
	if fastCalls == 0 || fastCalls >= steps {
		t.Errorf("%d of %d calls answered by a fast path: the replays compare too little", fastCalls, steps)
	}
}

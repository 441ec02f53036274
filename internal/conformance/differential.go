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

// Differential is the differential test (internal/differential) through
// the client under test: the property machine's runs (see Property) are
// recorded as the scripts received them from this client, then replayed
// call by call, with calls sent again and a pause drawn, through this
// client on two servers of their own: one with the fast paths on, one with
// them off. Every reply, and every key after every call, must be equal on
// both. So the arguments as this client renders them, and the replies as
// it converts them, meet both paths.
//
// It runs on the plain server only (the replay servers are plain ones); the
// root package's differential test replays far more histories (crashes,
// Redis's clock moved, crowds, call machines) through go-redis.
func differentialRuns(t *testing.T, tg Target) {
	if tg.OpenAt == nil || tg.Mini || tg.Cluster || tg.Replicas > 0 {
		t.Skip("the differential test runs on the plain server")
	}
	ctx := context.Background()
	setChecks(t, 15, 3)
	pair := &differential.Pair{Backend: "redis-server through the client under test"}
	fast, general := differential.Transforms(nil)
	for _, side := range []struct {
		r         **differential.Replayer
		name      string
		transform func(string) string
	}{{&pair.Fast, "fast paths on", fast}, {&pair.General, "fast paths off", general}} {
		srv, err := redisserver.Start("--enable-debug-command", "local")
		debug := err == nil
		if !debug { // a server before 7.0 has no such setting
			srv, err = redisserver.Start()
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = rdb.Close() })
		c, err := tg.OpenAt(t, srv.Addr)(testhook.Transform[fairlock.Option](side.transform))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		*side.r = &differential.Replayer{Name: side.name, RDB: rdb, Run: differential.ClientRunner(c), Debug: debug}
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
	t.Logf("%d histories, %d calls (%d answered by a fast path) replayed", runs, calls, fastCalls)
	if calls == 0 || fastCalls == 0 || fastCalls == calls {
		t.Errorf("%d calls replayed, %d of them answered by a fast path: the replays compare too little", calls, fastCalls)
	}
}

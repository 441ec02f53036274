package fairlock

// The differential test (see internal/differential): histories recorded
// from this package's go-redis clients (the property machines, the scale
// scenarios, call machines that drive the scripts directly) are replayed
// with the fast paths on and off, and must agree call by call.

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/differential"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// The differential package's names, as this package's tests use them.
type (
	call     = differential.Call
	replayer = differential.Replayer
)

var (
	recording = differential.Recording
	replayed  = differential.Replayed
	compose   = differential.Compose
	readLog   = differential.ReadLog
	lineDiff  = differential.LineDiff
)

// runScript runs the script of set that serves c's op, with c's keys and
// arguments.
func runScript(ctx context.Context, set *script.Set, rdb RedisClient, c call) (any, error) {
	args := make([]any, len(c.Args))
	for i, a := range c.Args {
		args[i] = a
	}
	o := script.OpNamed(c.Op())
	if o == nil {
		return nil, fmt.Errorf("no script serves op %q", c.Op())
	}
	return runTest(ctx, set.ForOp(o), rdb, c.Keys, args...).Result()
}

// scriptRunner returns the runner of a replayer on rdb whose scripts pass
// through transform: go-redis's own Script, as the tests run scripts by
// hand.
func scriptRunner(rdb RedisClient, transform func(string) string) differential.Runner {
	set := script.NewSet(transform, nil)
	return func(ctx context.Context, c call) (any, error) { return runScript(ctx, set, rdb, c) }
}

// newReplayer returns a replayer named name of database db at addr, its
// scripts passed through transform; its database is flushed when t ends.
func newReplayer(t testing.TB, name, addr string, db int, transform func(string) string) *replayer {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DB: db})
	t.Cleanup(func() {
		rdb.FlushDB(context.Background())
		rdb.Close()
	})
	return &replayer{Name: name, RDB: rdb, Run: scriptRunner(rdb, transform)}
}

// replayPair is a differential.Pair as the call machines use it.
type replayPair struct{ *differential.Pair }

func (p replayPair) step(ctx context.Context, c call, step int) (any, error) {
	return p.Step(ctx, c, step)
}

// newReplayPair returns the replayers of a real server (two of its
// databases) or, for real false, of a miniredis of their own (two
// databases; its clock fixed, so that expiries read back exactly). The
// real server is one started for the replays, which allows DEBUG; where
// it cannot be started with that setting (a server before 7.0), the
// shared one.
func newReplayPair(t testing.TB, real bool, inner func(string) string) replayPair {
	t.Helper()
	dbFast, dbGeneral := differential.ReplayDBFast, differential.ReplayDBGeneral
	name, addr, debug := "", "", false
	if real {
		name, addr = "redis-server", redistest.RealBackend(t).Addr
		if srv, err := redisserver.Start("--enable-debug-command", "local"); err == nil {
			t.Cleanup(srv.Stop)
			addr, debug = srv.Addr, true
		}
	} else {
		name = "miniredis"
		m := miniredis.RunT(t)
		m.SetTime(time.Now())
		addr, dbFast, dbGeneral = m.Addr(), 1, 2
	}
	fast, general := differential.Transforms(inner)
	p := &differential.Pair{
		Backend: name,
		Fast:    newReplayer(t, "fast paths on", addr, dbFast, fast),
		General: newReplayer(t, "fast paths off", addr, dbGeneral, general),
	}
	p.Fast.Debug, p.General.Debug = debug, debug
	return replayPair{p}
}

// TestFastPathsMatchGeneralPath replays recorded histories with the fast
// paths on and off, on miniredis and on the real server, and fails at the
// first call whose reply or effect differs.
func TestFastPathsMatchGeneralPath(t *testing.T) {
	if redistest.Race && !testing.Short() {
		// Its cost is Lua and go-redis round trips, whose Go code the
		// rest of the package runs under -race: the detector would only
		// slow it (and its crowds, thousands of clients' goroutines,
		// several times over).
		redistest.RunWithoutRace(t)
		return
	}
	t.Run("calls", func(t *testing.T) {
		// Script calls drawn directly, in lockstep.
		diffCalls(t, t, 0, nil)
	})
	t.Run("property", func(t *testing.T) {
		redistest.Long(t)
		// The property machine on miniredis: its clock moves, processes
		// crash and pause, Redis's scripts are flushed.
		diffMachines(t, t, recordingBackend(t), replayPairs(t, nil), *diffPropertyChecks, nil, func(rt *rapid.T, b *redistest.Backend) {
			runMachine(rt, b, mconfig{frozen: true, wait: pWait, maxCap: 8})
		})
	})
	t.Run("crowds", func(t *testing.T) {
		redistest.Long(t)
		// The machine on the real server, in real time, with crowds (one
		// process, many requests), bulk grants and a doomed crowd's mass
		// expiry.
		b := redistest.RealBackend(t)
		setFlag(t, "rapid.steps", "20")
		// Crowds of thousands are too much for miniredis's interpreter.
		pairs := []replayPair{newReplayPair(t, true, nil)}
		diffMachines(t, t, b, pairs, *diffCrowdChecks, nil, func(rt *rapid.T, b *redistest.Backend) {
			runMachine(rt, b, mconfig{wait: pWait, maxCap: 8, scale: true, crowd: *diffCrowd, doom: true})
		})
	})
}

// Flags for longer differential runs of the crowd machine.
var (
	diffPropertyChecks = flag.Int("diff.property.checks", 60, "property machines TestFastPathsMatchGeneralPath records")
	diffCrowdChecks    = flag.Int("diff.crowd.checks", 3, "crowd machines TestFastPathsMatchGeneralPath records")
	diffCrowd          = flag.Int("diff.crowd", 300, "largest crowd TestFastPathsMatchGeneralPath draws")
)

// RecordAndReplay runs run, whose clients use b, with every client it
// creates recording its script calls (their scripts passed through
// inner, if not nil), then
// replays them with the fast paths on and off (see
// TestFastPathsMatchGeneralPath) on the real server, faithfully and once
// more with a pause before one call; the first difference fails t. The
// scale scenarios (package fairlock_test) call it.
func RecordAndReplay(t *testing.T, b *redistest.Backend, inner func(string) string, run func()) {
	t.Helper()
	ctx := context.Background()
	rdb := b.Client(t)
	logKey := "fltest:log:" + rand.Text()
	restore := setTestTransform(recording(logKey, inner))
	run()
	restore()
	calls, err := readLog(ctx, rdb, logKey)
	if err != nil {
		t.Fatal(err)
	}
	p := newReplayPair(t, true, nil)
	for _, pause := range []bool{false, true} {
		start := time.Now()
		if err := p.Replay(ctx, calls, 1, pause); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d calls (%d answered by a fast path) replayed in %v (pause %v)", len(calls), p.FastCount(ctx), time.Since(start), pause)
	}
}

// recordingBackend returns a miniredis whose clock the property machine moves, for
// recording; it runs even when FAIRLOCK_REAL_ONLY skips the miniredis
// tests, since it only produces histories.
func recordingBackend(t testing.TB) *redistest.Backend {
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	return &redistest.Backend{Name: "miniredis", Addr: m.Addr(), Mini: m}
}

// replayPairs returns the replayers of miniredis (unless
// FAIRLOCK_REAL_ONLY=1) and of the real server (when there is one; under
// CI=true there must be).
func replayPairs(t testing.TB, inner func(string) string) []replayPair {
	t.Helper()
	var pairs []replayPair
	if !redistest.RealOnly() {
		pairs = append(pairs, newReplayPair(t, false, inner))
	}
	if _, ok := redistest.Server(); ok || os.Getenv("CI") == "true" || redistest.RealOnly() {
		pairs = append(pairs, newReplayPair(t, true, inner))
	} else {
		t.Log("no redis-server: histories are replayed on miniredis only")
	}
	return pairs
}

// diffMachines runs checks property machines (0: the rapid.checks flag) on
// b, recording, through run, with every script passed through
// inner (a mutation, or nil), and replays each machine's history on
// pairs (whose scripts inner must pass through too); a difference fails the machine, which rapid then shrinks.
//
// Failures are reported to tb: t itself, or a recorder that keeps them
// (to show that a broken rule is caught).
func diffMachines(t *testing.T, tb rapid.TB, b *redistest.Backend, pairs []replayPair, checks int, inner func(string) string, run func(*rapid.T, *redistest.Backend)) {
	ctx := context.Background()
	logKey := "fltest:log:" + rand.Text()
	defer setTestTransform(recording(logKey, inner))()
	rdb := b.Client(t)
	if checks > 0 {
		setFlag(t, "rapid.checks", strconv.Itoa(checks))
	}
	var calls, runs, fast int
	rapid.Check(tb, func(rt *rapid.T) {
		seed := rapid.Uint64().Draw(rt, "resend seed")
		rdb.Del(ctx, logKey)
		run(rt, b)
		history, err := readLog(ctx, rdb, logKey)
		if err != nil {
			rt.Fatal(err)
		}
		calls += len(history)
		runs++
		pause := rapid.Bool().Draw(rt, "pause")
		for i, p := range pairs {
			if err := p.Replay(ctx, history, seed, pause); err != nil {
				rt.Fatal(err)
			}
			if i == 0 {
				fast += p.FastCount(ctx) // the replay began on an empty database
			}
		}
	})
	t.Logf("%d histories, %d calls (%d answered by a fast path), replayed on %d backends", runs, calls, fast, len(pairs))
}

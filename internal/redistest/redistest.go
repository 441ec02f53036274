// Package redistest runs fairlock's tests against both an embedded
// miniredis and a real redis-server that it starts on a free loopback port.
//
// With CI=true in the environment a missing redis-server fails the run;
// elsewhere the real-server half of each test is skipped with a message.
//
// The real server is the redis-server that internal/redisserver finds:
// from the folder in FAIRLOCK_REDIS_SERVER_DIR, else PATH. Main prints its
// name and version once per test binary. With FAIRLOCK_REAL_ONLY=1 the
// miniredis half is skipped (Each's miniredis subtests and every test that
// calls Mini), for runs that check another server build, and a missing
// real server fails the run as under CI=true.
package redistest

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// Backend is one Redis that a test runs against.
type Backend struct {
	Name string
	Addr string
	// Mini is the embedded server, whose clock tests may move; nil for a
	// real redis-server. Its key TTLs follow its clock, as in Redis.
	Mini *miniredis.Miniredis
	now  time.Time // Mini's clock once frozen
}

// Real reports whether b is a real redis-server.
func (b *Backend) Real() bool { return b.Mini == nil }

// Client returns a client of b, closed when the test ends.
func (b *Backend) Client(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: b.Addr}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Freeze fixes the embedded server's clock at the current time, so that
// only Advance moves it.
func (b *Backend) Freeze(t testing.TB) {
	t.Helper()
	if b.Mini == nil {
		t.Fatal("Freeze needs miniredis")
	}
	b.now = time.Now()
	b.Mini.SetTime(b.now)
}

// Advance moves the embedded server's frozen clock forward by d; TIME in
// scripts and key expiry both follow. It fails the test on a real server.
func (b *Backend) Advance(t testing.TB, d time.Duration) {
	t.Helper()
	if b.Mini == nil || b.now.IsZero() {
		t.Fatal("Advance needs a frozen miniredis")
	}
	b.now = b.now.Add(d)
	b.Mini.SetTime(b.now)
}

// EnvRealOnly is the environment variable that, set to 1, skips the
// miniredis half of the tests.
const EnvRealOnly = "FAIRLOCK_REAL_ONLY"

// RealOnly reports whether FAIRLOCK_REAL_ONLY=1: tests run on the real
// server only.
func RealOnly() bool { return os.Getenv(EnvRealOnly) == "1" }

// skipMini skips t when only the real server is to be tested.
func skipMini(t testing.TB) {
	t.Helper()
	if RealOnly() {
		t.Skip(EnvRealOnly + "=1: miniredis not tested")
	}
}

// Mini starts an embedded server for one test, with TTLs that follow its
// clock (the wall clock until frozen). It skips the test when
// FAIRLOCK_REAL_ONLY=1.
func Mini(t testing.TB) *Backend {
	t.Helper()
	skipMini(t)
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	return &Backend{Name: "miniredis", Addr: m.Addr(), Mini: m}
}

// shared is the package's real redis-server, started by Main, and
// sharedBuild what it is.
var (
	shared      *redisserver.Server
	sharedBuild redisserver.Build
)

// Server returns the name, version and program path of the shared real
// server, and false when there is none.
func Server() (redisserver.Build, bool) { return sharedBuild, shared != nil }

// Main runs a test binary: it starts the shared redis-server and prints
// its name and version to stderr, runs the tests, stops the server and
// fails the run if a fairlock goroutine outlived the tests. Without a
// server it exits with status 1 under CI=true or FAIRLOCK_REAL_ONLY=1;
// otherwise it prints why the real-server tests will be skipped.
func Main(m *testing.M) { MainWith(m, nil) }

// MainWith is Main, calling after (if not nil) once the tests have run.
func MainWith(m *testing.M, after func()) {
	// Tests break connections on purpose; go-redis would log every redial.
	redis.SetLogger(quiet{})
	srv, err := redisserver.Start()
	if err == nil {
		sharedBuild, err = describe(srv)
		if err != nil {
			srv.Stop()
		}
	}
	switch {
	case err == nil:
		shared = srv
		fmt.Fprintf(os.Stderr, "redistest: real server %s\n", sharedBuild)
	case os.Getenv("CI") == "true" || RealOnly():
		fmt.Fprintf(os.Stderr, "redistest: CI=true or %s=1 and no redis-server could be started: %v\n", EnvRealOnly, err)
		os.Exit(1)
	default:
		fmt.Fprintf(os.Stderr, "redistest: real-Redis tests skipped: %v\n", err)
	}
	code := m.Run()
	cleanupNorace()
	if after != nil {
		after()
	}
	if shared != nil {
		shared.Stop()
	}
	if code == 0 {
		if leaks := Leaks(5 * time.Second); leaks != "" {
			fmt.Fprintf(os.Stderr, "redistest: goroutines leaked:\n%s\n", leaks)
			code = 1
		}
	}
	os.Exit(code)
}

// describe names a started server from its INFO reply and the program
// that runs it.
func describe(srv *redisserver.Server) (redisserver.Build, error) {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return redisserver.Build{}, fmt.Errorf("INFO server on %s: %w", srv.Addr, err)
	}
	b, ok := redisserver.FromInfo(info)
	if !ok {
		return b, fmt.Errorf("INFO server on %s names no server version", srv.Addr)
	}
	b.Path, err = redisserver.Binary("redis-server")
	return b, err
}

// Each runs f as a subtest on a fresh miniredis (skipped when
// FAIRLOCK_REAL_ONLY=1) and on the shared real server (skipped when there
// is none and CI is not set).
func Each(t *testing.T, f func(t *testing.T, b *Backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		f(t, Mini(t))
	})
	t.Run("redis", func(t *testing.T) {
		f(t, RealBackend(t))
	})
}

// RealBackend returns the shared real server, or skips the test.
func RealBackend(t testing.TB) *Backend {
	t.Helper()
	if shared == nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and no redis-server")
		}
		t.Skip("no redis-server (" + redisserver.EnvDir + " or PATH)")
	}
	return &Backend{Name: "redis", Addr: shared.Addr}
}

// Prefix returns a key prefix unique to this test, so tests may share a
// server and run in parallel.
func Prefix(t testing.TB) string {
	name := regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_")
	return "t:" + name + ":" + rand.Text()[:6] + ":"
}

// leakFrame matches a function of fairlock's library packages (not its
// tests, not this package).
var leakFrame = regexp.MustCompile(`(?m)^github\.com/fairlock/fairlock(/semaphore|/multilock|/election|/latch|/barrier)?\.`)

// Leaks waits up to wait for every goroutine running fairlock library code
// to end, and returns the stacks of those that did not; a goroutine whose
// stack contains one of ignore is not counted.
func Leaks(wait time.Duration, ignore ...string) string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if leakFrame.MatchString(g) && !strings.Contains(g, "redistest.Leaks(") &&
				!slices.ContainsFunc(ignore, func(s string) bool { return strings.Contains(g, s) }) {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Long skips t in the quick tier (go test -short): tests that take more
// than a few seconds (property checks at full size, mutation checks,
// scale and fault scenarios) run in the full suite only.
func Long(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("long: runs in the full suite (without -short)")
	}
}

// RunsOp reports whether cmd runs fairlock's script op: an FCALL, EVALSHA
// or EVAL whose arguments name it (every script call carries its op's
// name). Tests' hooks use it to pick out one op's commands.
func RunsOp(cmd redis.Cmder, op string) bool {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
		for _, a := range cmd.Args() {
			if a == op {
				return true
			}
		}
	}
	return false
}

// Package redistest runs fairlock's tests against both an embedded
// miniredis and a real redis-server that it starts on a free loopback port.
//
// With CI=true in the environment a missing redis-server fails the run;
// elsewhere the real-server half of each test is skipped with a message.
package redistest

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"regexp"
	"runtime"
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

// Mini starts an embedded server for one test, with TTLs that follow its
// clock (the wall clock until frozen).
func Mini(t testing.TB) *Backend {
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	return &Backend{Name: "miniredis", Addr: m.Addr(), Mini: m}
}

// shared is the package's real redis-server, started by Main.
var shared *redisserver.Server

// Main runs a test binary: it starts the shared redis-server, runs the
// tests, stops the server and fails the run if a fairlock goroutine
// outlived the tests.
func Main(m *testing.M) { MainWith(m, nil) }

// MainWith is Main, calling after (if not nil) once the tests have run.
func MainWith(m *testing.M, after func()) {
	// Tests break connections on purpose; go-redis would log every redial.
	redis.SetLogger(quiet{})
	srv, err := redisserver.Start()
	switch {
	case err == nil:
		shared = srv
	case os.Getenv("CI") == "true":
		fmt.Fprintf(os.Stderr, "redistest: CI=true and no redis-server could be started: %v\n", err)
		os.Exit(1)
	default:
		fmt.Fprintf(os.Stderr, "redistest: real-Redis tests skipped: %v\n", err)
	}
	code := m.Run()
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

// Each runs f as a subtest on a fresh miniredis and on the shared real
// server (skipped when there is none and CI is not set).
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
		t.Skip("no redis-server on PATH")
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
var leakFrame = regexp.MustCompile(`(?m)^github\.com/fairlock/fairlock(/semaphore|/multilock)?\.`)

// Leaks waits up to wait for every goroutine running fairlock library code
// to end, and returns the stacks of those that did not.
func Leaks(wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if leakFrame.MatchString(g) && !strings.Contains(g, "redistest.Leaks(") {
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

package faulttest

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/redis/go-redis/v9"
)

// promptBound is how soon a call must report a Redis it cannot reach at
// all (connection refused, a host name that does not resolve): a third of
// the 1.5 s deadline it runs under. Either failure is known within
// milliseconds of the first dial; the bound leaves room for a busy
// machine, and for go-redis's own retries if they stay short.
const promptBound = 500 * time.Millisecond

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Every call of a client whose Redis refuses connections, or whose host
// name does not resolve, returns an error matching ErrRedis well before
// its 1.5 s deadline, not at it.
func TestPromptErrors(t *testing.T) {
	for _, tc := range []struct{ what, addr string }{
		{"connection refused", closedAddr(t)},
		{"unresolvable host", "nonexistent.invalid:6379"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: tc.addr})
			c, err := fairlock.New(rdb, fairlock.WithPrefix("prompt:"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Close() })
			t.Cleanup(func() { c.Close() })
			req := fairlock.Request{Name: "p", Capacity: 1, Permits: 1}
			calls := []struct {
				name string
				run  func(ctx context.Context) error
			}{
				{"Acquire", func(ctx context.Context) error { _, err := c.Acquire(ctx, req); return err }},
				{"TryAcquire", func(ctx context.Context) error { _, err := c.TryAcquire(ctx, req); return err }},
				{"AcquireAll", func(ctx context.Context) error {
					_, err := c.AcquireAll(ctx, req, fairlock.Request{Name: "{p}:2", Capacity: 1, Permits: 1})
					return err
				}},
				{"Status", func(ctx context.Context) error { _, err := c.Status(ctx, "p"); return err }},
			}
			for _, cl := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
				start := time.Now()
				err := cl.run(ctx)
				took := time.Since(start)
				cancel()
				t.Logf("%s: %s returned after %v: %v", tc.what, cl.name, took.Round(time.Millisecond), err)
				if !errors.Is(err, fairlock.ErrRedis) || took > promptBound {
					t.Errorf("%s: %s returned after %v with %v; want an error matching ErrRedis within %v", tc.what, cl.name, took.Round(time.Millisecond), err, promptBound)
				}
			}
		})
	}
}

// Release of a lease whose Redis then went away (connection refused)
// reports ErrRedis promptly too.
func TestPromptReleaseError(t *testing.T) {
	srv := startServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	c, err := fairlock.New(rdb, fairlock.WithPrefix("prompt:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	t.Cleanup(func() { c.Close() })
	l, err := c.Acquire(context.Background(), fairlock.Request{Name: "r", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = l.Release(ctx)
	took := time.Since(start)
	t.Logf("Release returned after %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, fairlock.ErrRedis) || took > promptBound {
		t.Errorf("Release returned after %v with %v; want an error matching ErrRedis within %v", took.Round(time.Millisecond), err, promptBound)
	}
	// Like "fairlock", the sentinel's text is said once.
	if err != nil && strings.Count(err.Error(), "redis error") != 1 {
		t.Errorf("Release = %q; want \"redis error\" said once", err)
	}
}

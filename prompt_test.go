package fairlock_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/redis/go-redis/v9"
)

// A Redis that refuses connections, or whose name does not resolve, is
// reported as soon as a dial says so, not at the caller's deadline
// (go-redis itself retries a failed dial for about 1.7 s).
func TestUnreachableRedisReportedPromptly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	addrs := []string{closed}
	// A name that cannot resolve, where this machine's resolver says so
	// at once (a machine without DNS may only time out).
	const unresolvable = "fairlock-test.invalid"
	rctx, rcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, lerr := net.DefaultResolver.LookupHost(rctx, unresolvable)
	rcancel()
	var dns *net.DNSError
	if errors.As(lerr, &dns) && dns.IsNotFound {
		addrs = append(addrs, unresolvable+":6379")
	} else {
		t.Logf("no DNS answer for %s here (%v): only the refused port is tried", unresolvable, lerr)
	}
	req := fairlock.Request{Name: "down", Capacity: 1, Permits: 1}
	for _, addr := range addrs {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		// A short waiter TTL bounds Close, which waits for the clean-up
		// of the calls that returned early.
		c, err := fairlock.New(rdb, fairlock.WithWaiterTTL(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for _, call := range []struct {
			name string
			do   func(context.Context) error
		}{
			{"Acquire", func(ctx context.Context) error { _, err := c.Acquire(ctx, req); return err }},
			{"TryAcquire", func(ctx context.Context) error { _, err := c.TryAcquire(ctx, req); return err }},
			{"Status", func(ctx context.Context) error { _, err := c.Status(ctx, "down"); return err }},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			start := time.Now()
			err := call.do(ctx)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, fairlock.ErrRedis) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s on %s = %v, want an error matching ErrRedis", call.name, addr, err)
			}
			// Generous: a dial refused on loopback takes well under a
			// millisecond; the deadline is 1.5 s.
			if took > 500*time.Millisecond {
				t.Errorf("%s on %s returned after %v, want at once", call.name, addr, took)
			}
		}
		_ = c.Close()
		_ = rdb.Close()
	}
}

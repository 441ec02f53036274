package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// promptBound is how soon a call must report a Redis it cannot reach at
// all. A refused dial on loopback takes well under a millisecond; go-redis
// on its own takes seconds (five dials 100 ms apart, per attempt, and
// three attempts more), so the bound is loose and still tells the two
// apart.
const promptBound = 500 * time.Millisecond

// unreachableAddrs returns a loopback address where nothing listens, and
// a name that cannot resolve. The name has an empty label, so Go's
// resolver refuses it itself (a DNS error, not found) without asking a
// name server: a name server's "no such host" would make the row depend
// on the network. This machine's resolver loses about one query in 30,
// and Go then waits 5 s before asking again; the dial ends in a DNS
// timeout, which is rightly not taken for an unreachable Redis (a slow
// network may answer), and the row failed now and then.
func unreachableAddrs(t *testing.T) []string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{ln.Addr().String()}
	_ = ln.Close()
	const unresolvable = "fairlock..invalid"
	_, lerr := net.DefaultResolver.LookupHost(context.Background(), unresolvable)
	var dns *net.DNSError
	if !errors.As(lerr, &dns) || !dns.IsNotFound || dns.IsTimeout {
		t.Fatalf("looking up %q: %v, want a DNS error saying not found", unresolvable, lerr)
	}
	return append(addrs, unresolvable+":6379")
}

// A Redis that refuses connections, or whose name does not resolve, is
// reported as soon as a dial says so, not at the caller's deadline nor
// when go-redis's retries give up (seconds with its defaults): on a
// single node and on a Cluster, under a context with a deadline and under
// one without. Close then returns at once too: the clean-up the calls
// left is refused at once as well.
func TestUnreachableRedisReportedPromptly(t *testing.T) {
	req := fairlock.Request{Name: "down", Capacity: 1, Permits: 1}
	for _, addr := range unreachableAddrs(t) {
		for _, kind := range []struct {
			name string
			rdb  func() fairlock.RedisClient
		}{
			{"Client", func() fairlock.RedisClient { return redis.NewClient(&redis.Options{Addr: addr}) }},
			{"ClusterClient", func() fairlock.RedisClient {
				return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
			}},
		} {
			for _, deadline := range []bool{true, false} {
				rdb := kind.rdb()
				c, err := fairlock.New(rdb)
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
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if deadline {
						ctx, cancel = context.WithTimeout(ctx, 1500*time.Millisecond)
					}
					start := time.Now()
					err := call.do(ctx)
					took := time.Since(start)
					cancel()
					if !errors.Is(err, fairlock.ErrRedis) || errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("%s %s on %s (deadline %v) = %v, want an error matching ErrRedis", kind.name, call.name, addr, deadline, err)
					}
					if took > promptBound {
						t.Errorf("%s %s on %s (deadline %v) returned after %v, want at once", kind.name, call.name, addr, deadline, took.Round(time.Millisecond))
					}
				}
				start := time.Now()
				_ = c.Close()
				if took := time.Since(start); took > promptBound {
					t.Errorf("%s on %s (deadline %v): Close took %v, want at once", kind.name, addr, deadline, took.Round(time.Millisecond))
				}
				if cl, ok := rdb.(interface{ Close() error }); ok {
					_ = cl.Close()
				}
			}
		}
	}
}

// New hooks a go-redis client once, however many fairlock clients are
// made on it: a program that makes a Client per request on one shared
// go-redis client does not lengthen that client's dial path. The depth of
// the stack under which go-redis calls its Dialer measures the hook chain
// (each dial hook is a frame).
func TestDialHookInstalledOnce(t *testing.T) {
	var depth atomic.Int64
	refused := func(ctx context.Context, network, addr string) (net.Conn, error) {
		pcs := make([]uintptr, 1<<14)
		depth.Store(int64(runtime.Callers(0, pcs)))
		return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("refused by the test")}
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", Dialer: refused, MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	dialDepth := func() int64 {
		depth.Store(0)
		_ = rdb.Ping(context.Background()).Err()
		return depth.Load()
	}
	c, err := fairlock.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	one := dialDepth()
	// New costs milliseconds in this package's tests (every script is
	// rebuilt with a check); a hook added by each would show as 100
	// frames.
	const n = 100
	for range n {
		c, err := fairlock.New(rdb)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
	after := dialDepth()
	t.Logf("dial stack depth: %d frames after one fairlock client, %d after %d more", one, after, n)
	if one == 0 || after > one {
		t.Errorf("dial stack depth %d after one fairlock client, %d after %d more made and closed; want it unchanged", one, after, n)
	}
}

// The cost of watching dials, on every script call's path: Status (one
// script, one round trip on loopback) under a context that cannot end
// and under one with a deadline. Compare ns/op and allocs/op with and
// without the watch (go test -bench CallPath -benchmem -count 10, before
// and after a change).
func BenchmarkCallPath(b *testing.B) {
	be := redistest.RealBackend(b)
	rdb := be.Client(b)
	c, err := fairlock.New(rdb, fairlock.WithPrefix(redistest.Prefix(b)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	for _, deadline := range []bool{false, true} {
		b.Run(fmt.Sprintf("deadline=%v", deadline), func(b *testing.B) {
			ctx := context.Background()
			if deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Hour)
				defer cancel()
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Status(ctx, "bench"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

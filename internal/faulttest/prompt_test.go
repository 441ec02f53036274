package faulttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
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
				// Under a deadline, and under a context that never ends.
				for _, deadline := range []bool{true, false} {
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if deadline {
						ctx, cancel = context.WithTimeout(ctx, 1500*time.Millisecond)
					}
					start := time.Now()
					err := cl.run(ctx)
					took := time.Since(start)
					cancel()
					t.Logf("%s: %s (deadline %v) returned after %v: %v", tc.what, cl.name, deadline, took.Round(time.Millisecond), err)
					if !errors.Is(err, fairlock.ErrRedis) || took > promptBound {
						t.Errorf("%s: %s (deadline %v) returned after %v with %v; want an error matching ErrRedis within %v", tc.what, cl.name, deadline, took.Round(time.Millisecond), err, promptBound)
					}
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

// A failed dial is reported to the calls waiting for a connection, not to
// the calls in flight on connections that work: here Redis is paused
// while an Acquire, a Release and a Status are sent on the pool's three
// connections, and a fourth call, which must dial, is refused. The fourth
// returns ErrRedis at once; the three get Redis's answers once it resumes
// (the Acquire its lease, which stays held), under a deadline or not.
// Close then returns at once.
func TestPromptErrorOnlyForTheCallThatDialed(t *testing.T) {
	srv := startServer(t)
	for _, deadline := range []bool{true, false} {
		t.Run(fmt.Sprintf("deadline=%v", deadline), func(t *testing.T) {
			ctxOf := func() (context.Context, context.CancelFunc) {
				if deadline {
					return context.WithTimeout(context.Background(), 10*time.Second)
				}
				return context.Background(), func() {}
			}
			closed := closedAddr(t)
			var refuse atomic.Bool
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if refuse.Load() {
					addr = closed
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}})
			t.Cleanup(func() { rdb.Close() })
			c, err := fairlock.New(rdb, fairlock.WithPrefix(redistest.Prefix(t)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			req := func(name string) fairlock.Request { return fairlock.Request{Name: name, Capacity: 1, Permits: 1} }
			ctx := context.Background()
			rel, err := c.Acquire(ctx, req("rel"))
			if err != nil {
				t.Fatal(err)
			}
			// Exactly three connections in the pool: three calls sent
			// while Redis is paused each take one.
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			var warm sync.WaitGroup
			for range 3 {
				warm.Go(func() { _, _ = c.Status(ctx, "h") })
			}
			waitPool(t, rdb, 3, 0)
			if err := srv.Resume(); err != nil {
				t.Fatal(err)
			}
			warm.Wait()
			waitPool(t, rdb, 3, 3)

			// Three calls in flight on those connections, Redis paused.
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			resumed := false
			defer func() {
				if !resumed {
					_ = srv.Resume()
				}
			}()
			type result struct {
				name string
				err  error
			}
			results := make(chan result, 3)
			var lease atomic.Pointer[fairlock.Lease]
			inFlight := []struct {
				name string
				run  func(ctx context.Context) error
			}{
				{"Acquire", func(ctx context.Context) error {
					l, err := c.Acquire(ctx, req("h"))
					lease.Store(l)
					return err
				}},
				{"Release", func(ctx context.Context) error { return rel.Release(ctx) }},
				{"Status", func(ctx context.Context) error { _, err := c.Status(ctx, "h"); return err }},
			}
			for _, call := range inFlight {
				go func() {
					ctx, cancel := ctxOf()
					defer cancel()
					results <- result{call.name, call.run(ctx)}
				}()
			}
			waitPool(t, rdb, 3, 0)

			// A fourth call must dial, and is refused.
			refuse.Store(true)
			fctx, fcancel := ctxOf()
			start := time.Now()
			_, err = c.TryAcquire(fctx, req("f"))
			took := time.Since(start)
			fcancel()
			if !errors.Is(err, fairlock.ErrRedis) || took > promptBound {
				t.Errorf("TryAcquire refused a connection: returned after %v with %v; want an error matching ErrRedis within %v", took.Round(time.Millisecond), err, promptBound)
			}

			if err := srv.Resume(); err != nil {
				t.Fatal(err)
			}
			resumed = true
			for range inFlight {
				r := <-results
				if r.err != nil {
					t.Errorf("%s, in flight on a working connection while another call's dial was refused: %v; want Redis's answer", r.name, r.err)
				}
			}
			if l := lease.Load(); l != nil {
				if err := l.Err(); err != nil {
					t.Errorf("the lease the in-flight Acquire got: %v; want it held", err)
				}
				st, err := c.Status(ctx, "h")
				if err != nil || st.Held != 1 {
					t.Errorf("Status of the in-flight Acquire's semaphore: %d held, %v; want 1 held", st.Held, err)
				}
			}
			start = time.Now()
			_ = c.Close()
			if took := time.Since(start); took > promptBound {
				t.Errorf("Close took %v after a call's dial was refused; want at once", took.Round(time.Millisecond))
			}
		})
	}
}

// waitPool waits until rdb's pool holds total connections, idle of them
// idle.
func waitPool(t *testing.T, rdb *redis.Client, total, idle uint32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := rdb.PoolStats()
		if s.TotalConns == total && s.IdleConns == idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool: %d connections, %d idle; want %d, %d idle", s.TotalConns, s.IdleConns, total, idle)
		}
		time.Sleep(time.Millisecond)
	}
}

// A refused dial ends the commands that were waiting when it began, not
// those that came after, which wait for dials of their own: call A's dial
// is held, call B starts and waits for a dial of its own, then A's is
// refused. A returns ErrRedis at once; B connects and gets its answer.
func TestRefusedDialSparesLaterCalls(t *testing.T) {
	srv := startServer(t)
	closed := closedAddr(t)
	var dials atomic.Int32
	dialing := make(chan int32, 8)
	holdA, holdB := make(chan struct{}), make(chan struct{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		n := dials.Add(1)
		dialing <- n
		switch n {
		case 1: // A's
			<-holdA
			addr = closed
		case 2: // B's
			<-holdB
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}})
	t.Cleanup(func() { rdb.Close() })
	c, err := fairlock.New(rdb, fairlock.WithPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	status := func(done chan<- error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Status(ctx, "s")
		done <- err
	}
	next := func(what string) int32 {
		t.Helper()
		select {
		case n := <-dialing:
			return n
		case <-time.After(20 * time.Second):
			t.Fatalf("no dial for %s within 20s", what)
			return 0
		}
	}
	a, b := make(chan error, 1), make(chan error, 1)
	go status(a)
	if n := next("A"); n != 1 {
		t.Fatalf("dial %d first", n)
	}
	go status(b)
	if n := next("B, while A's dial is held"); n != 2 {
		t.Fatalf("dial %d second", n)
	}
	close(holdA)
	select {
	case err := <-a:
		if !errors.Is(err, fairlock.ErrRedis) {
			t.Errorf("A, whose dial was refused: %v; want an error matching ErrRedis", err)
		}
	case <-time.After(promptBound):
		t.Errorf("A, whose dial was refused, did not return within %v", promptBound)
	}
	close(holdB)
	if err := <-b; err != nil {
		t.Errorf("B, which waited for a dial of its own begun after A's: %v; want its answer", err)
	}
}

// cutAfterAcquire is a connection that, once armed, lets an acquire
// script through to Redis and then reads as closed by the server: the
// script runs, its reply is lost.
type cutAfterAcquire struct {
	net.Conn
	armed *atomic.Bool
	cut   atomic.Bool
}

func (c *cutAfterAcquire) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.armed.Load() && strings.Contains(string(p), "acquire") {
		c.armed.Store(false)
		c.cut.Store(true)
	}
	return n, err
}

func (c *cutAfterAcquire) Read(p []byte) (int, error) {
	if c.cut.Load() {
		c.Conn.Close()
		return 0, io.EOF
	}
	return c.Conn.Read(p)
}

// An Acquire whose script ran on a connection that then broke, and whose
// retry's dial was refused, returns ErrRedis at once; its clean-up still
// runs (the script may have run, as here) and, Redis reachable again,
// gives the grant back at once rather than at its deadline.
func TestCleanUpAfterADialError(t *testing.T) {
	srv := startServer(t)
	closed := closedAddr(t)
	for _, deadline := range []bool{true, false} {
		t.Run(fmt.Sprintf("deadline=%v", deadline), func(t *testing.T) {
			var armed, refuse atomic.Bool
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if refuse.CompareAndSwap(true, false) { // once
					addr = closed
				}
				var d net.Dialer
				conn, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &cutAfterAcquire{Conn: conn, armed: &armed}, nil
			}})
			t.Cleanup(func() { rdb.Close() })
			c, err := fairlock.New(rdb, fairlock.WithPrefix(redistest.Prefix(t)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			ctx := context.Background()
			// The library loaded, one connection open: the Acquire's
			// retry must dial.
			if _, err := c.Status(ctx, "x"); err != nil {
				t.Fatal(err)
			}
			waitPool(t, rdb, 1, 1)
			actx, cancel := ctx, context.CancelFunc(func() {})
			if deadline {
				actx, cancel = context.WithTimeout(ctx, 10*time.Second)
			}
			armed.Store(true)
			refuse.Store(true)
			start := time.Now()
			_, err = c.Acquire(actx, fairlock.Request{Name: "x", Capacity: 1, Permits: 1})
			took := time.Since(start)
			cancel()
			if !errors.Is(err, fairlock.ErrRedis) || took > promptBound {
				t.Fatalf("Acquire whose reply was lost and whose redial was refused: %v after %v; want an error matching ErrRedis within %v", err, took.Round(time.Millisecond), promptBound)
			}
			// The script granted the permit; the clean-up gives it back.
			var st fairlock.Status
			for end := time.Now().Add(promptBound); ; {
				st, err = c.Status(ctx, "x")
				if err == nil && st.Held == 0 && st.Queued == 0 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("%v after the Acquire failed: %d held, %d queued (%v); want the grant given back", promptBound, st.Held, st.Queued, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

package faulttest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/multilock"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// no call may return later than lateBound after its
// context ends, whatever state Redis is in.
const lateBound = 100 * time.Millisecond

// deadlines are the context deadlines each fault is tried with.
var deadlines = []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// deadlineEnv is one round of calls: a fairlock client with the default
// TTLs (lease 10 s, waiter 3 s) on its own
// connection pool, a semaphore "{d}:held" that another client holds, so
// that Acquire waits, and a lease of "{d}:rel" for Release to free.
type deadlineEnv struct {
	c      *fairlock.Client
	prefix string
	rel    *fairlock.Lease
}

var (
	held  = fairlock.Request{Name: "{d}:held", Capacity: 1, Permits: 1}
	other = fairlock.Request{Name: "{d}:other", Capacity: 1, Permits: 1}
)

// newDeadlineEnv makes a round's client on srv. Its holder is a client of
// its own, which takes held and keeps it.
func newDeadlineEnv(t *testing.T, srv *redisserver.Server) *deadlineEnv {
	t.Helper()
	e := &deadlineEnv{prefix: redistest.Prefix(t)}
	mk := func() *fairlock.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		c, err := fairlock.New(rdb, fairlock.WithPrefix(e.prefix))
		if err != nil {
			t.Fatal(err)
		}
		// Close before the pool goes: Close waits for the client's
		// background clean-up, which uses it.
		t.Cleanup(func() { rdb.Close() })
		t.Cleanup(func() { c.Close() })
		return c
	}
	holder := mk()
	if _, err := holder.Acquire(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	e.c = mk()
	var err error
	if e.rel, err = e.c.Acquire(context.Background(), fairlock.Request{Name: "{d}:rel", Capacity: 1, Permits: 1}); err != nil {
		t.Fatal(err)
	}
	return e
}

// timedCall is one fairlock call under a context.
type timedCall struct {
	name string
	wait bool // it waits for held
	run  func(ctx context.Context) (*fairlock.Lease, error)
}

func (e *deadlineEnv) calls(t *testing.T) []timedCall {
	sem, err := semaphore.New(e.c, held.Name, held.Capacity)
	if err != nil {
		t.Fatal(err)
	}
	none := func(err error) (*fairlock.Lease, error) { return nil, err }
	return []timedCall{
		{"Acquire", true, func(ctx context.Context) (*fairlock.Lease, error) { return e.c.Acquire(ctx, held) }},
		{"AcquireAll", true, func(ctx context.Context) (*fairlock.Lease, error) { return e.c.AcquireAll(ctx, held, other) }},
		{"semaphore.Acquire", true, func(ctx context.Context) (*fairlock.Lease, error) { return sem.Acquire(ctx, 1) }},
		{"multilock.Lock", true, func(ctx context.Context) (*fairlock.Lease, error) {
			return multilock.Lock(ctx, e.c, held.Name, other.Name)
		}},
		{"TryAcquire", false, func(ctx context.Context) (*fairlock.Lease, error) { return e.c.TryAcquire(ctx, other) }},
		{"TryAcquireAll", false, func(ctx context.Context) (*fairlock.Lease, error) {
			return e.c.TryAcquireAll(ctx, other, fairlock.Request{Name: "{d}:third", Capacity: 1, Permits: 1})
		}},
		{"Status", false, func(ctx context.Context) (*fairlock.Lease, error) {
			_, err := e.c.Status(ctx, held.Name)
			return none(err)
		}},
		{"Release", false, func(ctx context.Context) (*fairlock.Lease, error) { return none(e.rel.Release(ctx)) }},
	}
}

// result is how one call ended: late is how long after its context's
// deadline it returned (negative: before); starved is how late this
// process saw that deadline pass (0 when on time), measured by a goroutine
// that does nothing but wait for the context: a process starved of CPU
// sees every deadline late, and a call then answers for what it adds.
type result struct {
	name          string
	late, starved time.Duration
	err           error
}

// runRound runs calls at once, each under a context with deadline d, and
// returns how each ended. A lease one of them got is released in the
// background, bounded.
func runRound(calls []timedCall, d time.Duration) []result {
	out := make([]result, len(calls))
	var wg sync.WaitGroup
	for i, cl := range calls {
		wg.Go(func() {
			deadline := time.Now().Add(d)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			seen := make(chan time.Time, 1)
			go func() {
				<-ctx.Done()
				seen <- time.Now()
			}()
			l, err := cl.run(ctx)
			returned := time.Now()
			cancel()
			// The process saw its deadline pass when the control woke, or
			// (the control not run yet) not before the call returned.
			saw := <-seen
			if saw.After(returned) {
				saw = returned
			}
			out[i] = result{name: cl.name, late: returned.Sub(deadline), starved: max(saw.Sub(deadline), 0), err: err}
			if l != nil {
				rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
				_ = l.Release(rctx)
				rcancel()
			}
		})
	}
	wg.Wait()
	return out
}

// checkLate fails the test for each result that returned more than
// lateBound after this process saw its deadline pass, and logs all of
// them.
func checkLate(t *testing.T, fault string, d time.Duration, rs []result) {
	t.Helper()
	var lines []string
	for _, r := range rs {
		line := fmt.Sprintf("%s %+dms (%v)", r.name, r.late.Milliseconds(), short(r.err))
		if r.starved > 0 {
			line += fmt.Sprintf(" [deadline seen %+dms]", r.starved.Milliseconds())
		}
		lines = append(lines, line)
		if r.late-r.starved > lateBound {
			t.Errorf("%s, deadline %v: %s returned %v after its context ended, %v after this process saw it end (bound %v): %v",
				fault, d, r.name, r.late.Round(time.Millisecond), (r.late - r.starved).Round(time.Millisecond), lateBound, r.err)
		}
	}
	t.Logf("%s, deadline %v: returned after the deadline by: %s", fault, d, strings.Join(lines, ", "))
}

func short(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, fairlock.ErrRedis):
		return "ErrRedis"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return err.Error()
}

// startServer starts a redis-server of the test's own, stopped when the
// test ends.
func startServer(t *testing.T) *redisserver.Server {
	t.Helper()
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	srv, err := redisserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// Redis unreachable: the server is killed (its port closed) after each
// round's client has its lease. Every call returns within the bound of its
// deadline, and the calls that do not wait for held report ErrRedis as
// soon as go-redis gives up, well before a 1 s or 2 s deadline.
func TestDeadlineRedisUnreachable(t *testing.T) {
	redistest.Long(t)
	srv := startServer(t)
	for i, d := range deadlines {
		if i > 0 {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		}
		e := newDeadlineEnv(t, srv)
		calls := e.calls(t)
		srv.Kill()
		giveUp := goRedisGivesUp(srv.Addr)
		rs := runRound(calls, d)
		checkLate(t, "unreachable", d, rs)
		t.Logf("unreachable, deadline %v: go-redis gives up after %v", d, giveUp.Round(time.Millisecond))
		for _, r := range rs {
			// A call that go-redis gives up on before its deadline reports
			// ErrRedis then, not at the deadline.
			if giveUp+lateBound < d && (!errors.Is(r.err, fairlock.ErrRedis) || d+r.late > giveUp+lateBound) {
				t.Errorf("unreachable, deadline %v: %s returned after %v with %v; want an error matching ErrRedis within %v (go-redis gave up after %v)",
					d, r.name, (d + r.late).Round(time.Millisecond), r.err, lateBound, giveUp.Round(time.Millisecond))
			}
		}
	}
}

// goRedisGivesUp returns how long a go-redis client with default options
// takes to fail a command to addr, where nothing listens.
func goRedisGivesUp(addr string) time.Duration {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	start := time.Now()
	_ = rdb.Ping(context.Background()).Err()
	return time.Since(start)
}

// Redis stalled: the server is paused (SIGSTOP), so it accepts
// connections but answers nothing; go-redis would wait for its 3 s
// ReadTimeout whatever the context says.
func TestDeadlineRedisStalled(t *testing.T) {
	redistest.Long(t)
	srv := startServer(t)
	for _, d := range deadlines {
		e := newDeadlineEnv(t, srv)
		calls := e.calls(t)
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		rs := runRound(calls, d)
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
		checkLate(t, "stalled", d, rs)
	}
}

// Redis restarted during a wait: the waiting calls queue behind held, the
// server is killed halfway to their deadline and started again on its
// port 500 ms after the deadline passed.
func TestDeadlineRedisRestarted(t *testing.T) {
	redistest.Long(t)
	srv := startServer(t)
	for _, d := range deadlines {
		e := newDeadlineEnv(t, srv)
		var calls []timedCall
		for _, cl := range e.calls(t) {
			if cl.wait {
				calls = append(calls, cl)
			}
		}
		restarted := make(chan error, 1)
		go func() {
			waitWaiters(t, e.c, spec{name: held.Name}, len(calls))
			time.Sleep(d / 2)
			srv.Kill()
			time.Sleep(d/2 + 500*time.Millisecond)
			restarted <- srv.Restart()
		}()
		rs := runRound(calls, d)
		if err := <-restarted; err != nil {
			t.Fatal(err)
		}
		checkLate(t, "restarted", d, rs)
	}
}

// Renewal never outruns the lease's deadline: with Redis stalled, a
// lease's Done closes no later than its TTL (plus the bound) after the
// stall began, though go-redis would wait 3 s for the renewal's reply.
func TestDeadlineRenewalStalled(t *testing.T) {
	redistest.Long(t)
	srv := startServer(t)
	const ttl = time.Second
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	c, err := fairlock.New(rdb, fairlock.WithPrefix(redistest.Prefix(t)), fairlock.WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(context.Background(), held)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl / 2) // a renewal has been sent, and answered
	stalled := time.Now()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
	}
	ended := time.Since(stalled)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	t.Logf("lease TTL %v: Done closed %v after Redis stalled: %v", ttl, ended.Round(time.Millisecond), l.Err())
	if ended > ttl+lateBound {
		t.Errorf("lease TTL %v: Done closed %v after Redis stalled; want at most %v", ttl, ended.Round(time.Millisecond), ttl+lateBound)
	}
	if !errors.Is(l.Err(), fairlock.ErrLeaseLost) {
		t.Errorf("lease's cause %v; want ErrLeaseLost", l.Err())
	}
}

// Close waits for the clean-up that calls given up on their contexts left
// running: once Close returns, no fairlock goroutine is left.
func TestDeadlineCloseWaitsForCleanUp(t *testing.T) {
	redistest.Long(t)
	srv := startServer(t)
	e := newDeadlineEnv(t, srv)
	calls := e.calls(t)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	rs := runRound(calls, 200*time.Millisecond)
	checkLate(t, "stalled", 200*time.Millisecond, rs)
	// Let the clean-up finish while the Redis is back.
	time.AfterFunc(500*time.Millisecond, func() { _ = srv.Resume() })
	start := time.Now()
	if err := e.c.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close returned after %v", time.Since(start).Round(time.Millisecond))
	// Only the holder's client is left; close it too.
	if leaks := liveGoroutines(e.c); leaks != "" {
		t.Errorf("goroutines of the closed client left after Close:\n%s", leaks)
	}
}

// liveGoroutines returns the stacks of goroutines running fairlock's
// library code other than the listeners and maintainers of rooms (which
// belong to the test's other client). A goroutine Close waited for may
// still be on its way out (it has told Close it is done and not yet
// returned), so a goroutine is reported only if it is still there 100 ms
// later: far less than the clean-up this test stalls for 500 ms.
func liveGoroutines(*fairlock.Client) string {
	return redistest.Leaks(100*time.Millisecond, "(*room).listen", "(*room).maintain", "(*Lease).renew")
}

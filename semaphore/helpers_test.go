package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// env is one test's view of a backend: a raw client for inspection and a
// key prefix of its own.
type env struct {
	t      *testing.T
	b      *redistest.Backend
	rdb    *redis.Client
	prefix string
}

func newEnv(t *testing.T, b *redistest.Backend) *env {
	return &env{t: t, b: b, rdb: b.Client(t), prefix: redistest.Prefix(t)}
}

// client returns a fairlock client (one simulated process) using e's
// prefix, closed when the test ends.
func (e *env) client(opts ...fairlock.Option) *fairlock.Client {
	return e.clientOn(e.b.Client(e.t), opts...)
}

func (e *env) clientOn(rdb fairlock.RedisClient, opts ...fairlock.Option) *fairlock.Client {
	e.t.Helper()
	c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(e.prefix)}, opts...)...)
	if err != nil {
		e.t.Fatalf("fairlock.New: %v", err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (e *env) sem(c *fairlock.Client, name string, capacity int64) *semaphore.Semaphore {
	e.t.Helper()
	s, err := semaphore.New(c, name, capacity)
	if err != nil {
		e.t.Fatalf("semaphore.New(%q, %d): %v", name, capacity, err)
	}
	return s
}

// key returns the Redis key of a semaphore's part (see fairlock's doc).
func (e *env) key(name, part string) string { return e.prefix + "{" + name + "}:" + part }

// waitFor waits until cond holds, failing the test after 10s. It waits
// for a state, never asserts a duration.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitQueued waits until n tickets wait in the semaphore's queue.
func (e *env) waitQueued(name string, n int64) {
	e.t.Helper()
	e.waitFor(fmt.Sprintf("%d queued on %s", n, name), func() bool {
		got, err := e.rdb.ZCard(context.Background(), e.key(name, "q")).Result()
		return err == nil && got == n
	})
}

// keys lists the keys under e's prefix.
func (e *env) keys() []string {
	ks, err := e.rdb.Keys(context.Background(), e.prefix+"*").Result()
	if err != nil {
		e.t.Fatalf("KEYS: %v", err)
	}
	return ks
}

// result is what a background Acquire returned.
type result struct {
	lease *fairlock.Lease
	err   error
}

// acquireAsync starts Acquire in a goroutine and returns where its result
// will arrive.
func acquireAsync(ctx context.Context, s *semaphore.Semaphore, n int64) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx, n)
		ch <- result{l, err}
	}()
	return ch
}

func (e *env) receive(ch <-chan result) result {
	e.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		e.t.Fatal("Acquire did not return within 10s")
		return result{}
	}
}

// notYet fails if ch already has a result.
func (e *env) notYet(ch <-chan result, what string) {
	e.t.Helper()
	select {
	case r := <-ch:
		e.t.Fatalf("%s returned early: lease=%v err=%v", what, r.lease != nil, r.err)
	default:
	}
}

func (e *env) release(l *fairlock.Lease) {
	e.t.Helper()
	if err := l.Release(context.Background()); err != nil {
		e.t.Fatalf("Release: %v", err)
	}
}

// counter is a go-redis hook that counts the commands a client sends.
type counter struct {
	mu       sync.Mutex
	byName   map[string]int
	blocking int // BLPOPs in flight now
	peak     int // most BLPOPs in flight at once
	hold     chan struct{}
}

func newCounter() *counter { return &counter{byName: map[string]int{}} }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if (name == "evalsha" || name == "eval") && len(cmd.Args()) > 3 {
			// Count script calls by op: the first ARGV after the keys.
			nkeys, _ := cmd.Args()[2].(int)
			if i := 3 + nkeys; i < len(cmd.Args()) {
				if op, ok := cmd.Args()[i].(string); ok {
					name += ":" + op
				}
			}
		}
		c.mu.Lock()
		c.byName[name]++
		if name == "blpop" {
			c.blocking++
			c.peak = max(c.peak, c.blocking)
		}
		c.mu.Unlock()
		err := next(ctx, cmd)
		if name == "blpop" {
			c.mu.Lock()
			c.blocking--
			c.mu.Unlock()
		}
		return err
	}
}

func (c *counter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byName[name]
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.byName {
		n += v
	}
	return n
}

// isErr fails the test unless errors.Is(err, want).
func isErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s = %v, want an error matching %v", what, err, want)
	}
}

type redisOptions = redis.Options

// faultyClient returns a fairlock client whose connection f can break.
func (e *env) faultyClient(opts ...fairlock.Option) (*fairlock.Client, *redistest.Faults) {
	f := &redistest.Faults{}
	rdb := e.b.Client(e.t)
	rdb.AddHook(f)
	c := e.clientOn(rdb, opts...)
	// Cleanups run last-in first-out: let held BLPOPs go before Close.
	e.t.Cleanup(f.Hear)
	return c, f
}

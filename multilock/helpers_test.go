package multilock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
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

// client returns a fairlock client (one simulated process) with its own
// connection pool, closed when the test ends.
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

// faultyClient returns a client whose connection the returned Faults can
// cut, as if its process died.
func (e *env) faultyClient(opts ...fairlock.Option) (*fairlock.Client, *redistest.Faults) {
	f := &redistest.Faults{}
	rdb := e.b.Client(e.t)
	rdb.AddHook(f)
	c := e.clientOn(rdb, opts...)
	e.t.Cleanup(f.Hear)
	return c, f
}

func (e *env) status(name string) fairlock.Status {
	e.t.Helper()
	st, err := e.client().Status(context.Background(), name)
	if err != nil {
		e.t.Fatalf("Status(%q): %v", name, err)
	}
	return st
}

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

// waitQueued waits until n requests wait for name.
func (e *env) waitQueued(name string, n int) {
	e.t.Helper()
	e.waitFor("queue of "+name, func() bool { return len(e.status(name).Waiters) == n })
}

type result struct {
	lease *fairlock.Lease
	err   error
}

// async runs acquire in a goroutine and returns where its result arrives.
func async(acquire func() (*fairlock.Lease, error)) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := acquire()
		ch <- result{l, err}
	}()
	return ch
}

func (e *env) receive(ch <-chan result) *fairlock.Lease {
	e.t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			e.t.Fatalf("Acquire: %v", r.err)
		}
		return r.lease
	case <-time.After(10 * time.Second):
		e.t.Fatal("Acquire did not return within 10s")
		return nil
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

func isErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s = %v, want an error matching %v", what, err, want)
	}
}

func one(name string) fairlock.Request { return fairlock.Request{Name: name, Capacity: 1, Permits: 1} }

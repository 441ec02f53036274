// Package fltest holds the helpers that fairlock's tests share: those of
// the engine (the root package's external tests) and of the packages built
// on it (semaphore, multilock, the fault tests).
package fltest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Env is one test's view of a backend: a raw client for inspection and a
// key prefix of its own.
type Env struct {
	T      *testing.T
	B      *redistest.Backend
	RDB    *redis.Client
	Prefix string
}

// New returns t's view of b.
func New(t *testing.T, b *redistest.Backend) *Env {
	return &Env{T: t, B: b, RDB: b.Client(t), Prefix: redistest.Prefix(t)}
}

// Client returns a fairlock client (one simulated process, with its own
// connection pool) using e's prefix, closed when the test ends.
func (e *Env) Client(opts ...fairlock.Option) *fairlock.Client {
	e.T.Helper()
	return e.ClientOn(e.B.Client(e.T), opts...)
}

// ClientOn is Client on a given go-redis client.
func (e *Env) ClientOn(rdb fairlock.RedisClient, opts ...fairlock.Option) *fairlock.Client {
	e.T.Helper()
	c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(e.Prefix)}, opts...)...)
	if err != nil {
		e.T.Fatalf("fairlock.New: %v", err)
	}
	e.T.Cleanup(func() { _ = c.Close() })
	return c
}

// FaultyClient returns a client whose connection the returned Faults can
// break, as if its process died or stalled.
func (e *Env) FaultyClient(opts ...fairlock.Option) (*fairlock.Client, *redistest.Faults) {
	e.T.Helper()
	f := &redistest.Faults{}
	rdb := e.B.Client(e.T)
	faulty := redistest.AddHook[fairlock.Option](rdb, f)
	c := e.ClientOn(rdb, append([]fairlock.Option{faulty}, opts...)...)
	// Cleanups run last-in first-out: let held BLPOPs go before Close.
	e.T.Cleanup(f.Hear)
	return c, f
}

// WaitFor waits until cond holds, failing the test after 10s. It waits
// for a state, never asserts a duration.
func (e *Env) WaitFor(what string, cond func() bool) {
	e.T.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.T.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// WaitWaiters waits until c's Status shows n live waiters for name,
// failing the test after 10s.
func WaitWaiters(t testing.TB, c *fairlock.Client, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Status(context.Background(), name)
		if err == nil && len(st.Waiters) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: waiters %v (%v), want %d", name, st.Waiters, err, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Release releases l, failing the test on an error.
func (e *Env) Release(l *fairlock.Lease) {
	e.T.Helper()
	if err := l.Release(context.Background()); err != nil {
		e.T.Fatalf("Release: %v", err)
	}
}

// IsErr fails the test unless errors.Is(err, want).
func IsErr(t testing.TB, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s = %v, want an error matching %v", what, err, want)
	}
}

// Key returns the Redis key of one part ("s", "q", "h"...) of the
// semaphore name, which must carry no hash tag of its own (see fairlock's
// package doc).
func (e *Env) Key(name, part string) string { return e.Prefix + "{" + name + "}:" + part }

// CondKey returns the key of the waiters of the condition cond of the
// semaphore name (an untagged name): a derived key, base, U+001F, "c",
// U+001F, cond (keyspace.Keys.Derived).
func (e *Env) CondKey(name, cond string) string {
	return e.Prefix + "{" + name + "}\x1fc\x1f" + cond
}

// Keys lists the keys under e's prefix.
func (e *Env) Keys() []string {
	e.T.Helper()
	ks, err := e.RDB.Keys(context.Background(), e.Prefix+"*").Result()
	if err != nil {
		e.T.Fatalf("KEYS: %v", err)
	}
	return ks
}

// WaitQueued waits until n tickets, live or dead, wait in the queue of the
// semaphore name (untagged, as for Key). [WaitWaiters] counts live
// waiters only.
func (e *Env) WaitQueued(name string, n int64) {
	e.T.Helper()
	e.WaitFor(fmt.Sprintf("%d queued on %s", n, name), func() bool {
		got, err := e.RDB.ZCard(context.Background(), e.Key(name, "q")).Result()
		return err == nil && got == n
	})
}

// WaitDone waits for l's Done channel, failing the test after 10s.
func (e *Env) WaitDone(l *fairlock.Lease) {
	e.T.Helper()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		e.T.Fatal("lease Done not closed within 10s")
	}
}

// Result is what an acquire run by [Async] returned.
type Result struct {
	Lease *fairlock.Lease
	Err   error
}

// Async runs acquire in a goroutine and returns where its result arrives.
func Async(acquire func() (*fairlock.Lease, error)) <-chan Result {
	ch := make(chan Result, 1)
	go func() {
		l, err := acquire()
		ch <- Result{l, err}
	}()
	return ch
}

// Receive waits for ch's result, failing the test after 10s.
func (e *Env) Receive(ch <-chan Result) Result {
	e.T.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		e.T.Fatal("Acquire did not return within 10s")
		return Result{}
	}
}

// Granted is Receive, failing the test unless the acquire succeeded.
func (e *Env) Granted(ch <-chan Result) *fairlock.Lease {
	e.T.Helper()
	r := e.Receive(ch)
	if r.Err != nil {
		e.T.Fatalf("Acquire: %v", r.Err)
	}
	return r.Lease
}

// NotYet fails the test if ch already has a result.
func (e *Env) NotYet(ch <-chan Result, what string) {
	e.T.Helper()
	select {
	case r := <-ch:
		e.T.Fatalf("%s returned early: lease=%v err=%v", what, r.Lease != nil, r.Err)
	default:
	}
}

// Deadlocked fails the test unless err is a *fairlock.Error of op on names
// (in name order) matching [fairlock.ErrDeadlock] whose message says
// which lease holds the semaphore: its token and the semaphore's name.
func Deadlocked(t testing.TB, what string, err error, op string, names []string, token int64, held string) {
	t.Helper()
	var fe *fairlock.Error
	switch {
	case !errors.Is(err, fairlock.ErrDeadlock):
		t.Fatalf("%s = %v, want an error matching ErrDeadlock", what, err)
	case !errors.As(err, &fe) || fe.Op != op || fmt.Sprint(fe.Names) != fmt.Sprint(names):
		t.Fatalf("%s = %#v, want a *fairlock.Error of %q on %q", what, err, op, names)
	case !strings.Contains(err.Error(), fmt.Sprint(token)) || !strings.Contains(err.Error(), fmt.Sprintf("%q", held)) ||
		!strings.Contains(err.Error(), "wait on itself"):
		t.Fatalf("%s = %v, want it to name the lease's token %d, the semaphore %q and why", what, err, token, held)
	}
}

// Bounded returns a context that ends after 10s, so that a wait that
// should not happen fails the test rather than hang it; it is cancelled
// when the test ends.
func Bounded(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

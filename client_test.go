package fairlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// Semantics 10: Redis faults give documented errors, never a hang, and
// leave what others hold intact.
func TestRedisFaults(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		s := newSem(e.Client(), "f", 2)
		held, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}

		// SCRIPT FLUSH: scripts are loaded again transparently.
		if err := e.RDB.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		l, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatalf("Acquire after SCRIPT FLUSH: %v", err)
		}
		e.Release(l)

		// Release twice.
		l, err = s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		e.Release(l)
		fltest.IsErr(t, "second Release", l.Release(ctx), fairlock.ErrNotHeld)

		// A key of the wrong type in fairlock's key space.
		if err := e.RDB.Set(ctx, e.Key("wrong", "s"), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_, err = newSem(e.Client(), "wrong", 1).Acquire(ctx, 1)
		fltest.IsErr(t, "Acquire over a string key", err, fairlock.ErrRedis)

		// Out of memory.
		oom(t, b, e, func() {
			_, err := newSem(e.Client(), "oom", 1).Acquire(ctx, 1)
			fltest.IsErr(t, "Acquire under OOM", err, fairlock.ErrRedis)
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatalf("Acquire under OOM = %v, want Redis's OOM message", err)
			}
		})

		// The holder was not disturbed by any of it.
		if err := held.Err(); err != nil {
			t.Fatalf("holder's lease after others' faults: %v", err)
		}
		e.Release(held)
	})
}

// oom runs f while b refuses writes for lack of memory.
func oom(t *testing.T, b *redistest.Backend, e *fltest.Env, f func()) {
	t.Helper()
	ctx := context.Background()
	if b.Mini != nil {
		b.Mini.SetError("OOM command not allowed when used memory > 'maxmemory'.")
		defer b.Mini.SetError("")
		f()
		return
	}
	if err := e.RDB.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer e.RDB.ConfigSet(ctx, "maxmemory", "0")
	f()
}

// Semantics 10: with Redis gone, calls fail with ErrRedis, and do not hang.
func TestRedisDown(t *testing.T) {
	b := redistest.Mini(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	c := e.Client(fairlock.WithLeaseTTL(300*time.Millisecond), fairlock.WithWaiterTTL(300*time.Millisecond))
	s := newSem(c, "down", 1)
	held, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	waiting := acquireAsync(ctx, newSem(e.Client(fairlock.WithWaiterTTL(300*time.Millisecond)), "down", 1), 1)
	e.WaitQueued("down", 1)
	b.Mini.Close()

	_, err = s.TryAcquire(ctx, 1)
	fltest.IsErr(t, "TryAcquire with Redis down", err, fairlock.ErrRedis)
	// A blocked waiter learns within about one waiter TTL.
	r := e.Receive(waiting)
	fltest.IsErr(t, "blocked Acquire with Redis down", r.Err, fairlock.ErrRedis)
	// The holder's lease is lost once it cannot be renewed in time.
	e.WaitDone(held)
	fltest.IsErr(t, "Err() of an unrenewable lease", held.Err(), fairlock.ErrLeaseLost)
	err = held.Release(ctx)
	fltest.IsErr(t, "Release with Redis down", err, fairlock.ErrRedis)
	var netErr interface{ Timeout() bool }
	if !errors.As(err, &netErr) {
		t.Logf("Release error %v does not expose a net.Error; fine, but unusual", err)
	}
}

// Close ends waits, releases the leases it holds (their Done closed before
// it returns), and fails later calls.
func TestClose(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		c := e.Client()
		s := newSem(c, "close", 1)
		held, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		waiting := acquireAsync(ctx, s, 1)
		e.WaitQueued("close", 1)
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		select {
		case <-held.Done():
		default:
			t.Fatal("the lease's Done is open after Close returned")
		}
		fltest.IsErr(t, "Err() after Close", held.Err(), fairlock.ErrClosed)
		r := e.Receive(waiting)
		fltest.IsErr(t, "Acquire blocked across Close", r.Err, fairlock.ErrClosed)
		e.WaitQueued("close", 0)
		// The permit is free in Redis at once.
		l, err := newSem(e.Client(), "close", 1).TryAcquire(ctx, 1)
		if err != nil {
			t.Fatalf("TryAcquire after holder's Close = %v, want the permit Close released", err)
		}
		e.Release(l)
		fltest.IsErr(t, "Release after Close", held.Release(ctx), fairlock.ErrClosed)
		_, err = s.Acquire(ctx, 1)
		fltest.IsErr(t, "Acquire after Close", err, fairlock.ErrClosed)
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := c.Abandon(); err != nil {
			t.Fatalf("Abandon after Close: %v", err)
		}
	})
}

// Abandon ends waits, stops renewal without releasing (the lease stays in
// Redis until its TTL runs out, or its Release), and fails later calls.
func TestAbandon(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		c := e.Client()
		s := newSem(c, "abandon", 1)
		held, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		waiting := acquireAsync(ctx, s, 1)
		e.WaitQueued("abandon", 1)
		if err := c.Abandon(); err != nil {
			t.Fatalf("Abandon: %v", err)
		}
		r := e.Receive(waiting)
		fltest.IsErr(t, "Acquire blocked across Abandon", r.Err, fairlock.ErrClosed)
		e.WaitQueued("abandon", 0)
		e.WaitDone(held)
		fltest.IsErr(t, "Err() after Abandon", held.Err(), fairlock.ErrClosed)
		// The permit is still held in Redis until released.
		if _, err := newSem(e.Client(), "abandon", 1).TryAcquire(ctx, 1); !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire after holder's Abandon = %v, want ErrNotAcquired", err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release after Abandon: %v", err)
		}
		_, err = s.Acquire(ctx, 1)
		fltest.IsErr(t, "Acquire after Abandon", err, fairlock.ErrClosed)
		if err := c.Abandon(); err != nil {
			t.Fatalf("second Abandon: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close after Abandon: %v", err)
		}
	})
}

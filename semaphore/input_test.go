package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// Semantics 10: bad arguments get clear errors before anything reaches
// Redis.
func TestBadArguments(t *testing.T) {
	b := redistest.Mini(t)
	e := newEnv(t, b)
	c := e.Client()
	var nilClient *redis.Client
	for _, tc := range []struct {
		what string
		err  error
		want error
	}{
		{"New(nil)", second(fairlock.New(nil)), fairlock.ErrInvalidArgument},
		{"New(nil *redis.Client)", second(fairlock.New(nilClient)), fairlock.ErrInvalidArgument},
		{"WithLeaseTTL(0)", second(fairlock.New(e.rdb, fairlock.WithLeaseTTL(0))), fairlock.ErrInvalidArgument},
		{"WithLeaseTTL(-1s)", second(fairlock.New(e.rdb, fairlock.WithLeaseTTL(-time.Second))), fairlock.ErrInvalidArgument},
		{"WithWaiterTTL(0)", second(fairlock.New(e.rdb, fairlock.WithWaiterTTL(0))), fairlock.ErrInvalidArgument},
		{"WithPrefix with a brace", second(fairlock.New(e.rdb, fairlock.WithPrefix("a{b"))), fairlock.ErrInvalidArgument},
		{"semaphore.New(nil client)", second(semaphore.New(nil, "x", 1)), fairlock.ErrInvalidArgument},
		{"empty name", second(semaphore.New(c, "", 1)), fairlock.ErrInvalidName},
		{"oversize name", second(semaphore.New(c, strings.Repeat("x", fairlock.MaxNameLen+1), 1)), fairlock.ErrInvalidName},
		{"name with newline", second(semaphore.New(c, "a\nb", 1)), fairlock.ErrInvalidName},
		{"name not UTF-8", second(semaphore.New(c, "a\xffb", 1)), fairlock.ErrInvalidName},
		{"name that is only a tag", second(semaphore.New(c, "{x}", 1)), fairlock.ErrInvalidName},
		{"untagged name with a closing brace", second(semaphore.New(c, "a}b", 1)), fairlock.ErrInvalidName},
		{"capacity 0", second(semaphore.New(c, "x", 0)), fairlock.ErrInvalidArgument},
		{"capacity -1", second(semaphore.New(c, "x", -1)), fairlock.ErrInvalidArgument},
		{"capacity too large", second(semaphore.New(c, "x", fairlock.MaxCapacity+1)), fairlock.ErrInvalidArgument},
		{"NewMutex with empty name", second(semaphore.NewMutex(c, "")), fairlock.ErrInvalidName},
		{"NewRWMutex with empty name", second(semaphore.NewRWMutex(c, "")), fairlock.ErrInvalidName},
	} {
		fltest.IsErr(t, tc.what, tc.err, tc.want)
	}
	// Names that are odd but valid work.
	for _, name := range []string{"ünïcode ✓", "with space", "{tag}:x", "{a}b}", "x{", strings.Repeat("n", fairlock.MaxNameLen)} {
		l, err := e.sem(c, name, 1).Acquire(context.Background(), 1)
		if err != nil {
			t.Fatalf("Acquire on %q: %v", name, err)
		}
		e.Release(l)
	}
	for _, k := range e.keys() {
		if !strings.HasSuffix(k, ":s") && !strings.HasSuffix(k, ":t") {
			t.Fatalf("left key %s", k)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// Semantics 10: Redis faults give documented errors, never a hang, and
// leave what others hold intact.
func TestRedisFaults(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		s := e.sem(e.Client(), "f", 2)
		held, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}

		// SCRIPT FLUSH: scripts are loaded again transparently.
		if err := e.rdb.ScriptFlush(ctx).Err(); err != nil {
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
		if err := e.rdb.Set(ctx, e.key("wrong", "q"), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_, err = e.sem(e.Client(), "wrong", 1).Acquire(ctx, 1)
		fltest.IsErr(t, "Acquire over a string key", err, fairlock.ErrRedis)

		// Out of memory.
		oom(t, b, e, func() {
			_, err := e.sem(e.Client(), "oom", 1).Acquire(ctx, 1)
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
func oom(t *testing.T, b *redistest.Backend, e *env, f func()) {
	t.Helper()
	ctx := context.Background()
	if b.Mini != nil {
		b.Mini.SetError("OOM command not allowed when used memory > 'maxmemory'.")
		defer b.Mini.SetError("")
		f()
		return
	}
	if err := e.rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer e.rdb.ConfigSet(ctx, "maxmemory", "0")
	f()
}

// Semantics 10: with Redis gone, calls fail with ErrRedis, and do not hang.
func TestRedisDown(t *testing.T) {
	b := redistest.Mini(t)
	e := newEnv(t, b)
	ctx := context.Background()
	c := e.Client(fairlock.WithLeaseTTL(300*time.Millisecond), fairlock.WithWaiterTTL(300*time.Millisecond))
	s := e.sem(c, "down", 1)
	held, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	waiting := acquireAsync(ctx, e.sem(e.Client(fairlock.WithWaiterTTL(300*time.Millisecond)), "down", 1), 1)
	e.waitQueued("down", 1)
	b.Mini.Close()

	_, err = s.TryAcquire(ctx, 1)
	fltest.IsErr(t, "TryAcquire with Redis down", err, fairlock.ErrRedis)
	// A blocked waiter learns within about one waiter TTL.
	r := e.receive(waiting)
	fltest.IsErr(t, "blocked Acquire with Redis down", r.err, fairlock.ErrRedis)
	// The holder's lease is lost once it cannot be renewed in time.
	e.waitDone(held)
	fltest.IsErr(t, "Err() of an unrenewable lease", held.Err(), fairlock.ErrLeaseLost)
	err = held.Release(ctx)
	fltest.IsErr(t, "Release with Redis down", err, fairlock.ErrRedis)
	var netErr interface{ Timeout() bool }
	if !errors.As(err, &netErr) {
		t.Logf("Release error %v does not expose a net.Error; fine, but unusual", err)
	}
}

// Close ends waits, stops renewal without releasing, and fails later calls.
func TestClose(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		s := e.sem(c, "close", 1)
		held, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		waiting := acquireAsync(ctx, s, 1)
		e.waitQueued("close", 1)
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		r := e.receive(waiting)
		fltest.IsErr(t, "Acquire blocked across Close", r.err, fairlock.ErrClosed)
		e.waitQueued("close", 0)
		e.waitDone(held)
		fltest.IsErr(t, "Err() after Close", held.Err(), fairlock.ErrClosed)
		// The permit is still held in Redis until released.
		if _, err := e.sem(e.Client(), "close", 1).TryAcquire(ctx, 1); !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire after holder's Close = %v, want ErrNotAcquired", err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release after Close: %v", err)
		}
		_, err = s.Acquire(ctx, 1)
		fltest.IsErr(t, "Acquire after Close", err, fairlock.ErrClosed)
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

package multilock_test

import (
	"context"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/multilock"
	"github.com/fairlock/fairlock/semaphore"
)

// A multi-lock that overlaps a mutex the context holds fails at once with
// ErrDeadlock naming the held part (Lock, Acquire, Do, DoLock alike); a
// mutex held as part of a multi-lock cannot be locked again under it; a
// multi-lock of other names proceeds; TryLock returns ErrNotAcquired.
func TestDeadlockOverlap(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		c := e.Client()
		ctx := fltest.Bounded(t)
		mu, err := semaphore.NewMutex(c, "{acct}:17")
		if err != nil {
			t.Fatal(err)
		}
		names := []string{"{acct}:17", "{acct}:42"}
		l, err := mu.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lctx, cancel := fairlock.LeaseContext(ctx, l)
		_, err = multilock.Lock(lctx, c, names...)
		fltest.Deadlocked(t, "Lock over a held mutex", err, "acquire", names, l.Token(), "{acct}:17")
		_, err = multilock.Acquire(lctx, c, multilock.Mutex("{acct}:42"), multilock.Mutex("{acct}:17"))
		fltest.Deadlocked(t, "Acquire over a held mutex", err, "acquire", names, l.Token(), "{acct}:17")
		ran := false
		fn := func(context.Context) error { ran = true; return nil }
		fltest.IsErr(t, "DoLock over a held mutex", multilock.DoLock(lctx, c, names, fn), fairlock.ErrDeadlock)
		fltest.IsErr(t, "Do over a held mutex", multilock.Do(lctx, c, []multilock.Request{multilock.Mutex("{acct}:17")}, fn), fairlock.ErrDeadlock)
		if ran {
			t.Fatal("Do over a held mutex ran its function")
		}
		_, err = multilock.TryLock(lctx, c, names...)
		fltest.IsErr(t, "TryLock over a held mutex", err, fairlock.ErrNotAcquired)
		cancel()
		e.Release(l)

		err = multilock.DoLock(ctx, c, names, func(ctx context.Context) error {
			_, err := mu.Lock(ctx)
			fltest.IsErr(t, "Lock of a mutex the multi-lock holds", err, fairlock.ErrDeadlock)
			other, err := multilock.Lock(ctx, c, "{acct}:1", "{acct}:2")
			if err != nil {
				t.Fatalf("Lock of other names under the multi-lock: %v", err)
			}
			return other.Release(ctx)
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

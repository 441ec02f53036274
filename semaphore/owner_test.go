package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
)

// A mutex locked again under its own lease's context, inside Do or a
// LeaseContext, fails at once with ErrDeadlock (Do does not run its
// function); TryLock returns ErrNotAcquired as for anybody.
func TestDeadlockMutexLockedAgain(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		mu, err := semaphore.NewMutex(e.Client(), "mu")
		if err != nil {
			t.Fatal(err)
		}
		ctx := fltest.Bounded(t)
		ran := false
		err = mu.Do(ctx, func(ctx context.Context) error {
			_, err := mu.Lock(ctx)
			fltest.IsErr(t, "Lock inside Do", err, fairlock.ErrDeadlock)
			_, err = mu.TryLock(ctx)
			fltest.IsErr(t, "TryLock inside Do", err, fairlock.ErrNotAcquired)
			return mu.Do(ctx, func(context.Context) error { ran = true; return nil })
		})
		fltest.IsErr(t, "Do inside Do", err, fairlock.ErrDeadlock)
		if ran {
			t.Fatal("Do inside Do ran its function")
		}

		l, err := mu.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lctx, cancel := fairlock.LeaseContext(ctx, l)
		_, err = mu.Lock(lctx)
		fltest.Deadlocked(t, "Lock under LeaseContext", err, "acquire", []string{"mu"}, l.Token(), "mu")
		cancel()
		e.Release(l)
	})
}

// A write lock asked for under a read lock of the same RWMutex (an
// upgrade), or a read lock under the write lock, fails at once with
// ErrDeadlock. A read lock under a read lock is let through: it is granted
// when no writer is queued (it can deadlock only when one is; see the
// guide).
func TestDeadlockRWMutex(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		rw, err := semaphore.NewRWMutex(e.Client(), "rw")
		if err != nil {
			t.Fatal(err)
		}
		ctx := fltest.Bounded(t)
		err = rw.RDo(ctx, func(ctx context.Context) error {
			_, err := rw.Lock(ctx)
			fltest.IsErr(t, "Lock under RLock (an upgrade)", err, fairlock.ErrDeadlock)
			if err := rw.Do(ctx, func(context.Context) error { return nil }); !errors.Is(err, fairlock.ErrDeadlock) {
				t.Fatalf("Do under RDo = %v, want ErrDeadlock", err)
			}
			// Recursive read locking, no writer queued.
			return rw.RDo(ctx, func(context.Context) error { return nil })
		})
		if err != nil {
			t.Fatalf("RDo: %v", err)
		}
		err = rw.Do(ctx, func(ctx context.Context) error {
			_, err := rw.RLock(ctx)
			return err
		})
		fltest.IsErr(t, "RLock under Lock", err, fairlock.ErrDeadlock)

		r, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := fairlock.LeaseContext(ctx, r)
		_, err = rw.Lock(rctx)
		fltest.Deadlocked(t, "Lock under LeaseContext of RLock", err, "acquire", []string{"rw"}, r.Token(), "rw")
		cancel()
		e.Release(r)
	})
}

// A counting semaphore: more than the capacity minus what the context
// holds fails at once; up to that is granted.
func TestDeadlockCountingSemaphore(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		s := newSem(t, e.Client(), "pool", 5)
		ctx := fltest.Bounded(t)
		err := s.Do(ctx, 3, func(ctx context.Context) error {
			_, err := s.Acquire(ctx, 3)
			fltest.IsErr(t, "Acquire of 3 of 5 with 3 held", err, fairlock.ErrDeadlock)
			l, err := s.Acquire(ctx, 2)
			if err != nil {
				t.Fatalf("Acquire of the 2 left beside the 3 held: %v", err)
			}
			// Two leases of the context hold all 5 between them.
			lctx, cancel := fairlock.LeaseContext(ctx, l)
			defer cancel()
			_, err = s.Acquire(lctx, 1)
			fltest.Deadlocked(t, "Acquire of 1 with all 5 held by two leases", err, "acquire", []string{"pool"}, l.Token(), "pool")
			return l.Release(ctx)
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// The hazard the check cannot see: a read lock taken again under a read
// lock is granted at once when no writer waits, but a writer that queues
// between the two waits for the first, and the second waits behind the
// writer: a deadlock through another caller. It is not detected; here the
// second read lock waits until its deadline.
func TestRecursiveReadLockBehindWriterNotDetected(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		rw, err := semaphore.NewRWMutex(e.Client(), "rwq")
		if err != nil {
			t.Fatal(err)
		}
		ctx := fltest.Bounded(t)
		r, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(r)
		writer, err := semaphore.NewRWMutex(e.Client(), "rwq")
		if err != nil {
			t.Fatal(err)
		}
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		w := fltest.Async(func() (*fairlock.Lease, error) { return writer.Lock(wctx) })
		e.WaitQueued("rwq", 1)

		rctx, cancel := fairlock.LeaseContext(ctx, r)
		defer cancel()
		short, cancelShort := context.WithTimeout(rctx, 200*time.Millisecond)
		defer cancelShort()
		_, err = rw.RLock(short)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("RLock under RLock behind a queued writer = %v, want it to wait until its deadline", err)
		}
		stop()
		if res := e.Receive(w); res.Err == nil {
			e.Release(res.Lease)
		}
	})
}

// An RWMutex's deadlock is told in read and write locks, never in the
// permits of the semaphore underneath (MaxReaders of them).
func TestDeadlockRWMutexMessage(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		rw, err := semaphore.NewRWMutex(e.Client(), "rw")
		if err != nil {
			t.Fatal(err)
		}
		ctx := fltest.Bounded(t)
		for _, tc := range []struct {
			name      string
			hold      []bool // each a lock the context carries: true for the write lock
			askWrite  bool
			want, not string
		}{
			{"write under read", []bool{false}, true, `the write lock of "rw" cannot be granted under a read lock of it (token %s)`, "permits"},
			{"read under write", []bool{true}, false, `a read lock of "rw" cannot be granted under the write lock of it (token %s)`, "permits"},
			{"write under write", []bool{true}, true, `the write lock of "rw" cannot be granted under the write lock of it (token %s)`, "permits"},
			{"write under two reads", []bool{false, false}, true, `the write lock of "rw" cannot be granted under 2 read locks of it (tokens %s)`, "permits"},
		} {
			lctx := ctx
			var tokens []string
			var leases []*fairlock.Lease
			for _, w := range tc.hold {
				lock := rw.RLock
				if w {
					lock = rw.Lock
				}
				l, err := lock(ctx)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				leases = append(leases, l)
				tokens = append(tokens, fmt.Sprint(l.Token()))
				var cancel context.CancelFunc
				lctx, cancel = fairlock.LeaseContext(lctx, l)
				defer cancel()
			}
			lock := rw.RLock
			if tc.askWrite {
				lock = rw.Lock
			}
			_, err := lock(lctx)
			fltest.IsErr(t, tc.name, err, fairlock.ErrDeadlock)
			slices.Reverse(tokens) // innermost first
			want := fmt.Sprintf(tc.want, strings.Join(tokens, ", "))
			if msg := err.Error(); !strings.Contains(msg, want) || strings.Contains(msg, tc.not) || !strings.HasPrefix(msg, `fairlock: acquire "rw": deadlock: `) {
				t.Errorf("%s: error = %q, want it to say %q and not %q", tc.name, msg, want, tc.not)
			}
			for _, l := range leases {
				e.Release(l)
			}
		}
	})
}

package fairlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A state hash whose expiry or sequence another program overwrote with a
// value no script writes ('nan', 'inf', a number past what a float holds
// exactly, a negative one) must not lose a lease granted on it: read as a
// time, 'inf' would keep the keys' TTL from ever moving (they expire with
// the lease inside), and 'nan' would move it to a time before now (Redis
// deletes them at once). Either way the next caller would be granted the
// mutex beside the holder. Each value, on each field, through the lean,
// fast and general paths alike (a mutex nobody holds, then one with a
// waiter), leaves the holder alone, the state with a TTL, and tokens that
// still increase.
func TestOddExpiryAndSequenceKeepTheLease(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		c := e.Client()
		for _, field := range []string{"exp", "seq"} {
			for _, v := range []string{"nan", "inf", "-inf", "1e300", "-1"} {
				name := "odd-" + field + "-" + v
				m := newSem(c, name, 1)
				first, err := m.Acquire(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				e.Release(first)
				if err := e.RDB.HSet(ctx, e.Key(name, "s"), field, v).Err(); err != nil {
					t.Fatal(err)
				}
				l, err := m.TryAcquire(ctx, 1)
				if err != nil {
					t.Fatalf("%s=%s: acquire of a free mutex: %v", field, v, err)
				}
				if l.Token() <= first.Token() || l.Token() >= 1<<53 {
					t.Errorf("%s=%s: token %d after %d", field, v, l.Token(), first.Token())
				}
				if ttl := e.RDB.PTTL(ctx, e.Key(name, "s")).Val(); ttl <= 0 {
					t.Errorf("%s=%s: the state of a held mutex has TTL %v", field, v, ttl)
				}
				if _, err := m.TryAcquire(ctx, 1); !errors.Is(err, fairlock.ErrNotAcquired) {
					t.Fatalf("%s=%s: a second caller got %v while the mutex is held, want ErrNotAcquired", field, v, err)
				}
				// The same value under a holder: its release hands on to a
				// waiter, through the fast paths.
				if err := e.RDB.HSet(ctx, e.Key(name, "s"), field, v).Err(); err != nil {
					t.Fatal(err)
				}
				ch := acquireAsync(ctx, m, 1)
				e.WaitQueued(name, 1)
				e.Release(l)
				r := e.Receive(ch)
				if r.Err != nil {
					t.Fatalf("%s=%s: waiter: %v", field, v, r.Err)
				}
				if r.Lease.Token() <= l.Token() || r.Lease.Token() >= 1<<53 {
					t.Errorf("%s=%s: handed-on token %d after %d", field, v, r.Lease.Token(), l.Token())
				}
				if _, err := m.TryAcquire(ctx, 1); !errors.Is(err, fairlock.ErrNotAcquired) {
					t.Fatalf("%s=%s: a caller got %v while the waiter holds the mutex, want ErrNotAcquired", field, v, err)
				}
				e.Release(r.Lease)
			}
		}
	})
}

package fairlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// A process stopped past its lease's TTL (SIGSTOP, a long GC pause, a
// suspended VM) resumes with its timers not yet run: Err must already say
// the lease is lost, or the holder acts on a resource another holder now
// has. The scheduler is held up here as a stopped process's would be.
func TestErrSeesLeaseLapsedBeforeItsTimers(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Acquire(ctx, Request{Name: "lapse", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Err(); err != nil {
			t.Fatalf("Err() of a lease just granted = %v", err)
		}
		c.sched.mu.Lock() // no renewal runs
		time.Sleep(ttl + ttl/2)
		err = l.Err()
		lapsed := errors.Is(err, ErrLeaseLost)
		c.sched.mu.Unlock()
		if !lapsed {
			t.Fatalf("Err() %v past the lease's deadline, its renewal held up, = %v; want ErrLeaseLost", ttl/2, err)
		}
		select {
		case <-l.Done():
		default:
			t.Fatal("Done not closed once Err reported the lease lost")
		}
		if err := l.Release(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Release of the lapsed lease = %v", err)
		}
	})
}

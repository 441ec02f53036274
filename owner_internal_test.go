package fairlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// A lease past its deadline no longer counts as the context's, though its
// timers, held up as a stopped process's would be, have not ended it: the
// check reads the lease's clock (Err), and the request proceeds.
func TestDeadlockLapsedLeaseNoLongerCounts(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		req := Request{Name: "lapsed", Capacity: 1, Permits: 1}
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		owned := withOwner(ctx, l) // as LeaseContext marks it, without ending with it
		p, err := c.plan([]Request{req})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.deadlock(owned, "acquire", p); !errors.Is(err, ErrDeadlock) {
			t.Fatalf("the check under a live lease = %v, want ErrDeadlock", err)
		}
		c.sched.Lock() // no renewal runs
		time.Sleep(ttl + ttl/2)
		err = c.deadlock(owned, "acquire", p)
		c.sched.Unlock()
		if err != nil {
			t.Fatalf("the check under a lease past its deadline, its renewal held up = %v, want nil", err)
		}
		if err := l.Err(); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("the lapsed lease's Err = %v, want ErrLeaseLost", err)
		}
		next, err := c.Acquire(owned, req)
		if err != nil {
			t.Fatalf("Acquire under a context carrying a lapsed lease: %v", err)
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

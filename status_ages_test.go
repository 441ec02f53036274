package fairlock

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// Status dates holders by their tokens and the queue by its first waiter,
// on Redis's clock: with the clock frozen and moved by hand, the ages are
// the moves, to the millisecond.
func TestStatusAges(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	ctx := context.Background()
	c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := Request{Name: "ages", Capacity: 2, Permits: 1}
	first, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx)
	b.Advance(t, 700*time.Millisecond)
	second, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	b.Advance(t, 300*time.Millisecond)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go c.Acquire(wctx, req)
	waitFor(t, func() bool {
		st, err := c.Status(ctx, "ages")
		return err == nil && st.Queued == 1
	})
	b.Advance(t, 200*time.Millisecond)

	st, err := c.Status(ctx, "ages")
	if err != nil {
		t.Fatal(err)
	}
	// Tokens carry microseconds, Redis's now in Status milliseconds: each
	// age is short of the truth by under a millisecond.
	within := func(got, want time.Duration) bool { return got <= want && got > want-time.Millisecond }
	ages := map[int64]time.Duration{}
	for _, h := range st.Holders {
		ages[h.Token] = h.HeldFor
	}
	if got := ages[first.Token()]; !within(got, 1200*time.Millisecond) {
		t.Fatalf("first holder HeldFor = %v, want 1.2s (holders %+v)", got, st.Holders)
	}
	if got := ages[second.Token()]; !within(got, 500*time.Millisecond) {
		t.Fatalf("second holder HeldFor = %v, want 500ms (holders %+v)", got, st.Holders)
	}
	if !within(st.OldestWait, 200*time.Millisecond) {
		t.Fatalf("OldestWait = %v, want 200ms (waiters %+v, time %v)", st.OldestWait, st.Waiters, st.Time)
	}
	if st.Time.IsZero() || st.Time.Sub(st.Waiters[0].Since) != st.OldestWait {
		t.Fatalf("Time %v, first waiter since %v, OldestWait %v", st.Time, st.Waiters[0].Since, st.OldestWait)
	}
}

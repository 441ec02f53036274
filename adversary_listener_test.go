package fairlock

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/keyslot"
	"github.com/fairlock/fairlock/internal/redistest"
)

// TestAdversaryForeignControlListDeafensTheListener: the listener leaves
// a wake list another program wrote out of its blocking read, but its
// control list (ctl, under the prefix and the same hash tag, named like a
// wake list by the client's id) is looked at by nobody: a value of
// another type there fails every BLPOP of the listener with WRONGTYPE,
// leaveOutForeign finds no foreign wake list (it looks at keys[1:] only)
// and the listener retries with backoff for ever. Every room of that
// listener hears its grants only through its refresh.
func TestAdversaryForeignControlListDeafensTheListener(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		prefix := redistest.Prefix(t)
		// A refresh every 5 s: a grant heard sooner came by the wake-up.
		c, err := New(b.Client(t), WithPrefix(prefix), WithWaiterTTL(15*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		holder, err := New(b.Client(t), WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		mutex := Request{Name: "a", Capacity: 1, Permits: 1}
		h, err := holder.Acquire(ctx, mutex)
		if err != nil {
			t.Fatal(err)
		}
		// Another program writes the control list of c's first listener
		// (named as attachLocked names it).
		ka, _ := c.keys("a")
		ctl := prefix + "{" + keyslot.HashTag(ka.Wake(c.id)) + "}:l:" + c.id + ":1"
		if err := b.Client(t).Set(ctx, ctl, "another program", 0).Err(); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := c.Acquire(ctx, mutex)
			if err == nil {
				_ = l.Release(ctx)
			}
			got <- err
		}()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			st, err := c.Status(ctx, "a")
			if err == nil && st.Queued == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no waiter queued")
			}
		}
		time.Sleep(100 * time.Millisecond) // the listener's read has begun (and failed)
		start := time.Now()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 2500*time.Millisecond {
				t.Fatalf("the waiter heard its grant %v after the release, as by its refresh (every 5 s): the listener was deaf", d)
			}
		case <-time.After(12 * time.Second):
			t.Fatal("the waiter did not learn its grant")
		}
	})
}

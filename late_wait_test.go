package fairlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/statecheck"
)

// lateWaitBackend has the first condition wait it sees run twice, as when
// the reply to the first run is lost and the call is sent again: between
// the two runs (once the first run made the new ticket wait) it calls
// between, and the client reads the second run's reply only. While
// between runs, the client's refreshes wait: its process looks dead.
type lateWaitBackend struct {
	backend.Backend
	once    sync.Once
	between func(fresh string)
	paused  sync.RWMutex // write-held while between runs
}

func (b *lateWaitBackend) Script(ctx context.Context, s backend.Script) (any, error) {
	if len(s.Args) > 0 && s.Args[0] == "refresh" {
		b.paused.RLock()
		defer b.paused.RUnlock()
	}
	out, err := b.Backend.Script(ctx, s)
	if len(s.Args) < 2 || s.Args[0] != "wait" || err != nil {
		return out, err // (a NOSCRIPT is sent again, as EVAL)
	}
	if r, ok := out.([]any); !ok || len(r) == 0 || r[0] != int64(1) {
		return out, err // the run did not make the ticket wait
	}
	first := false
	b.once.Do(func() { first = true })
	if !first {
		return out, err
	}
	b.paused.Lock()
	b.between(s.Args[len(s.Args)-2])
	b.paused.Unlock()
	return b.Backend.Script(ctx, s)
}

// TestLateWaitOfEndedTicketWakesSpuriously: a condition wait whose reply
// is lost, and whose copy runs after the new ticket it made wait has died
// and been dropped (a signal found its process gone, which leaves no
// trace), finds neither the lease nor the ticket. Sent while the lease
// lived, the wait ends as a spurious wakeup does: it locks again and
// returns a lease. It once answered "not held", and Wait failed with
// ErrLeaseLost though the call itself had released the lease.
func TestLateWaitOfEndedTicketWakesSpuriously(t *testing.T) {
	redistest.Long(t) // waits a waiter TTL of real time
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		rdb := b.Client(t)
		const waiterTTL = 300 * time.Millisecond
		prefix := WithPrefix(redistest.Prefix(t))
		signaller, err := New(rdb, prefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = signaller.Close() })
		const name = "late-wait"
		lb := &lateWaitBackend{Backend: newGoRedis(rdb)}
		lb.between = func(string) {
			// The waiting process stops refreshing; its waiter dies, and a
			// signal drops it.
			if b.Mini != nil {
				b.Mini.FastForward(2 * waiterTTL)
			}
			time.Sleep(2 * waiterTTL)
			if n, err := signaller.signal(ctx, name, "x", false); err != nil || n != 0 {
				t.Errorf("signal = %d, %v; want the dead waiter dropped, nobody woken", n, err)
			}
		}
		c, err := NewWithBackend(lb, prefix, WithWaiterTTL(waiterTTL))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		l, err := c.Acquire(ctx, Request{Name: name, Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		nl, err := l.condWait(ctx, "x")
		if err != nil {
			t.Fatalf("Wait whose copy found its new ticket dropped = %v; want a spurious wakeup (a lease)", err)
		}
		k, err := c.keys(name)
		if err != nil {
			t.Fatal(err)
		}
		hs, err := statecheck.Holders(ctx, rdb, k.Base)
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 1 {
			t.Fatalf("holders after the wakeup: %v; want the new lease alone", hs)
		}
		if err := nl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(l.Release(ctx), ErrNotHeld) {
			t.Fatal("the lease the wait gave up is still held")
		}
	})
}

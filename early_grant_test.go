package fairlock

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
)

// earlyGrantBackend runs onQueued (once) when an acquire script answers
// that it queued its ticket on the semaphore "early", before the answer reaches the client: the
// moment between Redis queueing a waiter and its process reading so.
type earlyGrantBackend struct {
	backend.Backend
	once     sync.Once
	onQueued func(ticket string)
	sent     map[string]int  // ops sent, by name
	tickets  map[string]bool // tickets asked for "early" (a resent call asks again under its own)
	mu       sync.Mutex
}

func (b *earlyGrantBackend) Script(ctx context.Context, s backend.Script) (any, error) {
	op := ""
	if len(s.Args) > 0 {
		op = s.Args[0]
	}
	b.mu.Lock()
	b.sent[op]++
	if op == "acquire" && strings.Contains(s.Keys[0], "{early}") {
		b.tickets[s.Args[1]] = true
	}
	b.mu.Unlock()
	out, err := b.Backend.Script(ctx, s)
	if r, ok := out.([]any); ok && err == nil && op == "acquire" && len(r) > 0 && r[0] == int64(2) && strings.Contains(s.Keys[0], "{early}") {
		b.once.Do(func() { b.onQueued(s.Args[1]) })
	}
	return out, err
}

// TestGrantHeardBeforeItsQueuedReply: a waiter whose grant is announced,
// and heard by its process, before the process has read its own acquire's
// reply (the semaphore's first waiter of this process, whose wake-ups
// another semaphore's waits already listen for) holds that grant. It once
// gave it back as if its process had stalled past it (the wake-up carried
// no reading of Redis's clock yet), and asked again at the back of the
// queue: a lost place, a grant wasted, a tombstone left.
func TestGrantHeardBeforeItsQueuedReply(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		rdb := b.Client(t)
		prefix := WithPrefix(redistest.Prefix(t))
		holder, err := New(rdb, prefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = holder.Close() })
		req := Request{Name: "early", Capacity: 1, Permits: 1}
		other := Request{Name: "other", Capacity: 1, Permits: 1}
		held, err := holder.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		heldOther, err := holder.Acquire(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		var waiter *Client
		gb := &earlyGrantBackend{Backend: newGoRedis(rdb), sent: map[string]int{}, tickets: map[string]bool{}}
		gb.onQueued = func(ticket string) {
			// Hand the lease on, and wait until the waiter's process has
			// heard the grant.
			if err := held.Release(ctx); err != nil {
				t.Error(err)
				return
			}
			for deadline := time.Now().Add(5 * time.Second); ; {
				waiter.waits.Mu.Lock()
				_, waiting := waiter.waits.Tickets[ticket]
				waiter.waits.Mu.Unlock()
				if !waiting {
					return
				}
				if time.Now().After(deadline) {
					t.Error("the grant was not heard within 5s")
					return
				}
				time.Sleep(time.Millisecond)
			}
		}
		if waiter, err = NewWithBackend(gb, prefix); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = waiter.Close() })
		// A wait on another semaphore first, so that the process listens
		// for wake-ups before the semaphore under test has a waiter.
		first := make(chan error, 1)
		go func() {
			l, err := waiter.Acquire(ctx, other)
			if err == nil {
				err = l.Release(ctx)
			}
			first <- err
		}()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			waiter.waits.Mu.Lock()
			n := len(waiter.waits.Tickets)
			waiter.waits.Mu.Unlock()
			if n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the first wait did not queue")
			}
		}
		l, err := waiter.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		gb.mu.Lock()
		tickets, leaves := len(gb.tickets), gb.sent["leave"]
		gb.mu.Unlock()
		if leaves > 0 || tickets != 1 {
			t.Errorf("the waiter asked for the semaphore under %d tickets and sent %d leaves, want 1 and 0: it gave its grant back and asked again", tickets, leaves)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := heldOther.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
	})
}

package fairlock

// Adversarial tests of WithBatching (batch.go). Each names the promise it
// breaks; each fails on the code it was written against.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
)

// stallBackend is a Backend that returns by its context's end
// (backend.Info.Deadlines, as rueidis and valkey-go do) and models a Redis
// that stops answering: a script call that begins while stalled is set
// gets no answer; it returns only when its context ends (or at the test's
// end, free). Calls that begin after stalled is cleared are answered.
type stallBackend struct {
	backend.Backend
	stalled atomic.Bool
	entered atomic.Int32 // script calls that began while stalled
	free    chan struct{}
}

func (s *stallBackend) Info() backend.Info {
	info := s.Backend.Info()
	info.Deadlines = true
	return info
}

func (s *stallBackend) Script(ctx context.Context, sc backend.Script) (any, error) {
	if s.stalled.Load() {
		s.entered.Add(1)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.free:
			return nil, errors.New("stallBackend: freed at the test's end")
		}
	}
	return s.Backend.Script(ctx, sc)
}

// queuedIn returns how many calls of entry wait in c's batch queues.
func queuedIn(c *Client, entry string) int { return c.calls.Batch.Queued(entry) }

func advWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Promises: a blocking call returns by its context's end with Redis up or
// down, and ends what it began (a caller's cancellation ends its call);
// Close returns within its bound (one waiter TTL and a little through a
// client that honours deadlines); a call that meets no other is not
// delayed by batching.
//
// Calls queued behind a call Redis does not answer are sent, when it
// returns, as one batch under batchContext: WithoutCancel of the first
// call's context, with no deadline when their contexts have none. Their
// callers cancel and return, but the batch goes on in the Backend with a
// context that never ends, on a task of the client's. From then on the
// group stays busy: every later acquisition on the client queues behind
// it and fails at its deadline, though Redis answers again; and Close
// waits for the task without bound. Without batching, the same calls end
// with their contexts, a later Acquire is granted, and Close returns.
func TestBatchAdversaryCancelledBatchWedgesItsGroup(t *testing.T) {
	for _, batching := range []int{0, 8} {
		name := "alone"
		if batching > 0 {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) {
			b := redistest.Mini(t)
			s := &stallBackend{Backend: newGoRedis(b.Client(t)), free: make(chan struct{})}
			var freeOnce sync.Once
			free := func() { freeOnce.Do(func() { close(s.free) }) }
			defer free()
			const waiterTTL = 200 * time.Millisecond
			c, err := NewWithBackend(s, WithPrefix("wedge:"), WithBatching(batching), WithWaiterTTL(waiterTTL))
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					free() // the stalled calls return: Close can end
					c.Close()
				}
			}()
			s.stalled.Store(true)
			// A goes first and gets no answer; B and C come while it is out.
			var wg sync.WaitGroup
			var cancels []context.CancelFunc
			returned := make(chan time.Time, 3)
			for i, n := range []string{"a", "b", "c"} {
				ctx, cancel := context.WithCancel(context.Background())
				cancels = append(cancels, cancel)
				wg.Go(func() {
					_, err := c.Acquire(ctx, Request{Name: n, Capacity: 1, Permits: 1})
					if !errors.Is(err, context.Canceled) {
						t.Errorf("Acquire %s: %v, want context.Canceled", n, err)
					}
					returned <- time.Now()
				})
				if i == 0 {
					advWaitFor(t, "a's script call", func() bool { return s.entered.Load() == 1 })
				}
			}
			if batching > 0 {
				advWaitFor(t, "b and c queued", func() bool { return queuedIn(c, "acquire") == 2 })
			} else {
				advWaitFor(t, "b's and c's script calls", func() bool { return s.entered.Load() == 3 })
			}
			cancels[0]()
			if batching > 0 {
				// a's call ends with its context; b and c go out together.
				advWaitFor(t, "b and c sent", func() bool { return s.entered.Load() >= 2 && queuedIn(c, "acquire") == 0 })
			}
			cancels[1]()
			cancels[2]()
			cancelAt := time.Now()
			wg.Wait()
			for range 3 {
				if took := (<-returned).Sub(cancelAt); took > 200*time.Millisecond {
					t.Errorf("an Acquire returned %v after its context was cancelled", took)
				}
			}
			// Redis answers again.
			s.stalled.Store(false)
			time.Sleep(waiterTTL + 100*time.Millisecond) // the clean-ups end by their bound
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			l, err := c.Acquire(ctx, Request{Name: "d", Capacity: 1, Permits: 1})
			cancel()
			if err != nil {
				t.Errorf("Acquire of d, with Redis answering and no other call of the client's under way but cancelled ones: %v", err)
			} else {
				_ = l.Release(context.Background())
			}
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- c.Close() }()
			select {
			case <-done:
				closed = true
				t.Logf("Close returned after %v", time.Since(start).Round(time.Millisecond))
			case <-time.After(waiterTTL + 2*time.Second):
				t.Errorf("Close has not returned %v after it began (its bound: one waiter TTL, %v, and a little)", time.Since(start).Round(time.Millisecond), waiterTTL)
			}
		})
	}
}

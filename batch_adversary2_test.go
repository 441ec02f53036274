package fairlock

// Second round of adversarial tests of WithBatching (batch.go) and of the
// backend package's contract. Each names the promise it breaks; each fails
// on the code it was written against (cd9280b).

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
)

// Promise: Close returns within its documented bound — through a client
// that honours deadlines (rueidis, valkey-go), "within one waiter TTL and
// a little" — and "an Acquire whose script call Redis had not answered by
// then, on a client that waits for Redis as long as the caller's context
// lasts (rueidis, valkey-go): Close stops waiting for it at its bound".
//
// Without batching that holds: the stuck acquisition runs on its caller's
// goroutine and Close stops counting it at the bound (c.acquiring). With
// batching, an acquisition that queued behind another call is sent by
// drain, on a task of the client's (spawn), and Close waits for tasks
// without bound (close.go: `for c.tasks > 0 || ...`). The batch's context
// is batchContext's: with a caller's context.Background() (no Done) it
// never ends; with a long deadline it ends at that deadline. Either way
// Close waits for it, not for its bound. (The group stays busy too, so
// every later acquisition of the client queues behind it.)
func TestBatchAdversary2QueuedAcquireHoldsCloseForever(t *testing.T) {
	for _, kind := range []string{"background", "minute"} {
		for _, batching := range []int{0, 8} {
			name := kind + "/alone"
			if batching > 0 {
				name = kind + "/batched"
			}
			t.Run(name, func(t *testing.T) {
				b := redistest.Mini(t)
				s := &stallBackend{Backend: newGoRedis(b.Client(t)), free: make(chan struct{})}
				var freeOnce sync.Once
				free := func() { freeOnce.Do(func() { close(s.free) }) }
				const waiterTTL = 200 * time.Millisecond
				c, err := NewWithBackend(s, WithPrefix("hold:"), WithBatching(batching), WithWaiterTTL(waiterTTL))
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				bctx, bcancel := context.Background(), context.CancelFunc(func() {})
				if kind == "minute" {
					bctx, bcancel = context.WithTimeout(context.Background(), time.Minute)
				}
				closeDone := make(chan error, 1)
				closing := false
				defer func() {
					free() // the stalled calls return: everything can end
					bcancel()
					if !closing {
						go func() { closeDone <- c.Close() }()
					}
					<-closeDone
					wg.Wait()
				}()
				s.stalled.Store(true)
				actx, acancel := context.WithCancel(context.Background())
				defer acancel()
				// A goes first, alone, and gets no answer.
				wg.Go(func() { _, _ = c.Acquire(actx, Request{Name: "a", Capacity: 1, Permits: 1}) })
				advWaitFor(t, "a's script call", func() bool { return s.entered.Load() == 1 })
				// B comes while A is out: with batching it queues.
				wg.Go(func() { _, _ = c.Acquire(bctx, Request{Name: "b", Capacity: 1, Permits: 1}) })
				// (Under context.Background() B is sent alone, on its
				// caller's goroutine, as without batching: a Backend that
				// returns by its context's end would hold its group until the
				// close.)
				queues := batching > 0 && kind != "background"
				if queues {
					advWaitFor(t, "b queued", func() bool { return queuedIn(c, "acquire") == 1 })
				} else {
					advWaitFor(t, "b's script call", func() bool { return s.entered.Load() == 2 })
				}
				// A's caller gives up: its call returns; B is sent (batched:
				// by drain, on a task of the client's).
				acancel()
				if queues {
					advWaitFor(t, "b sent", func() bool { return queuedIn(c, "acquire") == 0 })
				}
				time.Sleep(50 * time.Millisecond)
				start := time.Now()
				closing = true
				go func() { closeDone <- c.Close() }()
				select {
				case err := <-closeDone:
					closeDone <- err // for the deferred wait
					t.Logf("Close returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
				case <-time.After(waiterTTL + 2*time.Second):
					t.Errorf("Close has not returned %v after it began (its bound through a client that honours deadlines: one waiter TTL, %v, and a little); an Acquire queued in a batch, under a context that outlives the bound (%s), holds it",
						time.Since(start).Round(time.Millisecond), waiterTTL, kind)
				}
			})
		}
	}
}

// readTimeoutBackend models go-redis (no backend.Info.Deadlines) against
// a Redis that stops answering: a script call that begins while stalled
// is set returns, whatever its context, after readTimeout with a
// socket's timeout error, as go-redis does at its ReadTimeout (here with
// MaxRetries off).
type readTimeoutBackend struct {
	backend.Backend
	readTimeout time.Duration
	stalled     atomic.Bool
	entered     atomic.Int32
}

func (s *readTimeoutBackend) Info() backend.Info {
	info := s.Backend.Info()
	info.Deadlines = false
	return info
}

func (s *readTimeoutBackend) Script(ctx context.Context, sc backend.Script) (any, error) {
	if s.stalled.Load() {
		s.entered.Add(1)
		time.Sleep(s.readTimeout)
		return nil, fmt.Errorf("read tcp: i/o timeout: %w", os.ErrDeadlineExceeded)
	}
	return s.Backend.Script(ctx, sc)
}

// Promise: Close returns within its bound, which through go-redis is
// "one waiter TTL plus the ReadTimeout of its call, Redis up, down or
// stalled". Without batching, concurrent acquisitions to a stalled Redis
// each wait out one ReadTimeout at the same time. With batching, those
// that queued behind the first call are sent one batch after another
// (drain: up to maxCalls per batch, each waiting out its own ReadTimeout),
// so Close, which waits for them (go-redis calls are not cut at the bound),
// takes about ceil(n/maxCalls)+1 ReadTimeouts. Here: 8 acquisitions with
// WithBatching(2), a 400 ms read timeout: about 2 s batched against 0.8 s
// alone.
func TestBatchAdversary2SerialBatchesStretchClose(t *testing.T) {
	for _, batching := range []int{0, 2} {
		name := "alone"
		if batching > 0 {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) {
			b := redistest.Mini(t)
			const readTimeout = 400 * time.Millisecond
			s := &readTimeoutBackend{Backend: newGoRedis(b.Client(t)), readTimeout: readTimeout}
			const waiterTTL = 200 * time.Millisecond
			c, err := NewWithBackend(s, WithPrefix("serial:"), WithBatching(batching), WithWaiterTTL(waiterTTL))
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			defer wg.Wait()
			s.stalled.Store(true)
			wg.Go(func() { _, _ = c.Acquire(context.Background(), Request{Name: "first", Capacity: 1, Permits: 1}) })
			advWaitFor(t, "the first script call", func() bool { return s.entered.Load() == 1 })
			const n = 8
			for i := range n {
				wg.Go(func() {
					_, _ = c.Acquire(context.Background(), Request{Name: fmt.Sprint("n", i), Capacity: 1, Permits: 1})
				})
			}
			if batching > 0 {
				advWaitFor(t, "the others queued", func() bool { return queuedIn(c, "acquire") == n })
			} else {
				advWaitFor(t, "the others' script calls", func() bool { return s.entered.Load() == 1+n })
			}
			start := time.Now()
			err = c.Close()
			took := time.Since(start)
			t.Logf("Close returned after %v: %v", took.Round(time.Millisecond), err)
			// The bound: one waiter TTL plus the ReadTimeout of its call;
			// a clean-up after a failed acquisition may wait out a second
			// ReadTimeout; and a generous margin.
			if bound := waiterTTL + 2*readTimeout + 400*time.Millisecond; took > bound {
				t.Errorf("Close took %v, past its bound through go-redis (one waiter TTL %v plus the ReadTimeout %v of its call; %v allowed): batches to a stalled Redis go one after another",
					took.Round(time.Millisecond), waiterTTL, readTimeout, bound)
			}
		})
	}
}

// boxedCheckBackend checks every script call's Boxed against the
// contract of backend.Script: "Boxed, when not nil, is Args as []any, each
// element the string at its index in Args".
type boxedCheckBackend struct {
	backend.Backend
	mu   sync.Mutex
	bad  []string
	seen atomic.Int32
	// renewals counts the renewal calls, Boxed set or not.
	renewals atomic.Int32
}

func (b *boxedCheckBackend) Script(ctx context.Context, sc backend.Script) (any, error) {
	if len(sc.Args) > 0 && strings.HasPrefix(sc.Args[0], "renew") {
		b.renewals.Add(1)
	}
	if sc.Boxed != nil {
		b.seen.Add(1)
		ok := len(sc.Boxed) == len(sc.Args)
		for i := 0; ok && i < len(sc.Args); i++ {
			s, isStr := sc.Boxed[i].(string)
			ok = isStr && s == sc.Args[i]
		}
		if !ok {
			b.mu.Lock()
			b.bad = append(b.bad, fmt.Sprintf("%s: %d args, %d boxed (%v / %v)", sc.Args[0], len(sc.Args), len(sc.Boxed), sc.Args, sc.Boxed))
			b.mu.Unlock()
		}
	}
	return b.Backend.Script(ctx, sc)
}

// Promise (API contract, backend/backend.go's Script.Boxed): "Boxed, when
// not nil, is Args as []any, each element the string at its index in
// Args, made once by fairlock: a client whose commands take []any may send
// it rather than box Args again." fairlock itself passes a Boxed that is
// a strict prefix of Args: renew_batch (internal/renew batchCall) appends to
// oc.args without oc.argv, and caller.alone sets sc.Boxed = oc.argv
// anyway. goRedis.send guards with sameArgs; an adapter written from the
// documented contract (sending Boxed when not nil) sends a renewal with
// its per-lease arguments cut off.
func TestBatchAdversary2BoxedIsArgs(t *testing.T) {
	b := redistest.Mini(t)
	chk := &boxedCheckBackend{Backend: newGoRedis(b.Client(t))}
	// (A TTL that a busy machine's stalls do not reach: the test is of
	// the renewals' arguments, not of their timing.)
	const ttl = 1500 * time.Millisecond
	c, err := NewWithBackend(chk, WithPrefix("boxed:"), WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.Acquire(ctx, Request{Name: "x", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	// A few renewals (every TTL/3): a renewal sent with a Boxed cut short
	// loses the lease.
	for deadline := time.Now().Add(10 * time.Second); chk.renewals.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := chk.renewals.Load(); n < 3 {
		t.Fatalf("%d renewals in 10 s, want three", n)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
	_ = l.Release(ctx)
	chk.mu.Lock()
	defer chk.mu.Unlock()
	if len(chk.bad) > 0 {
		t.Errorf("%d of %d script calls with Boxed set had Boxed != Args boxed, against backend.Script's contract; first: %s", len(chk.bad), chk.seen.Load(), chk.bad[0])
	}
}

// Promises: each call answered as if alone; a blocking call returns by
// its context's end. A batch holding one call whose context has no Done
// (context.Background(), legal for Acquire) and one cancellable call is
// sent by batchContext under a context that never ends (ending is false).
// The cancellable caller returns, but the group stays busy for as long as
// the Background call's script call is unanswered: every later
// acquisition of the client, on any name, queues behind it and fails at
// its deadline though Redis answers again. Without batching only the
// Background acquisition waits; the others are granted.
func TestBatchAdversary2BackgroundCallWedgesGroup(t *testing.T) {
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
			c, err := NewWithBackend(s, WithPrefix("wedge2:"), WithBatching(batching), WithWaiterTTL(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			defer func() {
				free()
				c.Close()
				wg.Wait()
			}()
			s.stalled.Store(true)
			actx, acancel := context.WithCancel(context.Background())
			defer acancel()
			wg.Go(func() { _, _ = c.Acquire(actx, Request{Name: "a", Capacity: 1, Permits: 1}) })
			advWaitFor(t, "a's script call", func() bool { return s.entered.Load() == 1 })
			// B (no Done) and C (cancellable) come while A is out.
			wg.Go(func() { _, _ = c.Acquire(context.Background(), Request{Name: "b", Capacity: 1, Permits: 1}) })
			cctx, ccancel := context.WithCancel(context.Background())
			defer ccancel()
			cDone := make(chan struct{})
			wg.Go(func() {
				defer close(cDone)
				_, _ = c.Acquire(cctx, Request{Name: "c", Capacity: 1, Permits: 1})
			})
			if batching > 0 {
				// B, under context.Background(), is sent alone (see
				// batcher.batches); C queues.
				advWaitFor(t, "b's script call, c queued", func() bool { return s.entered.Load() == 2 && queuedIn(c, "acquire") == 1 })
			} else {
				advWaitFor(t, "b's and c's script calls", func() bool { return s.entered.Load() == 3 })
			}
			acancel()
			if batching > 0 {
				advWaitFor(t, "c sent", func() bool { return queuedIn(c, "acquire") == 0 })
			}
			time.Sleep(20 * time.Millisecond)
			ccancel()
			select {
			case <-cDone:
			case <-time.After(time.Second):
				t.Errorf("c's Acquire did not return by its context's end")
			}
			// Redis answers again.
			s.stalled.Store(false)
			time.Sleep(300 * time.Millisecond) // the clean-ups end by their bound
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			l, err := c.Acquire(ctx, Request{Name: "d", Capacity: 1, Permits: 1})
			if err != nil {
				t.Errorf("Acquire of d, a free name, with Redis answering: %v (an unanswered Background call's batch holds the client's acquire group)", err)
				return
			}
			_ = l.Release(context.Background())
		})
	}
}

package fairlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A condition wait racing Close spends its lease whichever comes first
// (the wait's script, Close's release, or the wait finding the client
// closed before its script): it returns ErrClosed, and once Close has
// returned nothing is held, queued or waiting on the condition in Redis,
// and every lease and wait was observed from its start to its end.
func TestCondWaitRacingClose(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		pl := newPairLog()
		prefix := WithPrefix(redistest.Prefix(t))
		client := func() *Client {
			c, err := New(b.Client(t), prefix, WithObserver(pl), WithWaiterTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		observer, raw := client(), b.Client(t)
		for round := range 20 {
			name := fmt.Sprintf("condclose%d", round)
			c := client()
			l, err := c.Acquire(ctx, Request{Name: name, Capacity: 1, Permits: 1})
			if err != nil {
				t.Fatal(err)
			}
			w := condWaitAsync(ctx, l)
			if round%2 == 1 {
				time.Sleep(time.Duration(round) * 100 * time.Microsecond)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("round %d: Close: %v", round, err)
			}
			r := receive(t, w)
			if !errors.Is(r.err, ErrClosed) {
				t.Fatalf("round %d: CondWait racing Close = %v, want ErrClosed", round, r.err)
			}
			if l.Err() == nil {
				t.Fatalf("round %d: the lease given to CondWait is still held", round)
			}
			pl.balanced(t, observer, raw, name, 0, 0)
		}
		pl.check(t)
	})
}

// With WithReplicaAck, Close releases the leases as Release does (the
// release waits for the replicas' acknowledgement): the next waiter is
// granted at once.
func TestCloseWithReplicaAck(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		prefix := WithPrefix(redistest.Prefix(t))
		ardb := b.Client(t)
		ardb.AddHook(&fakeAck{})
		holder, err := New(ardb, prefix, WithReplicaAck(1, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		waiter, err := New(b.Client(t), prefix)
		if err != nil {
			t.Fatal(err)
		}
		defer waiter.Close()
		req := Request{Name: "acked", Capacity: 1, Permits: 1}
		held, err := holder.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			l, err := waiter.Acquire(ctx, req)
			if err == nil {
				err = l.Release(ctx)
			}
			done <- err
		}()
		waitQueued(t, waiter, "acked", 1)
		start := time.Now()
		if err := holder.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("the waiter: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter was not granted within 10 s of Close")
		}
		took := time.Since(start)
		t.Logf("%s: the waiter was granted and released %v after Close began", b.Name, took)
		if took > time.Second {
			t.Fatalf("the waiter was granted %v after Close, want well under the lease TTL", took)
		}
		if !errors.Is(held.Err(), ErrClosed) {
			t.Fatalf("Err() of the closed holder's lease: %v", held.Err())
		}
	})
}

// stallingBackend is a Backend that, once stalled, holds every script call
// until released, whatever its context: as a Redis client whose retries
// outlast any context (a go-redis Cluster client tries a command four
// times, each try waiting out its read timeout) would.
type stallingBackend struct {
	backend.Backend
	stalled atomic.Bool
	release chan struct{}
}

func (b *stallingBackend) Script(ctx context.Context, s backend.Script) (any, error) {
	if b.stalled.Load() {
		<-b.release
	}
	return b.Backend.Script(ctx, s)
}

// Close stops waiting at its bound, plus the Backend's answer wait, for
// the calls a Redis client holds past their contexts, and says what it
// left: a release at close held by the client for good does not hold
// Close.
func TestCloseGivesUpOnCallsHeldPastTheirContexts(t *testing.T) {
	redistest.Each(t, func(t *testing.T, rb *redistest.Backend) {
		b := &stallingBackend{Backend: newGoRedis(rb.Client(t)), release: make(chan struct{})}
		defer close(b.release)
		const waiterTTL = 300 * time.Millisecond
		c, err := NewWithBackend(b, WithPrefix(redistest.Prefix(t)), WithWaiterTTL(waiterTTL))
		if err != nil {
			t.Fatal(err)
		}
		c.answerWait = 300 * time.Millisecond
		if _, err := c.Acquire(context.Background(), Request{Name: "held", Capacity: 1, Permits: 1}); err != nil {
			t.Fatal(err)
		}
		b.stalled.Store(true)
		closed := make(chan error, 1)
		start := time.Now()
		go func() { closed <- c.Close() }()
		select {
		case err = <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Close waited 10 s for a release the Redis client held (its bound: 300ms, plus 300ms for a call already sent)")
		}
		took := time.Since(start)
		t.Logf("Close returned in %v: %v", took, err)
		if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "1 of 1 releases were still unanswered") {
			t.Errorf("Close = %v, want an error matching ErrRedis that says 1 release was still unanswered", err)
		}
		if took < waiterTTL {
			t.Errorf("Close returned in %v, before its bound %v", took, waiterTTL)
		}
	})
}

// A close counts failures whose errors differ in type (a reply error, a
// context's, a wrapped one): each kind's last is kept whatever its type.
// An atomic.Value held them once, which panics on a second store of
// another type: a Close in CI crashed its process so.
func TestCloseKeepsLastErrorsOfAnyType(t *testing.T) {
	var s shutdownState
	errs := []error{errors.New("first"), context.DeadlineExceeded, fmt.Errorf("wrapped: %w", ErrRedis)}
	for _, err := range errs {
		s.fail(err)
		s.failResend(err)
		s.failWithdrawal(err)
	}
	last := errs[len(errs)-1]
	for name, got := range map[string]any{"release": s.lastErr.Load(), "resend": s.resendLastErr.Load(), "withdrawal": s.withdrawLastErr.Load()} {
		if got != any(last) {
			t.Errorf("last %s error = %v, want %v", name, got, last)
		}
	}
}

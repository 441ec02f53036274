package fairlock

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
)

// opStallBackend returns by its context's end (backend.Info.Deadlines, as
// rueidis and valkey-go do). While armed, a script call of one of the ops
// in stall fails once with io.EOF (a dropped connection: transient) if
// failFirst is set, and after that gets no answer: it returns when its
// context ends, or when the test frees it.
type opStallBackend struct {
	backend.Backend
	armed     atomic.Bool
	failFirst bool
	failed    atomic.Bool
	stall     map[string]bool
	entered   atomic.Int32
	far       atomic.Int32 // of entered: under a deadline more than a minute away
	free      chan struct{}
}

func (s *opStallBackend) Info() backend.Info {
	info := s.Backend.Info()
	info.Deadlines = true
	return info
}

func (s *opStallBackend) Script(ctx context.Context, sc backend.Script) (any, error) {
	if s.armed.Load() && len(sc.Args) > 0 && s.stall[sc.Args[0]] {
		if s.failFirst && s.failed.CompareAndSwap(false, true) {
			return nil, io.EOF
		}
		s.entered.Add(1)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) > time.Minute {
			s.far.Add(1)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.free:
			return nil, errors.New("opStallBackend: freed at the test's end")
		}
	}
	return s.Backend.Script(ctx, sc)
}

// A resend of a release on its way when the close begins ends there:
// through a Backend that returns by its context's end (rueidis,
// valkey-go), a try under the lease's deadline (here a Request.LeaseTTL of
// an hour) to a Redis that does not answer held Close as long. The next
// try goes within the close's bound, and Close returns within it.
func TestCloseEndsAResendOnItsWay(t *testing.T) {
	const waiterTTL = 200 * time.Millisecond
	const limit = 3 * time.Second // far past waiterTTL + closeSlack
	for _, row := range []struct {
		name      string
		stall     string
		failFirst bool
		leaseTTL  time.Duration
		call      func(c *Client, l *Lease)
	}{
		{"resend", "release", true, time.Hour, func(c *Client, l *Lease) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err := l.Release(ctx)
			t.Logf("Release = %v", err)
		}},
	} {
		t.Run(row.name, func(t *testing.T) {
			b := redistest.Mini(t)
			s := &opStallBackend{Backend: newGoRedis(b.Client(t)), free: make(chan struct{}),
				stall: map[string]bool{row.stall: true}, failFirst: row.failFirst}
			defer close(s.free)
			c, err := NewWithBackend(s, WithPrefix(redistest.Prefix(t)), WithWaiterTTL(waiterTTL))
			if err != nil {
				t.Fatal(err)
			}
			l, err := c.Acquire(context.Background(), Request{Name: "m", Capacity: 1, Permits: 1, LeaseTTL: row.leaseTTL})
			if err != nil {
				t.Fatal(err)
			}
			s.armed.Store(true)
			row.call(c, l)
			if row.failFirst {
				advWaitFor(t, "the resend on its way", func() bool { return s.far.Load() > 0 })
			} else {
				advWaitFor(t, "the call on its way", func() bool { return s.entered.Load() > 0 })
			}
			start := time.Now()
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			select {
			case err := <-closed:
				took := time.Since(start)
				t.Logf("Close took %v: %v", took, err)
				if took > limit {
					t.Errorf("Close took %v, past its bound (%v waiter TTL + %v slack)", took, waiterTTL, closeSlack)
				}
			case <-time.After(limit):
				t.Errorf("Close still waiting %v after it began (bound: %v waiter TTL + %v slack): a call on its way to a Redis that does not answer holds it", limit, waiterTTL, closeSlack)
				s.armed.Store(false)
				// free the stalled calls (deferred) so that Close can end
			}
		})
	}
}

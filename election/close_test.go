package election_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A leader's client closing while the record's renewal is on its way to a
// Redis that does not answer it: the close's clean-up (clear the record)
// ends the renewal and waits for it no longer than the close's bound, not
// the renewal's own (a third of the lease TTL), so Close returns within
// its bound.
func TestCloseEndsARecordRenewalOnItsWay(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		rdb := b.Client(t)
		h := &holdValue{value: "leader-renewal-held", held: make(chan struct{}), release: make(chan struct{})}
		defer close(h.release)
		rdb.AddHook(h)
		const waiterTTL = 500 * time.Millisecond
		c := e.ClientOn(rdb, fairlock.WithWaiterTTL(waiterTTL))
		el := e.election(c, "close-renewing")
		l, err := el.Campaign(context.Background(), h.value)
		if err != nil {
			t.Fatal(err)
		}
		h.armed.Store(true)
		select {
		case <-h.held:
		case <-time.After(2 * c.LeaseTTL()):
			t.Fatal("the leader record was not renewed")
		}
		start := time.Now()
		err = c.Close()
		took := time.Since(start)
		t.Logf("Close returned in %v (bound %v): %v", took, waiterTTL, err)
		// A generous margin: the bound is a limit, not a measure. (The
		// renewal's own bound, a third of the lease TTL, is 3.3 s.)
		if limit := waiterTTL + time.Second; took > limit {
			t.Fatalf("Close returned in %v, want within its bound %v (limit checked %v)", took, waiterTTL, limit)
		}
		if l.Err() == nil {
			t.Fatal("leadership still held after Close")
		}
	})
}

// holdValue is a go-redis hook that, once armed, holds a command carrying
// value among its arguments while its context lasts (a Redis that does not
// answer it, through a client that honours deadlines) or until release,
// and closes held when it does.
type holdValue struct {
	value   string
	armed   atomic.Bool
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (h *holdValue) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdValue) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() {
			for _, a := range cmd.Args() {
				if s, ok := a.(string); ok && s == h.value {
					h.once.Do(func() { close(h.held) })
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-h.release:
					}
					break
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (h *holdValue) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

package fairlock_test

import (
	"context"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
)

// sem is one semaphore as the tests use it: the engine's calls with its
// name and capacity filled in (package semaphore's Semaphore, without
// importing it).
type sem struct {
	c        *fairlock.Client
	name     string
	capacity int64
}

func newSem(c *fairlock.Client, name string, capacity int64) sem { return sem{c, name, capacity} }

func (s sem) req(n int64) fairlock.Request {
	return fairlock.Request{Name: s.name, Capacity: s.capacity, Permits: n}
}

func (s sem) Acquire(ctx context.Context, n int64) (*fairlock.Lease, error) {
	return s.c.Acquire(ctx, s.req(n))
}

func (s sem) TryAcquire(ctx context.Context, n int64) (*fairlock.Lease, error) {
	return s.c.TryAcquire(ctx, s.req(n))
}

// acquireAsync starts s.Acquire in a goroutine and returns where its
// result will arrive.
func acquireAsync(ctx context.Context, s sem, n int64) <-chan fltest.Result {
	return fltest.Async(func() (*fairlock.Lease, error) { return s.Acquire(ctx, n) })
}

package semaphore

import (
	"context"

	"github.com/fairlock/fairlock"
)

// Mutex is a fair mutual-exclusion lock named in Redis: a semaphore of
// capacity 1. Lockers are served in arrival order. It holds no
// per-acquisition state and is safe for concurrent use.
type Mutex struct{ s *Semaphore }

// NewMutex returns the mutex name kept in Redis by c. It shares its state
// with a semaphore of the same name and capacity 1. It takes the options
// of [New], contacts no server and fails as [New] does.
func NewMutex(c *fairlock.Client, name string, opts ...Option) (*Mutex, error) {
	s, err := newSemaphore("new mutex", c, name, 1, opts)
	if err != nil {
		return nil, err
	}
	return &Mutex{s}, nil
}

// Lock waits, in arrival order, until the mutex is free and returns the
// lease that holds it, or an error matching ctx.Err() when ctx ends first
// (having left the queue). Under the context of a lease of this mutex
// (inside [Mutex.Do], or see [fairlock.LeaseContext]) it would wait on
// itself: it fails at once with [fairlock.ErrDeadlock]. Its other errors
// are [Semaphore.Acquire]'s.
func (m *Mutex) Lock(ctx context.Context) (*fairlock.Lease, error) { return m.s.Acquire(ctx, 1) }

// TryLock locks the mutex if it is free and nobody waits for it; otherwise
// it returns an error matching [fairlock.ErrNotAcquired] and changes
// nothing. Its other errors are [Semaphore.Acquire]'s.
func (m *Mutex) TryLock(ctx context.Context) (*fairlock.Lease, error) {
	return m.s.TryAcquire(ctx, 1)
}

// Do locks the mutex, runs f and unlocks it, as [Semaphore.Do]: f's
// context ends if the lease is lost, and Do returns f's error joined with
// the release's; if Lock fails, f does not run (so a Do of this mutex
// within f fails with [fairlock.ErrDeadlock]).
func (m *Mutex) Do(ctx context.Context, f func(ctx context.Context) error) error {
	return m.s.Do(ctx, 1, f)
}

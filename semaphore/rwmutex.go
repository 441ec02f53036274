package semaphore

import (
	"context"

	"github.com/fairlock/fairlock"
)

// MaxReaders is the number of readers an [RWMutex] admits at once. An
// RWMutex is a semaphore of this capacity in which a reader takes one
// permit and a writer takes them all.
const MaxReaders = 1 << 30

// RWMutex is a fair reader/writer lock named in Redis. Readers share it;
// a writer holds it alone. Requests are served in arrival order: readers
// that arrive after a waiting writer wait behind it, so writers are not
// starved, and readers queued behind a writer enter together when it
// leaves.
type RWMutex struct{ s *Semaphore }

// NewRWMutex returns the read-write mutex name kept in Redis by c. It
// takes the options of [New].
func NewRWMutex(c *fairlock.Client, name string, opts ...Option) (*RWMutex, error) {
	s, err := New(c, name, MaxReaders, opts...)
	if err != nil {
		return nil, err
	}
	return &RWMutex{s}, nil
}

// RLock waits for a shared (read) lock.
func (rw *RWMutex) RLock(ctx context.Context) (*fairlock.Lease, error) {
	return rw.s.Acquire(ctx, 1)
}

// TryRLock takes a read lock if that needs no waiting.
func (rw *RWMutex) TryRLock(ctx context.Context) (*fairlock.Lease, error) {
	return rw.s.TryAcquire(ctx, 1)
}

// Lock waits for the exclusive (write) lock.
func (rw *RWMutex) Lock(ctx context.Context) (*fairlock.Lease, error) {
	return rw.s.Acquire(ctx, MaxReaders)
}

// TryLock takes the write lock if that needs no waiting.
func (rw *RWMutex) TryLock(ctx context.Context) (*fairlock.Lease, error) {
	return rw.s.TryAcquire(ctx, MaxReaders)
}

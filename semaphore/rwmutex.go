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
// leaves. It holds no per-acquisition state and is safe for concurrent
// use.
type RWMutex struct{ s *Semaphore }

// NewRWMutex returns the read-write mutex name kept in Redis by c. It
// shares its state with a semaphore of the same name and capacity
// [MaxReaders]. It takes the options of [New], contacts no server and fails
// as [New] does.
func NewRWMutex(c *fairlock.Client, name string, opts ...Option) (*RWMutex, error) {
	s, err := newSemaphore("new rw mutex", c, name, MaxReaders, opts)
	if err != nil {
		return nil, err
	}
	return &RWMutex{s}, nil
}

// RLock waits, in arrival order, for a shared (read) lock and returns the
// lease that holds it, or an error matching ctx.Err() when ctx ends first
// (having left the queue). Under the context of this mutex's write lock
// it fails at once with [fairlock.ErrDeadlock]. Under a read lock's it is
// let through, and granted when nobody waits; but it waits behind a
// writer queued meanwhile, which waits for the first read lock: do not
// take read locks recursively (docs/guide.md, "Ownership"). Its other
// errors are [Semaphore.Acquire]'s.
func (rw *RWMutex) RLock(ctx context.Context) (*fairlock.Lease, error) {
	return rw.s.Acquire(ctx, 1)
}

// TryRLock takes a read lock if that needs no waiting: no writer holds
// the mutex and nobody waits for it. Otherwise it returns an error matching
// [fairlock.ErrNotAcquired] and changes nothing. Its other errors are
// [Semaphore.Acquire]'s.
func (rw *RWMutex) TryRLock(ctx context.Context) (*fairlock.Lease, error) {
	return rw.s.TryAcquire(ctx, 1)
}

// Lock waits, in arrival order, for the exclusive (write) lock and returns
// the lease that holds it, or an error matching ctx.Err() when ctx ends
// first (having left the queue). A read lock cannot be upgraded: under
// the context of a read or write lock of this mutex (inside
// [RWMutex.RDo] or Do, or see [fairlock.LeaseContext]), Lock would wait
// for its own caller, and fails at once with [fairlock.ErrDeadlock]. Its
// other errors are [Semaphore.Acquire]'s.
func (rw *RWMutex) Lock(ctx context.Context) (*fairlock.Lease, error) {
	return rw.s.Acquire(ctx, MaxReaders)
}

// TryLock takes the write lock if that needs no waiting: nobody holds the
// mutex or waits for it. Otherwise it returns an error matching
// [fairlock.ErrNotAcquired] and changes nothing. Its other errors are
// [Semaphore.Acquire]'s.
func (rw *RWMutex) TryLock(ctx context.Context) (*fairlock.Lease, error) {
	return rw.s.TryAcquire(ctx, MaxReaders)
}

// Do takes the write lock, runs f and unlocks, as [Mutex.Do]: f's context
// ends if the lease is lost, and Do returns f's error joined with the
// release's; if Lock fails, f does not run and Do returns its error.
func (rw *RWMutex) Do(ctx context.Context, f func(ctx context.Context) error) error {
	return rw.s.Do(ctx, MaxReaders, f)
}

// RDo takes a read lock, runs f and unlocks, as Do does with the write
// lock.
func (rw *RWMutex) RDo(ctx context.Context, f func(ctx context.Context) error) error {
	return rw.s.Do(ctx, 1, f)
}

package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
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
	l, err := rw.s.Acquire(ctx, 1)
	return l, rwDeadlock(err)
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
	l, err := rw.s.Acquire(ctx, MaxReaders)
	return l, rwDeadlock(err)
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
	lease, err := rw.Lock(ctx)
	if err != nil {
		return err
	}
	return run(ctx, lease, f)
}

// RDo takes a read lock, runs f and unlocks, as Do does with the write
// lock.
func (rw *RWMutex) RDo(ctx context.Context, f func(ctx context.Context) error) error {
	lease, err := rw.RLock(ctx)
	if err != nil {
		return err
	}
	return run(ctx, lease, f)
}

// rwDeadlock restates an ErrDeadlock error of an acquisition in the
// caller's terms, read and write locks, rather than the permits of the
// semaphore an RWMutex is: "a write lock cannot be granted under the
// read lock (token 7) that this context holds", not "holds 1 of the
// 1073741824 permits". Other errors pass unchanged.
func rwDeadlock(err error) error {
	var fe *fairlock.Error
	h, ok := engine.Deadlock(err)
	if !ok || !errors.As(err, &fe) {
		return err
	}
	asked := "a read lock"
	if h.Asked == MaxReaders {
		asked = "the write lock"
	}
	var held string
	switch {
	case h.Held >= MaxReaders:
		held = "the write lock"
	case h.Held == 1:
		held = "a read lock"
	default:
		held = fmt.Sprintf("%d read locks", h.Held)
	}
	tokens := "token " + strings.Join(h.Tokens, ", ")
	if len(h.Tokens) > 1 {
		tokens = "tokens " + strings.Join(h.Tokens, ", ")
	}
	return &fairlock.Error{Op: fe.Op, Names: fe.Names, Err: fmt.Errorf("%w: %s of %q cannot be granted under %s of it (%s) that this context carries, so waiting would wait on itself",
		fairlock.ErrDeadlock, asked, h.Name, held, tokens)}
}

package semaphore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
)

// Semaphore is a weighted counting semaphore named in Redis. It holds no
// per-acquisition state and is safe for concurrent use.
type Semaphore struct {
	c        *fairlock.Client
	name     string
	capacity int64
	maxHold  time.Duration // WithMaxHold; 0 for the client's
	leaseTTL time.Duration // WithLeaseTTL; 0 for the client's
}

// An Option configures a [Semaphore], [Mutex] or [RWMutex].
type Option func(*Semaphore)

// WithMaxHold caps how long each lease taken through this handle may be
// held, in place of the client's cap ([fairlock.WithMaxHold]): at d from
// its grant the lease ends, its Done closes with an error matching
// [fairlock.ErrMaxHold] (and [fairlock.ErrLeaseLost]), and Redis frees
// its permits. It sets [fairlock.Request.MaxHold] on every request; other
// handles of the same name are not affected. The default, 0, takes the
// client's cap. A negative d, or one over [fairlock.MaxHoldLimit] (365
// days), makes the constructor fail with [fairlock.ErrInvalidArgument].
func WithMaxHold(d time.Duration) Option {
	return func(s *Semaphore) { s.maxHold = d }
}

// WithLeaseTTL sets how long each lease taken through this handle lasts
// without renewal, in place of the client's TTL
// ([fairlock.WithLeaseTTL]): the lease is renewed every third of d while
// held, and when its holder's process dies or is cut off, Redis frees its
// permits d after the last renewal. It sets [fairlock.Request.LeaseTTL]
// on every request; other handles of the same name are not affected. The
// default, 0, takes the client's TTL. A negative d, a d under 10ms or one
// over [fairlock.MaxTTL] (24h) makes the constructor fail with
// [fairlock.ErrInvalidArgument].
func WithLeaseTTL(d time.Duration) Option {
	return func(s *Semaphore) { s.leaseTTL = d }
}

// New returns the semaphore name with the given capacity, kept in Redis by
// c. It validates its arguments and contacts no server: a nil client or a
// capacity out of range fails with [fairlock.ErrInvalidArgument], a name
// fairlock cannot use with [fairlock.ErrInvalidName]. Every user of one
// name must give the same capacity while it is in use; otherwise Acquire
// fails with [fairlock.ErrCapacityMismatch].
func New(c *fairlock.Client, name string, capacity int64, opts ...Option) (*Semaphore, error) {
	return newSemaphore("new semaphore", c, name, capacity, opts)
}

// newSemaphore is New for the constructor op ("new semaphore", "new
// mutex", ...), which its errors name with the semaphore, as a
// *fairlock.Error.
func newSemaphore(op string, c *fairlock.Client, name string, capacity int64, opts []Option) (*Semaphore, error) {
	fail := func(err error) error { return &fairlock.Error{Op: op, Names: []string{name}, Err: err} }
	if c == nil {
		return nil, fail(fmt.Errorf("%w: nil client", fairlock.ErrInvalidArgument))
	}
	s := &Semaphore{c: c, name: name, capacity: capacity}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	// A request for one permit checks the name, capacity and options the
	// way every later call will.
	if err := engine.Validate(c, s.request(1)); err != nil {
		return nil, fail(err)
	}
	return s, nil
}

// request is the engine's request for n permits.
func (s *Semaphore) request(n int64) fairlock.Request {
	return fairlock.Request{Name: s.name, Capacity: s.capacity, Permits: n, MaxHold: s.maxHold, LeaseTTL: s.leaseTTL}
}

// Name returns the semaphore's name. It cannot fail.
func (s *Semaphore) Name() string { return s.name }

// Capacity returns the semaphore's capacity. It cannot fail.
func (s *Semaphore) Capacity() int64 { return s.capacity }

// Acquire waits for n permits, first-in first-out, and returns the lease
// that holds them. It blocks until the permits are granted or ctx ends;
// then it leaves the queue and returns an error matching ctx.Err(). n must
// be in [1, Capacity]: other values fail at once with
// [fairlock.ErrInvalidArgument], and nothing is queued. A capacity other
// than the stored one fails with [fairlock.ErrCapacityMismatch], Redis
// failing with [fairlock.ErrRedis], a closed client with
// [fairlock.ErrClosed]; a failed Acquire holds nothing (see
// [fairlock.Client.Acquire]). Under a context that owns a live lease of
// this semaphore (the one Do passes to its function, or see
// [fairlock.LeaseContext]), n more than Capacity minus the permits it
// holds could never be granted: Acquire fails at once with
// [fairlock.ErrDeadlock] and sends nothing.
func (s *Semaphore) Acquire(ctx context.Context, n int64) (*fairlock.Lease, error) {
	return s.c.Acquire(ctx, s.request(n))
}

// TryAcquire takes n permits if they are free and nobody waits for the
// semaphore, without waiting. Otherwise it returns an error matching
// [fairlock.ErrNotAcquired] and changes nothing. Its other errors are
// Acquire's, but for [fairlock.ErrDeadlock]: it never waits, so under the
// context of its own lease it is busy as for anybody.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (*fairlock.Lease, error) {
	return s.c.TryAcquire(ctx, s.request(n))
}

// Do acquires n permits, runs f and releases them. The context given to f
// is cancelled, with a cause matching [fairlock.ErrLeaseLost], if the lease
// is lost (or reaches its cap, [WithMaxHold]) while f runs, so f can stop
// work it no longer protects. Do returns f's error joined with any error
// from the release (one matching ErrLeaseLost if the lease was lost); if
// Acquire fails, f does not run and Do returns its error: one matching
// [fairlock.ErrDeadlock] for a Do within a Do of the same semaphore
// whose permits do not fit beside the outer one's.
func (s *Semaphore) Do(ctx context.Context, n int64, f func(ctx context.Context) error) error {
	lease, err := s.Acquire(ctx, n)
	if err != nil {
		return err
	}
	return run(ctx, lease, f)
}

// run calls f under lease and releases it afterwards.
func run(ctx context.Context, lease *fairlock.Lease, f func(ctx context.Context) error) error {
	fctx, cancel := fairlock.LeaseContext(ctx, lease)
	ferr := f(fctx)
	cancel()
	rerr := lease.Release(context.WithoutCancel(ctx))
	return errors.Join(ferr, rerr)
}

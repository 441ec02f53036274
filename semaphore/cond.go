package semaphore

import (
	"context"
	"fmt"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
)

// Cond is a fair condition variable bound to one [Mutex], kept in Redis
// next to it, so processes that share the mutex share its conditions. As
// with sync.Cond, a caller holding the mutex waits for a condition with
// [Cond.Wait], and anybody, holding the mutex or not, wakes waiters with
// [Cond.Signal] or [Cond.Broadcast]:
//
//	lease, err := mu.Lock(ctx)
//	for err == nil && !ready() {
//		lease, err = cond.Wait(ctx, lease)
//	}
//
// Waiters are woken in the order they began to wait, and a woken waiter
// queues for the mutex behind those already queued for it. A Cond holds no
// per-call state and is safe for concurrent use.
type Cond struct {
	m    *Mutex
	name string
}

// NewCond returns the default condition variable of m (named ""). It
// contacts no server. A nil m yields a Cond whose calls fail with
// [fairlock.ErrInvalidArgument].
func NewCond(m *Mutex) *Cond { return &Cond{m: m} }

// NewNamedCond returns the condition variable name of m, so one mutex can
// guard several conditions (a bounded buffer's "not full" and "not
// empty"). It contacts no server; a nil m fails with
// [fairlock.ErrInvalidArgument], a name longer than [fairlock.MaxNameLen],
// not UTF-8 or holding control characters with [fairlock.ErrInvalidName].
func NewNamedCond(m *Mutex, name string) (*Cond, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil mutex", fairlock.ErrInvalidArgument)
	}
	if err := engine.ValidateCondName(name); err != nil {
		return nil, err
	}
	return &Cond{m: m, name: name}, nil
}

// Name returns the condition's name ("" for the default one). It cannot
// fail.
func (c *Cond) Name() string { return c.name }

// Wait unlocks the mutex held by lease and waits for a signal, in one
// atomic step in Redis, so a Signal sent after the unlock is never missed.
// Once woken it locks the mutex again, in first-in first-out order, and
// returns the new lease (the one given is spent). Wait may also return
// without a signal (a spurious wakeup, after its process could not refresh
// its place for the waiter TTL), holding the mutex; callers check their
// condition in a loop.
//
// On any error Wait returns a nil lease, and the caller holds nothing.
// When ctx ends, Wait leaves the condition (or the mutex's queue) and
// returns an error matching ctx.Err(). A lease that is not of this mutex
// fails with [fairlock.ErrInvalidArgument] (the lease is kept), one
// already released with [fairlock.ErrNotHeld], one that had expired with
// [fairlock.ErrLeaseLost]. If Redis refuses the wait or cannot be reached
// (out of memory, TRYAGAIN, READONLY, a lost connection...), Wait releases
// the lease as [fairlock.Lease.Release] would, so the next locker does not
// wait out the lease's TTL, and returns an error matching
// [fairlock.ErrRedis] that says so. A closed client fails with
// [fairlock.ErrClosed]. When ctx ends, Wait returns within the bounds of
// [fairlock.Client.Acquire]; leaving the condition (or the queue, a grant
// that raced the cancellation handed on) goes on in the background. With
// [fairlock.WithReplicaAck], a wait the replicas did not acknowledge in
// time fails with an error matching [fairlock.ErrNotReplicated]: the lease
// was released on the master, and the waiter leaves the condition. To an
// [fairlock.Observer] each Wait is an acquisition of its own: the lease
// given ends with LeaseReleased, then WaitStarted, and Granted or
// WaitAbandoned, under a new event ID.
func (c *Cond) Wait(ctx context.Context, lease *fairlock.Lease) (*fairlock.Lease, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if lease == nil || len(lease.Parts()) != 1 || lease.Name() != c.m.s.name {
		return nil, fmt.Errorf("%w: wait on a condition of %q needs a lease of that mutex", fairlock.ErrInvalidArgument, c.m.s.name)
	}
	l, err := engine.CondWait(ctx, lease, c.name)
	nl, _ := l.(*fairlock.Lease)
	return nl, err
}

// Signal wakes the longest waiter, if any, and reports how many it woke
// (0 or 1). Waiters whose process died are dropped, never woken. It needs
// no lease. A condition name fairlock cannot use fails with
// [fairlock.ErrInvalidName], a Redis that cannot be reached with
// [fairlock.ErrRedis], a closed client with [fairlock.ErrClosed]; when ctx
// ends first, Signal returns an error matching ctx.Err(), and the signal
// may or may not have been delivered. With [fairlock.WithReplicaAck], a
// signal the replicas did not acknowledge in time returns the count and
// an error matching [fairlock.ErrNotReplicated]: the master woke the
// waiter, and a failover can lose that. A Signal that go-redis sends again
// (its reply lost) wakes nobody more.
func (c *Cond) Signal(ctx context.Context) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return engine.Signal(ctx, c.m.s.c, c.m.s.name, c.name, false)
}

// Broadcast wakes every waiter there is when it is called, in the order
// they began to wait, and reports how many it woke (on an error, how many
// it had woken before), in several scripts of bounded length for a large
// set. It needs no lease. Its errors are [Cond.Signal]'s.
func (c *Cond) Broadcast(ctx context.Context) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return engine.Signal(ctx, c.m.s.c, c.m.s.name, c.name, true)
}

func (c *Cond) check() error {
	if c == nil || c.m == nil {
		return fmt.Errorf("%w: condition of a nil mutex", fairlock.ErrInvalidArgument)
	}
	return nil
}

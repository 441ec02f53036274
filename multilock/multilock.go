// Package multilock locks several fair semaphores at once, all or nothing,
// without deadlock.
//
// A multi-lock request joins the queue of every semaphore it names in one
// atomic step, and is granted only when it is first in all of those queues
// and fits in all of them at once. It never holds one semaphore while it
// waits for another, so it cannot take part in a deadlock, and because
// every queue orders requests by arrival, nobody starves either. Single
// semaphores (package semaphore) and multi-locks on the same names share
// the same queues and the same first-in first-out order.
//
// The result is one [fairlock.Lease] over all the semaphores: renewed as
// one (its TTL is the client's, or the shortest
// [fairlock.Request.LeaseTTL] its requests give), with a fencing token per
// semaphore ([fairlock.Lease.Parts]), ended
// (Done closed) when any part is lost, and released in one atomic step
// that hands every semaphore on to its next waiter. On such a lease,
// [fairlock.Lease.Token], Permits and Name answer for the first semaphore
// in name order only: use Parts for the token of each.
//
// # Redis Cluster
//
// One script changes all the semaphores of a request, so on Redis Cluster
// their keys must live in one hash slot. Give names that are locked
// together one hash tag: "{acct}:17" and "{acct}:42" share a slot, "acct:17"
// and "acct:42" do not. A request whose names span slots fails with
// [fairlock.ErrCrossSlot] before anything reaches Redis. On a single Redis
// server or a Sentinel-managed one, any names may be combined.
package multilock

import (
	"context"
	"errors"
	"fmt"

	"github.com/fairlock/fairlock"
)

// Request names one semaphore of a multi-lock, its capacity and the
// permits wanted. The capacity must be the one every user of that name
// gives (see [fairlock.ErrCapacityMismatch]).
type Request = fairlock.Request

// Mutex returns the request for the mutex name: the one permit of a
// semaphore of capacity 1, as [semaphore.NewMutex] uses. It validates
// nothing; Acquire does.
//
// [semaphore.NewMutex]: https://pkg.go.dev/github.com/fairlock/fairlock/semaphore#NewMutex
func Mutex(name string) Request { return Request{Name: name, Capacity: 1, Permits: 1} }

// Acquire waits until every request can be granted at once, in first-in
// first-out order on each semaphore, and returns the lease that holds them
// all. At most [fairlock.MaxResources] semaphores may be locked together,
// each named once. When ctx ends first, Acquire leaves every queue and
// returns an error matching ctx.Err(). Bad requests fail at once, before
// anything is queued: a nil client, too many or repeated names or permits
// out of range with [fairlock.ErrInvalidArgument], a bad name with
// [fairlock.ErrInvalidName], names in different Cluster slots with
// [fairlock.ErrCrossSlot]. A capacity other than a stored one fails with
// [fairlock.ErrCapacityMismatch], Redis failing with
// [fairlock.ErrRedis], a closed client with [fairlock.ErrClosed]. Under a
// context that owns a live lease of one of the semaphores (the one Do
// passes to its function, or see [fairlock.LeaseContext]), holding so
// many permits that the request could never be granted beside them (a
// mutex held, for one), Acquire fails at once with
// [fairlock.ErrDeadlock], naming that semaphore, and sends nothing. A
// failed Acquire holds nothing. The lease's Token, Permits and Name are
// the first semaphore's (in name order); [fairlock.Lease.Parts] lists
// each.
func Acquire(ctx context.Context, c *fairlock.Client, reqs ...Request) (*fairlock.Lease, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil client", fairlock.ErrInvalidArgument)
	}
	return c.AcquireAll(ctx, reqs...)
}

// TryAcquire takes every request at once if all are free now and nobody
// waits for any of them; otherwise it takes nothing and returns an error
// matching [fairlock.ErrNotAcquired]. Its other errors are Acquire's, but
// for [fairlock.ErrDeadlock]: it never waits.
func TryAcquire(ctx context.Context, c *fairlock.Client, reqs ...Request) (*fairlock.Lease, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil client", fairlock.ErrInvalidArgument)
	}
	return c.TryAcquireAll(ctx, reqs...)
}

// Lock locks the mutexes names at once; see [Mutex] and [Acquire], whose
// errors it returns: [fairlock.ErrDeadlock] under the context of a lease
// that holds one of them.
func Lock(ctx context.Context, c *fairlock.Client, names ...string) (*fairlock.Lease, error) {
	return Acquire(ctx, c, mutexes(names)...)
}

// TryLock locks the mutexes names at once if all are free now and nobody
// waits for any of them; otherwise it locks nothing and returns an error
// matching [fairlock.ErrNotAcquired]. Its other errors are Acquire's.
func TryLock(ctx context.Context, c *fairlock.Client, names ...string) (*fairlock.Lease, error) {
	return TryAcquire(ctx, c, mutexes(names)...)
}

// DoLock locks the mutexes names, runs f and unlocks them, as [Do] does
// for requests.
func DoLock(ctx context.Context, c *fairlock.Client, names []string, f func(ctx context.Context) error) error {
	return Do(ctx, c, mutexes(names), f)
}

// mutexes returns the requests of the mutexes names.
func mutexes(names []string) []Request {
	reqs := make([]Request, len(names))
	for i, n := range names {
		reqs[i] = Mutex(n)
	}
	return reqs
}

// Do acquires reqs, runs f and releases them all. The context given to f
// is cancelled, with the lease's error as cause, if any part of the lease
// is lost while f runs. Do returns f's error joined with any error from
// the release (ErrLeaseLost if the lease was lost); if Acquire fails, f
// does not run and Do returns its error ([fairlock.ErrDeadlock] for a Do
// within a Do that holds one of reqs' semaphores, when they do not fit
// beside it).
func Do(ctx context.Context, c *fairlock.Client, reqs []Request, f func(ctx context.Context) error) error {
	lease, err := Acquire(ctx, c, reqs...)
	if err != nil {
		return err
	}
	fctx, cancel := fairlock.LeaseContext(ctx, lease)
	ferr := f(fctx)
	cancel()
	rerr := lease.Release(context.WithoutCancel(ctx))
	return errors.Join(ferr, rerr)
}

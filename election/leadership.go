package election

import (
	"context"
	"sync"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
)

// Leadership is one candidate's term as leader, from the Campaign that won
// it until it is resigned or lost. Its methods are safe for concurrent use.
type Leadership struct {
	e     *Election
	lease *fairlock.Lease
	value string

	// The record's TTL is renewed on a timer, at a third of it, so no
	// goroutine exists between renewals (as the engine renews leases).
	mu      sync.Mutex
	timer   *time.Timer        // guarded by mu
	stopped bool               // guarded by mu
	cancel  context.CancelFunc // ends the renewal in flight; guarded by mu
	renewed chan struct{}      // closed when the renewal in flight returns; guarded by mu
}

func newLeadership(e *Election, lease *fairlock.Lease, value string) *Leadership {
	l := &Leadership{e: e, lease: lease, value: value}
	// The client's Close or Shutdown releases the mutex; the record is
	// then cleared and the change published, as Resign does, so that
	// observers learn of it at once.
	engine.AtCloseRelease(lease, func(ctx context.Context) {
		l.stop(ctx)
		_ = engine.LeaderClear(ctx, e.c, e.name, lease.Token())
	})
	l.mu.Lock()
	l.timer = time.AfterFunc(e.ttl/3, l.renew)
	l.mu.Unlock()
	return l
}

// Term returns the leadership's fencing token: the lease's token, strictly
// increasing over the election's leaders. A deposed leader's term is lower
// than its successor's.
func (l *Leadership) Term() int64 { return l.lease.Token() }

// Value returns the value the leader campaigned with.
func (l *Leadership) Value() string { return l.value }

// Done returns a channel that is closed when leadership ends: resigned,
// its lease lost (expired, say after a pause past the lease TTL, or not
// renewed because Redis was unreachable), or its client closed. A leader
// must stop acting as one when it closes; a successor may lead already.
func (l *Leadership) Done() <-chan struct{} { return l.lease.Done() }

// Err returns nil while leading, and afterwards why leadership ended, as
// [fairlock.Lease.Err] says: [fairlock.ErrNotHeld] once resigned, an error
// matching [fairlock.ErrLeaseLost] if it was lost, [fairlock.ErrClosed] if
// the client was closed ([fairlock.Client.Close] and Shutdown release the
// election's mutex, so the next candidate takes office at once, and then
// clear the record and publish the change, as Resign does;
// [fairlock.Client.Abandon] leaves the mutex until its lease expires,
// which observers see as [Election.Observe] says).
func (l *Leadership) Err() error { return l.lease.Err() }

// Lease returns the lease on the election's mutex that this leadership is.
func (l *Leadership) Lease() *fairlock.Lease { return l.lease }

// Resign ends the leadership: it releases the election's mutex, which
// grants it to the next candidate in the same script, and then deletes the
// leader record (unless a successor has already replaced it) and publishes
// that the leader resigned. Done closes before Resign returns.
//
// Resign returns what [fairlock.Lease.Release] returns: an error matching
// [fairlock.ErrLeaseLost] if leadership had already been lost, and
// [fairlock.ErrNotHeld] if it was resigned before. When ctx ends first it
// returns an error matching ctx.Err() and the release goes on in the
// background. Deleting the record is best effort: if it fails, Leader
// still reports no leader (the lease has ended), and observers learn of
// the change from the successor, if any, when it takes office.
func (l *Leadership) Resign(ctx context.Context) error {
	l.stop(ctx)
	err := l.lease.Release(ctx)
	if ctx.Err() == nil {
		_ = engine.LeaderClear(ctx, l.e.c, l.e.name, l.Term())
	}
	return err
}

// stop stops the record's renewal, ends one in flight and waits, while
// ctx lasts (a close's bound, or Resign's context), for it to return. (A
// renewal that lands later changes nothing: the record takes only the
// mutex's live lease, which is released next.)
func (l *Leadership) stop(ctx context.Context) {
	l.mu.Lock()
	l.stopped = true
	l.timer.Stop()
	cancel, renewed := l.cancel, l.renewed
	l.mu.Unlock()
	if renewed == nil {
		return
	}
	cancel()
	select {
	case <-renewed:
	case <-ctx.Done():
	}
}

// renew renews the leader record's TTL (writing it again if it expired),
// while the lease lasts: as its Err says, which reads the clock, so a
// leader resumed after a pause past its lease writes nothing (and the
// record takes only the mutex's live lease, by Redis's clock, in any
// case). A failure is retried at the next period: the lease, not the
// record, is what leadership is, and Leader checks it.
func (l *Leadership) renew() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	if l.lease.Err() != nil {
		l.stopped = true
		l.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.e.ttl/3)
	renewed := make(chan struct{})
	l.cancel, l.renewed = cancel, renewed
	l.mu.Unlock()

	_, _ = l.e.set(ctx, l.Term(), l.value)
	cancel()

	l.mu.Lock()
	l.cancel, l.renewed = nil, nil
	close(renewed)
	if !l.stopped {
		l.timer.Reset(l.e.ttl / 3)
	}
	l.mu.Unlock()
}

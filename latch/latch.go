// Package latch provides a countdown latch shared by processes through
// Redis: a count that CountDown lowers by one, and Wait, which blocks
// until the count reaches zero. Once at zero the latch stays open: every
// later Wait returns at once, and further CountDowns leave it at zero.
//
// A waiter is registered in Redis and woken by a push to its process, as
// a waiter for a semaphore's permits is: no polling, and every waiter is
// woken once. A waiter whose process dies is dropped within its client's
// waiter TTL ([fairlock.WithWaiterTTL]), as every waiter is.
//
// A [Latch] holds no per-call state and is safe for concurrent use; it is
// cheap, and may be created per call.
package latch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
)

// The engine's latch functions (the root package's latch.go), c a
// *fairlock.Client.
var (
	latchCount   = engine.Func[func(ctx context.Context, c any, name string, init int64) (count, stored int64, err error)]("latch.count")
	latchInspect = engine.Func[func(ctx context.Context, c any, name string) (count, init, waiting int64, err error)]("latch.inspect")
	latchDown    = engine.Func[func(ctx context.Context, c any, name string, init int64, ttl time.Duration) (count, stored int64, err error)]("latch.down")
	latchWait    = engine.Func[func(ctx context.Context, c any, name string, init int64, ttl time.Duration, waiting func()) (stored int64, err error)]("latch.wait")
)

// MaxCount is the largest count a latch may start with.
const MaxCount = 1 << 50

// DefaultTTL is how long a latch's count lives in Redis after the last
// CountDown, or the last Wait that had to wait, unless [WithTTL] says
// otherwise.
const DefaultTTL = 24 * time.Hour

// MaxTTL is the longest TTL [WithTTL] accepts.
const MaxTTL = 365 * 24 * time.Hour

// ErrCountMismatch is returned when a latch is used with a count other
// than the one it was made with in Redis: the first call on a name that
// has no latch there makes it with its handle's count, and the latch
// keeps that count until its keys expire (see [WithTTL]). The call changes
// nothing.
var ErrCountMismatch = errors.New("latch: count mismatch")

// A Latch is a countdown latch named in Redis. It holds no per-call state
// and is safe for concurrent use.
//
// A latch is made in Redis by the first CountDown or Wait on its name,
// with its handle's count, and lives until its keys expire: its count
// [DefaultTTL] (or [WithTTL]'s) after the last CountDown or the last Wait
// that had to wait. Once gone, the next such call makes it again at its
// count: that is how a latch starts over (there is no Reset). Every user
// of one name must give the same count while it lives; otherwise its
// calls fail with [ErrCountMismatch].
type Latch struct {
	c     *fairlock.Client
	name  string
	count int64
	ttl   time.Duration
}

// An Option configures a [Latch].
type Option func(*Latch)

// WithTTL sets how long the latch's count lives in Redis after the last
// CountDown, or the last Wait that had to wait, in place of [DefaultTTL]
// (24h). Its waiters outlive it while they wait: a CountDown after the
// count expired makes the latch again at its count, and the waiters wait
// for that one to open. A d under a second or over [MaxTTL] (365 days)
// makes New fail with [fairlock.ErrInvalidArgument].
func WithTTL(d time.Duration) Option {
	return func(l *Latch) { l.ttl = d }
}

// New returns the latch name starting at count, kept in Redis by c. It
// validates its arguments and contacts no server: a nil client, a count
// not in [1, MaxCount] or a TTL out of range fails with
// [fairlock.ErrInvalidArgument], a name fairlock cannot use with
// [fairlock.ErrInvalidName]. A latch's keys are its own: a semaphore, a
// mutex or an election of the same name is another object, and shares no
// key with it.
func New(c *fairlock.Client, name string, count int64, opts ...Option) (*Latch, error) {
	fail := func(err error) error { return &fairlock.Error{Op: "new latch", Names: []string{name}, Err: err} }
	if c == nil {
		return nil, fail(fmt.Errorf("%w: nil client", fairlock.ErrInvalidArgument))
	}
	l := &Latch{c: c, name: name, count: count, ttl: DefaultTTL}
	for _, o := range opts {
		if o != nil {
			o(l)
		}
	}
	switch {
	case count <= 0 || count > MaxCount:
		return nil, fail(fmt.Errorf("%w: count %d is not in [1, %d]", fairlock.ErrInvalidArgument, count, int64(MaxCount)))
	case l.ttl < time.Second || l.ttl > MaxTTL:
		return nil, fail(fmt.Errorf("%w: TTL %v is not in [1s, %v]", fairlock.ErrInvalidArgument, l.ttl, MaxTTL))
	}
	// The engine checks the name as it checks a semaphore's.
	if err := engine.Validate(c, fairlock.Request{Name: name, Capacity: 1, Permits: 1}); err != nil {
		return nil, fail(err)
	}
	return l, nil
}

// Name returns the latch's name. It cannot fail.
func (l *Latch) Name() string { return l.name }

// Initial returns the count the latch starts with. It cannot fail.
func (l *Latch) Initial() int64 { return l.count }

// mismatch is the error of a call op that found the latch stored with
// count stored.
func (l *Latch) mismatch(op string, stored int64) error {
	return &fairlock.Error{Op: op, Names: []string{l.name}, Err: fmt.Errorf("%w: stored with count %d, not %d", ErrCountMismatch, stored, l.count)}
}

// CountDown lowers the latch's count by one, never below zero: on an open
// latch it changes nothing. The CountDown that takes the count to zero
// wakes every waiter before it returns (in scripts of bounded length: at
// most 400 waiters each). It does not block otherwise.
//
// Each CountDown acts once: a call that the Redis client, or CountDown
// itself, sends again after an error that passes (a dropped connection, a
// failover, a slot migrating; CountDown sends again with backoff while
// ctx lasts, for at most the client's waiter TTL or 9 s, whichever is
// shorter, while its first run's record lasts) finds its first run's
// outcome. A count other than the stored one fails with
// [ErrCountMismatch], another program's value at one of the latch's keys
// with [fairlock.ErrForeignKey], both having changed nothing. When ctx
// ends first, CountDown returns an error matching ctx.Err(), and Redis
// failing one matching [fairlock.ErrRedis]: the count may then have been
// lowered or not. If it reached zero, the waiters it had not woken yet
// learn it from their process's next refresh (within a third of its
// waiter TTL) and return. A closed client yields [fairlock.ErrClosed].
func (l *Latch) CountDown(ctx context.Context) error {
	_, stored, err := latchDown(ctx, l.c, l.name, l.count, l.ttl)
	if err == nil && stored > 0 {
		return l.mismatch("count down", stored)
	}
	return err
}

// Wait blocks until the latch's count is zero, and returns nil then; on
// an open latch it returns at once. While it blocks, its waiter is
// registered in Redis and refreshed by its process; the CountDown that
// reaches zero pushes it a wake-up. When ctx ends first, Wait returns an
// error matching ctx.Err(), and its waiter leaves Redis in the
// background (if Redis cannot be reached, it is dropped within the
// client's waiter TTL). Wait may return nil after its waiter was dropped
// and asked again only if the latch was open by then; it never returns
// nil while the count is above zero. With [fairlock.WithReplicaAck], a
// Wait that has to wait fails with [fairlock.ErrNotReplicated] when the
// replicas do not acknowledge its waiter; one that finds the latch open
// reads the master and writes nothing, so it can open on a count down
// that failed unacknowledged, which a failover can then lose (see
// [Latch.Count]).
//
// A count other than the stored one fails with [ErrCountMismatch],
// another program's value at one of the latch's keys with
// [fairlock.ErrForeignKey]; Redis failing, or a waiter its process could
// not keep alive, yields [fairlock.ErrRedis], and a closed client (also
// while Wait blocks) [fairlock.ErrClosed].
//
// The client's observer ([fairlock.WithObserver]) sees a Wait that had
// to wait from [fairlock.WaitStarted] to [fairlock.WaitEnded] (the latch
// opened) or [fairlock.WaitAbandoned] (Err is the error Wait returns),
// under one ID; a Wait that did not wait (on an open latch, or failing
// first) reports nothing.
func (l *Latch) Wait(ctx context.Context) error {
	waiting, end := engine.ReportWait(l.c, l.name)
	stored, err := latchWait(ctx, l.c, l.name, l.count, l.ttl, waiting)
	if err == nil && stored > 0 {
		err = l.mismatch("wait latch", stored)
	}
	end(err)
	return err
}

// Count returns the latch's count now, by a read that changes nothing: its
// handle's count when the latch does not exist in Redis (no call has made
// it, or its keys expired). Its errors are CountDown's; it is never sent
// twice by fairlock itself. It reads the master and does not wait for
// replicas, even with [fairlock.WithReplicaAck]: it can see a count down
// that failed unacknowledged, which a failover can then lose (the count
// is read higher again); a count down that WithReplicaAck acknowledged
// is never lost so.
func (l *Latch) Count(ctx context.Context) (int64, error) {
	n, stored, err := latchCount(ctx, l.c, l.name, l.count)
	if err == nil && stored > 0 {
		return 0, l.mismatch("latch count", stored)
	}
	return n, err
}

// A Status is a latch's state in Redis at one moment, as [Inspect] reads
// it.
type Status struct {
	Exists  bool  `json:"exists"`  // the latch exists in Redis; when false the counts are 0
	Count   int64 `json:"count"`   // its count now: 0 when it is open
	Initial int64 `json:"initial"` // the count it was made with
	// Waiting is how many waiters are registered: Waits blocked on it,
	// with those whose process died until they are dropped (within their
	// waiter TTL).
	Waiting int64 `json:"waiting"`
}

// Inspect reads the latch name kept through c as Redis stores it,
// whatever count it was made with: for a tool that does not know that
// count (fairlock status). It changes nothing, and makes no latch. A
// nil client fails with [fairlock.ErrInvalidArgument], a name fairlock
// cannot use with [fairlock.ErrInvalidName]; its other errors are
// [Latch.Count]'s.
func Inspect(ctx context.Context, c *fairlock.Client, name string) (Status, error) {
	if c == nil {
		return Status{}, &fairlock.Error{Op: "latch count", Names: []string{name}, Err: fmt.Errorf("%w: nil client", fairlock.ErrInvalidArgument)}
	}
	count, init, waiting, err := latchInspect(ctx, c, name)
	if err != nil {
		return Status{}, err
	}
	return Status{Exists: init > 0, Count: count, Initial: init, Waiting: waiting}, nil
}

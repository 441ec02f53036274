// Package barrier provides a cyclic barrier shared by processes through
// Redis: a fixed number of parties Await each round, and every Await of a
// round returns when its last party arrives. Rounds are numbered 1, 2, 3,
// ... and each begins with nobody once the one before ends.
//
// A round ends in one of two ways. Its last party's arrival completes it:
// every party's Await returns its [Arrival]. A party whose context ends
// before that, or whose process dies (it stops refreshing its waiter: its
// client's waiter TTL, [fairlock.WithWaiterTTL], passes), breaks it:
// every other waiting party's Await returns an error matching
// [ErrBrokenBarrier] and naming the round, as
// java.util.concurrent.CyclicBarrier does. A party that arrives after its
// round broke starts the next one.
//
// Waiting parties are registered in Redis and woken by a push to their
// process, as a waiter for a semaphore's permits is: no polling. A round
// broken by a dead party ends within that party's waiter TTL and a third
// of the others' (their process's next refresh finds it so).
//
// A client's observer ([fairlock.WithObserver]) sees each Await that
// waited from [fairlock.WaitStarted] to [fairlock.WaitEnded] (its round
// completed) or [fairlock.WaitAbandoned] (its round broke, its context
// ended, its client closed or Redis failed: Err is Await's error); the
// round's last party, which does not wait, reports nothing.
//
// A [Barrier] holds no per-call state and is safe for concurrent use; it
// is cheap, and may be created per call.
package barrier

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
)

// The engine's barrier functions (the root package's barrier.go), c a
// *fairlock.Client.
var (
	barrierAwait  = engine.Func[func(ctx context.Context, c any, name string, parties int64, ttl time.Duration, waiting func()) (round, index, stored int64, broken bool, err error)]("barrier.await")
	barrierStatus = engine.Func[func(ctx context.Context, c any, name string, parties int64) (round int64, arrived []string, broken bool, stored int64, err error)]("barrier.status")
)

// MaxParties is the most parties a barrier may have: a round's end wakes
// every party in one script.
const MaxParties = 200

// DefaultTTL is how long a barrier's state lives in Redis after the last
// arrival, unless [WithTTL] says otherwise.
const DefaultTTL = 24 * time.Hour

// MaxTTL is the longest TTL [WithTTL] accepts.
const MaxTTL = 365 * 24 * time.Hour

// ErrPartiesMismatch is returned when a barrier is used with parties other
// than those it was made with in Redis: the first Await on a name that has
// no barrier there makes it with its handle's parties, and the barrier
// keeps them until its state expires (see [WithTTL]). The call changes
// nothing.
var ErrPartiesMismatch = errors.New("barrier: parties mismatch")

// ErrBrokenBarrier is matched (errors.Is) by the error of every Await whose
// round broke: a party of it left (its context ended, its client closed)
// or died before the round's last party arrived. The error is a
// [*BrokenError] naming the round.
var ErrBrokenBarrier = errors.New("barrier: broken")

// A BrokenError is the error of an Await whose round broke. It matches
// [ErrBrokenBarrier].
type BrokenError struct {
	Name  string // the barrier's name
	Round int64  // the round that broke
	Index int    // the party's 0-based arrival index in it, -1 if unknown
}

func (e *BrokenError) Error() string {
	return fmt.Sprintf("barrier %q: round %d broken", e.Name, e.Round)
}

// Is reports whether target is [ErrBrokenBarrier].
func (e *BrokenError) Is(target error) bool { return target == ErrBrokenBarrier }

// AbandonReason names, for an observer that classifies why a wait ended
// without a grant (fairlockotel's abandon reason), what ended this one:
// "broken", a round another party broke.
func (e *BrokenError) AbandonReason() string { return "broken" }

// An Arrival is how a round ended for one party: the round's number and
// the party's 0-based index in its arrival order (0 the first to arrive,
// parties-1 the last, whose arrival completed the round).
type Arrival struct {
	Round int64
	Index int
}

// A Status is a barrier's state at one moment.
type Status struct {
	Round   int64    `json:"round"`   // the current round (1 when the barrier does not exist in Redis)
	Parties int      `json:"parties"` // the parties each round waits for
	Arrived []string `json:"arrived"` // the owners ([fairlock.WithOwner] label, or client id) of its waiting parties, in arrival order
	Broken  bool     `json:"broken"`  // the round has lost a party, and breaks at the next refresh or arrival
}

// A Barrier is a cyclic barrier named in Redis. It holds no per-call
// state and is safe for concurrent use.
//
// A barrier is made in Redis by the first Await on its name, with its
// handle's parties, and lives until its state expires, [DefaultTTL] (or
// [WithTTL]'s) after the last arrival; then it starts again at round 1.
// Every user of one name must give the same parties while it lives;
// otherwise its calls fail with [ErrPartiesMismatch].
type Barrier struct {
	c       *fairlock.Client
	name    string
	parties int
	ttl     time.Duration
}

// An Option configures a [Barrier].
type Option func(*Barrier)

// WithTTL sets how long the barrier's state lives in Redis after the last
// arrival, in place of [DefaultTTL] (24h). A round must complete within
// it. A d under a second or over [MaxTTL] (365 days) makes New fail with
// [fairlock.ErrInvalidArgument].
func WithTTL(d time.Duration) Option {
	return func(b *Barrier) { b.ttl = d }
}

// New returns the barrier name for parties parties, kept in Redis by c.
// It validates its arguments and contacts no server: a nil client,
// parties not in [1, MaxParties] or a TTL out of range fails with
// [fairlock.ErrInvalidArgument], a name fairlock cannot use with
// [fairlock.ErrInvalidName]. A barrier's keys are its own: no other
// object of the same name shares a key with it.
func New(c *fairlock.Client, name string, parties int, opts ...Option) (*Barrier, error) {
	fail := func(err error) error { return &fairlock.Error{Op: "new barrier", Names: []string{name}, Err: err} }
	if c == nil {
		return nil, fail(fmt.Errorf("%w: nil client", fairlock.ErrInvalidArgument))
	}
	b := &Barrier{c: c, name: name, parties: parties, ttl: DefaultTTL}
	for _, o := range opts {
		if o != nil {
			o(b)
		}
	}
	switch {
	case parties <= 0 || parties > MaxParties:
		return nil, fail(fmt.Errorf("%w: parties %d is not in [1, %d]", fairlock.ErrInvalidArgument, parties, MaxParties))
	case b.ttl < time.Second || b.ttl > MaxTTL:
		return nil, fail(fmt.Errorf("%w: TTL %v is not in [1s, %v]", fairlock.ErrInvalidArgument, b.ttl, MaxTTL))
	}
	if err := engine.Validate(c, fairlock.Request{Name: name, Capacity: 1, Permits: 1}); err != nil {
		return nil, fail(err)
	}
	return b, nil
}

// Name returns the barrier's name. It cannot fail.
func (b *Barrier) Name() string { return b.name }

// Parties returns the parties each round waits for. It cannot fail.
func (b *Barrier) Parties() int { return b.parties }

// mismatch is the error of a call op that found the barrier stored with
// parties stored.
func (b *Barrier) mismatch(op string, stored int64) error {
	return &fairlock.Error{Op: op, Names: []string{b.name}, Err: fmt.Errorf("%w: stored with %d parties, not %d", ErrPartiesMismatch, stored, b.parties)}
}

// Await arrives at the barrier and blocks until the round it arrived in
// ends. When the round's last party arrives (this one, or a later one),
// Await returns the round and this party's index in it. While it blocks,
// its waiter is registered in Redis and refreshed by its process; the
// round's end pushes it a wake-up.
//
// When another party of the round leaves or dies first, Await returns an
// error matching [ErrBrokenBarrier] (a [*BrokenError] naming the round).
// When ctx ends first, Await returns an error matching ctx.Err(), and the
// round breaks for every other party, in the background (if Redis cannot
// be reached, within the client's waiter TTL, when its waiter dies); a
// round that completed before the break reached Redis stays completed
// for the other parties (this one's Await still returns ctx's error, as
// a done context wins). A closed client (also while Await blocks) yields
// [fairlock.ErrClosed] and breaks the round the same way. A party that
// arrives after its round broke starts the next round.
//
// Each Await acts once: a call that the Redis client sends again after an
// error that passes finds its first run's arrival. Parties other than the
// stored ones fail with [ErrPartiesMismatch], another program's value at
// one of the barrier's keys with [fairlock.ErrForeignKey], both having
// changed nothing; Redis failing, or a waiter its process could not keep
// alive, yields [fairlock.ErrRedis], and breaks the round. With
// [fairlock.WithReplicaAck], an arrival whose change the replicas did not
// acknowledge in time yields an error matching [fairlock.ErrNotReplicated]
// (a waiting one breaks its round): when it was the round's last party,
// the others may have returned the round completed, and a failover can
// lose that completion.
//
// The client's observer ([fairlock.WithObserver]) sees an Await that
// waited, under one ID naming the barrier, from [fairlock.WaitStarted]
// (its arrival registered in Redis) to [fairlock.WaitEnded] (its round
// completed; Wait is how long it waited) or [fairlock.WaitAbandoned] (Err
// is the error Await returns: its round broke, matching
// [ErrBrokenBarrier], its context ended, its client closed, or Redis
// failed). An Await that did not wait reports nothing: the round's last
// party, whose arrival completes the round and returns at once, and one
// that fails before its arrival is registered.
func (b *Barrier) Await(ctx context.Context) (Arrival, error) {
	waiting, end := engine.ReportWait(b.c, b.name)
	arr, err := b.await(ctx, waiting)
	end(err)
	return arr, err
}

// await is Await; waiting is its observer's report of the wait's start.
func (b *Barrier) await(ctx context.Context, waiting func()) (Arrival, error) {
	round, index, stored, broken, err := barrierAwait(ctx, b.c, b.name, int64(b.parties), b.ttl, waiting)
	switch {
	case err != nil:
		return Arrival{}, err
	case stored > 0:
		return Arrival{}, b.mismatch("await barrier", stored)
	case broken:
		return Arrival{}, &fairlock.Error{Op: "await barrier", Names: []string{b.name},
			Err: &BrokenError{Name: b.name, Round: round, Index: int(index)}}
	}
	return Arrival{Round: round, Index: int(index)}, nil
}

// Status returns the barrier's state now, by a read that changes nothing.
// Its errors are Await's; it is never sent twice by fairlock itself.
func (b *Barrier) Status(ctx context.Context) (Status, error) {
	round, arrived, broken, stored, err := barrierStatus(ctx, b.c, b.name, int64(b.parties))
	switch {
	case err != nil:
		return Status{}, err
	case stored > 0:
		return Status{}, b.mismatch("barrier status", stored)
	}
	return Status{Round: round, Parties: b.parties, Arrived: arrived, Broken: broken}, nil
}

// Inspect reads the barrier name kept through c as Redis stores it,
// whatever parties it was made with: for a tool that does not know them
// (fairlock status). Its Parties is 0 when the barrier does not exist in
// Redis (its Round is then 1). It changes nothing, and makes no barrier.
// A nil client fails with [fairlock.ErrInvalidArgument], a name fairlock
// cannot use with [fairlock.ErrInvalidName]; its other errors are
// [Barrier.Status]'s.
func Inspect(ctx context.Context, c *fairlock.Client, name string) (Status, error) {
	if c == nil {
		return Status{}, &fairlock.Error{Op: "barrier status", Names: []string{name}, Err: fmt.Errorf("%w: nil client", fairlock.ErrInvalidArgument)}
	}
	round, arrived, broken, stored, err := barrierStatus(ctx, c, name, 0)
	if err != nil {
		return Status{}, err
	}
	return Status{Round: round, Parties: int(stored), Arrived: arrived, Broken: broken}, nil
}

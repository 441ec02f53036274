// Package engine is how the packages built on fairlock's engine (package
// semaphore's condition variables, package election, package latch, package barrier, the
// command line, and any later primitive) reach what the engine does not export, and run its
// ops: through its
// call path, so that their calls keep its promises (they return by their
// context's end, run as the function library with its flags, wait for
// replicas under WithReplicaAck, name another program's key). They run no
// script of their own. The root package sets the functions when it is
// initialised; the client passed is a *fairlock.Client (as any, since this
// package cannot import it).
package engine

import (
	"context"
	"time"
)

// Leader is an election's record as the engine reads it.
type Leader struct {
	Value string
	Term  int64 // 0: no leader recorded, or its lease has ended
	// Left is how long the leader's lease had to run, by Redis's clock,
	// when it was read: it ends then unless its holder renews it.
	Left time.Duration
}

// Held is what an ErrDeadlock error says the caller's context holds of
// the semaphore it asked for.
type Held struct {
	Name   string
	Held   int64    // permits the context's leases hold
	Asked  int64    // permits asked for
	Tokens []string // the tokens of the leases that hold them
}

var (
	// Deadlock returns what err, an error matching fairlock.ErrDeadlock
	// from an acquisition, says the context holds; false for any other
	// error.
	Deadlock func(err error) (Held, bool)
	// Validate reports whether req (a fairlock.Request) is a request c
	// can serve; it contacts no server.
	Validate func(c any, req any) error
	// Subscribe returns a subscription to channel through c's Backend (a
	// backend.Subscription), or an error matching errors.ErrUnsupported.
	Subscribe func(ctx context.Context, c any, channel string) (any, error)
	// CanSubscribe reports whether c's Backend can subscribe.
	CanSubscribe func(c any) bool
	// CondWait releases lease (a *fairlock.Lease) and waits on its
	// semaphore's condition cond, returning the new lease (a
	// *fairlock.Lease, or nil with the error).
	CondWait func(ctx context.Context, lease any, cond string) (any, error)
	// Signal wakes the longest waiter of the condition cond of the
	// semaphore name (all: every waiter there was when it began) and
	// returns how many it woke.
	Signal func(ctx context.Context, c any, name, cond string, all bool) (int, error)
	// ValidateCondName reports whether name can name a condition.
	ValidateCondName func(name string) error

	// LeaderSet records term and value as the leader of the election
	// (mutex) name, for ttl, unless a higher term is recorded or term is
	// not the mutex's live lease by Redis's clock; it reports whether the
	// record holds term now. err matches fairlock.ErrNotReplicated (with
	// ErrRedis) when the record is written but not acknowledged by the
	// replicas asked for.
	LeaderSet func(ctx context.Context, c any, name string, term int64, value string, ttl time.Duration) (recorded bool, err error)
	// LeaderClear deletes the record of name if it holds term.
	LeaderClear func(ctx context.Context, c any, name string, term int64) error
	// LeaderGet returns the record of name when its term is the mutex's
	// live lease, else a Leader with Term 0.
	LeaderGet func(ctx context.Context, c any, name string) (Leader, error)
	// Transient reports whether an error of the engine's passes (the call
	// was refused or lost on its way: a failover, a slot migrating, a
	// dropped connection) and sending it again later may land.
	Transient func(err error) bool
	// AtCloseRelease has f run when lease's client, closing, has
	// released lease (a *fairlock.Lease) in Redis (Close, Shutdown),
	// with a context that ends when the close gives up; before it
	// returns. f may call the Leader ops, closed as the client is.
	AtCloseRelease func(lease any, f func(ctx context.Context))
	// LatchCount returns the count of the latch name made with count
	// init (init when it does not exist), or the count it was made with
	// when that is another (stored > 0; then count is 0).
	LatchCount func(ctx context.Context, c any, name string, init int64) (count, stored int64, err error)
	// LatchInspect reads the latch name as stored, whatever count it
	// was made with.
	LatchInspect func(ctx context.Context, c any, name string) (LatchState, error)
	// LatchDown counts the latch name down by one, never below 0, keeping
	// its count for ttl, and returns the count after (or stored, as
	// LatchCount); the call that reaches 0 wakes every waiter.
	LatchDown func(ctx context.Context, c any, name string, init int64, ttl time.Duration) (count, stored int64, err error)
	// ReportWait returns the report to c's observer of one wait on name
	// that grants nothing (a latch's Wait, a barrier's Await): waiting, to
	// pass to LatchWait or BarrierAwait (nil when c has no observer), and
	// end, to call with the error the wait's caller returns. The wait is
	// reported from fairlock.WaitStarted, the first time it waits, to
	// fairlock.WaitEnded (end(nil)) or fairlock.WaitAbandoned (with the
	// error); one that never waited reports nothing.
	ReportWait func(c any, name string) (waiting func(), end func(err error))
	// LatchWait returns once the latch name's count is 0 (or stored, as
	// LatchCount), or when ctx ends (its waiter withdrawn in the
	// background). waiting (when not nil) is called each time its waiter
	// is registered in Redis to wait.
	LatchWait func(ctx context.Context, c any, name string, init int64, ttl time.Duration, waiting func()) (stored int64, err error)
	// BarrierAwait arrives at the barrier name (made with parties, its
	// state kept ttl) and returns when the round it arrived in ends,
	// completed or broken; or when ctx ends (the round then breaks in the
	// background). waiting (when not nil) is called once its arrival is
	// registered in Redis to wait: never for the round's last party.
	BarrierAwait func(ctx context.Context, c any, name string, parties int64, ttl time.Duration, waiting func()) (Arrival, error)
	// BarrierStatus returns the barrier's round and its waiting parties.
	// With parties 0 it reads whatever parties are stored, and returns
	// them as Stored (0 when the barrier does not exist).
	BarrierStatus func(ctx context.Context, c any, name string, parties int64) (BarrierState, error)
	// LeaderChannel names the channel on which the record's changes are
	// published: "term value", or "0" when it is cleared.
	LeaderChannel func(c any, name string) (string, error)
)

// An Arrival is how a barrier's round ended for one party: its round and
// 0-based index (-1 unknown), whether it broke, or the parties the
// barrier is stored with (Stored > 0) when those are others.
type Arrival struct {
	Round, Index, Stored int64
	Broken               bool
}

// A LatchState is a latch's count and the count it was made with (0 and
// 0 when it does not exist), and how many waiters it has registered.
type LatchState struct {
	Count, Init, Waiting int64
}

// A BarrierState is a barrier's round, the owners of its waiting parties
// in arrival order, whether the round has lost a party, or Stored as in
// Arrival.
type BarrierState struct {
	Round   int64
	Arrived []string
	Broken  bool
	Stored  int64
}

// Package engine is how the packages built on fairlock's engine (package
// semaphore's condition variables, package election, package latch, package barrier, the
// command line, and any later primitive) reach what the engine does not export, and run its
// ops: through its
// call path, so that their calls keep its promises (they return by their
// context's end, run as the function library with its flags, wait for
// replicas under WithReplicaAck, name another program's key). They run no
// script of their own. The root package sets the functions below when it
// is initialised, and registers each primitive's from that primitive's
// own file (Register, Func); the client passed is a *fairlock.Client (as
// any, since this package cannot import it).
package engine

import (
	"context"
	"fmt"
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
	// ReportWait returns the report to c's observer of one wait on name
	// that grants nothing (a latch's Wait, a barrier's Await): waiting, to
	// pass to the primitive's wait (nil when c has no observer), and
	// end, to call with the error the wait's caller returns. The wait is
	// reported from fairlock.WaitStarted, the first time it waits, to
	// fairlock.WaitEnded (end(nil)) or fairlock.WaitAbandoned (with the
	// error); one that never waited reports nothing.
	ReportWait func(c any, name string) (waiting func(), end func(err error))
	// LeaderChannel names the channel on which the record's changes are
	// published: "term value", or "0" when it is cleared.
	LeaderChannel func(c any, name string) (string, error)
)

// A primitive built on the engine (a latch, a barrier) registers its
// functions here, from its file in the root package, when that package is
// initialised; the primitive's own package finds them with Func. So a new
// primitive adds none of its own declarations to this package.
var funcs = map[string]any{}

// Register makes f the function named name. A name registered twice
// panics: two primitives may not share one.
func Register(name string, f any) {
	if _, ok := funcs[name]; ok {
		panic("fairlock: engine function " + name + " registered twice")
	}
	funcs[name] = f
}

// Func returns the function registered as name, which must be of type F.
// It panics when there is none or it has another type: a primitive's
// package binds its functions when it is initialised, after the root
// package registered them, so a mistake fails every program at once.
func Func[F any](name string) F {
	f, ok := funcs[name].(F)
	if !ok {
		panic(fmt.Sprintf("fairlock: no engine function %s of type %T (registered: %T)", name, f, funcs[name]))
	}
	return f
}

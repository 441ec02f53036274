package election

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
)

var (
	// ErrNoLeader is returned by [Election.Leader] when nobody leads: no
	// candidate holds the election's mutex, or the one that holds it has
	// not yet recorded its value (Campaign has not returned).
	ErrNoLeader = errors.New("election: no leader")

	// ErrNotSubscriber is returned by [New] for a Client whose Redis
	// client cannot subscribe to pub/sub channels, which
	// [Election.Observe] needs (a Backend that is not a
	// [backend.Subscriber], or a wrapper of a go-redis client without
	// Subscribe).
	ErrNotSubscriber = errors.New("election: redis client cannot subscribe")
)

// MaxValueLen is the longest value, in bytes, a candidate may campaign with.
const MaxValueLen = 4096

// Election is a named election kept in Redis by a [fairlock.Client]. It
// holds no per-campaign state, is safe for concurrent use, and is cheap:
// it may be created per call.
type Election struct {
	c       *fairlock.Client
	name    string
	channel string        // where changes are published
	ttl     time.Duration // the lease TTL (WithLeaseTTL, or the client's); the record lasts twice as long
}

// Info is a leader as [Election.Leader] and [Election.Observe] report it.
// The zero Info (Term 0) stands for no leader in what Observe delivers.
type Info struct {
	Value string `json:"value"` // what the leader campaigned with
	Term  int64  `json:"term"`  // its lease's fencing token
}

// An Option configures an [Election].
type Option func(*Election)

// WithLeaseTTL sets the lease TTL of this election's leaderships, in
// place of the client's ([fairlock.WithLeaseTTL]): a leader renews its
// lease and its record every third of d, and when its process dies or is
// cut off, the next candidate leads d after its last renewal (the record
// lasts twice as long, but names no leader once the lease is gone). It
// sets [fairlock.Request.LeaseTTL] on every campaign; other elections of
// the client are not affected. The default, 0, takes the client's TTL. A
// negative d, a d under 10ms or one over [fairlock.MaxTTL] (24h) makes
// [New] fail with [fairlock.ErrInvalidArgument].
func WithLeaseTTL(d time.Duration) Option {
	return func(e *Election) { e.ttl = d }
}

// New returns the election name, kept in Redis by c. Its candidates queue
// on the fair mutex of the same name (which must not be used as a
// semaphore of another capacity). New validates its arguments and contacts
// no server. It fails with [fairlock.ErrInvalidArgument] for a nil client
// or an option out of range, [fairlock.ErrInvalidName] for a name the
// engine refuses, and [ErrNotSubscriber] when c's Redis client cannot
// Subscribe (any go-redis *redis.Client or ClusterClient can).
func New(c *fairlock.Client, name string, opts ...Option) (*Election, error) {
	e := &Election{c: c, name: name}
	if c == nil {
		return nil, e.errorf("new", "%w: nil client", fairlock.ErrInvalidArgument)
	}
	for _, o := range opts {
		if o != nil {
			o(e)
		}
	}
	channel, err := engine.LeaderChannel(c, name)
	if err != nil {
		return nil, e.errorf("new", "%w", err)
	}
	if err := engine.Validate(c, e.mutex()); err != nil {
		return nil, e.errorf("new", "%w", err)
	}
	if !engine.CanSubscribe(c) {
		return nil, e.errorf("new", "%w: %s", ErrNotSubscriber, "its Redis client has no pub/sub")
	}
	e.channel = channel
	if e.ttl == 0 {
		e.ttl = c.LeaseTTL()
	}
	return e, nil
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// mutex is the request for the election's mutex, with the election's
// lease TTL (the client's once New has run without WithLeaseTTL).
func (e *Election) mutex() fairlock.Request {
	return fairlock.Request{Name: e.name, Capacity: 1, Permits: 1, LeaseTTL: e.ttl}
}

// Campaign joins the queue of candidates (first-in first-out) and blocks
// until this candidate leads, then records value as the leader's and
// publishes the change. The returned [Leadership] is renewed until it is
// resigned or lost.
//
// Campaign fails at once with [fairlock.ErrInvalidArgument] for an empty
// value or one longer than [MaxValueLen]. When ctx ends first it returns,
// by ctx's end whatever state Redis is in, an error for which
// errors.Is(err, ctx.Err()) holds, leaving the queue in the background as
// [fairlock.Client.Acquire] does; a grant that raced the cancellation, or
// a leadership recorded as ctx ended, is released. A Redis that cannot be
// reached is reported with an error matching [fairlock.ErrRedis]; an error
// that passes (a failover, a slot migrating) while recording is retried
// while the lease and ctx last. A full Redis (maxmemory) still records its
// leader. With [fairlock.WithReplicaAck], the record is acknowledged by
// the replicas before Campaign returns, or the mutex is released and the
// error matches [fairlock.ErrNotReplicated]. A candidate granted the mutex
// but paused past its lease before recording its value is not recorded
// (the record holds only the mutex's live lease, by Redis's clock); it then
// queues again, at the back. A leader campaigning again under the context
// of its own leadership's lease ([fairlock.LeaseContext] of
// [Leadership.Lease]) would wait for itself: Campaign fails at once with
// [fairlock.ErrDeadlock].
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if value == "" || len(value) > MaxValueLen {
		return nil, e.errorf("campaign", "%w: value of %d bytes, want 1 to %d", fairlock.ErrInvalidArgument, len(value), MaxValueLen)
	}
	for {
		lease, err := e.c.Acquire(ctx, e.mutex())
		if err != nil {
			return nil, err
		}
		ok, err := e.record(ctx, lease, value)
		if err == nil && ok && ctx.Err() != nil {
			// Recorded as ctx ended: the caller no longer waits for it.
			err = e.errorf("campaign", "%w", ctx.Err())
		}
		if err != nil || !ok {
			// Not recorded: give the mutex back so the next candidate is
			// not kept waiting (in the background if ctx has ended).
			_ = lease.Release(ctx)
		}
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // the lease was lost before it was recorded
		}
		return newLeadership(e, lease, value), nil
	}
}

// record records lease's term as the leader's, with value, retrying an
// error that passes (backing off, while the lease and ctx last), and
// reports whether the record holds the term now.
func (e *Election) record(ctx context.Context, lease *fairlock.Lease, value string) (bool, error) {
	wait := 10 * time.Millisecond
	for {
		if lease.Err() != nil {
			return false, nil
		}
		ok, err := e.set(ctx, lease.Token(), value)
		if err == nil || !engine.Transient(err) || ctx.Err() != nil {
			return ok, err
		}
		t := time.NewTimer(wait + rand.N(wait))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, e.errorf("record leader", "%w", ctx.Err())
		case <-lease.Done():
			t.Stop()
			return false, nil
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// set records term and value unless a higher term is recorded or term is
// not the mutex's live lease, and reports whether the record holds term
// now.
func (e *Election) set(ctx context.Context, term int64, value string) (bool, error) {
	return engine.LeaderSet(ctx, e.c, e.name, term, value, max(2*e.ttl, time.Millisecond))
}

// Error is the error of an election's own: the operation, the election,
// and why (errors.Is and errors.As look through Err). Errors of the engine
// (a lease lost, Redis unreachable) come as the engine's *fairlock.Error.
type Error struct {
	Op   string // "new", "campaign", "leader", "record leader"
	Name string // the election
	Err  error
}

// Error reads "election: <op> "<name>": <why>", naming the package once.
func (e *Error) Error() string {
	why := "<nil>"
	if e.Err != nil {
		why = strings.ReplaceAll(strings.ReplaceAll(e.Err.Error(), "election: ", ""), "fairlock: ", "")
	}
	return "election: " + e.Op + " " + strconv.Quote(e.Name) + ": " + why
}

func (e *Error) Unwrap() error { return e.Err }

// errorf returns the election's error for op, its reason as the format
// gives it (%w wraps, as in fmt.Errorf).
func (e *Election) errorf(op, format string, a ...any) error {
	return &Error{Op: op, Name: e.name, Err: fmt.Errorf(format, a...)}
}

// Leader returns the current leader's value and term, or an error matching
// [ErrNoLeader] when nobody leads. It reads the leader record and checks
// it against the mutex's live lease (by Redis's clock) in one atomic
// step, so it never reports a leader whose lease has ended, even one that
// crashed with nobody queued behind it. It changes nothing. Errors and ctx
// are as for [fairlock.Client.Status].
func (e *Election) Leader(ctx context.Context) (Info, error) {
	l, err := engine.LeaderGet(ctx, e.c, e.name)
	if err != nil {
		return Info{}, err
	}
	if l.Term == 0 {
		return Info{}, e.errorf("leader", "%w", ErrNoLeader)
	}
	return Info{Value: l.Value, Term: l.Term}, nil
}

package election

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/redis/go-redis/v9"
)

var (
	// ErrNoLeader is returned by [Election.Leader] when nobody leads: no
	// candidate holds the election's mutex, or the one that holds it has
	// not yet recorded its value (Campaign has not returned).
	ErrNoLeader = errors.New("election: no leader")

	// ErrNotSubscriber is returned by [New] for a Redis client that cannot
	// subscribe to pub/sub channels, which [Election.Observe] needs.
	ErrNotSubscriber = errors.New("election: redis client cannot subscribe")
)

// MaxValueLen is the longest value, in bytes, a candidate may campaign with.
const MaxValueLen = 4096

//go:embed record.lua
var recordLua string

var recordScript = redis.NewScript(recordLua)

// subscriber is the part of a go-redis client Observe uses. *redis.Client
// and *redis.ClusterClient have it.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var (
	_ subscriber = (*redis.Client)(nil)
	_ subscriber = (*redis.ClusterClient)(nil)
)

// Election is a named election kept in Redis by a [fairlock.Client]. It
// holds no per-campaign state, is safe for concurrent use, and is cheap:
// it may be created per call.
type Election struct {
	c       *fairlock.Client
	rdb     fairlock.RedisClient
	sub     subscriber
	name    string
	record  string        // the leader record's key
	channel string        // where changes are published
	ttl     time.Duration // the lease TTL; the record lasts twice as long
}

// Info is a leader as [Election.Leader] and [Election.Observe] report it.
// The zero Info (Term 0) stands for no leader in what Observe delivers.
type Info struct {
	Value string `json:"value"` // what the leader campaigned with
	Term  int64  `json:"term"`  // its lease's fencing token
}

// New returns the election name, kept in Redis by c. Its candidates queue
// on the fair mutex of the same name (which must not be used as a
// semaphore of another capacity). New validates its arguments and contacts
// no server. It fails with [fairlock.ErrInvalidArgument] for a nil client,
// [fairlock.ErrInvalidName] for a name the engine refuses, and
// [ErrNotSubscriber] when c's Redis client cannot Subscribe (any go-redis
// *redis.Client or ClusterClient can).
func New(c *fairlock.Client, name string) (*Election, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil client", fairlock.ErrInvalidArgument)
	}
	base, err := c.KeyBase(name)
	if err != nil {
		return nil, err
	}
	sub, ok := c.Redis().(subscriber)
	if !ok {
		return nil, fmt.Errorf("%w: %T", ErrNotSubscriber, c.Redis())
	}
	return &Election{c: c, rdb: c.Redis(), sub: sub, name: name,
		record: base + ":ld", channel: base + ":ld:c", ttl: c.LeaseTTL()}, nil
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

func (e *Election) mutex() fairlock.Request {
	return fairlock.Request{Name: e.name, Capacity: 1, Permits: 1}
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
// [fairlock.Client.Acquire] does; a grant that raced the cancellation is
// released. A Redis that cannot be reached is reported with an error
// matching [fairlock.ErrRedis]. A candidate granted the mutex but paused
// past its lease before recording its value finds a later leader recorded;
// it then queues again, at the back.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if value == "" || len(value) > MaxValueLen {
		return nil, e.errorf("campaign", "%w: value of %d bytes, want 1 to %d", fairlock.ErrInvalidArgument, len(value), MaxValueLen)
	}
	for {
		lease, err := e.c.Acquire(ctx, e.mutex())
		if err != nil {
			return nil, err
		}
		ok, err := e.set(ctx, lease.Token(), value)
		if err != nil || !ok {
			// Not recorded: give the mutex back so the next candidate is
			// not kept waiting (in the background if ctx has ended).
			_ = lease.Release(ctx)
		}
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // a later leader was recorded: this lease was lost
		}
		return newLeadership(e, lease, value), nil
	}
}

// set records term and value unless a higher term is recorded, and reports
// whether the record holds term now.
func (e *Election) set(ctx context.Context, term int64, value string) (bool, error) {
	res, err := recordScript.Run(ctx, e.rdb, []string{e.record}, "set", term, value,
		max(2*e.ttl.Milliseconds(), 1), e.channel).Int64Slice()
	if err != nil {
		return false, e.fail(ctx, "record leader", err)
	}
	if len(res) != 2 {
		return false, e.errorf("record leader", "bad reply %v", res)
	}
	return res[0] == 1, nil
}

// errorf returns the election's error for op: "election: <op> of
// "<name>": " and the message format gives (%w wraps, as in fmt.Errorf).
// It is the one place the prefix is written.
func (e *Election) errorf(op, format string, a ...any) error {
	return fmt.Errorf("election: %s of %q: "+format, append([]any{op, e.name}, a...)...)
}

// fail wraps an error of one of the election's own scripts the way the
// engine wraps its own: the context's error as is, anything else as
// fairlock.ErrRedis.
func (e *Election) fail(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return e.errorf(op, "%w", cerr)
	}
	return e.errorf(op, "%w: %w", fairlock.ErrRedis, err)
}

// Leader returns the current leader's value and term, or an error matching
// [ErrNoLeader] when nobody leads. It reads the leader record and then
// checks it against the mutex's live holder (by Redis's clock, through
// [fairlock.Client.Status]), so it never reports a leader whose lease has
// ended, even one that crashed with nobody queued behind it. It changes
// nothing. Errors and ctx are as for [fairlock.Client.Status].
func (e *Election) Leader(ctx context.Context) (Info, error) {
	for range 3 {
		info, err := e.get(ctx)
		if err != nil {
			return Info{}, err
		}
		st, err := e.c.Status(ctx, e.name)
		if err != nil {
			return Info{}, err
		}
		if len(st.Holders) == 0 {
			return Info{}, e.errorf("leader", "%w", ErrNoLeader)
		}
		holder := st.Holders[0].Token
		switch {
		case info.Term == holder:
			return info, nil
		case holder < info.Term:
			// A leader took office between the two reads: read again.
			continue
		}
		// The holder has not recorded its value yet (its Campaign has not
		// returned), or the record was read before it did: read again.
	}
	return Info{}, e.errorf("leader", "%w", ErrNoLeader)
}

// get reads the leader record, live or not; Term 0 when there is none.
func (e *Election) get(ctx context.Context) (Info, error) {
	res, err := recordScript.Run(ctx, e.rdb, []string{e.record}, "get").Slice()
	if err != nil {
		return Info{}, e.fail(ctx, "read leader", err)
	}
	if len(res) != 2 || res[0] == nil || res[1] == nil {
		return Info{}, nil
	}
	term, err := strconv.ParseInt(fmt.Sprint(res[1]), 10, 64)
	if err != nil {
		return Info{}, e.errorf("read leader", "bad term %v", res[1])
	}
	return Info{Value: fmt.Sprint(res[0]), Term: term}, nil
}

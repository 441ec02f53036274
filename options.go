package fairlock

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/wait"
)

// Defaults of the [Option] settings.
const (
	DefaultPrefix    = "fairlock:"
	DefaultLeaseTTL  = 10 * time.Second
	DefaultWaiterTTL = 3 * time.Second
)

// A client's timers run at fractions of its TTLs.
const (
	// renewDivisor: a held lease is renewed TTL/renewDivisor after its
	// grant or last renewal was sent, which leaves two thirds of the TTL
	// to retry a renewal that failed; a queued waiter is refreshed
	// TTL/renewDivisor after its acquire or last round of refreshes
	// answered.
	renewDivisor = wait.RenewDivisor
	// retryDivisor: a renewal or refresh that failed is tried again
	// TTL/retryDivisor later (a renewal never past its lease's deadline).
	retryDivisor = wait.RetryDivisor
)

// MaxNameLen is the longest semaphore name, in bytes, that fairlock accepts;
// a longer one fails with [ErrInvalidName].
const MaxNameLen = keyspace.MaxNameLen

// The longest durations the options and requests accept; [New] and every
// call refuse a longer one with [ErrInvalidArgument] naming the option and
// the limit.
const (
	// MaxTTL is the longest lease TTL ([WithLeaseTTL],
	// [Request.LeaseTTL]), waiter TTL ([WithWaiterTTL]) and replica
	// acknowledgement timeout ([WithReplicaAck]) accepted: 24h. A TTL is
	// how long a crashed holder or waiter keeps others waiting; past a
	// day it bounds nothing a user would wait for. The client derives
	// timers from the TTLs (up to ten waiter TTLs, a lease TTL plus a
	// second) and the scripts keep Redis's time plus twice a TTL, in
	// milliseconds, as exact integers: a day leaves all of them far inside
	// their ranges, where a longer TTL would overflow some of them (from
	// 29 years up).
	MaxTTL = 24 * time.Hour
	// MaxHoldLimit is the longest cap on holding ([WithMaxHold],
	// [Request.MaxHold]) accepted: 365 days. A cap is counted from the
	// grant on the local clock and sent to Redis in milliseconds; a year
	// keeps both exact, and a longer cap is better said as none (0).
	MaxHoldLimit = 365 * 24 * time.Hour
)

// minTTL is the shortest lease or waiter TTL accepted. It keeps the
// shortest timer, a retry at TTL/retryDivisor, at a millisecond or more:
// shorter periods would keep Redis busy for nothing.
const minTTL = retryDivisor * time.Millisecond

type config struct {
	prefix    string
	owner     string
	leaseTTL  time.Duration
	waiterTTL time.Duration
	maxHold   time.Duration // WithMaxHold; 0 for no cap
	batch     int           // WithBatching; 0 for none

	ackReplicas int // WithReplicaAck; 0 for none
	ackTimeout  time.Duration

	observer Observer     // WithObserver; nil for none
	logger   *slog.Logger // WithLogger; nil for none

	// Set by tests only (internal/testhook): a transform of the scripts'
	// sources, and go-redis hooks (redis.Hook) for the blocking client
	// New builds.
	transform     func(src string) string
	transformKey  any // names transform when it is testTransform's (see script.NewSet); nil otherwise
	blockingHooks []any
}

// maxOwnerLen bounds the label set with [WithOwner].
const maxOwnerLen = 64

// Option configures a [Client]. Options are applied in order, a later one
// overriding an earlier; a nil Option is ignored. [New] checks the result
// and fails with [ErrInvalidArgument] if a value is out of range.
type Option func(*config)

// WithPrefix sets the prefix of every Redis key the client writes, so that
// several applications can share one Redis. The default is "fairlock:". A
// prefix may not contain '{' or '}', which would change the hash tag, nor
// control characters, and is at most 256 bytes; [New] refuses any other
// with [ErrInvalidArgument].
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithOwner labels the client's leases and waiters in Redis, for people
// reading [Client.Status] (the fairlock command uses "host:pid"). The label
// is at most 64 printable characters without spaces, braces or '/'; [New]
// refuses any other with [ErrInvalidArgument]. It is not a secret and
// grants nothing. The default is no label.
func WithOwner(label string) Option {
	return func(c *config) { c.owner = label }
}

// WithLeaseTTL sets how long a grant lasts without renewal. Leases are
// renewed automatically at a third of the TTL while held, so the TTL bounds
// how long a crashed holder keeps its permits. It is the client's
// default: a request may give its lease a TTL of its own
// ([Request.LeaseTTL]). The default is 10s; [New] refuses a TTL under
// 10ms or over [MaxTTL] (24h) with [ErrInvalidArgument].
func WithLeaseTTL(d time.Duration) Option {
	return func(c *config) { c.leaseTTL = d }
}

// WithWaiterTTL sets how long a queued waiter stays in the queue after its
// process stops refreshing it (crashed, partitioned or paused). Live
// processes refresh their waiters at a third of it. It bounds how long a
// dead waiter can delay the ones behind it. The default is 3s; [New]
// refuses a TTL under 10ms or over [MaxTTL] (24h) with
// [ErrInvalidArgument].
func WithWaiterTTL(d time.Duration) Option {
	return func(c *config) { c.waiterTTL = d }
}

// WithReplicaAck makes every change the client writes wait, before the
// call that made it returns, until at least replicas replicas of the Redis
// master have it (Redis's WAIT), for up to timeout. It narrows what a
// failover can lose (see the README's Reliability section) at the cost of
// a replication round trip on every acquire, renewal and release. Each of
// those scripts is sent with a PUBLISH on the channel
// "fairlock:replica-ack" (no key, nothing to hear) and the WAIT: the
// PUBLISH makes the WAIT cover all the master ran before it, also when the
// call is a resend that found its first run's outcome and wrote nothing
// (the first run's writes must reach the replicas too). A Redis user that
// may not publish there (ACL) gets WAITs that cover a script's own writes
// only.
//
// When the replicas do not acknowledge in time, Acquire gives the grant
// back and returns an error matching [ErrNotReplicated]; a renewal counts
// as failed (and is retried until the lease's deadline); Release returns
// the error, though the master has released the lease. So does every other
// call that changes Redis's state (a wait on a condition, a signal, a
// latch's count down, a barrier's arrival, an election's record): it
// returns an error matching [ErrNotReplicated], having changed the master,
// which a failover can then undo. A grant that
// reaches a waiter through its wake list is confirmed, with the wait,
// before Acquire returns. The client must be a *redis.Client (also as
// returned by redis.NewFailoverClient); [New] refuses others, since on
// Cluster each master replicates on its own. The timeout is at least 1ms
// and at most [MaxTTL] (24h), and replicas not negative; [New] refuses
// others with [ErrInvalidArgument].
func WithReplicaAck(replicas int, timeout time.Duration) Option {
	return func(c *config) { c.ackReplicas, c.ackTimeout = replicas, timeout }
}

// WithMaxHold caps how long any lease of the client may be held: a lease
// is not renewed past d from its grant, so it ends then even if its holder
// is stuck and never releases. Its Done channel closes at the cap (counted
// on the local clock from the earliest moment the grant can have
// happened, so never after Redis's), with [Lease.Err] matching
// [ErrMaxHold], which also matches [ErrLeaseLost]; [Lease.Release] then
// returns an error matching ErrMaxHold. The client releases the lease at
// the cap, in the background, so the next waiter is granted at once. Its
// last renewal asked Redis only for the time left to the cap, so Redis
// frees the permits at the cap on its own too (give or take that
// renewal's trip to Redis) if the holder's process stalls or is cut off
// after that renewal. A cap shorter than the lease TTL is applied by a
// renewal sent at once on the grant; if that renewal and the release at
// the cap both fail to reach Redis, the permits return when the grant's
// TTL runs out, as a lost lease's do. A request may set its own cap with
// [Request.MaxHold]. The default, 0, is no cap; d must not be negative nor
// over [MaxHoldLimit] (365 days).
func WithMaxHold(d time.Duration) Option {
	return func(c *config) { c.maxHold = d }
}

// MaxBatch is the most calls [WithBatching] lets the client send as one
// script call.
const MaxBatch = 64

// WithBatching lets the client send up to maxCalls of its concurrent calls
// as one script call: an acquisition's or a release's (also a renewal's
// and a withdrawal's) call that finds another call of its kind on its way
// to the same Redis (on Redis Cluster, to the same hash slot) waits for
// it, and then goes with the others that waited meanwhile. Each call is
// run as it would be alone, one after the other in the order they
// arrived, and gets its own reply or error; a call that finds no other on
// its way is sent at once, as without batching. Batching saves Redis
// the cost of a script call per request when one process makes many
// concurrent calls (many names, many goroutines), at the price of a wait
// of up to one round trip for calls that arrive while another is out.
// A call whose context ends while it waits is not sent; an acquisition
// still waiting when the client's close begins is not sent either (it
// fails with [ErrClosed]), and a batch of acquisitions on its way is
// given up then. Through a [backend.Backend] that returns by its
// context's end (rueidis, valkey-go), a call whose context cannot end
// (context.Background()) is always sent alone. Through go-redis a call
// that waits for a batch to a Redis that does not answer waits for that
// batch's read timeout first, then its own. Under
// [WithReplicaAck] nothing is batched (each of these calls waits for its
// replicas), nor through a [backend.Backend] whose [backend.Layout] is
// backend.Other.
//
// The default, 0, is no batching (1 is the same); maxCalls must not be
// negative nor over [MaxBatch]. [New] refuses others with
// [ErrInvalidArgument].
func WithBatching(maxCalls int) Option {
	return func(c *config) { c.batch = maxCalls }
}

// checkLeaseTTL reports an error matching [ErrInvalidArgument], naming
// what (the option or field that gave it), unless d is a lease TTL the
// client can keep: at least minTTL and at most MaxTTL. It is the one rule
// for every lease TTL: the client's (WithLeaseTTL) and a request's
// (Request.LeaseTTL, which only a zero exempts, as "the client's").
func checkLeaseTTL(what string, d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("%w: %s: lease TTL %v is negative (at least %v)", ErrInvalidArgument, what, d, minTTL)
	case d < minTTL:
		return fmt.Errorf("%w: %s: lease TTL %v is shorter than %v", ErrInvalidArgument, what, d, minTTL)
	case d > MaxTTL:
		return fmt.Errorf("%w: %s: lease TTL %v is longer than the largest accepted, %v", ErrInvalidArgument, what, d, MaxTTL)
	}
	return nil
}

func newConfig(opts []Option) (config, error) {
	cfg := config{prefix: DefaultPrefix, leaseTTL: DefaultLeaseTTL, waiterTTL: DefaultWaiterTTL}
	if f := testTransform.Load(); f != nil {
		cfg.transform, cfg.transformKey = *f, f
	}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case strings.ContainsAny(cfg.prefix, "{}"):
		return cfg, fmt.Errorf("%w: prefix %q contains '{' or '}'", ErrInvalidArgument, cfg.prefix)
	case strings.IndexFunc(cfg.prefix, unicode.IsControl) >= 0:
		return cfg, fmt.Errorf("%w: prefix %q contains a control character", ErrInvalidArgument, cfg.prefix)
	case len(cfg.prefix) > keyspace.MaxPrefixLen:
		return cfg, fmt.Errorf("%w: prefix is %d bytes, longer than %d", ErrInvalidArgument, len(cfg.prefix), keyspace.MaxPrefixLen)
	case len(cfg.owner) > maxOwnerLen || strings.ContainsAny(cfg.owner, "{} /") ||
		strings.IndexFunc(cfg.owner, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return cfg, fmt.Errorf("%w: owner label %q: at most %d printable characters, no spaces, braces or '/'", ErrInvalidArgument, cfg.owner, maxOwnerLen)
	}
	if err := checkLeaseTTL("WithLeaseTTL", cfg.leaseTTL); err != nil {
		return cfg, err
	}
	switch {
	case cfg.waiterTTL < minTTL:
		return cfg, fmt.Errorf("%w: WithWaiterTTL: waiter TTL %v is shorter than %v", ErrInvalidArgument, cfg.waiterTTL, minTTL)
	case cfg.waiterTTL > MaxTTL:
		return cfg, fmt.Errorf("%w: WithWaiterTTL: waiter TTL %v is longer than the largest accepted, %v", ErrInvalidArgument, cfg.waiterTTL, MaxTTL)
	case cfg.maxHold < 0:
		return cfg, fmt.Errorf("%w: WithMaxHold: max hold %v is negative", ErrInvalidArgument, cfg.maxHold)
	case cfg.maxHold > MaxHoldLimit:
		return cfg, fmt.Errorf("%w: WithMaxHold: max hold %v is longer than the largest accepted, %v", ErrInvalidArgument, cfg.maxHold, MaxHoldLimit)
	case cfg.batch < 0 || cfg.batch > MaxBatch:
		return cfg, fmt.Errorf("%w: WithBatching(%d): calls per batch must be between 0 (no batching) and %d", ErrInvalidArgument, cfg.batch, MaxBatch)
	case cfg.ackReplicas < 0 || (cfg.ackReplicas > 0 && cfg.ackTimeout < time.Millisecond):
		return cfg, fmt.Errorf("%w: WithReplicaAck(%d, %v): replicas must be >= 0 and the timeout at least 1ms", ErrInvalidArgument, cfg.ackReplicas, cfg.ackTimeout)
	case cfg.ackReplicas > 0 && cfg.ackTimeout > MaxTTL:
		return cfg, fmt.Errorf("%w: WithReplicaAck(%d, %v): the timeout is longer than the largest accepted, %v", ErrInvalidArgument, cfg.ackReplicas, cfg.ackTimeout, MaxTTL)
	}
	return cfg, nil
}

// WithObserver has the client report its events to o. The default is
// none; a nil o means none.
func WithObserver(o Observer) Option {
	return func(c *config) { c.observer = o }
}

// WithLogger has the client log what a caller must know and cannot see
// from return values: a lease lost and why, renewals failing, a listener's
// connection errors and recoveries, clean-up after a cancel that could not
// reach Redis. Nothing on the hot path is logged at Info or below. Records
// carry the semaphore names, the owner label ([WithOwner]) and the token.
// The default is no logging; a nil l means none.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// withTransform passes the source of each of the client's scripts through
// f (tests only; see internal/testhook). A nil f runs them as they are.
func withTransform(f func(src string) string) Option {
	return func(c *config) { c.transform, c.transformKey = f, nil }
}

// testTransform is this package's own tests' default for withTransform
// (main_test.go sets internal/halfrun's check), which a client's options
// override. Nothing outside the package can set it.
var testTransform atomic.Pointer[func(string) string]

// setTestTransform sets testTransform for the clients made from now on
// and returns a function that restores the one before.
func setTestTransform(f func(string) string) (restore func()) {
	var p *func(string) string
	if f != nil {
		p = &f
	}
	old := testTransform.Swap(p)
	return func() { testTransform.Store(old) }
}

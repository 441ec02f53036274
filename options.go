package fairlock

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
	"unicode"
)

// Defaults of the [Option] settings.
const (
	DefaultPrefix    = "fairlock:"
	DefaultLeaseTTL  = 10 * time.Second
	DefaultWaiterTTL = 3 * time.Second
)

// A client's timers run at fractions of its TTLs.
const (
	// renewDivisor: a held lease is renewed, and a queued waiter
	// refreshed, every TTL/renewDivisor, which leaves two thirds of the
	// TTL to retry a renewal that failed.
	renewDivisor = 3
	// retryDivisor: a renewal or refresh that failed is tried again
	// TTL/retryDivisor later (a renewal never past its lease's deadline).
	retryDivisor = 10
	// never is a timer's duration for "not planned": whatever is planned
	// comes earlier.
	never = time.Duration(math.MaxInt64)
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

	ackReplicas int // WithReplicaAck; 0 for none
	ackTimeout  time.Duration

	observer Observer     // WithObserver; nil for none
	logger   *slog.Logger // WithLogger; nil for none
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
// how long a crashed holder keeps its permits. The default is 10s; [New]
// refuses a TTL under 10ms with [ErrInvalidArgument].
func WithLeaseTTL(d time.Duration) Option {
	return func(c *config) { c.leaseTTL = d }
}

// WithWaiterTTL sets how long a queued waiter stays in the queue after its
// process stops refreshing it (crashed, partitioned or paused). Live
// processes refresh their waiters at a third of it. It bounds how long a
// dead waiter can delay the ones behind it. The default is 3s; [New]
// refuses a TTL under 10ms with [ErrInvalidArgument].
func WithWaiterTTL(d time.Duration) Option {
	return func(c *config) { c.waiterTTL = d }
}

func newConfig(opts []Option) (config, error) {
	cfg := config{prefix: DefaultPrefix, leaseTTL: DefaultLeaseTTL, waiterTTL: DefaultWaiterTTL}
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
	case len(cfg.prefix) > maxPrefixLen:
		return cfg, fmt.Errorf("%w: prefix is %d bytes, longer than %d", ErrInvalidArgument, len(cfg.prefix), maxPrefixLen)
	case len(cfg.owner) > maxOwnerLen || strings.ContainsAny(cfg.owner, "{} /") ||
		strings.IndexFunc(cfg.owner, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return cfg, fmt.Errorf("%w: owner label %q: at most %d printable characters, no spaces, braces or '/'", ErrInvalidArgument, cfg.owner, maxOwnerLen)
	case cfg.leaseTTL < minTTL:
		return cfg, fmt.Errorf("%w: lease TTL %v is shorter than %v", ErrInvalidArgument, cfg.leaseTTL, minTTL)
	case cfg.waiterTTL < minTTL:
		return cfg, fmt.Errorf("%w: waiter TTL %v is shorter than %v", ErrInvalidArgument, cfg.waiterTTL, minTTL)
	case cfg.ackReplicas < 0 || (cfg.ackReplicas > 0 && cfg.ackTimeout < time.Millisecond):
		return cfg, fmt.Errorf("%w: WithReplicaAck(%d, %v): replicas must be >= 0 and the timeout at least 1ms", ErrInvalidArgument, cfg.ackReplicas, cfg.ackTimeout)
	}
	return cfg, nil
}

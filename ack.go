package fairlock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// pipeliner is what WithReplicaAck needs of a client besides RedisClient:
// a pipeline, whose commands share one connection, so that WAIT covers the
// script before it. *redis.Client (also Sentinel failover) has it.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// run runs script s. With WithReplicaAck it also waits, on the same
// connection, until the configured number of replicas has the script's
// writes; the second result reports when they did not (the script's own
// result and error are in the Cmd either way).
func (c *Client) run(ctx context.Context, s *redis.Script, keys []string, args ...any) (*redis.Cmd, error) {
	if c.cfg.ackReplicas == 0 {
		return s.Run(ctx, c.rdb, keys, args...), nil
	}
	p := c.rdb.(pipeliner) // checked by New
	exec := func(eval func(redis.Pipeliner) *redis.Cmd) (*redis.Cmd, *redis.IntCmd) {
		pipe := p.Pipeline()
		cmd := eval(pipe)
		wait := redis.NewIntCmd(ctx, "wait", c.cfg.ackReplicas, c.cfg.ackTimeout.Milliseconds())
		_ = pipe.Process(ctx, wait)
		_, _ = pipe.Exec(ctx)
		return cmd, wait
	}
	cmd, wait := exec(func(pipe redis.Pipeliner) *redis.Cmd { return s.EvalSha(ctx, pipe, keys, args...) })
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		cmd, wait = exec(func(pipe redis.Pipeliner) *redis.Cmd { return s.Eval(ctx, pipe, keys, args...) })
	}
	if cmd.Err() != nil {
		return cmd, nil
	}
	acked, err := wait.Result()
	switch {
	case err != nil:
		return cmd, fmt.Errorf("%w: %w: WAIT: %w", ErrRedis, ErrNotReplicated, err)
	case acked < int64(c.cfg.ackReplicas):
		return cmd, fmt.Errorf("%w: %w: %d of %d replicas acknowledged within %v", ErrRedis, ErrNotReplicated, acked, c.cfg.ackReplicas, c.cfg.ackTimeout)
	}
	return cmd, nil
}

// WithReplicaAck makes every change the client writes wait, before the
// call that made it returns, until at least replicas replicas of the Redis
// master have it (Redis's WAIT), for up to timeout. It narrows what a
// failover can lose (see the README's Reliability section) at the cost of
// a replication round trip on every acquire, renewal and release.
//
// When the replicas do not acknowledge in time, Acquire gives the grant
// back and returns an error matching [ErrNotReplicated]; a renewal counts
// as failed (and is retried until the lease's deadline); Release returns
// the error, though the master has released the lease. A grant that
// reaches a waiter through its wake list is confirmed, with the wait,
// before Acquire returns. The client must be a *redis.Client (also as
// returned by redis.NewFailoverClient); [New] refuses others, since on
// Cluster each master replicates on its own.
func WithReplicaAck(replicas int, timeout time.Duration) Option {
	return func(c *config) { c.ackReplicas, c.ackTimeout = replicas, timeout }
}

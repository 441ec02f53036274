package fairlock

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// pipeliner is what WithReplicaAck needs of a client besides RedisClient:
// a pipeline, whose commands share one connection, so that WAIT covers the
// script before it. *redis.Client (also Sentinel failover) has it.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// run is the one way the client runs a script: oc's op, on its keys,
// through the script that serves it. With WithReplicaAck, for the ops
// whose writes must reach replicas (op.ack), it also waits, on the same
// connection, until the configured number of replicas has the script's
// writes; the second result reports when they did not (the script's own
// reply and error are in the result either way).
//
// The dial hooks watch the call (see prompt.go): if a dial it waits for is
// refused, or Redis's name does not resolve, it ends at once with a
// dialError.
func (c *Client) run(ctx context.Context, oc opCall) (result, error) {
	cmd, ackErr := c.runWatched(c.dials.mark(ctx, oc.keys), oc)
	return resultOf(cmd, c.dials.settle(cmd.Err())), ackErr
}

// A result is what a script call came to, as plain Go values: its reply
// (nil, int64, string, or []any of those) or the error that stood in its
// way. The script layer (scripts.go, functions.go) runs the call on the
// Redis client; everything above run reads results only.
type result struct {
	val any
	err error
}

// Err returns the call's error.
func (r result) Err() error { return r.err }

// Slice returns the reply, an array, or the call's error.
func (r result) Slice() ([]any, error) {
	if r.err != nil {
		return nil, r.err
	}
	s, ok := r.val.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: script reply %v is not an array", ErrRedis, r.val)
	}
	return s, nil
}

func (c *Client) runWatched(ctx context.Context, oc opCall) (*redis.Cmd, error) {
	s, keys, args := c.scripts.forOp(oc.op), oc.keys, oc.args
	if c.cfg.ackReplicas == 0 || !oc.op.ack {
		return s.Run(ctx, c.rdb, keys, args...), nil
	}
	p := c.rdb.(pipeliner) // checked by New
	var wait *redis.IntCmd
	cmd := s.run(ctx, c.rdb, func(send func(redis.Scripter) *redis.Cmd) *redis.Cmd {
		pipe := p.Pipeline()
		cmd := send(pipe)
		wait = redis.NewIntCmd(ctx, "wait", c.cfg.ackReplicas, c.cfg.ackTimeout.Milliseconds())
		_ = pipe.Process(ctx, wait)
		_, _ = pipe.Exec(ctx)
		return cmd
	}, keys, args)
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

// outcome is what run returned.
type outcome struct {
	res    result
	ackErr error
}

// runner returns a call of run on oc, for call.
func (c *Client) runner(oc opCall) func(context.Context) outcome {
	return func(ctx context.Context) outcome {
		res, ackErr := c.run(ctx, oc)
		return outcome{res, ackErr}
	}
}

// grace is how long a call whose context ended still waits for an answer
// already on its way, so that with a healthy Redis a cancelled Acquire has
// left its queue when it returns. A call waits at most two graces (its
// script's, then its clean-up's) past its context's end.
const grace = 30 * time.Millisecond

// call runs do(ctx) and returns its outcome, but returns no later than
// ctx's end (plus grace), even when go-redis would not notice it: unless the go-redis
// client sets Options.ContextTimeoutEnabled, a command sent to a Redis
// that does not answer waits for go-redis's ReadTimeout (3 s by default),
// and go-redis retries a connection it cannot open for over a second.
//
// When ctx can end, do runs on a goroutine of the client's (see spawn);
// otherwise on the caller's.
// If ctx ends first, call returns ok false and an outcome holding ctx's
// error; the goroutine then hands do's outcome, when it arrives, to late
// (if not nil), which cleans up after it: withdraws a ticket the script
// queued or granted, or sends again a release that failed. late is given
// the caller's context, ended; it must bound what it does itself.
// If do ends because a dial it waited for failed (Redis refused the
// connection or its name did not resolve; see run), call returns ok true
// and that outcome, whose error matches ErrRedis (isDialError), and hands
// it to late as well, in the background: an earlier attempt may have sent
// the script.
func (c *Client) call(ctx context.Context, do func(context.Context) outcome, late func(outcome)) (o outcome, ok bool) {
	if ctx.Done() == nil {
		o := do(ctx)
		if late != nil && isDialError(o.res.Err()) {
			c.spawn(func() { late(o) })
		}
		return o, true
	}
	var state atomic.Int32 // 0 running, 1 handed to the caller, 2 abandoned by it
	ch := make(chan outcome, 1)
	c.spawn(func() {
		o := do(ctx)
		if state.CompareAndSwap(0, 1) {
			ch <- o
			if late != nil && isDialError(o.res.Err()) {
				late(o)
			}
		} else if late != nil {
			late(o)
		}
	})
	select {
	case o := <-ch:
		return o, true
	case <-ctx.Done():
	}
	// A Redis that answers does so within the grace; the caller then
	// acts on the outcome itself, as if ctx had ended a moment later.
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case o := <-ch:
		return o, true
	case <-t.C:
		if !state.CompareAndSwap(0, 2) {
			return <-ch, true // the outcome came as the grace ended: use it
		}
		return outcome{res: result{err: ctx.Err()}}, false
	}
}

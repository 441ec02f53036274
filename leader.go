package fairlock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/internal/engine"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
)

// An election's leader record (package election) is kept beside the
// election's mutex and changed by the engine's "leader" ops
// (lua/ops/leader.lua), which check the recorded term against the
// mutex's live lease by Redis's clock. The election package reaches them
// through internal/engine (engine.go).

// leaderKeys are the keys of the leader ops on the election name: the
// mutex's, then the record.
func leaderKeys(k keyspace.Keys) []string {
	return append(k.List()[:len(k.List()):len(k.List())], k.Derived(keyspace.KindLeader))
}

// leaderChannel names the channel on which the election name's record
// announces its changes.
func leaderChannel(k keyspace.Keys) string { return k.Derived(keyspace.KindLeaderChange) }

// leaderRun runs the leader op lo on the election name, by ctx's end,
// with the arguments args gives for the election's keys (after the op's
// name); op names the call in errors.
func (c *Client) leaderRun(ctx context.Context, op string, lo *script.Op, name string, args func(k keyspace.Keys) []string) (script.Result, error, error) {
	k, err := c.keys(name)
	if err != nil {
		return script.Result{}, nil, opError(op, []string{name}, err)
	}
	if c.isClosed() && lo != script.OpLeaderClear && (lo != script.OpLeaderSet || !c.draining()) {
		// A record is cleared after Close released its term's lease
		// (see Lease.atClose): the close runs it, and bounds it. While a
		// Shutdown waits for the leases code holds, a leader's record is
		// renewed with its lease (nothing is granted after a close, so
		// only a term already held can be).
		return script.Result{}, nil, opError(op, []string{name}, ErrClosed)
	}
	a := args(k)
	o, _ := c.calls.Op(ctx, script.NewCall(lo, leaderKeys(k), len(a)).With(a...), nil)
	if err := o.Res.Err; err != nil {
		return script.Result{}, nil, fail(ctx, op, []string{name}, err)
	}
	return o.Res, o.AckErr, nil
}

func (c *Client) leaderSet(ctx context.Context, name string, term int64, value string, ttl time.Duration) (bool, error) {
	const op = "record leader"
	cmd, ackErr, err := c.leaderRun(ctx, op, script.OpLeaderSet, name, func(k keyspace.Keys) []string {
		return []string{ops.Itoa(term), value, ops.MsArg(ttl), leaderChannel(k)}
	})
	if err != nil {
		return false, err
	}
	res, _ := cmd.Slice()
	ok, err := script.Reply(res).Int(0)
	switch {
	case err != nil:
		return false, opError(op, []string{name}, fmt.Errorf("%w: bad reply %v: %w", ErrRedis, res, err))
	case ok == 1 && ackErr != nil:
		return false, opError(op, []string{name}, ackErr)
	}
	return ok == 1, nil
}

func (c *Client) leaderClear(ctx context.Context, name string, term int64) error {
	_, _, err := c.leaderRun(ctx, "clear leader", script.OpLeaderClear, name, func(k keyspace.Keys) []string {
		return []string{ops.Itoa(term), "", "1", leaderChannel(k)}
	})
	return err
}

func (c *Client) leaderGet(ctx context.Context, name string) (engine.Leader, error) {
	const op = "read leader"
	cmd, _, err := c.leaderRun(ctx, op, script.OpLeaderGet, name, func(keyspace.Keys) []string { return nil })
	if err != nil {
		return engine.Leader{}, err
	}
	res, _ := cmd.Slice()
	if len(res) != 3 || res[0] == nil || res[1] == nil {
		return engine.Leader{}, nil
	}
	term, err := strconv.ParseInt(fmt.Sprint(res[1]), 10, 64)
	if err != nil {
		return engine.Leader{}, opError(op, []string{name}, fmt.Errorf("%w: bad term %v", ErrRedis, res[1]))
	}
	left, err := strconv.ParseInt(fmt.Sprint(res[2]), 10, 64)
	if err != nil {
		return engine.Leader{}, opError(op, []string{name}, fmt.Errorf("%w: bad time left %v", ErrRedis, res[2]))
	}
	return engine.Leader{Value: fmt.Sprint(res[0]), Term: term, Left: time.Duration(left) * time.Millisecond}, nil
}

package fairlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/engine"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
)

// Cyclic barriers (package barrier), on the engine's seam as countdown
// latches are (latch.go). A barrier named N keeps its state in a hash
// derived from N's base (kind kindBarrier: {parties, round, n}); its
// waiters are condition waiters of a resource of its own whose base is
// that hash's key, so that they register, are refreshed by their
// process's room, are dropped within their waiter TTL when it dies, and
// are woken through their process's wake list, as a condition's are.
// Nothing is ever granted there: a round's end is pushed to each waiter
// as a grant of nothing whose one token says how it ended
// (barrierCompleted, barrierBroken), and recorded under its ticket, so
// that a waiter whose wake-up is lost, reported gone by its refresh, asks
// again with its ticket and finds it (lua/ops/barrier.lua). A refresh
// also reports gone the waiters of a round that lost a party
// (refresh.lua's broken), whose re-ask breaks the round for all.
// Package barrier reaches these through internal/engine, where they are
// registered below with the barrier's key kind and ops: the barrier's
// whole seam (docs/design.md).

// The barrier's key kind and ops. An arrival may grow memory (a waiter)
// or end a round, pushing wake-ups; a break frees waiters and pushes
// theirs.
var (
	kindBarrier     = keyspace.RegisterKind("B")
	opBarrierAwait  = script.Register("barrier_await", "lua/ops/barrier.lua", script.CrossSlot, true)
	opBarrierBreak  = script.Register("barrier_break", "lua/ops/barrier.lua", "allow-oom,"+script.CrossSlot, true)
	opBarrierStatus = script.Register("barrier_status", "lua/ops/barrier.lua", "no-writes", false)
)

// The functions package barrier calls (internal/engine.Func), c a
// *Client.
func init() {
	engine.Register("barrier.await", func(ctx context.Context, c any, name string, parties int64, ttl time.Duration, waiting func()) (round, index, stored int64, broken bool, err error) {
		a, err := c.(*Client).barrierAwait(ctx, name, parties, ttl, waiting)
		return a.round, a.index, a.stored, a.broken, err
	})
	engine.Register("barrier.status", func(ctx context.Context, c any, name string, parties int64) (round int64, arrived []string, broken bool, stored int64, err error) {
		return c.(*Client).barrierStatus(ctx, name, parties)
	})
}

// barrierCond is the condition a barrier's waiters wait on
// (BARRIER_COND in lua/ops/barrier.lua).
const barrierCond = ""

// A round's outcomes, as its wake-ups' token and replies carry them.
const (
	barrierCompleted = 1
	barrierBroken    = 2
)

// barrierKeys are a barrier's keys: its waiters' resource, and its hash.
type barrierKeys struct {
	res   keyspace.Keys
	state string
}

// barrierKeysOf returns the keys of the barrier whose name has keys k,
// each derived from k's base under kindBarrier (TestKeyOwners).
func barrierKeysOf(k keyspace.Keys) barrierKeys {
	state := k.Derived(kindBarrier)
	return barrierKeys{res: keyspace.Core(state), state: state}
}

// plan is the plan of a party of the barrier name: one permit of the
// waiters' resource (what its member and its refresh name).
func (bk barrierKeys) plan(name string) plan {
	return plan{parts: []part{{k: bk.res, req: Request{Name: name, Permits: 1}}}, keys: bk.res.List(), names: []string{name}}
}

// call is barrier.lua's op o on bk: the waiters' resource's keys, its
// condition's, then the hash; args after parties.
func (bk barrierKeys) call(o *script.Op, parties int64, args ...string) script.Call {
	keys := append(append(make([]string, 0, 7), bk.res.List()...), condKeys(bk.res, barrierCond)...)
	keys = append(keys, bk.state)
	return script.NewCall(o, keys, 1+len(args)).With(ops.Itoa(parties)).With(args...)
}

// barrierInts reads the first n integers of a script's reply (at least one).
func barrierInts(out script.Result, n int) ([]int64, error) {
	res, err := out.Slice()
	if err != nil {
		return nil, err
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("%w: empty barrier script reply", ErrRedis)
	}
	r := make([]int64, min(len(res), n))
	for i := range r {
		if r[i], err = script.Reply(res).Int(i); err != nil {
			return nil, fmt.Errorf("%w: barrier script reply %v: %w", ErrRedis, res, err)
		}
	}
	return r, nil
}

// barrierPartiesErrPrefix starts the error of a barrier op called with
// other parties than the stored ones: "FAIRLOCK_BARRIER_PARTIES <stored>".
const barrierPartiesErrPrefix = "FAIRLOCK_BARRIER_PARTIES "

// barrierStored returns the parties a barrier is stored with when err is
// a barrier op's refusal of others (nothing was written).
func barrierStored(err error) (int64, bool) {
	msg, ok := fault.ReplyOf(err)
	if !ok {
		return 0, false
	}
	rest, ok := strings.CutPrefix(msg, barrierPartiesErrPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	return n, err == nil && n > 0
}

// An arrival is what barrierAwait learns: the round, the party's index
// in it (-1 unknown), whether the round broke, or the parties the
// barrier is stored with (stored > 0) when those are others.
type arrival struct {
	round, index, stored int64
	broken               bool
}

// barrierAwait arrives at the barrier name (made with parties, its hash
// kept ttl) and returns when the round it arrived in ends: completed by
// its last party's arrival, or broken by a party that left or died. The
// arrival that completes a round returns at once; any other waits on the
// barrier's condition, registered in Redis, for the wake-up the round's
// end pushes. A waiter reported gone by its refresh (its wake-up lost, or
// its round having lost a party) asks again with its ticket, and learns
// its round's end, or breaks the round. When ctx ends, or the client
// closes, first, its round breaks in the background (barrier_break) and
// barrierAwait returns ctx's error (ErrClosed). waiting (when not nil) is
// called once its arrival is registered in Redis to wait (never for the
// round's last party): a waitReport's (reportWait), for the client's
// observer.
func (c *Client) barrierAwait(ctx context.Context, name string, parties int64, ttl time.Duration, waiting func()) (arrival, error) {
	const op = "await barrier"
	names := []string{name}
	wrap := func(err error) error { return opError(op, names, err) }
	bk, err := c.barrierStart(ctx, op, name)
	if err != nil {
		return arrival{}, err
	}
	// A close waits for the wait until it returns, so that its round has
	// been broken (or is being broken) by then.
	if !c.hold() {
		return arrival{}, wrap(ErrClosed)
	}
	defer c.unhold()
	p := bk.plan(name)
	cp := p.withCond(barrierCond)
	lease, _ := p.leaseArgs(c)
	// The waiter registers before its script runs, so a wake-up pushed
	// the moment it waits finds it.
	r, w, err := c.enter(p, true)
	if err != nil {
		return arrival{}, wrap(err)
	}
	ticket := w.Ticket
	await := func(asked string) script.Call {
		return bk.call(opBarrierAwait, parties, ops.MsArg(ttl), ticket, c.id, lease, c.waiterMs, asked)
	}
	breaks := func(asked string) script.Call {
		return bk.call(opBarrierBreak, parties, ops.MsArg(ttl), ticket, asked)
	}
	sent := time.Now()
	callCtx, bound := c.boundByClose(ctx)
	o, ok := c.calls.Op(callCtx, await(""), func(callpath.Outcome) {
		// The script may have made the ticket wait after the caller left.
		var report func(error)
		if ctx.Err() == nil {
			report = c.closeReport()
		}
		c.cleanUpReport(ctx, breaks(""), cp, report)
	})
	bound.done()
	if !ok {
		c.waits.Unregister(r, w)
		return arrival{}, wrap(c.endedByClose(ctx, o.Res.Err))
	}
	rep, err := barrierInts(o.Res, 5)
	if stored, ok := barrierStored(err); ok {
		c.waits.Unregister(r, w) // (nothing was written)
		return arrival{stored: stored}, nil
	}
	if err == nil && (rep[0] == 1 && len(rep) < 5 || rep[0] != 1 && len(rep) < 3 || rep[0] == 2 && len(rep) < 4) {
		err = fmt.Errorf("%w: barrier script reply %v", ErrRedis, rep)
	}
	if err != nil {
		c.waits.Unregister(r, w)
		if !leftAsIs(o.Res.Err) && !fault.IsDialError(err) {
			c.letGo(ctx, breaks(""), cp, nil)
		}
		return arrival{}, fail(ctx, op, names, err)
	}
	if rep[0] != 1 {
		c.waits.Unregister(r, w)
		if o.AckErr != nil {
			// The arrival completed (or broke) the round on the master
			// alone: a failover can lose what it wrote, so its success is
			// not reported.
			return arrival{}, wrap(o.AckErr)
		}
		return arrival{round: rep[1], index: rep[2], broken: rep[0] == 2}, nil
	}
	a := arrival{round: rep[3], index: rep[4]}
	asked := ops.Itoa(a.round)
	if o.AckErr != nil {
		c.waits.Unregister(r, w)
		c.letGo(ctx, breaks(asked), cp, nil)
		return arrival{}, wrap(o.AckErr)
	}
	c.waits.NoteQueued(r, w, time.Duration(rep[2])*time.Millisecond, clock.Sample{Sent: sent, Redis: rep[1]})
	if waiting != nil {
		waiting()
	}
	select {
	case <-w.Ch:
		wk := w.Wk
		switch {
		case wk.Err != nil:
			c.letGo(ctx, breaks(asked), cp, nil)
			return arrival{}, fail(ctx, op, names, wk.Err)
		case wk.Requeue:
			// Reported gone: its wake-up was lost, or its round lost a
			// party. Its ticket's record, or the round's break, says
			// which.
			o, ok := c.calls.Op(ctx, await(asked), func(callpath.Outcome) { c.cleanUp(ctx, breaks(asked), cp) })
			if !ok {
				c.letGo(ctx, breaks(asked), cp, nil)
				return arrival{}, wrap(o.Res.Err)
			}
			rep, err := barrierInts(o.Res, 4)
			if err == nil && (rep[0] == 1 || len(rep) < 3) {
				err = fmt.Errorf("%w: barrier script reply %v to a re-ask", ErrRedis, rep)
			}
			if err != nil {
				c.letGo(ctx, breaks(asked), cp, nil)
				return arrival{}, fail(ctx, op, names, err)
			}
			if o.AckErr != nil {
				// The re-ask broke the round (or read how it ended) on
				// the master alone.
				return arrival{}, wrap(o.AckErr)
			}
			a.broken = rep[0] != 0
			return a, nil
		}
		c.waits.Grants.Add(wk.Via)
		a.broken = len(wk.Grant.Tokens) == 0 || wk.Grant.Tokens[0] != barrierCompleted
		return a, nil
	case <-ctx.Done():
	case <-c.done:
	}
	c.waits.Unregister(r, w)
	if err := ctx.Err(); err != nil {
		c.letGo(ctx, breaks(asked), cp, nil)
		return arrival{}, wrap(err)
	}
	c.letGo(ctx, breaks(asked), cp, c.closeReport())
	return arrival{}, wrap(ErrClosed)
}

// barrierStart checks what every barrier op checks first: the name, and
// that the client is open and ctx has not ended.
func (c *Client) barrierStart(ctx context.Context, op, name string) (barrierKeys, error) {
	k, err := c.keys(name)
	if err != nil {
		return barrierKeys{}, opError(op, []string{name}, err)
	}
	if c.isClosed() {
		return barrierKeys{}, opError(op, []string{name}, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return barrierKeys{}, opError(op, []string{name}, err)
	}
	return barrierKeysOf(k), nil
}

// barrierStatus returns the barrier's round, the owners of its waiting
// parties in arrival order, and whether the round has lost a party (it
// breaks at the next refresh or arrival); or the parties it is stored
// with when those are others (stored > 0). With parties 0 it reads
// whatever parties are stored, and returns them as stored (0 when the
// barrier does not exist): a tool's read.
func (c *Client) barrierStatus(ctx context.Context, name string, parties int64) (round int64, arrived []string, broken bool, stored int64, err error) {
	const op = "barrier status"
	bk, err := c.barrierStart(ctx, op, name)
	if err != nil {
		return 0, nil, false, 0, err
	}
	o, ok := c.calls.Op(ctx, bk.call(opBarrierStatus, parties), nil)
	if !ok {
		return 0, nil, false, 0, opError(op, []string{name}, o.Res.Err)
	}
	res, err := o.Res.Slice()
	if stored, ok := barrierStored(err); ok {
		return 0, nil, false, stored, nil
	}
	var head []int64
	if err == nil {
		head, err = barrierInts(o.Res, 3)
	}
	if err == nil && len(head) < 3 {
		err = fmt.Errorf("%w: barrier status reply %v", ErrRedis, res)
	}
	if err != nil {
		return 0, nil, false, 0, fail(ctx, op, []string{name}, err)
	}
	for _, v := range res[3:] {
		s, _ := v.(string)
		arrived = append(arrived, owner(s))
	}
	if parties == 0 {
		stored = head[1]
	}
	return head[0], arrived, head[2] == 1, stored, nil
}

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
	"github.com/fairlock/fairlock/internal/wait"
)

// Countdown latches (package latch). A latch named N keeps its count in a
// hash derived from N's base (kind kindLatch: {count, init}); its waiters
// are condition waiters of a resource of its own whose base is that
// hash's key, so that they register, are refreshed by their process's
// room, are dropped within their waiter TTL when it dies, and withdraw
// ("leave") exactly as a condition's waiters do. Nothing is ever granted
// on that resource. The count down that reaches 0 takes every waiter off
// the condition and pushes a wake-up to its process (lua/ops/latch.lua);
// a waiter it left (its caller ended between its scripts) is reported
// gone by its room's refresh once the latch is open (refresh.lua's open),
// and asks again.
// Package latch reaches these through internal/engine, where they are
// registered below with the latch's key kind and ops: the latch's whole
// seam (docs/design.md).

// The latch's key kind and ops. A new waiter grows memory (no
// allow-oom); a count down frees waiters and pushes their wake-ups to
// their processes' lists.
var (
	kindLatch    = keyspace.RegisterKind("L")
	opLatchWait  = script.Register("latch_wait", "lua/ops/latch.lua", "", true)
	opLatchDown  = script.Register("latch_down", "lua/ops/latch.lua", "allow-oom,"+script.CrossSlot, true)
	opLatchCount = script.Register("latch_count", "lua/ops/latch.lua", "no-writes", false)
)

// The functions package latch calls (internal/engine.Func), c a *Client.
func init() {
	engine.Register("latch.count", func(ctx context.Context, c any, name string, init int64) (count, stored int64, err error) {
		return c.(*Client).latchCount(ctx, name, init)
	})
	engine.Register("latch.inspect", func(ctx context.Context, c any, name string) (count, init, waiting int64, err error) {
		return c.(*Client).latchInspect(ctx, name)
	})
	engine.Register("latch.down", func(ctx context.Context, c any, name string, init int64, ttl time.Duration) (count, stored int64, err error) {
		return c.(*Client).latchDown(ctx, name, init, ttl)
	})
	engine.Register("latch.wait", func(ctx context.Context, c any, name string, init int64, ttl time.Duration, waiting func()) (stored int64, err error) {
		return c.(*Client).latchWait(ctx, name, init, ttl, waiting)
	})
}

// latchCond is the condition a latch's waiters wait on (LATCH_COND in
// lua/ops/latch.lua).
const latchCond = ""

// maxLatchScripts bounds the scripts one count down runs: each wakes up
// to the script budget of waiters.
const maxLatchScripts = 100000

// latchKeys are a latch's keys: its waiters' resource, and its count.
type latchKeys struct {
	res   keyspace.Keys
	count string
}

// latchKeysOf returns the keys of the latch whose name has keys k. Every
// one is derived from k's base under kindLatch, so no semaphore's key, nor
// any other object's, is a latch's (TestKeyOwners).
func latchKeysOf(k keyspace.Keys) latchKeys {
	count := k.Derived(kindLatch)
	return latchKeys{res: keyspace.Core(count), count: count}
}

// plan is the plan of a waiter on the latch name: one permit of the
// waiters' resource (what its member and its refresh name).
func (lk latchKeys) plan(name string) plan {
	return plan{parts: []part{{k: lk.res, req: Request{Name: name, Permits: 1}}}, keys: lk.res.List(), names: []string{name}}
}

// call is latch.lua's op o on lk: the waiters' resource's keys, its
// condition's, then the count; args after init.
func (lk latchKeys) call(o *script.Op, init int64, args ...string) script.Call {
	keys := append(condKeys(lk.res, latchCond), lk.count)
	keys = append(append(make([]string, 0, 7), lk.res.List()...), keys...)
	return script.NewCall(o, keys, 1+len(args)).With(ops.Itoa(init)).With(args...)
}

// latchReply reads latch.lua's reply into integers: its code (or count),
// then up to two more.
func latchReply(out script.Result) ([3]int64, error) {
	var r [3]int64
	res, err := out.Slice()
	if err != nil {
		return r, err
	}
	for i := range min(len(res), 3) {
		if r[i], err = script.Reply(res).Int(i); err != nil {
			return r, fmt.Errorf("%w: latch script reply %v: %w", ErrRedis, res, err)
		}
	}
	if len(res) == 0 {
		return r, fmt.Errorf("%w: empty latch script reply", ErrRedis)
	}
	return r, nil
}

// latchCountErrPrefix starts the error of a latch op called with another
// count than the stored one: "FAIRLOCK_LATCH_COUNT <stored>".
const latchCountErrPrefix = "FAIRLOCK_LATCH_COUNT "

// latchStored returns the count a latch is stored with when err is a
// latch op's refusal of another (nothing was written), and false for any
// other error.
func latchStored(err error) (int64, bool) {
	msg, ok := fault.ReplyOf(err)
	if !ok {
		return 0, false
	}
	rest, ok := strings.CutPrefix(msg, latchCountErrPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	return n, err == nil && n > 0
}

// badCount is the error of a latch reply whose count is below 0, which
// no script writes.
func badCount(n int64) error {
	return fmt.Errorf("%w: latch script reply: count %d", ErrRedis, n)
}

// latchStart checks what every latch op checks first: the name, and that
// the client is open and ctx has not ended.
func (c *Client) latchStart(ctx context.Context, op, name string) (latchKeys, error) {
	k, err := c.keys(name)
	if err != nil {
		return latchKeys{}, opError(op, []string{name}, err)
	}
	if c.isClosed() {
		return latchKeys{}, opError(op, []string{name}, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return latchKeys{}, opError(op, []string{name}, err)
	}
	return latchKeysOf(k), nil
}

// latchCount returns the count of the latch name made with init (init
// when it does not exist), or the init it is stored with when that is
// another (stored > 0).
func (c *Client) latchCount(ctx context.Context, name string, init int64) (count, stored int64, err error) {
	const op = "latch count"
	lk, err := c.latchStart(ctx, op, name)
	if err != nil {
		return 0, 0, err
	}
	o, ok := c.calls.Op(ctx, lk.call(opLatchCount, init), nil)
	if !ok {
		return 0, 0, opError(op, []string{name}, o.Res.Err)
	}
	r, err := latchReply(o.Res)
	if stored, ok := latchStored(err); ok {
		return 0, stored, nil
	}
	if err == nil && r[0] < 0 {
		err = badCount(r[0])
	}
	if err != nil {
		return 0, 0, fail(ctx, op, []string{name}, err)
	}
	return r[0], 0, nil
}

// latchInspect returns the latch name's count, the count it was made
// with (0 and 0 when it does not exist) and how many waiters it has
// registered (the dead among them until they are dropped), whatever count
// it was made with: a tool's read.
func (c *Client) latchInspect(ctx context.Context, name string) (count, init, waiting int64, err error) {
	const op = "latch count"
	lk, err := c.latchStart(ctx, op, name)
	if err != nil {
		return 0, 0, 0, err
	}
	o, ok := c.calls.Op(ctx, lk.call(opLatchCount, 0), nil)
	if !ok {
		return 0, 0, 0, opError(op, []string{name}, o.Res.Err)
	}
	r, err := latchReply(o.Res)
	if err == nil && (r[0] < 0 || r[1] < 0 || r[2] < 0) {
		err = fmt.Errorf("%w: latch count reply %v", ErrRedis, r)
	}
	if err != nil {
		return 0, 0, 0, fail(ctx, op, []string{name}, err)
	}
	return r[0], r[1], r[2], nil
}

// latchResendFor bounds how long latchDown sends one script again under
// its id: less than the shortest life of the script's record (a
// tombstone, 10 s from its run, which comes after the first send), so
// that every copy it sends finds the record and none counts again.
const latchResendFor = 9 * time.Second

// latchDown counts the latch name (made with init) down by one, never
// below 0, keeping its count ttl; the call that takes it to 0 wakes every
// waiter, in scripts of bounded length. It returns the count after, or
// the stored init when that is another (stored > 0). Each script has an
// id of its own: go-redis's resend of it, and latchDown's own after an
// error that passes (sent again with backoff while ctx lasts, for at most
// a waiter TTL or latchResendFor, whichever is shorter), find the first
// run's reply and act no more.
func (c *Client) latchDown(ctx context.Context, name string, init int64, ttl time.Duration) (count, stored int64, err error) {
	const op = "count down"
	lk, err := c.latchStart(ctx, op, name)
	if err != nil {
		return 0, 0, err
	}
	names := []string{name}
	id, wait := keyspace.NewTicket(), resendFirst
	until := time.Now().Add(min(c.cfg.waiterTTL, latchResendFor))
	for scripts := 0; scripts < maxLatchScripts; {
		o, ok := c.calls.Op(ctx, lk.call(opLatchDown, init, ops.MsArg(ttl), id), nil)
		if !ok {
			return 0, 0, opError(op, names, o.Res.Err)
		}
		r, err := latchReply(o.Res)
		if stored, ok := latchStored(err); ok {
			return 0, stored, nil
		}
		if err == nil && r[0] < 0 {
			err = badCount(r[0])
		}
		if err != nil {
			if transient(err) && time.Now().Before(until) {
				// Sent again under the same id: if the first reached
				// Redis, this one finds its reply.
				if werr := c.pause(ctx, wait); werr != nil {
					return 0, 0, fail(ctx, op, names, err)
				}
				wait = min(2*wait, resendMost)
				continue
			}
			return 0, 0, fail(ctx, op, names, err)
		}
		if o.AckErr != nil {
			return 0, 0, opError(op, names, o.AckErr)
		}
		if r[1] == 0 {
			return r[0], 0, nil
		}
		// Waiters are left to wake: each script further has an id of
		// its own (the count stays 0).
		scripts++
		id, wait = keyspace.NewTicket(), resendFirst
	}
	return 0, 0, nil
}

// pause waits d, or until ctx ends or the client closes (an error then).
func (c *Client) pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return ErrClosed
	}
}

// latchWait waits until the latch name (made with init, its count kept
// ttl) is open: its count is 0. It returns at once when it is; otherwise
// its waiter waits on the latch's condition, registered in Redis, until
// the count down that reaches 0 wakes it through its process's wake list.
// A waiter dropped meanwhile (this process could not refresh it within
// its waiter TTL, or its wake-up was lost) asks again. When ctx ends, or
// the client closes, the waiter withdraws in the background and
// latchWait returns ctx's error (ErrClosed). stored > 0 is the init the
// latch is stored with, when that is another. waiting (when not nil) is
// called each time its waiter is registered in Redis to wait: a
// waitReport's (reportWait), for the client's observer.
func (c *Client) latchWait(ctx context.Context, name string, init int64, ttl time.Duration, waiting func()) (stored int64, err error) {
	const op = "wait latch"
	lk, err := c.latchStart(ctx, op, name)
	if err != nil {
		return 0, err
	}
	wrap := func(err error) error { return opError(op, []string{name}, err) }
	// A close waits for the wait until it returns, so that its waiter has
	// left the condition (or is being withdrawn) by then.
	if !c.hold() {
		return 0, wrap(ErrClosed)
	}
	defer c.unhold()
	p := lk.plan(name)
	cp := p.withCond(latchCond)
	lease, _ := p.leaseArgs(c)
	for {
		// The waiter registers before its script runs, so a wake-up
		// pushed the moment it waits finds it.
		r, w, err := c.enter(p, true)
		if err != nil {
			return 0, wrap(err)
		}
		ticket := w.Ticket
		sent := time.Now()
		callCtx, bound := c.boundByClose(ctx)
		o, ok := c.calls.Op(callCtx, lk.call(opLatchWait, init, ops.MsArg(ttl), ticket, c.id, lease, c.waiterMs), func(callpath.Outcome) {
			// The script may have made the ticket wait after the caller
			// left.
			var report func(error)
			if ctx.Err() == nil {
				report = c.closeReport()
			}
			c.cleanUpReport(ctx, cp.releaseCall(script.OpLeave, ticket, c, true, nil), cp, report)
		})
		bound.done()
		if !ok {
			c.waits.Unregister(r, w)
			return 0, wrap(c.endedByClose(ctx, o.Res.Err))
		}
		rep, err := latchReply(o.Res)
		if stored, ok := latchStored(err); ok {
			c.waits.Unregister(r, w) // (nothing was written)
			return stored, nil
		}
		if err != nil {
			c.waits.Unregister(r, w)
			if !leftAsIs(o.Res.Err) && !fault.IsDialError(err) {
				c.withdraw(ctx, cp, ticket)
			}
			return 0, fail(ctx, op, p.names, err)
		}
		if rep[0] == 0 {
			c.waits.Unregister(r, w)
			return 0, nil
		}
		if o.AckErr != nil {
			c.waits.Unregister(r, w)
			c.withdraw(ctx, cp, ticket)
			return 0, wrap(o.AckErr)
		}
		c.waits.NoteQueued(r, w, time.Duration(rep[2])*time.Millisecond, clock.Sample{Sent: sent, Redis: rep[1]})
		if waiting != nil {
			waiting()
		}
		open, err := c.awaitOpen(ctx, op, cp, r, w)
		if err != nil || open {
			return 0, err
		}
	}
}

// awaitOpen waits for the wake-up of latch waiter w (in room r; cp the
// plan whose "leave" withdraws it). It reports true when the latch opened;
// false when the waiter was dropped and must ask again; or an error:
// Redis failing the room, ctx's end or the client's close (the waiter
// then withdraws in the background).
func (c *Client) awaitOpen(ctx context.Context, op string, cp plan, r *wait.Room, w *wait.Waiter) (bool, error) {
	select {
	case <-w.Ch:
		wk := w.Wk
		switch {
		case wk.Err != nil:
			c.withdraw(ctx, cp, w.Ticket)
			return false, fail(ctx, op, cp.names, wk.Err)
		case wk.Requeue:
			return false, nil
		}
		c.waits.Grants.Add(wk.Via)
		return true, nil
	case <-ctx.Done():
	case <-c.done:
	}
	c.waits.Unregister(r, w)
	if err := ctx.Err(); err != nil {
		c.withdraw(ctx, cp, w.Ticket)
		return false, opError(op, cp.names, err)
	}
	c.withdrawAtClose(ctx, cp, w.Ticket)
	return false, opError(op, cp.names, ErrClosed)
}

package fairlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
)

// Condition variables. A condition is named by its semaphore (in practice
// a mutex: capacity 1) and a condition name; its waiters live in two keys
// of the semaphore's hash tag (see queue.lua). Waiting releases the lease
// and joins the condition in one script; a signal moves the longest waiter
// into the semaphore's queue, behind those already queued, where the
// ordinary grant reaches it on its wake list. While it waits on the
// condition, the ticket is a waiter of its semaphore's room like any
// other: the room's refresh keeps it alive and reports it dropped.

// validateCondName reports whether name can name a condition variable: at
// most [MaxNameLen] bytes of UTF-8 without control characters ("" is the
// default condition). It contacts no server; an invalid name fails with
// [ErrInvalidName].
func validateCondName(name string) error {
	switch {
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: condition name of %d bytes, longer than %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: condition name %q is not valid UTF-8", ErrInvalidName, name)
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return fmt.Errorf("%w: condition name %q contains a control character", ErrInvalidName, name)
	}
	return nil
}

// condKeys returns the keys of condition cond of the semaphore with keys
// k, as the scripts take them after the semaphore's: its waiters (a
// derived key of kind keyspace.KindCond; cond_key in lua/members.lua names it too);
// their deadlines are in the semaphore's :d.
func condKeys(k keyspace.Keys, cond string) []string {
	return []string{k.Derived(keyspace.KindCond, cond)}
}

// withCond returns p (of one semaphore) with condition cond's keys
// declared after the semaphore's.
func (p plan) withCond(cond string) plan {
	p.keys = append(slices.Clip(p.keys), condKeys(p.first().k, cond)...)
	return p
}

// condWait releases the lease and waits on the condition variable cond of
// its semaphore, in one atomic step, so a signal sent after the release is
// never missed. Once signalled, the waiter queues for the semaphore again,
// behind those already queued, and condWait returns the new lease that
// holds it. The lease given is spent whatever happens: on any error
// condWait returns a nil lease and the caller holds nothing.
//
// condWait may return without a signal (a spurious wakeup, as with any
// condition variable), having locked the semaphore again: when its waiter
// was dropped because this process could not refresh it within the waiter
// TTL. Callers check their condition in a loop.
//
// The lease must be of one semaphore, held, and not confirmed lost:
// otherwise condWait fails with [ErrInvalidArgument], [ErrNotHeld], or
// [ErrLeaseLost] (the lease had expired; nothing waits). When ctx ends,
// condWait returns an error matching ctx.Err() within the bounds of
// [Client.Acquire], having left the condition (or the queue; a grant that
// raced the cancellation is handed on) in the background. A closed client
// yields [ErrClosed].
//
// If Redis refuses the wait or cannot be reached (out of memory: a new
// waiter takes memory, and the wait, unlike a release, is not run on a
// full Redis; a dropped or refused connection; TRYAGAIN, LOADING,
// READONLY, BUSY and their kin), condWait releases the lease as
// [Lease.Release] does: the release is sent at once (it runs on a full
// Redis), and sent again in the background after an error that passes,
// until it lands or the lease would have expired, so the next waiter does
// not wait out the lease's TTL; a waiter the wait may have added to the
// condition is withdrawn. It then returns an error matching [ErrRedis]
// that wraps Redis's error and says the lease was released; the lease
// counts as released (its Err matches ErrNotHeld). The error does not
// match ErrNotHeld, which condWait returns only for a lease released
// before the call, nor ErrLeaseLost, unless the release found the lease
// already expired.
//
// Each wait is an acquisition of its own for an [Observer]: the lease
// given ends with LeaseReleased (or LeaseLost), and the wait reports
// WaitStarted once the waiter is on the condition, then Granted with the
// new lease or WaitAbandoned, under a new [Event.ID] that the new
// lease's events carry.
func (l *Lease) condWait(ctx context.Context, cond string) (*Lease, error) {
	c, p := l.c, l.p
	wrap := func(err error) error { return opError("wait", p.names, err) }
	if len(p.parts) != 1 {
		return nil, wrap(fmt.Errorf("%w: a condition variable needs a lease of one semaphore, not %d", ErrInvalidArgument, len(p.parts)))
	}
	if err := validateCondName(cond); err != nil {
		return nil, wrap(err)
	}
	cp := p.withCond(cond)
	l.mu.Lock()
	if l.released {
		closed := l.closedBy
		l.mu.Unlock()
		if closed {
			return nil, wrap(errClosedReleased)
		}
		return nil, wrap(ErrNotHeld)
	}
	l.stopRenewal()
	// A close waits for the wait until it returns (see hold).
	if !c.hold() {
		// The client is closing: the lease goes as its close says.
		l.spendAtClose()
		l.mu.Unlock()
		return nil, wrap(ErrClosed)
	}
	defer c.unhold()
	// The waiter registers before its script runs, so a grant announced
	// the moment it is signalled finds it.
	r, w, err := c.enter(p, true)
	if err != nil {
		// The client is closing: the lease goes as its close says.
		l.spendAtClose()
		l.mu.Unlock()
		return nil, wrap(err)
	}
	// The new lease is an acquisition of its own: its events carry an ID
	// of their own.
	np := p
	if c.cfg.observer != nil {
		np.id = eventIDs.Add(1)
	}
	fresh := w.Ticket
	release := p.releaseCall(script.OpRelease, l.ticket, c, l.announced, l.tokens)
	leave := cp.releaseCall(script.OpLeave, fresh, c, true, nil)
	until := l.expiresBy()
	wait := p.waitCall(cp, l.ticket, c, l.announced, l.tokens, fresh, cond)
	sent := time.Now()
	// Sent while the lease surely lived, a wait that finds no trace of
	// it, nor of the new ticket, knows that an earlier run of this call
	// released it and made the new ticket wait (see below).
	live := sent.Before(until)
	// The call ends at the close too (see boundByClose).
	callCtx, bound := c.boundByClose(ctx)
	o, ok := c.calls.Op(callCtx, wait.Under(ctx), func(callpath.Outcome) {
		// The script may have run, or not: release the lease (a resend
		// finds its tombstone) and withdraw the new ticket. (A caller
		// whose context lasts left because the close ended the call: the
		// close counts this withdrawal, as an acquisition's.)
		var report func(error)
		if ctx.Err() == nil {
			report = c.closeReport()
		}
		c.releaseSpent(ctx, release, p, until)
		c.cleanUpReport(ctx, leave, cp, report)
	})
	bound.done()
	l.released = true
	l.mu.Unlock()
	if !ok {
		c.waits.Unregister(r, w)
		l.finish(errReleased)
		return nil, wrap(c.endedByClose(ctx, o.Res.Err))
	}
	rep, err := ops.ParseWaitReply(o.Res)
	if err != nil {
		c.waits.Unregister(r, w)
		return nil, l.waitFailed(ctx, err, release, until, cp, fresh)
	}
	if rep.More {
		c.pumpLater(p)
	}
	if rep.Result == ops.ReleasedNoTrace && live {
		// A copy of the call whose first run released the lease and made
		// the new ticket wait, which has ended since with no trace (dead,
		// and dropped by a signal or a queue's run): the wait ends as a
		// spurious wakeup does, and locks again.
		c.waits.Unregister(r, w)
		l.finish(errReleased)
		if np.id != 0 {
			c.observeFor(np, Event{Kind: WaitStarted, Names: np.names, ID: np.id})
		}
		return c.acquirePlan(ctx, np, true, sent)
	}
	if rep.Result != 1 {
		c.waits.Unregister(r, w)
		l.finish(ErrLeaseLost)
		return nil, wrap(ErrLeaseLost)
	}
	if o.AckErr != nil {
		// The wait ran on the master alone, and a failover can lose it:
		// the new ticket leaves the condition, and the lease counts as
		// released, as a Release's does then.
		c.waits.Unregister(r, w)
		l.finish(errReleased)
		c.withdraw(ctx, cp, fresh)
		return nil, wrap(fmt.Errorf("%w; the lease was released (on the master), and nothing waits", o.AckErr))
	}
	l.finish(errReleased)
	if np.id != 0 {
		c.observeFor(np, Event{Kind: WaitStarted, Names: np.names, ID: np.id})
	}
	c.waits.NoteQueued(r, w, time.Duration(rep.Next)*time.Millisecond, clock.Sample{Sent: sent, Redis: rep.Now})
	tokens, deadline, again, err := c.awaitGrant(ctx, "wait", p, cp, r, w)
	if again {
		// A spurious wakeup: lock again, as the same acquisition (whose
		// end acquirePlan reports).
		return c.acquirePlan(ctx, np, true, sent)
	}
	var lease *Lease
	if err == nil {
		lease, err = c.newLease(ctx, np, fresh, tokens, deadline, true, leaseBoxes{})
	}
	if np.id != 0 {
		c.observeAcquire(np, sent, lease, err)
	}
	return lease, err
}

// waitFailed ends a condWait whose script failed with err, having run or
// not (see condWait): it releases the lease with the arguments release,
// sending them again in the background until until after an error that
// passes, withdraws the new ticket fresh from the condition (cp's) if the
// script may have added it, and returns condWait's error.
func (l *Lease) waitFailed(ctx context.Context, err error, release script.Call, until time.Time, cp plan, fresh string) error {
	c, p := l.c, l.p
	if !errors.Is(err, ErrRedis) { // a dial error already says it
		err = fmt.Errorf("%w: %w", ErrRedis, err)
	}
	wrap := func(format string, args ...any) error {
		err := fmt.Errorf("%w; "+format, append([]any{err}, args...)...)
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w (%w)", err, ctxErr)
		}
		return opError("wait", p.names, err)
	}
	if fault.IsDialError(err) {
		// The call's late clean-up (run in the background, see call)
		// releases the lease (and sends the release again) and withdraws
		// the ticket.
		l.finish(errReleased)
		return wrap("the lease was released: the release is sent in the background until it lands or the lease would have expired")
	}
	// The wait was sent before now: if now the lease surely lives, it
	// did then, and a release that finds no trace of it knows the wait
	// released it.
	live := time.Now().Before(until)
	if !leftAsIs(err) {
		// The script may have run, and added the new ticket: the
		// connection failed once the command was sent, or Redis refused
		// a resend of a try that ran (only a fairlock script's own
		// refusal says that nothing was written).
		c.withdraw(ctx, cp, fresh)
	}
	o, ok := c.calls.Op(ctx, release, func(o callpath.Outcome) {
		if _, err := c.released(p, o.Res); transient(err) || cutShort(err) {
			c.resendLater(release, p, until)
		}
	})
	if !ok {
		l.finish(errReleased)
		return wrap("the lease was released: the release goes on in the background")
	}
	n, rerr := c.released(p, o.Res)
	n = ops.ReleaseResult(n, live)
	switch {
	case rerr == nil && n == 1:
		l.finish(errReleased)
		return wrap("the lease was released")
	case rerr == nil:
		l.finish(ErrLeaseLost)
		return wrap("%w: the lease had expired", ErrLeaseLost)
	case transient(rerr):
		if !fault.IsDialError(rerr) { // (then the call's late handler sends it again)
			c.resendLater(release, p, until)
		}
		l.finish(errReleased)
		return wrap("the lease was released: its release met %v and is sent again in the background until it lands or the lease would have expired", rerr)
	}
	l.finish(fmt.Errorf("%w: the wait and its release failed, the lease is no longer renewed: %w", ErrLeaseLost, rerr))
	return wrap("its release failed too (%v): the lease is no longer renewed, and its permits return when its TTL runs out", rerr)
}

// maxSignalScripts bounds the scripts one signal or broadcast runs (each
// drops or wakes up to the script budget).
const maxSignalScripts = 100000

// signal wakes the longest waiter of the condition variable cond of the
// semaphore name, if any (or, all, every waiter that waited when it was
// called, in the order they began to wait, in several scripts of bounded
// length): each moves to the semaphore's queue, behind those already
// queued. Waiters whose process died (their waiter TTL passed unrefreshed)
// are dropped on the way, never woken. It needs no lease and returns how
// many waiters it woke (on an error, how many it had woken before).
// Package semaphore's Cond.Signal and Cond.Broadcast are its face.
//
// An invalid name fails with [ErrInvalidName]. When ctx ends first, signal
// returns an error matching ctx.Err(); the signal may have been delivered
// or not. A Redis that cannot be reached yields [ErrRedis], a closed
// client [ErrClosed]; so does a signal on its way when the client closes
// (delivered or not), which the close ends as it ends an acquisition.
func (c *Client) signal(ctx context.Context, name, cond string, all bool) (int, error) {
	op := "signal"
	if all {
		op = "broadcast"
	}
	wrap := func(err error) error { return opError(op, []string{name}, err) }
	k, err := c.keys(name)
	if err == nil {
		err = validateCondName(cond)
	}
	if err != nil {
		return 0, wrap(err)
	}
	if c.isClosed() {
		return 0, wrap(ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return 0, wrap(err)
	}
	p := plan{parts: []part{{k: k, req: Request{Name: name}}}, keys: k.List(), names: []string{name}}
	keys := p.withCond(cond).keys
	bound := ""
	total := 0
	for range maxSignalScripts {
		// Each script has an id of its own, which a resend (go-redis's)
		// carries too: the resend finds the first run's reply.
		// The call ends at the close too (see boundByClose).
		callCtx, closeBound := c.boundByClose(ctx)
		o, ok := c.calls.Op(callCtx, ops.SignalCall(keys, cond, all, bound, keyspace.NewTicket()).Under(ctx), nil)
		closeBound.done()
		if !ok {
			return total, wrap(c.endedByClose(ctx, o.Res.Err))
		}
		rep, err := ops.ParseSignalReply(o.Res)
		if err != nil {
			return total, fail(ctx, op, p.names, err)
		}
		bound = rep.Bound
		total += int(rep.Woken)
		if rep.More {
			c.pumpLater(p)
		}
		if o.AckErr != nil {
			// Woken on the master alone: a failover can lose the
			// wake-ups.
			return total, wrap(o.AckErr)
		}
		if !rep.CondMore || (!all && total > 0) {
			break
		}
	}
	return total, nil
}

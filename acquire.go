package fairlock

import (
	"context"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// acquire runs Acquire (mayWait) and TryAcquire (!mayWait) for one or more
// semaphores.
func (c *Client) acquire(ctx context.Context, reqs []Request, mayWait bool) (*Lease, error) {
	p, err := c.plan(reqs)
	if err != nil {
		names := make([]string, len(reqs))
		for i, r := range reqs {
			names[i] = r.Name
		}
		if !mayWait {
			return nil, opError("try acquire", names, err)
		}
		return nil, opError("acquire", names, err)
	}
	if c.cfg.observer != nil {
		p.id = eventIDs.Add(1)
	}
	return c.acquirePlan(ctx, p, mayWait, time.Time{})
}

// acquirePlan acquires p's semaphores: it runs acquire for a plan made and
// given its event ID (p.id, 0 when unobserved). queued is when the
// request began to wait, if it did before (its WaitStarted reported): a
// condition's waiter that queues again.
func (c *Client) acquirePlan(ctx context.Context, p plan, mayWait bool, queued time.Time) (lease *Lease, err error) {
	op, mode := "acquire", script.OpAcquire
	if !mayWait {
		op, mode = "try acquire", script.OpTry
	}
	if p.id != 0 {
		defer func() { c.observeAcquire(p, queued, lease, err) }()
	}
	wrap := func(err error) error { return opError(op, p.names, err) }
	// A wait for permits that a lease of ctx holds would wait on itself:
	// refused before anything is sent. (The check reads those leases'
	// clocks, which may end them, and ctx with them: so it comes first.)
	var dead error
	if mayWait {
		dead = c.deadlock(ctx, op, p)
	}
	// A done context wins over permits that happen to be free, as in
	// golang.org/x/sync/semaphore.
	if err := ctx.Err(); err != nil {
		return nil, wrap(err)
	}
	if dead != nil {
		return nil, dead
	}
	// A close waits for the acquisition until it returns, so that a ticket
	// it queued has left its queue (or is being withdrawn by a goroutine the
	// close waits for) by then.
	if !c.hold() {
		return nil, wrap(ErrClosed)
	}
	defer c.unhold()
	for {
		// A waiter registers before its script runs, so a grant announced
		// the moment it is queued finds it.
		r, w, err := c.enter(p, mayWait)
		if err != nil {
			return nil, wrap(err)
		}
		sent := time.Now()
		ticket := w.Ticket
		// The call ends at the close as well as with ctx, so that neither
		// its caller nor the Redis client's retries (a Cluster client
		// tries a command four times, each try waiting out its read
		// timeout when Redis stalls) outlast the close's bound: needed
		// only when ctx may outlast that bound (one waiter TTL from the
		// close). A call under a context that cannot end runs as it
		// comes, on its caller's goroutine (through a batching client,
		// alone: a batch holding it could hold its group); a close waits
		// for it until its bound only, and says so.
		callCtx, bound := c.boundByClose(ctx)
		o, ok := c.calls.Op(callCtx, p.acquireCall(mode, ticket, w.Box, c).Under(ctx), func(callpath.Outcome) {
			// The script may have queued or granted the ticket after the
			// caller left, or before its reply was lost. (A caller whose
			// context lasts left because the close ended the call: the
			// close counts this withdrawal.)
			var report func(error)
			if ctx.Err() == nil {
				report = c.closeReport()
			}
			c.cleanUpReport(ctx, p.releaseCall(script.OpLeave, ticket, c, true, nil), p, report)
		})
		bound.done()
		if !ok {
			c.waits.Unregister(r, w)
			return nil, wrap(c.endedByClose(ctx, o.Res.Err))
		}
		rep, err := ops.ParseAcquireReply(o.Res, len(p.parts))
		if err != nil {
			c.waits.Unregister(r, w)
			if !leftAsIs(o.Res.Err) && !fault.IsDialError(err) {
				// The script may have run before the failure was seen,
				// or ran and answered what this release cannot read.
				c.withdraw(ctx, p, w.Ticket)
			}
			return nil, fail(ctx, op, p.names, err)
		}
		switch rep.Code {
		case ops.AcqGranted, ops.AcqGrantedBefore:
			c.waits.Unregister(r, w)
			if rep.Grant.Expiry <= rep.Now {
				// Granted by a run whose reply was lost, and expired
				// since: ask again.
				c.waits.Grants.GaveBack()
				c.withdraw(ctx, p, w.Ticket)
				continue
			}
			if o.AckErr != nil {
				// Granted on the master only: give it back.
				c.giveBack(ctx, p, w.Ticket, rep.Grant.Tokens)
				return nil, wrap(o.AckErr)
			}
			// A grant found by a resend lasts only the waiter TTL until
			// confirmed, like an announced one.
			deadline := clock.Sample{Sent: sent, Redis: rep.Now}.LocalDeadline(rep.Grant.Expiry)
			c.waits.Grants.Add(wait.ViaReply)
			return c.newLease(ctx, p, w.Ticket, rep.Grant.Tokens, deadline, rep.Code == ops.AcqGrantedBefore, leaseBoxes{w.Box, rep.Grant.Tok0})
		case ops.AcqNotGranted:
			c.waits.Unregister(r, w)
			return nil, wrap(ErrNotAcquired)
		case ops.AcqEnded:
			// A resend found this request's grant over: ask again.
			c.waits.Unregister(r, w)
			continue
		}
		// Queued.
		if o.AckErr != nil {
			c.waits.Unregister(r, w)
			c.withdraw(ctx, p, w.Ticket)
			return nil, wrap(o.AckErr)
		}
		if queued.IsZero() {
			queued = sent
			c.observeFor(p, Event{Kind: WaitStarted, Names: p.names, ID: p.id})
		}
		c.waits.NoteQueued(r, w, time.Duration(rep.Next)*time.Millisecond, clock.Sample{Sent: sent, Redis: rep.Now})
		tokens, deadline, again, err := c.awaitGrant(ctx, op, p, p, r, w)
		switch {
		case err != nil:
			return nil, err
		case again:
			continue
		}
		return c.newLease(ctx, p, w.Ticket, tokens, deadline, true, leaseBoxes{ticket: w.Box})
	}
}

// awaitGrant waits for the grant of waiter w, queued in room r for p's
// semaphores (op and p name them in errors; leave is the plan whose
// "leave" withdraws the ticket: p, or p with a condition's keys). It
// returns the grant's tokens and the local deadline of its lease; again
// when the caller must ask anew (the ticket was dropped while this process
// could not refresh it, or the grant was heard too late and given back);
// or an *Error: Redis failing the room, a malformed grant, ctx's end, or
// the client closing (the ticket then leaves atomically, a grant that
// raced it handed on).
func (c *Client) awaitGrant(ctx context.Context, op string, p, leave plan, r *wait.Room, w *wait.Waiter) (tokens []int64, deadline time.Time, again bool, err error) {
	select {
	case <-w.Ch:
		wk := w.Wk
		switch {
		case wk.Err != nil:
			c.withdraw(ctx, leave, w.Ticket)
			return nil, time.Time{}, false, fail(ctx, op, p.names, wk.Err)
		case wk.Requeue:
			// The ticket was dropped while this process could not
			// refresh it (paused, or Redis lost it).
			return nil, time.Time{}, true, nil
		case len(wk.Grant.Tokens) != len(p.parts):
			c.withdraw(ctx, leave, w.Ticket)
			return nil, time.Time{}, false, opError(op, p.names,
				fmt.Errorf("%w: a grant with %d tokens for %d semaphores", ErrRedis, len(wk.Grant.Tokens), len(p.parts)))
		}
		// The lease counts from Redis's grant, not from when this process
		// heard of it.
		deadline := c.waits.ClockOf(r, wk).LocalDeadline(wk.Grant.Expiry)
		if !time.Now().Before(deadline) {
			// This process stalled past the grant: Redis may have expired
			// it and handed it on. Give it back if it has not.
			c.waits.Grants.GaveBack()
			c.withdraw(ctx, leave, w.Ticket)
			return nil, time.Time{}, true, nil
		}
		c.waits.Grants.Add(wk.Via)
		return wk.Grant.Tokens, deadline, false, nil
	case <-ctx.Done():
	case <-c.done:
	}
	c.waits.Unregister(r, w)
	if ctx.Err() != nil {
		c.withdraw(ctx, leave, w.Ticket)
	} else {
		c.withdrawAtClose(ctx, leave, w.Ticket)
	}
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, false, opError(op, p.names, err)
	}
	return nil, time.Time{}, false, opError(op, p.names, ErrClosed)
}

// observeAcquire reports how an acquisition ended: granted, or, if it had
// queued, abandoned.
func (c *Client) observeAcquire(p plan, queued time.Time, lease *Lease, err error) {
	var wait time.Duration
	if !queued.IsZero() {
		wait = time.Since(queued)
	}
	switch {
	case lease != nil:
		c.observeFor(p, Event{Kind: Granted, Names: p.names, Wait: wait, ID: p.id})
	case !queued.IsZero():
		c.observeFor(p, Event{Kind: WaitAbandoned, Names: p.names, Wait: wait, Err: err, ID: p.id})
	}
}

package fairlock

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/script"
)

// acquire runs Acquire (wait) and TryAcquire (!wait) for one or more
// semaphores.
func (c *Client) acquire(ctx context.Context, reqs []Request, wait bool) (*Lease, error) {
	p, err := c.plan(reqs)
	if err != nil {
		names := make([]string, len(reqs))
		for i, r := range reqs {
			names[i] = r.Name
		}
		if !wait {
			return nil, opError("try acquire", names, err)
		}
		return nil, opError("acquire", names, err)
	}
	if c.cfg.observer != nil {
		p.id = eventIDs.Add(1)
	}
	return c.acquirePlan(ctx, p, wait, time.Time{})
}

// acquirePlan acquires p's semaphores: it runs acquire for a plan made and
// given its event ID (p.id, 0 when unobserved). queued is when the
// request began to wait, if it did before (its WaitStarted reported): a
// condition's waiter that queues again.
func (c *Client) acquirePlan(ctx context.Context, p plan, wait bool, queued time.Time) (lease *Lease, err error) {
	op, mode := "acquire", script.OpAcquire
	if !wait {
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
	if wait {
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
		r, w, err := c.waits.register(p, wait)
		if err != nil {
			return nil, wrap(err)
		}
		sent := time.Now()
		ticket := w.ticket
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
		o, ok := c.calls.Op(callCtx, p.acquireCall(mode, ticket, c).Under(ctx), func(callpath.Outcome) {
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
			c.waits.unregister(r, w)
			return nil, wrap(c.endedByClose(ctx, o.Res.Err))
		}
		rep, err := parseAcquireReply(o.Res, len(p.parts))
		if err != nil {
			c.waits.unregister(r, w)
			if !fault.IsDialError(err) { // (then the call's late clean-up withdraws)
				// The script may have run before the failure was seen,
				// or ran and answered what this release cannot read.
				c.withdraw(ctx, p, w.ticket)
			}
			return nil, fail(ctx, op, p.names, err)
		}
		switch rep.code {
		case acqGranted, acqGrantedBefore:
			c.waits.unregister(r, w)
			if rep.g.expiry <= rep.now {
				// Granted by a run whose reply was lost, and expired
				// since: ask again.
				c.waits.grants.gaveBack()
				c.withdraw(ctx, p, w.ticket)
				continue
			}
			if o.AckErr != nil {
				// Granted on the master only: give it back.
				c.giveBack(ctx, p, w.ticket, rep.g.tokens)
				return nil, wrap(o.AckErr)
			}
			// A grant found by a resend lasts only the waiter TTL until
			// confirmed, like an announced one.
			deadline := clock.Sample{Sent: sent, Redis: rep.now}.LocalDeadline(rep.g.expiry)
			c.waits.grants.add(viaReply)
			return c.newLease(ctx, p, w.ticket, rep.g.tokens, deadline, rep.code == acqGrantedBefore)
		case acqNotGranted:
			c.waits.unregister(r, w)
			return nil, wrap(ErrNotAcquired)
		case acqEnded:
			// A resend found this request's grant over: ask again.
			c.waits.unregister(r, w)
			continue
		}
		// Queued.
		if o.AckErr != nil {
			c.waits.unregister(r, w)
			c.withdraw(ctx, p, w.ticket)
			return nil, wrap(o.AckErr)
		}
		if queued.IsZero() {
			queued = sent
			c.observe(Event{Kind: WaitStarted, Names: p.names, Permits: p.permits(), ID: p.id})
		}
		c.waits.noteQueued(r, w, time.Duration(rep.next)*time.Millisecond, clock.Sample{Sent: sent, Redis: rep.now})
		tokens, deadline, again, err := c.awaitGrant(ctx, op, p, p, r, w)
		switch {
		case err != nil:
			return nil, err
		case again:
			continue
		}
		return c.newLease(ctx, p, w.ticket, tokens, deadline, true)
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
func (c *Client) awaitGrant(ctx context.Context, op string, p, leave plan, r *room, w *waiter) (tokens []int64, deadline time.Time, again bool, err error) {
	select {
	case wk := <-w.ch:
		switch {
		case wk.err != nil:
			c.withdraw(ctx, leave, w.ticket)
			return nil, time.Time{}, false, fail(ctx, op, p.names, wk.err)
		case wk.requeue:
			// The ticket was dropped while this process could not
			// refresh it (paused, or Redis lost it).
			return nil, time.Time{}, true, nil
		case len(wk.grant.tokens) != len(p.parts):
			c.withdraw(ctx, leave, w.ticket)
			return nil, time.Time{}, false, opError(op, p.names,
				fmt.Errorf("%w: a grant with %d tokens for %d semaphores", ErrRedis, len(wk.grant.tokens), len(p.parts)))
		}
		// The lease counts from Redis's grant, not from when this process
		// heard of it.
		deadline := c.waits.clockOf(r, wk).LocalDeadline(wk.grant.expiry)
		if !time.Now().Before(deadline) {
			// This process stalled past the grant: Redis may have expired
			// it and handed it on. Give it back if it has not.
			c.waits.grants.gaveBack()
			c.withdraw(ctx, leave, w.ticket)
			return nil, time.Time{}, true, nil
		}
		c.waits.grants.add(wk.via)
		return wk.grant.tokens, deadline, false, nil
	case <-ctx.Done():
	case <-c.done:
	}
	c.waits.unregister(r, w)
	if ctx.Err() != nil {
		c.withdraw(ctx, leave, w.ticket)
	} else {
		c.withdrawAtClose(ctx, leave, w.ticket)
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
		c.observe(Event{Kind: Granted, Names: p.names, Permits: p.permits(), Wait: wait, ID: p.id})
	case !queued.IsZero():
		c.observe(Event{Kind: WaitAbandoned, Names: p.names, Permits: p.permits(), Wait: wait, Err: err, ID: p.id})
	}
}

// withdraw takes ticket out of p's semaphores, whether it waits or has just
// been granted. It returns by ctx's end; the withdrawal goes on in the
// background for up to one waiter TTL (see letGo). If Redis cannot be
// reached meanwhile, the ticket dies on its own: a waiter at its liveness
// deadline, a grant when its lease expires.
func (c *Client) withdraw(ctx context.Context, p plan, ticket string) {
	c.letGo(ctx, p.releaseCall(script.OpLeave, ticket, c, true, nil), p, nil)
}

// withdrawAtClose is withdraw for an acquisition that the client's close
// ended (a wait, or a grant that raced the close): a withdrawal that does
// not land counts in the close's error.
func (c *Client) withdrawAtClose(ctx context.Context, p plan, ticket string) {
	c.letGo(ctx, p.releaseCall(script.OpLeave, ticket, c, true, nil), p, c.closeReport())
}

// closeReport returns, once a close has begun, how a withdrawal that the
// close made is reported to it (counted in its error if it does not land);
// nil before.
func (c *Client) closeReport() func(error) {
	c.mu.Lock()
	s := c.shut
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	s.withdrawals.Add(1)
	return s.failWithdrawal
}

// resendCloseReport returns, once a close has begun, how a release or
// withdrawal sent again in the background, which the close bounds, is
// reported to it if it does not land; nil before.
func (c *Client) resendCloseReport() func(error) {
	c.mu.Lock()
	s := c.shut
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	s.resends.Add(1)
	return s.failResend
}

// giveBack releases a grant its caller will not use, like withdraw.
func (c *Client) giveBack(ctx context.Context, p plan, ticket string, tokens []int64) {
	c.letGo(ctx, p.releaseCall(script.OpRelease, ticket, c, false, tokens), p, nil)
}

// letGo runs oc (release.lua's) on p's semaphores, best effort, and
// waits for it while ctx lasts, and a grace beyond. The script runs on a goroutine of the
// client's (Close waits for it) under a context of its own that outlives
// the caller's by up to one waiter TTL; once ctx ends (or if it already
// has) and the grace passes, letGo returns and the call finishes in the background. A command
// already sent to a Redis that does not answer can hold that goroutine up
// to go-redis's ReadTimeout, which go-redis applies whatever the context.
// If report is not nil, it is passed why oc did not land (see cleanUpReport).
func (c *Client) letGo(ctx context.Context, oc script.Call, p plan, report func(error)) {
	if ctx.Done() == nil {
		c.cleanUpReport(ctx, oc, p, report)
		return
	}
	done := make(chan struct{})
	c.spawn(func() {
		defer close(done)
		c.cleanUpReport(ctx, oc, p, report)
	})
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(callpath.Grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// cleanUp runs oc (release.lua's) on p's semaphores, best effort, under
// a context that outlives ctx by up to one waiter TTL (and, once a close
// has ended the client's leases, ends by that close's bound). It blocks; callers
// that must not, run it through letGo or as a late outcome of call.
func (c *Client) cleanUp(ctx context.Context, oc script.Call, p plan) {
	c.cleanUpReport(ctx, oc, p, nil)
}

// cleanUpReport is cleanUp that, if report is not nil, passes it why oc
// did not land: failed, or, sent again in the background, failed for
// good or given up.
func (c *Client) cleanUpReport(ctx context.Context, oc script.Call, p plan, report func(error)) {
	// One waiter TTL, counted from a close's end of the client's work at
	// the latest (see cleanUpBy), so that the close's bound holds.
	by := c.cleanUpBy()
	if !time.Now().Before(by) {
		// A call that outlasted the close's bound hands its clean-up
		// over too late: nothing may be sent past the bound. The ticket
		// ends at its deadline.
		c.logf(slog.LevelWarn, "fairlock: clean-up came past the close's bound; Redis drops the ticket at its deadline", p.names, "",
			slog.String("op", oc.Op.Name))
		return
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), by)
	defer cancel()
	res, _ := c.calls.Run(ctx, oc)
	if _, err := c.released(p, res); transient(err) && !unreachable(err) {
		// It did not reach Redis: send it again until the ticket would
		// have been dropped anyway. (A Redis that refuses connections, or
		// whose name does not resolve, is not there to send it to; the
		// ticket ends at its deadline.)
		c.resendReport(oc, p, by, report, err)
	} else if err != nil {
		if report != nil {
			report(err)
		}
		c.logf(slog.LevelWarn, "fairlock: clean-up failed; Redis drops the ticket at its deadline", p.names, "",
			slog.String("op", oc.Op.Name), slog.Any("error", err))
	}
}

// boundByClose returns the context a call's script call (an acquisition's,
// a condition wait's, a signal's) runs under: ctx, ended by the client's
// close as well when ctx may outlast the close's bound (see boundBy).
func (c *Client) boundByClose(ctx context.Context) (context.Context, closeBound) {
	return c.boundBy(ctx, c.closing)
}

// boundBy returns the context a call's script call runs under: ctx, ended
// by end as well (the client's close, or, for a release, the close's end
// of the leases: see Client.renewing) when ctx may outlast the close's
// bound (see mayOutlastClose; a nil end: none), so that neither the caller nor the Redis
// client's retries (a Cluster client tries a command four times, each try
// waiting out its read timeout when Redis stalls) nor a Backend that
// returns only by its context's end outlast that bound; its done releases
// it once the call has returned. Through go-redis, a call under a context
// that cannot end runs as it comes, each try bounded by the read timeout
// (a close waits for it until its bound and the read timeout only, and
// says so).
func (c *Client) boundBy(ctx, end context.Context) (context.Context, closeBound) {
	if end == nil || !c.mayOutlastClose(ctx) {
		return ctx, closeBound{}
	}
	callCtx, cancel := context.WithCancel(ctx)
	return callCtx, closeBound{end: cancel, unhook: context.AfterFunc(end, cancel)}
}

// A closeBound ends a call's context at the client's close (boundBy).
type closeBound struct {
	end    context.CancelFunc
	unhook func() bool
}

// done releases what boundBy set up, once the call has returned.
func (b closeBound) done() {
	if b.end != nil {
		b.unhook()
		b.end()
	}
}

// endedByClose returns the error of a call whose script call failed with
// err under boundByClose's context: ErrClosed when the close, not ctx,
// ended it.
func (c *Client) endedByClose(ctx context.Context, err error) error {
	return c.endedBy(ctx, c.closing, err)
}

// endedBy returns the error of a call whose script call failed with err
// under boundBy's context for end: ErrClosed when end (the close), not
// ctx, ended it.
func (c *Client) endedBy(ctx, end context.Context, err error) error {
	if end != nil && ctx.Err() == nil && end.Err() != nil {
		return fmt.Errorf("%w: the call was on its way to Redis", ErrClosed)
	}
	return err
}

// mayOutlastClose reports whether a call under ctx may last longer than
// a close begun now would wait (one waiter TTL): ctx can end, with no
// deadline or a later one; or ctx cannot end and the Backend returns only
// by its context's end (backend.Info.Deadlines: rueidis, valkey-go), so
// that nothing but the close's end of it bounds a call to a Redis that
// does not answer. (Through go-redis, the read timeout bounds each try of
// a call under a context that cannot end, on its caller's goroutine.)
func (c *Client) mayOutlastClose(ctx context.Context) bool {
	if ctx.Done() == nil {
		return c.info.Deadlines
	}
	dl, ok := ctx.Deadline()
	return !ok || dl.After(time.Now().Add(c.cfg.waiterTTL))
}

// maxPumps bounds the scripts one background pump runs for one semaphore;
// whatever is left then is done by the waiters' own refreshes.
const maxPumps = 10000

// pumpLater finishes, in the background, the work a script left on p's
// semaphores: each "pump" script does a bounded part of it. One pump runs
// per semaphore at a time; Close waits for it.
func (c *Client) pumpLater(p plan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for _, pt := range p.parts {
		k := pt.k
		if c.pumping[k.base] {
			continue
		}
		c.pumping[k.base] = true
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer func() {
				c.mu.Lock()
				delete(c.pumping, k.base)
				c.mu.Unlock()
			}()
			for range maxPumps {
				select {
				case <-c.done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), c.cfg.waiterTTL)
				res, _ := c.calls.Run(ctx, pumpCall(k.list()))
				cancel()
				more, err := parsePumpReply(res)
				if err != nil || !more {
					return
				}
			}
		}()
	}
}

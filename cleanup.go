package fairlock

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
)

// What follows a call, below the operations that make it (acquire.go,
// lease.go, cond.go, latch.go, barrier.go, close.go): a release's reply
// read and the work its script left for later pumped in the background;
// a ticket withdrawn, a grant given back, a release let go on in the
// background when its caller's context ends; and the bound a Close puts
// on a call and on everything that follows it; and the resends of what a
// passing error left unsure.

// released reads release.lua's reply {result, more}; when the script left
// work for later (a long queue to grant, many leases to purge), it has the
// rest done in the background.
func (c *Client) released(p plan, out script.Result) (int64, error) {
	res, err := out.Slice()
	var n, more int64
	if err == nil {
		n, err = script.Reply(res).Int(0)
	}
	if err == nil {
		more, err = script.Reply(res).Int(1)
	}
	if err == nil && more == 1 {
		c.pumpLater(p)
	}
	return n, err
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
	return c.boundBy(ctx, c.closeEnds)
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
func (c *Client) boundBy(ctx context.Context, end *callpath.Ends) (context.Context, closeBound) {
	if end == nil || !c.mayOutlastClose(ctx) {
		return ctx, closeBound{}
	}
	callCtx, cancel := context.WithCancel(ctx)
	return callCtx, closeBound{end: cancel, ends: end, slot: end.Add(cancel)}
}

// A closeBound ends a call's context at the client's close (boundBy).
type closeBound struct {
	end  context.CancelFunc
	ends *callpath.Ends // where end is registered, in slot
	slot callpath.Slot
}

// done releases what boundBy set up, once the call has returned.
func (b closeBound) done() {
	if b.end != nil {
		b.ends.Remove(b.slot)
		b.end()
	}
}

// endedByClose returns the error of a call whose script call failed with
// err under boundByClose's context: ErrClosed when the close, not ctx,
// ended it.
func (c *Client) endedByClose(ctx context.Context, err error) error {
	return c.endedBy(ctx, c.closeEnds, err)
}

// endedBy returns the error of a call whose script call failed with err
// under boundBy's context for end: ErrClosed when end (the close), not
// ctx, ended it.
func (c *Client) endedBy(ctx context.Context, end *callpath.Ends, err error) error {
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
// semaphores (pump).
func (c *Client) pumpLater(p plan) {
	for _, pt := range p.parts {
		c.pump(pt.k)
	}
}

// pump finishes, in the background, the work a script left on the
// semaphore of keys k: each "pump" script does a bounded part of it. One
// pump runs per semaphore at a time; Close waits for it.
func (c *Client) pump(k keyspace.Keys) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.pumping[k.Base] {
		return
	}
	c.pumping[k.Base] = true
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() {
			c.mu.Lock()
			delete(c.pumping, k.Base)
			c.mu.Unlock()
		}()
		for range maxPumps {
			select {
			case <-c.done:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.waiterTTL)
			res, _ := c.calls.Run(ctx, ops.PumpCall(k.List()))
			cancel()
			more, err := ops.ParsePumpReply(res)
			if err != nil || !more {
				return
			}
		}
	}()
}

// Resends back off from resendFirst, doubling up to resendMost, with
// jitter.
const (
	resendFirst = 10 * time.Millisecond
	resendMost  = 500 * time.Millisecond
)

// resendLater sends oc (a release or a leave, which tombstones and queue
// marks make safe to send twice) on p's semaphores again in the
// background, with backoff, until it lands, fails for good, or until
// (when the lease would have expired, or the waiter been dropped, anyway).
// Close waits for it, at most a waiter TTL past Close.
func (c *Client) resendLater(oc script.Call, p plan, until time.Time) {
	c.resendReport(oc, p, until, nil, nil)
}

// resendReport is resendLater that, if report is not nil, passes it why
// oc did not land (failed for good, or given up at until; last is the
// error of the send before this one, if any) before it logs so. Without
// report, a resend that the client's close finds on its way reports to
// the close (see resendCloseReport).
func (c *Client) resendReport(oc script.Call, p plan, until time.Time, report func(error), last error) {
	c.spawn(func() {
		done := c.done
		wait := resendFirst
		for attempt := 1; ; attempt++ {
			left := time.Until(until)
			if left <= 0 {
				if report != nil {
					if last == nil {
						last = fmt.Errorf("%w: no time left to send it again", context.DeadlineExceeded)
					}
					report(last)
				}
				c.logf(slog.LevelWarn, "fairlock: gave up sending again; Redis ends it at its deadline", p.names, "",
					slog.String("op", oc.Op.Name), slog.Int("attempts", attempt-1))
				return
			}
			t := time.NewTimer(min(wait+rand.N(wait), left))
			select {
			case <-t.C:
			case <-done:
				t.Stop()
				// Closing: the remaining tries get a waiter TTL at most,
				// and end by the close's bound; if they do not land,
				// the close says so (unless the caller reports it).
				until = minTime(until, c.cleanUpBy())
				if report == nil {
					report = c.resendCloseReport()
				}
				done = nil // closed for good: from now on the timer alone
				continue
			}
			// A try on its way when the close begins ends there, and the
			// next one (within the close's bound, above) goes instead: a
			// try under the lease's deadline could hold the close as long.
			ctx, cancel := context.WithDeadline(context.Background(), until)
			unhook := func() bool { return true }
			if done != nil { // (the close not seen yet)
				unhook = context.AfterFunc(c.closing, cancel)
			}
			res, _ := c.calls.Run(ctx, oc)
			_, err := c.released(p, res)
			closed := !unhook() // the close ended this try
			cancel()
			if closed && err != nil {
				last = err
				continue
			}
			if err == nil || !transient(err) {
				if err != nil {
					if report != nil {
						report(err)
					}
					c.logf(slog.LevelWarn, "fairlock: sending again failed; Redis ends it at its deadline", p.names, "",
						slog.String("op", oc.Op.Name), slog.Any("error", err))
				}
				return
			}
			last = err
			wait = min(2*wait, resendMost)
		}
	})
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

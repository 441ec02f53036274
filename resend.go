package fairlock

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/fairlock/fairlock/internal/script"
)

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

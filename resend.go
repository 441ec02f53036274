package fairlock

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"
)

// transient reports whether err, from a script call, is one that passes:
// the call was refused or lost on its way (a connection dropped or
// refused, a Cluster slot migrating or moved, a server loading its data,
// a replica promoted or demoted, a cluster or master down, a server busy
// with a script) and sending it again later may land. A script's own
// error reply (FAIRLOCK_..., a wrong key type), out-of-memory and a closed
// go-redis client are not: sending again gives the same answer.
func transient(err error) bool {
	if err == nil {
		return false
	}
	if msg, ok := replyOf(err); ok {
		for _, p := range []string{"TRYAGAIN", "LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "MOVED", "ASK", "BUSY", "NOREPLICAS"} {
			if strings.HasPrefix(msg, p+" ") || msg == p {
				return true
			}
		}
		return false
	}
	var nerr net.Error
	return errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, context.DeadlineExceeded)
}

// cutShort reports whether err is a context's: a call cut short by its
// caller's context, which may not have been sent at all (go-redis checks
// the context before it sends).
func cutShort(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
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
func (c *Client) resendLater(oc opCall, p plan, until time.Time) {
	c.spawn(func() {
		done := c.done
		wait := resendFirst
		for attempt := 1; ; attempt++ {
			left := time.Until(until)
			if left <= 0 {
				c.logf(slog.LevelWarn, "fairlock: gave up sending again; Redis ends it at its deadline", p.names, "",
					slog.String("op", oc.op.name), slog.Int("attempts", attempt-1))
				return
			}
			t := time.NewTimer(min(wait+rand.N(wait), left))
			select {
			case <-t.C:
			case <-done:
				t.Stop()
				// Closing: the remaining tries get a waiter TTL at most.
				until = minTime(until, time.Now().Add(c.cfg.waiterTTL))
				done = nil // closed for good: from now on the timer alone
				continue
			}
			ctx, cancel := context.WithDeadline(context.Background(), until)
			res, _ := c.calls.run(ctx, oc)
			_, err := c.released(p, res)
			cancel()
			if err == nil || !transient(err) {
				if err != nil {
					c.logf(slog.LevelWarn, "fairlock: sending again failed; Redis ends it at its deadline", p.names, "",
						slog.String("op", oc.op.name), slog.Any("error", err))
				}
				return
			}
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

// slow reports whether err says Redis or the connection pool answered too
// slowly, rather than that Redis could not be reached.
func slow(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errPoolTimeout) ||
		(errors.As(err, &ne) && ne.Timeout())
}

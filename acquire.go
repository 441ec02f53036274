package fairlock

import (
	"context"
	"fmt"
	"time"
)

// acquire runs Acquire (wait) and TryAcquire (!wait).
func (c *Client) acquire(ctx context.Context, req Request, wait bool) (*Lease, error) {
	op, mode := "acquire", "acquire"
	if !wait {
		op, mode = "try acquire", "try"
	}
	wrap := func(err error) error { return fmt.Errorf("fairlock: %s %q: %w", op, req.Name, err) }
	k, err := c.check(req)
	if err != nil {
		return nil, err
	}
	// A done context wins over permits that happen to be free, as in
	// golang.org/x/sync/semaphore.
	if err := ctx.Err(); err != nil {
		return nil, wrap(err)
	}
	for {
		// A waiter registers before its script runs, so a grant announced
		// the moment it is queued finds it.
		r, w, err := c.register(k, req.Permits, wait)
		if err != nil {
			return nil, wrap(err)
		}
		start := time.Now()
		res, err := acquireScript.Run(ctx, c.rdb, k.list(), mode, w.ticket, req.Permits, c.id,
			ms(c.cfg.leaseTTL), ms(c.cfg.waiterTTL), req.Capacity).Slice()
		var code, val int64
		if err == nil {
			code, err = reply(res).int(0)
		}
		if err == nil {
			val, err = reply(res).int(1)
		}
		if err != nil {
			c.unregister(r, w)
			// The script may have run before the failure was seen.
			c.withdraw(ctx, k, w.ticket, req.Permits)
			return nil, fail(ctx, op, req.Name, err)
		}
		switch code {
		case 1:
			c.unregister(r, w)
			return c.newLease(ctx, k, req, w.ticket, val, start, false)
		case 0:
			c.unregister(r, w)
			return nil, wrap(ErrNotAcquired)
		}

		c.listen(r, w, time.Duration(val)*time.Millisecond)
		select {
		case wk := <-w.ch:
			switch {
			case wk.err != nil:
				c.withdraw(ctx, k, w.ticket, req.Permits)
				return nil, fail(ctx, op, req.Name, wk.err)
			case wk.requeue:
				// The ticket was dropped while this process could not
				// refresh it (paused, or Redis lost it); queue again.
				continue
			}
			return c.newLease(ctx, k, req, w.ticket, wk.token, wk.at, true)
		case <-ctx.Done():
		case <-c.done:
		}
		c.unregister(r, w)
		// Leave atomically; a grant that raced the cancellation is handed on.
		c.withdraw(ctx, k, w.ticket, req.Permits)
		if err := ctx.Err(); err != nil {
			return nil, wrap(err)
		}
		return nil, wrap(ErrClosed)
	}
}

// withdraw takes ticket out of the semaphore, whether it waits or has just
// been granted, using a context that outlives the caller's. If Redis cannot
// be reached, the ticket dies on its own: a waiter at its liveness
// deadline, a grant when its lease expires.
func (c *Client) withdraw(ctx context.Context, k keys, ticket string, permits int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.waiterTTL)
	defer cancel()
	_ = releaseScript.Run(ctx, c.rdb, k.list(), "leave", ticket, permits,
		c.id, ms(c.cfg.leaseTTL), ms(c.cfg.waiterTTL)).Err()
}

package fairlock

import (
	"context"
	"fmt"
	"time"
)

// acquire runs Acquire (wait) and TryAcquire (!wait) for one or more
// semaphores.
func (c *Client) acquire(ctx context.Context, reqs []Request, wait bool) (*Lease, error) {
	op, mode := "acquire", "acquire"
	if !wait {
		op, mode = "try acquire", "try"
	}
	p, err := c.plan(reqs)
	if err != nil {
		return nil, err
	}
	wrap := func(err error) error { return fmt.Errorf("fairlock: %s %s: %w", op, labelOf(p.names), err) }
	// A done context wins over permits that happen to be free, as in
	// golang.org/x/sync/semaphore.
	if err := ctx.Err(); err != nil {
		return nil, wrap(err)
	}
	for {
		// A waiter registers before its script runs, so a grant announced
		// the moment it is queued finds it.
		r, w, err := c.register(p, wait)
		if err != nil {
			return nil, wrap(err)
		}
		start := time.Now()
		ticket := w.ticket
		o, ok := c.call(ctx, c.runner(c.scripts.acquire, p.keys, p.acquireArgs(mode, ticket, c)), func(outcome) {
			// The script may have queued or granted the ticket after the
			// caller left, or before its reply was lost.
			c.cleanUp(ctx, p.releaseArgs("leave", ticket, c, true, nil), p)
		})
		if !ok {
			c.unregister(r, w)
			return nil, wrap(ctx.Err())
		}
		cmd, ackErr := o.cmd, o.ackErr
		res, err := cmd.Slice()
		var code, val int64
		if err == nil {
			code, err = reply(res).int(0)
		}
		if err == nil && code != 0 {
			val, err = reply(res).int(1)
		}
		if err != nil {
			c.unregister(r, w)
			// The script may have run before the failure was seen.
			c.withdraw(ctx, p, w.ticket)
			return nil, fail(ctx, op, p.names, err)
		}
		switch code {
		case 1, 3:
			// 3: a retry of this call (go-redis resends a command whose
			// reply was lost) found the grant; it lasts only the waiter
			// TTL until confirmed, like an announced one.
			c.unregister(r, w)
			tokens := make([]int64, len(p.parts))
			for i := range tokens {
				if tokens[i], err = reply(res).int(i + 1); err != nil {
					c.withdraw(ctx, p, w.ticket)
					return nil, wrap(err)
				}
			}
			if ackErr != nil {
				// Granted on the master only: give it back.
				c.giveBack(ctx, p, w.ticket, tokens)
				return nil, wrap(ackErr)
			}
			return c.newLease(ctx, p, w.ticket, tokens, start, code == 3)
		case 0:
			c.unregister(r, w)
			return nil, wrap(ErrNotAcquired)
		}

		if ackErr != nil {
			c.unregister(r, w)
			c.withdraw(ctx, p, w.ticket)
			return nil, wrap(ackErr)
		}
		c.listen(r, w, time.Duration(val)*time.Millisecond)
		select {
		case wk := <-w.ch:
			switch {
			case wk.err != nil:
				c.withdraw(ctx, p, w.ticket)
				return nil, fail(ctx, op, p.names, wk.err)
			case wk.requeue:
				// The ticket was dropped while this process could not
				// refresh it (paused, or Redis lost it); queue again.
				continue
			case len(wk.tokens) != len(p.parts):
				c.withdraw(ctx, p, w.ticket)
				return nil, wrap(fmt.Errorf("%w: a grant with %d tokens for %d semaphores", ErrRedis, len(wk.tokens), len(p.parts)))
			}
			return c.newLease(ctx, p, w.ticket, wk.tokens, wk.at, true)
		case <-ctx.Done():
		case <-c.done:
		}
		c.unregister(r, w)
		// Leave atomically; a grant that raced the cancellation is handed on.
		c.withdraw(ctx, p, w.ticket)
		if err := ctx.Err(); err != nil {
			return nil, wrap(err)
		}
		return nil, wrap(ErrClosed)
	}
}

// acquireArgs renders the arguments of acquire.lua's "acquire" and "try".
func (p plan) acquireArgs(op, ticket string, c *Client) []any {
	args := make([]any, 0, 6+2*len(p.parts))
	args = append(args, op, ticket, c.id, ms(c.cfg.leaseTTL), ms(c.cfg.waiterTTL), p.group)
	for _, pt := range p.parts {
		args = append(args, pt.req.Permits, pt.req.Capacity)
	}
	return args
}

// releaseArgs renders the arguments of release.lua for op on p's
// semaphores held under ticket with the given tokens (zeros for "leave").
func (p plan) releaseArgs(op, ticket string, c *Client, unconfirmed bool, tokens []int64) []any {
	args := make([]any, 0, 7+2*len(p.parts))
	args = append(args, op, ticket, c.id, boolArg(unconfirmed), ms(c.cfg.leaseTTL), ms(c.cfg.waiterTTL), p.group)
	for i, pt := range p.parts {
		var tok int64
		if tokens != nil {
			tok = tokens[i]
		}
		args = append(args, pt.req.Permits, tok)
	}
	return args
}

// withdraw takes ticket out of p's semaphores, whether it waits or has just
// been granted. It returns by ctx's end; the withdrawal goes on in the
// background for up to one waiter TTL (see letGo). If Redis cannot be
// reached meanwhile, the ticket dies on its own: a waiter at its liveness
// deadline, a grant when its lease expires.
func (c *Client) withdraw(ctx context.Context, p plan, ticket string) {
	c.letGo(ctx, p.releaseArgs("leave", ticket, c, true, nil), p)
}

// giveBack releases a grant its caller will not use, like withdraw.
func (c *Client) giveBack(ctx context.Context, p plan, ticket string, tokens []int64) {
	c.letGo(ctx, p.releaseArgs("release", ticket, c, false, tokens), p)
}

// letGo runs release.lua with args on p's semaphores, best effort, and
// waits for it while ctx lasts, and a grace beyond. The script runs on a goroutine of the
// client's (Close waits for it) under a context of its own that outlives
// the caller's by up to one waiter TTL; once ctx ends (or if it already
// has) and the grace passes, letGo returns and the call finishes in the background. A command
// already sent to a Redis that does not answer can hold that goroutine up
// to go-redis's ReadTimeout, which go-redis applies whatever the context.
func (c *Client) letGo(ctx context.Context, args []any, p plan) {
	if ctx.Done() == nil {
		c.cleanUp(ctx, args, p)
		return
	}
	done := make(chan struct{})
	c.spawn(func() {
		defer close(done)
		c.cleanUp(ctx, args, p)
	})
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// cleanUp runs release.lua with args on p's semaphores, best effort, under
// a context that outlives ctx by up to one waiter TTL. It blocks; callers
// that must not, run it through letGo or as a late outcome of call.
func (c *Client) cleanUp(ctx context.Context, args []any, p plan) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.waiterTTL)
	defer cancel()
	_, _ = c.run(ctx, c.scripts.release, p.keys, args...)
}

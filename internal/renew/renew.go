// Package renew renews a client's leases in batches: while one renewal
// script is in flight for a semaphore, the leases of that semaphore that
// fall due meanwhile wait for it and go in the next one.
package renew

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
)

// Renewals of one client's leases on one semaphore go out together: while
// one renewal script is in flight, the leases that fall due meanwhile wait
// for it and go in the next one, up to batchMax per script. A lone
// lease costs one script, as it would alone; a burst (the thousands of
// grants one release can hand out, whose first renewals fall due
// together) costs one script per batchMax leases. Leases over several
// semaphores, and every lease under WithReplicaAck, renew one by one.

// batchMax is the most leases one renewal script renews.
const batchMax = 128

// Req is one lease's renewal waiting for, or riding on, a batch.
type Req struct {
	ticket    string        // the lease's
	permits   int64         // the lease's, of its one semaphore
	token     int64         // the lease's
	announced bool          // the lease's grant was announced, not yet confirmed
	ttl       time.Duration // what the renewal asks for (less at a cap on holding)
	deadline  time.Time     // the lease's: the batch must answer before it
	done      chan result
	taken     bool // guarded by Batcher.mu: in a batch being sent
}

type result struct {
	n   int64 // 1 renewed, 0 the lease was gone
	err error
}

// queue holds the renewals waiting for one semaphore's next batch.
type queue struct {
	k    keyspace.Keys
	reqs []*Req
}

// Batcher batches a client's renewals: it holds each semaphore's queue of
// renewals waiting for the next batch, and sends the batches through the
// client's call path.
type Batcher struct {
	Calls    *callpath.Caller
	Closing  context.Context // the client's: no renewal is taken once it ends
	ID       string          // the client's, which holds the leases
	LeaseTTL time.Duration   // a batch's deadline when no renewal has one
	// More hands on the work a batch's script left for later on the
	// semaphore of keys k (the client's pump).
	More func(k keyspace.Keys)

	mu     sync.Mutex
	queues map[string]*queue // by keyspace.Keys.Base
}

// New returns the Batcher of a client's renewals: sent through calls,
// taken until closing ends, for leases held by the client id, a batch
// bounded by leaseTTL when no renewal in it has a deadline, and the work a
// batch's script leaves for later handed to more.
func New(calls *callpath.Caller, closing context.Context, id string, leaseTTL time.Duration, more func(keyspace.Keys)) *Batcher {
	return &Batcher{Calls: calls, Closing: closing, ID: id, LeaseTTL: leaseTTL, More: more, queues: make(map[string]*queue)}
}

// Renew renews the lease held under ticket (permits of the one semaphore
// of keys k, fenced by token; announced: its grant not yet confirmed) for
// ttl in the next batch of that semaphore, and returns the script's
// answer for it: 1 renewed, 0 the lease was gone. It returns by ctx's
// end: a renewal not yet sent is then withdrawn; one on its way is waited
// for a grace, as the call path does.
func (c *Batcher) Renew(ctx context.Context, k keyspace.Keys, ticket string, permits, token int64, announced bool, ttl time.Duration) (int64, error) {
	deadline, _ := ctx.Deadline()
	req := &Req{ticket: ticket, permits: permits, token: token, announced: announced, ttl: ttl, deadline: deadline, done: make(chan result, 1)}
	c.mu.Lock()
	if c.Closing.Err() != nil {
		c.mu.Unlock()
		return 0, fault.ErrClosed
	}
	q := c.queues[k.Base]
	start := q == nil
	if start {
		q = &queue{k: k}
		c.queues[k.Base] = q
	}
	q.reqs = append(q.reqs, req)
	c.mu.Unlock()
	if start {
		c.Calls.Spawn(func() { c.sendRenewals(q) })
	}
	select {
	case r := <-req.done:
		return r.n, r.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !req.taken {
		q.reqs = slices.DeleteFunc(q.reqs, func(x *Req) bool { return x == req })
		c.mu.Unlock()
		return 0, ctx.Err()
	}
	c.mu.Unlock()
	t := time.NewTimer(callpath.Grace)
	defer t.Stop()
	select {
	case r := <-req.done:
		return r.n, r.err
	case <-t.C:
		return 0, ctx.Err()
	}
}

// sendRenewals sends q's renewals in batches until none is left.
func (c *Batcher) sendRenewals(q *queue) {
	for {
		c.mu.Lock()
		n := min(len(q.reqs), batchMax)
		if n == 0 {
			delete(c.queues, q.k.Base)
			c.mu.Unlock()
			return
		}
		batch := q.reqs[:n:n]
		q.reqs = slices.Clone(q.reqs[n:])
		var deadline time.Time
		for _, r := range batch {
			r.taken = true
			if !r.deadline.IsZero() && (deadline.IsZero() || r.deadline.Before(deadline)) {
				deadline = r.deadline
			}
		}
		c.mu.Unlock()

		oc := batchCall(c.ID, q.k.List(), batch)
		if deadline.IsZero() {
			deadline = time.Now().Add(c.LeaseTTL)
		}
		// The batch ends, too, when the client's renewals end (at a
		// close's cut): the Redis client's retries must not outlast the
		// close, and the leases are being ended anyway.
		ctx, cancel := context.WithDeadline(c.Closing, deadline)
		o, _ := c.Calls.Op(ctx, oc, nil)
		cancel()
		results, more, err := renewed(o, len(batch))
		if more {
			c.More(q.k)
		}
		for i, r := range batch {
			if err != nil {
				r.done <- result{err: err}
			} else {
				r.done <- result{n: results[i]}
			}
		}
	}
}

// batchCall is "renew_batch" (lua/ops/renew_batch.lua) on keys, for
// leases of that one semaphore held by the client id.
func batchCall(id string, keys []string, batch []*Req) script.Call {
	oc := script.NewCall(script.OpRenewBatch, keys, 1+5*len(batch)).With(id)
	for _, r := range batch {
		oc.Args = append(oc.Args, r.ticket, ops.Itoa(r.permits), ops.Itoa(r.token), ops.BoolArg(r.announced), ops.MsArg(r.ttl))
	}
	return oc
}

// renewed reads a renew_batch reply {{result...}, more} for n leases:
// each one's result, and whether the script left work for later.
func renewed(o callpath.Outcome, n int) (results []int64, more bool, err error) {
	res, err := o.Res.Slice()
	if err != nil {
		return nil, false, err
	}
	m, err := script.Reply(res).Int(1)
	if err != nil {
		return nil, false, err
	}
	list, _ := res[0].([]any)
	if len(list) != n {
		return nil, false, fmt.Errorf("%w: renewal reply %v for %d leases", fault.ErrRedis, res, n)
	}
	out := make([]int64, n)
	for i := range list {
		if out[i], err = script.Reply(list).Int(i); err != nil {
			return nil, false, err
		}
	}
	return out, m == 1, nil
}

package fairlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/keyspace"
)

// Renewals of one client's leases on one semaphore go out together: while
// one renewal script is in flight, the leases that fall due meanwhile wait
// for it and go in the next one, up to renewBatchMax per script. A lone
// lease costs one script, as it would alone; a burst (the thousands of
// grants one release can hand out, whose first renewals fall due
// together) costs one script per renewBatchMax leases. Leases over several
// semaphores, and every lease under WithReplicaAck, renew one by one.

// renewBatchMax is the most leases one renewal script renews.
const renewBatchMax = 128

// renewReq is one lease's renewal waiting for, or riding on, a batch.
type renewReq struct {
	l         *Lease
	announced bool          // the lease's grant was announced, not yet confirmed
	ttl       time.Duration // what the renewal asks for (less at a cap on holding)
	deadline  time.Time     // the lease's: the batch must answer before it
	done      chan renewResult
	taken     bool // guarded by renewer.mu: in a batch being sent
}

type renewResult struct {
	n   int64 // 1 renewed, 0 the lease was gone
	err error
}

// renewQueue holds the renewals waiting for one semaphore's next batch.
type renewQueue struct {
	k    keyspace.Keys
	reqs []*renewReq
}

// renewer batches a client's renewals: it holds each semaphore's queue of
// renewals waiting for the next batch, and sends the batches through the
// client's call path.
type renewer struct {
	calls    *callpath.Caller
	closing  context.Context // the client's: no renewal is taken once it ends
	id       string          // the client's, which holds the leases
	leaseTTL time.Duration   // a batch's deadline when no renewal has one
	// more hands on the work a batch's script left for later
	// (Client.pumpLater).
	more func(plan)

	mu     sync.Mutex
	queues map[string]*renewQueue // by keyspace.Keys.Base
}

// batchable reports whether l renews in batches.
func (l *Lease) batchable() bool { return len(l.p.parts) == 1 && l.c.cfg.ackReplicas == 0 }

// renewBatched renews l for ttl in the next batch of its semaphore and
// returns the script's answer for it. It returns by ctx's end: a renewal not yet sent
// is then withdrawn; one on its way is waited for a grace, as call does.
func (c *renewer) renewBatched(ctx context.Context, l *Lease, announced bool, ttl time.Duration) (int64, error) {
	deadline, _ := ctx.Deadline()
	req := &renewReq{l: l, announced: announced, ttl: ttl, deadline: deadline, done: make(chan renewResult, 1)}
	k := l.p.parts[0].k
	c.mu.Lock()
	if c.closing.Err() != nil {
		c.mu.Unlock()
		return 0, ErrClosed
	}
	q := c.queues[k.Base]
	start := q == nil
	if start {
		q = &renewQueue{k: k}
		c.queues[k.Base] = q
	}
	q.reqs = append(q.reqs, req)
	c.mu.Unlock()
	if start {
		c.calls.Spawn(func() { c.sendRenewals(q) })
	}
	select {
	case r := <-req.done:
		return r.n, r.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !req.taken {
		q.reqs = slices.DeleteFunc(q.reqs, func(x *renewReq) bool { return x == req })
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
func (c *renewer) sendRenewals(q *renewQueue) {
	for {
		c.mu.Lock()
		n := min(len(q.reqs), renewBatchMax)
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

		oc := renewBatchCall(c.id, q.k.List(), batch)
		if deadline.IsZero() {
			deadline = time.Now().Add(c.leaseTTL)
		}
		// The batch ends, too, when the client's renewals end (at a
		// close's cut): the Redis client's retries must not outlast the
		// close, and the leases are being ended anyway.
		ctx, cancel := context.WithDeadline(c.closing, deadline)
		o, _ := c.calls.Op(ctx, oc, nil)
		cancel()
		results, more, err := renewedBatch(o, len(batch))
		if more {
			c.more(batch[0].l.p)
		}
		for i, r := range batch {
			if err != nil {
				r.done <- renewResult{err: err}
			} else {
				r.done <- renewResult{n: results[i]}
			}
		}
	}
}

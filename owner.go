package fairlock

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Ownership: a context made by LeaseContext is owned by its lease, and by
// every lease its parents are owned by. A waiting acquisition whose
// context owns a live lease that holds permits of a semaphore it asks for,
// so many that the request cannot be granted while that lease holds them,
// fails at once with ErrDeadlock (see Client.deadlock): it could be
// granted only once the lease ends, and the lease's context ends with it.

// ownerKey is the context key under which LeaseContext records its lease.
type ownerKey struct{}

// leaseOwner is one lease a context carries, and the one its parents carry
// (nil at the top): LeaseContext within LeaseContext chains them.
type leaseOwner struct {
	lease *Lease
	up    *leaseOwner
}

// withOwner returns ctx marked as owned by l as well as by the leases ctx
// carries already.
func withOwner(ctx context.Context, l *Lease) context.Context {
	up, _ := ctx.Value(ownerKey{}).(*leaseOwner)
	return context.WithValue(ctx, ownerKey{}, &leaseOwner{lease: l, up: up})
}

// deadlock returns an *Error of op matching ErrDeadlock if the live leases
// ctx carries hold so many permits of one of p's semaphores that p cannot
// be granted while they hold them: p asks for more than the capacity
// minus what they hold. A lease counts for a semaphore if it holds
// permits of the same keys (the same key base, so the same prefix and
// name) through the same go-redis client, with the same capacity (a
// request with another capacity fails in Redis with ErrCapacityMismatch),
// and if its Err, which reads the clock, is nil. It sends nothing to
// Redis. Reading a lease's Err may end it, and the contexts it owns.
func (c *Client) deadlock(ctx context.Context, op string, p plan) error {
	top, _ := ctx.Value(ownerKey{}).(*leaseOwner)
	if top == nil {
		return nil
	}
	for _, pt := range p.parts {
		var held int64
		var tokens []string
	chain:
		for o := top; o != nil; o = o.up {
			l := o.lease
			for seen := top; seen != o; seen = seen.up {
				if seen.lease == l {
					continue chain // the same lease twice up the chain counts once
				}
			}
			for i, lp := range l.p.parts {
				if lp.k.Base != pt.k.Base || lp.req.Capacity != pt.req.Capacity || !sameRedis(l.c, c) {
					continue
				}
				if l.Err() == nil {
					held += lp.req.Permits
					tokens = append(tokens, strconv.FormatInt(l.tokens[i], 10))
				}
				break
			}
		}
		if held == 0 || pt.req.Permits <= pt.req.Capacity-held {
			continue
		}
		return opError(op, p.names, &deadlockError{name: pt.req.Name, capacity: pt.req.Capacity, held: held, asked: pt.req.Permits, tokens: tokens})
	}
	return nil
}

// deadlockError is ErrDeadlock with what the context holds: the
// packages built on the engine (an RWMutex) restate it in their terms
// (see engine.Deadlock).
type deadlockError struct {
	name        string
	capacity    int64
	held, asked int64
	tokens      []string // of the leases that hold the permits
}

func (e *deadlockError) Error() string {
	who, hold, it := "the lease with token "+e.tokens[0]+" that this context carries", "holds", "it holds"
	if len(e.tokens) > 1 {
		who, hold, it = "the leases with tokens "+strings.Join(e.tokens, ", ")+" that this context carries", "hold", "they hold"
	}
	return fmt.Sprintf("%v: %s %s %d of the %d permits of %q; the %d asked for cannot be granted while %s them, so waiting would wait on itself",
		ErrDeadlock, who, hold, e.held, e.capacity, e.name, e.asked, it)
}

func (e *deadlockError) Unwrap() error { return ErrDeadlock }

// sameRedis reports whether a and b send their commands through the same
// Redis client (go-redis's, or a Backend), so that a name means the same
// keys to both once their key bases agree. Two clients are never the
// same, even on one Redis: fairlock cannot tell where a client connects.
func sameRedis(a, b *Client) bool {
	if a == b {
		return true
	}
	ca, cb := a.client(), b.client()
	va, vb := reflect.ValueOf(ca), reflect.ValueOf(cb)
	// A client of a type that cannot be compared (a struct holding a
	// slice) is never the same as another: == would panic.
	return va.Type() == vb.Type() && va.Comparable() && vb.Comparable() && ca == cb
}

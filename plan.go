package fairlock

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/keyslot"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// MaxResources is the most semaphores one request may lock at once.
const MaxResources = 16

// part is one semaphore of a request.
type part struct {
	k   keyspace.Keys
	req Request
	// req's permits and capacity as script arguments, rendered (and
	// boxed, see opCall.argv) once by plan; "" and nil in a part made
	// elsewhere (see permitsArg, capacityArg).
	permits, capacity       string
	permitsBox, capacityBox any
}

// permitsArg returns the part's permits as a script argument.
func (pt part) permitsArg() string {
	if pt.permits != "" {
		return pt.permits
	}
	return ops.Itoa(pt.req.Permits)
}

// capacityArg returns the part's capacity as a script argument.
func (pt part) capacityArg() string {
	if pt.capacity != "" {
		return pt.capacity
	}
	return ops.Itoa(pt.req.Capacity)
}

// A plan is a validated request for one or more semaphores, in the form
// the scripts take: parts in name order, their keys, and for several parts
// the group that marks the request in every queue.
type plan struct {
	parts []part
	keys  []string
	group string // "" for one semaphore
	// groupArg is group boxed (see opCall.argv), or nil.
	groupArg any
	names    []string
	id       uint64 // Event.ID of this acquisition, when observed
	// lease is the request's own lease TTL (see leaseTTLOf), or nil for
	// the client's (see ttl, leaseArgs). A pointer keeps a plan small: a
	// closure captures a plan of 128 bytes or less by value, and a larger
	// one by reference, which costs an allocation on every acquisition.
	lease *planLease
}

// leaseMs returns p's lease TTL as a script argument, or "" for the
// client's.
func (p plan) leaseMs() string {
	if p.lease != nil {
		return p.lease.ms
	}
	return ""
}

// enter makes p's ticket (see wait.Waits.Enter): a waiter too, in the
// room of p's first semaphore, when it may wait.
func (c *Client) enter(p plan, mayWait bool) (*wait.Room, *wait.Waiter, error) {
	first := p.first()
	return c.waits.Enter(first.k, first.req.Permits, p.group, p.leaseMs(), mayWait)
}

// A planLease is a lease TTL other than the client's, with the same as a
// script argument, rendered and boxed once.
type planLease struct {
	ttl time.Duration
	ms  string
	arg any
}

// ttl returns the lease TTL of p's lease: its own, or the client's.
func (p plan) ttl(c *Client) time.Duration {
	if p.lease != nil {
		return p.lease.ttl
	}
	return c.cfg.leaseTTL
}

// leaseArgs returns p's lease TTL as a script argument, and boxed (see
// opCall.argv).
func (p plan) leaseArgs(c *Client) (string, any) {
	if p.lease != nil {
		return p.lease.ms, p.lease.arg
	}
	return c.leaseMs, c.leaseArg
}

// leaseTTLOf returns the lease TTL of a lease over parts: the shortest
// its parts ask for (Request.LeaseTTL), a part's 0 counting as def (the
// client's). One lease is renewed as one, so the part that needs the
// shortest TTL sets it for all.
func leaseTTLOf(parts []part, def time.Duration) time.Duration {
	d := time.Duration(0)
	for _, pt := range parts {
		t := pt.req.LeaseTTL
		if t == 0 {
			t = def
		}
		if d == 0 || t < d {
			d = t
		}
	}
	return d
}

// maxPlans bounds the plans of single requests a client keeps (see
// plan); past it, it forgets them all.
const maxPlans = 1024

// plans keeps the plans of a client's single requests, which a client
// makes again and again for the same few semaphores: a plan depends only
// on the request and the client's prefix and layout, and once made it is
// only read (whoever extends its slices copies them first).
type plans struct {
	mu sync.RWMutex
	m  map[Request]plan
}

// plan validates reqs and orders them. Each semaphore may appear once. On a
// Cluster client, the semaphores of one request must share a hash slot. The
// plan of a single request comes from the client's plans once made.
func (c *Client) plan(reqs []Request) (plan, error) {
	if len(reqs) != 1 {
		return c.newPlan(reqs)
	}
	c.plans.mu.RLock()
	p, ok := c.plans.m[reqs[0]]
	c.plans.mu.RUnlock()
	if ok {
		return p, nil
	}
	p, err := c.newPlan(reqs)
	if err != nil {
		return p, err
	}
	c.plans.mu.Lock()
	if c.plans.m == nil || len(c.plans.m) >= maxPlans {
		c.plans.m = make(map[Request]plan)
	}
	c.plans.m[reqs[0]] = p
	c.plans.mu.Unlock()
	return p, nil
}

// newPlan makes the plan of reqs (see plan).
func (c *Client) newPlan(reqs []Request) (plan, error) {
	switch {
	case len(reqs) == 0:
		return plan{}, fmt.Errorf("%w: no semaphore requested", ErrInvalidArgument)
	case len(reqs) > MaxResources:
		return plan{}, fmt.Errorf("%w: %d semaphores in one request, more than %d", ErrInvalidArgument, len(reqs), MaxResources)
	}
	p := plan{parts: make([]part, len(reqs))}
	for i, req := range reqs {
		k, err := c.check(req)
		if err != nil {
			return plan{}, err
		}
		pt := part{k: k, req: req, permits: ops.Itoa(req.Permits), capacity: ops.Itoa(req.Capacity)}
		pt.permitsBox, pt.capacityBox = pt.permits, pt.capacity
		p.parts[i] = pt
	}
	slices.SortFunc(p.parts, func(a, b part) int { return strings.Compare(a.req.Name, b.req.Name) })
	if err := distinct(p.parts); err != nil {
		return plan{}, err
	}
	names := make([]string, len(p.parts))
	for i, pt := range p.parts {
		names[i] = pt.req.Name
		p.keys = append(p.keys, pt.k.List()...)
	}
	p.names = names
	if ttl := leaseTTLOf(p.parts, c.cfg.leaseTTL); ttl != c.cfg.leaseTTL {
		ms := ops.MsArg(ttl)
		p.lease = &planLease{ttl: ttl, ms: ms, arg: ms}
	}
	if len(p.parts) == 1 {
		return p, nil
	}
	if c.info.Layout == backend.Cluster {
		if err := sameSlot(p.parts); err != nil {
			return plan{}, err
		}
	}
	var g []string
	for _, pt := range p.parts {
		g = append(g, pt.k.Base, strconv.FormatInt(pt.req.Permits, 10), strconv.FormatInt(pt.req.Capacity, 10))
	}
	p.group = strings.Join(g, "\t")
	p.groupArg = p.group
	return p, nil
}

// first is the part whose room, wake list and refresh serve the request.
func (p plan) first() part { return p.parts[0] }

// distinct reports an error, matching [ErrInvalidArgument], if two parts
// name one semaphore: the same name, or names whose keys are the same. The
// name -> keys mapping is meant to be injective (keys), so the second
// check is a guard: a request that counted one semaphore twice would take
// its permits twice.
func distinct(parts []part) error {
	seen := make(map[string]string, len(parts)) // base -> name
	for _, pt := range parts {
		if other, ok := seen[pt.k.Base]; ok {
			if other == pt.req.Name {
				return fmt.Errorf("%w: %q requested twice", ErrInvalidArgument, other)
			}
			return fmt.Errorf("%w: %q and %q name the same keys (%s)", ErrInvalidArgument, other, pt.req.Name, pt.k.Base)
		}
		seen[pt.k.Base] = pt.req.Name
	}
	return nil
}

// sameSlot reports an error matching [ErrCrossSlot] unless all parts live
// in one Cluster slot; it names the first two names whose slots differ.
func sameSlot(parts []part) error {
	first := keyslot.Of(parts[0].k.Base)
	for _, pt := range parts[1:] {
		if at := keyslot.Of(pt.k.Base); at != first {
			return fmt.Errorf("%w: %q is in slot %d and %q in slot %d; give the names one hash tag, such as \"{acct}:1\" and \"{acct}:2\"",
				ErrCrossSlot, parts[0].req.Name, first, pt.req.Name, at)
		}
	}
	return nil
}

// permits lists a plan's permits in name order.
func (p plan) permits() []int64 {
	out := make([]int64, len(p.parts))
	for i, pt := range p.parts {
		out[i] = pt.req.Permits
	}
	return out
}

// acquireCall is acquire.lua's o ("acquire" or "try") for ticket on p's
// semaphores.
func (p plan) acquireCall(o *script.Op, ticket string, ticketBox any, c *Client) script.Call {
	lease, leaseBox := p.leaseArgs(c)
	oc := script.NewCall(o, p.keys, 5+2*len(p.parts)).Add(ticket, ticketBox).Add(c.id, c.idArg).
		Add(lease, leaseBox).Add(c.waiterMs, c.waiterArg).Add(p.group, p.groupArg)
	for _, pt := range p.parts {
		oc = oc.Add(pt.permitsArg(), pt.permitsBox).Add(pt.capacityArg(), pt.capacityBox)
	}
	return oc
}

// releaseCall is release.lua's o on p's semaphores held under ticket with
// the given tokens (nil, zeros, for "leave").
func (p plan) releaseCall(o *script.Op, ticket string, c *Client, announced bool, tokens []int64) script.Call {
	return p.releaseCallTTL(o, ticket, c, announced, tokens, p.ttl(c))
}

// releaseCallTTL is releaseCall with the lease TTL given: only "renew" may
// ask for another than the plan's (a cap on holding), since the other
// ops find a waiter by a member that contains the TTL it queued with.
func (p plan) releaseCallTTL(o *script.Op, ticket string, c *Client, announced bool, tokens []int64, ttl time.Duration) script.Call {
	return p.releaseCallBoxed(o, ticket, nil, c, announced, tokens, nil, ttl)
}

// releaseCallBoxed is releaseCallTTL with the ticket and the first token
// boxed beforehand (nil: box them now).
func (p plan) releaseCallBoxed(o *script.Op, ticket string, ticketBox any, c *Client, announced bool, tokens []int64, tok0 any, ttl time.Duration) script.Call {
	lease, leaseBox := p.leaseArgs(c)
	if ttl != p.ttl(c) {
		lease, leaseBox = ops.MsArg(ttl), nil
	}
	oc := script.NewCall(o, p.keys, 6+2*len(p.parts)).Add(ticket, ticketBox).Add(c.id, c.idArg).Add(lease, leaseBox).
		Add(c.waiterMs, c.waiterArg).Add(p.group, p.groupArg).Add(ops.BoolArg(announced), ops.BoolBox(announced))
	for i, pt := range p.parts {
		var tok int64
		if tokens != nil {
			tok = tokens[i]
		}
		if i == 0 && tok0 != nil {
			oc = oc.Add(pt.permitsArg(), pt.permitsBox).Add(tok0.(string), tok0)
			continue
		}
		oc = oc.Add(pt.permitsArg(), pt.permitsBox).Add(ops.Itoa(tok), nil)
	}
	return oc
}

// waitCall is release.lua's "wait" on cp's keys (p's and the
// condition's): a release of the lease held under ticket on p's
// semaphores, and the new ticket fresh waiting on the condition cond.
func (p plan) waitCall(cp plan, ticket string, c *Client, announced bool, tokens []int64, fresh, cond string) script.Call {
	oc := p.releaseCall(script.OpWait, ticket, c, announced, tokens).With(fresh, cond)
	oc.Keys = cp.keys
	return oc
}

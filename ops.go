package fairlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// The Go side of each script op: the arguments it takes and the reply it
// gives, one function each (the Lua side documents both in the header of
// the op's entry: acquire.lua, release.lua, lua/ops/*.lua), the members
// the replies carry, and the one place where a script's errors become
// fairlock's. The ops themselves (which script serves each, and whether
// WithReplicaAck waits for it) are in internal/script; the call path
// (internal/callpath) runs them. The ops are called from acquire.go
// (acquire, try), cleanup.go (leave, pump, release), lease.go (release,
// renew), status.go (status) and cond.go (wait, signal); internal/renew
// builds its own renew_batch, and internal/wait its refresh.

// The acquire script's reply codes (acquire.lua).
const (
	acqNotGranted    = 0 // "try": not free now
	acqGranted       = 1 // granted at once
	acqQueued        = 2 // queued; the grant comes on the wake list
	acqGrantedBefore = 3 // granted already, by a run whose reply was lost or by the queue
	acqEnded         = 4 // this request's grant ended before this call ran
)

// releasedNoTrace is release.lua's "release" (and "wait") result when it
// finds neither the lease nor any record of its ticket (nor, for "wait", of
// the new ticket): released by an earlier run of the call if it was sent
// while the lease lived, else perhaps long ended.
const releasedNoTrace = 3

// releaseResult reads a release's result n as 1 (released) or 0 (the lease
// was lost): releasedNoTrace is released when the release, or the call
// that released before it (a condition wait), was sent while the lease
// surely lived by this process's clock (sentLive), else lost.
func releaseResult(n int64, sentLive bool) int64 {
	if n != releasedNoTrace {
		return n
	}
	if sentLive {
		return 1
	}
	return 0
}

// acquireReply is acquire.lua's reply: its code, Redis's clock (ms), and
// by the code the grant (acqGranted, acqGrantedBefore) or when the queue's
// next event is due (acqQueued, ms from now).
type acquireReply struct {
	code, now, next int64
	g               wait.Grant
}

// parseAcquireReply reads acquire.lua's reply to a request for parts
// semaphores: {1 or 3, nowMs, expiryMs, token...}, {2, nowMs,
// nextEventMs}, {0} or {4}. The error is the command's, or a reply that
// does not read as one of those (matching ErrRedis).
func parseAcquireReply(out script.Result, parts int) (acquireReply, error) {
	var r acquireReply
	res, err := out.Slice()
	if err != nil {
		return r, err
	}
	bad := func(err error) (acquireReply, error) {
		return r, fmt.Errorf("%w: acquire script reply %v: %w", ErrRedis, res, err)
	}
	if r.code, err = script.Reply(res).Int(0); err != nil {
		return bad(err)
	}
	switch r.code {
	case acqNotGranted, acqEnded:
		return r, nil
	case acqQueued:
		if r.now, err = script.Reply(res).Int(1); err == nil {
			r.next, err = script.Reply(res).Int(2)
		}
		if err != nil {
			return bad(err)
		}
		return r, nil
	case acqGranted, acqGrantedBefore:
	default:
		return bad(fmt.Errorf("unknown code %d", r.code))
	}
	if len(res) != 3+parts {
		return bad(fmt.Errorf("a grant for %d semaphores", parts))
	}
	if r.now, err = script.Reply(res).Int(1); err != nil {
		return bad(err)
	}
	if r.g.Expiry, err = script.Reply(res).Int(2); err != nil {
		return bad(fmt.Errorf("bad grant expiry %q", fmt.Sprint(res[2])))
	}
	r.g.Tokens = make([]int64, parts)
	for i := range parts {
		t, err := script.Reply(res).Int(3 + i)
		if err != nil || t <= 0 {
			return bad(fmt.Errorf("bad token %q", fmt.Sprint(res[3+i])))
		}
		r.g.Tokens[i] = t
	}
	if s, ok := res[3].(string); ok && parts == 1 && wait.CanonicalToken(s) {
		r.g.Tok0 = res[3] // already boxed: no allocation
	}
	return r, nil
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
		lease, leaseBox = msArg(ttl), nil
	}
	oc := script.NewCall(o, p.keys, 6+2*len(p.parts)).Add(ticket, ticketBox).Add(c.id, c.idArg).Add(lease, leaseBox).
		Add(c.waiterMs, c.waiterArg).Add(p.group, p.groupArg).Add(boolArg(announced), boolBox(announced))
	for i, pt := range p.parts {
		var tok int64
		if tokens != nil {
			tok = tokens[i]
		}
		if i == 0 && tok0 != nil {
			oc = oc.Add(pt.permitsArg(), pt.permitsBox).Add(tok0.(string), tok0)
			continue
		}
		oc = oc.Add(pt.permitsArg(), pt.permitsBox).Add(itoa(tok), nil)
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

// waitReply is "wait"'s reply: result 1 (the new ticket waits), 0 (the
// lease was no longer held) or releasedNoTrace, work left for a pump, Redis's clock and the
// queue's next event (ms).
type waitReply struct {
	result    int64
	more      bool
	now, next int64
}

func parseWaitReply(out script.Result) (waitReply, error) {
	var r waitReply
	var more int64
	err := ints(out, &r.result, &more, &r.now, &r.next)
	r.more = more == 1
	return r, err
}

// signalCall is "signal" (lua/ops/signal.lua) on keys, of the condition
// cond: one waiter, or all (a broadcast) whose sequence is at most bound
// ("" on the first call); id is unique to the call (a ticket), so that a
// resend finds the first run's reply.
func signalCall(keys []string, cond string, all bool, bound, id string) script.Call {
	mode := "1"
	if all {
		mode = "all"
	}
	return script.NewCall(script.OpSignal, keys, 4).With(cond, mode, bound, id)
}

// signalReply is "signal"'s reply: waiters woken, whether the condition
// has waiters left to wake (call again, with bound), and whether the
// queue has work left for a pump.
type signalReply struct {
	woken          int64
	condMore, more bool
	bound          string
}

func parseSignalReply(out script.Result) (signalReply, error) {
	var r signalReply
	var cmore, more, bound int64
	err := ints(out, &r.woken, &cmore, &more, &bound)
	r.condMore, r.more, r.bound = cmore == 1, more == 1, strconv.FormatInt(bound, 10)
	return r, err
}

// pumpCall is "pump" (lua/ops/pump.lua) on keys; parsePumpReply reads
// whether work is left still.
func pumpCall(keys []string) script.Call { return script.NewCall(script.OpPump, keys, 0) }

func parsePumpReply(out script.Result) (more bool, err error) {
	var m int64
	err = ints(out, &m)
	return m == 1, err
}

// statusCall is "status" (lua/ops/status.lua) on keys.
func statusCall(keys []string) script.Call { return script.NewCall(script.OpStatus, keys, 0) }

// holderMember reads a holder's member as the scripts write it
// (lua/members.lua): "ticket permits client token".
func holderMember(m string) (client string, permits, token int64, err error) {
	f := strings.Fields(m)
	if len(f) != 4 {
		return "", 0, 0, fmt.Errorf("not 4 fields")
	}
	if permits, err = strconv.ParseInt(f[1], 10, 64); err == nil {
		token, err = strconv.ParseInt(f[3], 10, 64)
	}
	return f[2], permits, token, err
}

// waiterMember reads a waiter's member as the scripts write it
// (lua/members.lua): "ticket permits client leaseMs waiterMs", then for a
// multi-request a tab and its group.
func waiterMember(m string) (client string, permits int64, err error) {
	head, _, _ := strings.Cut(m, "\t")
	f := strings.Fields(head)
	if len(f) != 5 {
		return "", 0, fmt.Errorf("not 5 fields")
	}
	permits, err = strconv.ParseInt(f[1], 10, 64)
	return f[2], permits, err
}

// ints reads a script's array reply into integers, in order.
func ints(out script.Result, into ...*int64) error {
	res, err := out.Slice()
	for i, v := range into {
		if err != nil {
			break
		}
		*v, err = script.Reply(res).Int(i)
	}
	return err
}

const (
	capacityErrPrefix = "FAIRLOCK_CAPACITY "
)

// fail turns an error from Redis or the connection into fairlock's error
// for op on the semaphores names (in the order the script took them). It is
// the one place where Redis errors become a call's (the errors a script
// names, through fault.ScriptError, which the background paths use too).
func fail(ctx context.Context, op string, names []string, err error) error {
	// Only the caller's context makes a context error the caller's; an
	// internal timeout means Redis did not answer in time.
	if ctxErr := ctx.Err(); ctxErr != nil {
		return opError(op, names, ctxErr)
	}
	if callpath.DeadlineLike(err) && callpath.PastDeadline(ctx) {
		// ctx's deadline, passed a moment before ctx says so (settle).
		return opError(op, names, context.DeadlineExceeded)
	}
	if errors.Is(err, ErrRedis) {
		return opError(op, names, err)
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, capacityErrPrefix); ok {
		// "<stored> <index>": the capacity stored with the index-th
		// semaphore.
		stored, idx, _ := strings.Cut(rest, " ")
		i, _ := strconv.Atoi(idx)
		if len(names) > 1 && i >= 1 && i <= len(names) {
			return opError(op, names, fmt.Errorf("%w: stored capacity of %q is %s", ErrCapacityMismatch, names[i-1], stored))
		}
		return opError(op, names, fmt.Errorf("%w: stored capacity is %s", ErrCapacityMismatch, stored))
	}
	if mapped := fault.ScriptError(err); mapped != err {
		return opError(op, names, mapped)
	}
	if strings.HasPrefix(msg, "CROSSSLOT") {
		return opError(op, names, fmt.Errorf("%w: %w", ErrCrossSlot, err))
	}
	return opError(op, names, fmt.Errorf("%w: %w", ErrRedis, err))
}

// msArg renders d as a script argument: whole milliseconds, at least 1.
func msArg(d time.Duration) string { return strconv.FormatInt(clock.MS(d), 10) }

// itoa renders n as a script argument.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// boolArg renders a bool as a script argument.
func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// boolBox is boolArg(b) boxed, once for all calls.
func boolBox(b bool) any {
	if b {
		return argTrue
	}
	return argFalse
}

var argTrue, argFalse any = "1", "0"

package fairlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Go side of each script op: the arguments it takes and the replies it
// gives (the Lua side documents both at the top of acquire.lua and
// release.lua), and the one place where a script's errors become
// fairlock's. Scripts are loaded and run in scripts.go; the ops are called
// from acquire.go (acquire, try, leave), lease.go (release, renew),
// renew.go (renew_batch), room.go (refresh), status.go (status), cond.go
// (wait, signal) and acquire.go's pumpLater (pump).

// The acquire script's reply codes (acquire.lua).
const (
	acqNotGranted    = 0 // "try": not free now
	acqGranted       = 1 // granted at once
	acqQueued        = 2 // queued; the grant comes on the wake list
	acqGrantedBefore = 3 // granted already, by a run whose reply was lost or by the queue
	acqEnded         = 4 // this request's grant ended before this call ran
)

// parseGrantReply reads {code, nowMs, expiryMs, token...}.
func parseGrantReply(res []any, parts int) (now int64, g grant, err error) {
	if len(res) != 3+parts {
		return 0, grant{}, fmt.Errorf("%w: grant reply %v for %d semaphores", ErrRedis, res, parts)
	}
	f := make([]string, 0, 1+parts)
	for _, v := range res[2:] {
		f = append(f, fmt.Sprint(v))
	}
	now, err = reply(res).int(1)
	if err == nil {
		g, err = parseGrant(f)
	}
	return now, g, err
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
func (p plan) releaseArgs(op, ticket string, c *Client, announced bool, tokens []int64) []any {
	return p.releaseArgsTTL(op, ticket, c, announced, tokens, c.cfg.leaseTTL)
}

// releaseArgsTTL is releaseArgs with the lease TTL given: only "renew" may
// ask for another than the client's (a cap on holding), since the other
// ops find a waiter by a member that contains the TTL it queued with.
func (p plan) releaseArgsTTL(op, ticket string, c *Client, announced bool, tokens []int64, ttl time.Duration) []any {
	args := make([]any, 0, 7+2*len(p.parts))
	args = append(args, op, ticket, c.id, ms(ttl), ms(c.cfg.waiterTTL), p.group, boolArg(announced))
	for i, pt := range p.parts {
		var tok int64
		if tokens != nil {
			tok = tokens[i]
		}
		args = append(args, pt.req.Permits, tok)
	}
	return args
}

// released reads release.lua's reply {result, more}; when the script left
// work for later (a long queue to grant, many leases to purge), it has the
// rest done in the background.
func (c *Client) released(p plan, cmd *redis.Cmd) (int64, error) {
	res, err := cmd.Slice()
	var n, more int64
	if err == nil {
		n, err = reply(res).int(0)
	}
	if err == nil {
		more, err = reply(res).int(1)
	}
	if err == nil && more == 1 {
		c.pumpLater(p)
	}
	return n, err
}

// renewedBatch reads a renew_batch reply {{result...}, more}, handing on
// work the script left.
func (c *Client) renewedBatch(p plan, o outcome, n int) ([]int64, error) {
	res, err := o.cmd.Slice()
	if err != nil {
		return nil, err
	}
	more, err := reply(res).int(1)
	if err != nil {
		return nil, err
	}
	list, _ := res[0].([]any)
	if len(list) != n {
		return nil, fmt.Errorf("%w: renewal reply %v for %d leases", ErrRedis, res, n)
	}
	out := make([]int64, n)
	for i := range list {
		if out[i], err = reply(list).int(i); err != nil {
			return nil, err
		}
	}
	if more == 1 {
		c.pumpLater(p)
	}
	return out, nil
}

const capacityErrPrefix = "FAIRLOCK_CAPACITY "

// fail turns an error from Redis or the connection into fairlock's error
// for op on the semaphores names (in the order the script took them). It is
// the one place where Redis errors are mapped.
func fail(ctx context.Context, op string, names []string, err error) error {
	// Only the caller's context makes a context error the caller's; an
	// internal timeout means Redis did not answer in time.
	if ctxErr := ctx.Err(); ctxErr != nil {
		return opError(op, names, ctxErr)
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
	if strings.HasPrefix(msg, "CROSSSLOT") {
		return opError(op, names, fmt.Errorf("%w: %w", ErrCrossSlot, err))
	}
	return opError(op, names, fmt.Errorf("%w: %w", ErrRedis, err))
}

// reply reads a script's array reply as integers and strings.
type reply []any

func (r reply) int(i int) (int64, error) {
	if i >= len(r) {
		return 0, fmt.Errorf("short script reply %v", []any(r))
	}
	switch v := r[i].(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("unexpected script reply %v", []any(r))
}

// parseWake splits a wake-up "ticket expiryMs token..." pushed by
// queue.lua: the grant's expiry by Redis's clock, then one token per
// semaphore of the ticket's request.
func parseWake(s string) (ticket string, g grant, ok bool) {
	f := strings.Fields(s)
	if len(f) < 3 {
		return "", grant{}, false
	}
	g, err := parseGrant(f[1:])
	return f[0], g, err == nil
}

// grant is a grant as a script reports it: its expiry by Redis's clock and
// a token per semaphore.
type grant struct {
	expiry int64 // ms, Redis's clock
	tokens []int64
}

// parseGrant reads "expiryMs token..." fields.
func parseGrant(f []string) (grant, error) {
	if len(f) < 2 {
		return grant{}, fmt.Errorf("bad grant %q", f)
	}
	exp, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return grant{}, fmt.Errorf("bad grant expiry %q", f[0])
	}
	tokens, err := parseTokens(f[1:])
	return grant{expiry: exp, tokens: tokens}, err
}

func parseTokens(f []string) ([]int64, error) {
	tokens := make([]int64, len(f))
	for i, s := range f {
		t, err := strconv.ParseInt(s, 10, 64)
		if err != nil || t <= 0 {
			return nil, fmt.Errorf("bad token %q", s)
		}
		tokens[i] = t
	}
	return tokens, nil
}

package fairlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
)

// Status is a snapshot of one semaphore, as [Client.Status] reads it.
type Status struct {
	Name     string `json:"name"`
	Capacity int64  `json:"capacity"` // 0 when the semaphore is idle
	// InUse is the permits held by live leases, by Redis's clock, all of
	// them counted however many (not only those listed). It is exact
	// unless more than 10,000 leases have expired and no script has
	// dropped them yet (any call on the semaphore drops expired leases);
	// then each lease past those counts as one permit, an upper bound.
	InUse   int64    `json:"in_use"`
	Holders []Holder `json:"holders"`
	Waiters []Waiter `json:"waiters"` // in queue order
	// Held counts the live leases and Queued the live requests in the
	// queue, by Redis's clock, however many: at most [StatusMax] of each
	// are listed in Holders and Waiters. Leases that have expired are not
	// counted, even where no script has dropped them yet; nor are waiters
	// whose process died among the first [StatusMax] in the queue (those
	// past them count until they reach its head, where they are dropped).
	Queued int64 `json:"queued"`
	Held   int64 `json:"held"`
	// Time is Redis's clock when the snapshot was read, in milliseconds.
	Time time.Time `json:"time"`
	// OldestWait is how long the first waiter in the queue has waited, by
	// Redis's clock (Time less its Since); 0 with no waiter.
	OldestWait time.Duration `json:"oldest_wait_ns"`
}

// StatusMax is the most holders, and the most waiters, one [Status] lists:
// a snapshot of a queue of any length costs Redis a bounded time.
const StatusMax = 1000

// Holder is a live lease in a [Status].
type Holder struct {
	Owner     string        `json:"owner"` // the holder's [WithOwner] label, or its client id
	Permits   int64         `json:"permits"`
	Token     int64         `json:"token"`
	ExpiresIn time.Duration `json:"expires_in_ns"` // by Redis's clock; renewed while held
	// HeldFor is the lease's age by Redis's clock, derived from its token
	// (Redis's clock in microseconds at the grant, raised by one where
	// grants came faster) and Time. It is an approximation bounded below
	// by 0 that does not exceed the true age: it falls short of it by under
	// a millisecond (Time's resolution) plus the microseconds the token was
	// raised. After Redis's clock stepped back (a failover to a server
	// behind), it reads low, at worst 0. Renewals do not reset it.
	HeldFor time.Duration `json:"held_for_ns"`
}

// Waiter is a queued request in a [Status].
type Waiter struct {
	Owner   string    `json:"owner"`
	Permits int64     `json:"permits"`
	Since   time.Time `json:"since"` // arrival, by Redis's clock
}

// Status reads who holds and who waits for the semaphore name, in one
// atomic, read-only step. It leaves out leases that have expired and
// waiters whose process stopped refreshing, even where Redis has not yet
// dropped them. It lists at most [StatusMax] holders (the first to expire)
// and the first StatusMax waiters in queue order, so that its cost to Redis
// is bounded however long the queue; Held, Queued and InUse count them
// all.
//
// Status returns by ctx's end whatever state Redis is in, with an error
// for which errors.Is(err, ctx.Err()) holds; it reports a Redis that
// cannot be reached with an error matching [ErrRedis], at once when it
// refuses the connection or its name does not resolve (see [New]). A
// reply it cannot read (keys under the prefix that something other than
// fairlock wrote) also gives an error matching ErrRedis. An invalid name fails at once with [ErrInvalidName]. Status
// changes nothing in Redis.
func (c *Client) Status(ctx context.Context, name string) (Status, error) {
	k, err := c.keys(name)
	if err != nil {
		return Status{}, opError("status", []string{name}, err)
	}
	o, _ := c.calls.Call(ctx, func(ctx context.Context) callpath.Outcome {
		res, _ := c.calls.Run(ctx, ops.StatusCall(k.List()))
		return callpath.Outcome{Res: res}
	}, nil)
	res, err := o.Res.Slice()
	if err != nil {
		return Status{}, fail(ctx, "status", []string{name}, err)
	}
	st := Status{Name: name, Holders: []Holder{}, Waiters: []Waiter{}}
	now, err := script.Reply(res).Int(0)
	if err == nil {
		st.Capacity, err = script.Reply(res).Int(1)
	}
	if err == nil {
		st.Held, err = script.Reply(res).Int(4)
	}
	if err == nil {
		st.Queued, err = script.Reply(res).Int(5)
	}
	if err == nil {
		st.InUse, err = script.Reply(res).Int(6)
	}
	if err != nil || len(res) < 7 {
		return Status{}, opError("status", []string{name}, fmt.Errorf("%w: bad reply %v: %w", ErrRedis, res, err))
	}
	// A member fairlock did not write (its key space changed by hand, or
	// by another version) fails the call rather than be left out.
	bad := func(what string, v any, err error) (Status, error) {
		return Status{}, opError("status", []string{name}, fmt.Errorf("%w: bad %s %q in reply: %w", ErrRedis, what, fmt.Sprint(v), err))
	}
	score := func(v any) (float64, error) { return strconv.ParseFloat(fmt.Sprint(v), 64) }
	hs, _ := res[2].([]any)
	for i := 0; i+1 < len(hs); i += 2 {
		client, n, tok, err := ops.HolderMember(fmt.Sprint(hs[i]))
		if err != nil {
			return bad("holder", hs[i], err)
		}
		at, err := score(hs[i+1])
		if err != nil {
			return bad("holder expiry", hs[i+1], err)
		}
		st.Holders = append(st.Holders, Holder{Owner: owner(client), Permits: n, Token: tok,
			ExpiresIn: time.Duration(int64(at)-now) * time.Millisecond,
			HeldFor:   max(time.Duration(now*1000-tok)*time.Microsecond, 0)})
	}
	ws, _ := res[3].([]any)
	for i := 0; i+1 < len(ws); i += 2 {
		client, n, err := ops.WaiterMember(fmt.Sprint(ws[i]))
		if err != nil {
			return bad("waiter", ws[i], err)
		}
		seq, err := score(ws[i+1])
		if err != nil {
			return bad("waiter arrival", ws[i+1], err)
		}
		st.Waiters = append(st.Waiters, Waiter{Owner: owner(client), Permits: n,
			Since: time.UnixMicro(int64(seq)).UTC()})
	}
	if len(st.Holders)+len(st.Waiters) == 0 {
		st.Capacity = 0
	}
	st.Time = time.UnixMilli(now).UTC()
	if len(st.Waiters) > 0 {
		st.OldestWait = max(st.Time.Sub(st.Waiters[0].Since), 0)
	}
	st.Held, st.Queued = max(st.Held, int64(len(st.Holders))), max(st.Queued, int64(len(st.Waiters)))
	return st, nil
}

// owner returns the label part of a client id ("label/random", after
// keyspace.ProcessListMark on one server), or the id without the mark when it has
// none.
func owner(client string) string {
	client = keyspace.Unmarked(client)
	if i := strings.LastIndexByte(client, '/'); i >= 0 {
		return client[:i]
	}
	return client
}

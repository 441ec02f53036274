package wait

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/fairlock/fairlock/internal/script"
)

// RefreshArgs starts the arguments of "refresh" (lua/ops/refresh.lua) for
// waiters queued with the lease TTL lease (a script argument), with room
// for n tickets; appendRefreshed adds one ticket, and refreshCount counts
// them.
func (c *Waits) RefreshArgs(n int, lease string) []string {
	args := make([]string, 0, 4+3*n)
	return append(args, script.OpRefresh.Name, c.ID, lease, c.WaiterMs)
}

func AppendRefreshed(args []string, ticket string, permits int64, group string) []string {
	return append(args, ticket, strconv.FormatInt(permits, 10), group)
}

func RefreshCount(args []string) int { return (len(args) - 4) / 3 }

// RefreshedTicket returns the i-th ticket of refresh args.
func RefreshedTicket(args []string, i int) string { return args[4+3*i] }

// refreshReply is "refresh"'s reply: the queue's next event (ms, -1 for
// none), Redis's clock, and the tickets that no longer wait.
type refreshReply struct {
	next, now int64
	gone      []refreshed
}

// refreshed is a ticket that no longer waits: granted (grant set, in case
// its wake-up was lost), or dropped (nil: it queues again).
type refreshed struct {
	ticket string
	grant  *Grant
}

func parseRefreshReply(out script.Result) (refreshReply, error) {
	var r refreshReply
	res, err := out.Slice()
	if err == nil {
		r.next, err = script.Reply(res).Int(0)
	}
	if err == nil {
		r.now, err = script.Reply(res).Int(2)
	}
	if err != nil {
		return r, err
	}
	gone, _ := res[1].([]any)
	for i := 0; i+1 < len(gone); i += 2 {
		ticket, _ := gone[i].(string)
		granted, _ := gone[i+1].(string)
		t := refreshed{ticket: ticket}
		if granted != "0" {
			g, err := parseGrant(strings.Fields(granted))
			if err != nil {
				return r, err
			}
			t.grant = &g
		}
		r.gone = append(r.gone, t)
	}
	return r, nil
}

// parseWake splits a wake-up "ticket expiryMs token..." pushed by
// queue.lua: the grant's expiry by Redis's clock, then one token per
// semaphore of the ticket's request.
func parseWake(s string) (ticket string, g Grant, ok bool) {
	f := strings.Fields(s)
	if len(f) < 3 {
		return "", Grant{}, false
	}
	g, err := parseGrant(f[1:])
	return f[0], g, err == nil
}

// Grant is a grant as a script reports it: its expiry by Redis's clock and
// a token per semaphore.
type Grant struct {
	Expiry int64 // ms, Redis's clock
	Tokens []int64
	// Tok0 is tokens[0] as a script argument, boxed, when the reply gave
	// it in canonical form (the decimal of tokens[0]); nil otherwise.
	Tok0 any
}

// CanonicalToken reports whether s, which parsed as a token > 0, is
// the decimal of its value: no sign, no leading zero.
func CanonicalToken(s string) bool { return s != "" && s[0] >= '1' && s[0] <= '9' }

// parseGrant reads "expiryMs token..." fields.
func parseGrant(f []string) (Grant, error) {
	if len(f) < 2 {
		return Grant{}, fmt.Errorf("bad grant %q", f)
	}
	exp, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return Grant{}, fmt.Errorf("bad grant expiry %q", f[0])
	}
	tokens, err := parseTokens(f[1:])
	return Grant{Expiry: exp, Tokens: tokens}, err
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

// Group counts the goroutines a client's Close waits for.
type Group interface {
	Add(int)
	Done()
}

const (
	// RenewDivisor: a waiter's liveness is refreshed every waiter TTL ÷
	// RenewDivisor (and a lease renewed every lease TTL ÷ RenewDivisor).
	RenewDivisor = 3
	// RetryDivisor: a failed refresh is tried again after waiter TTL ÷
	// RetryDivisor.
	RetryDivisor = 10
)

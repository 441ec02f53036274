// Package ops is the Go side of the engine's script ops: the reply each
// gives, read by one function each, the arguments shared by several, and
// the members the replies carry (the Lua side documents both in the
// header of the op's entry: acquire.lua, release.lua, lua/ops/*.lua). The
// ops themselves (which script serves each, and whether WithReplicaAck
// waits for it) are in internal/script, and the call path
// (internal/callpath) runs them. The calls that name a request's
// semaphores are built by the root package's plan (plan.go), which also
// turns a script's errors into fairlock's (errors.go's fail);
// internal/renew builds its own renew_batch, and internal/wait its
// refresh.
package ops

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// The acquire script's reply codes (acquire.lua).
const (
	AcqNotGranted    = 0 // "try": not free now
	AcqGranted       = 1 // granted at once
	AcqQueued        = 2 // queued; the grant comes on the wake list
	AcqGrantedBefore = 3 // granted already, by a run whose reply was lost or by the queue
	AcqEnded         = 4 // this request's grant ended before this call ran
)

// ReleasedNoTrace is release.lua's "release" (and "wait") result when it
// finds neither the lease nor any record of its ticket (nor, for "wait", of
// the new ticket): released by an earlier run of the call if it was sent
// while the lease lived, else perhaps long ended.
const ReleasedNoTrace = 3

// ReleaseResult reads a release's result n as 1 (released) or 0 (the lease
// was lost): ReleasedNoTrace is released when the release, or the call
// that released before it (a condition wait), was sent while the lease
// surely lived by this process's clock (sentLive), else lost.
func ReleaseResult(n int64, sentLive bool) int64 {
	if n != ReleasedNoTrace {
		return n
	}
	if sentLive {
		return 1
	}
	return 0
}

// AcquireReply is acquire.lua's reply: its code, Redis's clock (ms), and
// by the code the grant (AcqGranted, AcqGrantedBefore) or when the queue's
// next event is due (AcqQueued, ms from now).
type AcquireReply struct {
	Code, Now, Next int64
	Grant           wait.Grant
}

// ParseAcquireReply reads acquire.lua's reply to a request for parts
// semaphores: {1 or 3, nowMs, expiryMs, token...}, {2, nowMs,
// nextEventMs}, {0} or {4}. The error is the command's, or a reply that
// does not read as one of those (matching fault.ErrRedis).
func ParseAcquireReply(out script.Result, parts int) (AcquireReply, error) {
	var r AcquireReply
	res, err := out.Slice()
	if err != nil {
		return r, err
	}
	bad := func(err error) (AcquireReply, error) {
		return r, fmt.Errorf("%w: acquire script reply %v: %w", fault.ErrRedis, res, err)
	}
	if r.Code, err = script.Reply(res).Int(0); err != nil {
		return bad(err)
	}
	switch r.Code {
	case AcqNotGranted, AcqEnded:
		return r, nil
	case AcqQueued:
		if r.Now, err = script.Reply(res).Int(1); err == nil {
			r.Next, err = script.Reply(res).Int(2)
		}
		if err != nil {
			return bad(err)
		}
		return r, nil
	case AcqGranted, AcqGrantedBefore:
	default:
		return bad(fmt.Errorf("unknown code %d", r.Code))
	}
	if len(res) != 3+parts {
		return bad(fmt.Errorf("a grant for %d semaphores", parts))
	}
	if r.Now, err = script.Reply(res).Int(1); err != nil {
		return bad(err)
	}
	if r.Grant.Expiry, err = script.Reply(res).Int(2); err != nil {
		return bad(fmt.Errorf("bad grant expiry %q", fmt.Sprint(res[2])))
	}
	r.Grant.Tokens = make([]int64, parts)
	for i := range parts {
		t, err := script.Reply(res).Int(3 + i)
		if err != nil || t <= 0 {
			return bad(fmt.Errorf("bad token %q", fmt.Sprint(res[3+i])))
		}
		r.Grant.Tokens[i] = t
	}
	if s, ok := res[3].(string); ok && parts == 1 && wait.CanonicalToken(s) {
		r.Grant.Tok0 = res[3] // already boxed: no allocation
	}
	return r, nil
}

// WaitReply is "wait"'s reply: result 1 (the new ticket waits), 0 (the
// lease was no longer held) or ReleasedNoTrace, work left for a pump, Redis's clock and the
// queue's next event (ms).
type WaitReply struct {
	Result    int64
	More      bool
	Now, Next int64
}

// ParseWaitReply reads "wait"'s reply (WaitReply).
func ParseWaitReply(out script.Result) (WaitReply, error) {
	var r WaitReply
	var more int64
	err := Ints(out, &r.Result, &more, &r.Now, &r.Next)
	r.More = more == 1
	return r, err
}

// SignalCall is "signal" (lua/ops/signal.lua) on keys, of the condition
// cond: one waiter, or all (a broadcast) whose sequence is at most bound
// ("" on the first call); id is unique to the call (a ticket), so that a
// resend finds the first run's reply.
func SignalCall(keys []string, cond string, all bool, bound, id string) script.Call {
	mode := "1"
	if all {
		mode = "all"
	}
	return script.NewCall(script.OpSignal, keys, 4).With(cond, mode, bound, id)
}

// SignalReply is "signal"'s reply: waiters woken, whether the condition
// has waiters left to wake (call again, with bound), and whether the
// queue has work left for a pump.
type SignalReply struct {
	Woken          int64
	CondMore, More bool
	Bound          string
}

// ParseSignalReply reads "signal"'s reply (SignalReply).
func ParseSignalReply(out script.Result) (SignalReply, error) {
	var r SignalReply
	var cmore, more, bound int64
	err := Ints(out, &r.Woken, &cmore, &more, &bound)
	r.CondMore, r.More, r.Bound = cmore == 1, more == 1, strconv.FormatInt(bound, 10)
	return r, err
}

// PumpCall is "pump" (lua/ops/pump.lua) on keys; ParsePumpReply reads
// whether work is left still.
func PumpCall(keys []string) script.Call { return script.NewCall(script.OpPump, keys, 0) }

// ParsePumpReply reads "pump"'s reply: whether work is left still.
func ParsePumpReply(out script.Result) (more bool, err error) {
	var m int64
	err = Ints(out, &m)
	return m == 1, err
}

// StatusCall is "status" (lua/ops/status.lua) on keys.
func StatusCall(keys []string) script.Call { return script.NewCall(script.OpStatus, keys, 0) }

// HolderMember reads a holder's member as the scripts write it
// (lua/members.lua): "ticket permits client token".
func HolderMember(m string) (client string, permits, token int64, err error) {
	f := strings.Fields(m)
	if len(f) != 4 {
		return "", 0, 0, fmt.Errorf("not 4 fields")
	}
	if permits, err = strconv.ParseInt(f[1], 10, 64); err == nil {
		token, err = strconv.ParseInt(f[3], 10, 64)
	}
	return f[2], permits, token, err
}

// WaiterMember reads a waiter's member as the scripts write it
// (lua/members.lua): "ticket permits client leaseMs waiterMs", then for a
// multi-request a tab and its group.
func WaiterMember(m string) (client string, permits int64, err error) {
	head, _, _ := strings.Cut(m, "\t")
	f := strings.Fields(head)
	if len(f) != 5 {
		return "", 0, fmt.Errorf("not 5 fields")
	}
	permits, err = strconv.ParseInt(f[1], 10, 64)
	return f[2], permits, err
}

// Ints reads a script's array reply into integers, in order.
func Ints(out script.Result, into ...*int64) error {
	res, err := out.Slice()
	for i, v := range into {
		if err != nil {
			break
		}
		*v, err = script.Reply(res).Int(i)
	}
	return err
}

// MsArg renders d as a script argument: whole milliseconds, at least 1.
func MsArg(d time.Duration) string { return strconv.FormatInt(clock.MS(d), 10) }

// Itoa renders n as a script argument.
func Itoa(n int64) string { return strconv.FormatInt(n, 10) }

// BoolArg renders a bool as a script argument.
func BoolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// BoolBox is BoolArg(b) boxed, once for all calls.
func BoolBox(b bool) any {
	if b {
		return ArgTrue
	}
	return ArgFalse
}

var ArgTrue, ArgFalse any = "1", "0"

package fairlock

// The countdown latch in the call machine (differential_calls_test.go):
// its three scripts drawn directly (a Wait's, a CountDown's under an id
// of its own, a Count's), now and then with another count than the
// stored one, and its waiters refreshed, withdrawn ("leave", with the
// machine's other waiters) and woken on their processes' wake lists
// (hear). The latch has no fast path of its own: in the fast-vs-general
// pair its calls are compared as every call is, and they reach the
// resend and foreign-key pairs and the batches' histories too. The
// machine also checks the count: what each CountDown and Count answers is
// init less the distinct CountDowns (a resent one, which the "resend"
// action makes, counts once), never below 0.

import (
	"fmt"
	"slices"

	"github.com/fairlock/fairlock/internal/keyspace"
	"pgregory.net/rapid"
)

// clatch is the call machine's latch.
type clatch struct {
	init, count int64
	res         *csem // its waiters' resource: never acquired
	k           latchKeys
	downs       map[string]string // each count down's first reply, by its id
}

// callLatchTTL is the count's TTL: longer than any run's clock.
const callLatchTTL = 24 * 3600 * 1000

// newCallLatch draws the machine's latch.
func (m *callMachine) newCallLatch(t *rapid.T) {
	k := keyspace.Keys{Base: callPrefix + "{l}"}
	lk := latchKeysOf(k)
	init := rapid.Int64Range(1, 3).Draw(t, "latch count")
	m.latch = &clatch{init: init, count: init, k: lk, res: &csem{name: "l", base: lk.res.Base}, downs: map[string]string{}}
}

// isLatchWaiter reports whether tk waits on the machine's latch.
func (m *callMachine) isLatchWaiter(tk *cticket) bool {
	return m.latch != nil && tk.parts[0].sem == m.latch.res
}

// latchCall is one call about the latch.
func (m *callMachine) latchCall(t *rapid.T) {
	l := m.latch
	init := l.init
	if rapid.IntRange(0, 15).Draw(t, "other latch count") == 0 {
		init++ // refused, having written nothing
	}
	// latch.lua's KEYS: the waiters' resource's, its condition's, the
	// count (latchKeys.call).
	keys := append(append(l.k.res.List(), condKeys(l.k.res, latchCond)...), l.k.count)
	run := func(op string, args ...string) []any {
		res, _ := m.exec(call{Keys: keys, Args: append([]string{op, num(init)}, args...)}).([]any)
		return res
	}
	switch rapid.SampledFrom([]string{"wait", "wait", "count down", "count", "refresh"}).Draw(t, "latch op") {
	case "wait":
		p := m.drawProc(t)
		tk := &cticket{ticket: m.newTicket(), p: p, parts: []cpart{{l.res, 1}}, cond: "c:" + latchCond}
		res := run("latch_wait", num(callLatchTTL), tk.ticket, p.id, num(p.lease), num(p.wait))
		if len(res) > 0 && res[0] == int64(1) {
			m.waiting = append(m.waiting, tk)
		}
	case "count down":
		id := m.newTicket()
		res := run("latch_down", num(callLatchTTL), id)
		if len(res) == 0 || init != l.init {
			return
		}
		l.downs[id] = fmt.Sprint(res)
		l.count = max(l.count-1, 0)
		if n, _ := res[0].(int64); n != l.count {
			t.Fatalf("latch_down answered %v; the count is %d (init %d less the distinct count downs, floored at 0)", res, l.count, l.init)
		}
	case "count":
		res := run("latch_count")
		if len(res) == 0 || init != l.init {
			return
		}
		if n, _ := res[0].(int64); n != l.count {
			t.Fatalf("latch_count answered %v; the count is %d", res, l.count)
		}
	case "refresh":
		// A process refreshes its latch waiters (its room on the latch's
		// resource): gone ("0") once the latch is open.
		p := m.drawProc(t)
		args := []string{"refresh", p.id, num(p.lease), num(p.wait)}
		for _, tk := range m.waiting {
			if tk.p == p && m.isLatchWaiter(tk) {
				args = append(args, tk.ticket, "1", "")
			}
		}
		res, _ := m.exec(call{Keys: l.res.keys(), Args: args}).([]any)
		if len(res) < 2 {
			return
		}
		gone, _ := res[1].([]any)
		for i := 0; i+1 < len(gone); i += 2 {
			m.learn(fmt.Sprint(gone[i]), fmt.Sprint(gone[i+1]))
		}
	}
}

// latchWoken takes a latch waiter that heard its wake-up (or that a
// refresh reported gone) off the machine's waiters: the latch is open,
// and nothing was granted.
func (m *callMachine) latchWoken(ticket string) bool {
	i := slices.IndexFunc(m.waiting, func(tk *cticket) bool { return tk.ticket == ticket && m.isLatchWaiter(tk) })
	if i < 0 {
		return false
	}
	m.waiting = slices.Delete(m.waiting, i, i+1)
	return true
}

// wakeSems are the resources whose wake lists the machine's processes
// hear: its semaphores, and its latch's and its barrier's waiters'
// resources.
func (m *callMachine) wakeSems() []*csem {
	sems := slices.Clip(m.sems)
	if m.latch != nil {
		sems = append(sems, m.latch.res)
	}
	if m.barrier != nil {
		sems = append(sems, m.barrier.res)
	}
	return sems
}

// resendDown sends the count down c again now, as the resend action sends
// any call, but only within copyWindow of its first run: the promise that
// a count down acts once covers the copies a client sends (go-redis's,
// on a connection whose reply was lost; CountDown's own, for at most its
// waiter TTL), which a count down's record (kept as a tombstone, 10 to
// 20 s) answers. A copy later than that finds its record trimmed, or its
// keys expired, and is a new count down; no client sends one. The copy
// must answer what the first run answered, and change no count.
func (m *callMachine) resendDown(t *rapid.T, c call) {
	if !m.recent(c) {
		t.Skip("a count down's copy comes within the copy window")
	}
	res := m.exec(call{Script: c.Script, Keys: c.Keys, Args: c.Args})
	if first, ok := m.latch.downs[c.Args[3]]; ok && fmt.Sprint(res) != first {
		t.Fatalf("a copy of a count down answered %v, its first run %s: it counted again", res, first)
	}
}

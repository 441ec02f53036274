package fairlock

// The cyclic barrier in the call machine (differential_calls_test.go), as
// the countdown latch is (differential_latch_test.go): its three scripts
// drawn directly (an arrival under a ticket of its own, a break of an
// arrival's round, a status), now and then with other parties than the
// stored ones, and its waiters refreshed, withdrawn ("leave") and woken
// on their processes' wake lists (hear). Its calls are compared in the
// fast-vs-general pair, the resend pair and the foreign-key pair.
//
// The machine checks what the barrier answers against its arrivals,
// whatever the clock did to its waiters (a dead or withdrawn one breaks
// its round): an arrival that waits is the next of its round, in arrival
// order, in a round no earlier than the last; an arrival that completes
// its round is its last party, after parties-1 arrivals that waited in
// it (none of which left); a round that completed never broke, and a waiter woken "completed"
// waited in a round that completed, one woken "broken" in one that did
// not; an intact round's status lists its waiters' processes in arrival
// order.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fairlock/fairlock/internal/keyspace"
	"pgregory.net/rapid"
)

// cbarrier is the call machine's barrier.
type cbarrier struct {
	parties int64
	res     *csem // its waiters' resource: never acquired
	k       barrierKeys
	round   int64                // the latest round an arrival was answered in
	waited  map[int64][]*cticket // by round, the arrivals that waited in it, in order
	roundOf map[string]int64     // by ticket, the round it arrived in
	ended   map[int64]string     // by round: "completed" or "broken"
	lost    map[int64]bool       // the rounds a waiter left (withdrawn) before they ended
}

// newCallBarrier draws the machine's barrier.
func (m *callMachine) newCallBarrier(t *rapid.T) {
	bk := barrierKeysOf(keyspace.Keys{Base: callPrefix + "{b}"})
	m.barrier = &cbarrier{
		parties: rapid.Int64Range(1, 3).Draw(t, "barrier parties"),
		res:     &csem{name: "b", base: bk.res.Base},
		k:       bk,
		round:   1,
		waited:  map[int64][]*cticket{},
		roundOf: map[string]int64{},
		ended:   map[int64]string{},
		lost:    map[int64]bool{},
	}
}

// isBarrierWaiter reports whether tk waits on the machine's barrier.
func (m *callMachine) isBarrierWaiter(tk *cticket) bool {
	return m.barrier != nil && tk.parts[0].sem == m.barrier.res
}

// barrierEnd notes that round ended as outcome says, and fails if it
// ended otherwise before.
func (m *callMachine) barrierEnd(t *rapid.T, round int64, outcome string) {
	b := m.barrier
	if was, ok := b.ended[round]; ok && was != outcome {
		t.Fatalf("barrier round %d %s, and %s before", round, outcome, was)
	}
	b.ended[round] = outcome
}

// barrierReached notes that an arrival was answered in round r: the
// rounds before it ended, broken unless they completed.
func (m *callMachine) barrierReached(t *rapid.T, r int64) {
	b := m.barrier
	for q := b.round; q < r; q++ {
		if _, ok := b.ended[q]; !ok {
			m.barrierEnd(t, q, "broken")
		}
	}
	b.round = r
}

// barrierCall is one call about the barrier.
func (m *callMachine) barrierCall(t *rapid.T) {
	b := m.barrier
	parties := b.parties
	if rapid.IntRange(0, 15).Draw(t, "other barrier parties") == 0 {
		parties++ // refused, having written nothing
	}
	// barrier.lua's KEYS: the waiters' resource's, its condition's, the
	// hash (barrierKeys.call).
	keys := append(append(b.k.res.List(), condKeys(b.k.res, barrierCond)...), b.k.state)
	run := func(op string, args ...string) []any {
		res, _ := m.exec(call{Keys: keys, Args: append([]string{op, num(parties)}, args...)}).([]any)
		if parties != b.parties {
			return nil
		}
		return res
	}
	ints := func(res []any) []int64 {
		out := make([]int64, len(res))
		for i, v := range res {
			out[i], _ = v.(int64)
		}
		return out
	}
	switch rapid.SampledFrom([]string{"await", "await", "await", "break", "status", "refresh"}).Draw(t, "barrier op") {
	case "await":
		p := m.drawProc(t)
		tk := &cticket{ticket: m.newTicket(), p: p, parts: []cpart{{b.res, 1}}, cond: "c:" + barrierCond}
		res := ints(run("barrier_await", num(callLatchTTL), tk.ticket, p.id, num(p.lease), num(p.wait), ""))
		if len(res) == 0 {
			return
		}
		switch res[0] {
		case 0: // completed its round: its last party
			r, idx := res[1], res[2]
			if b.lost[r] {
				t.Fatalf("an arrival answered %v: it completed round %d, which a waiter left", res, r)
			}
			if r < b.round || idx != b.parties-1 || len(b.waited[r]) != int(b.parties-1) {
				t.Fatalf("an arrival answered %v (completed round %d as party %d); the barrier has %d parties, and %d arrivals waited in that round (the latest round %d)",
					res, r, idx, b.parties, len(b.waited[r]), b.round)
			}
			m.barrierReached(t, r)
			b.roundOf[tk.ticket] = r
			m.barrierEnd(t, r, "completed")
		case 1: // waits
			r, idx := res[3], res[4]
			if r < b.round || idx != int64(len(b.waited[r])) || idx >= b.parties-1 {
				t.Fatalf("an arrival answered %v (waits in round %d as party %d); %d arrivals waited in that round before it (the latest round %d, %d parties)",
					res, r, idx, len(b.waited[r]), b.round, b.parties)
			}
			if _, ended := b.ended[r]; ended {
				t.Fatalf("an arrival answered %v: it waits in round %d, which ended (%s)", res, r, b.ended[r])
			}
			m.barrierReached(t, r)
			b.waited[r] = append(b.waited[r], tk)
			b.roundOf[tk.ticket] = r
			m.waiting = append(m.waiting, tk)
			m.barrierStatus(t, run) // its round as the status reads it
		default:
			t.Fatalf("a new arrival answered %v", res)
		}
	case "break":
		// An arrival whose caller's context ended breaks its round.
		var ws []*cticket
		for _, tk := range m.waiting {
			if m.isBarrierWaiter(tk) {
				ws = append(ws, tk)
			}
		}
		if len(ws) == 0 {
			t.Skip("no barrier waiter")
		}
		tk := ws[rapid.IntRange(0, len(ws)-1).Draw(t, "barrier waiter")]
		r := b.roundOf[tk.ticket]
		res := ints(run("barrier_break", num(callLatchTTL), tk.ticket, num(r)))
		if len(res) > 0 && res[0] == 1 {
			m.barrierEnd(t, r, "broken")
		}
	case "status":
		m.barrierStatus(t, run)
	case "refresh":
		// A process refreshes its barrier waiters (its room on the
		// barrier's resource): gone once their round ended or broke.
		p := m.drawProc(t)
		args := []string{"refresh", p.id, num(p.lease), num(p.wait)}
		for _, tk := range m.waiting {
			if tk.p == p && m.isBarrierWaiter(tk) {
				args = append(args, tk.ticket, "1", "")
			}
		}
		res, _ := m.exec(call{Keys: b.res.keys(), Args: args}).([]any)
		if len(res) < 2 {
			return
		}
		gone, _ := res[1].([]any)
		for i := 0; i+1 < len(gone); i += 2 {
			m.learn(fmt.Sprint(gone[i]), fmt.Sprint(gone[i+1]))
		}
	}
}

// barrierStatus reads the barrier's status through run and checks it: a
// round no earlier than the latest, the parties, fewer clients than
// parties, and for the latest round while it is intact, its waiters'
// processes in arrival order.
func (m *callMachine) barrierStatus(t *rapid.T, run func(op string, args ...string) []any) {
	b := m.barrier
	out := run("barrier_status")
	if len(out) < 3 {
		return
	}
	res := make([]int64, 3)
	for i := range res {
		res[i], _ = out[i].(int64)
	}
	r, broken, clients := res[0], res[2], out[3:]
	if r < b.round || res[1] != b.parties || len(clients) >= int(b.parties) {
		t.Fatalf("status answered %v; the latest round %d, %d parties", out, b.round, b.parties)
	}
	if _, ended := b.ended[r]; broken != 0 || r != b.round || ended {
		return
	}
	var want, got []string
	for _, tk := range b.waited[r] {
		want = append(want, tk.p.id)
	}
	for _, v := range clients {
		got = append(got, fmt.Sprint(v))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("status of intact round %d lists %q; its arrivals waited from %q", r, got, want)
	}
}

// barrierLeft notes that the barrier waiter tk was withdrawn ("leave"):
// its round, unless it ended first, can no longer complete.
func (m *callMachine) barrierLeft(tk *cticket) {
	r := m.barrier.roundOf[tk.ticket]
	if _, ended := m.barrier.ended[r]; !ended {
		m.barrier.lost[r] = true
	}
}

// barrierWoken takes a barrier waiter that heard its wake-up (or that a
// refresh reported gone) off the machine's waiters, and checks the
// outcome a wake-up carries ("expiry outcome": 1 completed, 2 broken)
// against its round's.
func (m *callMachine) barrierWoken(ticket, grant string) bool {
	i := slices.IndexFunc(m.waiting, func(tk *cticket) bool { return tk.ticket == ticket && m.isBarrierWaiter(tk) })
	if i < 0 {
		return false
	}
	m.waiting = slices.Delete(m.waiting, i, i+1)
	f := strings.Fields(grant)
	if len(f) < 2 {
		return true // gone: its outcome is in its record
	}
	b := m.barrier
	r := b.roundOf[ticket]
	outcome := map[string]string{"1": "completed", "2": "broken"}[f[1]]
	if outcome == "" {
		m.t.Fatalf("barrier waiter %s woken with %q", ticket, grant)
	}
	if outcome == "completed" && b.ended[r] != "completed" {
		m.t.Fatalf("barrier waiter %s of round %d woken completed; the round %s", ticket, r, b.ended[r])
	}
	if outcome == "broken" {
		m.barrierEnd(m.t, r, "broken")
	}
	return true
}

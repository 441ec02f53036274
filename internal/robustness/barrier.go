package robustness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fairlock/fairlock/barrier"
)

// The barrier traffic (scenario.barrier): a sixth worker in every child
// awaits one cyclic barrier, barrierName, made with barrierParties (one
// party per child), round after round, each Await under the call
// timeout. An Await whose context ends breaks its round for the other
// parties; every party then arrives again and begins the next round. An
// Await still running when the child is told to stop is cancelled (error
// class "stopped"): the parties told before it will not arrive.
const (
	barrierName    = "br"
	barrierParties = 3 // the children of a run (children in the tests)
	barrierTTL     = time.Minute
)

// barrierTraffic runs the barrier worker until stop ends.
func barrierTraffic(stop context.Context, w *worker) {
	b, err := barrier.New(w.c, barrierName, barrierParties, barrier.WithTTL(barrierTTL))
	if err != nil {
		op := Op{Child: w.child, Client: w.client, Kind: "barrier_await", Res: barrierName, Call: now(), Err: err.Error(), Class: "other"}
		op.Return = op.Call
		w.record(record{Op: &op})
		return
	}
	for stop.Err() == nil {
		op := Op{Child: w.child, Client: w.client, Kind: "barrier_await", Res: barrierName, Call: now()}
		ctx, cancel := context.WithTimeout(stop, w.timeout)
		dl, _ := ctx.Deadline()
		op.Deadline = dl.UnixMicro()
		a, err := b.Await(ctx)
		cancel()
		op.Return = now()
		var be *barrier.BrokenError
		switch {
		case errors.As(err, &be):
			op.Err, op.Class = err.Error(), "broken"
			op.N, op.Index = be.Round, be.Index
		case err != nil:
			op.Err, op.Class = err.Error(), classify(err)
		default:
			op.N, op.Index = a.Round, a.Index
		}
		w.record(record{Op: &op})
		if err != nil && be == nil {
			time.Sleep(time.Duration(10+w.rng.IntN(20)) * time.Millisecond)
		}
	}
}

// BarrierResult is what CheckBarrier found.
type BarrierResult struct {
	Ops, Completed, Broken, Errors int // Awaits; that returned an Arrival; that returned the round broken; that failed otherwise
	Rounds                         int // rounds some Await saw complete
	ErrorKinds                     map[string]int
	Violations                     []string
}

// CheckBarrier checks the barrier Awaits of a history, directly rather
// than by porcupine: an Await is not one atomic step (it arrives, then
// returns when its round ends, by other parties' arrivals), so a model
// of single-point operations does not fit it. What every history must
// show, by the host's clock that all children share:
//
//   - each completed round has exactly barrierParties arrivals, with the
//     indices 0..barrierParties-1 each once; an Await that failed other
//     than broken may have arrived and had its reply lost, so a round
//     with fewer Arrivals must have as many such Awaits that could have
//     been in it: called before its first Arrival returned, by a client
//     whose Awaits before had reported only earlier rounds;
//   - the round's end lies after every one of its Arrivals' calls and
//     before every return: no Await returns a round that completed
//     before it was called (nor one it could not have been in);
//   - per party, the rounds its Awaits report (completed or broken)
//     rise strictly: a party arrives again only after its round ended;
//   - no round both completes for one party and breaks for another;
//   - each Await returns by its context's deadline (plus slack).
func CheckBarrier(h History, pauses []Pause, lim Limits) BarrierResult {
	var res BarrierResult
	var calls Result
	// A violation whose calls meet a fault's span is marked (lossMark),
	// and named apart from the others.
	// One near a fault when an arrival failed in its span is marked
	// unackedMark: the arrival may have completed a round on the master
	// alone.
	var marked, unmarked []string
	unacked := slices.ContainsFunc(h.Ops, func(op Op) bool { return unackedIn(lim.Faults, op, "barrier_await") })
	violate := func(from, till int64, format string, args ...any) {
		v := fmt.Sprintf(format, args...)
		if m := near(lim.Faults, from, till); m != "" {
			if unacked {
				m = unackedMark
			}
			marked = append(marked, m+v)
		} else {
			unmarked = append(unmarked, v)
		}
	}
	type round struct {
		done, broken []Op
	}
	rounds := map[int64]*round{}
	at := func(n int64) *round {
		if rounds[n] == nil {
			rounds[n] = &round{}
		}
		return rounds[n]
	}
	// unknown are the Awaits that failed other than broken: each may have
	// arrived, in a round after after (its client's last reported round),
	// and had its reply lost.
	type maybe struct {
		op    Op
		after int64
	}
	var unknown []maybe
	last := map[int]Op{}       // per client, its last Await that named a round
	for _, op := range h.Ops { // in call order (ReadHistories)
		if op.Kind != "barrier_await" {
			continue
		}
		res.Ops++
		checkDeadline(&calls, op, pauses, h.Stalls, lim.Slack)
		switch {
		case op.Class == "broken":
			res.Broken++
			at(op.N).broken = append(at(op.N).broken, op)
		case op.Err != "":
			res.Errors++
			if res.ErrorKinds == nil {
				res.ErrorKinds = map[string]int{}
			}
			res.ErrorKinds[op.Class]++
			unknown = append(unknown, maybe{op, last[op.Client].N})
			continue
		default:
			res.Completed++
			at(op.N).done = append(at(op.N).done, op)
		}
		if p, ok := last[op.Client]; ok && op.N <= p.N {
			violate(p.Call, op.Return, "barrier: client %d's Await reported round %d after its earlier Await reported round %d", op.Client, op.N, p.N)
		}
		last[op.Client] = op
	}
	ns := make([]int64, 0, len(rounds))
	for n := range rounds {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	for _, n := range ns {
		r := rounds[n]
		if len(r.done) == 0 {
			continue
		}
		res.Rounds++
		from, till := int64(1<<62), int64(0)
		for _, op := range append(append([]Op(nil), r.done...), r.broken...) {
			from, till = min(from, op.Call), max(till, op.Return)
		}
		if len(r.broken) > 0 {
			violate(from, till, "barrier round %d both completed (for client %d) and broke (for client %d)", n, r.done[0].Client, r.broken[0].Client)
		}
		seen := map[int]bool{}
		maxCall, minRet := int64(0), int64(1<<62)
		for _, op := range r.done {
			if op.Index < 0 || op.Index >= barrierParties || seen[op.Index] {
				violate(from, till, "barrier round %d: index %d out of [0, %d) or given twice", n, op.Index, barrierParties)
			}
			seen[op.Index] = true
			maxCall, minRet = max(maxCall, op.Call), min(minRet, op.Return)
		}
		if maxCall >= minRet {
			violate(from, till, "barrier round %d: an Await returned it at %d, before another Await of it was called at %d", n, minRet, maxCall)
		}
		if missing := barrierParties - len(r.done); missing > 0 {
			could := 0
			for _, u := range unknown {
				if u.op.Call < minRet && u.after < n {
					could++
				}
			}
			if could < missing {
				violate(from, till, "barrier round %d completed with %d Arrivals (indices %v) and %d Awaits whose outcome is unknown, not %d parties", n, len(r.done), indices(r.done), could, barrierParties)
			}
		}
	}
	res.Violations = calls.Violations
	for _, vs := range [][]string{unmarked, marked} {
		if n := len(vs); n > maxBarrierViolations {
			mark := ""
			for _, m := range []string{unackedMark, lossMark} {
				if mark == "" && strings.HasPrefix(vs[0], m) {
					mark = m
				}
			}
			vs = append(vs[:maxBarrierViolations:maxBarrierViolations], fmt.Sprintf("%sbarrier: %d violations more", mark, n-maxBarrierViolations))
		}
		res.Violations = append(res.Violations, vs...)
	}
	return res
}

// maxBarrierViolations is how many violations CheckBarrier names, of those
// near a fault and of the others each; a rule broken in every round would
// otherwise name each.
const maxBarrierViolations = 10

func indices(ops []Op) []int {
	out := make([]int, 0, len(ops))
	for _, op := range ops {
		out = append(out, op.Index)
	}
	sort.Ints(out)
	return out
}

// describeBarrier is the one line a run logs of res.
func describeBarrier(res BarrierResult) string {
	return fmt.Sprintf("barrier: %d Awaits, %d Arrivals in %d completed rounds, %d broken, %d errors %v, %d violations",
		res.Ops, res.Completed, res.Rounds, res.Broken, res.Errors, res.ErrorKinds, len(res.Violations))
}

package robustness

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// state is the model's state of one fenced resource.
type state struct {
	value, hw, hr int64
}

// Model is the porcupine model of one fenced resource (see Store). It
// admits a refusal exactly when the store's rule calls for one, and an
// accepted write only when the value it read (From) is the value it
// overwrites: two holders that both read v and both had their write of
// v+1 accepted cannot be linearized.
var Model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range history {
			r := op.Input.(Op).Res
			if by[r] == nil {
				names = append(names, r)
			}
			by[r] = append(by[r], op)
		}
		out := make([][]porcupine.Operation, 0, len(names))
		for _, n := range names {
			out = append(out, by[n])
		}
		return out
	},
	Init: func() any { return state{} },
	Step: func(st, in, out any) (bool, any) {
		s, op, rep := st.(state), in.(Op), out.(Reply)
		switch op.Kind {
		case "read":
			if op.Tok < s.hw {
				return rep.Refused, s
			}
			if rep.Refused || rep.Value != s.value {
				return false, s
			}
			s.hr = max(s.hr, op.Tok)
			return true, s
		case "write":
			if op.Tok < max(s.hw, s.hr) {
				return rep.Refused, s
			}
			if rep.Refused || op.From != s.value {
				return false, s
			}
			s.value, s.hw = op.To, op.Tok
			return true, s
		}
		return false, s
	},
	Equal: func(a, b any) bool { return a.(state) == b.(state) },
	DescribeOperation: func(in, out any) string {
		op, rep := in.(Op), out.(Reply)
		if op.Kind == "read" {
			return fmt.Sprintf("read(%s, tok %d) -> %v", op.Res, op.Tok, rep)
		}
		return fmt.Sprintf("write(%s, tok %d, %d->%d) -> %v", op.Res, op.Tok, op.From, op.To, rep)
	},
	DescribeState: func(st any) string {
		s := st.(state)
		return fmt.Sprintf("value %d, highest write %d, highest read %d", s.value, s.hw, s.hr)
	},
}

// Pause is a span in which a child was stopped (SIGSTOP), in Unix
// microseconds: its calls that span it may return late.
type Pause struct {
	Child      int
	From, Till int64
}

// Limits are what Check holds the history to.
type Limits struct {
	// Slack is how late after its context's deadline a fairlock call may
	// return.
	Slack time.Duration
	// Linearizability bounds porcupine's search; a search that runs out is
	// reported as a violation, so that a check that did not finish cannot
	// pass.
	Linearizability time.Duration
	// Faults are the spans (µs, the host's clock) in which a fault may
	// have lost writes Redis acknowledged, widened by lossBefore and
	// lossAfter. CheckLatch and CheckBarrier mark a violation whose calls
	// meet one with lossMark; a fault that is documented to lose writes
	// allows those (lostWrites), and no others.
	Faults []Span
}

// A Span is a stretch of the host's clock, in µs.
type Span struct{ From, Till int64 }

// lossMark begins a latch's or barrier's violation whose calls meet a
// fault's span (Limits.Faults).
const lossMark = "near a fault: "

// How far a fault's span reaches before it was injected and after it was
// healed. Before: a restart with appendfsync everysec loses the writes of
// the last second or so; a failover starts its span itself, at a moment
// the replica is known to have every write acknowledged before (caughtUp).
// After: the old master rejoins as a replica within a second or so, while
// clients that still reach it may write there.
const (
	lossBefore = 2 * time.Second
	lossAfter  = 3 * time.Second
)

// near returns mark if [from, till] meets one of spans, else "".
func near(spans []Span, from, till int64) string {
	for _, s := range spans {
		if from <= s.Till && till >= s.From {
			return lossMark
		}
	}
	return ""
}

// Result is what Check found.
type Result struct {
	Acquired int // leases granted
	// ByChild counts the leases granted to each child process.
	ByChild  map[int]int
	StoreOps int // reads and writes the store answered
	Refused  int // reads and writes the store refused (fenced rejections)
	Errors   int // fairlock calls that failed (any error)
	// ErrorKinds counts the failed calls by call and kind of error.
	ErrorKinds map[string]int
	Lost       int // leases the child saw lost before releasing
	// MaxLate is the latest any fairlock call returned after its deadline
	// (0 when all returned before), calls across a pause of their process
	// left out.
	MaxLate time.Duration
	// Stalled counts the calls late past the slack by no more than
	// their process's own stalls (History.Stalls) during them: the host
	// did not run it.
	Stalled    int
	Violations []string
	Notes      []string // what the nemesis measured (not set by Check)
}

func (r *Result) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// Check validates a run's history against the store's final state: the
// store's history is linearizable (Model), no update was lost, at most
// capacity permits were held at once, tokens are unique and increase in
// grant order, and every fairlock call returned by its deadline.
func Check(h History, finals map[string]Final, pauses []Pause, lim Limits) Result {
	var res Result
	res.Acquired = len(h.Leases)
	res.ByChild = map[int]int{}
	for _, l := range h.Leases {
		res.ByChild[l.Child]++
	}
	var ops []porcupine.Operation
	writes := map[string]int64{}
	for _, op := range h.Ops {
		switch op.Kind {
		case "read", "write":
			if op.Err != "" {
				res.violate("store call failed: %+v", op)
				continue
			}
			res.StoreOps++
			if op.Refused {
				res.Refused++
			} else if op.Kind == "write" {
				writes[op.Res]++
			}
			ops = append(ops, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Output: op.Reply, Return: op.Return})
		case "acquire", "release":
			if op.Err != "" {
				res.Errors++
				if res.ErrorKinds == nil {
					res.ErrorKinds = map[string]int{}
				}
				res.ErrorKinds[op.Kind+" "+op.Class]++
			}
			checkDeadline(&res, op, pauses, h.Stalls, lim.Slack)
		}
	}
	for _, l := range h.Leases {
		if l.Lost {
			res.Lost++
		}
	}
	switch porcupine.CheckOperationsTimeout(Model, ops, lim.Linearizability) {
	case porcupine.Illegal:
		res.violate("the store's history is not linearizable: an accepted write overwrote a value other than the one its holder read, or the store broke its rule")
	case porcupine.Unknown:
		res.violate("linearizability not decided within %v", lim.Linearizability)
	}
	for name, f := range finals {
		if f.Value != writes[name] || f.Writes != writes[name] {
			res.violate("lost update on %s: final value %d, %d writes accepted by the store, %d in the history", name, f.Value, f.Writes, writes[name])
		}
	}
	checkCapacity(&res, h.Leases, pauses)
	checkTokens(&res, h.Leases)
	return res
}

// checkDeadline holds op to its deadline (plus slack), unless its child
// was stopped (pauses) during it, or did not run (stalls, as the child
// measured them) for as long as it was late past the slack.
func checkDeadline(res *Result, op Op, pauses, stalls []Pause, slack time.Duration) {
	if op.Deadline == 0 || op.Return <= op.Deadline {
		return
	}
	for _, p := range pauses {
		if p.Child == op.Child && p.From < op.Return && op.Call < p.Till {
			return // the child was stopped during the call
		}
	}
	late := time.Duration(op.Return-op.Deadline) * time.Microsecond
	res.MaxLate = max(res.MaxLate, late)
	if late <= slack {
		return
	}
	var stalled int64 // µs of the call in which its child did not run
	for _, p := range stalls {
		if p.Child == op.Child {
			stalled += max(0, min(p.Till, op.Return)-max(p.From, op.Call))
		}
	}
	if time.Duration(stalled)*time.Microsecond >= late-slack {
		res.Stalled++
		return
	}
	res.violate("%s by client %d returned %v after its deadline (err %q)", op.Kind, op.Client, late, op.Err)
}

// resumedLive marks a capacity violation in which a lease's last evidence
// of being live is Lease.Err reading nil just after its process resumed
// from a stop past the lease's end: the lease's timers had not yet run.
const resumedLive = "a lease read live by Err just after its process resumed"

// span is one lease's certainly-live span on one semaphore.
type span struct {
	asked, start, live int64
	permits, tok       int64
	client             int
	// resumed: the last live mark came within a second after its process
	// was resumed from a pause.
	resumed bool
}

// lastLive returns the latest time at which l was certainly live: the
// first time of its last mark not straddling a pause of its child; 0 when
// there is none.
func lastLive(l Lease, pauses []Pause) (last int64, resumed bool) {
	for _, m := range l.Marks {
		ok := true
		for _, p := range pauses {
			if p.Child == l.Child && p.From <= m[1] && m[0] <= p.Till {
				ok = false
			}
		}
		if ok {
			last = max(last, m[0])
		}
	}
	for _, p := range pauses {
		if p.Child == l.Child && p.Till <= last && last < p.Till+time.Second.Microseconds() {
			resumed = true
		}
	}
	return last, resumed
}

func bySemaphore(leases []Lease, pauses []Pause) (map[string][]span, map[string]int64) {
	spans, caps := map[string][]span{}, map[string]int64{}
	for _, l := range leases {
		live, resumed := lastLive(l, pauses)
		for _, p := range l.Parts {
			spans[p.Name] = append(spans[p.Name], span{asked: l.Asked, start: l.Start, live: live, resumed: resumed,
				permits: p.Permits, tok: p.Token, client: l.Client})
			caps[p.Name] = p.Capacity
		}
	}
	return spans, caps
}

// checkCapacity sweeps each semaphore's certainly-live spans: the permits
// of spans open at once may not exceed the capacity. A span runs from
// Acquire's return (after the grant) to the lease's last live mark (before
// its end in Redis), so it lies inside the lease's life by Redis's clock,
// which on one host is the clock the children read.
func checkCapacity(res *Result, leases []Lease, pauses []Pause) {
	spans, caps := bySemaphore(leases, pauses)
	for name, ss := range spans {
		type edge struct {
			at, d int64
			s     span
		}
		var es []edge
		for _, s := range ss {
			if s.live > s.start {
				es = append(es, edge{s.start, s.permits, s}, edge{s.live, -s.permits, s})
			}
		}
		// Ends before starts at one instant: spans that touch do not overlap.
		sort.Slice(es, func(i, j int) bool {
			if es[i].at != es[j].at {
				return es[i].at < es[j].at
			}
			return es[i].d < es[j].d
		})
		var used int64
		open := map[span]bool{}
		for _, e := range es {
			used += e.d
			open[e.s] = e.d > 0
			if used > caps[name] {
				var held []string
				why := ""
				for s, ok := range open {
					if ok {
						held = append(held, fmt.Sprintf("client %d token %d (%d permits) live %d..%d", s.client, s.tok, s.permits, s.start, s.live))
						if s.resumed {
							why = " (" + resumedLive + ")"
						}
					}
				}
				sort.Strings(held)
				res.violate("capacity of %s exceeded%s: %d permits held at %d (cap %d): %s",
					name, why, used, e.at, caps[name], strings.Join(held, "; "))
				break
			}
		}
	}
}

// checkTokens checks each semaphore's tokens: unique, and ordered as the
// grants are wherever the order is known (one lease's Acquire returned
// before another's was called).
func checkTokens(res *Result, leases []Lease) {
	spans, _ := bySemaphore(leases, nil)
	for name, ss := range spans {
		seen := map[int64]int{}
		for _, s := range ss {
			if c, dup := seen[s.tok]; dup {
				res.violate("token %d of %s granted twice (clients %d and %d)", s.tok, name, c, s.client)
				break
			}
			seen[s.tok] = s.client
		}
		byStart := append([]span(nil), ss...)
		sort.Slice(byStart, func(i, j int) bool { return byStart[i].start < byStart[j].start })
		byAsked := append([]span(nil), ss...)
		sort.Slice(byAsked, func(i, j int) bool { return byAsked[i].asked < byAsked[j].asked })
		// For each lease in order of asking, the highest token among those
		// granted (Acquire returned) before it was asked must be lower.
		var i int
		var top span
		have := false
		for _, b := range byAsked {
			for ; i < len(byStart) && byStart[i].start < b.asked; i++ {
				if !have || byStart[i].tok > top.tok {
					top, have = byStart[i], true
				}
			}
			if have && top.tok >= b.tok {
				res.violate("token of %s went back: %d granted after %d", name, b.tok, top.tok)
				break
			}
		}
	}
}

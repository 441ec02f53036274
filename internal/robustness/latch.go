package robustness

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/fairlock/fairlock/internal/engine"
)

// The engine's latch functions, as package latch calls them.
var (
	engineLatchCount = engine.Func[func(ctx context.Context, c any, name string, init int64) (count, stored int64, err error)]("latch.count")
	engineLatchDown  = engine.Func[func(ctx context.Context, c any, name string, init int64, ttl time.Duration) (count, stored int64, err error)]("latch.down")
	engineLatchWait  = engine.Func[func(ctx context.Context, c any, name string, init int64, ttl time.Duration, waiting func()) (stored int64, err error)]("latch.wait")
)

// The latch traffic (scenario.latch): a fifth worker in every child
// counts down a sequence of countdown latches, "{lt}:0", "{lt}:1", ...,
// each made with latchCount (one count down per child), reads each one's
// count and waits for it to open, each call under the call timeout. A
// latch a child's lost count down leaves shut is given up on when its Wait
// times out; the child goes on to the next one. A call still running
// when the child is told to stop is cancelled (error class "stopped"), so
// that a child does not wait out the call timeout on a latch the children
// told before it will never count down. The names share the hash
// tag latchTag, so on Cluster every latch of the run is in one slot, which
// a slot move (moveSlots) moves whichever latch the children are on.
const (
	latchCount = 3 // the children of a run (children in the tests)
	latchTTL   = time.Minute
	latchTag   = "lt"
)

// latchTraffic runs the latch worker until stop ends.
func latchTraffic(stop context.Context, w *worker) {
	for g := 0; stop.Err() == nil; g++ {
		name := fmt.Sprintf("{%s}:%d", latchTag, g)
		w.latchOp(stop, "latch_down", name, func(ctx context.Context) (int64, error) {
			n, stored, err := engineLatchDown(ctx, w.c, name, latchCount, latchTTL)
			if err == nil && stored != 0 {
				err = fmt.Errorf("latch %s stored with count %d", name, stored)
			}
			return n, err
		})
		count := func() {
			w.latchOp(stop, "latch_count", name, func(ctx context.Context) (int64, error) {
				n, stored, err := engineLatchCount(ctx, w.c, name, latchCount)
				if err == nil && stored != 0 {
					err = fmt.Errorf("latch %s stored with count %d", name, stored)
				}
				return n, err
			})
		}
		if w.rng.IntN(2) == 0 {
			count()
		}
		w.latchOp(stop, "latch_wait", name, func(ctx context.Context) (int64, error) {
			stored, err := engineLatchWait(ctx, w.c, name, latchCount, latchTTL, nil)
			if err == nil && stored != 0 {
				err = fmt.Errorf("latch %s stored with count %d", name, stored)
			}
			return 0, err
		})
		count()
	}
}

// latchOp runs f under the call timeout, cancelled when stop ends, and
// records it: its count (N) when it returns one.
func (w *worker) latchOp(stop context.Context, kind, name string, f func(context.Context) (int64, error)) {
	op := Op{Child: w.child, Client: w.client, Kind: kind, Res: name, Call: now()}
	ctx, cancel := context.WithTimeout(stop, w.timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	op.Deadline = dl.UnixMicro()
	n, err := f(ctx)
	op.Return = now()
	op.N = n
	if err != nil {
		op.Err, op.Class = err.Error(), classify(err)
	}
	w.record(record{Op: &op})
}

// LatchModel is the porcupine model of one countdown latch: a count that
// starts at latchCount; a count down lowers it by one, never below 0, and
// answers the count after; a count answers it; a Wait returns (without
// an error) only while it is 0. A count down that failed may or may not
// have counted, at any time after its call (its script may run late):
// both states follow it. Waits and counts that failed say nothing.
var LatchModel = (&porcupine.NondeterministicModel{
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
	Init: func() []any { return []any{int64(latchCount)} },
	Step: func(st, in, _ any) []any {
		s, op := st.(int64), in.(Op)
		down := max(s-1, 0)
		switch {
		case op.Kind == "latch_down" && op.Err != "":
			return []any{s, down}
		case op.Kind == "latch_down" && op.N == down:
			return []any{down}
		case op.Kind == "latch_count" && op.N == s:
			return []any{s}
		case op.Kind == "latch_wait" && s == 0:
			return []any{s}
		}
		return nil
	},
	Equal: func(a, b any) bool { return a.(int64) == b.(int64) },
	DescribeOperation: func(in, _ any) string {
		op := in.(Op)
		if op.Err != "" {
			return fmt.Sprintf("%s(%s) failed: %s", op.Kind, op.Res, op.Err)
		}
		return fmt.Sprintf("%s(%s) -> %d", op.Kind, op.Res, op.N)
	},
	DescribeState: func(st any) string { return fmt.Sprintf("count %d", st.(int64)) },
}).ToModel()

// LatchResult is what CheckLatch found.
type LatchResult struct {
	Ops, Opened, Errors int // calls; Waits that returned nil; calls that failed
	ErrorKinds          map[string]int
	Violations          []string
}

// CheckLatch checks the latch calls of a history: linearizable against
// LatchModel, and each returned by its context's end (plus slack).
func CheckLatch(h History, pauses []Pause, lim Limits) LatchResult {
	var res LatchResult
	var ops []porcupine.Operation
	var calls Result
	for _, op := range h.Ops {
		switch op.Kind {
		case "latch_down", "latch_count", "latch_wait":
		default:
			continue
		}
		res.Ops++
		checkDeadline(&calls, op, pauses, h.Stalls, lim.Slack)
		ret := op.Return
		if op.Err != "" {
			res.Errors++
			if res.ErrorKinds == nil {
				res.ErrorKinds = map[string]int{}
			}
			res.ErrorKinds[op.Kind+" "+op.Class]++
			if op.Kind != "latch_down" {
				continue // it says nothing
			}
			ret = math.MaxInt64 // it may count at any time after its call
		} else if op.Kind == "latch_wait" {
			res.Opened++
		}
		ops = append(ops, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Return: ret})
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	res.Violations = calls.Violations
	// Each latch is checked by itself (LatchModel's partitions, one at a
	// time), so that a violation names its latch and its calls.
	by := map[string][]porcupine.Operation{}
	var names []string
	for _, op := range ops {
		r := op.Input.(Op).Res
		if by[r] == nil {
			names = append(names, r)
		}
		by[r] = append(by[r], op)
	}
	// A latch whose calls meet a fault's span is marked (lossMark), and
	// counted apart: a fault that loses writes allows those alone.
	named := map[string]int{}
	for _, name := range names {
		var v string
		switch porcupine.CheckOperationsTimeout(LatchModel, by[name], lim.Linearizability) {
		case porcupine.Illegal:
			v = fmt.Sprintf("the latch history is not linearizable: a count down, a count or a Wait that returned saw a count no sequence of the calls gives, on latch %s: %s", name, describeLatchOps(by[name]))
		case porcupine.Unknown:
			v = fmt.Sprintf("latch linearizability not decided within %v, on latch %s", lim.Linearizability, name)
		default:
			continue
		}
		from, till := int64(math.MaxInt64), int64(0)
		for _, o := range by[name] {
			from, till = min(from, o.Input.(Op).Call), max(till, o.Input.(Op).Return)
		}
		mark := near(lim.Faults, from, till)
		if mark != "" && slices.ContainsFunc(by[name], func(o porcupine.Operation) bool {
			return unackedIn(lim.Faults, o.Input.(Op), "latch_down")
		}) {
			mark = unackedMark
		}
		if named[mark]++; named[mark] <= maxLatchViolations {
			res.Violations = append(res.Violations, mark+v)
		}
	}
	for mark, n := range named {
		if n > maxLatchViolations {
			res.Violations = append(res.Violations, fmt.Sprintf("%sthe latch history is not linearizable on %d latches more", mark, n-maxLatchViolations))
		}
	}
	return res
}

// unackedMark begins a latch's or barrier's violation near a fault
// (lossMark) on an object one of whose changes (a count down, an
// arrival) failed and was running in the fault's span: one that
// WithReplicaAck did not see replicated (or whose answer was lost). Redis
// ran it on the master, where other calls could read it (a Count, the
// other parties of the round it completed), and a failover can then lose
// it: a latch's count is read lower, then higher again; a barrier's round
// completes for some parties, then again, or breaks. WithReplicaAck
// promises that a change it acknowledged survives a failover, not that a
// read sees only acknowledged ones: a row with WithReplicaAck allows this
// violation alone.
const unackedMark = lossMark + "after a change that failed unacknowledged: "

// unackedIn reports whether op is a change of kind that failed (other
// than by finding its barrier's round broken, which writes nothing of its
// own) and was running (from its call to its return) at some moment of
// one of spans: Redis may have run it at any moment of that time. The
// call's time is taken before it is sent, and a count down resends the
// same count down until it is acknowledged or its time is up: one called
// before the span began can reach Redis after it.
func unackedIn(spans []Span, op Op, kind string) bool {
	return op.Kind == kind && op.Err != "" && op.Class != "broken" && near(spans, op.Call, op.Return) != ""
}

// maxLatchViolations is how many latches CheckLatch names; a rule broken
// on every latch would otherwise name each.
const maxLatchViolations = 5

// describeLatchOps lists a latch's calls, in call order, with their times
// (µs, the host's clock) and outcomes: the excerpt of a violation.
func describeLatchOps(ops []porcupine.Operation) string {
	parts := make([]string, 0, len(ops))
	for _, o := range ops {
		op := o.Input.(Op)
		out := fmt.Sprintf("-> %d", op.N)
		switch {
		case op.Err != "":
			out = "failed (" + op.Class + ")"
		case op.Kind == "latch_wait":
			out = "opened"
		}
		parts = append(parts, fmt.Sprintf("client %d %s %s [%d..%d]", op.Client, op.Kind, out, op.Call, op.Return))
	}
	return strings.Join(parts, "; ")
}

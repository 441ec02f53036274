package robustness

import (
	"strings"
	"testing"
)

// await is a barrier Await of client over [call, ret]: completed with
// round and index, or, with class set, failed so ("broken" names the
// round).
func await(client int, call, ret, round int64, index int, class string) Op {
	op := Op{Client: client, Kind: "barrier_await", Res: barrierName, Call: call, Return: ret, N: round, Index: index, Class: class}
	if class != "" {
		op.Err = class
	}
	return op
}

// TestCheckBarrier breaks each rule CheckBarrier holds a history to, one
// history at a time, and requires the violation that names it.
func TestCheckBarrier(t *testing.T) {
	whole := []Op{await(1, 0, 10, 1, 0, ""), await(2, 1, 10, 1, 1, ""), await(3, 2, 10, 1, 2, "")}
	for _, tc := range []struct {
		name string
		ops  []Op
		want string // a violation's text; "" for none
	}{
		{"whole rounds", append(whole[:3:3],
			await(1, 11, 20, 2, 2, ""), await(2, 11, 20, 2, 0, ""), await(3, 12, 20, 2, 1, "")), ""},
		{"a round broken, then the next whole", []Op{
			await(1, 0, 5, 1, 0, "broken"), await(2, 1, 5, 1, -1, "broken"), await(3, 2, 4, 0, 0, "deadline"),
			await(1, 6, 20, 2, 0, ""), await(2, 7, 20, 2, 1, ""), await(3, 8, 20, 2, 2, "")}, ""},
		{"a lost reply excuses a missing party", []Op{
			await(1, 0, 10, 1, 0, ""), await(2, 1, 10, 1, 1, ""), await(3, 2, 9, 0, 0, "deadline")}, ""},
		{"a party short", whole[:2], "completed with 2 Arrivals"},
		{"an index twice", []Op{await(1, 0, 10, 1, 0, ""), await(2, 1, 10, 1, 1, ""), await(3, 2, 10, 1, 1, "")},
			"given twice"},
		{"an index past the parties", []Op{await(1, 0, 10, 1, 0, ""), await(2, 1, 10, 1, 1, ""), await(3, 2, 10, 1, 3, "")},
			"out of [0, 3)"},
		{"a round returned before a party of it was called", []Op{
			await(1, 0, 5, 1, 0, ""), await(2, 1, 10, 1, 1, ""), await(3, 6, 10, 1, 2, "")}, "before another Await of it was called"},
		{"a party's rounds fall", append(whole[:3:3],
			await(1, 11, 20, 1, 0, "broken")), "after its earlier Await reported round 1"},
		{"a round completed and broken", append(whole[:3:3],
			await(1, 11, 20, 1, 0, "broken")), "both completed"},
		{"a lost reply after the round's end excuses no party", []Op{
			await(1, 0, 10, 1, 0, ""), await(2, 1, 10, 1, 1, ""), await(3, 11, 13, 0, 0, "deadline")},
			"completed with 2 Arrivals"},
		{"a lost reply excuses no party of a round its client had passed", []Op{
			await(3, 0, 1, 5, -1, "broken"), await(3, 2, 3, 0, 0, "deadline"),
			await(1, 4, 10, 3, 0, ""), await(2, 5, 10, 3, 1, "")}, "round 3 completed with 2 Arrivals"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := CheckBarrier(History{Ops: tc.ops}, nil, lim)
			if tc.want == "" {
				for _, v := range res.Violations {
					t.Errorf("unexpected violation: %s", v)
				}
				return
			}
			for _, v := range res.Violations {
				if strings.Contains(v, tc.want) {
					return
				}
			}
			t.Errorf("no violation saying %q; got %q", tc.want, res.Violations)
		})
	}
}

// TestCheckNearAFault requires CheckBarrier and CheckLatch to mark
// (lossMark) a violation whose calls meet a fault's span, and only such a
// violation: a fault that loses writes allows those alone (lostWrites).
func TestCheckNearAFault(t *testing.T) {
	faulted := lim
	faulted.Faults = []Span{{From: 100, Till: 200}}
	short := func(call, ret, round int64) []Op { // a round completed a party short
		return []Op{await(1, call, ret, round, 0, ""), await(2, call+1, ret, round, 1, "")}
	}
	latchOps := func(call int64, name string) []Op { // a Wait that opened a latch no one counted down
		return []Op{{Client: 1, Kind: "latch_wait", Res: name, Call: call, Return: call + 10}}
	}
	for _, tc := range []struct {
		name   string
		ops    []Op
		marked bool
	}{
		{"a barrier round before the span", short(0, 10, 1), false},
		{"a barrier round that meets the span", short(95, 105, 1), true},
		{"a barrier round after the span", short(300, 310, 1), false},
		{"a latch before the span", latchOps(0, "{lt}:0"), false},
		{"a latch that meets the span", latchOps(195, "{lt}:0"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := History{Ops: tc.ops}
			vs := append(CheckBarrier(h, nil, faulted).Violations, CheckLatch(h, nil, faulted).Violations...)
			if len(vs) == 0 {
				t.Fatal("no violation")
			}
			for _, v := range vs {
				if got := strings.HasPrefix(v, lossMark); got != tc.marked || anyPart(v, lostWrites) != tc.marked {
					t.Errorf("marked (allowed under a fault that loses writes) %v, want %v: %s", got, tc.marked, v)
				}
			}
		})
	}
}

// A count down that failed unacknowledged near a failover can be read by a
// Count and then lost: the latch's violation is marked as such (which the
// rows with WithReplicaAck allow), and only when such a count down meets
// the fault's span. The history is the one a failover with
// WithReplicaAck(1) produced: two count downs acknowledged (3 -> 2 -> 1), a
// third timed out, Counts read 0, then 1 once the replica took over.
func TestCheckUnacknowledgedCountDown(t *testing.T) {
	down := func(client int, call, ret, n int64, err string) Op {
		op := Op{Client: client, Kind: "latch_down", Res: "{lt}:1", Call: call, Return: ret, N: n}
		if err != "" {
			op.Err, op.Class = err, "deadline"
		}
		return op
	}
	count := func(client int, call, ret, n int64) Op {
		return Op{Client: client, Kind: "latch_count", Res: "{lt}:1", Call: call, Return: ret, N: n}
	}
	history := func(failedAt int64) []Op {
		return []Op{
			down(36, 1000, 1010, 2, ""), down(4, 1020, 1030, 1, ""), down(20, failedAt, failedAt+1960, 0, "context deadline exceeded"),
			count(4, 1050, 1060, 1), count(20, 3010, 3020, 0), count(36, 3015, 3025, 0), count(4, 3030, 3040, 1), count(20, 4000, 4010, 1),
		}
	}
	for _, tc := range []struct {
		name     string
		failedAt int64 // when the unacknowledged count down was called
		spans    []Span
		mark     string
	}{
		{"its count down failed in the span", 1040, []Span{{From: 1035, Till: 5000}}, unackedMark},
		{"its count down was still running when the span began", 1040, []Span{{From: 2000, Till: 5000}}, unackedMark},
		{"its count down failed before the span", 1040, []Span{{From: 3005, Till: 5000}}, lossMark},
		{"no span", 1040, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := lim
			l.Faults = tc.spans
			vs := CheckLatch(History{Ops: history(tc.failedAt)}, nil, l).Violations
			if len(vs) != 1 {
				t.Fatalf("violations %q, want one", vs)
			}
			got := ""
			for _, m := range []string{unackedMark, lossMark} {
				if strings.HasPrefix(vs[0], m) {
					got = m
					break
				}
			}
			if got != tc.mark {
				t.Errorf("marked %q, want %q: %s", got, tc.mark, vs[0])
			}
		})
	}
}

// An arrival that failed unacknowledged near a failover may have completed
// its round on the master alone: the other parties returned the round, and
// once the replica took over, a party arriving again completed it again.
// The barrier's violation is marked as such (which the rows with
// WithReplicaAck allow) only when such an arrival meets the fault's span;
// an arrival that found its round broken wrote nothing of its own.
func TestCheckUnacknowledgedArrival(t *testing.T) {
	history := func(failed Op) []Op {
		return []Op{await(1, 1000, 1100, 1, 0, ""), await(2, 1010, 1100, 1, 1, ""), failed, await(1, 1200, 1300, 1, 2, "")}
	}
	for _, tc := range []struct {
		name   string
		failed Op
		spans  []Span
		mark   string
	}{
		{"its arrival failed in the span", await(3, 1040, 1540, 0, 0, "not-replicated"), []Span{{From: 1150, Till: 5000}}, unackedMark},
		{"its arrival failed before the span", await(3, 1040, 1100, 0, 0, "not-replicated"), []Span{{From: 1150, Till: 5000}}, lossMark},
		{"an arrival that found its round broken in the span", await(3, 1040, 1540, 1, -1, "broken"), []Span{{From: 1150, Till: 5000}}, lossMark},
		{"no span", await(3, 1040, 1540, 0, 0, "not-replicated"), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := lim
			l.Faults = tc.spans
			vs := CheckBarrier(History{Ops: history(tc.failed)}, nil, l).Violations
			if len(vs) == 0 {
				t.Fatal("no violation")
			}
			for _, v := range vs {
				got := ""
				for _, m := range []string{unackedMark, lossMark} {
					if strings.HasPrefix(v, m) {
						got = m
						break
					}
				}
				if got != tc.mark {
					t.Errorf("marked %q, want %q: %s", got, tc.mark, v)
				}
			}
		})
	}
}

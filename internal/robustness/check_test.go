package robustness

import (
	"strings"
	"testing"
	"time"
)

var lim = Limits{Slack: 100 * time.Millisecond, Linearizability: 10 * time.Second}

func read(client int, tok, call, ret, value int64, refused bool) Op {
	return Op{Client: client, Kind: "read", Res: "r", Tok: tok, Call: call, Return: ret, Reply: Reply{Refused: refused, Value: value}}
}

func write(client int, tok, call, ret, from int64, refused bool) Op {
	return Op{Client: client, Kind: "write", Res: "r", Tok: tok, From: from, To: from + 1, Call: call, Return: ret,
		Reply: Reply{Refused: refused, Value: from + 1}}
}

func violations(res Result, want string) bool {
	for _, v := range res.Violations {
		if strings.Contains(v, want) {
			return true
		}
	}
	return false
}

func TestCheckLinearizability(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ops    []Op
		finals map[string]Final
		want   string // a violation's text; "" for none
	}{
		{"one holder after another", []Op{
			read(1, 5, 0, 1, 0, false), write(1, 5, 2, 3, 0, false),
			read(2, 6, 4, 5, 1, false), write(2, 6, 6, 7, 1, false),
		}, map[string]Final{"r": {Value: 2, Writes: 2}}, ""},
		{"a stale holder fenced off", []Op{
			read(1, 5, 0, 1, 0, false),
			read(2, 6, 2, 3, 0, false), write(2, 6, 4, 5, 0, false),
			write(1, 5, 6, 7, 0, true),
		}, map[string]Final{"r": {Value: 1, Writes: 1, Refused: 1}}, ""},
		{"readers share in any token order", []Op{
			read(1, 7, 0, 1, 0, false), read(2, 6, 2, 3, 0, false),
		}, map[string]Final{"r": {}}, ""},
		// Two holders with one token: the fencing cannot tell them apart
		// and both writes of 0->1 land.
		{"two writers with one token", []Op{
			read(1, 5, 0, 1, 0, false), read(2, 5, 2, 3, 0, false),
			write(1, 5, 4, 5, 0, false), write(2, 5, 6, 7, 0, false),
		}, map[string]Final{"r": {Value: 1, Writes: 2}}, "not linearizable"},
		{"a refusal the rule does not call for", []Op{
			read(1, 5, 0, 1, 0, false), write(1, 5, 2, 3, 0, true),
		}, map[string]Final{"r": {Refused: 1}}, "not linearizable"},
		{"a stale read served", []Op{
			read(1, 5, 0, 1, 0, false), write(1, 5, 2, 3, 0, false), read(2, 4, 4, 5, 1, false),
		}, map[string]Final{"r": {Value: 1, Writes: 1}}, "not linearizable"},
		{"a write the history lacks", []Op{
			read(1, 5, 0, 1, 0, false),
		}, map[string]Final{"r": {Value: 1, Writes: 1}}, "lost update"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Check(History{Ops: tc.ops}, tc.finals, nil, lim)
			if tc.want == "" && len(res.Violations) > 0 {
				t.Errorf("violations %q, want none", res.Violations)
			}
			if tc.want != "" && !violations(res, tc.want) {
				t.Errorf("violations %q, want one saying %q", res.Violations, tc.want)
			}
		})
	}
}

func lease(client int, asked, start, live int64, parts ...Part) Lease {
	return Lease{Client: client, Asked: asked, Start: start, Marks: [][2]int64{{live, live}}, Parts: parts}
}

func TestCheckLeases(t *testing.T) {
	mx := func(tok int64) Part { return Part{Name: "m", Capacity: 1, Permits: 1, Token: tok} }
	sem := func(n, tok int64) Part { return Part{Name: "s", Capacity: 3, Permits: n, Token: tok} }
	for _, tc := range []struct {
		name   string
		leases []Lease
		pauses []Pause
		want   string
	}{
		{"one after another", []Lease{lease(1, 0, 10, 20, mx(1)), lease(2, 5, 20, 30, mx(2))}, nil, ""},
		{"overlapping mutex holders", []Lease{lease(1, 0, 10, 20, mx(1)), lease(2, 5, 19, 30, mx(2))}, nil, "capacity of m"},
		// Client 1 was stopped across its mark at 20: its lease may have
		// ended during the stop, before its timers could say so.
		{"a mark across a pause", []Lease{lease(1, 0, 10, 20, mx(1)), lease(2, 5, 19, 30, mx(2))},
			[]Pause{{Child: 0, From: 18, Till: 25}}, ""},
		{"a pause of another child", []Lease{lease(1, 0, 10, 20, mx(1)), {Child: 1, Client: 2, Asked: 5, Start: 19, Marks: [][2]int64{{30, 30}}, Parts: []Part{mx(2)}}},
			[]Pause{{Child: 1, From: 18, Till: 25}}, "capacity of m"},
		{"semaphore at capacity", []Lease{lease(1, 0, 10, 20, sem(2, 1)), lease(2, 0, 11, 30, sem(1, 2))}, nil, ""},
		{"semaphore past capacity", []Lease{lease(1, 0, 10, 20, sem(2, 1)), lease(2, 0, 11, 30, sem(2, 2))}, nil, "capacity of s"},
		{"a token twice", []Lease{lease(1, 0, 10, 20, mx(1)), lease(2, 5, 21, 30, mx(1))}, nil, "granted twice"},
		{"a token lower after", []Lease{lease(1, 0, 10, 20, mx(2)), lease(2, 11, 21, 30, mx(1))}, nil, "went back"},
		// Asked before the other's grant returned: the order is unknown.
		{"concurrent asks in any order", []Lease{lease(1, 0, 10, 20, mx(2)), lease(2, 5, 21, 30, mx(1))}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Check(History{Leases: tc.leases}, nil, tc.pauses, lim)
			if tc.want == "" && len(res.Violations) > 0 {
				t.Errorf("violations %q, want none", res.Violations)
			}
			if tc.want != "" && !violations(res, tc.want) {
				t.Errorf("violations %q, want one saying %q", res.Violations, tc.want)
			}
		})
	}
}

func TestCheckDeadlines(t *testing.T) {
	late := Op{Child: 1, Kind: "acquire", Call: 0, Deadline: 1000, Return: 1000 + 200_000}
	onTime := Op{Child: 1, Kind: "release", Call: 0, Deadline: 1000, Return: 1000 + 50_000}
	if res := Check(History{Ops: []Op{onTime}}, nil, nil, lim); len(res.Violations) > 0 {
		t.Errorf("a call within the slack: violations %q", res.Violations)
	}
	if res := Check(History{Ops: []Op{late}}, nil, nil, lim); !violations(res, "after its deadline") {
		t.Errorf("a call past the slack: violations %q, want one", res.Violations)
	}
	paused := []Pause{{Child: 1, From: 500, Till: 150_000}}
	if res := Check(History{Ops: []Op{late}}, nil, paused, lim); len(res.Violations) > 0 {
		t.Errorf("a late call of a paused child: violations %q, want none", res.Violations)
	}
	// A child's own stall excuses as much lateness as it lasted during
	// the call, and no more; another child's stall excuses nothing.
	pastSlack := late.Return - late.Deadline - lim.Slack.Microseconds()
	for _, tc := range []struct {
		name    string
		stalls  []Pause
		excused bool
	}{
		{"a stall as long as the lateness past the slack", []Pause{{Child: 1, From: 100, Till: 100 + pastSlack}}, true},
		{"two stalls adding up to it", []Pause{{Child: 1, From: 100, Till: 100 + pastSlack/2}, {Child: 1, From: 50_000, Till: 50_000 + pastSlack - pastSlack/2}}, true},
		{"a shorter stall", []Pause{{Child: 1, From: 100, Till: 100 + pastSlack - 1}}, false},
		{"a stall mostly before the call", []Pause{{Child: 1, From: -pastSlack, Till: 10}}, false},
		{"another child's stall", []Pause{{Child: 2, From: 100, Till: 100 + 10*pastSlack}}, false},
	} {
		res := Check(History{Ops: []Op{late}, Stalls: tc.stalls}, nil, nil, lim)
		if got := len(res.Violations) == 0; got != tc.excused {
			t.Errorf("%s: violations %q, excused %v, want %v", tc.name, res.Violations, got, tc.excused)
		}
	}
}

// TestStoreFences checks the store's rule on its own.
func TestStoreFences(t *testing.T) {
	s := &Store{regs: map[string]*register{}}
	steps := []struct {
		kind    string
		tok, to int64
		refused bool
	}{
		{"read", 5, 0, false},
		{"read", 4, 0, false}, // readers share
		{"write", 4, 1, true}, // below a read
		{"write", 5, 1, false},
		{"read", 4, 0, true}, // below a write
		{"write", 6, 2, false},
	}
	for i, st := range steps {
		var rep Reply
		if st.kind == "read" {
			rep = s.read("r", st.tok)
		} else {
			rep = s.write("r", st.tok, st.to)
		}
		if rep.Refused != st.refused {
			t.Errorf("step %d: %s with token %d: refused %v, want %v", i, st.kind, st.tok, rep.Refused, st.refused)
		}
	}
	if f := s.Finals()["r"]; f != (Final{Value: 2, Writes: 2, Refused: 2}) {
		t.Errorf("final %+v", f)
	}
}

package fairlock

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/internal/keyspace"
)

// A latch's condition key can expire with only dead waiters in it (it
// outlives their deadlines, not the state hash's later moves) and be made
// again by a new waiter; the dead waiters' marks still count in nc. The
// count down that opens the latch wakes the live waiter and must drop the
// lost marks too: left counted, the latch answered "waiters left to wake"
// at every call (the long TestPropertyFairSafe: "CountDown = 0 (stored
// 0), reply [0 1 0]").
func TestLatchOpensPastLostMarks(t *testing.T) {
	if err := latchOpensPastLostMarks(t, nil); err != nil {
		t.Fatal(err)
	}
}

// latchOpensPastLostMarks is TestLatchOpensPastLostMarks on scripts
// changed by transform: the error says what went wrong.
func latchOpensPastLostMarks(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	lk := latchKeysOf(keyspace.Keys{Base: "trace:{l}"})
	ks := append(append(lk.res.List(), condKeys(lk.res, latchCond)...), lk.count)
	run := func(args ...string) string { return fmt.Sprint(g.runOn(ks, args...)) }
	// PX waits with a 1 s waiter TTL, and dies.
	if got := run("latch_wait", "2", "600000", "TX", "PX", "10000", "1000"); !strings.HasPrefix(got, "[1 ") {
		return fmt.Errorf("PX's wait = %v, want waiting", got)
	}
	if got := run("latch_down", "2", "600000", "D1"); got != "[1 0]" {
		return fmt.Errorf("the first count down = %v, want [1 0]", got)
	}
	g.advance(5000)
	// The condition's key expires with PX's dead member in it.
	if err := g.r.RDB.Del(context.Background(), condKeys(lk.res, latchCond)[0]).Err(); err != nil {
		return err
	}
	// PY waits: the key is made again, with PY alone.
	if got := run("latch_wait", "2", "600000", "TY", "PY", "10000", "1000"); !strings.HasPrefix(got, "[1 ") {
		return fmt.Errorf("PY's wait = %v, want waiting", got)
	}
	if got := run("latch_down", "2", "600000", "D2"); got != "[0 0]" {
		return fmt.Errorf("the count down that opens the latch = %v, want [0 0] (no waiter left)\n%s", got, g.dump())
	}
	if got := run("latch_count", "0"); got != "[0 2 0]" {
		return fmt.Errorf("latch_count = %v, want [0 2 0] (no waiter registered)\n%s", got, g.dump())
	}
	return nil
}

package fairlock

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/internal/keyspace"
)

// A round that breaks wakes each of its waiting parties with the outcome
// broken: two parties of three wait, the first breaks the round (its
// caller's context ended), and the second's wake-up must say so. Woken
// as completed, its Await would report a round that never completed.
func TestBrokenRoundWakesItsPartiesBroken(t *testing.T) {
	if err := brokenRoundWakesItsPartiesBroken(t, nil); err != nil {
		t.Fatal(err)
	}
}

// brokenRoundWakesItsPartiesBroken is TestBrokenRoundWakesItsPartiesBroken
// on scripts changed by transform: the error says what went wrong.
func brokenRoundWakesItsPartiesBroken(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	bk := barrierKeysOf(keyspace.Keys{Base: "trace:{b}"})
	ks := append(append(bk.res.List(), condKeys(bk.res, barrierCond)...), bk.state)
	run := func(args ...string) []any {
		out, _ := g.runOn(ks, args...).([]any)
		return out
	}
	// barrier_await's ARGV: parties, the barrier's TTL, ticket, client,
	// lease, waiter TTL, the round asked for ("" for a new arrival). A
	// party that waits answers [1 now next round index].
	var round string
	for _, p := range []string{"A", "B"} {
		got := run("barrier_await", "3", "600000", "T"+p, "P"+p, "10000", "1000", "")
		if len(got) < 5 || fmt.Sprint(got[0]) != "1" {
			return fmt.Errorf("party %s's arrival = %v, want it waiting", p, got)
		}
		round = fmt.Sprint(got[3])
	}
	if got := run("barrier_break", "3", "600000", "TA", round); len(got) == 0 || fmt.Sprint(got[0]) != "1" {
		return fmt.Errorf("party A's break = %v, want the round broken\n%s", got, g.dump())
	}
	list := bk.res.Wake("PB")
	entries, err := g.r.RDB.LRange(context.Background(), list, 0, -1).Result()
	if err != nil {
		return err
	}
	for _, e := range entries {
		// A barrier's wake-up: "ticket now outcome" (1 completed, 2 broken).
		if f := strings.Fields(e); len(f) == 3 && f[0] == "TB" {
			if f[2] != "2" {
				return fmt.Errorf("party B's wake-up = %q, want its round broken (2)", e)
			}
			return nil
		}
	}
	return fmt.Errorf("party B heard no wake-up on %s: %q\n%s", list, entries, g.dump())
}

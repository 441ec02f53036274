package main

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// stepRows names each logged call by its implementation and kind, counts
// only this run's keys, gathers a tag that names a process into one row,
// and orders the rows by implementation as met, then by total time.
func TestStepRows(t *testing.T) {
	run := "bench:R1:"
	fc := func(fn string, keys []string, args ...string) []string {
		out := append([]string{"FCALL", fn, fmt.Sprint(len(keys))}, keys...)
		return append(out, args...)
	}
	lib := "fairlock_acquire_0123456789abcdef"
	entries := []struct {
		args []string
		addr string
		us   int64
	}{
		{fc(lib, []string{run + "fairlock:{contended64}:s", run + "fairlock:{contended64}:q"}, "acquire", "T1"), "127.0.0.1:1", 70},
		{[]string{"hmget", run + "fairlock:{contended64}:s", "cap"}, "", 5},
		{fc(lib, []string{run + "fairlock:{contended64}:s"}, "try", "T2"), "127.0.0.1:1", 30},
		{fc(lib, []string{run + "fairlock:{contended64}:s"}, "acquire", "T3"), "127.0.0.1:1", 90},
		{fc("fairlock_fifo_release", []string{run + "FIFO floor (reference):{contended64}:s"}, "w", "0"), "127.0.0.1:2", 20},
		{[]string{"BLMPOP", "1", "1", run + "fairlock:w:abc", "LEFT"}, "127.0.0.1:3", 2},
		{[]string{"rpush", run + "fairlock:{w:/24/CLIENTA}", "x"}, "127.0.0.1:3", 4},
		{[]string{"rpush", run + "fairlock:{w:/24/CLIENTB}", "x"}, "127.0.0.1:3", 3},
		{fc(lib, []string{"bench:OTHER:fairlock:{x}:s"}, "acquire"), "127.0.0.1:1", 1000}, // another run's
		{[]string{"PING"}, "127.0.0.1:4", 1},
		{fc("f", nil), "127.0.0.1:4", 1}, // no keys
	}
	var log []redis.SlowLog
	for i, e := range entries {
		// SLOWLOG GET gives the newest first.
		log = append([]redis.SlowLog{{ID: int64(i), Args: e.args, ClientAddr: e.addr, Duration: time.Duration(e.us) * time.Microsecond}}, log...)
	}
	got := []string{}
	for _, r := range stepRows(log, run) {
		got = append(got, fmt.Sprintf("%s | %s | %v", r.impl, r.call, r.us))
	}
	want := []string{
		"fairlock {contended64} | fairlock_acquire acquire | [70 90]",
		"fairlock {contended64} | fairlock_acquire try | [30]",
		"fairlock {contended64} | hmget | [5]",
		"FIFO floor (reference) {contended64} | fairlock_fifo_release | [20]",
		"fairlock | blmpop | [2]",
		"fairlock {w:/…} | rpush | [3 4]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n%q\nwant:\n%q", got, want)
	}
	r := &stepRow{us: []int64{1, 2, 3, 4, 100}}
	if r.pct(50) != 3 || r.pct(90) != 4 || r.mean() != 22 || r.total() != 110 {
		t.Errorf("p50 %d p90 %d mean %v total %d, want 3 4 22 110", r.pct(50), r.pct(90), r.mean(), r.total())
	}
}

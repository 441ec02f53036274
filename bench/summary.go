package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// summary is the front page's table: a few rows drawn from the run's
// scenario tables, fairlock's figures beside its peers', the costs of
// fairness among them (Redis CPU per acquisition; throughput at scale and
// with short holds). The README pastes it with the run's id, so that its
// figures and bench/README.md's come from one run.
func summary(rep *Report) *Table {
	t := &Table{Name: "summary", Title: "Summary",
		Note:    "fairlock on go-redis first, then on rueidis and valkey-go in brackets; the peers' range, the best of them named. Drawn from the tables below.",
		Columns: []string{"measure", "fairlock (rueidis, valkey-go)", "peers"}}
	type pick struct {
		what, table, key string
		where            func(map[string]any) bool
		format           func(float64) string
		higherBetter     bool
	}
	at := func(k string, v float64) func(map[string]any) bool {
		return func(d map[string]any) bool { f, ok := figure64(d[k]); return ok && f == v }
	}
	usF := func(v float64) string { return fmt.Sprintf("%.0f µs", v) }
	msF := func(v float64) string { return fmt.Sprintf("%.0f ms", v) }
	x := func(v float64) string { return fmt.Sprintf("%.2f ×", v) }
	cpu := func(v float64) string { return fmt.Sprintf("%.1f µs", v) }
	plain := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	jainF := func(v float64) string { return fmt.Sprintf("%.3f", v) }
	picks := []pick{
		{"uncontended acquire p50", "uncontended", "acquire_p50_us", nil, usF, false},
		{"Redis CPU per uncontended acquire + release", "uncontended", "redis_cpu_us_per_cycle", nil, cpu, false},
		{"handoff to a blocked waiter, p50", "handoff", "handoff_p50_us", nil, usF, false},
		{"64 processes, 1 ms holds: acquisitions/s ÷ best peer", "contended", "per_best_peer", at("n", 64), x, true},
		{"64 processes, 1 ms holds: Jain's fairness index (1 is fair)", "contended", "jain", at("n", 64), jainF, true},
		{"64 processes, 1 ms holds: processes that never acquired", "contended", "starved", at("n", 64), plain, false},
		{"64 processes, 1 ms holds: Redis CPU per acquisition", "contended", "redis_cpu_us_per_acq", at("n", 64), cpu, false},
		{"64 processes, 100 µs holds: acquisitions/s ÷ best peer", "contended-100us", "per_best_peer", at("n", 64), x, true},
		{"8 waiters 3 ms apart: grant-order inversions (0 is FIFO)", "fifo", "inversions", nil, plain, false},
		{"1,000 waiters in one process: drain", "drain", "drain_ms", nil, msF, false},
		{"1,000 names, 64 goroutines: acquisitions/s ÷ best peer", "scale", "per_best_peer", at("m", 1000), x, true},
		{"1,000 names: Redis CPU per acquisition", "scale", "redis_cpu_us_per_acq", at("m", 1000), cpu, false},
	}
	for _, p := range picks {
		tab := slices.IndexFunc(rep.Scenarios, func(s *Table) bool { return s.Name == p.table })
		if tab < 0 {
			continue
		}
		own := map[string]float64{}
		type peer struct {
			name string
			v    float64
		}
		var peers []peer
		for _, d := range rep.Scenarios[tab].Data {
			if p.where != nil && !p.where(d) {
				continue
			}
			name, _ := d["impl"].(string)
			v, ok := figure64(d[p.key])
			if !ok || math.IsNaN(v) || strings.Contains(name, "(reference)") {
				continue
			}
			if strings.HasPrefix(name, "fairlock") {
				own[name] = v
			} else {
				peers = append(peers, peer{name, v})
			}
		}
		main, ok := own["fairlock"]
		if !ok {
			continue
		}
		cell := p.format(main)
		var others []string
		for _, n := range []string{"fairlock-rueidis", "fairlock-valkey"} {
			if v, ok := own[n]; ok {
				others = append(others, p.format(v))
			}
		}
		if len(others) > 0 {
			cell += " (" + strings.Join(others, ", ") + ")"
		}
		peersCell := "–"
		if len(peers) > 0 {
			slices.SortFunc(peers, func(a, b peer) int {
				if p.higherBetter {
					return cmpFloat(b.v, a.v)
				}
				return cmpFloat(a.v, b.v)
			})
			lo, hi := peers[0].v, peers[len(peers)-1].v
			peersCell = p.format(lo)
			if hi != lo {
				peersCell += " – " + p.format(hi)
			}
			peersCell += " (best: " + peers[0].name + ")"
		}
		t.Rows = append(t.Rows, []string{p.what, cell, peersCell})
		t.Data = append(t.Data, map[string]any{"measure": p.what, "fairlock": main})
	}
	return t
}

// figure64 reads a figure of a table's data as a float64.
func figure64(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	}
	return 0, false
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// slowlogMaxLen is how many entries the server keeps while -slowlog logs
// every command: a 3 s contended scenario logs about 200,000.
const slowlogMaxLen = 1_000_000

// serverSteps is -slowlog's capture of one scenario: the server's SLOWLOG
// set to log every command, and its settings as they were, put back by
// table.
type serverSteps struct {
	rdb   *redis.Client
	saved map[string]string
}

// startSteps sets rdb's server to log every command, with its execution
// time, and empties its log. On a server that refuses (miniredis has no
// SLOWLOG) it returns an error and changes nothing.
func startSteps(ctx context.Context, rdb *redis.Client) (*serverSteps, error) {
	saved := map[string]string{}
	for _, p := range []string{"slowlog-log-slower-than", "slowlog-max-len"} {
		v, err := rdb.ConfigGet(ctx, p).Result()
		if err != nil {
			return nil, err
		}
		saved[p] = v[p]
	}
	s := &serverSteps{rdb: rdb, saved: saved}
	if err := rdb.ConfigSet(ctx, "slowlog-max-len", fmt.Sprint(slowlogMaxLen)).Err(); err != nil {
		return nil, err
	}
	if err := rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		s.restore(ctx)
		return nil, err
	}
	if err := rdb.SlowLogReset(ctx).Err(); err != nil {
		s.restore(ctx)
		return nil, err
	}
	return s, nil
}

// restore puts the server's SLOWLOG settings back as startSteps found them.
func (s *serverSteps) restore(ctx context.Context) {
	for p, v := range s.saved {
		s.rdb.ConfigSet(ctx, p, v)
	}
}

// table reads the log, puts the server's settings back, and returns the
// table of the scenario's calls (see stepRows), named after it.
func (s *serverSteps) table(ctx context.Context, scenario, run string) (*Table, error) {
	s.rdb.ConfigSet(ctx, "slowlog-log-slower-than", "-1") // (nothing more is logged while it is read)
	log, err := s.rdb.SlowLogGet(ctx, -1).Result()
	s.restore(ctx)
	s.rdb.SlowLogReset(ctx)
	if err != nil {
		return nil, err
	}
	t := &Table{Name: "steps_" + scenario, Title: "Server time per call: " + scenario,
		Note:    "Each call's execution inside Redis, from SLOWLOG with every command logged (-slowlog): a script's time includes the commands it runs, and no network, parsing or reply. SLOWLOG logs the commands a script runs as well, under its caller: a command's row holds those and the client's own, and its time is in its script's too. Rows under 0.1% of the scenario's logged time are left out. Logging every command costs the server about a microsecond each, so the scenario's other figures are diagnostic only in this run.",
		Columns: []string{"implementation", "call", "calls", "mean", "p50", "p90", "total"}}
	if len(log) >= slowlogMaxLen {
		t.Note += fmt.Sprintf(" The log held its %d entries at the most: the earliest calls are not counted.", slowlogMaxLen)
	}
	rows := stepRows(log, run)
	var all int64
	for _, r := range rows {
		all += r.total()
	}
	for _, r := range rows {
		if r.total()*1000 < all {
			continue
		}
		t.Rows = append(t.Rows, []string{r.impl, r.call, fmt.Sprint(len(r.us)), fmt.Sprintf("%.1f µs", r.mean()),
			fmt.Sprintf("%d µs", r.pct(50)), fmt.Sprintf("%d µs", r.pct(90)), fmt.Sprintf("%.1f ms", float64(r.total())/1000)})
		t.Data = append(t.Data, map[string]any{"implementation": r.impl, "call": r.call, "calls": len(r.us),
			"mean_us": r.mean(), "p50_us": r.pct(50), "p90_us": r.pct(90), "total_us": r.total()})
	}
	return t, nil
}

// A stepRow is one implementation's calls of one kind, with each one's
// execution time (µs).
type stepRow struct {
	impl, call string
	us         []int64
}

func (r *stepRow) total() int64 {
	var n int64
	for _, u := range r.us {
		n += u
	}
	return n
}

func (r *stepRow) mean() float64 { return float64(r.total()) / float64(len(r.us)) }

// pct returns the p-th percentile of r's times (r.us sorted).
func (r *stepRow) pct(p int) int64 { return r.us[(len(r.us)-1)*p/100] }

// libraryFn matches a function of fairlock's library: its entry's name,
// then the hash of the sources (script.NewLibrary).
var libraryFn = regexp.MustCompile(`^(fairlock_[a-z_]+)_[0-9a-f]{16}$`)

// stepRows groups the SLOWLOG entries of this run's keys (prefix run) by
// implementation (the part of the first key that follows run, and the
// lock's hash tag when the key has one) and call:
// a function by its name (fairlock's by its entry and op, ARGV[1]), a
// script by its SHA1, a command by its name (SLOWLOG logs the commands a
// script runs as well, under its client: they cannot be told from the
// client's own). Rows come by implementation as first met in the log's
// order (oldest first), then most total time first.
func stepRows(log []redis.SlowLog, run string) []*stepRow {
	rows := map[[2]string]*stepRow{}
	var order []*stepRow
	for i := len(log) - 1; i >= 0; i-- { // (SLOWLOG GET gives the newest first)
		e := log[i]
		impl, call, ok := stepOf(e.Args, run)
		if !ok {
			continue
		}
		k := [2]string{impl, call}
		r := rows[k]
		if r == nil {
			r = &stepRow{impl: impl, call: call}
			rows[k] = r
			order = append(order, r)
		}
		r.us = append(r.us, e.Duration.Microseconds())
	}
	impls := []string{}
	for _, r := range order {
		slices.Sort(r.us)
		if !slices.Contains(impls, r.impl) {
			impls = append(impls, r.impl)
		}
	}
	slices.SortStableFunc(order, func(a, b *stepRow) int {
		if a.impl != b.impl {
			return slices.Index(impls, a.impl) - slices.Index(impls, b.impl)
		}
		switch ta, tb := a.total(), b.total(); {
		case ta > tb:
			return -1
		case ta < tb:
			return 1
		}
		return 0
	})
	return order
}

// stepOf names the implementation and the call of a logged command's
// arguments, or reports false when its first key is not this run's.
func stepOf(args []string, run string) (impl, call string, ok bool) {
	if len(args) == 0 {
		return "", "", false
	}
	cmd := strings.ToLower(args[0])
	key, call := "", cmd
	switch cmd {
	case "fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro":
		if len(args) < 4 || args[2] == "0" {
			return "", "", false
		}
		key = args[3]
		switch {
		case strings.HasPrefix(cmd, "fcall"):
			call = args[1]
			if m := libraryFn.FindStringSubmatch(call); m != nil {
				call = m[1]
				var n int
				if _, err := fmt.Sscan(args[2], &n); err == nil && len(args) > 3+n {
					call += " " + args[3+n]
				}
			}
		case strings.HasPrefix(cmd, "evalsha"):
			call = "script " + args[1][:min(len(args[1]), 8)]
		default:
			call = "script"
		}
	case "blmpop", "bzmpop":
		if len(args) < 4 {
			return "", "", false
		}
		key = args[3]
	default:
		if len(args) < 2 {
			return "", "", false
		}
		key = args[1]
	}
	rest, found := strings.CutPrefix(key, run)
	if !found {
		return "", "", false
	}
	impl, rest, _ = strings.Cut(rest, ":")
	// A lock's keys carry its name as a hash tag (the contended scenario's
	// {contended64}): calls on locks of different sizes of a scenario
	// are told apart.
	// A tag that names a process besides (a wake list's, {w:/…/client})
	// is cut at its first slash: one row for them all.
	if tag, _, ok := strings.Cut(rest, "}"); ok && strings.HasPrefix(tag, "{") {
		if head, _, cut := strings.Cut(tag, "/"); cut {
			tag = head + "/…"
		}
		impl += " " + tag + "}"
	}
	return impl, call, true
}

// withSteps runs scenario f, with the server's time per call captured
// when -slowlog asks for it on a real server; its table follows the
// scenario's.
func (e *env) withSteps(name string, f func(*env) ([]*Table, []Target, error)) ([]*Table, []Target, error) {
	if !e.cfg.slowlog || !e.real {
		return f(e)
	}
	// Each step has a minute of its own: the scenario between them can
	// run longer than that.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	s, err := startSteps(ctx, e.admin)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("-slowlog: %w", err)
	}
	tables, targets, err := f(e)
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err != nil {
		s.restore(ctx)
		return tables, targets, err
	}
	t, err := s.table(ctx, name, e.run)
	if err != nil {
		return nil, nil, fmt.Errorf("-slowlog: %w", err)
	}
	return append(tables, t), targets, nil
}

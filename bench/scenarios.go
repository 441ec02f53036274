package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

var scenarios = map[string]func(*env) ([]*Table, []Target, error){
	"uncontended":     uncontended,
	"handoff":         handoff,
	"contended":       contended,
	"contended-100us": contended100us,
	"queue":           queueScaling,
	"fifo":            fifo,
	"drain":           drain,
	"semaphore":       countingSemaphore,
	"dining":          dining,
	"phase":           phase,
	"floor":           floor,
	"scale":           atScale,
	"wake":            manyNames,
}

// counter is a go-redis hook counting the commands one process sends.
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		if opStats != nil {
			opStats.note(cmd)
		}
		return next(ctx, cmd)
	}
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// A proc is one simulated process: its own go-redis client and locker.
type proc struct {
	locker
	rdb *redis.Client
}

// procs opens n processes of im, all counting their commands into cnt.
func (e *env) procs(im impl, n int, cnt *counter) ([]*proc, func(), error) {
	var ps []*proc
	closeAll := func() {
		for _, p := range ps {
			p.close()
			p.rdb.Close()
		}
	}
	for range n {
		rdb := counted(redis.NewClient(&redis.Options{Addr: e.addr}), cnt)
		l, err := im.open(rdb, e.run+im.name+":")
		if err != nil {
			rdb.Close()
			closeAll()
			return nil, nil, err
		}
		ps = append(ps, &proc{locker: l, rdb: rdb})
	}
	return ps, closeAll, nil
}

// serverCalls returns the commands Redis has run in all (INFO
// commandstats, script-internal calls included), or -1 where INFO does not
// say (miniredis).
func (e *env) serverCalls() int64 {
	info, err := e.admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return -1
	}
	var total int64
	found := false
	for _, l := range strings.Split(strings.ReplaceAll(info, "\r", ""), "\n") {
		// cmdstat_get:calls=1,usec=...
		_, rest, ok := strings.Cut(l, ":calls=")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.ParseInt(num, 10, 64)
		total += n
		found = true
	}
	if !found {
		return -1
	}
	return total
}

func (e *env) connectedClients() int {
	info, err := e.admin.Info(context.Background(), "clients").Result()
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(infoField(info, "connected_clients"))
	if err != nil {
		return -1
	}
	return n
}

// rotate returns the implementations starting at the k-th, so that in
// turn each goes first: drift of the machine hits all alike.
func rotate(ims []impl, k int) []int {
	out := make([]int, len(ims))
	for i := range ims {
		out[i] = (i + k) % len(ims)
	}
	return out
}

func us(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }

// fNear formats x against a limit with two decimals, or three where two
// would show the limit itself for a value past it (8.003 is not 8.00).
func fNear(x, limit float64) string {
	if s := f2(x); x > limit && s == f2(limit) {
		return strconv.FormatFloat(x, 'f', 3, 64)
	}
	return f2(x)
}

func perAcq(cmds, acqs int64) string {
	if cmds < 0 || acqs == 0 {
		return "n/a"
	}
	return f2(float64(cmds) / float64(acqs))
}

// 1. Uncontended acquire and release, against a PING in the same loop.
func uncontended(e *env) ([]*Table, []Target, error) {
	refNote := ""
	if refs, ok := e.floorRefs(); ok {
		e = e.withRefs(refs...)
		refNote = " The two reference rows are not locks: the floor functions are FCALLs doing only an uncontended acquire's and a release's Redis commands (table 8); the least script lock's FCALLs do TIME, HMGET and HSET each and nothing else, the fewest commands of any lock whose leases Redis's clock judges from a script's state hash (a lock with fairlock's guarantees cannot cost less); both in the same loop."
	}
	ctx := context.Background()
	n := len(e.impls)
	ps := make([]*proc, n)
	cnt := make([]*counter, n)
	for i, im := range e.impls {
		cnt[i] = &counter{}
		p, closeAll, err := e.procs(im, 1, cnt[i])
		if err != nil {
			return nil, nil, err
		}
		defer closeAll()
		ps[i] = p[0]
	}
	pinger := redis.NewClient(&redis.Options{Addr: e.addr})
	defer pinger.Close()
	acq := make([][]time.Duration, n)
	rel := make([][]time.Duration, n)
	var pings []time.Duration
	deadline := time.Now().Add(time.Duration(n) * e.cfg.duration)
	for iter := 0; iter < 20 || time.Now().Before(deadline); iter++ {
		t0 := time.Now()
		if err := pinger.Ping(ctx).Err(); err != nil {
			return nil, nil, err
		}
		pings = append(pings, time.Since(t0))
		for _, i := range rotate(e.impls, iter) {
			t0 := time.Now()
			unlock, err := ps[i].lock(ctx, "u")
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", e.impls[i].name, err)
			}
			t1 := time.Now()
			if err := unlock(ctx); err != nil {
				return nil, nil, fmt.Errorf("%s release: %w", e.impls[i].name, err)
			}
			if iter > 0 { // the first round warms connections and scripts
				acq[i] = append(acq[i], t1.Sub(t0))
				rel[i] = append(rel[i], time.Since(t1))
			}
		}
	}
	pingP50 := quantile(pings, 0.5)
	cpu, err := e.uncontendedCPU(ps)
	if err != nil {
		return nil, nil, err
	}
	source := "Redis CPU: n/a (embedded)."
	if cpu.measured {
		source = "Redis CPU is the main thread's (INFO cpu used_cpu_user_main_thread + used_cpu_sys_main_thread)"
		if !cpu.mainThread {
			source = "Redis CPU is the whole process's (INFO cpu used_cpu_user + used_cpu_sys: this server has no main-thread figures)"
		}
		source += fmt.Sprintf(", read before and after slices of %d cycles per implementation, interleaved, minus an empty slice's (the INFO calls'); server commands from INFO commandstats, scripts' inner commands included.", cpuBatch)
	}
	var names []string
	for _, im := range e.impls {
		names = append(names, im.name)
	}
	pingMark := []marker{{micros(pingP50), "PING p50"}}
	fig := cdfFigure("uncontended", "1. Uncontended acquire and release: latency distributions",
		fmt.Sprintf("One process per implementation, one lock, nobody else; %d samples each, interleaved. A curve further left is faster; its height at a latency is the share of calls that took at most that long.", len(acq[0])),
		2, []cdfPanel{{"acquire", names, acq, pingMark}, {"release", names, rel, pingMark}})
	t := &Table{Name: "uncontended", Title: "1. Uncontended acquire + release", figs: []*figure{fig},
		Note: fmt.Sprintf("One process per implementation, one lock, nobody else. PING p50 %s, p99 %s, measured in the same loop (%d samples). ", us(pingP50), us(quantile(pings, 0.99)), len(pings)) + source + refNote,
		Columns: []string{"implementation", "acquire p50", "acquire p99", "release p50", "acquire p50 / PING p50", "commands per acquire+release",
			"Redis CPU per acquire+release", "÷ setnx's", "server commands per acquire+release", "samples"}}
	var targets []Target
	ref := -1.0
	for i, im := range e.impls {
		if im.name == "setnx" && cpu.measured {
			ref = cpu.perCycle[i]
		}
	}
	// The least script lock's row (a reference, where the server has
	// functions): the engine's targets are judged against it.
	least := slices.IndexFunc(e.impls, func(im impl) bool { return im.name == refLeastScript })
	for i, im := range e.impls {
		r := ratio(quantile(acq[i], 0.5), pingP50)
		cpuS, cpuR, calls := "n/a (embedded)", "n/a (embedded)", "n/a (embedded)"
		var cpuRatio float64 = math.NaN()
		if cpu.measured {
			cpuS = fmt.Sprintf("%.1f µs", cpu.perCycle[i])
			cpuR = "n/a (no setnx)"
			if ref > 0 {
				cpuRatio = cpu.perCycle[i] / ref
				cpuR = f2(cpuRatio)
			}
			calls = "n/a"
			if cpu.calls[i] >= 0 {
				calls = f2(cpu.calls[i])
			}
		}
		t.Rows = append(t.Rows, []string{im.name, us(quantile(acq[i], 0.5)), us(quantile(acq[i], 0.99)), us(quantile(rel[i], 0.5)), f2(r),
			perAcq(cnt[i].n.Load(), int64(len(acq[i])+1+cpu.cycles[i])), cpuS, cpuR, calls, strconv.Itoa(len(acq[i]))})
		d := map[string]any{"impl": im.name, "acquire_p50_us": micros(quantile(acq[i], 0.5)), "acquire_p99_us": micros(quantile(acq[i], 0.99)),
			"release_p50_us": micros(quantile(rel[i], 0.5)), "ping_p50_us": micros(pingP50), "acquire_per_ping": r, "samples": len(acq[i])}
		if cpu.measured {
			d["redis_cpu_us_per_cycle"] = cpu.perCycle[i]
			d["redis_cpu_main_thread"] = cpu.mainThread
			d["cpu_cycles"] = cpu.cycles[i]
			if !math.IsNaN(cpuRatio) {
				d["redis_cpu_per_setnx"] = cpuRatio
			}
			if cpu.calls[i] >= 0 {
				d["server_cmds_per_cycle"] = cpu.calls[i]
			}
		}
		t.Data = append(t.Data, d)
		if im.name == batchedName {
			if own := slices.IndexFunc(e.impls, func(x impl) bool { return x.ownRow() }); own >= 0 {
				ra := ratio(quantile(acq[i], 0.5), quantile(acq[own], 0.5))
				targets = append(targets, timed(Target{"uncontended", "a lone call's latency (acquire p50) with batching on ≤ 1.05 × off", f2(ra) + " ×", ra <= 1.05, false}))
			}
		}
		if im.ownRow() {
			if least < 0 {
				// No reference row (no functions): the target stands, unmeasured.
				targets = append(targets, timed(Target{"uncontended", "acquire p50 ≤ 1.2 × least script lock's", "n/a (the reference needs a server with functions)", false, false}))
			} else {
				ra := ratio(quantile(acq[i], 0.5), quantile(acq[least], 0.5))
				targets = append(targets, timed(Target{"uncontended", "acquire p50 ≤ 1.2 × least script lock's", f2(ra) + " ×", ra <= 1.2, false}))
				if cpu.measured {
					rc := cpu.perCycle[i] / cpu.perCycle[least]
					targets = append(targets, timed(Target{"uncontended", "Redis CPU per acquire+release ≤ 1.25 × least script lock's",
						fmt.Sprintf("%s × (%.1f µs; least script lock %.1f µs)", f2(rc), cpu.perCycle[i], cpu.perCycle[least]), rc <= 1.25, false}))
				}
			}
			if e.real {
				if cpu.measured && cpu.calls[i] >= 0 {
					// Judged to the table's two decimals: the readings' own
					// commands, subtracted as an empty slice's mean, vary by
					// one from slice to slice (8.000 is 8 plus that noise).
					c := math.Round(cpu.calls[i]*100) / 100
					targets = append(targets, Target{"uncontended", "server commands per acquire+release ≤ 8", fNear(c, 8), c <= 8, false})
				}
			}
		}
	}
	return []*Table{t}, targets, nil
}

// cpuBatch is how many acquire+release cycles one CPU slice runs.
const cpuBatch = 200

// cpuFigures is Redis's cost of uncontended acquire+release cycles, per
// implementation (indexed as e.impls).
type cpuFigures struct {
	measured   bool      // false where INFO cpu says nothing (miniredis)
	mainThread bool      // see cpuTime
	perCycle   []float64 // µs of Redis CPU per acquire+release
	calls      []float64 // server commands per acquire+release; -1 unknown
	cycles     []int
}

// uncontendedCPU runs slices of cpuBatch acquire+release cycles on ps (one
// process per implementation), the implementations in turn as the latency
// loop interleaves them, with an empty slice among them that measures what
// the INFO calls themselves cost. Each implementation gets about half of
// -duration and at least three slices. It returns the first error of a
// lock or release. On miniredis it runs one round only, to check the
// path, and measured is false.
func (e *env) uncontendedCPU(ps []*proc) (cpuFigures, error) {
	ctx := context.Background()
	n := len(ps)
	f := cpuFigures{perCycle: make([]float64, n), calls: make([]float64, n), cycles: make([]int, n)}
	cpuSum := make([]float64, n+1) // index n: the empty slice
	callSum := make([]int64, n+1)
	slicesRun := make([]int, n+1)
	measured, mainThread, callsKnown := true, true, true
	budget := time.Duration(n) * e.cfg.duration / 2
	start := time.Now()
	for round := 0; round < 3 || (e.real && time.Since(start) < budget); round++ {
		order := append(rotate(e.impls, round), n)
		if round%2 == 1 {
			slices.Reverse(order) // the empty slice runs first and last in turn
		}
		for _, i := range order {
			calls0 := e.serverCalls()
			c0, ok0 := e.serverCPU()
			if i < n {
				for range cpuBatch {
					unlock, err := ps[i].lock(ctx, "u")
					if err != nil {
						return f, fmt.Errorf("%s: %w", e.impls[i].name, err)
					}
					if err := unlock(ctx); err != nil {
						return f, fmt.Errorf("%s release: %w", e.impls[i].name, err)
					}
				}
				f.cycles[i] += cpuBatch
			}
			c1, ok1 := e.serverCPU()
			calls1 := e.serverCalls()
			if !ok0 || !ok1 {
				measured = false
			} else {
				mainThread = mainThread && c0.mainThread && c1.mainThread
				cpuSum[i] += c1.seconds - c0.seconds
			}
			if calls0 < 0 || calls1 < 0 {
				callsKnown = false
			} else {
				callSum[i] += calls1 - calls0
			}
			slicesRun[i]++
		}
		if !e.real {
			break
		}
	}
	f.measured, f.mainThread = measured && e.real, mainThread
	emptyCPU := cpuSum[n] / float64(slicesRun[n])
	emptyCalls := float64(callSum[n]) / float64(slicesRun[n])
	for i := range n {
		s := float64(slicesRun[i])
		f.perCycle[i] = max(0, (cpuSum[i]-s*emptyCPU)*1e6/float64(f.cycles[i]))
		f.calls[i] = -1
		if callsKnown {
			f.calls[i] = (float64(callSum[i]) - s*emptyCalls) / float64(f.cycles[i])
		}
	}
	return f, nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// 2. Handoff: a release by one process to the return of a waiter blocked
// in another.
func handoff(e *env) ([]*Table, []Target, error) {
	ctx := context.Background()
	const idle = 20 * time.Millisecond // how long the waiter waits before the release
	n := len(e.impls)
	holders, waiters := make([]*proc, n), make([]*proc, n)
	cnts := make([]*counter, n)
	for i, im := range e.impls {
		cnts[i] = &counter{}
		p, closeAll, err := e.procs(im, 2, cnts[i])
		if err != nil {
			return nil, nil, err
		}
		defer closeAll()
		holders[i], waiters[i] = p[0], p[1]
	}
	pinger := redis.NewClient(&redis.Options{Addr: e.addr})
	defer pinger.Close()
	_ = pinger.Ping(ctx)
	hand := make([][]time.Duration, n)
	rel := make([][]time.Duration, n) // the release call itself
	var pings []time.Duration
	// Per cycle (the holder's acquire to the waiter's release, the wait
	// between included): client commands, server commands and Redis CPU,
	// summed over the measured cycles; the empty pair of readings taken
	// each round is what the readings themselves cost.
	cyc := make([][3]float64, n+1)
	cycles := make([]int, n+1)
	deadline := time.Now().Add(time.Duration(n) * e.cfg.duration)
	for iter := 0; iter < 6 || time.Now().Before(deadline); iter++ {
		time.Sleep(idle)
		t0 := time.Now()
		if err := pinger.Ping(ctx).Err(); err != nil {
			return nil, nil, err
		}
		pings = append(pings, time.Since(t0))
		if e.real && iter > 0 {
			s0 := e.snap(&counter{})
			s1 := e.snap(&counter{})
			cyc[n] = addSnap(cyc[n], s0, s1)
			cycles[n]++
		}
		for _, i := range rotate(e.impls, iter) {
			var s0 snap
			if e.real {
				s0 = e.snap(cnts[i])
			}
			unlock, err := holders[i].lock(ctx, "h")
			if err != nil {
				return nil, nil, err
			}
			got := make(chan time.Time, 1)
			done := make(chan error, 1)
			go func() {
				u, err := waiters[i].lock(ctx, "h")
				if err != nil {
					got <- time.Time{}
					done <- err
					return
				}
				got <- time.Now()
				done <- u(ctx)
			}()
			time.Sleep(idle)
			t0 := time.Now()
			if err := unlock(ctx); err != nil {
				return nil, nil, err
			}
			released := time.Since(t0)
			t1 := <-got
			if err := <-done; err != nil {
				return nil, nil, fmt.Errorf("%s waiter: %w", e.impls[i].name, err)
			}
			if iter > 0 {
				hand[i] = append(hand[i], t1.Sub(t0))
				rel[i] = append(rel[i], released)
				if e.real {
					cyc[i] = addSnap(cyc[i], s0, e.snap(cnts[i]))
					cycles[i]++
				}
			}
		}
	}
	ping := quantile(pings, 0.5)
	bestRel := time.Duration(0)
	for i, im := range e.impls {
		if r := quantile(rel[i], 0.5); im.peer && (bestRel == 0 || r < bestRel) {
			bestRel = r
		}
	}
	t := &Table{Name: "handoff", Title: "2. Handoff: release to the blocked waiter's return",
		Note: fmt.Sprintf("The waiter has waited %v when the holder releases. Idle-PING: a PING after %v of silence on its connection, p50 %s. "+
			"Release call: the releasing call's own latency (its connection idle for %v, a waiter to wake); ÷ best peer divides its p50 by the fastest peer's. "+
			"Per handoff: from the holder's acquire to the waiter's release, the %v wait between included (the peers' polling in it counts); "+
			"server commands from INFO commandstats, Redis CPU from INFO cpu (main thread), read around each cycle, minus what a reading with nothing between costs.", idle, idle, us(ping), idle, idle),
		Columns: []string{"implementation", "handoff p50", "p99", "max", "p50 / idle-PING p50", "release call p50", "release call p99", "÷ best peer's release call",
			"client commands / handoff", "server commands / handoff", "Redis CPU / handoff", "samples"}}
	var targets []Target
	for i, im := range e.impls {
		r := ratio(quantile(hand[i], 0.5), ping)
		relP50 := quantile(rel[i], 0.5)
		rr := ratio(relP50, bestRel)
		client, server, cpuS := "n/a (embedded)", "n/a (embedded)", "n/a (embedded)"
		d := map[string]any{"impl": im.name, "handoff_p50_us": micros(quantile(hand[i], 0.5)), "handoff_p99_us": micros(quantile(hand[i], 0.99)),
			"handoff_max_us": micros(maxOf(hand[i])), "idle_ping_p50_us": micros(ping), "handoff_per_idle_ping": r, "samples": len(hand[i]),
			"release_call_p50_us": micros(relP50), "release_call_p99_us": micros(quantile(rel[i], 0.99))}
		if !math.IsNaN(rr) {
			d["release_call_per_best_peer"] = rr
		}
		if e.real && cycles[i] > 0 && cycles[n] > 0 {
			per := perCycle(cyc[i], cycles[i], cyc[n], cycles[n])
			client, server, cpuS = f2(per[0]), f2(per[1]), fmt.Sprintf("%.1f µs", per[2])
			d["client_cmds_per_handoff"], d["server_cmds_per_handoff"], d["redis_cpu_us_per_handoff"] = per[0], per[1], per[2]
		}
		rrS := "n/a"
		if !math.IsNaN(rr) {
			rrS = f2(rr)
		}
		t.Rows = append(t.Rows, []string{im.name, us(quantile(hand[i], 0.5)), us(quantile(hand[i], 0.99)), us(maxOf(hand[i])), f2(r),
			us(relP50), us(quantile(rel[i], 0.99)), rrS, client, server, cpuS, strconv.Itoa(len(hand[i]))})
		t.Data = append(t.Data, d)
		if im.ownRow() {
			// The engine's target, and the thin call path's beside it.
			targets = append(targets, timed(Target{"handoff", "handoff p50 ≤ 2.2 × idle-PING p50", f2(r) + " ×", r <= 2.2, false}),
				timed(Target{"handoff", "handoff p50 ≤ 2.0 × idle-PING p50 (with the thin call path)", f2(r) + " ×", r <= 2.0, false}))
			if !math.IsNaN(rr) {
				targets = append(targets, timed(Target{"handoff", "release call p50 ≤ 2.0 × best peer's release call", f2(rr) + " ×", rr <= 2.0, false}))
			}
		}
	}
	var names []string
	for _, im := range e.impls {
		names = append(names, im.name)
	}
	t.figs = append(t.figs, cdfFigure("handoff", "2. Handoff: latency distributions",
		fmt.Sprintf("A waiter has waited %v when the holder releases; %d handoffs per implementation. Left: from the release call's start to the waiter's return. Right: the release call itself.", idle, len(hand[0])),
		2, []cdfPanel{{"release to the waiter's return", names, hand, []marker{{micros(ping), "idle-PING p50"}}},
			{"the release call itself", names, rel, []marker{{micros(ping), "idle-PING p50"}}}}))
	return []*Table{t}, targets, nil
}

// addSnap adds to sum the client commands, server commands and Redis CPU
// (µs) between two readings.
func addSnap(sum [3]float64, a, b snap) [3]float64 {
	sum[0] += float64(b.client - a.client)
	sum[1] += float64(b.server - a.server)
	sum[2] += (b.cpu - a.cpu) * 1e6
	return sum
}

// perCycle divides the sums over n cycles by n, less what an empty pair of
// readings costs (empty over ne pairs); the client count has no such cost.
func perCycle(sum [3]float64, n int, empty [3]float64, ne int) [3]float64 {
	var out [3]float64
	out[0] = sum[0] / float64(n)
	for k := 1; k < 3; k++ {
		out[k] = max(0, sum[k]/float64(n)-empty[k]/float64(ne))
	}
	return out
}

// loopStats is what processes looping acquire / hold / release saw.
type loopStats struct {
	counts   []int64 // acquisitions per process
	permits  []int64 // permits per process (weighted scenarios)
	maxWait  time.Duration
	holdSum  time.Duration
	overlaps int64
	elapsed  time.Duration
	err      error

	// Counted in the steady part of each run (see loop's probe): from a
	// fifth of the run to just before its end, so that neither the
	// processes' first requests nor the waits cut off at the end count.
	// cpu is Redis's CPU seconds; noCPU is set where a reading failed
	// (miniredis), server -1 where commandstats did not say.
	// self is this process's CPU seconds (the clients' side: every
	// implementation's processes live in it, and only the one measured
	// runs in its slice).
	win struct {
		acqs, client, server int64
		cpu, self            float64
		noCPU                bool
	}
}

// snap is what a probe reads: the commands sent so far by the processes
// measured (client) and run by Redis in all (server, scripts' inner
// commands included; -1 where INFO does not say), and Redis's CPU time
// (cpuOK false where INFO cpu does not say).
type snap struct {
	client, server int64
	cpu            float64 // seconds
	cpuOK          bool
	self           float64 // this process's CPU seconds (user + system)
}

// snap reads cnt and the server's counters.
func (e *env) snap(cnt *counter) snap {
	s := snap{client: cnt.n.Load(), server: e.serverCalls(), self: selfCPU()}
	if c, ok := e.serverCPU(); ok && e.real {
		s.cpu, s.cpuOK = c.seconds, true
	}
	return s
}

// cpuPerAcq writes the steady window's Redis CPU per acquisition.
func (s *loopStats) cpuPerAcq() (float64, string) {
	if s.win.noCPU || s.win.acqs == 0 {
		return math.NaN(), "n/a (embedded)"
	}
	v := s.win.cpu * 1e6 / float64(s.win.acqs)
	return v, fmt.Sprintf("%.1f µs", v)
}

// selfPerAcq is the steady window's client CPU (this process's) per
// acquisition, in µs.
func (s *loopStats) selfPerAcq() (float64, string) {
	if s.win.acqs == 0 {
		return math.NaN(), "n/a"
	}
	v := s.win.self * 1e6 / float64(s.win.acqs)
	return v, fmt.Sprintf("%.1f µs", v)
}

func (s *loopStats) total() (n int64) {
	for _, c := range s.counts {
		n += c
	}
	return n
}

// loop runs every process of ps for d: acquire via take (returning the
// permits it holds and the release), hold for about hold, release.
// occupancy is checked against limit with a counter of fairlock's own.
func loop(ps []*proc, d, hold time.Duration, limit int64, st *loopStats,
	take func(ctx context.Context, i int, p *proc) (int64, func(context.Context) error, error)) {
	loopProbed(ps, d, hold, limit, st, nil, take)
}

// loopProbed is loop with a probe of the commands sent so far and Redis's
// CPU (see snap), read at a fifth of the run and again 5% before its end:
// st.win counts what happened between.
func loopProbed(ps []*proc, d, hold time.Duration, limit int64, st *loopStats, probe func() snap,
	take func(ctx context.Context, i int, p *proc) (int64, func(context.Context) error, error)) {
	if st.counts == nil {
		st.counts = make([]int64, len(ps))
		st.permits = make([]int64, len(ps))
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	end, _ := ctx.Deadline()
	var inUse atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	if probe != nil {
		wg.Go(func() {
			read := func() (acqs int64, sn snap) {
				mu.Lock()
				acqs = st.total()
				mu.Unlock()
				return acqs, probe()
			}
			time.Sleep(d / 5)
			a0, s0 := read()
			time.Sleep(time.Until(start.Add(d * 95 / 100)))
			a1, s1 := read()
			st.win.acqs += a1 - a0
			st.win.client += s1.client - s0.client
			if s0.server < 0 || s1.server < 0 || st.win.server < 0 {
				st.win.server = -1
			} else {
				st.win.server += s1.server - s0.server
			}
			st.win.self += s1.self - s0.self
			if s0.cpuOK && s1.cpuOK {
				st.win.cpu += s1.cpu - s0.cpu
			} else {
				st.win.noCPU = true
			}
		})
	}
	for i, p := range ps {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				n, release, err := take(ctx, i, p)
				waited := time.Since(t0)
				mu.Lock()
				// A wait cut off by the end of the run counts too: a
				// starving process must not hide there.
				st.maxWait = max(st.maxWait, waited)
				mu.Unlock()
				if err != nil {
					// An error at the run's end is the end's: its deadline
					// can pass a while before ctx says so (ctx's timer runs
					// late under load), and a client that set its socket's
					// deadline from ctx's fails the call first.
					if ctx.Err() == nil && time.Now().Before(end) {
						mu.Lock()
						st.err = err
						mu.Unlock()
						cancel()
					}
					return
				}
				h0 := time.Now()
				if inUse.Add(n) > limit {
					atomic.AddInt64(&st.overlaps, 1)
				}
				if hold < time.Millisecond {
					// time.Sleep rounds short sleeps up to about 1 ms in a
					// process that is otherwise idle (the peers'); a spin
					// holds every implementation alike.
					for time.Since(h0) < hold {
						runtime.Gosched()
					}
				} else {
					time.Sleep(hold)
				}
				inUse.Add(-n)
				err = release(context.Background())
				mu.Lock()
				st.holdSum += time.Since(h0)
				st.counts[i]++
				st.permits[i] += n
				if err != nil && st.err == nil {
					st.err = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	st.elapsed += time.Since(start)
}

func asFloats(xs []int64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// 3. Contended: N processes loop on one lock, 1 ms critical section.
func contended(e *env) ([]*Table, []Target, error) {
	return contendedWith(e, "contended", "3. Contended: N processes loop acquire / 1 ms critical section / release", time.Millisecond, []int{4, 16, 64})
}

// 3b. The same with a 100 µs critical section, where the lock's own cost
// shows more.
func contended100us(e *env) ([]*Table, []Target, error) {
	return contendedWith(e, "contended-100us", "3b. Contended: N processes loop acquire / 100 µs critical section / release", 100*time.Microsecond, []int{16, 64})
}

// contendedWith runs N processes per implementation looping acquire / hold
// / release on one lock, for each N of ns, and reports throughput,
// fairness, starvation and commands per acquisition.
func contendedWith(e *env, name, title string, hold time.Duration, ns []int) ([]*Table, []Target, error) {
	const parts = 3
	t := &Table{Name: name, Title: title,
		Note: fmt.Sprintf("Each implementation runs %v per N, in %d slices interleaved with the others. Longest wait includes waits cut off by the end of a slice; starved counts processes with no acquisition at all. "+
			"Commands per acquisition are counted in the steady part of each slice (from a fifth of it to 5%% before its end), so that the processes' first requests and the waits cut off at its end do not count; server commands come from INFO commandstats and include the commands scripts run; Lua-internal is server minus client commands; Redis CPU is INFO cpu's main thread over the same window, divided by its acquisitions. A hold under 1 ms is a spin: time.Sleep rounds it up to about 1 ms in an otherwise idle process.", e.cfg.duration, parts),
		Columns: []string{"N", "implementation", "acquisitions/s", "÷ best peer", "Jain", "starved", "longest wait", "longest wait / (N × mean hold)", "client commands / acq", "server commands / acq", "Lua-internal / acq", "Redis CPU / acq", "client CPU / acq", "overlaps"}}
	var targets []Target
	if refs, ok := e.fifoFloor(); ok {
		e = e.withRefs(refs...)
		t.Note += " Client CPU is this process's (user + system, getrusage) over the same window, divided by its acquisitions: every implementation's processes live in the harness's one process, and only the one measured runs in its slice." +
			" The FIFO floor rows are references, not locks to use: the least a FIFO lock woken by push can do (a key for the owner, a list of waiters, a release that pushes onto the first waiter's own list: no lease, no liveness, no retries), measured the same way, and the same doing besides the Redis commands of fairlock's enqueue and handing release (on keys of its own); ÷ best peer compares them too."
	}
	for _, N := range ns {
		n := len(e.impls)
		ps := make([][]*proc, n)
		cnt := make([]*counter, n)
		sts := make([]*loopStats, n)
		for i, im := range e.impls {
			cnt[i] = &counter{}
			p, closeAll, err := e.procs(im, N, cnt[i])
			if err != nil {
				return nil, nil, err
			}
			defer closeAll()
			ps[i], sts[i] = p, &loopStats{}
		}
		for s := range parts {
			for _, i := range rotate(e.impls, s) {
				probe := func() snap { return e.snap(cnt[i]) }
				// A -cpuprofile's samples of the slice's goroutines, and of
				// those they start, carry the implementation and N.
				labels := pprof.Labels("impl", e.impls[i].name, "N", strconv.Itoa(N))
				pprof.Do(context.Background(), labels, func(context.Context) {
					loopProbed(ps[i], e.cfg.duration/parts, hold, 1, sts[i], probe, func(ctx context.Context, _ int, p *proc) (int64, func(context.Context) error, error) {
						u, err := p.lock(ctx, fmt.Sprintf("%s%d", name, N))
						return 1, u, err
					})
				})
				if sts[i].err != nil {
					return nil, nil, fmt.Errorf("%s, N=%d: %w", e.impls[i].name, N, sts[i].err)
				}
			}
		}
		best := 0.0
		rates := make([]float64, n)
		for i, im := range e.impls {
			rates[i] = float64(sts[i].total()) / sts[i].elapsed.Seconds()
			if im.peer {
				best = max(best, rates[i])
			}
		}
		var shares []shareRow
		for i, im := range e.impls {
			shares = append(shares, shareRow{im.name, sts[i].counts, fmt.Sprintf("%.0f acquisitions/s", rates[i])})
		}
		t.figs = append(t.figs, sharesFigure(fmt.Sprintf("%s-n%d", name, N),
			fmt.Sprintf("%s: acquisitions per process, N = %d", strings.SplitN(title, ": ", 2)[0], N),
			fmt.Sprintf("%d processes loop acquire / %v critical section / release on one lock, %v per implementation. One bar per process, sorted; 1 is a fair share (the implementation's acquisitions ÷ N). A red tick under the axis is a process that never acquired.", N, hold, e.cfg.duration),
			shares))
		// The FIFO floor's row (a reference, where the server has
		// functions), which the engine's targets are judged against.
		floor := slices.IndexFunc(e.impls, func(im impl) bool { return im.name == refFIFOFloor })
		for i, im := range e.impls {
			st := sts[i]
			acqs := st.total()
			rate := rates[i]
			j := jain(asFloats(st.counts))
			starved := 0
			for _, c := range st.counts {
				if c == 0 {
					starved++
				}
			}
			meanHold := time.Duration(0)
			if acqs > 0 {
				meanHold = st.holdSum / time.Duration(acqs)
			}
			waitRatio := ratio(st.maxWait, time.Duration(N)*meanHold)
			vsBest, vsBestS := math.NaN(), "n/a"
			if best > 0 {
				vsBest = rate / best
				vsBestS = f2(vsBest)
			}
			// Commands per acquisition count the steady part of the runs.
			wacqs, client := st.win.acqs, st.win.client
			internal := int64(-1)
			if st.win.server >= 0 {
				internal = max(st.win.server-client, 0)
			}
			cpuV, cpuS := st.cpuPerAcq()
			selfV, selfS := st.selfPerAcq()
			t.Rows = append(t.Rows, []string{strconv.Itoa(N), im.name, fmt.Sprintf("%.0f", rate), vsBestS, fmt.Sprintf("%.3f", j), strconv.Itoa(starved), us(st.maxWait), f2(waitRatio),
				perAcq(client, wacqs), perAcq(st.win.server, wacqs), perAcq(internal, wacqs), cpuS, selfS, strconv.FormatInt(st.overlaps, 10)})
			d := map[string]any{"n": N, "impl": im.name, "hold_us": micros(hold), "acquisitions_per_s": rate, "jain": j, "starved": starved, "max_wait_us": micros(st.maxWait),
				"mean_hold_us": micros(meanHold), "max_wait_per_n_hold": waitRatio, "client_cmds": client, "server_cmds": st.win.server,
				"steady_acquisitions": wacqs, "acquisitions": acqs, "overlaps": st.overlaps, "per_process": st.counts}
			if !math.IsNaN(vsBest) {
				d["per_best_peer"] = vsBest
			}
			if !math.IsNaN(cpuV) {
				d["redis_cpu_us_per_acq"] = cpuV
			}
			putNum(d, "client_cpu_us_per_acq", selfV)
			t.Data = append(t.Data, d)
			if !im.ownRow() || N != 64 {
				continue
			}
			if floor >= 0 {
				targets = append(targets, e.floorTargets(name, rate/rates[floor], cpuV, selfV, sts[floor])...)
			}
			targets = append(targets,
				timed(Target{name, "N=64: longest wait ≤ 3 × N × mean hold", f2(waitRatio) + " × N × mean hold", waitRatio <= 3, false}),
				Target{name, "no overlap", strconv.FormatInt(st.overlaps, 10), st.overlaps == 0, false})
			if best > 0 {
				targets = append(targets, timed(Target{name, "N=64: acquisitions/s ≥ 1.0 × best peer, Jain ≥ 0.99, 0 starved",
					fmt.Sprintf("%s ×, Jain %.3f, %d starved", vsBestS, j, starved), vsBest >= 1 && j >= 0.99 && starved == 0, false}))
			} else {
				targets = append(targets, Target{name, "N=64: Jain ≥ 0.99, 0 starved", fmt.Sprintf("Jain %.3f, %d starved", j, starved), j >= 0.99 && starved == 0, false})
			}
			cpa := float64(client) / float64(max(wacqs, 1))
			// A waiter's refreshes are counted: how many depends on how long
			// it waits, a matter of speed.
			targets = append(targets, timed(Target{name, "N=64: requests per acquisition ≤ 2.2", f2(cpa), wacqs > 0 && cpa <= 2.2, false}))
			if e.real && internal >= 0 {
				spa := float64(st.win.server) / float64(max(wacqs, 1))
				targets = append(targets, Target{name, "N=64: server commands per acquisition ≤ 14", f2(spa), wacqs > 0 && spa <= 14, false})
			}
		}
	}
	return []*Table{t}, targets, nil
}

// floorTargets are the contended scenario's targets judged against the
// FIFO floor measured in the same loops (floor: its stats at N = 64):
// fairlock's Redis CPU per acquisition, and with 1 ms holds its client
// CPU per acquisition, with 100 µs holds its throughput (vsFloor: its
// acquisitions/s ÷ the floor's).
func (e *env) floorTargets(name string, vsFloor, cpu, self float64, floor *loopStats) []Target {
	var out []Target
	fcpu, _ := floor.cpuPerAcq()
	if r := cpu / fcpu; !math.IsNaN(r) {
		out = append(out, timed(Target{name, "N=64: Redis CPU per acquisition ≤ 1.6 × FIFO floor's", fmt.Sprintf("%s × (%.1f µs; floor %.1f µs)", f2(r), cpu, fcpu), r <= 1.6, false}))
	}
	switch name {
	case "contended":
		fself, _ := floor.selfPerAcq()
		if r := self / fself; !math.IsNaN(r) {
			out = append(out, timed(Target{name, "N=64: client CPU per acquisition ≤ 1.3 × FIFO floor's", fmt.Sprintf("%s × (%.1f µs; floor %.1f µs)", f2(r), self, fself), r <= 1.3, false}))
		}
	case "contended-100us":
		out = append(out, timed(Target{name, "N=64: acquisitions/s ≥ 0.9 × FIFO floor's", f2(vsFloor) + " ×", vsFloor >= 0.9, false}))
	}
	return out
}

// 4. FIFO: waiters arrive a few ms apart while the lock is held.
func fifo(e *env) ([]*Table, []Target, error) {
	const waiters = 8
	const gap = 3 * time.Millisecond
	n := len(e.impls)
	ps := make([][]*proc, n)
	for i, im := range e.impls {
		p, closeAll, err := e.procs(im, waiters+1, &counter{})
		if err != nil {
			return nil, nil, err
		}
		defer closeAll()
		ps[i] = p
	}
	inversions := make([]int, n)
	rounds := make([]int, n)
	spent := make([]time.Duration, n)
	for r := 0; ; r++ {
		more := false
		for _, i := range rotate(e.impls, r) {
			if rounds[i] >= 2 && spent[i] >= e.cfg.duration {
				continue
			}
			more = true
			start := time.Now()
			inv, err := fifoRound(ps[i], waiters, gap)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", e.impls[i].name, err)
			}
			inversions[i] += inv
			rounds[i]++
			spent[i] += time.Since(start)
		}
		if !more {
			break
		}
	}
	pairs := waiters * (waiters - 1) / 2
	t := &Table{Name: "fifo", Title: "4. FIFO order: waiters arriving 3 ms apart while the lock is held",
		Note:    fmt.Sprintf("%d waiters per round, each its own process. Kendall tau distance between arrival and grant order: 0 is FIFO, %d per round is reversed, about %d random.", waiters, pairs, pairs/2),
		Columns: []string{"implementation", "rounds", "inversions in all", "mean Kendall distance per round", "normalised (0 FIFO, 0.5 random)"}}
	var targets []Target
	for i, im := range e.impls {
		mean := float64(inversions[i]) / float64(rounds[i])
		t.Rows = append(t.Rows, []string{im.name, strconv.Itoa(rounds[i]), strconv.Itoa(inversions[i]), f2(mean), f2(mean / float64(pairs))})
		t.Data = append(t.Data, map[string]any{"impl": im.name, "rounds": rounds[i], "inversions": inversions[i], "waiters": waiters})
		if im.ownRow() {
			targets = append(targets, Target{"fifo", "order inversions = 0", strconv.Itoa(inversions[i]), inversions[i] == 0, false})
		}
	}
	return []*Table{t}, targets, nil
}

// fifoRound holds the lock with ps[0] while ps[1..] start waiting, gap
// apart, then releases and returns the inversions in the order of grants.
func fifoRound(ps []*proc, waiters int, gap time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	unlock, err := ps[0].lock(ctx, "f")
	if err != nil {
		return 0, err
	}
	var mu sync.Mutex
	var order []int
	errs := make(chan error, waiters)
	for j := range waiters {
		go func() {
			u, err := ps[j+1].lock(ctx, "f")
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			order = append(order, j)
			mu.Unlock()
			errs <- u(ctx)
		}()
		time.Sleep(gap)
		// Arrival is when a request reaches Redis. Where the harness can
		// see the queue (fairlock), it waits until this waiter is in it
		// before starting the next, so scheduling delays of a loaded
		// machine cannot reorder the arrivals themselves.
		for deadline := time.Now().Add(time.Second); queueLen(ps[0], "f") >= 0 && queueLen(ps[0], "f") < j+1 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(5 * gap)
	if err := unlock(ctx); err != nil {
		return 0, err
	}
	for range waiters {
		if err := <-errs; err != nil {
			return 0, err
		}
	}
	return kendallDistance(order), nil
}

// queueLen reads how many wait for a fairlock semaphore, through its own
// Status; -1 for other implementations.
func queueLen(p *proc, key string) int {
	f, ok := p.locker.(*fairlockLocker)
	if !ok {
		return -1
	}
	st, err := f.c.Status(context.Background(), key)
	if err != nil {
		return -1
	}
	return len(st.Waiters)
}

// fillStall is how long the drain scenario waits for its queue to grow
// before it releases with fewer waiters queued than it started. It waits
// on while the queue grows: under the race detector, on the embedded
// Redis with the machine's cores busy, a thousand acquisitions took more
// than 30 s, and a release made then sent its handoff behind the rest of
// the queueing, so that the drain's limit passed with none granted.
const fillStall = 10 * time.Second

// 5. A thousand goroutines of one process wait on one lock.
func drain(e *env) ([]*Table, []Target, error) {
	const waiters = 1000
	limit := cmp.Or(e.cfg.drainStop, max(time.Second, 3*e.cfg.duration))
	t := &Table{Name: "drain", Title: "5. 1,000 goroutine waiters in one process: drain",
		Note: fmt.Sprintf("One process (one go-redis client, default pool) starts %d goroutines on one lock while another holds it, then the holder releases; each waiter releases at once. "+
			"Drain is the time from the release to the last waiter done, stopped at %v. Peak connections counts the waiting process's connections to Redis.", waiters, limit),
		Columns: []string{"implementation", "drain", "drained", "client commands / acq", "server commands / acq", "Redis CPU / acq", "peak connections", "pool size"}}
	var targets []Target
	fig := &figure{name: "drain", title: "5. 1,000 goroutine waiters in one process: the drain over time",
		subtitle: fmt.Sprintf("One process starts %d goroutines on one lock while another holds it; the holder releases at time 0 and each waiter releases as soon as it holds. The curve counts the waiters that have held the lock; the run stops at %v.", waiters, limit)}
	pn := &panel{title: "waiters granted since the release", x: axis{label: "time since the release", log: true, format: durUS}, y: axis{label: "waiters granted", min: 0, max: waiters},
		vlines: []marker{{micros(limit), "stopped"}}}
	fig.panelW, fig.panelH = 900, 360
	fig.panels = []*panel{pn}
	t.figs = []*figure{fig}
	for _, im := range e.impls {
		fig.legend = append(fig.legend, im.name)
		cnt := &counter{}
		holder, closeH, err := e.procs(im, 1, &counter{})
		if err != nil {
			return nil, nil, err
		}
		key := "d"
		unlock, err := holder[0].lock(context.Background(), key)
		if err != nil {
			closeH()
			return nil, nil, err
		}
		// The waiting process does not exist yet; everybody else has
		// their connections. (A client that dials when it is made, as
		// rueidis's, counts from here.)
		base := e.connectedClients()
		wp, closeW, err := e.procs(im, 1, cnt)
		if err != nil {
			closeH()
			return nil, nil, err
		}
		p := wp[0]
		ctx, cancel := context.WithCancel(context.Background())
		var done atomic.Int64
		var wg sync.WaitGroup
		grants := make([]time.Time, waiters)
		serverBefore := e.serverCalls()
		cpuBefore, cpuOK0 := e.serverCPU()
		peak := 0
		stopSampling := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				if c := e.connectedClients(); c >= 0 && base >= 0 {
					peak = max(peak, c-base)
				}
				select {
				case <-stopSampling:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		for range waiters {
			wg.Go(func() {
				u, err := p.lock(ctx, key)
				if err != nil {
					return
				}
				grants[done.Add(1)-1] = time.Now()
				_ = u(context.Background())
			})
		}
		// Let every waiter get in line: fairlock's queue can be read; the
		// others are given a fixed time. (Not only the drain's limit: a
		// release made while acquisitions are still on their way sends
		// the handoff's commands behind theirs on the waiting process's
		// connections, and the drain would time the rest of the queueing.
		// Under the race detector, on the embedded Redis, a thousand
		// acquisitions take seconds.)
		// The holder's process reads it, every 20 ms: the waiting
		// process's commands are the ones counted.
		if n := queueLen(holder[0], key); n >= 0 {
			for last, grew := n, time.Now(); n < waiters && time.Since(grew) < max(fillStall, limit); n = queueLen(holder[0], key) {
				if n > last {
					last, grew = n, time.Now()
				}
				time.Sleep(20 * time.Millisecond)
			}
		} else {
			time.Sleep(300 * time.Millisecond)
		}
		t0 := time.Now()
		if err := unlock(context.Background()); err != nil {
			cancel()
			return nil, nil, err
		}
		deadline := time.Now().Add(limit)
		for done.Load() < waiters && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		elapsed := time.Since(t0)
		drained := done.Load()
		cancel()
		wg.Wait()
		close(stopSampling)
		<-sampled
		server := int64(-1)
		if after := e.serverCalls(); serverBefore >= 0 && after >= 0 {
			server = after - serverBefore
		}
		cpuS, cpuV := "n/a (embedded)", math.NaN()
		if cpuAfter, ok := e.serverCPU(); ok && cpuOK0 && e.real && drained > 0 {
			cpuV = (cpuAfter.seconds - cpuBefore.seconds) * 1e6 / float64(drained)
			cpuS = fmt.Sprintf("%.1f µs", cpuV)
		}
		var at []float64
		for _, g := range grants[:drained] {
			at = append(at, max(micros(g.Sub(t0)), 1))
		}
		slices.Sort(at)
		line := series{name: im.name, step: true, pts: []pt{{at0(at), 0}}}
		for k, v := range at {
			line.pts = append(line.pts, pt{v, float64(k + 1)})
		}
		if drained < waiters {
			line.pts = append(line.pts, pt{micros(limit), float64(drained)})
		}
		pn.lines = append(pn.lines, line)
		pool := p.rdb.Options().PoolSize
		poolS := strconv.Itoa(pool)
		if im.client != "" {
			poolS = "n/a (" + im.client + ")" // not go-redis's pool
		}
		closeW()
		closeH()
		drainS := us(elapsed)
		if drained < waiters {
			drainS = "> " + us(limit)
		}
		t.Rows = append(t.Rows, []string{im.name, drainS, fmt.Sprintf("%d of %d", drained, waiters), perAcq(cnt.n.Load(), drained), perAcq(server, drained),
			cpuS, strconv.Itoa(peak), poolS})
		d := map[string]any{"impl": im.name, "drain_ms": float64(elapsed) / float64(time.Millisecond), "drained": drained, "waiters": waiters,
			"client_cmds": cnt.n.Load(), "server_cmds": server, "peak_connections": peak}
		if im.client == "" {
			d["pool_size"] = pool
		}
		if !math.IsNaN(cpuV) {
			d["redis_cpu_us_per_acq"] = cpuV
		}
		t.Data = append(t.Data, d)
		if im.ownRow() {
			cpa := float64(cnt.n.Load()) / float64(max(drained, 1))
			targets = append(targets,
				timed(Target{"drain", "1,000 waiters drain ≤ 0.5 s", drainS, drained == waiters && elapsed <= 500*time.Millisecond, false}),
				Target{"drain", "≤ 4 commands per acquisition", f2(cpa), cpa <= 4, false},
				Target{"drain", "peak connections ≤ pool + 2", fmt.Sprintf("%d (pool %d)", peak, pool), peak <= pool+2, false})
		}
	}
	return []*Table{t}, targets, nil
}

// 6a. A counting semaphore: capacity 4, 16 processes asking for 1 to 3
// permits. Only fairlock has one; its peers offer mutexes.
func countingSemaphore(e *env) ([]*Table, []Target, error) {
	const capacity, procs = 4, 16
	im, ok := e.own()
	if !ok {
		return nil, nil, nil
	}
	ps, closeAll, err := e.procs(im, procs, &counter{})
	if err != nil {
		return nil, nil, err
	}
	defer closeAll()
	st := &loopStats{}
	loop(ps, e.cfg.duration, time.Millisecond, capacity, st, func(ctx context.Context, i int, p *proc) (int64, func(context.Context) error, error) {
		w := int64(1 + i%3)
		sem, err := semaphore.New(p.locker.(*fairlockLocker).c, "sem", capacity)
		if err != nil {
			return 0, nil, err
		}
		l, err := sem.Acquire(ctx, w)
		if err != nil {
			return 0, nil, err
		}
		return w, l.Release, nil
	})
	if st.err != nil {
		return nil, nil, st.err
	}
	acqs := st.total()
	var permits int64
	for _, p := range st.permits {
		permits += p
	}
	j := jain(asFloats(st.counts))
	t := &Table{Name: "semaphore", Title: "6a. Counting semaphore: capacity 4, 16 processes, weights 1–3, 1 ms hold",
		Note:    "fairlock only: its peers have no counting semaphore. Under FIFO each process gets its turn whatever its weight, so acquisitions per process should be equal (Jain over acquisitions).",
		Columns: []string{"implementation", "acquisitions/s", "permits/s", "Jain (acquisitions)", "longest wait", "capacity exceeded"}}
	t.figs = append(t.figs, sharesFigure("semaphore", "6a. Counting semaphore: acquisitions per process",
		fmt.Sprintf("Capacity %d, %d processes asking for 1 to 3 permits, 1 ms hold, %v. One bar per process, sorted; 1 is a fair share.", capacity, procs, e.cfg.duration),
		[]shareRow{{im.name, st.counts, fmt.Sprintf("%.0f acquisitions/s", float64(acqs)/st.elapsed.Seconds())}}))
	t.Rows = append(t.Rows, []string{im.name, fmt.Sprintf("%.0f", float64(acqs)/st.elapsed.Seconds()), fmt.Sprintf("%.0f", float64(permits)/st.elapsed.Seconds()),
		fmt.Sprintf("%.3f", j), us(st.maxWait), strconv.FormatInt(st.overlaps, 10)})
	t.Data = append(t.Data, map[string]any{"impl": im.name, "acquisitions": acqs, "permits": permits, "seconds": st.elapsed.Seconds(), "jain": j,
		"max_wait_us": micros(st.maxWait), "exceeded": st.overlaps, "per_process": st.counts})
	return []*Table{t}, []Target{{"semaphore", "capacity never exceeded", strconv.FormatInt(st.overlaps, 10), st.overlaps == 0, false}}, nil
}

// 6b. Dining philosophers: five processes, five forks, each eating with
// both its neighbours' forks. fairlock takes both at once; its peers take
// them one after the other in name order (no deadlock, no atomicity).
func dining(e *env) ([]*Table, []Target, error) {
	const seats = 5
	n := len(e.impls)
	ps := make([][]*proc, n)
	sts := make([]*loopStats, n)
	cnts := make([]*counter, n)
	for i, im := range e.impls {
		cnts[i] = &counter{}
		p, closeAll, err := e.procs(im, seats, cnts[i])
		if err != nil {
			return nil, nil, err
		}
		defer closeAll()
		ps[i], sts[i] = p, &loopStats{}
	}
	forkOf := func(i int) string { return fmt.Sprintf("{table}:fork%d", i%seats) }
	for s := range 2 {
		for _, i := range rotate(e.impls, s) {
			var forks [seats]atomic.Int64
			st := sts[i]
			probe := func() snap { return e.snap(cnts[i]) }
			loopProbed(ps[i], e.cfg.duration/2, time.Millisecond, 1<<62, st, probe, func(ctx context.Context, j int, p *proc) (int64, func(context.Context) error, error) {
				u, err := p.lockBoth(ctx, forkOf(j), forkOf(j+1))
				if err != nil {
					return 0, nil, err
				}
				for _, f := range []int{j % seats, (j + 1) % seats} {
					if forks[f].Add(1) != 1 {
						atomic.AddInt64(&st.overlaps, 1)
					}
				}
				return 1, func(ctx context.Context) error {
					forks[j%seats].Add(-1)
					forks[(j+1)%seats].Add(-1)
					return u(ctx)
				}, nil
			})
			if st.err != nil {
				return nil, nil, fmt.Errorf("%s: %w", e.impls[i].name, st.err)
			}
		}
	}
	t := &Table{Name: "dining", Title: "6b. Dining philosophers: 5 processes, 5 forks, 1 ms meals",
		Note:    "fairlock: multilock (both forks at once). Peers: lower-numbered fork first, then the other (the textbook deadlock-free order). Commands and Redis CPU per meal are counted in the steady part of each run, as in table 3.",
		Columns: []string{"implementation", "meals/s", "Jain", "min share of fair", "max share of fair", "longest wait", "client commands / meal", "server commands / meal", "Redis CPU / meal", "fork held twice"}}
	var targets []Target
	var shares []shareRow
	for i, im := range e.impls {
		shares = append(shares, shareRow{im.name, sts[i].counts, fmt.Sprintf("%.0f meals/s", float64(sts[i].total())/sts[i].elapsed.Seconds())})
	}
	t.figs = append(t.figs, sharesFigure("dining", "6b. Dining philosophers: meals per philosopher",
		fmt.Sprintf("%d processes, %d forks, 1 ms meals, %v per implementation. One bar per philosopher, sorted; 1 is a fair share. fairlock takes both forks at once (multilock); the peers take the lower-numbered fork first.", seats, seats, e.cfg.duration), shares))
	for i, im := range e.impls {
		st := sts[i]
		meals := st.total()
		lo, hi := 1e9, 0.0
		fair := float64(meals) / seats
		for _, c := range st.counts {
			lo, hi = min(lo, float64(c)/fair), max(hi, float64(c)/fair)
		}
		j := jain(asFloats(st.counts))
		cpuV, cpuS := st.cpuPerAcq()
		t.Rows = append(t.Rows, []string{im.name, fmt.Sprintf("%.0f", float64(meals)/st.elapsed.Seconds()), fmt.Sprintf("%.3f", j), f2(lo), f2(hi), us(st.maxWait),
			perAcq(st.win.client, st.win.acqs), perAcq(st.win.server, st.win.acqs), cpuS, strconv.FormatInt(st.overlaps, 10)})
		d := map[string]any{"impl": im.name, "meals": meals, "seconds": st.elapsed.Seconds(), "jain": j, "min_share": lo, "max_share": hi,
			"max_wait_us": micros(st.maxWait), "overlaps": st.overlaps, "per_process": st.counts, "client_cmds": st.win.client, "server_cmds": st.win.server,
			"steady_meals": st.win.acqs}
		if !math.IsNaN(cpuV) {
			d["redis_cpu_us_per_acq"] = cpuV
		}
		t.Data = append(t.Data, d)
		if im.ownRow() {
			targets = append(targets, Target{"dining", "no fork held twice", strconv.FormatInt(st.overlaps, 10), st.overlaps == 0, false})
		}
	}
	return []*Table{t}, targets, nil
}

// shareRow is one implementation's acquisitions per process.
type shareRow struct {
	impl   string
	counts []int64
	about  string // a figure for the panel's title
}

// sharesFigure draws a bar per process for each implementation, in panels
// one above the other: the process's acquisitions over a fair share (the
// implementation's mean), sorted, so that a starved process shows as a gap
// at the right and a red tick.
func sharesFigure(name, title, subtitle string, rows []shareRow) *figure {
	fg := &figure{name: name, title: title, subtitle: subtitle, panelW: 900, panelH: 150}
	top := 1.0
	for _, r := range rows {
		fg.legend = append(fg.legend, r.impl)
		var sum int64
		for _, c := range r.counts {
			sum += c
		}
		for _, c := range r.counts {
			if sum > 0 {
				top = max(top, float64(c)*float64(len(r.counts))/float64(sum))
			}
		}
	}
	top = math.Ceil(top)
	for _, r := range rows {
		var sum int64
		starved := 0
		for _, c := range r.counts {
			sum += c
			if c == 0 {
				starved++
			}
		}
		sorted := slices.Clone(r.counts)
		slices.SortFunc(sorted, func(a, b int64) int { return int(b - a) })
		bs := &bars{series: []string{r.impl}, zeroMark: true}
		for k, c := range sorted {
			v := 0.0
			if sum > 0 {
				v = float64(c) * float64(len(r.counts)) / float64(sum)
			}
			bs.groups = append(bs.groups, "")
			if len(sorted) <= 16 {
				bs.groups[k] = strconv.Itoa(k + 1)
			}
			bs.vals = append(bs.vals, []float64{v})
		}
		fg.panels = append(fg.panels, &panel{
			title: fmt.Sprintf("%s: %s, Jain %.3f, %d of %d starved", r.impl, r.about, jain(asFloats(r.counts)), starved, len(r.counts)),
			x:     axis{label: "processes, most acquisitions first"},
			y:     axis{label: "÷ fair share", min: 0, max: top},
			bars:  bs, hlines: []marker{{1, "fair share"}},
		})
	}
	return fg
}

// cdfPanel is one panel of latency distributions: samples[i] are
// names[i]'s.
type cdfPanel struct {
	title   string
	names   []string
	samples [][]time.Duration
	marks   []marker // vertical lines, in µs
}

// cdfFigure draws, per panel, each implementation's latency distribution
// (share of calls at or below a latency) on a log axis.
func cdfFigure(name, title, subtitle string, cols int, ps []cdfPanel) *figure {
	fg := &figure{name: name, title: title, subtitle: subtitle, cols: cols, panelW: 460, panelH: 300}
	seen := map[string]bool{}
	for _, p := range ps {
		pn := &panel{title: p.title, x: axis{label: "latency", log: true, format: durUS}, y: axis{label: "share of calls ≤ latency", min: 0, max: 1}, vlines: p.marks}
		for i, n := range p.names {
			if !seen[n] {
				seen[n] = true
				fg.legend = append(fg.legend, n)
			}
			us := make([]float64, len(p.samples[i]))
			for k, d := range p.samples[i] {
				us[k] = max(micros(d), 1)
			}
			pn.lines = append(pn.lines, cdf(n, us))
		}
		fg.panels = append(fg.panels, pn)
	}
	return fg
}

// at0 is where a count-over-time curve starts on a log axis: at its first
// point, or at the axis's 1 µs when there is none.
func at0(sorted []float64) float64 {
	if len(sorted) == 0 {
		return 1
	}
	return sorted[0]
}

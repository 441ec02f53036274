package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/redis/go-redis/v9"
)

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec int64 }

// commandStats reads INFO commandstats by command ("blpop", "evalsha",
// ...); nil where INFO does not say (miniredis).
func (e *env) commandStats() map[string]cmdStat {
	info, err := e.admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return nil
	}
	out := map[string]cmdStat{}
	for _, l := range strings.Split(strings.ReplaceAll(info, "\r", ""), "\n") {
		// cmdstat_blpop:calls=300,usec=2732,usec_per_call=9.11,...
		name, rest, ok := strings.Cut(strings.TrimPrefix(l, "cmdstat_"), ":")
		if !ok || name == l {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls = n
			case "usec":
				st.usec = n
			}
		}
		out[name] = st
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// usedMemory is INFO memory's used_memory less mem_clients_normal (the
// clients' buffers, which grow and shrink with their traffic by hundreds
// of KB), in bytes: what the data and the server's own structures hold.
// Where the server has no mem_clients_normal it is used_memory whole; -1
// where INFO does not say (miniredis).
func (e *env) usedMemory() int64 {
	info, err := e.admin.Info(context.Background(), "memory").Result()
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(infoField(info, "used_memory"), 10, 64)
	if err != nil {
		return -1
	}
	if c, err := strconv.ParseInt(infoField(info, "mem_clients_normal"), 10, 64); err == nil {
		n -= c
	}
	return n
}

// connSampler samples the server's connections every 10 ms until stopped,
// and returns the most seen above base.
func (e *env) connSampler(base int) (stop func() int) {
	done := make(chan struct{})
	out := make(chan int, 1)
	go func() {
		peak := 0
		for {
			if c := e.connectedClients(); c >= 0 && base >= 0 {
				peak = max(peak, c-base)
			}
			select {
			case <-done:
				out <- peak
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() int { close(done); return <-out }
}

// median of xs (NaN left out); NaN when none is left.
func median(xs []float64) float64 {
	var s []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// scaleResult is one implementation's run of the at-scale scenario.
type scaleResult struct {
	st        *loopStats
	rate      float64
	memDelta  int64 // used_memory, end of the steady window minus start
	memKnown  bool  // false where INFO memory does not say (miniredis)
	keysDelta int64 // DBSIZE likewise
	peakConns int
	// Once every lock is released (the run's end): the keys and memory
	// left per name the run touched, against those before it.
	idleKeys, idleMem float64
	cut               int // names whose last wait the run's end cut off
	touched           int
}

// 9. At scale: one process, 64 goroutines over M names, 100 µs critical
// sections.
func atScale(e *env) ([]*Table, []Target, error) {
	const goroutines = 64
	const hold = 100 * time.Microsecond
	ms := []int{1000}
	if e.real {
		ms = append(ms, 10000)
	}
	t := &Table{Name: "scale", Title: "9. At scale: one process, 64 goroutines over M names, 100 µs critical sections",
		Note: fmt.Sprintf("One process (one go-redis client, default pool) runs %d goroutines, each looping: acquire a name drawn at random from M, hold it %v (a spin), release; %v per implementation and M, the implementations in turn, with the run's keys deleted before each. "+
			"Commands and Redis CPU (INFO cpu, main thread) are counted in the steady window (from a fifth of the run to 5%% before its end) and divided by its acquisitions. "+
			"Memory: INFO memory's used_memory less mem_clients_normal (the clients' buffers, which swing by hundreds of KB with their traffic; the connections column counts the connections) when the run starts (the process's pool dialled by 64 PINGs at once and a second for Redis to account for the new clients, no lock taken) and at the end of the steady window: what the run's keys hold while it runs; ÷ acquisitions/s makes it bytes per sustained acquisition per second. "+
			"Keys: DBSIZE at the same two moments. Keys left and memory per idle name: DBSIZE and used_memory once every lock is released (at the run's end), less their values before it, divided by the names the run touched (keys: less those of the few names whose last wait the run's end cut off, which keep that request's record, a tombstone with fairlock, for as long as a resent call of it may come, and are not idle after a release). Connections: the most INFO clients' connected_clients saw above what it was before the process connected, sampled every 10 ms. Ran M = %s.",
			goroutines, hold, scaleDuration(e), strings.Join(mapInts(ms, thousandsInt), ", ")),
		Columns: []string{"M", "implementation", "acquisitions/s", "÷ best peer", "client commands / acq", "server commands / acq", "Redis CPU / acq", "÷ peers' median",
			"memory Δ", "bytes per acq/s", "keys Δ", "keys left per idle name", "memory per 1,000 idle names", "connections", "longest wait", "overlaps"}}
	var targets []Target
	fig := &figure{name: "scale", title: "9. At scale: one process, 64 goroutines over M names, 100 µs critical sections",
		subtitle: "Per implementation and number of names M. Redis CPU and server commands per acquisition from INFO cpu and INFO commandstats over the steady window; connections: the process's most at once; memory: used_memory less the clients' buffers, its growth while running ÷ acquisitions/s.",
		cols:     2, panelW: 460, panelH: 280}
	var names []string
	for _, im := range e.impls {
		names = append(names, im.name)
		fig.legend = append(fig.legend, im.name)
	}
	type metric struct {
		title string
		y     axis
		get   func(r scaleResult) float64
	}
	metrics := []metric{
		{"acquisitions/s", axis{label: "acquisitions/s", zero: true}, func(r scaleResult) float64 { return r.rate }},
		{"Redis CPU per acquisition", axis{label: "Redis CPU per acquisition (µs)", zero: true}, func(r scaleResult) float64 { v, _ := r.st.cpuPerAcq(); return v }},
		{"server commands per acquisition", axis{label: "server commands per acquisition", zero: true}, func(r scaleResult) float64 {
			if r.st.win.server < 0 || r.st.win.acqs == 0 {
				return math.NaN()
			}
			return float64(r.st.win.server) / float64(r.st.win.acqs)
		}},
		{"connections per process", axis{label: "connections (most at once)", zero: true}, func(r scaleResult) float64 { return float64(r.peakConns) }},
		{"Redis memory per sustained acquisition/s", axis{label: "memory Δ ÷ acquisitions/s (bytes)", zero: true}, func(r scaleResult) float64 {
			if !r.memKnown || r.rate == 0 {
				return math.NaN()
			}
			return float64(r.memDelta) / r.rate
		}},
	}
	results := make([][]scaleResult, len(ms))
	for mi, M := range ms {
		results[mi] = make([]scaleResult, len(e.impls))
		for _, i := range rotate(e.impls, mi) {
			r, err := e.scaleRun(e.impls[i], M, goroutines, hold)
			if err != nil {
				return nil, nil, fmt.Errorf("%s, M=%d: %w", e.impls[i].name, M, err)
			}
			results[mi][i] = r
		}
		best := 0.0
		var peerCPU, peerConns []float64
		for i, im := range e.impls {
			if im.peer {
				best = max(best, results[mi][i].rate)
				v, _ := results[mi][i].st.cpuPerAcq()
				peerCPU = append(peerCPU, v)
				peerConns = append(peerConns, float64(results[mi][i].peakConns))
			}
		}
		medCPU, medConns := median(peerCPU), median(peerConns)
		for i, im := range e.impls {
			r := results[mi][i]
			st := r.st
			vsBest := math.NaN()
			if best > 0 {
				vsBest = r.rate / best
			}
			cpuV, cpuS := st.cpuPerAcq()
			cpuR := cpuV / medCPU
			memS, perRateS, idleMemS := "n/a (embedded)", "n/a (embedded)", "n/a (embedded)"
			if r.memKnown {
				memS = bytesFmt(float64(r.memDelta))
				idleMemS = bytesFmt(r.idleMem)
				perRateS = "n/a"
				if r.rate > 0 {
					perRateS = bytesFmt(float64(r.memDelta) / r.rate)
				}
			}
			t.Rows = append(t.Rows, []string{thousandsInt(M), im.name, fmt.Sprintf("%.0f", r.rate), fnum(vsBest), perAcq(st.win.client, st.win.acqs), perAcq(st.win.server, st.win.acqs),
				cpuS, fnum(cpuR), memS, perRateS, strconv.FormatInt(r.keysDelta, 10), fmt.Sprintf("%.2f", r.idleKeys), idleMemS, strconv.Itoa(r.peakConns), us(st.maxWait), strconv.FormatInt(st.overlaps, 10)})
			d := map[string]any{"m": M, "impl": im.name, "goroutines": goroutines, "hold_us": micros(hold), "acquisitions_per_s": r.rate, "acquisitions": st.total(),
				"steady_acquisitions": st.win.acqs, "client_cmds": st.win.client, "server_cmds": st.win.server, "keys_delta": r.keysDelta, "peak_connections": r.peakConns,
				"max_wait_us": micros(st.maxWait), "overlaps": st.overlaps, "idle_keys_per_name": r.idleKeys, "names_touched": r.touched}
			putNum(d, "per_best_peer", vsBest)
			putNum(d, "redis_cpu_us_per_acq", cpuV)
			putNum(d, "redis_cpu_per_peers_median", cpuR)
			if r.memKnown {
				d["used_memory_delta"] = r.memDelta
				if r.rate > 0 {
					d["bytes_per_acq_per_s"] = float64(r.memDelta) / r.rate
				}
				d["idle_memory_per_1000_names"] = r.idleMem
			}
			t.Data = append(t.Data, d)
			if im.name == batchedName && M == 1000 {
				cpuMeasured := "n/a (embedded)"
				if !math.IsNaN(cpuR) {
					cpuMeasured = fmt.Sprintf("%s × (%s; peers' median %.1f µs)", f2(cpuR), cpuS, medCPU)
				}
				targets = append(targets,
					Target{"scale", "M=1,000, batched: no overlap", strconv.FormatInt(st.overlaps, 10), st.overlaps == 0, false},
					timed(Target{"scale", "M=1,000, batched: Redis CPU per acquisition ≤ 1.0 × peers' median", cpuMeasured, cpuR <= 1.0, false}))
			}
			if !im.ownRow() {
				continue
			}
			targets = append(targets, Target{"scale", fmt.Sprintf("M=%s: no overlap", thousandsInt(M)), strconv.FormatInt(st.overlaps, 10), st.overlaps == 0, false})
			if M == 1000 && st.win.server >= 0 && e.real {
				spa := float64(st.win.server) / float64(max(st.win.acqs, 1))
				targets = append(targets, Target{"scale", "M=1,000: server commands per acquisition ≤ 8.5", f2(spa), st.win.acqs > 0 && spa <= 8.5, false})
			}
			cpuMeasured := "n/a (embedded)"
			if !math.IsNaN(cpuR) {
				cpuMeasured = fmt.Sprintf("%s × (%s; peers' median %.1f µs)", f2(cpuR), cpuS, medCPU)
			}
			targets = append(targets,
				timed(Target{"scale", fmt.Sprintf("M=%s: Redis CPU per acquisition ≤ 2.5 × peers' median", thousandsInt(M)), cpuMeasured, cpuR <= 2.5, false}),
				Target{"scale", fmt.Sprintf("M=%s: keys left per idle name ≤ 1", thousandsInt(M)),
					fmt.Sprintf("%s (%s per 1,000 idle names)", fNear(r.idleKeys, 1), bytesFmt(r.idleMem)), r.idleKeys <= 1, false},
				Target{"scale", fmt.Sprintf("M=%s: connections per process ≤ peers' median + 2", thousandsInt(M)), fmt.Sprintf("%d (peers' median %.0f)", r.peakConns, medConns),
					float64(r.peakConns) <= medConns+2, false})
		}
	}
	var groups []string
	for _, M := range ms {
		groups = append(groups, "M = "+thousandsInt(M))
	}
	for _, m := range metrics {
		bs := &bars{groups: groups, series: names, labels: true}
		any := false
		for mi := range ms {
			var row []float64
			for i := range e.impls {
				v := m.get(results[mi][i])
				any = any || !math.IsNaN(v)
				row = append(row, v)
			}
			bs.vals = append(bs.vals, row)
		}
		pn := &panel{title: m.title, x: axis{label: "names (M)"}, y: m.y, bars: bs}
		if !any {
			pn.empty = "n/a on the embedded miniredis: run with -redis auto"
		}
		fig.panels = append(fig.panels, pn)
	}
	t.figs = []*figure{fig}
	return []*Table{t}, targets, nil
}

func putNum(d map[string]any, k string, v float64) {
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		d[k] = v
	}
}

func fnum(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return f2(v)
}

func thousandsInt(n int) string { return thousands(int64(n)) }

func mapInts(xs []int, f func(int) string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

// scaleDuration is how long each run of the at-scale scenario lasts:
// -duration, but at least long enough that its steady window sees
// acquisitions when the first ones of thousands of names are slow.
func scaleDuration(e *env) time.Duration { return max(e.cfg.duration, 250*time.Millisecond) }

// scaleRun runs one implementation's part of the at-scale scenario.
func (e *env) scaleRun(im impl, M, goroutines int, hold time.Duration) (scaleResult, error) {
	e.cleanup() // no key of an earlier run expires (and frees memory) during this one
	base := e.connectedClients()
	cnt := &counter{}
	ps, closeAll, err := e.procs(im, 1, cnt)
	if err != nil {
		return scaleResult{}, err
	}
	defer closeAll()
	one := make([]*proc, goroutines) // one process, its goroutines
	for k := range one {
		one[k] = ps[0]
	}
	held := make([]atomic.Int32, M)
	touched := make([]atomic.Bool, M)
	// cut marks the names whose wait the run's end cut off: such a request
	// ended without a release, and leaves its record for as long as a
	// resent call of it may come (a tombstone, with fairlock), so those
	// names are not idle after their last release, and their keys do not
	// count in keys left per idle name.
	cut := make([]atomic.Bool, M)
	st := &loopStats{}
	var mem, keys []int64
	probe := func() snap {
		mem = append(mem, e.usedMemory())
		keys = append(keys, e.admin.DBSize(context.Background()).Val())
		return e.snap(cnt)
	}
	// The memory and keys before any lock, once the process has dialled its
	// pool (64 goroutines at once fill it): what the run's state holds is
	// what grows from here, and the connections fairlock dials besides.
	// (An implementation on a client of its own, which it dialled when
	// made, leaves the process's go-redis pool alone.)
	var warm sync.WaitGroup
	for range goroutines {
		if im.client != "" {
			break
		}
		warm.Go(func() { _ = ps[0].rdb.Ping(context.Background()).Err() })
	}
	warm.Wait()
	// Redis accounts for its clients' buffers (mem_clients_normal) in its
	// cron, a few clients at a time: the new connections' share settles
	// within a second. (miniredis says nothing of its memory.)
	if e.real {
		time.Sleep(time.Second)
	}
	mem0, keys0 := e.usedMemory(), e.admin.DBSize(context.Background()).Val()
	stopConns := e.connSampler(base)
	loopProbed(one, scaleDuration(e), hold, 1<<62, st, probe, func(ctx context.Context, _ int, p *proc) (int64, func(context.Context) error, error) {
		k := rand.IntN(M)
		u, err := p.lock(ctx, "s"+strconv.Itoa(M)+":"+strconv.Itoa(k))
		if err != nil {
			cut[k].Store(true)
			return 0, nil, err
		}
		if held[k].Add(1) != 1 {
			atomic.AddInt64(&st.overlaps, 1)
		}
		touched[k].Store(true)
		return 1, func(ctx context.Context) error {
			held[k].Add(-1)
			return u(ctx)
		}, nil
	})
	peak := stopConns()
	if st.err != nil {
		return scaleResult{}, st.err
	}
	r := scaleResult{st: st, rate: float64(st.total()) / st.elapsed.Seconds(), peakConns: peak}
	if len(mem) == 2 && mem0 >= 0 && mem[1] >= 0 {
		r.memDelta, r.memKnown = mem[1]-mem0, true
	}
	if len(keys) == 2 {
		r.keysDelta = keys[1] - keys0
	}
	var cutKeys int64
	for k := range touched {
		switch {
		case cut[k].Load():
			r.cut++
			cutKeys += e.keysOfName("s" + strconv.Itoa(M) + ":" + strconv.Itoa(k))
		case touched[k].Load():
			r.touched++
		}
	}
	if r.touched > 0 {
		// Every lock is released: what stays is what an idle name costs.
		left := e.admin.DBSize(context.Background()).Val() - keys0 - cutKeys
		r.idleKeys = float64(left) / float64(r.touched)
		if m := e.usedMemory(); r.memKnown && m >= 0 {
			r.idleMem = float64(m-mem0) / float64(r.touched+r.cut) * 1000
		}
	}
	return r, nil
}

// blpopCounter counts, on a fairlock client's blocking connections, the
// blocking reads (BLMPOP, or BLPOP where the server lacks it) sent and the
// keys they wait on.
type blpopCounter struct{ calls, keys atomic.Int64 }

func (c *blpopCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *blpopCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch args := cmd.Args(); cmd.Name() {
		case "blpop": // BLPOP key ... timeout
			c.calls.Add(1)
			c.keys.Add(int64(len(args) - 2))
		case "blmpop": // BLMPOP timeout numkeys key ... LEFT COUNT n
			if len(args) > 2 {
				n, _ := strconv.ParseInt(fmt.Sprint(args[2]), 10, 64)
				c.calls.Add(1)
				c.keys.Add(n)
			}
		}
		return next(ctx, cmd)
	}
}
func (c *blpopCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// queuedCounter counts the requests a fairlock client queued.
type queuedCounter struct{ n atomic.Int64 }

func (c *queuedCounter) Observe(ev fairlock.Event) {
	if ev.Kind == fairlock.WaitStarted {
		c.n.Add(1)
	}
}

// wakeResult is one implementation's run at one K of the wake scenario.
type wakeResult struct {
	k, drained          int
	drain               time.Duration // first release to the last waiter's return
	waited              time.Duration // waiters' start to the first release
	client, server      int64         // server -1 unknown
	cpu                 float64       // µs; NaN unknown
	blpopCalls, blpopUS int64         // BLPOP and BLMPOP, from commandstats; -1 unknown
	take                time.Duration // the holder's K acquires, one after another
	hookCalls, hookKeys int64         // fairlock's blocking client, from its hook
	peakConns           int
}

// 10. Many names: K waiters in one process, each on a name of its own, all
// held by another process and released together.
func manyNames(e *env) ([]*Table, []Target, error) {
	ks := []int{10, 100, 1000}
	if !e.real {
		// 1,000 waiters polling keep miniredis, one lock for all its
		// connections, busy for tens of seconds.
		ks = []int{10, 100}
	}
	const wait = 500 * time.Millisecond // from the waiters' start to the releases
	limit := max(10*time.Second, 3*e.cfg.duration)
	t := &Table{Name: "wake", Title: "10. Waiters over many names: K waiters, each on a name of its own",
		Note: fmt.Sprintf("One process holds K names; another (one go-redis client) starts K goroutines, each waiting on one of them. %v later (and once fairlock has queued every waiter) the holder releases the names one after another, and each waiter releases as soon as it holds; stopped at %v. The run's keys are deleted before each implementation's run. "+
			"Per acquisition: everything from the waiters' start to the last one's release (the wait, the peers' polling in it, fairlock's enqueues and refreshes, the releases, the wake-ups), divided by K; client commands are both processes'. "+
			"Blocking reads (BLMPOP, BLPOP where the server lacks it): the calls and Redis's own time for them from INFO commandstats (usec ÷ calls, the block and the wake-up included), and the keys each waited on, counted on fairlock's blocking connections: the cost of a wake-up's blocking read as the names one listener covers grow (usec is wall-clock time inside the server: on a loaded machine a read the server was descheduled in counts long; table 10b's p50 is the steadier figure). "+
			"Connections: the waiting process's most at once. Holder takes K: the holder's K acquires, one after another, before the waiters start (not in the per-acquisition figures).", wait, limit),
		Columns: []string{"K", "implementation", "drained", "drain", "client commands / acq", "server commands / acq", "Redis CPU / acq", "÷ peers' median",
			"blocking reads / acq", "keys per blocking read", "Redis µs per blocking read", "connections", "holder takes K"}}
	var targets []Target
	res := make([][]wakeResult, len(ks))
	for ki, K := range ks {
		res[ki] = make([]wakeResult, len(e.impls))
		for _, i := range rotate(e.impls, ki) {
			r, err := e.wakeRun(e.impls[i], K, wait, limit)
			if err != nil {
				return nil, nil, fmt.Errorf("%s, K=%d: %w", e.impls[i].name, K, err)
			}
			res[ki][i] = r
		}
		var peerCPU, peerConns []float64
		for i, im := range e.impls {
			if im.peer {
				peerCPU = append(peerCPU, res[ki][i].cpu)
				peerConns = append(peerConns, float64(res[ki][i].peakConns))
			}
		}
		medCPU, medConns := median(peerCPU), median(peerConns)
		for i, im := range e.impls {
			r := res[ki][i]
			cpuS := "n/a (embedded)"
			if !math.IsNaN(r.cpu) {
				cpuS = fmt.Sprintf("%.1f µs", r.cpu)
			}
			cpuR := r.cpu / medCPU
			blCalls, blUS, keysPer := "n/a (embedded)", "n/a (embedded)", "–"
			if r.blpopCalls >= 0 {
				blCalls = perAcq(r.blpopCalls, int64(max(r.drained, 1)))
				blUS = "–"
				if r.blpopCalls > 0 {
					blUS = fmt.Sprintf("%.1f µs", float64(r.blpopUS)/float64(r.blpopCalls))
				}
			}
			if r.hookCalls > 0 {
				keysPer = fmt.Sprintf("%.0f", float64(r.hookKeys)/float64(r.hookCalls))
			}
			drainS := us(r.drain)
			if r.drained < K {
				drainS = "> " + us(limit)
			}
			t.Rows = append(t.Rows, []string{thousandsInt(K), im.name, fmt.Sprintf("%d of %d", r.drained, K), drainS, perAcq(r.client, int64(max(r.drained, 1))),
				perAcq(r.server, int64(max(r.drained, 1))), cpuS, fnum(cpuR), blCalls, keysPer, blUS, strconv.Itoa(r.peakConns), us(r.take)})
			d := map[string]any{"k": K, "impl": im.name, "drained": r.drained, "waiters": K, "drain_ms": float64(r.drain) / float64(time.Millisecond),
				"waited_ms": float64(r.waited) / float64(time.Millisecond), "client_cmds": r.client, "server_cmds": r.server, "peak_connections": r.peakConns,
				"holder_take_ms": float64(r.take) / float64(time.Millisecond)}
			putNum(d, "redis_cpu_us_per_acq", r.cpu)
			putNum(d, "redis_cpu_per_peers_median", cpuR)
			if r.blpopCalls >= 0 {
				d["blocking_reads"], d["blocking_read_usec"] = r.blpopCalls, r.blpopUS
			}
			if r.hookCalls > 0 {
				d["blocking_read_keys_mean"] = float64(r.hookKeys) / float64(r.hookCalls)
			}
			t.Data = append(t.Data, d)
			if !im.ownRow() || K != ks[len(ks)-1] {
				continue
			}
			cpuMeasured := "n/a (embedded)"
			if !math.IsNaN(cpuR) {
				cpuMeasured = fmt.Sprintf("%s × (%s; peers' median %.1f µs)", f2(cpuR), cpuS, medCPU)
			}
			targets = append(targets,
				Target{"wake", fmt.Sprintf("K=%s: every waiter granted", thousandsInt(K)), fmt.Sprintf("%d of %d", r.drained, K), r.drained == K, false},
				timed(Target{"wake", fmt.Sprintf("K=%s: Redis CPU per acquisition ≤ 1.5 × peers' median", thousandsInt(K)), cpuMeasured, cpuR <= 1.5, false}),
				Target{"wake", fmt.Sprintf("K=%s: connections per process ≤ peers' median + 2", thousandsInt(K)), fmt.Sprintf("%d (peers' median %.0f)", r.peakConns, medConns),
					float64(r.peakConns) <= medConns+2, false})
		}
	}
	bare, err := e.bareBLPOP()
	if err != nil {
		return nil, nil, err
	}
	t.figs = []*figure{wakeFigure(e, ks, res, bare)}
	tables := []*Table{t}
	if bare != nil {
		tables = append(tables, bare)
	}
	return tables, targets, nil
}

// wakeRun runs one implementation at K waiters over K names.
func (e *env) wakeRun(im impl, K int, wait, limit time.Duration) (wakeResult, error) {
	ctx := context.Background()
	e.cleanup() // no key of an earlier run expires (Redis CPU) during this one
	r := wakeResult{k: K, cpu: math.NaN(), server: -1}
	cnt := &counter{}
	holder, closeH, err := e.procs(im, 1, cnt)
	if err != nil {
		return r, err
	}
	defer closeH()
	// The waiting process: for fairlock, its queued waiters counted and
	// its blocking connections' BLPOPs too.
	// A client of the implementation's own (rueidis's) dials when it is
	// made: its connections count from before.
	ownBase := e.connectedClients()
	wrdb := counted(redis.NewClient(&redis.Options{Addr: e.addr}), cnt)
	defer wrdb.Close()
	queued := &queuedCounter{}
	bl := &blpopCounter{}
	var waiter locker
	isFairlock := im.ownRow()
	if isFairlock {
		c, err := fairlock.New(wrdb, fairlock.WithPrefix(e.run+im.name+":"), fairlock.WithLeaseTTL(leaseTTL), fairlock.WithObserver(queued),
			testhook.BlockingHooks[fairlock.Option](bl, cnt))
		if err != nil {
			return r, err
		}
		waiter = &fairlockLocker{c: c}
	} else if waiter, err = im.open(wrdb, e.run+im.name+":"); err != nil {
		return r, err
	}
	defer waiter.close()
	name := func(k int) string { return fmt.Sprintf("w%d:%d", K, k) }
	unlocks := make([]func(context.Context) error, K)
	taking := time.Now()
	for k := range K {
		if unlocks[k], err = holder[0].lock(ctx, name(k)); err != nil {
			return r, err
		}
	}
	r.take = time.Since(taking)
	base := e.connectedClients() // the waiting process has not connected yet
	if im.client != "" {
		base = ownBase
	}
	stopConns := e.connSampler(base)
	s0, st0 := e.snap(cnt), e.commandStats()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for k := range K {
		wg.Go(func() {
			u, err := waiter.lock(wctx, name(k))
			if err != nil {
				return
			}
			done.Add(1)
			_ = u(context.Background())
		})
	}
	time.Sleep(wait)
	for deadline := time.Now().Add(limit); isFairlock && queued.n.Load() < int64(K) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	t0 := time.Now()
	r.waited = t0.Sub(start)
	deadline := t0.Add(limit)
	released := 0
	for ; released < K && time.Now().Before(deadline); released++ {
		if err := unlocks[released](ctx); err != nil {
			cancel()
			wg.Wait()
			stopConns()
			return r, fmt.Errorf("the holder's release of %s: %w", name(released), err)
		}
	}
	for done.Load() < int64(K) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	r.drain = time.Since(t0)
	r.drained = int(done.Load())
	cancel()
	wg.Wait()
	s1, st1 := e.snap(cnt), e.commandStats()
	for _, u := range unlocks[released:] { // cut off by the limit: not measured
		_ = u(ctx)
	}
	r.peakConns = stopConns()
	n := float64(max(r.drained, 1))
	r.client = s1.client - s0.client
	if s0.server >= 0 && s1.server >= 0 {
		r.server = s1.server - s0.server
	}
	if s0.cpuOK && s1.cpuOK {
		r.cpu = (s1.cpu - s0.cpu) * 1e6 / n
	}
	if st0 != nil && st1 != nil {
		for _, c := range []string{"blpop", "blmpop"} {
			r.blpopCalls += st1[c].calls - st0[c].calls
			r.blpopUS += st1[c].usec - st0[c].usec
		}
	}
	if st0 == nil || st1 == nil {
		r.blpopCalls = -1
	}
	r.hookCalls, r.hookKeys = bl.calls.Load(), bl.keys.Load()
	return r, nil
}

// bareBLPOPKeys are the key counts of the bare blocking-read reference.
var bareBLPOPKeys = []int{1, 10, 100, 512, 1000}

// bareBLPOP measures, on a real server, one blocking read over K keys
// woken by one RPUSH, the command fairlock's listeners use (BLMPOP; BLPOP
// where the server lacks it): Redis's own time per read as K grows, with
// no lock around it. It returns nil on miniredis.
func (e *env) bareBLPOP() (*Table, error) {
	if !e.real {
		return nil, nil
	}
	const wakeups = 100
	ctx := context.Background()
	blk := redis.NewClient(&redis.Options{Addr: e.addr})
	defer blk.Close()
	pusher := redis.NewClient(&redis.Options{Addr: e.addr})
	defer pusher.Close()
	cmd := "blmpop"
	read := func(keys []string) error {
		return blk.BLMPop(ctx, 10*time.Second, "left", 1, keys...).Err()
	}
	// LMPOP came with BLMPOP (Redis 7); on an empty list it answers nil.
	if err := blk.LMPop(ctx, "left", 1, e.run+"bare:probe").Err(); err != nil && err != redis.Nil {
		cmd = "blpop"
		read = func(keys []string) error { return blk.BLPop(ctx, 10*time.Second, keys...).Err() }
	}
	t := &Table{Name: "wake-read", Title: "10b. The blocking read alone: one " + strings.ToUpper(cmd) + " over K keys, woken by one RPUSH",
		Note: fmt.Sprintf("A reference, not a lock: one client blocks in %s on K empty lists (the command fairlock's listeners use), another pushes onto one of them once INFO clients shows it blocked; %d wake-ups per K. "+
			"Redis's time per read is INFO commandstats's usec (the block and the wake-up), read before and after each wake-up: the p50 of those, and the mean over all. "+
			"usec is wall-clock time inside the server, so on a loaded machine a read the server was descheduled in counts long; the p50 leaves those out.", strings.ToUpper(cmd), wakeups),
		Columns: []string{"keys", "Redis µs per read, p50", "mean", "p50 ÷ 1 key's"}}
	var one float64
	for _, K := range bareBLPOPKeys {
		keys := make([]string, K)
		for k := range keys {
			keys[k] = fmt.Sprintf("%sbare:{b}:%d", e.run, k)
		}
		st0 := e.commandStats()
		var each []float64 // Redis's µs for each read
		for w := range wakeups {
			w0 := e.commandStats()
			errc := make(chan error, 1)
			go func() { errc <- read(keys) }()
			for deadline := time.Now().Add(5 * time.Second); ; {
				info, err := e.admin.Info(ctx, "clients").Result()
				if err != nil {
					return nil, err
				}
				if infoField(info, "blocked_clients") == "1" {
					break
				}
				if time.Now().After(deadline) {
					return nil, fmt.Errorf("bare %s over %d keys: not blocked after 5s", cmd, K)
				}
			}
			if err := pusher.RPush(ctx, keys[w%K], "x").Err(); err != nil {
				return nil, err
			}
			if err := <-errc; err != nil {
				return nil, fmt.Errorf("bare %s over %d keys: %w", cmd, K, err)
			}
			w1 := e.commandStats()
			each = append(each, float64(w1[cmd].usec-w0[cmd].usec))
		}
		st1 := e.commandStats()
		calls := st1[cmd].calls - st0[cmd].calls
		mean := float64(st1[cmd].usec-st0[cmd].usec) / float64(max(calls, 1))
		p50 := median(each)
		if K == 1 {
			one = p50
		}
		t.Rows = append(t.Rows, []string{thousandsInt(K), fmt.Sprintf("%.0f µs", p50), fmt.Sprintf("%.1f µs", mean), f2(p50 / one)})
		t.Data = append(t.Data, map[string]any{"keys": K, "command": cmd, "read_p50_us": p50, "read_mean_us": mean, "calls": calls, "per_one_key": p50 / one})
	}
	return t, nil
}

// wakeFigure draws table 10: Redis CPU per acquisition and the drain
// against K, and Redis's time per BLPOP against the keys it waits on.
func wakeFigure(e *env, ks []int, res [][]wakeResult, bare *Table) *figure {
	fg := &figure{name: "wake", title: "10. Waiters over many names: what a wake-up costs Redis",
		subtitle: "K waiters in one process, each on a name of its own, all released together. Redis CPU per acquisition counts everything from the waiters' start to the last release, the peers' polling included; the blocking-read panel shows what one read costs Redis as its keys grow, and (dotted) how many keys fairlock's listener waited on at each K.",
		cols:     2, panelW: 460, panelH: 300}
	cpu := &panel{title: "Redis CPU per acquisition", x: axis{label: "K (waiters, each on its own name)", log: true}, y: axis{label: "Redis CPU per acquisition", zero: true, format: durUS}}
	drain := &panel{title: "drain: first release to the last waiter's return", x: axis{label: "K (waiters, each on its own name)", log: true}, y: axis{label: "drain", log: true, format: durUS}}
	for i, im := range e.impls {
		fg.legend = append(fg.legend, im.name)
		c := series{name: im.name, dots: true}
		d := series{name: im.name, dots: true}
		for ki, K := range ks {
			if r := res[ki][i]; !math.IsNaN(r.cpu) {
				c.pts = append(c.pts, pt{float64(K), r.cpu})
			}
			d.pts = append(d.pts, pt{float64(K), max(micros(res[ki][i].drain), 1)})
		}
		cpu.lines = append(cpu.lines, c)
		drain.lines = append(drain.lines, d)
	}
	blp := &panel{title: "Redis's time per blocking read (p50, bare; table 10b)", x: axis{label: "keys the read waits on", log: true}, y: axis{label: "Redis time per read", log: true, format: durUS}}
	// Where fairlock's listener sat on that curve: the keys its blocking
	// reads waited on, on average, at each K.
	for ki, K := range ks {
		for i, im := range e.impls {
			if r := res[ki][i]; im.ownRow() && r.hookCalls > 0 {
				keys := float64(r.hookKeys) / float64(r.hookCalls)
				blp.vlines = append(blp.vlines, marker{keys, fmt.Sprintf("fairlock at K=%s: %.0f keys", thousandsInt(K), keys)})
			}
		}
	}
	if bare != nil {
		fg.legend = append(fg.legend, refBareBlockingRead)
		ref := series{name: refBareBlockingRead, dots: true}
		for _, d := range bare.Data {
			ref.pts = append(ref.pts, pt{float64(d["keys"].(int)), d["read_p50_us"].(float64)})
		}
		blp.lines = append(blp.lines, ref)
	} else {
		blp.empty = "n/a on the embedded miniredis: run with -redis auto"
	}
	if !e.real {
		cpu.empty = "n/a on the embedded miniredis: run with -redis auto"
	}
	fg.panels = []*panel{cpu, blp, drain}
	return fg
}

// keysOfName counts the keys whose name holds the lock name name as a
// whole (not as the start of a longer number): every implementation's keys
// for it.
func (e *env) keysOfName(name string) int64 {
	var n int64
	for _, pattern := range []string{"*" + name, "*" + name + "[^0-9]*"} {
		iter := e.admin.Scan(context.Background(), 0, pattern, 1000).Iterator()
		for iter.Next(context.Background()) {
			n++
		}
	}
	return n
}

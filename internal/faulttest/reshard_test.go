package faulttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// While a Cluster slot is MIGRATING, a script's
// redis.call on a key it did not declare and that the source node does not
// have fails ("non local key"), after the script's earlier writes were
// made. Wake lists are such keys (usually missing: their BLPOP emptied
// them), and so are a multi-lock's other semaphores.
//
// TestReshardUnderLoad moves the slot of a busy capacity-3 semaphore and of
// two hash-tagged mutexes (locked alone and together) between nodes, six
// times, the way redis-cli --cluster reshard does, with the slot held open
// and its keys moved one per MIGRATE, so that scripts run on the MIGRATING
// source with wake lists missing. An liveOccupancy record that fairlock does
// not write must show no over-grant; every worker must finish its rounds
// once the moves are over; errors callers get during the moves are counted
// and reported.
func TestReshardUnderLoad(t *testing.T) {
	redistest.Long(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true and no redis-server on PATH")
		}
		t.Skip("no redis-server on PATH")
	}
	cl, err := redisserver.StartCluster(3)
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	defer cl.Stop()
	ctx := context.Background()

	const (
		prefix     = "rs:"
		semName    = "{rs}:sem"
		semCap     = 3
		semWorkers = 10
		multiProcs = 4 // lock {rs}:x and {rs}:y together
		xProcs     = 4 // lock {rs}:x alone
		moves      = 6
		finalRound = 5 // rounds each worker must finish after the moves
	)
	caps := map[string]int64{semName: semCap, "{rs}:x": 1, "{rs}:y": 1}
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer admin.Close()
	slot64, err := admin.ClusterKeySlot(ctx, prefix+semName+":s").Result()
	if err != nil {
		t.Fatal(err)
	}
	slot := int(slot64)

	occ := newLiveOccupancy(caps)
	red := &redirects{}
	stats := &callerErrors{}

	// Each worker is one fairlock client (one process in the queues, with
	// its own wake list) on its own cluster client.
	type workerSpec struct {
		id   int
		reqs []fairlock.Request
	}
	var specs []workerSpec
	for i := range semWorkers + multiProcs + xProcs {
		var reqs []fairlock.Request
		switch {
		case i < semWorkers:
			reqs = []fairlock.Request{{Name: semName, Capacity: semCap, Permits: 1}}
		case i < semWorkers+multiProcs:
			reqs = []fairlock.Request{{Name: "{rs}:x", Capacity: 1, Permits: 1}, {Name: "{rs}:y", Capacity: 1, Permits: 1}}
		default:
			reqs = []fairlock.Request{{Name: "{rs}:x", Capacity: 1, Permits: 1}}
		}
		specs = append(specs, workerSpec{id: i, reqs: reqs})
	}
	var (
		settled   atomic.Int64 // unix µs when the last move closed; 0 before
		stop      = make(chan struct{})
		finalDone sync.WaitGroup
		all       sync.WaitGroup
		rounds    = make([]atomic.Int64, len(specs))
		after     = make([]atomic.Int64, len(specs)) // rounds begun after settling
	)
	finalDone.Add(len(specs))
	for _, sp := range specs {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
		rdb.OnNewNode(func(n *redis.Client) { n.AddHook(red.hookFor(n.Options().Addr)) })
		c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(time.Second),
			fairlock.WithWaiterTTL(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		all.Go(func() {
			defer rdb.Close()
			defer c.Close()
			finished := false
			for {
				select {
				case <-stop:
					if !finished {
						finalDone.Done()
					}
					return
				default:
				}
				began := time.Now()
				postSettle := settled.Load() != 0 && began.UnixMicro() > settled.Load()
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				l, err := c.AcquireAll(actx, sp.reqs...)
				cancel()
				if err != nil {
					stats.add("acquire", err, postSettle)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				parts := l.Parts()
				occ.enter(parts)
				time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Microsecond)
				lost := l.Err() != nil
				occ.leave(parts, lost)
				if err := l.Release(ctx); err != nil {
					stats.add("release", err, postSettle)
				}
				rounds[sp.id].Add(1)
				if postSettle && after[sp.id].Add(1) == finalRound && !finished {
					finished = true
					finalDone.Done()
				}
			}
		})
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		all.Wait()
	}()

	audits := 0
	audit := func(when string) {
		t.Helper()
		for name := range caps {
			a, err := auditState(ctx, admin, prefix+name)
			if err != nil {
				t.Errorf("audit %s of %s: %v", when, name, err)
				continue
			}
			audits++
			if bad := a.problems(caps[name]); bad != "" {
				t.Errorf("state of %s %s: %s (%+v)", name, when, bad, a)
			}
		}
	}

	time.Sleep(time.Second) // queues fill
	audit("before the moves")
	from, err := cl.NodeOf(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	home, other := from, (from+1)%len(cl.Nodes)
	began := time.Now()
	var keysMoved []int
	for i := range moves {
		to := other
		if i%2 == 1 {
			to = home
		}
		err := cl.MigrateSlot(ctx, slot, to, redisserver.Migration{
			Batch: 1, Hold: 400 * time.Millisecond, Pause: 25 * time.Millisecond,
			Hook: func(s redisserver.MigrationStep) {
				switch s.Phase {
				case "open":
					red.open(s.SourceAddr)
					red.wakeListsAtOpen.Add(int64(countWakeLists(ctx, s.SourceAddr, slot)))
				case "closed":
					red.close()
					keysMoved = append(keysMoved, s.Moved)
				}
			},
		})
		if err != nil {
			t.Fatalf("move %d of slot %d to node %d: %v", i, slot, to, err)
		}
		time.Sleep(300 * time.Millisecond) // settled: the queues run on the new owner
		audit(fmt.Sprintf("after move %d", i+1))
	}
	movesTook := time.Since(began)
	settled.Store(time.Now().UnixMicro())

	// Every worker must finish its rounds now that the slot has settled.
	done := make(chan struct{})
	go func() { finalDone.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		var stuck []string
		for i := range specs {
			if after[i].Load() < finalRound {
				stuck = append(stuck, fmt.Sprintf("worker %d (%s): %d of %d rounds", i, specs[i].reqs[0].Name, after[i].Load(), finalRound))
			}
		}
		t.Errorf("not every waiter was granted within 20s of the last move: %s", strings.Join(stuck, "; "))
	}
	recovered := time.Since(time.UnixMicro(settled.Load()))
	close(stop)
	all.Wait()
	audit("at the end")

	var total int64
	for i := range rounds {
		total += rounds[i].Load()
	}
	t.Logf("slot %d moved %d times between nodes %d and %d in %v (keys per move %v); workers finished %d rounds each %v after the last move",
		slot, moves, home, other, movesTook.Round(time.Millisecond), keysMoved, finalRound, recovered.Round(time.Millisecond))
	t.Logf("liveOccupancy: %s; %d rounds in all", occ.summary(), total)
	t.Logf("while the slot was open: %s", red.summary())
	t.Logf("errors returned to callers: %s", stats.summary())
	t.Logf("%d state audits", audits)

	// The window must have been real: scripts ran on the MIGRATING source,
	// and wake lists were missing there (a waiter's BLPOP was sent on).
	// (Blocking reads run on a go-redis client that fairlock builds for
	// them, out of this hook's reach since the listener change, so the
	// BLPOPs sent on with ASK are no longer counted; the scripts that ran
	// on the source are the window.)
	if red.evalOnSource.Load() == 0 {
		t.Errorf("the reshard window was not exercised: %d scripts ran on the migrating source, %d BLPOPs were redirected (ASK)",
			red.evalOnSource.Load(), red.blpopAsk.Load())
	}
	if v := occ.violations(); v > 0 {
		t.Errorf("over-granted: capacity exceeded %d times (%s)", v, occ.firstViolation())
	}
	if n := stats.postSettle.Load(); n > 0 {
		t.Errorf("%d calls begun after the slot settled failed (first: %s)", n, stats.firstPost())
	}
}

// liveOccupancy is the independent record of in-process workers: each worker notes entering and
// leaving its critical section here, and fairlock never writes it.
type liveOccupancy struct {
	mu      sync.Mutex
	caps    map[string]int64
	in      map[string]int64
	peak    map[string]int64
	enters  map[string]int
	over    int
	first   string
	lostIn  int // leases found lost when their holder left
	started time.Time
}

func newLiveOccupancy(caps map[string]int64) *liveOccupancy {
	return &liveOccupancy{caps: caps, in: map[string]int64{}, peak: map[string]int64{}, enters: map[string]int{}, started: time.Now()}
}

func (o *liveOccupancy) enter(parts []fairlock.Part) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range parts {
		o.in[p.Name] += p.Permits
		o.enters[p.Name]++
		o.peak[p.Name] = max(o.peak[p.Name], o.in[p.Name])
		if o.in[p.Name] > o.caps[p.Name] {
			o.over++
			if o.first == "" {
				o.first = fmt.Sprintf("%d of %d permits of %s held at %v", o.in[p.Name], o.caps[p.Name], p.Name, time.Since(o.started).Round(time.Millisecond))
			}
		}
	}
}

func (o *liveOccupancy) leave(parts []fairlock.Part, lost bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range parts {
		o.in[p.Name] -= p.Permits
	}
	if lost {
		o.lostIn++
	}
}

func (o *liveOccupancy) violations() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.over
}

func (o *liveOccupancy) firstViolation() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.first
}

func (o *liveOccupancy) summary() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var names []string
	for n := range o.caps {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		out = append(out, fmt.Sprintf("%s %d acquisitions, peak %d of %d", n, o.enters[n], o.peak[n], o.caps[n]))
	}
	return fmt.Sprintf("%s; %d violations; %d leases lost while held", strings.Join(out, ", "), o.over, o.lostIn)
}

// redirects counts, per node, what the cluster nodes answered while a slot
// was open: scripts that ran on the MIGRATING source, scripts stopped there
// by a key the node did not have, and redirections.
type redirects struct {
	src atomic.Pointer[string] // the source's address while the slot is open

	evalOnSource, scriptAborted atomic.Int64
	ask, tryAgain, moved        atomic.Int64
	blpopAsk                    atomic.Int64
	windows, wakeListsAtOpen    atomic.Int64
	firstAbortMu                sync.Mutex
	firstAbort                  string
}

func (r *redirects) open(addr string) { r.windows.Add(1); r.src.Store(&addr) }
func (r *redirects) close()           { r.src.Store(nil) }

func (r *redirects) hookFor(addr string) redis.Hook { return nodeHook{r: r, addr: addr} }

// note counts what the node at addr answered to cmd: err, or else the
// command's own error (go-redis sets it only after the hooks have run).
func (r *redirects) note(addr string, cmd redis.Cmder, err error) {
	src := r.src.Load()
	onSource := src != nil && *src == addr
	name := cmd.Name()
	if err == nil {
		err = cmd.Err()
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	switch {
	case strings.HasPrefix(msg, "ASK "):
		r.ask.Add(1)
		if (name == "blpop" || name == "blmpop") && onSource {
			r.blpopAsk.Add(1)
		}
		return
	case strings.HasPrefix(msg, "TRYAGAIN"):
		r.tryAgain.Add(1)
		return
	case strings.HasPrefix(msg, "MOVED "):
		r.moved.Add(1)
		return
	}
	if name != "evalsha" && name != "eval" && name != "fcall" {
		return
	}
	if strings.Contains(msg, "non local key") || strings.Contains(msg, "Script attempted") {
		r.scriptAborted.Add(1)
		r.firstAbortMu.Lock()
		if r.firstAbort == "" {
			r.firstAbort = msg
		}
		r.firstAbortMu.Unlock()
	}
	if onSource && !strings.HasPrefix(msg, "NOSCRIPT") && !strings.HasPrefix(msg, "ERR Function not found") {
		r.evalOnSource.Add(1)
	}
}

func (r *redirects) summary() string {
	r.firstAbortMu.Lock()
	first := r.firstAbort
	r.firstAbortMu.Unlock()
	return fmt.Sprintf("%d windows, %d wake lists on the source as each opened; %d scripts ran on the migrating source, %d scripts stopped by a non-local key (first: %q); %d ASK (%d of them BLPOPs of wake lists), %d TRYAGAIN, %d MOVED",
		r.windows.Load(), r.wakeListsAtOpen.Load(), r.evalOnSource.Load(), r.scriptAborted.Load(), first, r.ask.Load(), r.blpopAsk.Load(), r.tryAgain.Load(), r.moved.Load())
}

type nodeHook struct {
	r    *redirects
	addr string
}

func (h nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.r.note(h.addr, cmd, err)
		return err
	}
}

func (h nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.r.note(h.addr, c, nil)
		}
		return err
	}
}

var nodeAddr = regexp.MustCompile(`127\.0\.0\.1:\d+`)

// callerErrors counts the errors fairlock returned to the workers, by kind.
type callerErrors struct {
	mu         sync.Mutex
	kinds      map[string]int
	postSettle atomic.Int64
	firstAfter string
}

func (e *callerErrors) add(op string, err error, postSettle bool) {
	kind := "other"
	msg := err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		kind = "wait timed out (5s)"
	case strings.Contains(msg, "TRYAGAIN"):
		kind = "TRYAGAIN"
	case strings.Contains(msg, "non local key") || strings.Contains(msg, "Script attempted"):
		kind = "non-local key"
	case errors.Is(err, fairlock.ErrLeaseLost):
		kind = "lease lost"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.kinds == nil {
		e.kinds = map[string]int{}
	}
	if kind == "other" {
		kind = "other: " + nodeAddr.ReplaceAllString(msg, "<node>")
	}
	e.kinds[op+": "+kind]++
	if postSettle {
		e.postSettle.Add(1)
		if e.firstAfter == "" {
			e.firstAfter = op + ": " + msg
		}
	}
}

func (e *callerErrors) firstPost() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.firstAfter
}

func (e *callerErrors) summary() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.kinds) == 0 {
		return "none"
	}
	var out []string
	for k, n := range e.kinds {
		out = append(out, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// countWakeLists returns how many wake lists of the slot the node at addr
// holds.
func countWakeLists(ctx context.Context, addr string, slot int) int {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	keys, err := rdb.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
	if err != nil {
		return -1
	}
	n := 0
	for _, k := range keys {
		if strings.Contains(k, "\x1fw\x1f") { // a semaphore's own wake list (keyspace.Keys.Derived)
			n++
		}
	}
	return n
}

// stateAudit is one semaphore's stored state, read in one script:
// the counters of its state hash against its sorted sets.
type stateAudit struct {
	Exists           bool
	Used, SumH       int64 // permits the hash counts; permits in H
	NH, CardH        int64
	NQ, CardQ, CardD int64 // CardD: the unused third key's members
	Live             int64 // permits of leases whose expiry is in the future
}

// problems names what is inconsistent in a, or "".
func (a stateAudit) problems(capacity int64) string {
	var out []string
	if a.Live > capacity {
		out = append(out, fmt.Sprintf("Redis holds %d live permits of %d", a.Live, capacity))
	}
	if a.Exists {
		if a.Used != a.SumH {
			out = append(out, fmt.Sprintf("used %d but the leases hold %d", a.Used, a.SumH))
		}
		if a.NH != a.CardH {
			out = append(out, fmt.Sprintf("nh %d but %d leases", a.NH, a.CardH))
		}
		if a.NQ != a.CardQ {
			out = append(out, fmt.Sprintf("nq %d but %d queued", a.NQ, a.CardQ))
		}
	}
	// Layout 3 keeps waiters' deadlines in their processes' liveness
	// fields in the state hash: the third key (:d in layouts 1 and 2)
	// holds nothing.
	if a.CardD != 0 {
		out = append(out, fmt.Sprintf("the unused third key (:d) holds %d members", a.CardD))
	}
	return strings.Join(out, "; ")
}

var auditScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('HMGET', KEYS[1], 'used', 'nh', 'nq', 'o', 'oe')
local exists = redis.call('EXISTS', KEYS[1])
local sum, live = 0, 0
local h = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
-- The holder kept in the state hash counts as one of :h's.
if st[4] then
  table.insert(h, 1, st[5])
  table.insert(h, 1, st[4])
end
for i = 1, #h, 2 do
  local n = tonumber(string.match(h[i], '^%S+ (%d+)')) or 0
  sum = sum + n
  if tonumber(h[i + 1]) > now then live = live + n end
end
return {exists, tonumber(st[1]) or 0, sum, tonumber(st[2]) or 0, #h / 2,
  tonumber(st[3]) or 0, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]), live}`)

func auditState(ctx context.Context, rdb redis.Scripter, base string) (stateAudit, error) {
	res, err := auditScript.Run(ctx, rdb, []string{base + ":s", base + ":q", base + ":d", base + ":h"}).Int64Slice()
	if err != nil {
		return stateAudit{}, err
	}
	if len(res) != 9 {
		return stateAudit{}, fmt.Errorf("audit reply %v", res)
	}
	return stateAudit{Exists: res[0] == 1, Used: res[1], SumH: res[2], NH: res[3], CardH: res[4],
		NQ: res[5], CardQ: res[6], CardD: res[7], Live: res[8]}, nil
}

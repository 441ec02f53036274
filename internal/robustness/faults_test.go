package robustness

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

var reportPath = flag.String("robustness.report", "", "write the per-fault table (Markdown) to this file")

// The docs' promises the faults are held to (README, Guarantees in brief,
// and docs/reliability.md).
const (
	promiseBounded = "every call returns by its context's end, Redis up or down; at most capacity held; tokens increase"
	promisePaused  = "a holder paused past its lease may still act; the fencing token lets the resource refuse it; at most capacity held by Redis's clock"
	promiseKept    = "guaranteed given a Redis that keeps the writes it acknowledged: at most capacity held, tokens increase"
	promiseLossy   = "not guaranteed: a restart that loses acknowledged writes can lose grants (an overlap) and releases"
)

// lostWrites are the violations a fault that can lose acknowledged writes
// (a restart with appendfsync everysec, a failover without WithReplicaAck)
// is documented to allow. A lost grant lets Redis grant the permits again:
// an overlap ("capacity of"), anywhere in the run. A lost count down
// raises a latch's count again, and a lost latch is made again at its
// count, so a later Count reads more than an earlier one, or a Wait waits
// on a latch another Wait saw open: not linearizable. A lost arrival or
// round end lets a barrier give a round's number or a party's index
// again, or complete a round that broke for a party that saw it broken.
// Those are allowed only on a latch or a round whose calls meet the
// fault's span (lossMark, Limits.Faults): a lost write changes what
// follows it, and the writes a fault can lose are those acknowledged
// shortly before it. Every other violation (a latch or a round away from
// the fault, a deadline missed, a token given twice or going back, a lost
// update on the fenced store) stays a failure under these faults too.
var lostWrites = []string{"capacity of", lossMark}

// A fault is a row of faults.
type fault struct {
	scenario
	allowed []string
	long    bool // run with -robustness.long only
}

// faults lists the nemesis's faults, each with its promise. A fault's
// allowed violations are those the docs say the fault may cause: they are
// reported, and do not fail the test. TestRobustnessFaults runs every row
// but the first; the latch's and barrier's tests pick theirs by name
// (pick).
var faults = []fault{
	{scenario: scenario{name: "none", promise: promiseKept}},
	{scenario: scenario{name: "proxy latency 50ms, all clients", promise: promiseBounded, hold: 1500 * time.Millisecond,
		fault: func(t *testing.T, e *env) func() {
			for _, p := range e.proxies {
				p.SetLatency(50 * time.Millisecond)
			}
			return func() {
				for _, p := range e.proxies {
					p.SetLatency(0)
				}
			}
		}}},
	{scenario: scenario{name: "proxy latency 400ms, one client", promise: promiseBounded, hold: 1500 * time.Millisecond, eachChild: true,
		fault: func(t *testing.T, e *env) func() {
			p := e.proxies[e.target]
			p.SetLatency(400 * time.Millisecond)
			return func() { p.SetLatency(0) }
		}}},
	{scenario: scenario{name: "proxy stall 1.5s, one client", promise: promiseBounded, hold: 1500 * time.Millisecond, eachChild: true,
		fault: func(t *testing.T, e *env) func() { return e.proxies[e.target].Stall() }}},
	{scenario: scenario{name: "proxy stall 1.5s, all clients", promise: promiseBounded, hold: 1500 * time.Millisecond,
		fault: func(t *testing.T, e *env) func() { return all(e, (*Proxy).Stall) }}},
	{scenario: scenario{name: "proxy cut 1.5s, one client", promise: promiseBounded, hold: 1500 * time.Millisecond, eachChild: true,
		fault: func(t *testing.T, e *env) func() { return e.proxies[e.target].Cut() }}},
	{scenario: scenario{name: "proxy cut 1.5s, all clients", promise: promiseBounded, hold: 1500 * time.Millisecond,
		fault: func(t *testing.T, e *env) func() { return all(e, (*Proxy).Cut) }}},
	// Right after SIGCONT, before the lease's timers have run, Lease.Err
	// must already read the lease lost: a violation here is a failure.
	{scenario: scenario{name: "client SIGSTOP 1.5s (lease 1s)", promise: promisePaused, hold: 1500 * time.Millisecond, eachChild: true,
		fault: func(t *testing.T, e *env) func() { return e.stop(t, e.target) }}},
	{scenario: scenario{name: "Redis paused 1.5s", promise: promiseBounded, hold: 1500 * time.Millisecond, fault: pause}},
	{scenario: scenario{name: "Redis killed, restarted 500ms later, appendfsync always", promise: promiseKept,
		hold: 500 * time.Millisecond, redisArgs: []string{"--appendonly", "yes", "--appendfsync", "always"},
		fault: restart}},
	{scenario: scenario{name: "Redis killed, restarted 500ms later, appendfsync everysec", promise: promiseLossy,
		hold: 500 * time.Millisecond, redisArgs: []string{"--appendonly", "yes", "--appendfsync", "everysec"},
		fault: restart}, allowed: lostWrites},
	// Sentinel: the master fails; the sentinels promote the replica
	// (about 1.7 s after a kill, with down-after 500 ms); the old master
	// comes back and is made a replica of the new one.
	// The fault lasts until the sentinels name a new master, then the old
	// one is restarted (resumed). The short run has one kill without and
	// one pause with WithReplicaAck; the long run all four.
	{scenario: scenario{name: "Sentinel failover, master killed", promise: promiseFailover,
		deploy: "sentinel", hold: 300 * time.Millisecond, fault: failover(restart)}, allowed: lostWrites},
	{scenario: scenario{name: "Sentinel failover, master paused", promise: promiseFailover,
		deploy: "sentinel", hold: 300 * time.Millisecond, fault: failover(pause)}, allowed: lostWrites, long: true},
	{scenario: scenario{name: "Sentinel failover, master killed, WithReplicaAck(1)", promise: promiseAck,
		deploy: "sentinel", replicaAck: 1, hold: 300 * time.Millisecond, fault: failover(restart)}, allowed: []string{unackedMark}, long: true},
	{scenario: scenario{name: "Sentinel failover, master paused, WithReplicaAck(1)", promise: promiseAck,
		deploy: "sentinel", replicaAck: 1, hold: 300 * time.Millisecond, fault: failover(pause)}, allowed: []string{unackedMark}},
	{scenario: scenario{name: "Cluster: the slots of all four semaphores moved to another master", promise: promiseCluster,
		deploy: "cluster", fault: moveSlots}},
}

const (
	promiseFailover = "failover can lose acknowledged writes: a lost grant is an overlap, the first holder's next renewal finds nothing; tokens follow the clock"
	promiseAck      = "with WithReplicaAck only writes whose call failed or is still running can be lost, if Sentinel promotes a replica that acknowledged them"
	promiseCluster  = "leases keep renewing through a slot move; no over-grant; a refused release is sent again"
)

// failoverWait is how long a failover fault waits for the sentinels to
// name another master. A failover is named 1-2 s after the fault; one whose
// election splits three ways (every sentinel votes for itself) is given up
// after redisserver.FailoverTimeout and tried again twice that long after
// it began, so the wait covers several such tries.
const failoverWait = 30 * time.Second

// failover returns a fault that injects f on the Sentinel set's current
// master, once it has a replica in sync and the sentinels can fail it over,
// and waits (up to failoverWait) until the sentinels name another master;
// its heal is f's (the old master comes back, and the sentinels make it a
// replica).
//
// Right after naming a new master, the sentinels may take it for down: each
// counts its first ping from the switch, but reconnects to the new address
// at most once per ping period (down-after, here), so that ping can be
// answered late. They then start a failover of the new master, which has
// no replica fit to promote (the old master is down or resyncing), abort
// it, and start none for twice redisserver.FailoverTimeout. A fault
// injected meanwhile would see no failover until that time is out, so the
// next fault waits for it.
func failover(f func(*testing.T, *env) func()) func(*testing.T, *env) func() {
	return func(t *testing.T, e *env) func() {
		if !e.switched.IsZero() {
			// Sentinel adds up to a second of its own to the delay.
			time.Sleep(time.Until(e.switched.Add(2*redisserver.FailoverTimeout + time.Second)))
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: e.sentinel.SentinelAddrs()[0]})
		defer sc.Close()
		master := func() string {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			a, err := sc.GetMasterAddrByName(ctx, redisserver.MasterName).Result()
			if err != nil || len(a) != 2 {
				return ""
			}
			return net.JoinHostPort(a[0], a[1])
		}
		before := master()
		e.server = nil
		for _, s := range []*redisserver.Server{e.sentinel.Master, e.sentinel.Replica} {
			if s.Addr == before {
				e.server = s
			}
		}
		if e.server == nil {
			t.Errorf("the sentinels name %q as master, neither server of the set", before)
			return func() {}
		}
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		ok := synced(sctx, e.server.Addr) && known(sctx, e.sentinel.SentinelAddrs())
		scancel()
		if !ok {
			t.Errorf("master %s not seen up by every sentinel with a replica in sync that they know, within 20s", before)
		}
		replica := e.sentinel.Master
		if replica == e.server {
			replica = e.sentinel.Replica
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		e.injected, ok = caughtUp(cctx, e.server.Addr, replica.Addr)
		ccancel()
		if !ok {
			t.Errorf("replica %s did not catch up with master %s within 5s", replica.Addr, before)
		}
		start := time.Now()
		heal := f(t, e)
		for time.Since(start) < failoverWait {
			if m := master(); m != "" && m != before {
				e.switched = time.Now()
				e.measured("new master named after", time.Since(start))
				return heal
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("no failover within %v of the fault (master %s)", failoverWait, before)
		return heal
	}
}

// known waits until every sentinel sees the master up, with no failover
// under way, and knows a replica in good health (or ctx ends), and reports
// whether they do: a sentinel learns of a replica from the master's INFO,
// every 10 s, and a failover with no replica it knows of is aborted and
// not tried again for twice the failover timeout.
func known(ctx context.Context, sentinels []string) bool {
	for _, addr := range sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
		ok := false
		for !ok && ctx.Err() == nil {
			m, _ := sc.Master(ctx, redisserver.MasterName).Result()
			rs, _ := sc.Replicas(ctx, redisserver.MasterName).Result()
			for _, r := range rs {
				if m["flags"] == "master" && r["flags"] == "slave" && r["master-link-status"] == "ok" {
					ok = true
				}
			}
			if !ok {
				time.Sleep(50 * time.Millisecond)
			}
		}
		sc.Close()
		if !ok {
			return false
		}
	}
	return true
}

// synced waits until the master at addr has a replica online whose last
// acknowledgement is at most a second old (or ctx ends), and reports
// whether it has: before that, the sentinels cannot promote it. Under
// traffic a replica's offset trails the master's by what is in flight, so
// the offsets are not compared.
func synced(ctx context.Context, addr string) bool {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for ctx.Err() == nil {
		info, _ := rdb.Info(ctx, "replication").Result()
		for _, line := range strings.Split(info, "\r\n") {
			v, ok := strings.CutPrefix(line, "slave0:")
			if !ok {
				continue
			}
			// "ip=...,port=...,state=online,offset=...,lag=0", and on
			// Valkey ",type=replica" after.
			fields := strings.Split(v, ",")
			if slices.Contains(fields, "state=online") && (slices.Contains(fields, "lag=0") || slices.Contains(fields, "lag=1")) {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// caughtUp reads the replication offset of the master at master, then
// waits until the replica at replica has applied the stream up to it (or
// ctx ends), and returns when it read the offset (µs, the host's clock)
// and whether the replica got there. Every write the master acknowledged
// before that moment is then on the replica, so a failover can lose only
// writes acknowledged after it: the start of the fault's span
// (Limits.Faults).
func caughtUp(ctx context.Context, master, replica string) (int64, bool) {
	offset := func(addr, field string) (int64, bool) {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		info, err := rdb.Info(ctx, "replication").Result()
		if err != nil {
			return 0, false
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				return n, err == nil
			}
		}
		return 0, false
	}
	at := now()
	want, ok := offset(master, "master_repl_offset")
	if !ok {
		return at, false
	}
	for ctx.Err() == nil {
		if got, ok := offset(replica, "slave_repl_offset"); ok && got >= want {
			return at, true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return at, false
}

func pause(t *testing.T, e *env) func() {
	if err := e.server.Pause(); err != nil {
		t.Errorf("pause Redis: %v", err)
	}
	return func() {
		if err := e.server.Resume(); err != nil {
			t.Errorf("resume Redis: %v", err)
		}
	}
}

// moveSlots moves the slot of each object of the traffic (e.slotTags: the
// semaphores', and the latches' and the barrier's when they run) to the
// next master, one after another, as redis-cli --cluster reshard does.
func moveSlots(t *testing.T, e *env) func() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: e.cluster.Addrs()[0]})
	defer rdb.Close()
	for _, tag := range e.slotTags {
		slot, err := rdb.ClusterKeySlot(ctx, "{"+tag+"}").Result()
		if err != nil {
			t.Errorf("CLUSTER KEYSLOT: %v", err)
			return func() {}
		}
		from, err := e.cluster.NodeOf(ctx, int(slot))
		if err != nil {
			t.Errorf("slot %d: %v", slot, err)
			return func() {}
		}
		if err := e.cluster.MoveSlot(ctx, int(slot), (from+1)%len(e.cluster.Nodes)); err != nil {
			t.Errorf("move slot %d of %s: %v", slot, tag, err)
		}
	}
	return func() {}
}

func all(e *env, f func(*Proxy) func()) func() {
	var heals []func()
	for _, p := range e.proxies {
		heals = append(heals, f(p))
	}
	return func() {
		for _, h := range heals {
			h()
		}
	}
}

func restart(t *testing.T, e *env) func() {
	e.server.Kill()
	return func() {
		if err := e.server.Restart(); err != nil {
			t.Errorf("restart Redis: %v", err)
		}
	}
}

// TestRobustnessFaults runs the traffic under each fault once (with
// -robustness.long, many times over minutes) and checks the history.
func TestRobustnessFaults(t *testing.T) {
	redistest.Long(t)
	var rows []string
	for _, f := range faults[1:] {
		t.Run(f.name, func(t *testing.T) {
			res, allowed := runFault(t, f, f.scenario)
			if res.Acquired == 0 {
				t.Errorf("no lease granted")
			}
			rows = append(rows, row(f.scenario, res, allowed))
		})
	}
	if *reportPath != "" {
		writeReport(t, rows)
	}
}

// runFault runs sc, f's scenario with what a test adds to it (the latch
// or barrier traffic), unless f is for -robustness.long alone, and fails
// t with every violation but those f allows, which it logs; it returns
// the run's Result and how many violations f allowed.
func runFault(t *testing.T, f fault, sc scenario) (res Result, allowed int) {
	t.Helper()
	if f.long && !*long {
		t.Skip("with -robustness.long only")
	}
	res = run(t, sc)
	for _, v := range res.Violations {
		if anyPart(v, f.allowed) {
			allowed++
			t.Logf("allowed under this fault: %s", v)
		} else {
			t.Error(v)
		}
	}
	return res, allowed
}

// pick returns the rows of faults with these names, in the table's order,
// and fails t for a name the table does not hold (a row renamed there).
func pick(t *testing.T, names ...string) []fault {
	t.Helper()
	var out []fault
	for _, f := range faults {
		if slices.Contains(names, f.name) {
			out = append(out, f)
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(out, func(f fault) bool { return f.name == n }) {
			t.Errorf("no fault named %q in faults", n)
		}
	}
	return out
}

func anyPart(v string, parts []string) bool {
	for _, p := range parts {
		if strings.Contains(v, p) {
			return true
		}
	}
	return false
}

// row is a scenario's line of the report.
func row(sc scenario, res Result, allowed int) string {
	var kinds []string
	for k, n := range res.ErrorKinds {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	notes := fmt.Sprintf("latest return after a deadline %v; %d leases seen lost", res.MaxLate.Round(time.Millisecond), res.Lost)
	if len(kinds) > 0 {
		notes += "; errors: " + strings.Join(kinds, ", ")
	}
	if len(res.Notes) > 0 {
		notes += "; " + strings.Join(res.Notes, "; ")
	}
	if allowed > 0 {
		notes += fmt.Sprintf("; %d violations of a kind this fault is documented to allow (first: %s)", allowed, res.Violations[0])
	}
	return fmt.Sprintf("| %s | %s | %d leases, %d store calls | %d | %d | %d | %s |",
		sc.name, sc.promise, res.Acquired, res.StoreOps, res.Refused, len(res.Violations), res.Errors, notes)
}

func writeReport(t *testing.T, rows []string) {
	calm, rounds := timing()
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s: %d children × 4 workers, lease TTL %v, waiter TTL %v, call timeout %v; each fault %d times, %v of calm traffic around each.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), children, leaseTTL, waiterTL, callTime, rounds, calm)
	b.WriteString("| fault | what the docs promise | operations | fenced rejections | violations | errors | notes |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
	if err := os.WriteFile(*reportPath, []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
}

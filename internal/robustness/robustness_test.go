package robustness

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/clients"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
)

var (
	mutate = flag.String("robustness.mutate", "", "a Mutations name the children of TestLatchUnderFaults and TestBarrierUnderFaults run with: the checks must then fail those tests")
	long   = flag.Bool("robustness.long", false, "inject each fault many times (-robustness.rounds), with longer calm spans, instead of once")
	rounds = flag.Int("robustness.rounds", 10, "with -robustness.long, how many times each fault is injected")
)

func TestMain(m *testing.M) {
	if IsChild() {
		os.Exit(ChildMain(GoRedis))
	}
	redistest.MainWith(m, clients.Cleanup)
}

// Timing of the traffic, for the short run.
const (
	children = 3
	leaseTTL = time.Second
	waiterTL = 500 * time.Millisecond
	callTime = 2 * time.Second // each acquire's and release's context timeout
	// sentinelDown is how long the sentinels wait before they declare the
	// master down.
	sentinelDown = 500 * time.Millisecond
	// slack is how late after its deadline a call may return: the time a
	// busy 2-core machine, under the race detector, takes to schedule the
	// goroutine that notices the deadline and unwind the call.
	slack = 500 * time.Millisecond
)

// A scenario is a run of the traffic against one deployment with one fault.
type scenario struct {
	name      string
	promise   string   // what the docs promise under this fault
	redisArgs []string // extra redis-server arguments
	// fault injects one fault and returns its heal; nil for a fault-free run.
	fault func(t *testing.T, e *env) (heal func())
	hold  time.Duration // how long a fault lasts before it is healed
	// eachChild: the fault strikes one child (env.target), each child in
	// turn, so that it meets each client under test.
	eachChild bool
	mutation  string // a Mutations name the children run with
	// deploy is the Redis deployment: "" for one server behind a proxy per
	// child, "sentinel" for a master, a replica and three sentinels,
	// "cluster" for three masters; the children reach the last two
	// directly (their clients find the nodes through Sentinel or Cluster).
	deploy     string
	replicaAck int // WithReplicaAck's replicas in the children; 0 for none
	// older, when set, is a test binary of this package built from the
	// previous release (see upgrade_test.go): the even children run it,
	// the others this build, so both releases share the semaphores.
	older string
	// otherLayout says that older keeps another key layout: the release
	// whose process first creates a semaphore's keys holds it while it is
	// in use, and the other release's calls on it are refused, so a child
	// may take no lease at all.
	otherLayout bool
	// latch adds the latch traffic (latch.go) to every child, and its
	// check (CheckLatch) to the run's.
	latch bool
	// barrier adds the barrier traffic (barrier.go) to every child, and
	// its check (CheckBarrier) to the run's.
	barrier bool
}

// env is a running scenario, as the nemesis sees it.
type env struct {
	server   *redisserver.Server // the single server, or Sentinel's first master
	sentinel *redisserver.Sentinel
	cluster  *redisserver.Cluster
	proxies  []*Proxy
	kids     []*kid
	target   int // the child a one-child fault strikes this round
	// slotTags are the hash tags of the traffic's objects: a Cluster slot
	// move moves their slots (moveSlots).
	slotTags []string

	// switched is when the nemesis last saw the sentinels name a new
	// master (see failover).
	switched time.Time
	// injected, when a fault sets it, is the earliest moment (µs) from
	// which it may lose writes (failover: see caughtUp); a fault's span
	// (Limits.Faults) then starts there, not lossBefore before the fault.
	injected int64

	mu     sync.Mutex
	pauses []Pause
	times  map[string][]time.Duration // what the faults measured, for the report
}

// measured records a duration the nemesis measured, under what it is.
func (e *env) measured(what string, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.times == nil {
		e.times = map[string][]time.Duration{}
	}
	e.times[what] = append(e.times[what], d)
}

// notes returns the measured durations as notes: each kind's range.
func (e *env) notes() []string {
	var out []string
	for what, ds := range e.times {
		lo, hi := slices.Min(ds), slices.Max(ds)
		out = append(out, fmt.Sprintf("%s %v–%v (%d times)", what, lo.Round(10*time.Millisecond), hi.Round(10*time.Millisecond), len(ds)))
	}
	slices.Sort(out)
	return out
}

// kid is a child process seen from the parent.
type kid struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
}

// stop pauses child i (SIGSTOP) and returns the function that resumes it,
// recording the pause so that the deadline check excuses its calls.
func (e *env) stop(t *testing.T, i int) (heal func()) {
	from := now()
	if err := e.kids[i].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Errorf("SIGSTOP child %d: %v", i, err)
	}
	return func() {
		if err := e.kids[i].cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Errorf("SIGCONT child %d: %v", i, err)
		}
		e.mu.Lock()
		e.pauses = append(e.pauses, Pause{Child: i, From: from, Till: now()})
		e.mu.Unlock()
	}
}

// timing returns how long the traffic runs before, during and after the
// faults, and how many times the fault is injected.
func timing() (calm time.Duration, n int) {
	if *long {
		return 2 * time.Second, *rounds
	}
	return 600 * time.Millisecond, 1
}

// run runs sc: a store, a Redis, a proxy and a child per client; the
// fault injected and healed rounds times between calm spans; then the
// history is checked.
func run(t *testing.T, sc scenario) Result {
	t.Helper()
	if _, err := redisserver.Which(); err != nil {
		if os.Getenv("CI") == "true" || redistest.RealOnly() {
			t.Fatalf("no redis-server: %v", err)
		}
		t.Skipf("no redis-server: %v", err)
	}
	dir := t.TempDir()
	store, err := StartStore()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	e := &env{slotTags: []string{mutexName, semName, rwName, multiTag}}
	if sc.latch {
		e.slotTags = append(e.slotTags, latchTag)
	}
	if sc.barrier {
		e.slotTags = append(e.slotTags, barrierName)
	}
	var redisEnv func(i int) string
	switch sc.deploy {
	case "":
		srv, err := redisserver.Start(sc.redisArgs...)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Stop()
		e.server = srv
		for range children {
			p, err := StartProxy(srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			e.proxies = append(e.proxies, p)
		}
		redisEnv = func(i int) string { return envAddr + "=" + e.proxies[i].Addr() }
	case "sentinel":
		set, err := redisserver.StartSentinel(sentinelDown)
		if err != nil {
			t.Fatal(err)
		}
		defer set.Stop()
		e.sentinel, e.server = set, set.Master
		redisEnv = func(int) string { return envSentinels + "=" + strings.Join(set.SentinelAddrs(), ",") }
	case "cluster":
		cl, err := redisserver.StartCluster(3)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Stop()
		e.cluster = cl
		redisEnv = func(int) string { return envCluster + "=" + strings.Join(cl.Addrs(), ",") }
	default:
		t.Fatalf("unknown deployment %q", sc.deploy)
	}
	// The upgrade's children are the two releases (this one on go-redis),
	// the others one per client.
	bins := []clients.Binary{{Client: "older release", Path: sc.older}, {Client: "go-redis", Path: os.Args[0]}}
	if sc.older == "" {
		bins = clients.Binaries(t)
	}
	var who []string
	for i := range children {
		bin := bins[i%len(bins)]
		who = append(who, fmt.Sprintf("child %d: %s", i, bin.Client))
		k := &kid{cmd: exec.Command(bin.Path, "-test.run=^$")}
		k.cmd.Env = append(os.Environ(),
			"GORACE=atexit_sleep_ms=0", redisEnv(i), envAck+"="+strconv.Itoa(sc.replicaAck),
			envChild+"="+strconv.Itoa(i), envStore+"="+store.URL(),
			envHist+"="+filepath.Join(dir, fmt.Sprintf("child-%d.jsonl", i)),
			envPrefix+"=rb:", envLease+"="+leaseTTL.String(), envWaiter+"="+waiterTL.String(),
			envTimeout+"="+callTime.String(), envMutation+"="+sc.mutation, envLatch+"="+map[bool]string{true: "1"}[sc.latch],
			envBarrier+"="+map[bool]string{true: "1"}[sc.barrier])
		k.cmd.Stderr = &k.stderr
		if k.stdin, err = k.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := k.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		e.kids = append(e.kids, k)
	}
	warmUp(t, dir, sc)
	calm, n := timing()
	if sc.eachChild {
		n = max(n, children)
	}
	time.Sleep(calm)
	healed := make([]int64, children) // when a one-child fault on each was last healed
	var spans []Span                  // each fault's, for Limits.Faults
	for round := range n {
		e.target = round % children
		if sc.fault != nil {
			from := now() - lossBefore.Microseconds()
			e.injected = 0
			heal := sc.fault(t, e)
			if e.injected != 0 {
				from = e.injected
			}
			time.Sleep(sc.hold)
			heal()
			healed[e.target] = now()
			spans = append(spans, Span{From: from, Till: healed[e.target] + lossAfter.Microseconds()})
		}
		time.Sleep(calm)
	}
	if sc.eachChild {
		// The last child struck needs the time to give up a call that
		// its fault held (the call timeout) and take a lease again.
		time.Sleep(callTime + time.Second)
	}
	for i, k := range e.kids {
		_ = k.cmd.Process.Signal(syscall.SIGCONT)
		_ = k.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- k.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("child %d: %v\n%s", i, err, k.stderr.String())
			}
		case <-time.After(2*callTime + 5*time.Second):
			_ = k.cmd.Process.Kill()
			<-done
			t.Errorf("child %d did not stop within %v of being told\n%s", i, 2*callTime+5*time.Second, k.stderr.String())
		}
	}
	h, err := ReadHistories(dir)
	if err != nil {
		t.Fatal(err)
	}
	lim := Limits{Slack: slack, Linearizability: time.Minute, Faults: spans}
	res := Check(h, store.Finals(), e.pauses, lim)
	res.Notes = e.notes()
	if sc.latch {
		lr := CheckLatch(h, e.pauses, lim)
		t.Logf("%s: latch: %d calls, %d Waits opened, %d errors %v, %d violations", sc.name, lr.Ops, lr.Opened, lr.Errors, lr.ErrorKinds, len(lr.Violations))
		if lr.Opened == 0 {
			t.Errorf("%s: no latch opened", sc.name)
		}
		res.Violations = append(res.Violations, lr.Violations...)
	}
	if sc.barrier {
		br := CheckBarrier(h, e.pauses, lim)
		t.Logf("%s: %s", sc.name, describeBarrier(br))
		if br.Rounds == 0 {
			t.Errorf("%s: no barrier round completed", sc.name)
		}
		res.Violations = append(res.Violations, br.Violations...)
	}
	t.Logf("%s (%s)", sc.name, strings.Join(who, ", "))
	for i := range children {
		if res.ByChild[i] == 0 && !sc.otherLayout {
			t.Errorf("%s: no lease granted to child %d (%s)", sc.name, i, bins[i%len(bins)].Client)
		}
	}
	if sc.eachChild && sc.fault != nil {
		// Every client must come through the fault that struck it, not
		// only take leases before it: a lease granted after the heal.
		after := make([]bool, children)
		for _, l := range h.Leases {
			if l.Child >= 0 && l.Child < children && healed[l.Child] > 0 && l.Start > healed[l.Child] {
				after[l.Child] = true
			}
		}
		for i, ok := range after {
			if !ok {
				t.Errorf("%s: child %d (%s) took no lease after its fault was healed", sc.name, i, bins[i%len(bins)].Client)
			}
		}
	}
	t.Logf("%s: %d leases, %d store calls, %d refused by fencing, %d leases lost, %d fairlock errors %v, latest return after a deadline %v (%d late calls excused by their process's stalls; longest stall %v), %d violations",
		sc.name, res.Acquired, res.StoreOps, res.Refused, res.Lost, res.Errors, res.ErrorKinds, res.MaxLate, res.Stalled, longestStall(h.Stalls), len(res.Violations))
	return res
}

// longestStall is the longest of stalls.
func longestStall(stalls []Pause) time.Duration {
	var d int64
	for _, p := range stalls {
		d = max(d, p.Till-p.From)
	}
	return time.Duration(d) * time.Microsecond
}

// warmUpLimit bounds how long run waits for its children to start.
const warmUpLimit = 2 * time.Minute

// warmUp waits until every child has taken part: a lease recorded (the
// release with another layout: any call recorded), and in a latch or
// barrier run a count down or an Await too. The calm spans and the faults
// are timed from then, not from the children's start: a child built with
// the race detector, started while the machine's cores run other tests,
// took longer than the calm spans to take its first lease, so that the run
// had no traffic of that client to check (and no latch could open: it
// needs a count down of every child).
func warmUp(t *testing.T, dir string, sc scenario) {
	t.Helper()
	want := []string{`"lease":`}
	if sc.otherLayout {
		want = []string{`"op":`}
	}
	if sc.latch {
		want = append(want, `"kind":"latch_down"`)
	}
	if sc.barrier {
		want = append(want, `"kind":"barrier_await"`)
	}
	deadline := time.Now().Add(warmUpLimit)
	for i := 0; i < children; {
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("child-%d.jsonl", i)))
		if !slices.ContainsFunc(want, func(w string) bool { return !bytes.Contains(b, []byte(w)) }) {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Errorf("child %d had not recorded each of %q within %v of its start", i, want, warmUpLimit)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expectClean fails t with every violation of res.
func expectClean(t *testing.T, res Result) {
	t.Helper()
	for _, v := range res.Violations {
		t.Error(v)
	}
	if res.Acquired == 0 || res.StoreOps == 0 {
		t.Errorf("no traffic: %d leases, %d store calls", res.Acquired, res.StoreOps)
	}
}

func TestRobustnessNoFault(t *testing.T) {
	expectClean(t, run(t, scenario{name: "none"}))
}

// TestMutationsCaught runs the fault-free traffic with a rule of the Lua
// broken, and requires the checks to see it.
func TestMutationsCaught(t *testing.T) {
	redistest.Long(t)
	for _, tc := range []struct{ mutation, want string }{
		{"capacity", "capacity of"},
		{"token-reuse", "granted twice"},
		{"latch-early", "latch history is not linearizable"},
		{"barrier-early", "completed with 2 Arrivals"},
	} {
		t.Run(tc.mutation, func(t *testing.T) {
			latch := strings.HasPrefix(tc.mutation, "latch")
			bar := strings.HasPrefix(tc.mutation, "barrier")
			res := run(t, scenario{name: "mutation " + tc.mutation, mutation: tc.mutation, latch: latch, barrier: bar})
			found := false
			for _, v := range res.Violations {
				t.Log(v)
				found = found || strings.Contains(v, tc.want)
			}
			if !found {
				t.Errorf("with %s broken: no violation saying %q", tc.mutation, tc.want)
			}
		})
	}
}

// TestMutationTargetsExist fails when a mutation's target is no longer in
// the Lua source, so that a mutation cannot silently stop mutating.
func TestMutationTargetsExist(t *testing.T) {
	for name, m := range Mutations {
		src, err := os.ReadFile(filepath.Join("..", "..", m.File))
		if err != nil {
			t.Fatalf("mutation %s: %v", name, err)
		}
		if n := strings.Count(string(src), m.Old); n != 1 {
			t.Errorf("mutation %s: %s holds its target %d times, want once: update Mutations in mutations.go\ntarget: %q",
				name, m.File, n, m.Old)
		}
	}
}

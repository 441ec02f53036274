package conformance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/engine"
	"github.com/fairlock/fairlock/internal/statecheck"
	"github.com/fairlock/fairlock/internal/testhook"
	"pgregory.net/rapid"
)

// Property is the model-based property test, through the client under
// test: a rapid state machine drives four processes (a Client each, with
// an owner label of its own) on one semaphore of a drawn capacity, with
// requests of drawn sizes: acquire, try, release, cancel a wait, wait on
// one of the semaphore's condition variables (the default one or a named
// one) and signal or broadcast it, and close a process (which gives up
// what it holds and waits for, then comes back as a new Client). After
// every step it compares what Redis reports (Status: the holders and the
// queue in order; each condition's waiters) and what each call returned
// with a first-in first-out model of weighted permits: a request is
// granted when it heads the queue and fits, and never otherwise; a
// signalled condition waiter joins the end of the queue. Every Status
// read on the way must show no more than the capacity in use, and on a
// single server every key the keys' invariants (internal/statecheck).
//
// It runs with the scripts' fast paths on every target, and on the plain
// server a second time with them off (every call on the general path, by
// internal/testhook's NoFastPaths), so that both paths, through this
// client, are held to the same model. (The transport is the Backend's, the
// same whichever path the script takes; a client made with a transform
// runs its scripts by EVAL, which costs miniredis a compile per call.)
//
// Time is real and leases do not expire while a run lasts (their TTL is
// far longer); crashes and lapsed leases are the root package's property
// test's and the robustness suite's (on every client too).
func property(t *testing.T, tg Target) {
	setChecks(t, 40, 25)
	for _, path := range []struct {
		name string
		opts []fairlock.Option
	}{
		{"fast paths", nil},
		{"general path", []fairlock.Option{testhook.Transform[fairlock.Option](testhook.NoFastPaths)}},
	} {
		if path.opts != nil && (tg.Mini || tg.Cluster || tg.Replicas > 0) {
			continue
		}
		t.Run(path.name, func(t *testing.T) {
			var st pStats
			rapid.Check(t, func(rt *rapid.T) { runModel(rt, tg, path.opts, &st) })
			t.Logf("%d steps: %d grants, %d of them to a wait the queue held; %d cancelled waits, %d closes; longest queue %d; %d condition waits (%d on the named one), %d woken by a signal",
				st.steps, st.grants, st.queuedGrants, st.cancels, st.closes, st.maxQueue, st.condWaits, st.namedWaits, st.woken)
			if st.queuedGrants == 0 || st.cancels == 0 || st.closes == 0 || st.namedWaits == 0 || st.woken == 0 {
				t.Errorf("the machines never reached a queued grant, a cancelled wait, a close, a wait on the named condition and a signalled waiter: the model checks too little")
			}
		})
	}
}

// setChecks has rapid run full checks, or short under -short, until t
// ends.
func setChecks(t *testing.T, full, short int) {
	checks := flag.Lookup("rapid.checks")
	if checks == nil {
		t.Fatal("rapid's -rapid.checks flag is not registered")
	}
	n := full
	if testing.Short() {
		n = short * 5 // rapid runs a fifth of -rapid.checks with -short
	}
	old := checks.Value.String()
	_ = checks.Value.Set(strconv.Itoa(n))
	t.Cleanup(func() { _ = checks.Value.Set(old) })
}

// pStats counts what the machines reached, over all runs.
type pStats struct {
	steps, grants, queuedGrants, cancels, closes, maxQueue int
	condWaits, namedWaits, woken                           int
}

// pConds are the condition variables the model uses: the default one and
// a named one (whose key is derived from the semaphore's and the name).
var pConds = []string{"", "ready"}

type pActor struct {
	owner  string
	c      *fairlock.Client
	n      int64  // permits of the request in progress
	state  int    // pIdle, pWaiting, pHolding, pCond
	cond   string // pCond: the condition it waits on
	lease  *fairlock.Lease
	res    chan pResult // the Acquire in progress
	cancel context.CancelFunc
	// granted: the model has granted the wait in progress, whose result
	// the next check takes; queued: it waited behind others first.
	granted, queued bool
}

const (
	pIdle = iota
	pWaiting
	pHolding
	pCond // waits on a condition (its Wait's result comes on res)
)

type pResult struct {
	l   *fairlock.Lease
	err error
}

type pModel struct {
	tg     Target
	t      *rapid.T
	name   string
	cap    int64
	actors []*pActor
	queue  []*pActor // arrival order
	conds  []*pActor // condition waiters, in the order they began to wait
	held   int64
	opts   []fairlock.Option // of every process
	st     *pStats
}

func runModel(rt *rapid.T, tg Target, opts []fairlock.Option, st *pStats) {
	m := &pModel{tg: tg, t: rt, opts: opts, st: st, name: "{prop" + newTag() + "}:s", cap: rapid.Int64Range(1, 4).Draw(rt, "capacity")}
	defer func() {
		for _, a := range m.actors {
			if a.cancel != nil {
				a.cancel()
			}
			_ = a.c.Close()
		}
	}()
	for i := range 4 {
		a := &pActor{owner: fmt.Sprintf("p%d", i)}
		m.reopen(a)
		m.actors = append(m.actors, a)
	}
	rt.Repeat(map[string]func(*rapid.T){
		"acquire":   m.acquire,
		"try":       m.try,
		"release":   m.release,
		"cancel":    m.cancelWait,
		"close":     m.close,
		"wait":      m.condWait,
		"signal":    func(t *rapid.T) { m.signal(t, false) },
		"broadcast": func(t *rapid.T) { m.signal(t, true) },
		"":          m.check,
	})
}

func (m *pModel) reopen(a *pActor) {
	c, err := m.tg.Open(append([]fairlock.Option{fairlock.WithOwner(a.owner), fairlock.WithLeaseTTL(time.Hour),
		fairlock.WithWaiterTTL(time.Hour)}, m.opts...)...)
	if err != nil {
		m.t.Fatalf("open %s: %v", a.owner, err)
	}
	a.c, a.state, a.lease, a.res, a.cancel, a.granted = c, pIdle, nil, nil, nil, false
}

func (m *pModel) req(n int64) fairlock.Request {
	return fairlock.Request{Name: m.name, Capacity: m.cap, Permits: n}
}

func (m *pModel) pick(t *rapid.T, state int) *pActor {
	var as []*pActor
	for _, a := range m.actors {
		if a.state == state && !a.granted {
			as = append(as, a)
		}
	}
	if len(as) == 0 {
		t.Skip("no process in that state")
	}
	return rapid.SampledFrom(as).Draw(t, "process")
}

// grant grants the heads of the queue that fit, in order, as Redis must.
func (m *pModel) grant() {
	for len(m.queue) > 0 && m.held+m.queue[0].n <= m.cap {
		a := m.queue[0]
		m.queue = m.queue[1:]
		m.held += a.n
		a.granted = true
		m.st.grants++
		if a.queued {
			m.st.queuedGrants++
		}
	}
}

func (m *pModel) acquire(t *rapid.T) {
	a := m.pick(t, pIdle)
	a.n = rapid.Int64Range(1, m.cap).Draw(t, "permits")
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel, a.res, a.state = cancel, make(chan pResult, 1), pWaiting
	c, req := a.c, m.req(a.n)
	go func() {
		l, err := c.Acquire(ctx, req)
		a.res <- pResult{l, err}
	}()
	m.queue = append(m.queue, a)
	a.queued = len(m.queue) > 1 || m.held+a.n > m.cap
	m.st.maxQueue = max(m.st.maxQueue, len(m.queue))
	m.grant()
	// Its place in the queue is fixed before the next step.
	m.check(t)
}

func (m *pModel) try(t *rapid.T) {
	a := m.pick(t, pIdle)
	n := rapid.Int64Range(1, m.cap).Draw(t, "permits")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := a.c.TryAcquire(ctx, m.req(n))
	want := len(m.queue) == 0 && m.held+n <= m.cap
	switch {
	case want && err != nil:
		t.Fatalf("%s: TryAcquire(%d) with %d of %d in use and no queue = %v, want a lease", a.owner, n, m.held, m.cap, err)
	case !want && err == nil:
		t.Fatalf("%s: TryAcquire(%d) granted with %d of %d in use and %d queued", a.owner, n, m.held, m.cap, len(m.queue))
	case !want && !errors.Is(err, fairlock.ErrNotAcquired):
		t.Fatalf("%s: TryAcquire(%d) refused with %v, want ErrNotAcquired", a.owner, n, err)
	}
	if want {
		a.n, a.lease, a.state = n, l, pHolding
		m.held += n
		m.st.grants++
	}
}

func (m *pModel) release(t *rapid.T) {
	a := m.pick(t, pHolding)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.lease.Release(ctx); err != nil {
		t.Fatalf("%s: Release: %v", a.owner, err)
	}
	m.held -= a.n
	a.lease, a.state = nil, pIdle
	m.grant()
}

func (m *pModel) cancelWait(t *rapid.T) {
	a := m.pick(t, rapid.SampledFrom([]int{pWaiting, pCond}).Draw(t, "wait cancelled"))
	a.cancel()
	r := m.result(a)
	if r.err == nil {
		t.Fatalf("%s: cancelled wait for %d (not at a place the model grants) returned a lease", a.owner, a.n)
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("%s: cancelled wait returned %v, want context.Canceled", a.owner, r.err)
	}
	m.queue = slices.DeleteFunc(m.queue, func(x *pActor) bool { return x == a })
	m.conds = slices.DeleteFunc(m.conds, func(x *pActor) bool { return x == a })
	a.state, a.res, a.cancel = pIdle, nil, nil
	m.st.cancels++
	m.grant()
}

// close closes a process: its leases are released and its wait ends.
func (m *pModel) close(t *rapid.T) {
	a := rapid.SampledFrom(m.actors).Draw(t, "process")
	if a.granted {
		m.take(t, a) // a grant the model made is the process's until it closes
	}
	if err := a.c.Close(); err != nil {
		t.Fatalf("%s: Close: %v", a.owner, err)
	}
	switch a.state {
	case pHolding:
		m.held -= a.n
	case pWaiting, pCond:
		if r := m.result(a); !errors.Is(r.err, fairlock.ErrClosed) {
			t.Fatalf("%s: a wait ended by Close returned %v, %v; want ErrClosed", a.owner, r.l, r.err)
		}
		m.queue = slices.DeleteFunc(m.queue, func(x *pActor) bool { return x == a })
		m.conds = slices.DeleteFunc(m.conds, func(x *pActor) bool { return x == a })
	}
	m.reopen(a)
	m.st.closes++
	m.grant()
}

// condWait has a holder wait on one of the semaphore's conditions: its
// lease is spent (its permits go to the queue's heads that fit) and it
// waits on the condition, behind those already there.
func (m *pModel) condWait(t *rapid.T) {
	a := m.pick(t, pHolding)
	cond := rapid.SampledFrom(pConds).Draw(t, "condition")
	ctx, cancel := context.WithCancel(context.Background())
	lease := a.lease
	a.cancel, a.res, a.state, a.cond, a.lease = cancel, make(chan pResult, 1), pCond, cond, nil
	go func() {
		l, err := engine.CondWait(ctx, lease, cond)
		nl, _ := l.(*fairlock.Lease)
		a.res <- pResult{nl, err}
	}()
	m.held -= a.n
	m.conds = append(m.conds, a)
	m.st.condWaits++
	if cond != "" {
		m.st.namedWaits++
	}
	m.grant()
	// Its place on the condition is fixed before the next step.
	m.check(t)
}

// signal wakes the longest waiter of one of the semaphore's conditions
// (all: every one), through any process: each joins the end of the queue,
// in order.
func (m *pModel) signal(t *rapid.T, all bool) {
	cond := rapid.SampledFrom(pConds).Draw(t, "condition")
	var woken, left []*pActor
	for _, a := range m.conds {
		if a.cond == cond && (all || len(woken) == 0) {
			woken = append(woken, a)
		} else {
			left = append(left, a)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	by := rapid.SampledFrom(m.actors).Draw(t, "signaller")
	n, err := engine.Signal(ctx, by.c, m.name, cond, all)
	if err != nil || n != len(woken) {
		t.Fatalf("%s: signal (all %v) of condition %q = %d, %v; the model wakes %d", by.owner, all, cond, n, err, len(woken))
	}
	m.conds = left
	for _, a := range woken {
		a.state, a.queued = pWaiting, true
		m.queue = append(m.queue, a)
		m.st.woken++
	}
	m.st.maxQueue = max(m.st.maxQueue, len(m.queue))
	m.grant()
	m.check(t)
}

// condKey is the key of the semaphore's condition cond (the library's
// derived key: the base, U+001F, "c", U+001F, the name).
func (m *pModel) condKey(cond string) string {
	return fairlock.DefaultPrefix + m.name + "\x1fc\x1f" + cond
}

// result waits for a's Acquire to return.
func (m *pModel) result(a *pActor) pResult {
	select {
	case r := <-a.res:
		return r
	case <-time.After(10 * time.Second):
		m.t.Fatalf("%s: Acquire(%d) did not return within 10s", a.owner, a.n)
		return pResult{}
	}
}

// take takes the lease the model granted to a's wait.
func (m *pModel) take(t *rapid.T, a *pActor) {
	r := m.result(a)
	if r.err != nil {
		t.Fatalf("%s: Acquire(%d), granted by the model, returned %v", a.owner, a.n, r.err)
	}
	a.lease, a.state, a.granted, a.res, a.cancel = r.l, pHolding, false, nil, nil
}

// check takes the model's grants and compares Redis's holders and queue
// with the model's, polling while wake-ups and clean-up run.
func (m *pModel) check(t *rapid.T) {
	m.st.steps++
	for _, a := range m.actors {
		if a.granted {
			m.take(t, a)
		}
		if a.state == pWaiting || a.state == pCond {
			select {
			case r := <-a.res:
				t.Fatalf("%s: Acquire(%d) returned %v, %v while the model has it wait (%d of %d in use, queue %s, conditions %s)",
					a.owner, a.n, r.l, r.err, m.held, m.cap, m.queueString(), m.condString())
			default:
			}
		}
	}
	var wantHolders []string
	for _, a := range m.actors {
		if a.state == pHolding {
			wantHolders = append(wantHolders, fmt.Sprintf("%s:%d", a.owner, a.n))
		}
	}
	slices.Sort(wantHolders)
	if !m.tg.Cluster {
		// The keys' invariants, as they are now (on Cluster, the admin
		// client's transaction may reach another node than the keys').
		base := fairlock.DefaultPrefix + m.name
		st := statecheck.State{Prefix: base, Bases: []string{base}}
		if err := statecheck.Check(context.Background(), m.tg.Admin, st); err != nil {
			t.Fatalf("state invariant: %v", err)
		}
	}
	want := fmt.Sprintf("holders %v, queue %s, conditions %s", wantHolders, m.queueString(), m.condString())
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := m.actors[0].c.Status(ctx, m.name)
		cancel()
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		if st.InUse > m.cap {
			t.Fatalf("%d permits in use, capacity %d: %+v", st.InUse, m.cap, st)
		}
		var holders, queue []string
		for _, h := range st.Holders {
			holders = append(holders, fmt.Sprintf("%s:%d", h.Owner, h.Permits))
		}
		for _, w := range st.Waiters {
			queue = append(queue, fmt.Sprintf("%s:%d", w.Owner, w.Permits))
		}
		slices.Sort(holders)
		var conds []string
		for _, cond := range pConds {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			ws, err := m.tg.Admin.ZRange(ctx, m.condKey(cond), 0, -1).Result()
			cancel()
			if err != nil {
				t.Fatalf("reading condition %q: %v", cond, err)
			}
			for _, w := range ws {
				// A member: ticket, permits, client, ...
				f := strings.Fields(w)
				if len(f) < 2 {
					t.Fatalf("condition %q has a member of a bad form: %q", cond, w)
				}
				conds = append(conds, fmt.Sprintf("%q:%s", cond, f[1]))
			}
		}
		got := fmt.Sprintf("holders %v, queue %v, conditions %v", holders, queue, conds)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis has %s; the model %s", got, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// condString lists the model's condition waiters, condition by condition,
// each in order, by their permits, as check reads Redis's (whose members
// name a client by an id of the library's, not by its owner label).
func (m *pModel) condString() string {
	var c []string
	for _, cond := range pConds {
		for _, a := range m.conds {
			if a.cond == cond {
				c = append(c, fmt.Sprintf("%q:%d", cond, a.n))
			}
		}
	}
	return fmt.Sprint(c)
}

func (m *pModel) queueString() string {
	var q []string
	for _, a := range m.queue {
		q = append(q, fmt.Sprintf("%s:%d", a.owner, a.n))
	}
	return fmt.Sprint(q)
}

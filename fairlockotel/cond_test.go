package fairlockotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockotel"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// gauge returns an up-down counter's value for the semaphore name.
func (r *rig) gauge(metric, name string) int64 {
	s, ok := r.metrics()[metric].(metricdata.Sum[int64])
	if !ok {
		return 0
	}
	for _, dp := range s.DataPoints {
		if key(dp.Attributes) == "fairlock.semaphore="+name {
			return dp.Value
		}
	}
	return 0
}

// balanced waits until the observer's gauges count as many holders of the
// mutex name as Status does, and as many waiters as wait in its queue and
// on its default condition, and those are want; it fails the test
// otherwise.
func (r *rig) balanced(c *fairlock.Client, rdb redis.Cmdable, name string, wantHeld, wantWaiting int64) {
	r.t.Helper()
	ctx := context.Background()
	var holders, waiters, onCond int64
	var st fairlock.Status
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		holders, waiters = r.gauge("fairlock.holders", name), r.gauge("fairlock.waiters", name)
		if st, err = c.Status(ctx, name); err != nil {
			r.t.Fatal(err)
		}
		if onCond, err = rdb.ZCard(ctx, r.prefix+"{"+name+"}\x1fc\x1f").Result(); err != nil {
			r.t.Fatal(err)
		}
		if holders == st.Held && waiters == st.Queued+onCond && holders == wantHeld && waiters == wantWaiting {
			return
		}
	}
	r.t.Fatalf("gauges: %d holders, %d waiters; Redis has %d holders, %d queued and %d on the condition; want %d and %d",
		holders, waiters, st.Held, st.Queued, onCond, wantHeld, wantWaiting)
}

type waitResult struct {
	l   *fairlock.Lease
	err error
}

// condWait waits on the default condition of lease l's mutex, through c.
func condWait(ctx context.Context, c *fairlock.Client, l *fairlock.Lease) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		nl, err := cond(c, l.Name()).Wait(ctx, l)
		ch <- waitResult{nl, err}
	}()
	return ch
}

// cond returns the default condition of the mutex name, through c.
func cond(c *fairlock.Client, name string) *semaphore.Cond {
	m, err := semaphore.NewMutex(c, name)
	if err != nil {
		panic(err)
	}
	return semaphore.NewCond(m)
}

func (r *rig) receive(ch <-chan waitResult) waitResult {
	r.t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(10 * time.Second):
		r.t.Fatal("CondWait did not return within 10s")
		return waitResult{}
	}
}

func (r *rig) granted(ch <-chan waitResult) *fairlock.Lease {
	r.t.Helper()
	res := r.receive(ch)
	if res.err != nil {
		r.t.Fatalf("CondWait: %v", res.err)
	}
	return res.l
}

// Condition waits are acquisitions: the waiters and holders gauges follow
// what Redis has through waits, signals, a broadcast, a cancelled wait, a
// lost lease and Close; every span ends, and the observer remembers
// nothing once every wait and lease has ended.
func TestCondWaitsCounted(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	raw := r.b.Client(t)
	// A long waiter TTL: a refresh held up past it by a loaded machine
	// would wake a waiter without a signal.
	c1, c2 := r.client(fairlock.WithWaiterTTL(time.Minute)), r.client(fairlock.WithWaiterTTL(time.Minute))
	const name = "m"
	req := fairlock.Request{Name: name, Capacity: 1, Permits: 1}
	acquire := func(c *fairlock.Client) *fairlock.Lease {
		t.Helper()
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	release := func(l *fairlock.Lease) {
		t.Helper()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	w1 := condWait(ctx, c1, acquire(c1))
	r.balanced(c1, raw, name, 0, 1)
	w2 := condWait(ctx, c2, acquire(c2))
	r.balanced(c1, raw, name, 0, 2)
	cctx, cancel := context.WithCancel(ctx)
	w3 := condWait(cctx, c1, acquire(c1))
	r.balanced(c1, raw, name, 0, 3)
	cancel()
	if res := r.receive(w3); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("cancelled CondWait = %v", res.err)
	}
	r.balanced(c1, raw, name, 0, 2)

	// A signal wakes the first; it waits again; a broadcast wakes both.
	if n, err := cond(c2, name).Signal(ctx); err != nil || n != 1 {
		t.Fatalf("CondSignal = %d, %v", n, err)
	}
	a := r.granted(w1)
	r.balanced(c1, raw, name, 1, 1)
	wa := condWait(ctx, c1, a)
	r.balanced(c1, raw, name, 0, 2)
	if n, err := cond(c2, name).Broadcast(ctx); err != nil || n != 2 {
		t.Fatalf("CondBroadcast = %d, %v", n, err)
	}
	b := r.granted(w2)
	r.balanced(c1, raw, name, 1, 1)
	release(b)
	a = r.granted(wa)
	r.balanced(c1, raw, name, 1, 0)
	release(a)
	r.balanced(c1, raw, name, 0, 0)

	// A lease a wait returned is lost: its process is cut off.
	faults := &redistest.Faults{}
	frdb := r.b.Client(t)
	faulty := redistest.AddHook[fairlock.Option](frdb, faults)
	t.Cleanup(faults.Hear)
	fc, err := fairlock.New(frdb, faulty, fairlock.WithPrefix(r.prefix), fairlock.WithObserver(r.obs),
		fairlock.WithLeaseTTL(600*time.Millisecond), fairlock.WithWaiterTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	l, err := fc.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	wf := condWait(ctx, fc, l)
	r.balanced(c1, raw, name, 0, 1)
	if n, err := cond(c2, name).Signal(ctx); err != nil || n != 1 {
		t.Fatalf("CondSignal = %d, %v", n, err)
	}
	lost := r.granted(wf)
	r.balanced(c1, raw, name, 1, 0)
	faults.Down.Store(true)
	select {
	case <-lost.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the cut-off lease did not end")
	}
	r.balanced(c1, raw, name, 0, 0)
	faults.Down.Store(false)

	// Close ends a wait on the condition.
	c3 := r.client(fairlock.WithWaiterTTL(time.Minute))
	w4 := condWait(ctx, c3, acquire(c3))
	r.balanced(c1, raw, name, 0, 1)
	_ = c3.Close()
	if res := r.receive(w4); !errors.Is(res.err, fairlock.ErrClosed) {
		t.Fatalf("CondWait ended by Close = %v", res.err)
	}
	r.balanced(c1, raw, name, 0, 0)

	if n := len(r.spans.Started()) - len(r.spans.Ended()); n != 0 {
		t.Fatalf("%d spans never ended", n)
	}
	if n := fairlockotel.Live(r.obs); n != 0 {
		t.Fatalf("the observer remembers %d acquisitions after every wait and lease ended", n)
	}
	m := r.metrics()
	// Granted: 5 acquisitions at once (each then waits) and 4 waits (w1,
	// wa, w2, wf); abandoned: the cancelled wait and the one Close ended.
	// Released: the 5 leases granted at once and a (twice) by their waits,
	// and b; lost: the lease fc was cut off with.
	wantAcq := map[string]int64{
		"fairlock.outcome=granted,fairlock.semaphore=m":                            9,
		"fairlock.outcome=abandoned,fairlock.reason=canceled,fairlock.semaphore=m": 1,
		"fairlock.outcome=abandoned,fairlock.reason=closed,fairlock.semaphore=m":   1,
	}
	if acq := sums(t, m["fairlock.acquisitions"]); !mapsEqual(acq, wantAcq) {
		t.Fatalf("fairlock.acquisitions = %v, want %v", acq, wantAcq)
	}
	hold := hists(t, m["fairlock.hold.duration"])
	if rel, lost := hold["fairlock.outcome=released,fairlock.semaphore=m"].Count, hold["fairlock.outcome=lost,fairlock.semaphore=m"].Count; rel != 8 || lost != 1 {
		t.Fatalf("holds: %d released, %d lost; want 8 and 1", rel, lost)
	}
}
